//! Images in and out of page blobs: `upload` (a raw image, a fixed VHD or a
//! dynamic VHD into a new page blob, written as a fixed VHD) and `download`
//! (a page blob into a sparse local file), both sparse, parallel and with
//! progress; uploads resume.
//!
//! Owns the transfer pipelines; not the REST client (`blob`), the footer
//! format (`vhd`) or the segmented page-range listing (`drive::BlobPageStore`,
//! reused here). The module map:
//! - `scan.rs`: holes (SEEK_DATA/SEEK_HOLE) and zero pages of a local image,
//!   the chunk grid and the content digest of a chunk;
//! - `image.rs`: what a local file is (raw, fixed VHD, dynamic VHD read
//!   through `vhd::dynamic`, refused) and its sizes;
//! - `journal.rs`: the resume record kept in the blob's metadata;
//! - `file_state.rs`: the record of what a downloaded file holds (which
//!   drive, snapshot and ETag; decrypted or stored; raw or VHD), read by
//!   `download --since` before it updates the file;
//! - `upload.rs`, `download.rs`: the pipelines; `progress.rs`: counters and display;
//! - `crc.rs`: CRC32C.
//!
//! Invariants: an upload holds a lease on the blob from before its first
//! write until after its last (two uploads cannot interleave, a mount cannot
//! attach a half-written drive); the VHD footer is written last, so an
//! incomplete upload is never a valid drive; a chunk is recorded as done only
//! after every Put Page of it succeeded; a download's file is recorded as
//! holding a state only after it was synced.

use std::path::PathBuf;

pub mod crc;
pub mod download;
pub mod file_state;
pub mod image;
pub mod journal;
pub mod progress;
pub mod scan;
pub mod upload;

pub use download::{download, DownloadOptions, DownloadReport};
pub use image::{ImageKind, SourceImage};
pub use progress::{Display, Progress, Reporter};
pub use upload::{upload, UploadOptions, UploadReport};

/// Default number of requests in flight.
pub const DEFAULT_PARALLEL: usize = 8;
/// Most requests in flight a user may ask for.
pub const MAX_PARALLEL: usize = 64;

/// What can go wrong in a transfer; each variant reads as one line that
/// says what to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The local image cannot be uploaded as it is.
    #[error("{}: {message}", path.display())]
    Image {
        /// The file.
        path: PathBuf,
        /// Why, and what to do.
        message: String,
    },
    /// A local file operation failed.
    #[error("cannot {what} {}: {error}", path.display())]
    Io {
        /// What was being done ("read", "create").
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause (part of the message, not a separate source, so the
        /// CLI's one line says it once).
        error: std::io::Error,
    },
    /// The service refused or could not be reached.
    #[error(transparent)]
    Blob(#[from] crate::blob::Error),
    /// The target blob exists and neither `--overwrite` nor `--resume` was given.
    #[error("blob {blob} already exists; use --overwrite to replace it, or --resume to continue an interrupted upload")]
    BlobExists {
        /// The blob.
        blob: String,
    },
    /// The blob is leased by someone else (a mount, another upload).
    #[error("blob {blob} is leased (mounted, or another upload is running); unmount it, or run 'blobdrive break-lease {blob}' if its holder is gone")]
    Leased {
        /// The blob.
        blob: String,
    },
    /// The local target exists and `--overwrite` was not given.
    #[error("{} already exists; use --overwrite to replace it", path.display())]
    FileExists {
        /// The file.
        path: PathBuf,
    },
    /// `--resume` was asked for but there is nothing (compatible) to resume.
    #[error("cannot resume the upload to {blob}: {reason}")]
    CannotResume {
        /// The blob.
        blob: String,
        /// Why, and what to do.
        reason: String,
    },
    /// The blob is not what the operation needs (not a page blob, no footer).
    #[error("{blob}: {reason}")]
    NotADrive {
        /// The blob.
        blob: String,
        /// Why.
        reason: String,
    },
    /// An upload failed part way; what was recorded can be resumed.
    #[error("upload to {blob} stopped after {done_chunks} of {chunks} chunks: {cause}; run the same command with --resume to continue")]
    Incomplete {
        /// The blob.
        blob: String,
        /// Chunks recorded as done.
        done_chunks: u64,
        /// All chunks.
        chunks: u64,
        /// What stopped it.
        cause: Box<Error>,
    },
    /// Another `download` is writing the same local file (it holds the
    /// file's lock).
    #[error("another update of {} is running; wait for it to finish", path.display())]
    Busy {
        /// The file.
        path: PathBuf,
    },
    /// A download of the live drive found it changed part way (its reads
    /// are pinned to the ETag seen at the start): nothing was kept.
    #[error("the drive changed while it was downloaded; download a snapshot: 'blobdrive snapshot {blob}' then --snapshot T")]
    Changed {
        /// The drive.
        blob: String,
    },
    /// Interrupted on request (Ctrl-C).
    #[error("interrupted")]
    Interrupted,
}

/// Result of the transfer layer.
pub type Result<T> = std::result::Result<T, Error>;

/// An [`Error::Io`] maker for `map_err`.
pub(crate) fn io_error<'a>(
    what: &'static str,
    path: &'a std::path::Path,
) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |error| Error::Io {
        what,
        path: path.to_path_buf(),
        error,
    }
}
