//! The two narrow traits the FUSE layer is written against: [`Catalog`] (what
//! exists: containers, blobs, snapshots) and [`Device`] (one opened drive or blob).
//!
//! The real implementations are thin adapters over `blob::BlobClient` and
//! `drive::Drive`; `fs::memory` holds in-memory ones for tests. Every error that
//! crosses into `fs` is an [`FsError`] that already carries the errno the kernel
//! will see: the mapping happens in the adapter, once, and nowhere else.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;

/// An error with the errno the FUSE reply will carry and a message for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsError {
    /// Positive errno (`libc::EIO`, `libc::EBUSY`, ...).
    pub errno: i32,
    /// What failed, for logs and control-socket answers.
    pub message: String,
    /// The failure left no data behind: everything written is durable
    /// (a lease that could not be released after the last flush).
    pub data_durable: bool,
    /// The drive refused to open because another writer came between its
    /// writer lineage and now (`blob/lineage.rs`): a takeover must not
    /// retry, but save what it holds.
    pub fenced: bool,
}

impl FsError {
    /// An error with an explicit errno.
    pub fn new(errno: i32, message: impl Into<String>) -> Self {
        FsError {
            errno,
            message: message.into(),
            data_durable: false,
            fenced: false,
        }
    }

    /// `ENOENT`: no such container, blob or snapshot.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(libc::ENOENT, message)
    }

    /// `EBUSY`: the drive is leased by another writer (the mount lock).
    pub fn busy(message: impl Into<String>) -> Self {
        Self::new(libc::EBUSY, message)
    }

    /// `EROFS`: a write on a read-only mount, snapshot or block blob.
    pub fn read_only(message: impl Into<String>) -> Self {
        Self::new(libc::EROFS, message)
    }

    /// `EIO`: the backend failed after its retries.
    pub fn io(message: impl Into<String>) -> Self {
        Self::new(libc::EIO, message)
    }
}

impl fmt::Display for FsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let errno = std::io::Error::from_raw_os_error(self.errno);
        write!(f, "{} ({errno})", self.message)
    }
}

impl std::error::Error for FsError {}

/// Result type of the FUSE layer and its backend traits.
pub type FsResult<T> = Result<T, FsError>;

/// One opened drive (or raw page blob, or block blob): a fixed-size run of bytes.
///
/// Offsets and lengths are in bytes of the disk (the VHD footer is not part of it).
/// Implementations are shared between file handles and used concurrently.
#[async_trait]
pub trait Device: Send + Sync {
    /// Size of the disk in bytes; changes only through [`Device::grow`].
    fn size_bytes(&self) -> u64;
    /// Grows the disk to `new_size_bytes` while open (online resize); only
    /// drives opened read-write can.
    async fn grow(&self, new_size_bytes: u64) -> FsResult<()> {
        let _ = new_size_bytes;
        Err(FsError::new(
            libc::EOPNOTSUPP,
            "only a drive opened read-write can grow",
        ))
    }
    /// Reads up to `len` bytes at `offset_bytes`, clipped at the end of the disk.
    async fn read_at(&self, offset_bytes: u64, len: usize) -> FsResult<Bytes>;
    /// Writes `data` at `offset_bytes`; the caller keeps the range inside the disk.
    async fn write_at(&self, offset_bytes: u64, data: &[u8]) -> FsResult<()>;
    /// Makes the range read as zeros and frees its storage (Clear Pages).
    async fn discard(&self, offset_bytes: u64, len_bytes: u64) -> FsResult<()>;
    /// Writes `len_bytes` of zeros at `offset_bytes` that stay allocated
    /// (not a hole) once flushed. The default writes zeros, which a device
    /// that stores zero pages as holes may free: the drive overrides it.
    async fn write_zeroes_allocated(&self, offset_bytes: u64, len_bytes: u64) -> FsResult<()> {
        const STEP: u64 = 1024 * 1024;
        let zeros = vec![0u8; STEP.min(len_bytes) as usize];
        let mut at = offset_bytes;
        let end = offset_bytes.saturating_add(len_bytes);
        while at < end {
            let n = STEP.min(end - at);
            self.write_at(at, &zeros[..n as usize]).await?;
            at += n;
        }
        Ok(())
    }
    /// Returns when every write accepted before the call is durable in the blob.
    async fn flush(&self) -> FsResult<()>;
    /// Flushes, then releases what the open took (the lease of a writable open).
    /// No other method is called after `close`.
    async fn close(&self) -> FsResult<()>;
    /// True when the last flush found storage silent (an outage), so a
    /// shutdown saves a recovery file first instead of waiting on another
    /// flush.
    fn storage_unanswered(&self) -> bool {
        false
    }
    /// Saves what is not durable yet (a recovery file) without trying to
    /// flush it, because a flush just failed; returns the file, if any was
    /// needed. A later `close` replaces or removes it.
    async fn save_unflushed(&self, _reason: &str) -> FsResult<Option<std::path::PathBuf>> {
        Ok(None)
    }
    /// True once this read-only device found its blob changed since it
    /// opened: it fails every read from then on, so a new open needs a
    /// device of its own.
    fn changed(&self) -> bool {
        false
    }
    /// Live counters for `blobdrive stats` (the drive engine's `Counters`).
    fn stats(&self) -> serde_json::Value;
    /// Which parts of `[offset_bytes, offset_bytes + len_bytes)` (clipped at
    /// the end of the disk) may hold data, as consecutive runs in order; a
    /// run with `data: false` reads as zeros and stores nothing. The
    /// default says everything is data, which is always true.
    fn allocation(&self, offset_bytes: u64, len_bytes: u64) -> Vec<Extent> {
        let len_bytes = len_bytes.min(self.size_bytes().saturating_sub(offset_bytes));
        if len_bytes == 0 {
            return Vec::new();
        }
        vec![Extent {
            len_bytes,
            data: true,
        }]
    }
}

/// One run of a disk's allocation map (see [`Device::allocation`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Length of the run in bytes.
    pub len_bytes: u64,
    /// True when the run may hold data; false when it reads as zeros and
    /// the blob stores nothing for it.
    pub data: bool,
}

/// What a listed name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A virtual directory (a blob-name prefix ending in `/`).
    Dir,
    /// A page blob with a fixed VHD footer; `size_bytes` is the disk size
    /// (blob size − 512).
    Drive {
        /// Disk size in bytes.
        size_bytes: u64,
    },
    /// A page blob without a VHD footer, exposed whole.
    RawPageBlob {
        /// Blob size in bytes.
        size_bytes: u64,
    },
    /// A block blob, exposed read-only.
    BlockBlob {
        /// Blob size in bytes.
        size_bytes: u64,
    },
}

impl EntryKind {
    /// The file size this entry shows, or `None` for a directory.
    pub fn file_size(&self) -> Option<u64> {
        match *self {
            EntryKind::Dir => None,
            EntryKind::Drive { size_bytes }
            | EntryKind::RawPageBlob { size_bytes }
            | EntryKind::BlockBlob { size_bytes } => Some(size_bytes),
        }
    }
}

/// One entry of a container listing at some prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// The name relative to the listed prefix, without a trailing `/`.
    pub name: String,
    /// Directory, drive, raw page blob or block blob.
    pub kind: EntryKind,
    /// The snapshot time (as the service prints it) for a snapshot entry.
    pub snapshot: Option<String>,
    /// Last-modified time, when the listing gives one.
    pub modified: Option<SystemTime>,
}

/// Where a blob lives: the address [`Catalog::open`] takes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EntryPath {
    /// Container name.
    pub container: String,
    /// Full blob name inside the container (`dir/sub/disk.vhd`).
    pub blob: String,
    /// Snapshot time, for a read-only snapshot.
    pub snapshot: Option<String>,
}

impl fmt::Display for EntryPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.container, self.blob)?;
        if let Some(snapshot) = &self.snapshot {
            write!(f, "?snapshot={snapshot}")?;
        }
        Ok(())
    }
}

/// What the extended attributes of a drive show: the state `blobdrive
/// info` reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriveState {
    /// The lease as `info` words it (`available`, `leased (infinite)`);
    /// `None` for a snapshot, which has no lease.
    pub lease: Option<String>,
    /// How many snapshots the drive has; `None` for a snapshot.
    pub snapshots: Option<usize>,
    /// Bytes the blob stores (its page ranges, footer included).
    pub stored_bytes: u64,
}

/// The refusal of a change a catalog does not make (the defaults below).
fn not_here(what: &str) -> FsError {
    FsError::new(libc::EPERM, format!("{what} is not possible in this mount"))
}

/// The account as the namespace mount sees it.
#[async_trait]
pub trait Catalog: Send + Sync {
    /// Names of all containers of the account (every page of the listing).
    async fn list_containers(&self) -> FsResult<Vec<String>>;
    /// Blobs, snapshots and virtual directories directly under `prefix` (empty,
    /// or ending in `/`) in `container`, with `/` as delimiter, every page of it.
    async fn list_dir(&self, container: &str, prefix: &str) -> FsResult<Vec<DirEntry>>;
    /// Opens a blob. `writable` takes the drive's lease and fails with `EBUSY`
    /// while another writer holds it; snapshots and block blobs refuse it (`EROFS`).
    async fn open(&self, path: &EntryPath, writable: bool) -> FsResult<Arc<dyn Device>>;
    /// Creates container `name` (`EINVAL` for a name the service refuses,
    /// `EEXIST` when it exists).
    async fn create_container(&self, name: &str) -> FsResult<()> {
        Err(not_here(&format!("creating container {name}")))
    }
    /// Deletes container `name` if it holds no blob (`ENOTEMPTY` otherwise).
    async fn delete_container(&self, name: &str) -> FsResult<()> {
        Err(not_here(&format!("deleting container {name}")))
    }
    /// Makes a new drive of `size_bytes` at `path`, as `blobdrive create`
    /// does (`EINVAL` for a size the rules refuse, `EEXIST` when the blob
    /// exists).
    async fn create_drive(&self, path: &EntryPath, size_bytes: u64) -> FsResult<()> {
        let _ = size_bytes;
        Err(not_here(&format!("creating {path}")))
    }
    /// Deletes the drive (or the one snapshot) at `path` under `blobdrive
    /// delete`'s refusals: `EBUSY` while leased, `ENOTEMPTY` while it has
    /// snapshots, `EPERM` for a blob that is not a drive.
    async fn delete(&self, path: &EntryPath) -> FsResult<()> {
        Err(not_here(&format!("deleting {path}")))
    }
    /// The state of the drive (or snapshot) at `path`, for its extended
    /// attributes.
    async fn drive_state(&self, path: &EntryPath) -> FsResult<DriveState> {
        Err(FsError::new(
            libc::ENODATA,
            format!("{path}: no drive state in this mount"),
        ))
    }
}
