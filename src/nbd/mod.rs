//! An NBD server over the drive engine: `blobdrive serve C/B --nbd unix:PATH`
//! gives qemu, libnbd's tools (`nbdinfo`, `nbdcopy`, `nbdfuse`), fio's `nbd`
//! engine and `nbd-client` a block device without FUSE.
//!
//! Parts: `proto.rs` (the specification's constants and pure message
//! parsers and encoders), `handshake.rs` (fixed newstyle negotiation),
//! `transmission.rs` (requests onto `fs::Device`), `export.rs` (a drive under
//! its export name, with its counters), `listen.rs` (Unix or TCP listener,
//! peer check, connection bound, the accept loop), `refusals.rs` (refused
//! requests logged at most once per kind per interval).
//!
//! Each export is one drive opened through the same catalog an attach uses
//! (`fs::azure::AzureCatalog`): one cache, one flush path, the lease and its
//! watcher, recovery files. Every connection to an export shares that one
//! device, so `NBD_FLAG_CAN_MULTI_CONN` holds. This module knows the
//! protocol and the `Device` trait, nothing of HTTP, FUSE or the cache.

pub mod export;
pub mod handshake;
pub mod listen;
pub mod proto;
pub mod refusals;
pub mod transmission;

pub use export::{Export, Exports};
pub use listen::{serve, Endpoint, Limits, Listener};
