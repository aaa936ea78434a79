//! In-memory [`Catalog`] and [`Device`]: the reference backend of the FUSE tests.
//!
//! A [`MemoryDisk`] keeps two images: `current` (what reads see) and `durable`
//! (what a crash would keep). Writes and discards change `current` and mark pages
//! dirty; only `flush` copies dirty pages into `durable`, so a test can tell a
//! flushed disk from one that merely cached the data. Writable opens take a
//! lease that a second writable open is refused (`EBUSY`), like the drive engine.
//! It counts every operation so tests can prove that fsync, fstrim and unmount
//! reached the device.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use bytes::Bytes;
use serde::Serialize;

use super::backend::{Catalog, Device, DirEntry, EntryKind, EntryPath, FsError, FsResult};
use crate::units::PAGE_SIZE;

/// Operation counts of one [`MemoryDisk`].
#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
pub struct DiskCounters {
    /// `read_at` calls.
    pub reads: u64,
    /// `write_at` calls.
    pub writes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// `discard` calls.
    pub discards: u64,
    /// Bytes discarded.
    pub discard_bytes: u64,
    /// `flush` calls (including the one inside `close` of a writable device).
    pub flushes: u64,
    /// Writable opens (leases taken).
    pub writable_opens: u64,
    /// `close` calls.
    pub closes: u64,
}

#[derive(Default)]
struct AtomicCounters {
    reads: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    discards: AtomicU64,
    discard_bytes: AtomicU64,
    flushes: AtomicU64,
    writable_opens: AtomicU64,
    closes: AtomicU64,
}

fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

struct DiskState {
    current: Vec<u8>,
    durable: Vec<u8>,
    dirty_pages: BTreeSet<u64>,
    leased: bool,
    /// A file that mirrors `durable` (for tests that check a daemon in another process).
    durable_file: Option<PathBuf>,
}

/// The bytes of one in-memory drive, shared by every device opened on it.
pub struct MemoryDisk {
    state: Mutex<DiskState>,
    counters: AtomicCounters,
    read_only: bool,
    /// Bumped by [`MemoryDisk::change_behind_readers`]: read-only devices
    /// opened before report [`Device::changed`].
    generation: AtomicU64,
}

impl MemoryDisk {
    fn new(data: Vec<u8>, read_only: bool) -> Arc<Self> {
        Arc::new(MemoryDisk {
            state: Mutex::new(DiskState {
                durable: data.clone(),
                current: data,
                dirty_pages: BTreeSet::new(),
                leased: false,
                durable_file: None,
            }),
            counters: AtomicCounters::default(),
            generation: AtomicU64::new(0),
            read_only,
        })
    }

    fn lock(&self) -> MutexGuard<'_, DiskState> {
        self.state
            .lock()
            .expect("memory disk lock poisoned: a test panicked while holding it")
    }

    /// Someone changed the blob behind the read-only devices open on it:
    /// each of them reports [`Device::changed`] from now on.
    pub fn change_behind_readers(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.lock().current.len() as u64
    }

    /// What reads return now (flushed or not).
    pub fn current_bytes(&self) -> Vec<u8> {
        self.lock().current.clone()
    }

    /// What has been flushed: what the blob would hold after a crash.
    pub fn durable_bytes(&self) -> Vec<u8> {
        self.lock().durable.clone()
    }

    /// Number of pages written but not yet flushed.
    pub fn dirty_pages(&self) -> usize {
        self.lock().dirty_pages.len()
    }

    /// True while a writable device holds the lease.
    pub fn is_leased(&self) -> bool {
        self.lock().leased
    }

    /// Mirrors the durable image into `path` on every flush (and now), so another
    /// process can check what a daemon made durable.
    pub fn mirror_durable_to(&self, path: PathBuf) -> std::io::Result<()> {
        let mut state = self.lock();
        std::fs::write(&path, &state.durable)?;
        state.durable_file = Some(path);
        Ok(())
    }

    /// A copy of the counters.
    pub fn counters(&self) -> DiskCounters {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DiskCounters {
            reads: get(&c.reads),
            writes: get(&c.writes),
            write_bytes: get(&c.write_bytes),
            discards: get(&c.discards),
            discard_bytes: get(&c.discard_bytes),
            flushes: get(&c.flushes),
            writable_opens: get(&c.writable_opens),
            closes: get(&c.closes),
        }
    }

    fn mark_dirty(state: &mut DiskState, start: u64, end: u64) {
        let first = start / PAGE_SIZE;
        let last = end.div_ceil(PAGE_SIZE);
        state.dirty_pages.extend(first..last);
    }

    /// Copies dirty pages into the durable image; returns them for the mirror file.
    fn flush_dirty(&self) -> (Option<PathBuf>, Vec<(u64, Vec<u8>)>) {
        let mut state = self.lock();
        let pages = std::mem::take(&mut state.dirty_pages);
        let mut runs = Vec::new();
        for page in pages {
            let start = (page * PAGE_SIZE) as usize;
            let end = (start + PAGE_SIZE as usize).min(state.current.len());
            let bytes = state.current[start..end].to_vec();
            state.durable[start..end].copy_from_slice(&bytes);
            runs.push((start as u64, bytes));
        }
        (state.durable_file.clone(), runs)
    }
}

/// A [`Device`] opened on a [`MemoryDisk`].
pub struct MemoryDevice {
    disk: Arc<MemoryDisk>,
    writable: bool,
    closed: AtomicBool,
    /// The disk's generation when this device opened.
    generation: u64,
}

impl MemoryDevice {
    fn check_open(&self) -> FsResult<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(FsError::io("memory device used after close"));
        }
        Ok(())
    }

    fn check_range(&self, offset_bytes: u64, len_bytes: u64) -> FsResult<()> {
        let size = self.disk.size_bytes();
        match offset_bytes.checked_add(len_bytes) {
            Some(end) if end <= size => Ok(()),
            _ => Err(FsError::new(
                libc::EINVAL,
                format!("range {offset_bytes}+{len_bytes} past the end of a {size}-byte disk"),
            )),
        }
    }

    fn check_writable(&self) -> FsResult<()> {
        if !self.writable {
            return Err(FsError::new(libc::EBADF, "memory device opened read-only"));
        }
        Ok(())
    }
}

#[async_trait]
impl Device for MemoryDevice {
    fn size_bytes(&self) -> u64 {
        self.disk.size_bytes()
    }

    fn changed(&self) -> bool {
        !self.writable && self.disk.generation.load(Ordering::Acquire) != self.generation
    }

    async fn read_at(&self, offset_bytes: u64, len: usize) -> FsResult<Bytes> {
        self.check_open()?;
        bump(&self.disk.counters.reads, 1);
        let state = self.disk.lock();
        let size = state.current.len() as u64;
        let start = offset_bytes.min(size) as usize;
        let end = offset_bytes.saturating_add(len as u64).min(size) as usize;
        Ok(Bytes::copy_from_slice(&state.current[start..end]))
    }

    async fn write_at(&self, offset_bytes: u64, data: &[u8]) -> FsResult<()> {
        self.check_open()?;
        self.check_writable()?;
        self.check_range(offset_bytes, data.len() as u64)?;
        bump(&self.disk.counters.writes, 1);
        bump(&self.disk.counters.write_bytes, data.len() as u64);
        let mut state = self.disk.lock();
        let start = offset_bytes as usize;
        state.current[start..start + data.len()].copy_from_slice(data);
        MemoryDisk::mark_dirty(&mut state, offset_bytes, offset_bytes + data.len() as u64);
        Ok(())
    }

    async fn discard(&self, offset_bytes: u64, len_bytes: u64) -> FsResult<()> {
        self.check_open()?;
        self.check_writable()?;
        self.check_range(offset_bytes, len_bytes)?;
        bump(&self.disk.counters.discards, 1);
        bump(&self.disk.counters.discard_bytes, len_bytes);
        let mut state = self.disk.lock();
        let (start, end) = (offset_bytes as usize, (offset_bytes + len_bytes) as usize);
        state.current[start..end].fill(0);
        MemoryDisk::mark_dirty(&mut state, offset_bytes, offset_bytes + len_bytes);
        Ok(())
    }

    async fn flush(&self) -> FsResult<()> {
        self.check_open()?;
        bump(&self.disk.counters.flushes, 1);
        let (mirror, runs) = self.disk.flush_dirty();
        if let Some(path) = mirror {
            tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                let file = std::fs::OpenOptions::new().write(true).open(path)?;
                for (offset, bytes) in runs {
                    file.write_all_at(&bytes, offset)?;
                }
                file.sync_all()
            })
            .await
            .map_err(|e| FsError::io(format!("mirror task failed: {e}")))?
            .map_err(|e| FsError::io(format!("cannot mirror durable image: {e}")))?;
        }
        Ok(())
    }

    async fn close(&self) -> FsResult<()> {
        self.check_open()?;
        if self.writable {
            self.flush().await?;
            self.disk.lock().leased = false;
        }
        self.closed.store(true, Ordering::Release);
        bump(&self.disk.counters.closes, 1);
        Ok(())
    }

    fn stats(&self) -> serde_json::Value {
        let mut value = serde_json::to_value(self.disk.counters())
            .expect("counters are plain integers and always serialize");
        value["dirty_pages"] = self.disk.dirty_pages().into();
        value
    }
}

struct MemoryBlob {
    kind: EntryKind,
    disk: Arc<MemoryDisk>,
    snapshots: BTreeMap<String, Arc<MemoryDisk>>,
}

/// An account held in memory: containers of drives, raw page blobs, block blobs
/// and snapshots.
#[derive(Default)]
pub struct MemoryCatalog {
    containers: Mutex<BTreeMap<String, BTreeMap<String, MemoryBlob>>>,
}

impl MemoryCatalog {
    /// An empty account.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, BTreeMap<String, MemoryBlob>>> {
        self.containers
            .lock()
            .expect("memory catalog lock poisoned: a test panicked while holding it")
    }

    /// Adds an empty container (no-op if it exists).
    pub fn add_container(&self, container: &str) {
        self.lock().entry(container.to_string()).or_default();
    }

    fn add_blob(
        &self,
        container: &str,
        blob: &str,
        kind: EntryKind,
        data: Vec<u8>,
    ) -> Arc<MemoryDisk> {
        let read_only = matches!(kind, EntryKind::BlockBlob { .. });
        let disk = MemoryDisk::new(data, read_only);
        self.lock()
            .entry(container.to_string())
            .or_default()
            .insert(
                blob.to_string(),
                MemoryBlob {
                    kind,
                    disk: disk.clone(),
                    snapshots: BTreeMap::new(),
                },
            );
        disk
    }

    /// Adds a zero-filled drive whose disk is `size_bytes` long.
    pub fn add_drive(&self, container: &str, blob: &str, size_bytes: u64) -> Arc<MemoryDisk> {
        let kind = EntryKind::Drive { size_bytes };
        self.add_blob(container, blob, kind, vec![0; size_bytes as usize])
    }

    /// Adds a page blob without a VHD footer.
    pub fn add_raw_page_blob(
        &self,
        container: &str,
        blob: &str,
        size_bytes: u64,
    ) -> Arc<MemoryDisk> {
        let kind = EntryKind::RawPageBlob { size_bytes };
        self.add_blob(container, blob, kind, vec![0; size_bytes as usize])
    }

    /// Adds a block blob with the given content.
    pub fn add_block_blob(&self, container: &str, blob: &str, data: Vec<u8>) -> Arc<MemoryDisk> {
        let kind = EntryKind::BlockBlob {
            size_bytes: data.len() as u64,
        };
        self.add_blob(container, blob, kind, data)
    }

    /// Takes a snapshot of a blob's durable bytes at time `snapshot`.
    pub fn add_snapshot(
        &self,
        container: &str,
        blob: &str,
        snapshot: &str,
    ) -> Option<Arc<MemoryDisk>> {
        let mut containers = self.lock();
        let entry = containers.get_mut(container)?.get_mut(blob)?;
        let disk = MemoryDisk::new(entry.disk.durable_bytes(), true);
        entry.snapshots.insert(snapshot.to_string(), disk.clone());
        Some(disk)
    }

    /// The disk of a blob (or of one of its snapshots).
    pub fn disk(&self, path: &EntryPath) -> Option<Arc<MemoryDisk>> {
        let containers = self.lock();
        let blob = containers.get(&path.container)?.get(&path.blob)?;
        match &path.snapshot {
            None => Some(blob.disk.clone()),
            Some(snapshot) => blob.snapshots.get(snapshot).cloned(),
        }
    }
}

#[async_trait]
impl Catalog for MemoryCatalog {
    async fn list_containers(&self) -> FsResult<Vec<String>> {
        Ok(self.lock().keys().cloned().collect())
    }

    async fn list_dir(&self, container: &str, prefix: &str) -> FsResult<Vec<DirEntry>> {
        let containers = self.lock();
        let blobs = containers
            .get(container)
            .ok_or_else(|| FsError::not_found(format!("no container {container}")))?;
        let mut entries = Vec::new();
        let mut dirs = BTreeSet::new();
        for (name, blob) in blobs.range(prefix.to_string()..) {
            let Some(rest) = name.strip_prefix(prefix) else {
                break;
            };
            if let Some((dir, _)) = rest.split_once('/') {
                dirs.insert(dir.to_string());
                continue;
            }
            entries.push(DirEntry {
                name: rest.to_string(),
                kind: blob.kind,
                snapshot: None,
                modified: None,
            });
            for snapshot in blob.snapshots.keys() {
                entries.push(DirEntry {
                    name: rest.to_string(),
                    kind: blob.kind,
                    snapshot: Some(snapshot.clone()),
                    modified: None,
                });
            }
        }
        entries.extend(dirs.into_iter().map(|name| DirEntry {
            name,
            kind: EntryKind::Dir,
            snapshot: None,
            modified: None,
        }));
        Ok(entries)
    }

    async fn open(&self, path: &EntryPath, writable: bool) -> FsResult<Arc<dyn Device>> {
        let disk = self
            .disk(path)
            .ok_or_else(|| FsError::not_found(format!("no blob {path}")))?;
        if writable {
            if path.snapshot.is_some() || disk.read_only {
                return Err(FsError::read_only(format!("{path} is read-only")));
            }
            let mut state = disk.lock();
            if state.leased {
                return Err(FsError::busy(format!("{path} is leased by another writer")));
            }
            state.leased = true;
            drop(state);
            bump(&disk.counters.writable_opens, 1);
        }
        let generation = disk.generation.load(Ordering::Acquire);
        Ok(Arc::new(MemoryDevice {
            disk,
            writable,
            closed: AtomicBool::new(false),
            generation,
        }))
    }
}
