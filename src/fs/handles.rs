//! Open file handles and the devices behind them.
//!
//! One device per open file (inode), shared by all its handles. The first open
//! opens the device; the first *writable* open of a file already open read-only
//! opens it again read-write (taking the lease) and every handle moves to that
//! device, so readers see the writer's cached data. The last release flushes and
//! closes the device (releasing the lease). A read-only device that found its
//! blob changed fails every read from then on: a new open of the file gets a
//! fresh device, and the handles open before stay on the old one (their reads
//! keep failing: an open never sees two states). A `NAME.vhd` created in a
//! namespace mount and not yet sized has an empty device of its own until
//! its size makes the drive (`reopen_writable`). Opens and releases of one file are
//! serialized by an async gate; reads and writes only take a short lock to find
//! the current device.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use super::backend::{Catalog, Device, EntryPath, FsError, FsResult};

/// The device of an open file, and whether it was opened read-write.
#[derive(Clone)]
pub struct OpenDevice {
    /// The device.
    pub device: Arc<dyn Device>,
    /// True when it holds the lease.
    pub writable: bool,
    /// The FUSE reads it served.
    pub reads: Arc<FuseReads>,
}

impl OpenDevice {
    fn new(device: Arc<dyn Device>, writable: bool) -> Self {
        Self {
            device,
            writable,
            reads: Arc::default(),
        }
    }
}

/// The FUSE READ requests a device served and the bytes they returned
/// (`fuse_read_requests`, `fuse_read_bytes` in its stats). Their ratio is
/// the size the kernel's reads reach the daemon in (for an attach: the
/// loop device's requests, cut at FUSE's `max_pages`), which the cost of a
/// read per byte follows: each request is a wakeup, a task and a reply.
#[derive(Debug, Default)]
pub struct FuseReads {
    requests: AtomicU64,
    bytes: AtomicU64,
}

impl FuseReads {
    /// Counts one request that returned `bytes`.
    pub fn record(&self, bytes: usize) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct Gate {
    handles: usize,
    /// Read-only devices replaced by a read-write one; closed at the last release.
    retired: Vec<Arc<dyn Device>>,
}

struct OpenFile {
    path: EntryPath,
    gate: tokio::sync::Mutex<Gate>,
    current: RwLock<Option<OpenDevice>>,
}

impl OpenFile {
    fn current(&self) -> Option<OpenDevice> {
        self.current
            .read()
            .expect("device slot lock poisoned: a panic happened while holding it")
            .clone()
    }

    fn set_current(&self, device: Option<OpenDevice>) -> Option<OpenDevice> {
        let mut slot = self
            .current
            .write()
            .expect("device slot lock poisoned: a panic happened while holding it");
        std::mem::replace(&mut *slot, device)
    }
}

/// Where a handle's device comes from.
enum Opener<'a> {
    /// The catalog opens the blob.
    Catalog(&'a dyn Catalog),
    /// A created file with no size yet: no blob exists.
    Unsized,
}

/// The device of a `NAME.vhd` created in a namespace mount and not yet
/// given a size: empty, and nothing behind it (a write has no room:
/// `ENOSPC`, from `FsCore::write`'s end-of-disk check).
struct Unsized {
    path: EntryPath,
}

#[async_trait::async_trait]
impl Device for Unsized {
    fn size_bytes(&self) -> u64 {
        0
    }

    async fn read_at(&self, _offset_bytes: u64, _len: usize) -> FsResult<bytes::Bytes> {
        Ok(bytes::Bytes::new())
    }

    async fn write_at(&self, _offset_bytes: u64, _data: &[u8]) -> FsResult<()> {
        Err(FsError::new(
            libc::ENOSPC,
            format!(
                "{} has no size yet: give it one first (truncate -s SIZE)",
                self.path
            ),
        ))
    }

    async fn discard(&self, _offset_bytes: u64, _len_bytes: u64) -> FsResult<()> {
        Ok(())
    }

    async fn flush(&self) -> FsResult<()> {
        Ok(())
    }

    async fn close(&self) -> FsResult<()> {
        Ok(())
    }

    fn stats(&self) -> serde_json::Value {
        serde_json::json!({ "target": self.path.to_string(), "unsized": true })
    }
}

/// What an open handle is.
#[derive(Debug, Clone, Copy)]
pub struct Handle {
    /// Inode of the file.
    pub ino: u64,
    /// Opened for writing.
    pub writable: bool,
}

/// All open handles and files of a mount.
#[derive(Default)]
pub struct Handles {
    next_fh: AtomicU64,
    handles: Mutex<HashMap<u64, Handle>>,
    /// Handles kept on a read-only device that found its blob changed,
    /// after a new open replaced it as their file's current device.
    pinned: Mutex<HashMap<u64, OpenDevice>>,
    files: Mutex<HashMap<u64, Arc<OpenFile>>>,
    /// Final counters of the devices closed since the mount, by blob path (the
    /// last session of each), so `stats` still shows them after `dd` exits.
    closed: Mutex<serde_json::Map<String, serde_json::Value>>,
    /// Closes at the last release that failed (their data went to a recovery
    /// file, or is lost): the unmount reports them, so it exits non-zero.
    failed_closes: Mutex<Vec<FsError>>,
}

impl Handles {
    fn handles(&self) -> MutexGuard<'_, HashMap<u64, Handle>> {
        self.handles
            .lock()
            .expect("handle table lock poisoned: a panic happened while holding it")
    }

    fn pinned(&self) -> MutexGuard<'_, HashMap<u64, OpenDevice>> {
        self.pinned
            .lock()
            .expect("pinned handle lock poisoned: a panic happened while holding it")
    }

    fn files(&self) -> MutexGuard<'_, HashMap<u64, Arc<OpenFile>>> {
        self.files
            .lock()
            .expect("open file table lock poisoned: a panic happened while holding it")
    }

    /// Opens a handle on file `ino` (blob `path`), opening or upgrading its
    /// device. `fh` gives the handle's number (a takeover re-creates the
    /// handles the kernel holds); None takes the next one.
    pub async fn open(
        &self,
        catalog: &dyn Catalog,
        ino: u64,
        path: &EntryPath,
        writable: bool,
        fh: Option<u64>,
    ) -> FsResult<u64> {
        self.open_with(Opener::Catalog(catalog), ino, path, writable, fh)
            .await
    }

    /// Opens a handle on file `ino`, a `NAME.vhd` created in the mount and
    /// not yet given a size: its device is [`Unsized`] until
    /// [`Handles::reopen_writable`] replaces it with the new drive.
    pub async fn open_unsized(&self, ino: u64, path: &EntryPath, writable: bool) -> FsResult<u64> {
        self.open_with(Opener::Unsized, ino, path, writable, None)
            .await
    }

    /// Replaces the device of open file `ino` with one opened read-write
    /// from `catalog` (the drive just made for a created file); the handles
    /// open on it move to the new device. Nothing to do when it is not open.
    pub async fn reopen_writable(&self, catalog: &dyn Catalog, ino: u64) -> FsResult<()> {
        let Some(file) = self.files().get(&ino).cloned() else {
            return Ok(());
        };
        let mut gate = file.gate.lock().await;
        if gate.handles == 0 {
            return Ok(());
        }
        let device = catalog.open(&file.path, true).await?;
        tracing::debug!(path = %file.path, "device opened for the new drive");
        if let Some(old) = file.set_current(Some(OpenDevice::new(device, true))) {
            gate.retired.push(old.device);
        }
        Ok(())
    }

    async fn open_with(
        &self,
        opener: Opener<'_>,
        ino: u64,
        path: &EntryPath,
        writable: bool,
        fh: Option<u64>,
    ) -> FsResult<u64> {
        if let Some(fh) = fh {
            if self.handles().contains_key(&fh) {
                return Err(FsError::new(
                    libc::EEXIST,
                    format!("handle {fh} is open already"),
                ));
            }
        }
        let file = self
            .files()
            .entry(ino)
            .or_insert_with(|| {
                Arc::new(OpenFile {
                    path: path.clone(),
                    gate: tokio::sync::Mutex::new(Gate::default()),
                    current: RwLock::new(None),
                })
            })
            .clone();
        let mut gate = file.gate.lock().await;
        let current = file.current();
        let needs_open = match &current {
            None => true,
            Some(open) => (writable && !open.writable) || open_changed(open),
        };
        if needs_open {
            let device = match opener {
                Opener::Catalog(catalog) => catalog.open(path, writable).await?,
                Opener::Unsized => Arc::new(Unsized { path: path.clone() }),
            };
            tracing::debug!(%path, writable, "device opened");
            let replaced = file.set_current(Some(OpenDevice::new(device, writable)));
            if let Some(old) = replaced {
                if open_changed(&old) {
                    tracing::info!(%path, "the blob changed under its read-only device: new opens get a fresh one, the open handles keep failing");
                    self.pin_handles(ino, &old);
                }
                gate.retired.push(old.device);
            }
        }
        gate.handles += 1;
        let fh = match fh {
            Some(fh) => {
                // Numbers given later never reuse it.
                self.next_fh.fetch_max(fh, Ordering::Relaxed);
                fh
            }
            None => self.next_fh.fetch_add(1, Ordering::Relaxed) + 1,
        };
        self.handles().insert(fh, Handle { ino, writable });
        Ok(fh)
    }

    /// Keeps the open handles of file `ino` on `old` (a read-only device
    /// that found its blob changed) once a new open replaced it.
    fn pin_handles(&self, ino: u64, old: &OpenDevice) {
        let handles = self.handles();
        let mut pinned = self.pinned();
        for (fh, h) in handles.iter() {
            if h.ino == ino {
                pinned.entry(*fh).or_insert_with(|| old.clone());
            }
        }
    }

    /// The handle `fh` and the device it uses: its file's current one, or
    /// the changed one it stays on.
    pub fn get(&self, fh: u64) -> FsResult<(Handle, OpenDevice)> {
        let bad = || FsError::new(libc::EBADF, format!("no open handle {fh}"));
        let handle = *self.handles().get(&fh).ok_or_else(bad)?;
        if let Some(open) = self.pinned().get(&fh).cloned() {
            return Ok((handle, open));
        }
        let file = self.files().get(&handle.ino).cloned().ok_or_else(bad)?;
        let device = file.current().ok_or_else(bad)?;
        Ok((handle, device))
    }

    /// Releases handle `fh`; the last handle of a file flushes and closes its device.
    pub async fn release(&self, fh: u64) -> FsResult<()> {
        let handle = self
            .handles()
            .remove(&fh)
            .ok_or_else(|| FsError::new(libc::EBADF, format!("no open handle {fh}")))?;
        self.pinned().remove(&fh);
        let Some(file) = self.files().get(&handle.ino).cloned() else {
            return Ok(());
        };
        let mut gate = file.gate.lock().await;
        gate.handles = gate.handles.saturating_sub(1);
        if gate.handles > 0 {
            return Ok(());
        }
        let retired = std::mem::take(&mut gate.retired);
        let current = file.set_current(None);
        // Listed before the close too, so `stats` does not lose the device
        // while its last flush runs; the final counters replace these.
        self.remember_closed(&file.path, current.clone());
        let result = close_devices(&file.path, current.clone(), retired).await;
        self.remember_closed(&file.path, current);
        if let Err(err) = &result {
            self.failed_closes
                .lock()
                .expect("failed closes lock poisoned: a panic happened while holding it")
                .push(err.clone());
        }
        result
    }

    fn remember_closed(&self, path: &EntryPath, closed: Option<OpenDevice>) {
        if let Some(open) = closed {
            let stats = device_stats(&open, false);
            self.closed
                .lock()
                .expect("closed stats lock poisoned: a panic happened while holding it")
                .insert(path.to_string(), stats);
        }
    }

    /// Flushes every device opened read-write; returns the failures.
    pub async fn flush_all(&self) -> Vec<FsError> {
        let mut errors = Vec::new();
        for file in self.open_files() {
            if let Some(open) = file.current().filter(|open| open.writable) {
                if let Err(err) = open.device.flush().await {
                    tracing::error!(path = %file.path, %err, "flush failed");
                    errors.push(err);
                }
            }
        }
        errors
    }

    /// The size of file `ino`'s open device now (it changes when a drive
    /// grows), or `None` when the file is not open.
    pub fn live_size(&self, ino: u64) -> Option<u64> {
        let file = self.files().get(&ino).cloned()?;
        file.current().map(|open| open.device.size_bytes())
    }

    /// Grows every device opened read-write to `new_size_bytes`; fails when
    /// none is (only a writable open holds the lease a resize needs).
    pub async fn grow(&self, new_size_bytes: u64) -> FsResult<()> {
        let mut grown = 0;
        for file in self.open_files() {
            if let Some(open) = file.current().filter(|open| open.writable) {
                open.device.grow(new_size_bytes).await?;
                tracing::info!(path = %file.path, new_size_bytes, "device grown");
                grown += 1;
            }
        }
        if grown == 0 {
            return Err(FsError::new(
                libc::EROFS,
                "no drive of this mount is open read-write",
            ));
        }
        Ok(())
    }

    /// True when a writable open device's last flush found storage silent.
    pub fn storage_unanswered(&self) -> bool {
        self.open_files().iter().any(|file| {
            file.current()
                .is_some_and(|open| open.writable && open.device.storage_unanswered())
        })
    }

    /// Saves the unflushed data of every writable open device in a
    /// recovery file (after a failed flush); returns the files written.
    pub async fn save_unflushed_all(&self, reason: &str) -> SavedUnflushed {
        let mut saved = SavedUnflushed::default();
        for file in self.open_files() {
            if let Some(open) = file.current().filter(|open| open.writable) {
                match open.device.save_unflushed(reason).await {
                    Ok(Some(path)) => saved.files.push(path),
                    Ok(None) => {}
                    Err(err) => {
                        saved.failed = true;
                        tracing::error!(path = %file.path, %err, "saving unflushed data failed")
                    }
                }
            }
        }
        saved
    }

    /// Closes every open device, whatever handles remain (at unmount, after the
    /// kernel is gone); returns the failures, with those of earlier closes.
    pub async fn close_all(&self) -> Vec<FsError> {
        // Earlier closes that failed (at a last release) count too.
        let mut errors = std::mem::take(
            &mut *self
                .failed_closes
                .lock()
                .expect("failed closes lock poisoned: a panic happened while holding it"),
        );
        for file in self.open_files() {
            let mut gate = file.gate.lock().await;
            gate.handles = 0;
            let retired = std::mem::take(&mut gate.retired);
            let current = file.set_current(None);
            if let Err(err) = close_devices(&file.path, current.clone(), retired).await {
                errors.push(err);
            }
            self.remember_closed(&file.path, current);
        }
        self.handles().clear();
        errors
    }

    /// Counters of every device, by blob path: the open ones (`"open": true`)
    /// and the last session of those closed since the mount (`"open": false`).
    pub fn stats(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut map = self
            .closed
            .lock()
            .expect("closed stats lock poisoned: a panic happened while holding it")
            .clone();
        for file in self.open_files() {
            if let Some(open) = file.current() {
                map.insert(file.path.to_string(), device_stats(&open, true));
            }
        }
        map
    }

    fn open_files(&self) -> Vec<Arc<OpenFile>> {
        self.files().values().cloned().collect()
    }
}

/// A read-only device that found its blob changed: no new open uses it.
fn open_changed(open: &OpenDevice) -> bool {
    !open.writable && open.device.changed()
}

fn device_stats(open: &OpenDevice, is_open: bool) -> serde_json::Value {
    let mut stats = open.device.stats();
    if let Some(object) = stats.as_object_mut() {
        object.insert("writable".into(), open.writable.into());
        object.insert("open".into(), is_open.into());
        let reads = &open.reads;
        let requests = reads.requests.load(Ordering::Relaxed);
        object.insert("fuse_read_requests".into(), requests.into());
        let bytes = reads.bytes.load(Ordering::Relaxed);
        object.insert("fuse_read_bytes".into(), bytes.into());
    }
    stats
}

async fn close_devices(
    path: &EntryPath,
    current: Option<OpenDevice>,
    retired: Vec<Arc<dyn Device>>,
) -> FsResult<()> {
    let mut result = Ok(());
    for device in retired {
        if let Err(err) = device.close().await {
            tracing::warn!(%path, %err, "closing a replaced read-only device failed");
        }
    }
    if let Some(open) = current {
        match open.device.close().await {
            Ok(()) => tracing::debug!(%path, writable = open.writable, "device closed"),
            Err(err) => {
                tracing::error!(%path, %err, "closing the device failed; its data may not be durable");
                result = Err(err);
            }
        }
    }
    result
}

/// What saving the unflushed data of every writable device did.
#[derive(Debug, Default)]
pub struct SavedUnflushed {
    /// The recovery files written.
    pub files: Vec<std::path::PathBuf>,
    /// Some device's data could not be saved (logged).
    pub failed: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::memory::MemoryCatalog;

    fn disk_path() -> EntryPath {
        EntryPath {
            container: "c".into(),
            blob: "disk.vhd".into(),
            snapshot: None,
        }
    }

    #[tokio::test]
    async fn writable_open_upgrades_readers_and_last_release_closes_with_the_lease() {
        let catalog = MemoryCatalog::new();
        let disk = catalog.add_drive("c", "disk.vhd", 4096);
        let handles = Handles::default();
        let reader = handles
            .open(&*catalog, 7, &disk_path(), false, None)
            .await
            .unwrap();
        assert!(!disk.is_leased(), "read-only opens take no lease");
        let writer = handles
            .open(&*catalog, 7, &disk_path(), true, None)
            .await
            .unwrap();
        assert!(disk.is_leased());
        let (_, seen_by_reader) = handles.get(reader).unwrap();
        assert!(
            seen_by_reader.writable,
            "readers move to the read-write device"
        );

        let (_, device) = handles.get(writer).unwrap();
        device.device.write_at(0, &[1; 512]).await.unwrap();
        handles.release(writer).await.unwrap();
        assert!(disk.is_leased(), "a reader still holds the file open");
        handles.release(reader).await.unwrap();
        assert!(!disk.is_leased(), "the last release releases the lease");
        assert_eq!(disk.dirty_pages(), 0, "and flushed first");
        assert_eq!(disk.durable_bytes()[..512], [1; 512]);
        assert_eq!(
            disk.counters().closes,
            2,
            "the replaced read-only device is closed too"
        );
    }

    #[tokio::test]
    async fn a_refused_writable_open_leaves_no_handle() {
        let catalog = MemoryCatalog::new();
        catalog.add_drive("c", "disk.vhd", 4096);
        let first = Handles::default();
        let second = Handles::default();
        first
            .open(&*catalog, 2, &disk_path(), true, None)
            .await
            .unwrap();
        let err = second
            .open(&*catalog, 2, &disk_path(), true, None)
            .await
            .err()
            .unwrap();
        assert_eq!(err.errno, libc::EBUSY);
        assert!(second.stats().is_empty());
    }
    #[tokio::test]
    async fn an_open_after_the_blob_changed_gets_a_fresh_read_only_device() {
        let catalog = MemoryCatalog::new();
        let disk = catalog.add_drive("c", "disk.vhd", 4096);
        let handles = Handles::default();
        let before = handles
            .open(&*catalog, 3, &disk_path(), false, None)
            .await
            .unwrap();
        disk.change_behind_readers();
        let (_, old) = handles.get(before).unwrap();
        assert!(old.device.changed());
        let after = handles
            .open(&*catalog, 3, &disk_path(), false, None)
            .await
            .unwrap();
        let (_, fresh) = handles.get(after).unwrap();
        assert!(!fresh.device.changed(), "a new open gets a fresh device");
        let (_, kept) = handles.get(before).unwrap();
        assert!(
            Arc::ptr_eq(&kept.device, &old.device),
            "the handle open before stays on its device"
        );
        handles.release(before).await.unwrap();
        assert_eq!(disk.counters().closes, 0, "the file is still open");
        let (_, still) = handles.get(after).unwrap();
        assert!(Arc::ptr_eq(&still.device, &fresh.device));
        handles.release(after).await.unwrap();
        assert_eq!(
            disk.counters().closes,
            2,
            "both devices closed at the last release"
        );
    }
}
