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
//! the new end, as the one layout detector reads it (`lifecycle::layout`,
//! the partition table first): every partition and a GPT's backup header,
//! or a whole-disk filesystem measured by its superblock; data past the new
//! end when nothing measurable is there (or an encrypted drive's key was
//! not given: its layout is read through the key, never from ciphertext).
//! No table is written here: a grown GPT's backup stays at the old end, and
//! the todo says how to move it.

use std::sync::Arc;

use std::future::Future;

use anyhow::{anyhow, bail};

use super::{leased_elsewhere, ResizeReport, ShrinkNotAllowed};
use crate::blob::{BlobClient, BlobPath, BlobType};
use crate::crypt::{DataKey, KeySlots};
use crate::drive::resize::{finish_recorded_grow, locate_footer, move_footer};
use crate::drive::{BlobPageStore, PageStore};
use crate::lifecycle::layout;
use crate::partition::{self, Layout};
use crate::provision::checks::{blob_err, is_leased, operation_lease, release_operation_lease};
use crate::units::{format_size, ByteRange};

/// Resizes a drive nobody has leased: grows it, or with `allow_shrink`
/// shrinks it after checking that nothing it holds reaches past the new end.
/// `key` is the unlocked data key of an encrypted drive: its layout is read
/// through it; without it, an encrypted drive's layout is unknown.
/// `cancel` resolving stops it between two requests and releases the lease.
pub async fn resize_offline(
    client: &BlobClient,
    path: &BlobPath,
    new_size_bytes: u64,
    allow_shrink: bool,
    key: Option<Arc<DataKey>>,
    cancel: impl Future<Output = ()>,
) -> anyhow::Result<ResizeReport> {
    let props = client.get_properties(path).await.map_err(blob_err)?;
    if props.blob_type != Some(BlobType::PageBlob) {
        bail!("{path} is not a page blob, so not a drive");
    }
    // An encrypted drive's layout is read as plaintext or not at all: its
    // ciphertext could pass for anything.
    let encrypted = !matches!(KeySlots::from_metadata(&props.metadata), Ok(None));
    let layout_store = (key.is_some() || !encrypted).then(|| layout::store_for(client, path, key));
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
        r = resize_leased(client, path, new_size_bytes, allow_shrink, lease.id(), layout_store) => r,
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
    layout_store: Option<Arc<dyn PageStore>>,
) -> anyhow::Result<ResizeReport> {
    let store = BlobPageStore::new(client.clone(), path.clone());
    let blob_bytes = store.size_bytes().await.map_err(blob_err)?;
    let located = locate_footer(&store, blob_bytes)
        .await
        .map_err(|e| anyhow!("{path} is not a drive: {e}"))?;
    let old = located.offset_bytes;
    let found = match layout_store {
        Some(s) => Some(layout::read_layout(s, &path.to_string(), old).await?),
        None => None,
    };
    if new_size_bytes < old {
        if !allow_shrink {
            return Err(ShrinkNotAllowed(format!(
                "{path} is {} and {} is smaller: shrinking cuts data off the end; add --allow-shrink to shrink it",
                format_size(old),
                format_size(new_size_bytes)
            ))
            .into());
        }
        check_shrink(&store, path, found.as_ref(), old, new_size_bytes).await?;
    }
    let unchanged = new_size_bytes == old && !located.interrupted_grow;
    let finished_interrupted = if unchanged {
        // A grow cut after its new footer: the same size again clears the
        // old footer page and the record it left.
        finish_recorded_grow(&store, &located, Some(lease_id))
            .await
            .map_err(blob_err)?
    } else {
        move_footer(&store, &located.footer, old, new_size_bytes, Some(lease_id))
            .await
            .map_err(blob_err)?;
        located.interrupted_grow
    };
    tracing::info!(drive = %path, old, new_size_bytes, "resized offline");
    let layout = found.and_then(Result::ok);
    let whole = layout
        .as_ref()
        .and_then(|l| l.whole.as_ref())
        .and_then(|fs| Some((fs.kind.name(), fs.size_bytes?)));
    let table = layout.as_ref().and_then(|l| l.table.as_ref());
    let (filesystem, todo) = match (whole, table) {
        (Some((kind, size_bytes)), _) if size_bytes < new_size_bytes => (
            Some(kind.to_string()),
            Some(format!(
                "the {kind} filesystem is still {}: mount the drive and run 'blobdrive resize {path} --size {}' again to grow it in place",
                format_size(size_bytes),
                crate::units::exact_size(new_size_bytes)
            )),
        ),
        (Some((kind, _)), _) => (Some(kind.to_string()), None),
        (None, Some(t)) if new_size_bytes > old => (
            None,
            Some(format!(
                "the disk grew but its {} partitions did not: mount the drive (its last partition) and run \
                 'blobdrive resize {path} --size {}' again to extend that partition and its filesystem in place, \
                 or extend the last partition yourself (sfdisk, growpart), then its filesystem",
                t.kind.name(),
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
        finished_interrupted,
        partition: None,
        partition_grown: false,
        todo,
    })
}

/// Refuses a shrink to `new_size_bytes` that would cut what the drive
/// holds: its partitions and table (or its whole-disk filesystem) as the
/// one layout detector reads them, table first; when nothing measurable is
/// there (unknown bytes, a filesystem whose size is not read, an encrypted
/// drive without its key), any data stored past the new end.
async fn check_shrink(
    store: &BlobPageStore,
    path: &BlobPath,
    found: Option<&Result<Layout, partition::Error>>,
    old: u64,
    new_size_bytes: u64,
) -> anyhow::Result<()> {
    let unknown_why = match found {
        Some(Err(e)) => {
            bail!("the partition table of {path} does not add up ({e}); not shrinking it")
        }
        Some(Ok(layout)) => match layout.reach() {
            Some(r) if r.end_bytes > new_size_bytes => bail!(
                "{} on {path} ends at {}: shrinking the drive to {} would cut it off; {}",
                r.what,
                format_size(r.end_bytes),
                format_size(new_size_bytes),
                r.before_shrinking
            ),
            Some(_) => return Ok(()),
            None => "no filesystem blobdrive can measure",
        },
        None => "its layout cannot be read without its key (--key-file or --passphrase-file)",
    };
    let beyond = store
        .page_ranges(ByteRange::new(new_size_bytes, old))
        .await
        .map_err(blob_err)?;
    if beyond.is_empty() {
        Ok(())
    } else {
        bail!(
            "{path} holds data past {} and {unknown_why}; not shrinking it",
            format_size(new_size_bytes)
        )
    }
}
