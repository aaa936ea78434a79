//! `drive::Error`: what a user of the disk needs to know, one variant per
//! situation they can act on (in use elsewhere, lease lost, read-only, out of
//! range, closed, not a drive, backend failure). Each maps to exactly one errno
//! through [`Error::errno`]; the FUSE layer uses that and nothing else.

use crate::blob;

/// An error from the drive engine.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// Another holder has the lease: the drive is mounted elsewhere.
    #[error(
        "drive {target} is in use elsewhere (lease held); if that host is gone, \
         mount with --break-lease or run 'blobdrive break-lease {target}'"
    )]
    InUse {
        /// `container/blob`.
        target: String,
    },
    /// Our lease was broken or taken while the drive was open: writes are
    /// refused; unflushed data is kept in memory (see `Drive::unflushed_bytes`).
    #[error(
        "lease on drive {target} was lost (broken by someone else); writes are refused \
         and unflushed data is kept in memory"
    )]
    LeaseLost {
        /// `container/blob`.
        target: String,
    },
    /// A write or discard on a drive opened read-only or from a snapshot.
    #[error("drive is read-only")]
    ReadOnly,
    /// A write or discard reaching past the end of the data area.
    #[error("range {offset_bytes}+{len_bytes} is past the end of the drive ({size_bytes} bytes)")]
    OutOfRange {
        /// First byte asked for.
        offset_bytes: u64,
        /// Length asked for.
        len_bytes: u64,
        /// Size of the data area.
        size_bytes: u64,
    },
    /// The drive was closed.
    #[error("drive is closed")]
    Closed,
    /// The blob does not hold a fixed VHD the drive can use.
    #[error("not a drive: {reason}")]
    NotADrive {
        /// Why, in words.
        reason: String,
    },
    /// A flush pass found no answer from storage for a whole retry budget:
    /// the pages stay dirty (in memory) and go out when storage answers.
    #[error(
        "storage did not answer within {secs} s while flushing drive {target}; \
         the unflushed data is kept in memory"
    )]
    Stalled {
        /// `container/blob`.
        target: String,
        /// How long the pass waited.
        secs: u64,
    },
    /// Every write is durable in the blob, but the lease could not be
    /// released: the drive stays locked until it is (or is broken).
    #[error(
        "drive {target}: all data is durable in the blob, but releasing its lease failed \
         ({cause}); it stays locked: run 'blobdrive break-lease {target}' if no mount of it \
         is left"
    )]
    ReleaseFailed {
        /// `container/blob`.
        target: String,
        /// The service's error (boxed: it is large and rare).
        cause: Box<blob::Error>,
    },
    /// The blob service failed (after the client's retries).
    #[error(transparent)]
    Backend(#[from] blob::Error),
}

impl Error {
    /// The errno the FUSE layer answers with.
    pub fn errno(&self) -> i32 {
        match self {
            Error::InUse { .. } => libc::EBUSY,
            Error::LeaseLost { .. } => libc::EIO,
            Error::ReadOnly => libc::EROFS,
            Error::OutOfRange { .. } => libc::ENOSPC,
            Error::Closed => libc::EIO,
            Error::Stalled { .. } => libc::EIO,
            Error::ReleaseFailed { .. } => libc::EIO,
            Error::NotADrive { .. } => libc::EINVAL,
            Error::Backend(e) if e.is_not_found() => libc::ENOENT,
            Error::Backend(e) if e.is_auth_failure() => libc::EACCES,
            Error::Backend(_) => libc::EIO,
        }
    }
}

/// Result with the drive's error.
pub type Result<T> = std::result::Result<T, Error>;
