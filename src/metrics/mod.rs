//! Metrics for Prometheus: what a mount measures beyond its counters, and how
//! it is shown.
//!
//! Owns the process-wide [`registry`] of per-drive latency histograms (Put
//! Page, Get, fsync) and event counts (retries by reason, leases lost,
//! recovery files written), the [`text`] writer that turns a mount's counters
//! and that registry into the Prometheus text exposition format, and the
//! [`export`] of that text: an HTTP `/metrics` listener and a file for
//! node_exporter's textfile collector. It knows nothing of FUSE or of the
//! drive engine: callers hand it a drive's name and a duration or an event.
//!
//! Invariants: every series carries a `drive` label (`container/blob`);
//! counters end in `_total` and only grow; sizes are in bytes and durations
//! in seconds, as Prometheus names them.

pub mod export;
pub mod histogram;
pub mod registry;
pub mod text;

pub use histogram::Histogram;
pub use registry::{
    count_lease_lost, count_recovery_file, count_retry, observe, registry, Operation,
};
