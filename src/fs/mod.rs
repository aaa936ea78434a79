//! The FUSE layer: the namespace mount of an account (or one container).
//!
//! Owns inodes, listings, file handles and the mapping of kernel requests onto
//! [`Device`]s; knows nothing of HTTP or of the page cache. Layout of a mount:
//!
//! - the root lists containers (or, for a one-container mount, that container);
//! - inside a container, `/` in blob names makes virtual directories;
//! - a drive (page blob with a fixed VHD footer) is a regular file whose size is
//!   the disk size (blob size − 512), readable and writable; a page blob without a
//!   footer is shown whole; a block blob is a read-only file;
//! - a snapshot is a read-only file beside its blob, named
//!   `<blob name>@<snapshot time>`, e.g. `disk.vhd@2026-11-21T23:03:01.5600000Z`
//!   (the time exactly as the service gives it). If a blob's own name collides
//!   with such a name, the first listed wins.
//!
//! Two front ends turn kernel requests into [`FsCore`] calls: `fuse.rs` (the
//! fuser crate) for namespace mounts, and our own protocol layer (`wire.rs`,
//! `session.rs`) for the private one-file mount of an attach.
//!
//! Invariants: a handler never waits on I/O on a FUSE thread (see `fuse.rs`); the
//! first writable open of a drive takes its lease and the last release flushes
//! and releases it (see `handles.rs`); `fsync` and `flush` return only when the
//! data is durable in the blob. Attributes are cached by the kernel for
//! [`core::ATTR_TTL`], listings here for [`core::LISTING_TTL`].
//!
//! [`Device`]: backend::Device

pub mod azure;
pub mod backend;
pub mod changes;
pub mod core;
pub mod fuse;
pub mod handles;
pub mod inodes;
pub mod local;
pub mod memory;
pub mod one_drive;
pub mod rescue;
pub mod session;
pub mod unlocks;
pub mod wire;
pub mod write_log;
pub mod xattrs;

pub use backend::{
    Catalog, Device, DirEntry, DriveState, EntryKind, EntryPath, Extent, FsError, FsResult,
};
pub use core::{FsConfig, FsCore};
pub use fuse::BlobFs;
