//! `resize`: offline, under a lease of its own for the few requests it takes;
//! online, by asking the daemon that holds the drive's lease on this host to
//! grow it, then making the loop device and the filesystem take the new size.
//!
//! Invariants: a shrink is refused while attached, and offline unless what
//! the drive holds ends before the new end (a filesystem measured by its
//! superblock; a partition table is refused outright, since its partitions
//! are not checked yet); the blob keeps a valid footer at every step
//! (`drive::resize::move_footer`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use serde::Serialize;

use super::checks::{blob_err, is_leased};
use super::layout::{self, Layout};
use crate::attach::{filesystem, FsType, LoopDevice};
use crate::blob::{BlobClient, BlobPath, BlobType};
use crate::daemon::registry::AttachedDrive;
use crate::drive::resize::{locate_footer, move_footer};
use crate::drive::{BlobPageStore, PageStore};
use crate::units::{format_size, ByteRange};

/// How long the FUSE file may take to show its new size to the kernel
/// (attributes are cached for a few seconds).
const FILE_SIZE_WAIT: Duration = Duration::from_secs(15);

/// What a resize did.
#[derive(Debug, Clone, Serialize)]
pub struct ResizeReport {
    /// `container/blob`.
    pub drive: String,
    /// Disk size before, in bytes.
    pub old_size_bytes: u64,
    /// Disk size now, in bytes.
    pub new_size_bytes: u64,
    /// True when it was attached here and grown in place.
    pub online: bool,
    /// The filesystem found on the disk (`ext4`, `xfs`), if any.
    pub filesystem: Option<String>,
    /// True when the filesystem was grown to fill the disk.
    pub filesystem_grown: bool,
    /// True when this finished a resize an interruption had left half done.
    pub finished_interrupted: bool,
    /// What is left for the user to do, if anything.
    pub todo: Option<String>,
}

/// The refusal of a shrink asked for without `--allow-shrink`: a usage
/// error (the command line must change), which the CLI reports as one.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ShrinkNotAllowed(pub String);

/// The line for a drive leased by someone other than this host's daemon.
pub fn leased_elsewhere(path: &BlobPath) -> String {
    format!(
        "drive {path} is mounted (leased) by another host or by a namespace mount; resize it where it is attached, \
         or unmount it first (run 'blobdrive break-lease {path}' only if that host is gone)"
    )
}

/// Resizes a drive nobody has leased: grows it, or with `allow_shrink`
/// shrinks it after checking that nothing it holds reaches past the new end.
pub async fn resize_offline(
    client: &BlobClient,
    path: &BlobPath,
    new_size_bytes: u64,
    allow_shrink: bool,
) -> anyhow::Result<ResizeReport> {
    let props = client.get_properties(path).await.map_err(blob_err)?;
    if props.blob_type != Some(BlobType::PageBlob) {
        bail!("{path} is not a page blob, so not a drive");
    }
    if is_leased(props.lease_state) {
        bail!("{}", leased_elsewhere(path));
    }
    let lease_id = uuid::Uuid::new_v4().to_string();
    client
        .acquire_lease(path, &lease_id, None)
        .await
        .map_err(|e| {
            if e.is_lease_conflict() {
                anyhow!(leased_elsewhere(path))
            } else {
                blob_err(e)
            }
        })?;
    let result = resize_leased(client, path, new_size_bytes, allow_shrink, &lease_id).await;
    if let Err(e) = client.release_lease(path, &lease_id).await {
        tracing::warn!(drive = %path, error = %e, "could not release the resize lease");
    }
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
                "the disk grew but its {t} partitions did not: extend the last partition (growpart, sfdisk), then its filesystem"
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

/// The drive file the daemon of `entry` serves (the FUSE root is the
/// drive's container).
fn drive_file(entry: &AttachedDrive) -> PathBuf {
    let name = entry
        .drive
        .split_once('/')
        .map_or(entry.drive.as_str(), |(_, b)| b);
    entry.fuse_dir.join(name)
}

fn file_size(file: &Path) -> anyhow::Result<u64> {
    Ok(std::fs::metadata(file)
        .with_context(|| format!("cannot stat the drive file {}", file.display()))?
        .len())
}

/// Grows a drive attached read-write on this host, in place: the daemon
/// grows the blob under its lease, then the FUSE file, the loop device and
/// the filesystem take the new size, with no remount. Blocking: run it off
/// the async runtime.
pub fn resize_online(entry: &AttachedDrive, new_size_bytes: u64) -> anyhow::Result<ResizeReport> {
    let file = drive_file(entry);
    let old = file_size(&file)?;
    if new_size_bytes < old {
        bail!(
            "drive {} is attached at {}: a drive is never shrunk while attached; unmount it first (and shrink it with --allow-shrink)",
            entry.drive,
            entry.dir.display()
        );
    }
    crate::daemon::control::request_grow(&entry.dir, new_size_bytes)?;
    // The kernel caches the file's attributes; a stat after they expire
    // brings the new size in (a write racing with it can delay that).
    let started = Instant::now();
    while file_size(&file)? != new_size_bytes {
        if started.elapsed() > FILE_SIZE_WAIT {
            bail!(
                "the blob of {} grew to {}, but its FUSE file still shows {}; run 'blobdrive resize' again",
                entry.drive,
                format_size(new_size_bytes),
                format_size(file_size(&file)?)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let device = LoopDevice {
        device: entry.loop_device.clone(),
    };
    let seen = device
        .refresh_capacity()
        .map_err(|e| anyhow!("the drive grew, but its loop device did not: {e}"))?;
    if seen != new_size_bytes {
        bail!(
            "the drive grew to {}, but {} shows {}",
            format_size(new_size_bytes),
            entry.loop_device.display(),
            format_size(seen)
        );
    }
    let fs = FsType::from_name(&entry.fs_type);
    let grown = filesystem::grow(&fs, &entry.loop_device, &entry.dir).map_err(|e| {
        anyhow!("the drive and its loop device grew, but the filesystem did not: {e}")
    })?;
    let todo = (!grown).then(|| {
        format!(
            "blobdrive cannot grow a {} filesystem: grow it on {} yourself",
            entry.fs_type,
            entry.loop_device.display()
        )
    });
    Ok(ResizeReport {
        drive: entry.drive.clone(),
        old_size_bytes: old,
        new_size_bytes,
        online: true,
        filesystem: Some(entry.fs_type.clone()),
        filesystem_grown: grown,
        finished_interrupted: false,
        todo,
    })
}
