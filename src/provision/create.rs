//! The one way a new drive is made: the size checked against the rules of a
//! new drive (`units::check_drive_size`), the container created when
//! missing, a page blob of size + 512 bytes created conditionally
//! (`If-None-Match: *`, so an existing blob is never replaced: CloudDrive's
//! Create() could lose a drive that way), the key slots of an encrypted
//! drive saved, then the fixed VHD footer written. Only the footer is
//! written, so a new drive of any size stores 512 bytes.
//!
//! Invariant: when anything after the blob's creation fails, the blob just
//! made (ours, empty) is deleted again, so a failed create leaves nothing
//! that looks like a half-made drive; [`CreateError::Footer`] says whether
//! that cleanup worked.

use std::fmt;

use bytes::Bytes;

use crate::blob::{BlobClient, BlobPath, Error as BlobError};
use crate::crypt::KeySlots;
use crate::units::{check_drive_size, SizeError};
use crate::vhd::Footer;

/// Why a drive was not made.
#[derive(Debug)]
pub enum CreateError {
    /// The size breaks the rules of a new drive (whole MiB, 16 MiB to
    /// 8 TiB − 1 MiB); nothing was sent.
    Size(SizeError),
    /// Creating the blob failed (it exists already, the container is
    /// missing and could not be made, ...): nothing was left behind.
    Blob(BlobError),
    /// The blob was made but its key slots or footer could not be written;
    /// `cleanup` is how deleting the empty blob again went.
    Footer {
        /// What the footer (or key slot) write answered.
        error: BlobError,
        /// `Ok` when the empty blob was deleted again.
        cleanup: Result<(), BlobError>,
    },
}

impl fmt::Display for CreateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CreateError::Size(e) => write!(f, "{e}"),
            CreateError::Blob(e) => write!(f, "{e}"),
            CreateError::Footer { error, cleanup } => match cleanup {
                Ok(()) => write!(
                    f,
                    "writing the VHD footer failed, so the empty blob was deleted again: {error}"
                ),
                Err(d) => write!(
                    f,
                    "writing the VHD footer failed ({error}), and deleting the empty blob failed too ({d})"
                ),
            },
        }
    }
}

impl std::error::Error for CreateError {}

/// Whether [`create_drive`] made the container it was asked to put the
/// drive in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Created {
    /// True when the container did not exist and was created.
    pub container_created: bool,
}

/// Makes drive `path` of `size_bytes` (the disk, without the footer):
/// container if missing, conditional page blob, key `slots` of an
/// encrypted drive, footer. See the module comment for what a failure
/// leaves.
pub async fn create_drive(
    client: &BlobClient,
    path: &BlobPath,
    size_bytes: u64,
    slots: Option<&KeySlots>,
) -> Result<Created, CreateError> {
    check_drive_size(size_bytes).map_err(CreateError::Size)?;
    let container_created = match client.create_container(&path.container).await {
        Ok(created) => {
            if created {
                tracing::info!(container = %path.container, "created container");
            }
            created
        }
        // A SAS scoped to one container, or to blobs only, may not create
        // containers; if the container exists the drive can still be made,
        // and if not, creating the blob says so.
        Err(e) if e.is_auth_failure() => {
            tracing::debug!(container = %path.container, error = %e, "cannot create the container; trying the blob");
            false
        }
        Err(e) => return Err(CreateError::Blob(e)),
    };
    let footer = Footer::new_fixed(size_bytes);
    client
        .create_page_blob(path, footer.blob_size_bytes())
        .await
        .map_err(CreateError::Blob)?;
    // Key slots go in before the footer: a blob that looks like a drive
    // always says whether it is encrypted.
    let slots_saved = match slots {
        Some(slots) => save_new_slots(client, path, slots).await,
        None => Ok(()),
    };
    let written = match slots_saved {
        Ok(()) => {
            let bytes = Bytes::copy_from_slice(&footer.to_bytes());
            client.put_pages(path, size_bytes, bytes, None).await
        }
        Err(e) => Err(e),
    };
    if let Err(error) = written {
        let cleanup = client.delete_blob(path, false, None).await;
        return Err(CreateError::Footer { error, cleanup });
    }
    Ok(Created { container_created })
}

/// Adds the encryption header and first key slot to the new blob's metadata
/// (keeping what the create put there).
async fn save_new_slots(
    client: &BlobClient,
    path: &BlobPath,
    slots: &KeySlots,
) -> crate::blob::Result<()> {
    let mut metadata = client.get_properties(path).await?.metadata;
    slots.apply_to(&mut metadata);
    let pairs: Vec<(String, String)> = metadata.into_iter().collect();
    client.set_metadata(path, &pairs, None).await
}
