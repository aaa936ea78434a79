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

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};

use super::{attach, control, request_unmount, run_mount, MountOptions};
use crate::attach::{filesystem, FsType};
use crate::blob::{Account, BlobClient, BlobPath};
use crate::drive::DriveOptions;
use crate::fs::azure::AzureCatalog;
use crate::fs::one_drive::OneDriveCatalog;
use crate::fs::{Catalog, EntryPath};

/// How long the private mount may take to come up.
const MOUNT_TIMEOUT: Duration = Duration::from_secs(60);

/// Makes a filesystem of type `fs` on drive `path` (a base blob of
/// `size_bytes` disk bytes). Runs a FUSE mount on a helper thread: call it
/// where no fork follows.
pub fn format_drive(
    account: Account,
    path: &BlobPath,
    size_bytes: u64,
    fs: &FsType,
    data_key: Option<Arc<crate::crypt::DataKey>>,
) -> anyhow::Result<()> {
    let dir = private_dir(path)?;
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
            run_mount(&thread_dir, &opts, move || async move {
                let client = BlobClient::new(account)?;
                let inner: Arc<dyn Catalog> = Arc::new(
                    AzureCatalog::new(client, DriveOptions::default()).with_data_key(data_key),
                );
                let catalog: Arc<dyn Catalog> =
                    Arc::new(OneDriveCatalog::new(inner, drive, size_bytes));
                Ok(catalog)
            })
        })
        .context("cannot start the formatting mount")?;
    let started = Instant::now();
    while !attach::is_mount_point(&dir).unwrap_or(false) {
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
    tracing::info!(drive = %path, %fs, "making the filesystem");
    let made = filesystem::make(&file, fs).with_context(|| format!("mkfs.{fs} on {path} failed"));
    let unmounted = request_unmount(&dir);
    let served = server
        .join()
        .map_err(|_| anyhow!("the formatting mount panicked"))?;
    let _ = std::fs::remove_dir(&dir);
    made?;
    unmounted.with_context(|| format!("the filesystem on {path} may not be durable"))?;
    served.with_context(|| format!("the filesystem on {path} may not be durable"))?;
    Ok(())
}

fn private_dir(path: &BlobPath) -> anyhow::Result<PathBuf> {
    let root = control::run_dir().join("format");
    std::fs::create_dir_all(&root).with_context(|| format!("cannot create {}", root.display()))?;
    let name = control::mount_key(Path::new(&format!("{path}#{}", std::process::id())));
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}
