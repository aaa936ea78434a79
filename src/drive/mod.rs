//! The drive engine: a block device over one page blob, with no FUSE knowledge.
//!
//! [`Drive`] owns a page cache (512-byte pages in 256 KiB chunks whose memory
//! comes in 4 KiB blocks, LRU-evicted, bounded, with a dirty budget), an optional disk tier below it (`disk_cache`, `tier.rs`), a sparse map of the pages that hold data, the lease that is the
//! mount lock, and a background flusher. The blob is reached only through the
//! [`PageStore`] trait. Invariants that matter: only the data area (blob size
//! minus the VHD footer) is reachable; `flush` returns only once every write
//! accepted before it is durable; dirty data is never dropped, even when the
//! lease is lost.

mod allocation;
pub mod blob_store;
mod cache;
mod chunk;
pub mod counters;
pub mod disk_cache;
pub mod encrypted;
pub mod error;
pub mod extents;
mod fetch;
mod flush;
mod io;
mod lease;
mod link;
pub mod memory;
mod open;
pub mod resize;
pub mod store;
mod tier;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Notify;
use tokio::task::{JoinHandle, JoinSet};

pub use allocation::Allocation;
pub use blob_store::BlobPageStore;
pub use counters::Counters;
pub use disk_cache::DiskCacheOptions;
pub use encrypted::EncryptedStore;
pub use error::{Error, Result};
pub use extents::PageRange;
pub use memory::MemoryStore;
pub use store::{ByteRange, PageStore};

use cache::Cache;
use counters::Meters;
use extents::Extents;
use lease::Lease;

/// How a drive is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Reads and writes; holds the blob's lease while open.
    ReadWrite,
    /// Reads only; no lease, so it works while someone else has it mounted.
    ReadOnly,
    /// Reads only, from a snapshot (which cannot be leased).
    Snapshot,
}

/// Tuning and identity of one open drive.
#[derive(Debug, Clone)]
pub struct DriveOptions {
    /// Read-write, read-only or snapshot.
    pub mode: Mode,
    /// Memory bound for the drive's data: cached chunks plus the copies that
    /// requests in flight hold (an eighth of it, at most `flush_parallelism`
    /// Put Pages of 4 MiB). At least 2 MiB of chunks are used.
    pub cache_bytes: u64,
    /// Memory dirty data may hold (4 KiB blocks holding dirty pages, and
    /// their chunks' bookkeeping) before writers wait for room
    /// (`--max-dirty`). `None`: a quarter of the cache. Clamped to half the
    /// cache.
    pub max_dirty_bytes: Option<u64>,
    /// How long written data may stay dirty before the background flush.
    pub flush_delay: Duration,
    /// Put Page / Clear Pages requests in flight during a flush (fewer when
    /// an eighth of `cache_bytes` cannot hold that many 4 MiB bodies).
    pub flush_parallelism: usize,
    /// The most sequential reads fetch ahead; within it the depth follows
    /// the link as measured (`link.rs`). 0: no read-ahead.
    pub read_ahead_bytes: u64,
    /// Proposed lease id; a random UUID v4 when `None`.
    pub lease_id: Option<String>,
    /// `container/blob`, for messages.
    pub target: String,
    /// The disk tier below the memory cache (`--cache-dir`,
    /// `--disk-cache-size`); `None`: memory only.
    pub disk_cache: Option<DiskCacheOptions>,
    /// The writer lineage a read-write open continues, and where its mark
    /// is recorded.
    pub lineage: LineageOptions,
}

/// How a read-write open stands to a writer lineage (`blob/lineage.rs`).
#[derive(Clone, Default)]
pub struct LineageOptions {
    /// What the lineage left the blob as: the open takes the lease
    /// ([`DriveOptions::lease_id`]) again only if the blob is still so, and
    /// fails with [`Error::Fenced`] otherwise. `None`: a new lineage starts
    /// with this open.
    pub resume: Option<crate::blob::Mark>,
    /// Told the mark at open and at every change of it.
    pub recorder: Option<crate::blob::fence::MarkRecorder>,
}

impl std::fmt::Debug for LineageOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineageOptions")
            .field("resume", &self.resume)
            .field("recorder", &self.recorder.is_some())
            .finish()
    }
}

/// How a drive's memory bound is split (see [`DriveOptions::memory_budget`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryBudget {
    /// Bytes of cached chunks.
    pub cache_bytes: u64,
    /// Put Page / Clear Pages requests in flight during a flush.
    pub flush_parallelism: usize,
    /// Bytes of dirty data writers may leave before they wait (whole Put
    /// Pages; the chunks' bookkeeping comes on top).
    pub dirty_bytes: u64,
}

impl DriveOptions {
    /// The split of `cache_bytes` between requests in flight and cached
    /// chunks, and the dirty limit: the one rule for both the drive and
    /// whoever sizes something by it (an attach's write log).
    pub fn memory_budget(&self) -> MemoryBudget {
        use crate::units::MAX_PUT_PAGE_BYTES;
        // Requests in flight hold copies of their pages (Put Page bodies,
        // Get bodies): they come out of the same budget as the cached
        // chunks, so `cache_bytes` bounds all the data memory of the drive.
        let in_flight = (self.flush_parallelism.max(1) as u64 * MAX_PUT_PAGE_BYTES)
            .min(self.cache_bytes / 8)
            .max(MAX_PUT_PAGE_BYTES);
        let flush_parallelism = (in_flight / MAX_PUT_PAGE_BYTES) as usize;
        let cache_bytes = self
            .cache_bytes
            .saturating_sub(in_flight)
            .max(open::MIN_CACHE_CHUNKS * chunk::CHUNK_BYTES);
        // By default a quarter of the cache, but at least one Put Page.
        let mut dirty_bytes = self
            .max_dirty_bytes
            .unwrap_or((cache_bytes / 4).max(MAX_PUT_PAGE_BYTES))
            .clamp(chunk::CHUNK_BYTES, cache_bytes / 2);
        // Whole Put Pages: a pass that writers wait for then sends full 4 MiB
        // requests of a sequential stream, not a 4 MiB and a 2 MiB one.
        if dirty_bytes >= MAX_PUT_PAGE_BYTES {
            dirty_bytes -= dirty_bytes % MAX_PUT_PAGE_BYTES;
        }
        MemoryBudget {
            cache_bytes,
            flush_parallelism,
            dirty_bytes,
        }
    }
}

impl Default for DriveOptions {
    fn default() -> Self {
        DriveOptions {
            mode: Mode::ReadWrite,
            cache_bytes: 512 * 1024 * 1024,
            max_dirty_bytes: None,
            flush_delay: Duration::from_secs(1),
            flush_parallelism: 8,
            read_ahead_bytes: 32 * 1024 * 1024,
            lease_id: None,
            target: String::from("drive"),
            disk_cache: None,
            lineage: LineageOptions::default(),
        }
    }
}

/// Where sequential reads stand, for read-ahead.
#[derive(Debug, Default)]
struct ReadAhead {
    /// Furthest end of the current stream's reads.
    last_end: u64,
    /// End of what read-ahead already fetched.
    fetched_until: u64,
    /// Near reads in a row.
    streak: u32,
    /// How far ahead of the reads this stream fetches now (0: not yet). It
    /// starts at the floor and doubles each time the reads have moved on
    /// by a window and asked for a window's worth of bytes, up to the
    /// depth the link asks for (`link::Estimate::depth_bytes`).
    window: u64,
    /// Bytes the stream's reads asked for since the window last changed
    /// (a read asked again counts again: a reader that skips most of what
    /// it passes but reads what it keeps several times grows as a
    /// sequential one, which a page cache above makes rare).
    consumed: u64,
    /// Where the reads must get to before the window doubles again.
    grow_at: u64,
}

/// State shared by the drive handle and its background flusher.
pub(crate) struct Inner {
    store: Arc<dyn PageStore>,
    mode: Mode,
    target: String,
    /// Size of the data area (blob size minus the footer); grows only
    /// through `resize::grow`, never shrinks while open.
    size_bytes: AtomicU64,
    lease: Lease,
    cache: Cache,
    /// The disk tier, when on.
    disk: Option<Arc<disk_cache::DiskCache>>,
    /// Copies down to the disk tier after a flush that found the writer's
    /// queue full: sent again, waiting for room, at close (`tier.rs`), so a
    /// clean unmount leaves the tier whole.
    disk_skipped: Mutex<tier::Skipped>,
    extents: Mutex<Extents>,
    meters: Meters,
    /// One flush pass at a time, so a page is never in two uploads at once.
    flush_lock: flush::FlushLock,
    /// How the passes ended.
    passes: flush::PassLog,
    /// Where the current write stream began and where it stood at the
    /// previous background pass: what a background pass may hold back.
    stream: Mutex<Option<flush::StreamMarks>>,
    max_dirty_bytes: u64,
    flush_parallelism: usize,
    flush_delay: Duration,
    read_ahead_bytes: u64,
    read_ahead: Mutex<ReadAhead>,
    /// The link to the blob as this drive's Gets measured it: what
    /// read-ahead depth and the holes read along follow (`link.rs`).
    link: link::Link,
    /// Read-ahead's Gets in flight and workers running, held to half the
    /// client's limit of reads as it is now (`fetch::AheadGets`).
    ahead: fetch::AheadGets,
    /// Set when close begins: no read-ahead starts from then on, so no Get
    /// or disk tier write runs after the last flush and the lease release.
    ahead_off: AtomicBool,
    /// Where and when the last write ended, so a background flush can leave
    /// the growing tail of a sequential stream for the next pass.
    last_write: Mutex<Option<(u64, std::time::Instant)>>,
    closed: AtomicBool,
    /// Writes and discards accepted (see `Drive::writes_accepted`).
    writes_accepted: std::sync::atomic::AtomicU64,
    /// Wakes the background flusher after a write (or to stop it).
    kick: Notify,
    /// A sequential write stream has filled a whole 4 MiB window of the
    /// drive: the flusher sends it without waiting out `flush_delay`.
    window_full: Notify,
    /// Writers are waiting for room: the flusher runs a full pass at once.
    drain_wanted: AtomicBool,
    /// Wakes the flusher for a drain, even during its delay.
    drain: Notify,
    /// Tells the background flusher to stop.
    stop: Notify,
    stopping: AtomicBool,
    /// A read found the blob changed under this read-only open: every read
    /// fails from then on (`fetch.rs`, `Inner::read_error`).
    changed: AtomicBool,
    /// The blob's metadata as the open read it (under the lease, for a
    /// writer): what the caller's choices made before the open must match.
    metadata_at_open: std::collections::BTreeMap<String, String>,
}

impl Inner {
    /// Size of the data area now.
    pub(crate) fn size_bytes(&self) -> u64 {
        self.size_bytes.load(Ordering::Acquire)
    }

    fn extents(&self) -> std::sync::MutexGuard<'_, Extents> {
        self.extents.lock().expect("extents mutex poisoned")
    }

    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            Err(Error::Closed)
        } else {
            Ok(())
        }
    }

    fn check_writable(&self) -> Result<()> {
        self.check_open()?;
        if self.mode != Mode::ReadWrite {
            return Err(Error::ReadOnly);
        }
        self.lease.check()
    }

    /// After a durable flush: makes the lineage's mark known again if the
    /// flush's parallel writes left the ETag of its last change unknown.
    pub(crate) async fn settle_lineage(&self) {
        if let (Some(id), Ok(())) = (self.lease.id(), self.lease.check()) {
            self.store.settle_lineage(id).await;
        }
    }
}

/// One open drive: a fixed-size disk over a page blob. Share it as
/// `Arc<Drive>`; every method takes `&self`. Call [`Drive::close`] before
/// dropping it, or dirty data is lost.
pub struct Drive {
    inner: Arc<Inner>,
    flusher: Mutex<Option<JoinHandle<()>>>,
    /// Background read-ahead fetches; aborted on close and drop.
    read_aheads: Mutex<JoinSet<()>>,
}

/// Read-ahead workers at most. Each fetches one step of the window at a
/// time (one Get of at most 4 MiB where the blob holds data throughout), so
/// its pages become readable as soon as its own Get returns, not when the
/// whole window has arrived.
const MAX_READ_AHEADS: usize = 8;

impl Inner {
    /// Read-ahead Gets (and workers) the drive may have in flight now: half
    /// the client's limit of reads as it is now (at least one), at most
    /// [`MAX_READ_AHEADS`].
    pub(crate) fn read_ahead_gets_allowed(&self) -> usize {
        self.store
            .read_limit()
            .map_or(MAX_READ_AHEADS, |l| (l / 2).max(1))
            .min(MAX_READ_AHEADS)
    }
}

impl Drive {
    /// Open the drive in `store`: check the VHD footer, take the lease for
    /// read-write, and load the sparse map.
    pub async fn open(store: Arc<dyn PageStore>, opts: DriveOptions) -> Result<Drive> {
        let inner = Arc::new(open::open_inner(store, opts).await?);
        let flusher = if inner.mode == Mode::ReadWrite {
            Some(flush::spawn_background(&inner))
        } else {
            None
        };
        Ok(Drive {
            inner,
            flusher: Mutex::new(flusher),
            read_aheads: Mutex::new(JoinSet::new()),
        })
    }

    /// Size of the data area in bytes (blob size minus the 512-byte footer).
    pub fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    /// True once a read of this read-only open found the blob changed:
    /// every read fails from then on.
    pub fn has_changed(&self) -> bool {
        self.inner.changed.load(Ordering::Acquire)
    }

    /// The blob's metadata as the open read it, with the size and the
    /// sparse map (under the lease, for a read-write open): a decision the
    /// caller made from metadata read before the open (whether the drive is
    /// encrypted, under which key) is checked against it.
    pub fn metadata_at_open(&self) -> &std::collections::BTreeMap<String, String> {
        &self.inner.metadata_at_open
    }

    /// Grow the data area to `new_size_bytes` while open, under the lease:
    /// the blob grows, the footer moves (an interruption leaves a valid
    /// drive of either size), and the new area reads as zeros. Refuses a
    /// smaller size and a drive not opened read-write.
    pub async fn grow(&self, new_size_bytes: u64) -> Result<()> {
        self.inner.grow(new_size_bytes).await
    }

    /// How the drive was opened.
    pub fn mode(&self) -> Mode {
        self.inner.mode
    }

    /// The lease id held, for read-write drives.
    pub fn lease_id(&self) -> Option<&str> {
        self.inner.lease.id()
    }

    /// `container/blob`, as given in the options.
    pub fn target(&self) -> &str {
        &self.inner.target
    }

    /// Read `len` bytes at `offset_bytes` (any alignment). Reads past the end
    /// are clipped, like a file: fewer bytes come back.
    ///
    /// On a read-only open of a live blob, every read fails with
    /// [`Error::Changed`] once any read found the blob changed since the
    /// open: what was served before came from one state, nothing after
    /// mixes in another (pages cached and holes of the old map included).
    pub async fn read_at(&self, offset_bytes: u64, len: usize) -> Result<Bytes> {
        self.inner.check_unchanged()?;
        let (data, workers) = self.inner.read_at(offset_bytes, len).await?;
        // A read-ahead may have found the change meanwhile: the rule stays
        // simple (no read succeeds once a change was seen).
        self.inner.check_unchanged()?;
        if workers > 0 {
            self.start_read_ahead(workers);
        }
        Ok(data)
    }

    /// Have up to `wanted` read-ahead workers running (fewer when the
    /// client's limit of reads is low). Each takes the next step of the
    /// stream's window not yet started (`Inner::next_read_ahead`: its pages
    /// are marked before the step's Get goes, so a reader arriving first
    /// waits for it instead of fetching again), fetches it, and takes the
    /// next as soon as its Get completes, until the window is full; a
    /// later read that moves the window on starts them again.
    ///
    /// Read-ahead and foreground reads share the client's limit of reads,
    /// whose slots go first come, first served: so that a reader waiting for
    /// a page never queues behind read-ahead for a slot, read-ahead keeps
    /// at most half the limit *as it is now* in flight, counted in Gets
    /// (a fragmented step is several), and the other half stays free for
    /// reads that wait: each read-ahead Get takes a slot of
    /// `fetch::AheadGets` first, and a worker beyond half the limit stops
    /// before its next step.
    fn start_read_ahead(&self, wanted: usize) {
        let workers = wanted.min(self.inner.read_ahead_gets_allowed());
        let mut set = self
            .read_aheads
            .lock()
            .expect("read-ahead set mutex poisoned");
        while set.try_join_next().is_some() {}
        while set.len() < workers {
            // Reserved here, not in the task, so the pages are marked before
            // this read returns and the next read finds them.
            let Some(job) = self.inner.next_read_ahead() else {
                return;
            };
            let inner = self.inner.clone();
            set.spawn(async move {
                let mut worker = inner.ahead.worker();
                let mut job = Some(job);
                while let Some(j) = job {
                    if let Err(e) = inner.run_job(j).await {
                        tracing::debug!(target = %inner.target, error = %e, "read-ahead failed");
                        return;
                    }
                    // After a 503 cut the limit, the workers beyond half
                    // of it stop (their Gets would only wait for a slot).
                    if worker.surplus(inner.read_ahead_gets_allowed()) {
                        return;
                    }
                    job = inner.next_read_ahead();
                }
            });
        }
    }

    /// Which of `pages` may hold data: the sparse map merged with the pages
    /// written and not yet flushed, as consecutive runs in order (clipped to
    /// the data area). A run with `data: false` reads as zeros.
    pub fn allocation(&self, pages: PageRange) -> Vec<Allocation> {
        self.inner.allocation(pages)
    }

    /// Write `data` at `offset_bytes` (any alignment). The data is in the
    /// cache when this returns; [`Drive::flush`] makes it durable.
    pub async fn write_at(&self, offset_bytes: u64, data: &[u8]) -> Result<()> {
        self.inner.write_at(offset_bytes, data).await
    }

    /// Write `len_bytes` of zeros at `offset_bytes` that stay allocated in
    /// the blob (NBD's WRITE_ZEROES with NO_HOLE): the flush sends the
    /// whole pages as data (Put Page of zeros) rather than clearing them, so
    /// the sparse map keeps them. [`Drive::discard`] is the one that frees.
    ///
    /// The zeros come from one buffer shared by every call: a client may
    /// pipeline thousands of these (NBD charges each to its in-flight budget
    /// as a request without payload), and a buffer of its own per call,
    /// held while the call waits for the dirty budget, would grow the
    /// process by a megabyte per waiting request, outside `--cache-size`.
    pub async fn write_zeroes_allocated(&self, offset_bytes: u64, len_bytes: u64) -> Result<()> {
        let zeros = shared_zeros();
        let step = zeros.len() as u64;
        let mut at = offset_bytes;
        let end = offset_bytes.saturating_add(len_bytes);
        while at < end {
            let n = step.min(end - at);
            self.inner
                .write_at_as(at, &zeros[..n as usize], true)
                .await?;
            at += n;
        }
        Ok(())
    }

    /// Zero `len_bytes` at `offset_bytes`: pages fully inside are cleared in
    /// the blob before this returns; partial edge pages are zero-filled
    /// (written). Concurrent writes to the same range are not ordered with it.
    pub async fn discard(&self, offset_bytes: u64, len_bytes: u64) -> Result<()> {
        self.inner.discard(offset_bytes, len_bytes).await
    }

    /// Make every write accepted before this call durable in the blob.
    pub async fn flush(&self) -> Result<()> {
        self.inner.check_open()?;
        if self.inner.mode != Mode::ReadWrite {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let out = self.inner.flush_pass().await;
        if out.is_ok() {
            self.inner.settle_lineage().await;
        }
        let elapsed = started.elapsed();
        crate::metrics::observe(
            &self.inner.target,
            crate::metrics::Operation::Fsync,
            elapsed,
        );
        out
    }

    /// Flush, stop the background flusher and release the lease. When the
    /// flush fails the drive stays open (and keeps its dirty data), so the
    /// caller can retry or save the data; later calls after a successful close
    /// fail with `Closed`.
    ///
    /// In an outage (the last flush pass failed) close stops the background
    /// flusher at once instead of waiting for its pass, so it takes one pass
    /// (at most one retry budget), not two.
    /// A lease that cannot be released after a durable flush is reported as
    /// [`Error::ReleaseFailed`], never as lost data.
    pub async fn close(&self) -> Result<()> {
        self.inner.check_open()?;
        // Before the workers are stopped, under the set's lock: a read
        // finishing meanwhile starts none (`Inner::next_read_ahead`).
        // Not undone if the close fails: reads work without read-ahead.
        self.inner.ahead_off.store(true, Ordering::Release);
        let mut aheads = std::mem::take(
            &mut *self
                .read_aheads
                .lock()
                .expect("read-ahead set mutex poisoned"),
        );
        aheads.shutdown().await;
        let seen = self.inner.passes.finished();
        self.inner.stopping.store(true, Ordering::Release);
        self.inner.stop.notify_one();
        let handle = self.flusher.lock().expect("flusher mutex poisoned").take();
        if let Some(h) = handle {
            if self.inner.passes.last_failure().is_some() {
                // Its pass would only spend another budget on a dead link.
                h.abort();
            }
            let _ = h.await;
        }
        if self.inner.mode == Mode::ReadWrite {
            let _g = self.inner.flush_lock.lock().await;
            self.inner.passes.failed_since(seen)?;
            self.inner.flush_pass_locked().await?;
        }
        self.inner.closed.store(true, Ordering::Release);
        self.inner.persist_skipped().await;
        // After the last flush, before the lease goes: the ETag recorded is
        // the one our writes left.
        self.inner.close_disk().await;
        self.inner
            .lease
            .release(self.inner.store.as_ref(), &self.inner.meters)
            .await
    }

    /// A snapshot of the counters.
    pub fn counters(&self) -> Counters {
        let c = &self.inner.cache;
        let mut out = self.inner.meters.snapshot(c.dirty_bytes(), c.cache_bytes());
        (out.disk_bytes, out.disk_bad_chunks) = self.inner.disk_gauges();
        out.flushing = self.inner.flush_lock.is_held();
        out
    }

    /// True when the last flush pass failed because storage did not answer
    /// (not a refusal): asking it more now would only wait.
    pub fn storage_unanswered(&self) -> bool {
        match self.inner.passes.last_failure() {
            Some(Error::Stalled { .. }) => true,
            Some(Error::Backend(e)) => e.kind == crate::blob::ErrorKind::Transport,
            _ => false,
        }
    }

    /// `LeaseLost` once the service refused this drive's lease (another host
    /// broke it): writes and flushes fail from then on.
    pub fn lease_lost(&self) -> Option<Error> {
        self.inner.lease.check().err()
    }

    /// Writes and discards accepted so far: a recovery file saved at one
    /// count holds every unflushed page as long as the count is unchanged.
    pub fn writes_accepted(&self) -> u64 {
        self.inner.writes_accepted.load(Ordering::Acquire)
    }

    /// Bytes written but not yet durable in the blob. After a lost lease this
    /// is the data a recovery file must take.
    pub fn unflushed_bytes(&self) -> u64 {
        self.inner.cache.dirty_bytes()
    }

    /// What this drive's writer lineage left the blob as, as far as the
    /// drive knows (`blob/lineage.rs`); None for a store without lineages.
    pub fn lineage_mark(&self) -> Option<crate::blob::Mark> {
        self.inner.store.lineage_mark()
    }

    /// The blob's state read under this drive's lease: what a recovery
    /// file saved now records as its lineage's mark. An error when the
    /// lease is not held (or storage does not answer).
    pub async fn state_under_lease(&self) -> Result<crate::blob::Mark> {
        let Some(id) = self.inner.lease.id() else {
            return Err(self.inner.lease.lost_error());
        };
        self.inner.lease.check()?;
        Ok(self.inner.store.state_under_lease(id).await?)
    }

    /// The unflushed data as `(offset_bytes, bytes)` runs of whole pages, in
    /// order, for a recovery file.
    /// For an encrypted drive they are the ciphertext the blob would hold,
    /// so a recovery file never keeps plaintext and applies without a key.
    pub fn unflushed_data(&self) -> Vec<(u64, Bytes)> {
        let store = &self.inner.store;
        self.inner
            .unflushed_data()
            .into_iter()
            .map(|(offset, data)| (offset, store.as_stored(offset, data)))
            .collect()
    }
}

impl Drop for Drive {
    fn drop(&mut self) {
        // Normal shutdown goes through `close`; this only stops a flusher a
        // forgotten drive would otherwise keep alive.
        if let Ok(mut f) = self.flusher.lock() {
            if let Some(h) = f.take() {
                h.abort();
            }
        }
        let dirty = self.inner.cache.dirty_bytes();
        if dirty > 0 {
            tracing::error!(target = %self.inner.target, dirty_bytes = dirty, "drive dropped with unflushed data");
        }
    }
}

/// 1 MiB of zeros, allocated once for the whole process, for
/// [`Drive::write_zeroes_allocated`] to write from (the largest step it
/// writes in; the cache copies from it, so it is only ever read).
fn shared_zeros() -> &'static [u8] {
    const ZERO_STEP_BYTES: usize = 1024 * 1024;
    static ZEROS: std::sync::OnceLock<Box<[u8]>> = std::sync::OnceLock::new();
    ZEROS.get_or_init(|| vec![0u8; ZERO_STEP_BYTES].into_boxed_slice())
}
