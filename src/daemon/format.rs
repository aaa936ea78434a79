//! Formatting a drive (`blobdrive create --mkfs`): `mkfs` runs on the drive
//! file of a private, foreground FUSE mount that shows just that drive.
//!
//! Why the FUSE file and not a loop device: mkfs works on regular files, so
//! no loop device is needed; and why not a local image uploaded afterwards:
//! the drive engine already skips all-zero pages that hold no data (mkfs
//! zeroes journals and tables), holds the lease while mkfs writes, and needs
//! no local disk space. The formatting is durable when this returns: the
//! mount's unmount flushes every page and releases the lease, and its failure
//! is this function's failure.
//!
//! `with_drive_file` is that private mount for any work on a drive's file
//! (`new_uuid.rs` gives a copy's filesystems fresh UUIDs through it).
//!
//! With a partition table (`--partition-table gpt`), sfdisk writes the table
//! on the drive file first, and mkfs then runs on a loop device limited to
//! the partition (offset and size limit), detached before the unmount.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};

use super::mountpoint::{ensure_run_dir, is_mount_point, mount_key, run_dir};
use super::{attach, request_unmount, run_mount, MountOptions};
use crate::attach::{filesystem, table, FsType, LoopDevice};
use crate::blob::{Account, BlobClient, BlobPath};
use crate::drive::DriveOptions;
use crate::fs::azure::AzureCatalog;
use crate::fs::one_drive::OneDriveCatalog;
use crate::fs::{Catalog, EntryPath};

/// How long the private mount may take to come up.
const MOUNT_TIMEOUT: Duration = Duration::from_secs(60);

/// How to lay out a new drive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Format {
    /// Write a GPT with one Linux partition from 1 MiB to the end first.
    pub gpt: bool,
    /// The filesystem to make (in the partition when there is one).
    pub fs: Option<FsType>,
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.fs, self.gpt) {
            (Some(fs), true) => write!(f, "{fs} in partition 1 of a GPT"),
            (Some(fs), false) => write!(f, "{fs}"),
            (None, true) => f.write_str("a GPT with one empty partition"),
            (None, false) => f.write_str("nothing"),
        }
    }
}

/// Lays out drive `path` (a base blob of `size_bytes` disk bytes) as
/// `format` says. Runs a FUSE mount on a helper thread: call it where no
/// fork follows.
pub fn format_drive(
    account: Account,
    path: &BlobPath,
    size_bytes: u64,
    format: &Format,
    data_key: Option<Arc<crate::crypt::DataKey>>,
) -> anyhow::Result<()> {
    tracing::info!(drive = %path, %format, "formatting");
    with_drive_file(account, path, size_bytes, data_key, |file| {
        lay_out(file, format).with_context(|| format!("formatting {path} failed"))
    })
}

/// Runs `work` on the file of drive `path` (a base blob of `size_bytes`
/// disk bytes) in a private, foreground FUSE mount of it, which holds the
/// drive's lease; everything `work` wrote is durable in the blob when this
/// returns `Ok` (the unmount flushes it). Runs the mount on a helper
/// thread: call it where no fork follows.
pub(super) fn with_drive_file<T>(
    account: Account,
    path: &BlobPath,
    size_bytes: u64,
    data_key: Option<Arc<crate::crypt::DataKey>>,
    work: impl FnOnce(&Path) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let dir = private_dir(path, "")?;
    let drive = EntryPath {
        container: path.container.clone(),
        blob: path.name.clone(),
        snapshot: None,
    };
    let opts = MountOptions {
        foreground: true,
        container: Some(path.container.clone()),
        source: Some(format!("blobdrive-mkfs:{path}")),
        ..MountOptions::default()
    };
    let thread_dir = dir.clone();
    let file = dir.join(&path.name);
    let server = std::thread::Builder::new()
        .name("mkfs-mount".into())
        .spawn(move || {
            run_mount(&thread_dir, &opts, move |_takeover| {
                let (account, drive, data_key) = (account.clone(), drive.clone(), data_key.clone());
                async move {
                    let client = BlobClient::new(account)?;
                    let inner: Arc<dyn Catalog> = Arc::new(
                        AzureCatalog::new(client, DriveOptions::default()).with_data_key(data_key),
                    );
                    let catalog: Arc<dyn Catalog> =
                        Arc::new(OneDriveCatalog::new(inner, drive, size_bytes));
                    Ok(catalog)
                }
            })
        })
        .context("cannot start the formatting mount")?;
    let started = Instant::now();
    while !is_mount_point(&dir).unwrap_or(false) {
        if server.is_finished() {
            let result = server
                .join()
                .map_err(|_| anyhow!("the formatting mount panicked"))?;
            let _ = std::fs::remove_dir(&dir);
            result.context("cannot mount the new drive to format it")?;
            bail!("the formatting mount ended before it was ready");
        }
        if started.elapsed() > MOUNT_TIMEOUT {
            bail!("the formatting mount of {path} did not come up in {MOUNT_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let done = work(&file);
    let unmounted = request_unmount(&dir);
    let served = server
        .join()
        .map_err(|_| anyhow!("the formatting mount panicked"))?;
    let _ = std::fs::remove_dir(&dir);
    let value = done?;
    unmounted.with_context(|| format!("the filesystem on {path} may not be durable"))?;
    served.with_context(|| format!("the filesystem on {path} may not be durable"))?;
    Ok(value)
}

/// Writes the table and makes the filesystem on the drive file `file`.
fn lay_out(file: &Path, format: &Format) -> anyhow::Result<()> {
    if !format.gpt {
        if let Some(fs) = &format.fs {
            filesystem::make(file, fs)?;
        }
        return Ok(());
    }
    table::write_data_disk_gpt(file)?;
    let Some(fs) = &format.fs else {
        return Ok(());
    };
    // Read back what sfdisk wrote: the partition's place comes from the
    // table itself, and a table our reader refuses is caught here.
    let mut disk = crate::partition::FileDisk::open(file)?;
    let part = crate::partition::read_table(&mut disk)?
        .and_then(|t| t.partitions.into_iter().next())
        .ok_or_else(|| anyhow!("sfdisk wrote no partition"))?;
    let device = LoopDevice::attach_area(file, false, Some((part.start_bytes, part.size_bytes)))?;
    let made = filesystem::make(&device.device, fs);
    let detached = detach_and_wait(&device);
    made?;
    detached?;
    Ok(())
}

/// Detaches `device` and waits until it has let go of the drive file (the
/// private mount's unmount needs that).
pub(super) fn detach_and_wait(device: &LoopDevice) -> anyhow::Result<()> {
    let detached = device.detach();
    let started = Instant::now();
    while attach::loop_backing_file(&device.device).is_some() {
        if started.elapsed() > MOUNT_TIMEOUT {
            bail!(
                "loop device {} did not let go of the drive",
                device.device.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    detached?;
    Ok(())
}

/// A new private directory for work on drive `path` (`tag` tells two of
/// one process apart), under the run directory.
pub(super) fn private_dir(path: &BlobPath, tag: &str) -> anyhow::Result<PathBuf> {
    let root = ensure_run_dir()
        .with_context(|| format!("cannot use the run directory {}", run_dir().display()))?
        .join("format");
    std::fs::create_dir_all(&root).with_context(|| format!("cannot create {}", root.display()))?;
    let name = mount_key(Path::new(&format!("{path}#{}{tag}", std::process::id())));
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}
