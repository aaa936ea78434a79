//! An export: one opened drive under its NBD name, the flags it is served
//! with, and its counters. Every connection to an export shares its one
//! [`Device`], hence one cache and one flush path: what makes
//! `NBD_FLAG_CAN_MULTI_CONN` true.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::Serialize;

use super::proto::{
    NBD_FLAG_CAN_MULTI_CONN, NBD_FLAG_HAS_FLAGS, NBD_FLAG_READ_ONLY, NBD_FLAG_SEND_FLUSH,
    NBD_FLAG_SEND_FUA, NBD_FLAG_SEND_TRIM, NBD_FLAG_SEND_WRITE_ZEROES,
};
use crate::fs::Device;

/// Smallest block a client that asked may address (a drive's page).
pub const MIN_BLOCK_BYTES: u32 = 512;
/// Block size without read-modify-write (the cache's 4 KiB blocks).
pub const PREFERRED_BLOCK_BYTES: u32 = 4096;
/// Largest READ or WRITE payload (the specification's portable 32 MiB).
pub const MAX_PAYLOAD_BYTES: u32 = 32 * 1024 * 1024;

/// What the server counts per export (`serve --json` prints them at exit).
#[derive(Debug, Default)]
pub struct ExportCounters {
    /// `NBD_CMD_READ` requests answered with data.
    pub read_requests: AtomicU64,
    /// Bytes those reads returned.
    pub read_bytes: AtomicU64,
    /// `NBD_CMD_WRITE` requests done.
    pub write_requests: AtomicU64,
    /// Bytes written.
    pub write_bytes: AtomicU64,
    /// `NBD_CMD_FLUSH` requests (and FUA writes) made durable.
    pub flushes: AtomicU64,
    /// `NBD_CMD_TRIM` and `NBD_CMD_WRITE_ZEROES` requests done.
    pub zeroes: AtomicU64,
    /// `NBD_CMD_BLOCK_STATUS` requests answered.
    pub block_status: AtomicU64,
    /// Requests answered with an error.
    pub errors: AtomicU64,
}

/// A snapshot of [`ExportCounters`].
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CountersSnapshot {
    /// See [`ExportCounters::read_requests`].
    pub read_requests: u64,
    /// See [`ExportCounters::read_bytes`].
    pub read_bytes: u64,
    /// See [`ExportCounters::write_requests`].
    pub write_requests: u64,
    /// See [`ExportCounters::write_bytes`].
    pub write_bytes: u64,
    /// See [`ExportCounters::flushes`].
    pub flushes: u64,
    /// See [`ExportCounters::zeroes`].
    pub zeroes: u64,
    /// See [`ExportCounters::block_status`].
    pub block_status: u64,
    /// See [`ExportCounters::errors`].
    pub errors: u64,
}

impl ExportCounters {
    /// Adds one to `counter`.
    pub fn bump(counter: &AtomicU64, by: u64) {
        counter.fetch_add(by, Ordering::Relaxed);
    }

    /// The counts now.
    pub fn snapshot(&self) -> CountersSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CountersSnapshot {
            read_requests: get(&self.read_requests),
            read_bytes: get(&self.read_bytes),
            write_requests: get(&self.write_requests),
            write_bytes: get(&self.write_bytes),
            flushes: get(&self.flushes),
            zeroes: get(&self.zeroes),
            block_status: get(&self.block_status),
            errors: get(&self.errors),
        }
    }
}

/// One drive served over NBD.
pub struct Export {
    /// The export name clients ask for: the drive's `container/blob`.
    pub name: String,
    /// The opened drive, shared by every connection.
    pub device: Arc<dyn Device>,
    /// Writes, trims and zeroing are refused with `NBD_EPERM`.
    pub read_only: bool,
    /// What was served.
    pub counters: ExportCounters,
}

impl Export {
    /// An export of `device` under `name`.
    pub fn new(name: impl Into<String>, device: Arc<dyn Device>, read_only: bool) -> Self {
        Export {
            name: name.into(),
            device,
            read_only,
            counters: ExportCounters::default(),
        }
    }

    /// The transmission flags announced for this export.
    pub fn transmission_flags(&self) -> u16 {
        // One device (one cache) behind every connection: a flush on any of
        // them covers the writes completed on all of them.
        let shared = NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH | NBD_FLAG_CAN_MULTI_CONN;
        if self.read_only {
            shared | NBD_FLAG_READ_ONLY
        } else {
            shared | NBD_FLAG_SEND_FUA | NBD_FLAG_SEND_TRIM | NBD_FLAG_SEND_WRITE_ZEROES
        }
    }
}

/// What the server counts across its exports.
#[derive(Debug, Default)]
pub struct ServerCounters {
    /// Connections accepted and served.
    pub connections: AtomicU64,
    /// Connections closed at accept: another user's, or over the maximum.
    pub refused_connections: AtomicU64,
}

/// The exports of one server, by name.
#[derive(Default)]
pub struct Exports {
    exports: Vec<Arc<Export>>,
    /// The server's own counters.
    pub counters: ServerCounters,
}

impl Exports {
    /// A set of exports; names are unique (the caller's drives are).
    pub fn new(exports: Vec<Arc<Export>>) -> Self {
        Exports {
            exports,
            counters: ServerCounters::default(),
        }
    }

    /// The NBD counters in the Prometheus text format, to append to the
    /// drives' own metrics: requests by command, bytes by direction,
    /// refused requests per export, connections served and refused.
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        let mut family = |name: &str, help: &str, samples: Vec<(String, u64)>| {
            out += &format!("# HELP {name} {help}\n# TYPE {name} counter\n");
            for (labels, value) in samples {
                out += &format!("{name}{labels} {value}\n");
            }
        };
        let per_export = |f: &dyn Fn(&CountersSnapshot) -> Vec<(String, u64)>| {
            self.exports
                .iter()
                .flat_map(|e| {
                    let drive = e.name.replace('\\', "\\\\").replace('"', "\\\"");
                    f(&e.counters.snapshot())
                        .into_iter()
                        .map(move |(extra, v)| (format!("{{drive=\"{drive}\"{extra}}}"), v))
                })
                .collect::<Vec<_>>()
        };
        family(
            "blobdrive_nbd_requests_total",
            "NBD requests answered without error, by command (trim counts TRIM and WRITE_ZEROES; flush counts FUA writes too).",
            per_export(&|c| {
                [
                    ("read", c.read_requests),
                    ("write", c.write_requests),
                    ("flush", c.flushes),
                    ("trim", c.zeroes),
                    ("block_status", c.block_status),
                ]
                .into_iter()
                .map(|(cmd, v)| (format!(",command=\"{cmd}\""), v))
                .collect()
            }),
        );
        family(
            "blobdrive_nbd_bytes_total",
            "Bytes NBD reads returned and writes carried.",
            per_export(&|c| {
                vec![
                    (",direction=\"read\"".to_string(), c.read_bytes),
                    (",direction=\"write\"".to_string(), c.write_bytes),
                ]
            }),
        );
        family(
            "blobdrive_nbd_refused_requests_total",
            "NBD requests answered with an error (past the end, too long, read-only, failed).",
            per_export(&|c| vec![(String::new(), c.errors)]),
        );
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        family(
            "blobdrive_nbd_connections_total",
            "NBD connections accepted.",
            vec![(String::new(), get(&self.counters.connections))],
        );
        family(
            "blobdrive_nbd_refused_connections_total",
            "NBD connections closed at accept (another user's, or over --max-connections).",
            vec![(String::new(), get(&self.counters.refused_connections))],
        );
        out
    }

    /// The export called `name`; the empty name is the default export when
    /// the server has exactly one.
    pub fn find(&self, name: &str) -> Option<Arc<Export>> {
        if name.is_empty() && self.exports.len() == 1 {
            return self.exports.first().cloned();
        }
        self.exports.iter().find(|e| e.name == name).cloned()
    }

    /// Every export, in the order given.
    pub fn all(&self) -> &[Arc<Export>] {
        &self.exports
    }
}
