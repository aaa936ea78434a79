//! The offline resize: a drive nobody has leased, resized under a lease of
//! its own (`checks::OPERATION_LEASE_SECS`, renewed while the resize runs),
//! released after, also when it fails or is interrupted (`cancel`: the
//! CLI's Ctrl-C and SIGTERM). Interrupted at any step, the drive is a drive
//! at its old or its new size, and running the resize again finishes it.
//!
//! Invariants: the drive is refused while anyone holds its lease (this
//! host's daemon included: an attached drive grows through `online.rs`);
//! the blob holds a valid footer at one of the two sizes at every step
//! (`drive::resize::move_footer`), and a grow an interruption left half done
//! is recognised (`locate_footer`) and finished; a shrink needs
//! `--allow-shrink` and is refused unless what the drive holds ends before
//! the new end: a filesystem measured by its superblock (`layout.rs`), data
//! past the end of an unknown layout, and any partition table (its
//! partitions are not checked yet). No table is written here: a grown GPT's
//! backup stays at the old end, and the todo says how to move it.

use std::future::Future;

use anyhow::{anyhow, bail};

use super::{leased_elsewhere, ResizeReport, ShrinkNotAllowed};
use crate::blob::{BlobClient, BlobPath, BlobType};
use crate::drive::resize::{locate_footer, move_footer};
use crate::drive::{BlobPageStore, PageStore};
use crate::lifecycle::checks::{blob_err, is_leased, operation_lease, release_operation_lease};
use crate::lifecycle::layout::{self, Layout};
use crate::units::{format_size, ByteRange};

/// Resizes a drive nobody has leased: grows it, or with `allow_shrink`
/// shrinks it after checking that nothing it holds reaches past the new end.
/// `cancel` resolving stops it between two requests and releases the lease.
pub async fn resize_offline(
    client: &BlobClient,
    path: &BlobPath,
    new_size_bytes: u64,
    allow_shrink: bool,
    cancel: impl Future<Output = ()>,
) -> anyhow::Result<ResizeReport> {
    let props = client.get_properties(path).await.map_err(blob_err)?;
    if props.blob_type != Some(BlobType::PageBlob) {
        bail!("{path} is not a page blob, so not a drive");
    }
    if is_leased(props.lease_state) {
        bail!("{}", leased_elsewhere(path));
    }
    let lease = operation_lease(client, path).await.map_err(|e| {
        if e.is_lease_conflict() {
            anyhow!(leased_elsewhere(path))
        } else {
            blob_err(e)
        }
    })?;
    // Dropped at its next request when cancelled: each step is one request,
    // and one still in flight carries the lease id, so the service refuses
    // it once the lease is released.
    let result = tokio::select! {
        r = resize_leased(client, path, new_size_bytes, allow_shrink, lease.id()) => r,
        () = cancel => Err(anyhow!(
            "resize of {path} was interrupted; it is a drive at its old or its new size: \
             'blobdrive info {path}' shows which, and running the resize again finishes it"
        )),
    };
    release_operation_lease(lease, path).await;
    result
}

async fn resize_leased(
    client: &BlobClient,
    path: &BlobPath,
    new_size_bytes: u64,
    allow_shrink: bool,
    lease_id: &str,
) -> anyhow::Result<ResizeReport> {
    let store = BlobPageStore::new(client.clone(), path.clone());
    let blob_bytes = store.size_bytes().await.map_err(blob_err)?;
    let located = locate_footer(&store, blob_bytes)
        .await
        .map_err(|e| anyhow!("{path} is not a drive: {e}"))?;
    let old = located.offset_bytes;
    let head_len = layout::HEAD_BYTES.min(old);
    let head = client
        .get_blob_range(path, ByteRange::new(0, head_len))
        .await
        .map_err(blob_err)?;
    let found = layout::detect(&head);
    if new_size_bytes < old {
        if !allow_shrink {
            return Err(ShrinkNotAllowed(format!(
                "{path} is {} and {} is smaller: shrinking cuts data off the end; add --allow-shrink to shrink it",
                format_size(old),
                format_size(new_size_bytes)
            ))
            .into());
        }
        check_shrink(&store, path, &found, old, new_size_bytes).await?;
    }
    let unchanged = new_size_bytes == old && !located.interrupted_grow;
    if !unchanged {
        move_footer(&store, &located.footer, old, new_size_bytes, Some(lease_id))
            .await
            .map_err(blob_err)?;
    }
    tracing::info!(drive = %path, old, new_size_bytes, "resized offline");
    let (filesystem, todo) = match found {
        Layout::Filesystem { kind, size_bytes } if size_bytes < new_size_bytes => (
            Some(kind.to_string()),
            Some(format!(
                "the {kind} filesystem is still {}: mount the drive and run 'blobdrive resize {path} --size {}' again to grow it in place",
                format_size(size_bytes),
                crate::units::exact_size(new_size_bytes)
            )),
        ),
        Layout::Filesystem { kind, .. } => (Some(kind.to_string()), None),
        Layout::PartitionTable(t) if new_size_bytes > old => (
            None,
            Some(format!(
                "the disk grew but its {t} partitions did not: mount the drive (its last partition) and run \
                 'blobdrive resize {path} --size {}' again to extend that partition and its filesystem in place, \
                 or extend the last partition yourself (sfdisk, growpart), then its filesystem",
                crate::units::exact_size(new_size_bytes)
            )),
        ),
        _ => (None, None),
    };
    Ok(ResizeReport {
        drive: path.to_string(),
        old_size_bytes: old,
        new_size_bytes,
        online: false,
        filesystem,
        filesystem_grown: false,
        finished_interrupted: located.interrupted_grow,
        partition: None,
        partition_grown: false,
        todo,
    })
}

async fn check_shrink(
    store: &BlobPageStore,
    path: &BlobPath,
    found: &Layout,
    old: u64,
    new_size_bytes: u64,
) -> anyhow::Result<()> {
    match *found {
        Layout::Filesystem { kind, size_bytes } if size_bytes > new_size_bytes => bail!(
            "the {kind} filesystem on {path} is {}: shrinking the drive to {} would cut it off; shrink the filesystem first",
            format_size(size_bytes),
            format_size(new_size_bytes)
        ),
        Layout::Filesystem { .. } => Ok(()),
        Layout::PartitionTable(t) => bail!(
            "{path} has a {t} partition table; blobdrive does not check partitions yet, so it does not shrink a partitioned drive"
        ),
        Layout::Unknown => {
            let beyond = store
                .page_ranges(ByteRange::new(new_size_bytes, old))
                .await
                .map_err(blob_err)?;
            if beyond.is_empty() {
                Ok(())
            } else {
                bail!(
                    "{path} holds data past {} and no filesystem blobdrive can measure; not shrinking it",
                    format_size(new_size_bytes)
                )
            }
        }
    }
}
