//! A consistent snapshot of a drive: when this host has it attached
//! read-write, freeze its filesystem (everything it wrote is on the loop
//! device, and writers wait), ask the daemon to flush (everything the loop
//! device wrote is durable in the blob), take the blob snapshot, and thaw —
//! thaw always, even when the flush or the snapshot failed. A drive this
//! host serves read-write over NBD is flushed first (its clients' own
//! filesystems are theirs to quiesce).

use std::path::PathBuf;

use anyhow::{anyhow, Context as _};

use super::control::request_flush;
use super::registry;
use crate::attach::filesystem;
use crate::blob::{BlobClient, BlobPath};

/// A snapshot taken by [`snapshot_drive`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotTaken {
    /// The snapshot time, as the service gives it.
    pub time: String,
    /// The directory that was frozen for it, when the drive was attached here.
    pub frozen: Option<PathBuf>,
}

/// Snapshots `path` (a base blob), consistently when this host has it
/// attached read-write.
pub async fn snapshot_drive(client: &BlobClient, path: &BlobPath) -> anyhow::Result<SnapshotTaken> {
    let path = path.base();
    let drive = format!("{}/{}", path.container, path.name);
    let attached = registry::find_read_write(&client.account().name, &drive);
    let Some(entry) = attached else {
        // Served read-write over NBD here: no filesystem of ours to freeze,
        // but every write its clients were answered for goes first.
        if let Some(server) = super::served::find_read_write(&client.account().name, &drive) {
            tracing::info!(endpoint = %server.endpoint, "flushing the NBD export for the snapshot");
            let key = server.key.clone();
            blocking(move || request_flush(&key)).await?;
        }
        let time = client
            .snapshot(&path)
            .await
            .with_context(|| format!("cannot snapshot {path}"))?;
        return Ok(SnapshotTaken { time, frozen: None });
    };
    let dir = entry.dir;
    tracing::info!(dir = %dir.display(), "freezing the attached filesystem for the snapshot");
    let frozen = dir.clone();
    blocking(move || filesystem::freeze(&frozen).map_err(anyhow::Error::new))
        .await
        .with_context(|| format!("cannot freeze {} for a consistent snapshot", dir.display()))?;
    let flushed_dir = dir.clone();
    let taken = async {
        blocking(move || request_flush(&flushed_dir)).await?;
        client
            .snapshot(&path)
            .await
            .with_context(|| format!("cannot snapshot {path}"))
    }
    .await;
    let thaw_dir = dir.clone();
    let thawed = blocking(move || filesystem::thaw(&thaw_dir).map_err(anyhow::Error::new)).await;
    match (taken, thawed) {
        (Ok(time), Ok(())) => Ok(SnapshotTaken {
            time,
            frozen: Some(dir),
        }),
        (Ok(time), Err(err)) => Err(anyhow!(
            "snapshot {time} of {path} was taken, but {} is still frozen: {err:#}; \
             run 'fsfreeze --unfreeze {}'",
            dir.display(),
            dir.display()
        )),
        (Err(err), thawed) => {
            if let Err(thaw_err) = thawed {
                tracing::error!("{} is still frozen: {thaw_err:#}", dir.display());
            }
            Err(err)
        }
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .context("a blocking call panicked")?
}
