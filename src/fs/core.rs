//! The async core of the FUSE layer: namespace, attributes, handles and I/O, with
//! no knowledge of the kernel protocol (the shim in `fuse.rs` owns that).
//!
//! Listings are cached per directory for [`LISTING_TTL`]; a directory handle keeps
//! the listing it was opened with, so `readdir` offsets stay stable while the
//! cache refreshes. Every method may wait on the network and runs on tokio, never
//! on a FUSE thread.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use fuser::{FileAttr, FileType, INodeNo};

use super::backend::{Catalog, EntryKind, EntryPath, FsError, FsResult};
use super::handles::Handles;
use super::inodes::{InodeTable, Node, NodeKind};
use super::local::Local;

/// How long the kernel may cache attributes and names.
pub const ATTR_TTL: Duration = Duration::from_secs(2);
/// How long a directory listing is reused before the backend is asked again.
pub const LISTING_TTL: Duration = Duration::from_secs(5);
/// Separates a blob name from its snapshot time in file names.
pub const SNAPSHOT_SEPARATOR: char = '@';
/// `fallocate` mode of a discard from the loop device: punch hole, keep size.
pub const FALLOC_PUNCH_HOLE_KEEP_SIZE: i32 = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
/// `fallocate` mode of a write-zeroes from the loop device: zero range, keep size.
pub const FALLOC_ZERO_RANGE_KEEP_SIZE: i32 = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;

/// How the namespace is shown.
#[derive(Debug, Clone, Default)]
pub struct FsConfig {
    /// Refuse every write and writable open with `EROFS`.
    pub read_only: bool,
    /// Show only this container at the root (`blobdrive mount C DIR`).
    pub container: Option<String>,
    /// Owner shown on every file (the mounting user).
    pub uid: u32,
    /// Group shown on every file.
    pub gid: u32,
}

/// One name of a directory listing.
#[derive(Debug, Clone)]
pub struct Listed {
    /// File name shown to the kernel (`disk.vhd`, `disk.vhd@<time>`).
    pub name: String,
    /// Its inode.
    pub ino: u64,
    /// Directory or regular file.
    pub is_dir: bool,
}

struct Listing {
    fetched: Instant,
    entries: Arc<Vec<Listed>>,
    index: HashMap<String, usize>,
}

/// Counts the requests being served, so shutdown can wait for the last one.
#[derive(Default)]
pub struct InFlight {
    count: AtomicUsize,
    idle: tokio::sync::Notify,
}

/// Held by a request task while it runs.
pub struct InFlightGuard(Arc<InFlight>);

impl InFlight {
    /// Marks one more request in flight until the guard drops.
    pub fn enter(self: &Arc<Self>) -> InFlightGuard {
        self.count.fetch_add(1, Ordering::AcqRel);
        InFlightGuard(self.clone())
    }

    /// Returns when no request is in flight.
    pub async fn wait_idle(&self) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.count.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// The filesystem, as async methods over a [`Catalog`].
pub struct FsCore {
    pub(super) catalog: Arc<dyn Catalog>,
    config: FsConfig,
    pub(super) inodes: InodeTable,
    listings: Mutex<HashMap<u64, Listing>>,
    dir_handles: Mutex<HashMap<u64, Arc<Vec<Listed>>>>,
    next_dir_fh: AtomicU64,
    pub(super) handles: Handles,
    /// Directories made here and created files not yet sized.
    pub(super) local: Local,
    mounted_at: SystemTime,
    /// Requests being served.
    pub in_flight: Arc<InFlight>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .expect("fs core lock poisoned: a panic happened while holding it")
}

impl FsCore {
    /// Runs `work` on `runtime` under an in-flight guard (what an unmount
    /// waits for): how both FUSE front ends answer a request from a task.
    pub fn spawn_in_flight<F, Fut>(self: &Arc<Self>, runtime: &tokio::runtime::Handle, work: F)
    where
        F: FnOnce(Arc<FsCore>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let core = self.clone();
        let guard = core.in_flight.enter();
        runtime.spawn(async move {
            work(core).await;
            drop(guard);
        });
    }

    /// A filesystem over `catalog`.
    pub fn new(catalog: Arc<dyn Catalog>, config: FsConfig) -> Self {
        let mounted_at = SystemTime::now();
        let root = match &config.container {
            Some(container) => NodeKind::Dir {
                container: container.clone(),
                prefix: String::new(),
            },
            None => NodeKind::Account,
        };
        FsCore {
            catalog,
            inodes: InodeTable::new(root, mounted_at),
            config,
            listings: Mutex::new(HashMap::new()),
            dir_handles: Mutex::new(HashMap::new()),
            next_dir_fh: AtomicU64::new(1),
            handles: Handles::default(),
            local: Local::default(),
            mounted_at,
            in_flight: Arc::default(),
        }
    }

    /// How long the kernel may cache the name and attributes of `ino`: not
    /// at all for a created file not yet sized (it is gone at its last
    /// release, and its size is about to change), else [`ATTR_TTL`].
    pub fn ttl(&self, ino: u64) -> Duration {
        if self.local.is_pending(ino) {
            Duration::ZERO
        } else {
            ATTR_TTL
        }
    }

    /// True when the mount refuses writes.
    pub fn read_only(&self) -> bool {
        self.config.read_only
    }

    /// Drops the cached listing of directory `ino`, after a change in it.
    pub(super) fn forget_listing(&self, ino: u64) {
        lock(&self.listings).remove(&ino);
    }

    pub(super) fn node(&self, ino: u64) -> FsResult<Node> {
        self.inodes
            .get(ino)
            .ok_or_else(|| FsError::not_found(format!("no inode {ino}")))
    }

    /// The attributes `stat` shows for a node.
    pub fn attr(&self, node: &Node) -> FileAttr {
        let (kind, size, perm) = match &node.kind {
            NodeKind::Account | NodeKind::Dir { .. } => {
                let perm = if self.config.read_only { 0o555 } else { 0o755 };
                (FileType::Directory, 0, perm)
            }
            NodeKind::File { path, kind } => {
                let read_only = self.config.read_only
                    || path.snapshot.is_some()
                    || matches!(kind, EntryKind::BlockBlob { .. });
                let perm = if read_only { 0o444 } else { 0o644 };
                // An open drive may have grown since it was listed.
                let size = self
                    .handles
                    .live_size(node.ino)
                    .or(kind.file_size())
                    .unwrap_or(0);
                (FileType::RegularFile, size, perm)
            }
        };
        FileAttr {
            ino: INodeNo(node.ino),
            size,
            blocks: size.div_ceil(512),
            atime: node.modified,
            mtime: node.modified,
            ctime: node.modified,
            crtime: node.modified,
            kind,
            perm,
            nlink: if kind == FileType::Directory { 2 } else { 1 },
            uid: self.config.uid,
            gid: self.config.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    /// Attributes of inode `ino`.
    pub async fn getattr(&self, ino: u64) -> FsResult<FileAttr> {
        Ok(self.attr(&self.node(ino)?))
    }

    /// Attributes of `name` in directory `parent`.
    pub async fn lookup(&self, parent: u64, name: &str) -> FsResult<FileAttr> {
        let ino = {
            let listing = self.listing(parent).await?;
            let position = listing.1.get(name).copied();
            position.map(|i| listing.0[i].ino)
        };
        let ino = ino.ok_or_else(|| FsError::not_found(format!("no entry {name:?}")))?;
        self.getattr(ino).await
    }

    /// The (cached) listing of a directory: entries and name → position.
    pub(super) async fn listing(
        &self,
        ino: u64,
    ) -> FsResult<(Arc<Vec<Listed>>, HashMap<String, usize>)> {
        if let Some(listing) = lock(&self.listings).get(&ino) {
            if listing.fetched.elapsed() < LISTING_TTL {
                return Ok((listing.entries.clone(), listing.index.clone()));
            }
        }
        let entries = Arc::new(self.fetch_listing(ino).await?);
        let index: HashMap<String, usize> = entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.name.clone(), i))
            .collect();
        lock(&self.listings).insert(
            ino,
            Listing {
                fetched: Instant::now(),
                entries: entries.clone(),
                index: index.clone(),
            },
        );
        Ok((entries, index))
    }

    async fn fetch_listing(&self, ino: u64) -> FsResult<Vec<Listed>> {
        let node = self.node(ino)?;
        let mut listed = Vec::new();
        match node.kind {
            NodeKind::Account => {
                for container in self.catalog.list_containers().await? {
                    let kind = NodeKind::Dir {
                        container: container.clone(),
                        prefix: String::new(),
                    };
                    let child = self.inodes.upsert(ino, &container, kind, self.mounted_at);
                    listed.push(Listed {
                        name: container,
                        ino: child.ino,
                        is_dir: true,
                    });
                }
            }
            NodeKind::Dir { container, prefix } => {
                for entry in self.catalog.list_dir(&container, &prefix).await? {
                    if entry.name.is_empty() || entry.name.contains('/') || entry.name.len() > 255 {
                        tracing::debug!(name = %entry.name, "skipping a name the kernel cannot show");
                        continue;
                    }
                    let (name, kind) = match entry.kind {
                        EntryKind::Dir => (
                            entry.name.clone(),
                            NodeKind::Dir {
                                container: container.clone(),
                                prefix: format!("{prefix}{}/", entry.name),
                            },
                        ),
                        file_kind => {
                            let name = match &entry.snapshot {
                                Some(time) => format!("{}{SNAPSHOT_SEPARATOR}{time}", entry.name),
                                None => entry.name.clone(),
                            };
                            let path = EntryPath {
                                container: container.clone(),
                                blob: format!("{prefix}{}", entry.name),
                                snapshot: entry.snapshot.clone(),
                            };
                            (
                                name,
                                NodeKind::File {
                                    path,
                                    kind: file_kind,
                                },
                            )
                        }
                    };
                    if listed.iter().any(|l: &Listed| l.name == name) {
                        // A blob and a virtual directory of the same name: the blob wins.
                        continue;
                    }
                    let is_dir = matches!(kind, NodeKind::Dir { .. });
                    let modified = entry.modified.unwrap_or(self.mounted_at);
                    let child = self.inodes.upsert(ino, &name, kind, modified);
                    listed.push(Listed {
                        name,
                        ino: child.ino,
                        is_dir,
                    });
                }
            }
            NodeKind::File { .. } => {
                return Err(FsError::new(libc::ENOTDIR, "not a directory"));
            }
        }
        // What this mount holds that storage does not list (yet).
        for (name, entry) in self.local.children(ino) {
            if listed.iter().any(|l| l.name == name) {
                if entry.is_dir {
                    // A drive made in it: the blob names carry it now.
                    self.local.remove(ino, &name);
                }
                continue;
            }
            listed.push(Listed {
                name,
                ino: entry.ino,
                is_dir: entry.is_dir,
            });
        }
        Ok(listed)
    }

    /// Opens directory `ino`: its listing is fixed for the life of the handle.
    pub async fn opendir(&self, ino: u64) -> FsResult<u64> {
        let (entries, _) = self.listing(ino).await?;
        let fh = self.next_dir_fh.fetch_add(1, Ordering::Relaxed);
        lock(&self.dir_handles).insert(fh, entries);
        Ok(fh)
    }

    /// The listing a directory handle was opened with.
    pub fn readdir(&self, fh: u64) -> FsResult<Arc<Vec<Listed>>> {
        lock(&self.dir_handles)
            .get(&fh)
            .cloned()
            .ok_or_else(|| FsError::new(libc::EBADF, format!("no directory handle {fh}")))
    }

    /// Forgets a directory handle.
    pub fn releasedir(&self, fh: u64) {
        lock(&self.dir_handles).remove(&fh);
    }

    /// Opens file `ino`; `writable` when opened for writing. Returns the handle and
    /// whether the file is read-only content (a snapshot or block blob).
    pub async fn open(&self, ino: u64, writable: bool) -> FsResult<(u64, bool)> {
        self.open_as(ino, writable, None).await
    }

    /// [`FsCore::open`] with the handle number `fh` (a takeover re-creates
    /// the handles the kernel holds); None takes the next one.
    pub async fn open_as(
        &self,
        ino: u64,
        writable: bool,
        fh: Option<u64>,
    ) -> FsResult<(u64, bool)> {
        let node = self.node(ino)?;
        let NodeKind::File { path, kind } = &node.kind else {
            return Err(FsError::new(libc::EISDIR, "is a directory"));
        };
        let immutable = path.snapshot.is_some() || matches!(kind, EntryKind::BlockBlob { .. });
        if writable && self.config.read_only {
            return Err(FsError::read_only(format!(
                "{path}: the mount is read-only"
            )));
        }
        if writable && immutable {
            return Err(FsError::read_only(format!("{path} is read-only")));
        }
        if self.local.is_pending(ino) {
            let fh = self.handles.open_unsized(ino, path, writable).await?;
            return Ok((fh, false));
        }
        let fh = self
            .handles
            .open(&*self.catalog, ino, path, writable, fh)
            .await?;
        Ok((fh, immutable))
    }

    /// Reads up to `len` bytes at `offset_bytes` through handle `fh`.
    pub async fn read(&self, fh: u64, offset_bytes: u64, len: u32) -> FsResult<Bytes> {
        let (_, open) = self.handles.get(fh)?;
        let size = open.device.size_bytes();
        if offset_bytes >= size {
            return Ok(Bytes::new());
        }
        let len = (len as u64).min(size - offset_bytes) as usize;
        let data = open.device.read_at(offset_bytes, len).await?;
        open.reads.record(data.len());
        Ok(data)
    }

    pub(super) fn writable_device(&self, fh: u64) -> FsResult<super::handles::OpenDevice> {
        if self.config.read_only {
            return Err(FsError::read_only("the mount is read-only"));
        }
        let (handle, open) = self.handles.get(fh)?;
        if !handle.writable || !open.writable {
            return Err(FsError::new(libc::EBADF, "handle not open for writing"));
        }
        Ok(open)
    }

    /// Writes `data` at `offset_bytes`; a drive never grows, so the write is clipped
    /// at its end (`ENOSPC` when nothing fits).
    pub async fn write(&self, fh: u64, offset_bytes: u64, data: &[u8]) -> FsResult<u32> {
        let open = self.writable_device(fh)?;
        let size = open.device.size_bytes();
        if data.is_empty() {
            return Ok(0);
        }
        if offset_bytes >= size {
            let (handle, _) = self.handles.get(fh)?;
            if self.local.is_pending(handle.ino) {
                let name = self.node(handle.ino).map(|n| self.node_name(&n))?;
                return Err(FsError::new(
                    libc::ENOSPC,
                    format!("{name} has no size yet: give it one first ('truncate -s SIZE'), which makes the drive"),
                ));
            }
            return Err(FsError::new(
                libc::ENOSPC,
                "write past the end of a fixed-size drive",
            ));
        }
        let len = (data.len() as u64).min(size - offset_bytes) as usize;
        open.device.write_at(offset_bytes, &data[..len]).await?;
        Ok(len as u32)
    }

    /// `close(2)` of a handle (FUSE flush): makes its writes durable.
    pub async fn flush(&self, fh: u64) -> FsResult<()> {
        let (handle, open) = self.handles.get(fh)?;
        if handle.writable && open.writable {
            open.device.flush().await?;
        }
        Ok(())
    }

    /// `fsync(2)`, and the loop device's cache flush: makes all writes durable.
    pub async fn fsync(&self, fh: u64) -> FsResult<()> {
        let (_, open) = self.handles.get(fh)?;
        if open.writable {
            open.device.flush().await?;
        }
        Ok(())
    }

    /// Releases handle `fh`; the last one flushes and closes the device. A
    /// created file that never got a size is gone at its last release.
    pub async fn release(&self, fh: u64) -> FsResult<()> {
        let ino = self.handles.get(fh).ok().map(|(handle, _)| handle.ino);
        let result = self.handles.release(fh).await;
        if let Some(ino) = ino.filter(|&ino| self.handles.live_size(ino).is_none()) {
            self.forget_unsized(ino);
        }
        result
    }

    /// `fallocate`: punch-hole and zero-range (both keeping the size) discard;
    /// anything else would change a fixed-size disk and is refused.
    pub async fn fallocate(
        &self,
        fh: u64,
        offset_bytes: u64,
        len_bytes: u64,
        mode: i32,
    ) -> FsResult<()> {
        if mode == 0 || mode == libc::FALLOC_FL_KEEP_SIZE {
            return self
                .allocate(fh, offset_bytes.saturating_add(len_bytes), mode == 0)
                .await;
        }
        if mode != FALLOC_PUNCH_HOLE_KEEP_SIZE && mode != FALLOC_ZERO_RANGE_KEEP_SIZE {
            return Err(FsError::new(
                libc::EOPNOTSUPP,
                format!("fallocate mode {mode:#x}"),
            ));
        }
        let open = self.writable_device(fh)?;
        let size = open.device.size_bytes();
        let end = offset_bytes.saturating_add(len_bytes).min(size);
        if offset_bytes >= end {
            return Ok(());
        }
        open.device.discard(offset_bytes, end - offset_bytes).await
    }

    /// `setattr`: a created `NAME.vhd` not yet sized becomes a drive of
    /// `size` (see `changes.rs`); other sizes are fixed; mode, owner and
    /// times changes (`other_changes`) are accepted and ignored (the blob
    /// has nowhere to keep them). A read-only mount refuses every change.
    pub async fn setattr(
        &self,
        ino: u64,
        size: Option<u64>,
        other_changes: bool,
    ) -> FsResult<FileAttr> {
        let node = self.node(ino)?;
        if self.config.read_only && (size.is_some() || other_changes) {
            return Err(FsError::read_only(format!(
                "{}: the mount is read-only",
                self.node_name(&node)
            )));
        }
        if let Some(size) = size {
            self.resize_file(&node, size).await?;
        }
        Ok(self.attr(&self.node(ino)?))
    }

    /// `statfs`: the known drives' total size as capacity, no free-space
    /// figure (storage gives none; a drive's pages need no allocation), 4 KiB
    /// blocks.
    pub fn statfs(&self) -> Statfs {
        let block_size = 4096u64;
        Statfs {
            blocks: self.inodes.known_file_bytes().div_ceil(block_size),
            files: self.inodes.len() as u64,
            block_size: block_size as u32,
            name_max: 255,
        }
    }

    /// Counters of every device opened since the mount, by blob path (see
    /// `Handles::stats`).
    pub fn stats(&self) -> serde_json::Value {
        serde_json::Value::Object(self.handles.stats())
    }

    /// Grows the drive opened read-write to `new_size_bytes` (an online
    /// resize); `getattr` shows the new size from then on.
    pub async fn grow_drive(&self, new_size_bytes: u64) -> FsResult<()> {
        self.handles.grow(new_size_bytes).await
    }

    /// Flushes every writable device; returns the failures.
    pub async fn flush_all(&self) -> Vec<FsError> {
        self.handles.flush_all().await
    }

    /// True when a writable device's last flush found storage silent.
    pub fn storage_unanswered(&self) -> bool {
        self.handles.storage_unanswered()
    }

    /// Saves the unflushed data of every writable device in a recovery file
    /// (after a failed flush, before anything else can block); returns the
    /// files written, and whether any device's could not be saved.
    pub async fn save_unflushed_all(&self, reason: &str) -> super::handles::SavedUnflushed {
        self.handles.save_unflushed_all(reason).await
    }

    /// Waits for in-flight requests, then closes every device (flush + release
    /// lease); returns the failures.
    pub async fn close_all(&self) -> Vec<FsError> {
        self.in_flight.wait_idle().await;
        self.handles.close_all().await
    }
}

/// What `statfs` answers.
#[derive(Debug, Clone, Copy)]
pub struct Statfs {
    /// Capacity in blocks.
    pub blocks: u64,
    /// Inodes known.
    pub files: u64,
    /// Block size in bytes.
    pub block_size: u32,
    /// Longest file name.
    pub name_max: u32,
}
