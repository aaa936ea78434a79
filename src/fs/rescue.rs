//! Rescuing a drive's unflushed pages into a recovery file (`crate::recovery`)
//! when they can no longer reach the blob: as soon as the drive's lease is
//! found lost (a watcher polls the drive), when a flush at unmount fails
//! (before anything else can block), and when its close fails.
//!
//! Why not wait for the close: once another host has broken the lease (a
//! take-over with `--break-lease`), the dirty pages of this host exist only in
//! the daemon's memory, and a daemon that is then killed or a host that
//! reboots would lose them. Writes are refused from the moment the lease is
//! lost, so the pages saved then are, barring a write that raced with the
//! loss, all there will ever be.
//!
//! Invariant: at most one recovery file per drive is left behind. A close that
//! fails with no write accepted since the last save names that file; one
//! that finds more writes a new file (a superset) and removes the older one;
//! one that succeeds removes it (the data is durable).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::drive::Drive;

/// How often the watcher looks at the drive's lease.
const LEASE_POLL: Duration = Duration::from_millis(500);

/// A recovery file saved for a drive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    /// The file.
    pub file: PathBuf,
    /// Unflushed bytes it holds.
    pub bytes: u64,
    /// The drive's write count when it was saved.
    writes: u64,
}

/// The recovery state of one open drive: the file saved so far and the
/// watcher task (aborted when the drive closes or is dropped).
#[derive(Default)]
pub struct Rescue {
    saved: tokio::sync::Mutex<Option<Saved>>,
    watcher: Mutex<Option<JoinHandle<()>>>,
}

/// What owns a drive and its rescue state (the FUSE device of a drive).
pub trait Rescuable: Send + Sync + 'static {
    /// The drive.
    fn drive(&self) -> &Drive;
    /// Its rescue state.
    fn rescue(&self) -> &Rescue;
    /// Storage account name, for the recovery file's header.
    fn account(&self) -> &str;
}

impl Rescue {
    /// Start watching `owner`'s drive: the first time its lease is found
    /// lost, save its unflushed pages. The task holds only a weak reference,
    /// so it ends with the device.
    pub fn watch<T: Rescuable>(owner: &Arc<T>) {
        let weak: Weak<T> = Arc::downgrade(owner);
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(LEASE_POLL).await;
                let Some(owner) = weak.upgrade() else { return };
                if let Some(lost) = owner.drive().lease_lost() {
                    let reason = lost.to_string();
                    // Logged inside, loudly, with the file's name.
                    let _ = owner.rescue().save(owner.as_ref(), &reason).await;
                    return;
                }
            }
        });
        *owner
            .rescue()
            .watcher
            .lock()
            .expect("watcher mutex poisoned") = Some(task);
    }

    /// Stop the watcher (the drive is closing).
    pub fn stop_watching(&self) {
        if let Some(task) = self.watcher.lock().expect("watcher mutex poisoned").take() {
            task.abort();
        }
    }

    /// Save the drive's unflushed pages, unless the file saved earlier holds
    /// exactly as many bytes (nothing was written since). `Ok(None)`: nothing
    /// is unflushed.
    pub async fn save<T: Rescuable + ?Sized>(
        &self,
        owner: &T,
        reason: &str,
    ) -> Result<Option<Saved>, crate::recovery::RecoveryError> {
        let drive = owner.drive();
        let mut saved = self.saved.lock().await;
        let writes = drive.writes_accepted();
        let bytes = drive.unflushed_bytes();
        if bytes == 0 {
            return Ok(None);
        }
        if let Some(old) = saved
            .as_ref()
            .filter(|s| s.bytes == bytes && s.writes == writes)
        {
            return Ok(Some(old.clone()));
        }
        let result = crate::recovery::save_drive(drive, owner.account(), reason).await;
        match &result {
            Ok(Some(file)) => {
                crate::metrics::count_recovery_file(drive.target());
                tracing::error!(
                    drive = %drive.target(),
                    file = %file.display(),
                    bytes,
                    "unflushed data SAVED TO A RECOVERY FILE: run 'blobdrive recover {}'",
                    file.display()
                );
                if let Some(old) = saved.take() {
                    // The new file holds every page the old one did.
                    let file = old.file.clone();
                    let removed = tokio::task::spawn_blocking(move || std::fs::remove_file(file))
                        .await
                        .map_err(std::io::Error::other)
                        .and_then(|r| r);
                    if let Err(e) = removed {
                        tracing::warn!(file = %old.file.display(), error = %e, "cannot remove the older recovery file");
                    }
                }
                *saved = Some(Saved {
                    file: file.clone(),
                    bytes,
                    writes,
                });
            }
            Ok(None) => {}
            Err(e) => {
                tracing::error!(drive = %drive.target(), error = %e, "saving a recovery file failed: unflushed data is only in memory");
            }
        }
        result.map(|file| {
            file.map(|file| Saved {
                file,
                bytes,
                writes,
            })
        })
    }

    /// Remove the file saved so far: its data reached the blob after all.
    pub async fn forget(&self) {
        let Some(old) = self.saved.lock().await.take() else {
            return;
        };
        tracing::info!(file = %old.file.display(), "the data of this recovery file is durable now; removing it");
        let file = old.file.clone();
        let removed = tokio::task::spawn_blocking(move || std::fs::remove_file(file))
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r);
        if let Err(e) = removed {
            tracing::warn!(file = %old.file.display(), error = %e, "cannot remove an obsolete recovery file");
        }
    }
}

impl Drop for Rescue {
    fn drop(&mut self) {
        self.stop_watching();
    }
}
