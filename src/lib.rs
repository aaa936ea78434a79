//! blobdrive: Azure page blobs as Linux disks.
//!
//! Layers, each knowing only the one below: `cli` → `fs` → `drive` → `blob`,
//! with `vhd` (the fixed VHD footer) and `units` (page arithmetic) beside them.
//! See DESIGN.md in the shared folder for the architecture.

pub mod attach;
pub mod blob;
pub mod cli;
pub mod daemon;
pub mod drive;
pub mod fs;
pub mod metrics;
pub mod recovery;
pub mod transfer;
pub mod units;
pub mod vhd;
