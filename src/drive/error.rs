//! `drive::Error`: what a user of the disk needs to know, one variant per
//! situation they can act on (in use elsewhere, lease lost, read-only, out of
//! range, closed, not a drive, a copy into it not complete, changed under a
//! read-only open, backend failure). Each maps to exactly one errno
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
    /// A copy or restore into the blob is pending, failed or was aborted
    /// (`x-ms-copy-status`): it may hold only part of its data, so it is
    /// not opened read-write.
    #[error("drive {target}: {}", copy_status_line(target, status))]
    CopyIncomplete {
        /// `container/blob`.
        target: String,
        /// Pending, failed, aborted or a value this version does not know.
        status: crate::blob::CopyStatus,
    },
    /// The blob changed (a restore, a resize, an upload --overwrite, a
    /// writer elsewhere) since this read-only open of it: every read fails
    /// from then on rather than mix its old and new states.
    #[error(
        "drive {target} changed in the blob since it was opened read-only (a restore, resize, \
         upload --overwrite or a writer elsewhere); its reads fail from now on rather than mix \
         two states: unmount and mount it again, or mount a snapshot ('blobdrive snapshot {target}')"
    )]
    Changed {
        /// `container/blob`.
        target: String,
    },
    /// An open failed after taking the lease, and releasing that lease
    /// failed too: the drive may stay locked until the lease is broken.
    #[error(
        "{cause}; releasing the lease this open took failed too ({release}), so drive {target} \
         may stay locked: 'blobdrive break-lease {target}' frees it if no mount of it is left"
    )]
    OpenFailedLocked {
        /// `container/blob`.
        target: String,
        /// Why the open failed.
        cause: Box<Error>,
        /// Why the release failed, as the service said.
        release: String,
    },
    /// An open that continues a writer lineage found the blob changed
    /// since the lineage left it (another writer came between): nothing of
    /// the lineage's may go into it (`blob/lineage.rs`).
    #[error("{0}")]
    Fenced(blob::Refusal),
    /// The blob service failed (after the client's retries).
    #[error(transparent)]
    Backend(#[from] blob::Error),
}

impl From<blob::ResumeError> for Error {
    fn from(e: blob::ResumeError) -> Self {
        match e {
            blob::ResumeError::Refused(r) => Error::Fenced(r),
            blob::ResumeError::Backend(b) => Error::Backend(b),
        }
    }
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
            Error::OpenFailedLocked { cause, .. } => cause.errno(),
            Error::NotADrive { .. } => libc::EINVAL,
            Error::CopyIncomplete { .. } => libc::EIO,
            Error::Changed { .. } => libc::EIO,
            Error::Fenced(_) => libc::EIO,
            Error::Backend(e) if e.is_not_found() => libc::ENOENT,
            Error::Backend(e) if e.is_auth_failure() => libc::EACCES,
            Error::Backend(_) => libc::EIO,
        }
    }
}

/// What a copy status that is not `success` means for the drive `target`
/// and what to do: the one wording `open` refuses with and `info` shows.
/// `None` for a finished copy (or none at all).
pub fn copy_status_problem(
    target: &str,
    status: Option<&crate::blob::CopyStatus>,
) -> Option<String> {
    use crate::blob::CopyStatus;
    match status {
        None | Some(CopyStatus::Success) => None,
        Some(s) => Some(copy_status_line(target, s)),
    }
}

fn copy_status_line(target: &str, status: &crate::blob::CopyStatus) -> String {
    use crate::blob::CopyStatus;
    match status {
        CopyStatus::Pending => format!(
            "a copy or restore into it is still pending (copy status pending), so it holds only part of its data; \
             it does not attach read-write until the copy ends: wait ('blobdrive info {target}' shows the copy status)"
        ),
        CopyStatus::Failed | CopyStatus::Aborted => format!(
            "the copy or restore into it {} (copy status {}), so it holds only part of its data; \
             it does not attach read-write: restore it from a snapshot ('blobdrive restore {target} --snapshot TIME'; \
             'blobdrive info {target}' lists them), or delete it and copy it again",
            if *status == CopyStatus::Failed { "failed" } else { "was aborted" },
            status.as_str()
        ),
        CopyStatus::Unknown(value) => format!(
            "a copy or restore into it ended in a state this version does not know (copy status {value}), \
             so it may hold only part of its data; it does not attach read-write \
             ('blobdrive info {target}' shows the copy status)"
        ),
        CopyStatus::Success => "the copy into it is complete".to_string(),
    }
}

/// Result with the drive's error.
pub type Result<T> = std::result::Result<T, Error>;
