//! The end of a daemon's drives, one path for a mount and an NBD server:
//! flush; when storage is already silent, or the flush fails, save the
//! unflushed pages in a recovery file first (before anything else can
//! block or a stop timeout cut the end short); then close every drive,
//! which flushes once more and replaces that file with a complete one or
//! removes it. A failure is said in one line, never swallowed.

use async_trait::async_trait;

use crate::fs::handles::SavedUnflushed;
use crate::fs::{FsCore, FsError};

/// The open drives a daemon closes at its end: a mount's `FsCore`, or the
/// exports of an NBD server.
#[async_trait]
pub trait Closing: Send + Sync {
    /// True when the last flush found storage silent (an outage).
    fn storage_unanswered(&self) -> bool;
    /// Saves the unflushed data of every writable drive in a recovery file.
    async fn save_unflushed_all(&self, reason: &str) -> SavedUnflushed;
    /// Flushes every drive; returns the failures.
    async fn flush_all(&self) -> Vec<FsError>;
    /// Closes every drive (flush, lease released); returns the failures.
    async fn close_all(&self) -> Vec<FsError>;
}

#[async_trait]
impl Closing for FsCore {
    fn storage_unanswered(&self) -> bool {
        FsCore::storage_unanswered(self)
    }
    async fn save_unflushed_all(&self, reason: &str) -> SavedUnflushed {
        FsCore::save_unflushed_all(self, reason).await
    }
    async fn flush_all(&self) -> Vec<FsError> {
        FsCore::flush_all(self).await
    }
    async fn close_all(&self) -> Vec<FsError> {
        FsCore::close_all(self).await
    }
}

/// Flushes before the close; a flush that fails (the client already
/// retried for its whole budget, or the lease is gone), or storage that is
/// already silent, gets the dirty pages saved in a recovery file now. The
/// close that follows tries once more and replaces or removes the file.
pub async fn flush_before_close(drives: &dyn Closing) {
    if drives.storage_unanswered() {
        // Another flush would wait a whole retry budget before the dirty
        // pages are safe anywhere: save them first.
        tracing::error!("storage is not answering; saving unflushed data to a recovery file first");
        let saved = drives
            .save_unflushed_all("storage did not answer at the end")
            .await;
        tracing::info!(files = saved.files.len(), "recovery files written");
        return;
    }
    let errors = drives.flush_all().await;
    if !errors.is_empty() {
        let reason = join_errors(&errors);
        tracing::error!(errors = %reason, "final flush failed; unflushed data goes to a recovery file");
        let saved = drives.save_unflushed_all(&reason).await;
        tracing::info!(files = saved.files.len(), "recovery files written");
    }
}

/// Closes every drive; the line to show when one failed, saying whether
/// every write is durable all the same (only the release failed).
pub async fn close_drives(drives: &dyn Closing) -> Result<(), String> {
    let errors = drives.close_all().await;
    if errors.is_empty() {
        Ok(())
    } else if errors.iter().all(|e| e.data_durable) {
        Err(format!(
            "every write is durable, but {}",
            join_errors(&errors)
        ))
    } else {
        Err(format!("data may not be durable: {}", join_errors(&errors)))
    }
}

/// The errors in one line.
pub fn join_errors(errors: &[FsError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}
