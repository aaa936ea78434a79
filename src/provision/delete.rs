//! The one way a drive (or one snapshot of it) is deleted, with the
//! refusals every caller gets: a leased blob is never deleted (the lease is
//! the mount lock), a blob that is not a drive only when forced, and a
//! drive with snapshots only when they are to go too. The `delete` command
//! and `rm` in a namespace mount both call [`delete_drive`]; each words the
//! typed refusal for its user (a flag to add, or the command to run).

use crate::blob::{BlobClient, BlobPath, Error as BlobError};

use super::checks::{check_disk, is_leased, snapshots_of};

/// What a delete may also remove.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeleteOptions {
    /// Delete the drive's snapshots with it.
    pub include_snapshots: bool,
    /// Delete the blob even if it is not a drive (never while leased).
    pub force: bool,
}

/// Why a delete was refused or failed; nothing was deleted.
#[derive(Debug)]
pub enum DeleteError {
    /// The blob is leased: mounted here or elsewhere.
    Leased,
    /// The blob is not a drive, and the delete was not forced; why not.
    NotADrive(String),
    /// The drive has this many snapshots, and they were not to go.
    HasSnapshots(usize),
    /// Reading the blob's state or deleting it failed.
    Blob(BlobError),
}

impl From<BlobError> for DeleteError {
    fn from(e: BlobError) -> Self {
        DeleteError::Blob(e)
    }
}

/// What was deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deleted {
    /// Snapshots deleted with the drive.
    pub snapshots: usize,
}

/// Deletes `path` (a drive, or the one snapshot it names) after the checks
/// the module comment lists, in that order.
pub async fn delete_drive(
    client: &BlobClient,
    path: &BlobPath,
    opts: DeleteOptions,
) -> Result<Deleted, DeleteError> {
    let props = client.get_properties(path).await?;
    if path.snapshot.is_none() && is_leased(props.lease_state) {
        return Err(DeleteError::Leased);
    }
    if !opts.force {
        let check = check_disk(client, path, props.blob_type, props.content_length).await?;
        if let Some(problem) = check.problem(path) {
            return Err(DeleteError::NotADrive(problem));
        }
    }
    let snapshots = if path.snapshot.is_none() {
        snapshots_of(client, path).await?.len()
    } else {
        0
    };
    if snapshots > 0 && !opts.include_snapshots {
        return Err(DeleteError::HasSnapshots(snapshots));
    }
    client
        .delete_blob(path, opts.include_snapshots, None)
        .await?;
    tracing::info!(drive = %path, snapshots, "deleted");
    Ok(Deleted { snapshots })
}
