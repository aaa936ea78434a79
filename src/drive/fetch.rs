//! Filling cache pages from the blob, each page fetched once.
//!
//! What it owns: turning "these pages must be valid" into few Get Blob
//! requests (only the parts the sparse map says may hold data, coalesced; the
//! rest become zeros; chunks the disk tier holds are read from it instead,
//! and what the blob returns is copied down to it), and making sure two
//! readers of the same missing page do not both fetch it: a fetch marks its
//! pages `fetching` in their chunks; others wait for it, or fetch themselves
//! if it failed. Get bodies are not gathered: each part goes into the
//! job's blocks as it comes off the connection (`PageStore::read_into`,
//! [`FetchJob::receive`]), skipping pages that are valid, and the pages
//! become valid only when every read of the job succeeded. That saves a
//! copy of every byte read (the body into a buffer, then into blocks:
//! about 6% of the daemon's CPU in a cold sequential read) and the bodies'
//! memory (up to 8 x 4 MiB per job). Invariants: a fill
//! never overwrites a valid page (it is at least as new as the blob); a
//! [`FetchJob`] that ends without filling (error, cancellation) clears its
//! marks in `Drop`, so nobody waits forever. A job pins its chunks.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::Notify;

use super::cache::ChunkRef;
use super::chunk::{chunk_pages, chunks_of, CHUNK_BYTES};
use super::counters::add;
use super::disk_cache::CachedChunk;
use super::error::{Error, Result};
use super::extents::{intersect, Extents, PageRange};
use super::link::DEFAULT_READ_HOLE_BYTES;
use super::{Inner, Mode};
use crate::units::{ByteRange, MAX_GET_BYTES, PAGE_SIZE};

/// Get Blob requests one fetch has in flight; more only queue at the
/// service and hold more bodies in memory at once.
const GETS_IN_FLIGHT: usize = 8;

/// Read-ahead's share of the client's limit of reads, counted in Gets:
/// each read-ahead Get takes a slot here before it goes, and there are at
/// most `Inner::read_ahead_gets_allowed` (read as each Get goes, so a
/// limit cut by a 503 holds read-ahead back at once). Also counts the
/// workers, so those beyond the share stop.
#[derive(Debug, Default)]
pub(crate) struct AheadGets {
    in_flight: std::sync::Mutex<usize>,
    freed: Notify,
    workers: std::sync::atomic::AtomicUsize,
}

/// One read-ahead Get's slot; freed when dropped.
pub(crate) struct AheadSlot<'a>(&'a AheadGets);

impl Drop for AheadSlot<'_> {
    fn drop(&mut self) {
        *self.0.lock() -= 1;
        self.0.freed.notify_waiters();
    }
}

/// One running read-ahead worker, counted in [`AheadGets`]; counted off
/// when dropped (also when its task is aborted at close).
pub(crate) struct AheadWorker<'a>(Option<&'a AheadGets>);

impl AheadWorker<'_> {
    /// True, and this worker counted off, when more than `allowed` workers
    /// run: the caller stops.
    pub(crate) fn surplus(&mut self, allowed: usize) -> bool {
        let Some(gets) = self.0 else {
            return true;
        };
        let counted_off = gets
            .workers
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (w > allowed).then(|| w - 1)
            })
            .is_ok();
        if counted_off {
            self.0 = None;
        }
        counted_off
    }
}

impl Drop for AheadWorker<'_> {
    fn drop(&mut self) {
        if let Some(gets) = self.0 {
            gets.workers.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl AheadGets {
    fn lock(&self) -> std::sync::MutexGuard<'_, usize> {
        self.in_flight
            .lock()
            .expect("read-ahead gets mutex poisoned")
    }

    /// Wait until fewer than `allowed()` read-ahead Gets are in flight and
    /// take a slot.
    async fn take(&self, allowed: impl Fn() -> usize) -> AheadSlot<'_> {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut n = self.lock();
                if *n < allowed() {
                    *n += 1;
                    return AheadSlot(self);
                }
            }
            freed.await;
        }
    }

    /// Count a worker in, until the returned guard is dropped.
    pub(crate) fn worker(&self) -> AheadWorker<'_> {
        self.workers.fetch_add(1, Ordering::AcqRel);
        AheadWorker(Some(self))
    }
}

/// What a fill found, for the hit/miss counters (pages).
#[derive(Debug, Default)]
pub(crate) struct FillStats {
    pub hits: u64,
    pub misses: u64,
    pub holes: u64,
}

/// Pages one caller marked `fetching`, and the reads that will fill them.
pub(crate) struct FetchJob {
    refs: Vec<ChunkRef>,
    /// Pages this job fills (sorted, disjoint).
    mine: Vec<PageRange>,
    /// The parts of `mine` to read from the blob; the rest are zeros.
    fetch: Vec<PageRange>,
    filled: Arc<Notify>,
    done: bool,
    /// A read-ahead's job: its Gets take slots of [`AheadGets`].
    ahead: bool,
}

/// Where a job's pages come from.
pub(crate) struct Sources {
    /// The ranges read from the blob (sorted): their bytes are in the
    /// chunks' blocks already ([`FetchJob::receive`]).
    pub blob: Vec<PageRange>,
    /// Chunks found in the disk tier; they give the job's data pages that
    /// the blob reads do not cover.
    pub disk: HashMap<u64, CachedChunk>,
}

/// Append `page` to sorted page ranges, merging with the last one.
fn push_page(ranges: &mut Vec<PageRange>, page: u64) {
    match ranges.last_mut() {
        Some(r) if r.end == page => r.end += 1,
        _ => ranges.push(PageRange::new(page, page + 1)),
    }
}

/// Append `next` (after every range in `fetch`) to the reads, merged into
/// the last read when the result stays within one Get and the gap between
/// them is at most `hole_pages` (what the link says a hole read along may
/// cost, `link.rs`) and either short (at most [`DEFAULT_READ_HOLE_BYTES`])
/// or a true hole (no page of it in `extents`: the service returns zeros). A gap with stored pages holds pages that are valid or being
/// fetched by another job (they are not this job's): joining across a
/// long one would download cached data again, so only the short gaps the
/// drive joined before it measured the link are. Pages of a gap that are
/// not this job's are read but never filled (`finish` fills only `mine`).
fn push_coalesced(fetch: &mut Vec<PageRange>, next: PageRange, hole_pages: u64, extents: &Extents) {
    if let Some(last) = fetch.last_mut() {
        let gap = PageRange::new(last.end, next.start.max(last.end));
        let joinable = gap.len_pages() <= hole_pages
            && (gap.len_pages() <= DEFAULT_READ_HOLE_BYTES / PAGE_SIZE || !extents.any_in(gap));
        if next.start >= last.end && joinable && next.end - last.start <= MAX_GET_BYTES / PAGE_SIZE
        {
            last.end = next.end;
            return;
        }
    }
    fetch.push(next);
}

impl FetchJob {
    fn is_empty(&self) -> bool {
        self.mine.is_empty()
    }

    /// Copy part of the body of the Get of `read` (`at`: its offset in that
    /// body) into this job's pages that are not valid, as it arrives; they
    /// become valid in [`Self::finish`], once every body came.
    fn receive(&self, read: PageRange, at: u64, bytes: &[u8]) {
        let start = read.start * PAGE_SIZE + at;
        let end = (start + bytes.len() as u64).min(read.end * PAGE_SIZE);
        let mut pos = start;
        while pos < end {
            let index = pos / CHUNK_BYTES;
            let base = index * CHUNK_BYTES;
            let to = end.min(base + CHUNK_BYTES);
            if let Some(r) = self.refs.iter().find(|r| r.index == index) {
                let span = chunk_pages(index);
                let here = PageRange::covering(ByteRange::new(pos, to));
                let src = &bytes[(pos - start) as usize..(to - start) as usize];
                let mut c = r.lock();
                for m in &self.mine {
                    let part = intersect(here, *m);
                    if !part.is_empty() {
                        let slots =
                            (part.start - span.start) as usize..(part.end - span.start) as usize;
                        c.receive((pos - base) as usize, src, slots);
                    }
                }
            }
            pos = to;
        }
    }

    /// Fill this job's pages (or leave them invalid when `src` is `None`),
    /// clear their marks and wake waiters. Pages outside the sparse map are
    /// zeros; pages the blob reads covered hold their bytes already
    /// (`receive`) and become valid; the others come from the disk tier.
    fn finish(&mut self, src: Option<&Sources>) {
        self.done = true;
        for r in &self.refs {
            let span = chunk_pages(r.index);
            let disk = src.and_then(|s| s.disk.get(&r.index));
            let mut c = r.lock();
            for m in &self.mine {
                let part = intersect(span, *m);
                if let Some(src) = src {
                    let mut page = part.start;
                    while page < part.end {
                        let i = self.fetch.partition_point(|f| f.end <= page);
                        let Some(f) = self.fetch.get(i).filter(|f| f.start <= page) else {
                            // Zeros up to the next read.
                            let to = self
                                .fetch
                                .get(i)
                                .map_or(part.end, |f| f.start.min(part.end));
                            for p in page..to {
                                c.fill((p - span.start) as usize, None);
                            }
                            page = to;
                            continue;
                        };
                        let to = f.end.min(part.end);
                        let j = src.blob.partition_point(|b| b.end <= page);
                        match src.blob.get(j) {
                            Some(b) if b.start <= page => {
                                let to = to.min(b.end);
                                for p in page..to {
                                    c.received((p - span.start) as usize);
                                }
                                page = to;
                            }
                            next => {
                                // Not read from the blob: the disk tier has it.
                                let to = next.map_or(to, |b| b.start.min(to));
                                for p in page..to {
                                    let slot = (p - span.start) as usize;
                                    let on_disk = disk.and_then(|c| c.page(slot));
                                    debug_assert!(on_disk.is_some(), "page {p} has no source");
                                    c.fill(slot, on_disk.flatten());
                                }
                                page = to;
                            }
                        }
                    }
                }
                for page in part.start..part.end {
                    c.set_fetching((page - span.start) as usize, false);
                }
            }
        }
        self.filled.notify_waiters();
    }
}

impl Drop for FetchJob {
    fn drop(&mut self) {
        if !self.done && !self.mine.is_empty() {
            self.finish(None);
        }
    }
}

impl Inner {
    /// Mark the pages of `want` within `refs` that are neither valid nor
    /// being fetched as this caller's. Returns the job, the counts for pages
    /// inside `count`, and the pages someone else is fetching.
    fn reserve(
        &self,
        refs: &[ChunkRef],
        want: &[PageRange],
        count: PageRange,
    ) -> (FetchJob, FillStats, Vec<PageRange>) {
        let mut stats = FillStats::default();
        let mut mine = Vec::new();
        let mut others = Vec::new();
        for r in refs {
            let span = chunk_pages(r.index);
            let mut c = r.lock();
            for w in want {
                let part = intersect(span, *w);
                for page in part.start..part.end {
                    let slot = (page - span.start) as usize;
                    let counted = (page >= count.start && page < count.end) as u64;
                    if c.is_valid(slot) {
                        stats.hits += counted;
                    } else if c.is_fetching(slot) {
                        stats.misses += counted;
                        push_page(&mut others, page);
                    } else {
                        stats.misses += counted;
                        c.set_fetching(slot, true);
                        push_page(&mut mine, page);
                    }
                }
            }
        }
        let mut fetch = Vec::new();
        let hole_pages = self.link.estimate().read_along_hole_bytes() / PAGE_SIZE;
        {
            let extents = self.extents();
            for m in &mine {
                stats.holes += intersect(*m, count).len_pages();
                for d in extents.within(*m) {
                    stats.holes -= intersect(d, count).len_pages();
                    let mut start = d.start;
                    while start < d.end {
                        let end = d.end.min(start + MAX_GET_BYTES / PAGE_SIZE);
                        push_coalesced(
                            &mut fetch,
                            PageRange::new(start, end),
                            hole_pages,
                            &extents,
                        );
                        start = end;
                    }
                }
            }
        }
        let job = FetchJob {
            refs: refs.to_vec(),
            mine,
            fetch,
            filled: self.cache.filled.clone(),
            done: false,
            ahead: false,
        };
        (job, stats, others)
    }

    /// Read a job's data parts (at most [`GETS_IN_FLIGHT`] at once, bodies
    /// kept in order) and fill its pages.
    pub(crate) async fn run_job(&self, mut job: FetchJob) -> Result<()> {
        use futures::{StreamExt, TryStreamExt};
        if job.is_empty() {
            job.done = true;
            return Ok(());
        }
        let disk = self.disk_chunks(&job.fetch).await;
        let blob = if disk.is_empty() {
            job.fetch.clone()
        } else {
            super::tier::not_on_disk(&job.fetch, &disk, MAX_GET_BYTES / PAGE_SIZE)
        };
        // Bodies go straight into the job's blocks as they arrive
        // (`FetchJob::receive`), in any order. Collected first: a lazy `map`
        // in the stream would make the future not provably `Send` for every
        // lifetime (a known rustc limitation).
        let sinks: Vec<_> = blob
            .iter()
            .map(|&f| {
                let job = &job;
                move |at: u64, bytes: &[u8]| job.receive(f, at, bytes)
            })
            .collect();
        let ahead = job.ahead;
        let reads: Vec<_> = blob
            .iter()
            .zip(&sinks)
            .map(|(f, sink)| {
                add(&self.meters.get, 1);
                async move {
                    let _slot = match ahead {
                        true => Some(self.ahead.take(|| self.read_ahead_gets_allowed()).await),
                        false => None,
                    };
                    let called = std::time::Instant::now();
                    let took = self.store.read_into(f.bytes(), sink).await?;
                    let ended = std::time::Instant::now();
                    // The answering attempt's own time when the store
                    // knows it: a wait for a slot or a retry's back-off
                    // (the service asking for less) is not the link.
                    let started = took.and_then(|t| ended.checked_sub(t)).unwrap_or(called);
                    let bytes = f.len_pages() * PAGE_SIZE;
                    self.link.record(started.max(called), ended, bytes);
                    add(&self.meters.bytes_down, bytes);
                    Ok::<(), crate::blob::Error>(())
                }
            })
            .collect();
        // On error the job is dropped: its marks are cleared, pages stay
        // invalid (whatever bytes came are never shown).
        futures::stream::iter(reads)
            .buffer_unordered(GETS_IN_FLIGHT)
            .try_collect::<Vec<()>>()
            .await
            .map_err(|e| self.read_error(e))?;
        drop(sinks);
        let pages = |v: &[PageRange]| v.iter().map(|r| r.len_pages()).sum::<u64>();
        self.note_disk(pages(&job.fetch), pages(&blob));
        let src = Sources { blob, disk };
        job.finish(Some(&src));
        if self.disk.is_some() && !src.blob.is_empty() {
            let touched: Vec<ChunkRef> = job
                .refs
                .iter()
                .filter(|r| {
                    let span = chunk_pages(r.index);
                    src.blob.iter().any(|b| !intersect(span, *b).is_empty())
                })
                .cloned()
                .collect();
            drop(job);
            self.persist_wait(touched).await;
        }
        Ok(())
    }

    /// A failed read from the blob as the drive reports it. On a read-only
    /// open (pinned to the ETag it opened, `open.rs`), a read refused
    /// because the blob changed means the drive is no longer the state it
    /// serves: from then on every read fails ([`Self::check_unchanged`]),
    /// also of cached pages and of holes the old sparse map vouches for,
    /// and the change is logged at error level once.
    pub(crate) fn read_error(&self, e: crate::blob::Error) -> Error {
        if self.mode != Mode::ReadOnly || !super::store::is_changed(&e) {
            return e.into();
        }
        if !self.changed.swap(true, Ordering::AcqRel) {
            tracing::error!(target = %self.target, error = %e, "{}", self.changed_error());
        }
        self.changed_error()
    }

    fn changed_error(&self) -> Error {
        Error::Changed {
            target: self.target.clone(),
        }
    }

    /// `Changed` once a read found the blob changed under this read-only
    /// open (see [`Self::read_error`]).
    pub(crate) fn check_unchanged(&self) -> Result<()> {
        if self.changed.load(Ordering::Acquire) {
            return Err(self.changed_error());
        }
        Ok(())
    }

    /// Make every page of `want` (within the pinned `refs`) valid: fetch the
    /// pages nobody is fetching, wait for the others. Hits, misses and holes
    /// are counted for the pages inside `count` only.
    pub(crate) async fn fill(
        &self,
        refs: &[ChunkRef],
        want: &[PageRange],
        count: PageRange,
    ) -> Result<FillStats> {
        let (job, stats, mut waiting) = self.reserve(refs, want, count);
        self.run_job(job).await?;
        while !waiting.is_empty() {
            let notified = self.cache.filled.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Pages whose fetch failed are free again: take them over.
            let (job, _, still) = self.reserve(refs, &waiting, PageRange::new(0, 0));
            waiting = still;
            if !job.is_empty() {
                self.run_job(job).await?;
                continue;
            }
            if !waiting.is_empty() {
                notified.await;
            }
        }
        Ok(stats)
    }

    /// Start reading ahead `[start_bytes, end_bytes)`: pin the chunks that
    /// hold data there and mark their pages, so a reader arriving before
    /// the data waits instead of fetching again. The caller runs the
    /// returned job in the background; `Ok(None)` means there is nothing to
    /// fetch (holes, or pages already valid or being fetched), `Err(NoRoom)`
    /// that the cache cannot pin the chunks now.
    pub(crate) fn reserve_read_ahead(
        &self,
        start_bytes: u64,
        end_bytes: u64,
    ) -> std::result::Result<Option<FetchJob>, NoRoom> {
        let window = PageRange::covering(ByteRange::new(start_bytes, end_bytes));
        let indices: Vec<u64> = chunks_of(start_bytes, end_bytes)
            .filter(|&i| self.extents().any_in(intersect(chunk_pages(i), window)))
            .take(self.cache.max_pins())
            .collect();
        if indices.is_empty() {
            return Ok(None);
        }
        let refs = self.cache.try_pin_all(&indices, window).ok_or(NoRoom)?;
        let (mut job, _, _) = self.reserve(&refs, &[window], PageRange::new(0, 0));
        job.ahead = true;
        Ok((!job.is_empty()).then_some(job))
    }
}

/// The cache has no room to pin a read-ahead's chunks now.
#[derive(Debug)]
pub(crate) struct NoRoom;

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use async_trait::async_trait;
    use bytes::Bytes;

    use crate::blob::error::Result;
    use crate::blob::BodySink;
    use crate::drive::store::BlobState;
    use crate::drive::{Drive, DriveOptions, MemoryStore, Mode, PageStore};
    use crate::units::ByteRange;

    const MIB: u64 = 1 << 20;

    /// The bytes the tests store at `[start, end)`: each 4 KiB page a
    /// value of its own, never zero (a zero page would read as a hole).
    fn pattern(start: u64, end: u64) -> Vec<u8> {
        (start..end).map(|i| (i / 4096) as u8 | 1).collect()
    }

    /// A read-only drive over `store` with this cache and read-ahead cap.
    async fn read_only(
        store: Arc<dyn PageStore>,
        cache_bytes: u64,
        read_ahead_bytes: u64,
    ) -> Drive {
        Drive::open(
            store,
            DriveOptions {
                mode: Mode::ReadOnly,
                cache_bytes,
                read_ahead_bytes,
                ..DriveOptions::default()
            },
        )
        .await
        .unwrap()
    }

    /// A read-only drive of 16 MiB with data in `data` (byte ranges), no
    /// read-ahead, whose link is measured at 40 MiB/s and 60 ms: holes of
    /// up to 2 MiB are read along.
    async fn far_link_drive(data: &[(u64, u64)]) -> (Arc<MemoryStore>, Drive) {
        let store = Arc::new(MemoryStore::with_drive(16 * MIB));
        for &(start, end) in data {
            store.poke(start, &pattern(start, end));
        }
        let drive = read_only(store.clone(), 64 * MIB, 0).await;
        let t0 = Instant::now();
        let link = &drive.inner.link;
        link.record(t0, t0 + Duration::from_millis(100), 4 * MIB);
        link.record(t0, t0 + Duration::from_millis(60), 4096);
        assert!(link.estimate().read_along_hole_bytes() >= 2 * MIB);
        (store, drive)
    }

    #[tokio::test]
    async fn a_read_around_cached_data_does_not_fetch_it_again() {
        let (store, drive) = far_link_drive(&[(0, 16 * MIB)]).await;
        let before = store.counts().bytes_read;
        drive.read_at(MIB + MIB / 2, MIB as usize).await.unwrap();
        assert_eq!(store.counts().bytes_read - before, MIB);
        // Around it: 1.5 MiB before, 1.5 MiB after; the cached MiB between
        // is data, not a hole, and is not read again.
        let before = store.counts().bytes_read;
        let got = drive.read_at(0, 4 * MIB as usize).await.unwrap();
        assert_eq!(store.counts().bytes_read - before, 3 * MIB);
        assert_eq!(&got[..], &store.contents(ByteRange::new(0, 4 * MIB))[..]);
        drive.close().await.unwrap();
    }

    #[tokio::test]
    async fn a_true_hole_the_link_allows_is_read_along() {
        let (store, drive) = far_link_drive(&[(0, MIB), (2 * MIB, 3 * MIB)]).await;
        let before = store.counts();
        let got = drive.read_at(0, 3 * MIB as usize).await.unwrap();
        let after = store.counts();
        assert_eq!(after.reads - before.reads, 1, "one Get across the hole");
        assert_eq!(after.bytes_read - before.bytes_read, 3 * MIB);
        assert_eq!(&got[..], &store.contents(ByteRange::new(0, 3 * MIB))[..]);
        drive.close().await.unwrap();
    }

    /// A blob whose client limit of reads is set by the test, counting the
    /// most 4 MiB Gets (read-ahead's steps) in flight at once.
    struct Limited {
        inner: Arc<MemoryStore>,
        limit: AtomicUsize,
        in_flight: AtomicUsize,
        most: AtomicUsize,
        steps: AtomicUsize,
    }

    #[async_trait]
    impl PageStore for Limited {
        async fn size_bytes(&self) -> Result<u64> {
            self.inner.size_bytes().await
        }
        async fn state(&self) -> Result<BlobState> {
            self.inner.state().await
        }
        async fn page_ranges(&self, within: ByteRange) -> Result<Vec<ByteRange>> {
            self.inner.page_ranges(within).await
        }
        async fn read(&self, range: ByteRange) -> Result<Bytes> {
            self.inner.read(range).await
        }
        async fn read_into(
            &self,
            range: ByteRange,
            sink: BodySink<'_>,
        ) -> Result<Option<Duration>> {
            let step = range.len() == 4 * MIB;
            if step {
                self.steps.fetch_add(1, Ordering::SeqCst);
                let n = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                self.most.fetch_max(n, Ordering::SeqCst);
            }
            let out = self.inner.read_into(range, sink).await;
            if step {
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
            }
            out
        }
        fn read_limit(&self) -> Option<usize> {
            Some(self.limit.load(Ordering::SeqCst))
        }
        async fn write_pages(&self, at: u64, data: Bytes, lease: Option<&str>) -> Result<()> {
            self.inner.write_pages(at, data, lease).await
        }
        async fn fence_earlier_writes(&self, lease: Option<&str>) -> Result<()> {
            self.inner.fence_earlier_writes(lease).await
        }
        async fn clear_pages(&self, range: ByteRange, lease: Option<&str>) -> Result<()> {
            self.inner.clear_pages(range, lease).await
        }
        async fn resize(&self, bytes: u64, lease: Option<&str>) -> Result<()> {
            self.inner.resize(bytes, lease).await
        }
        async fn acquire_lease(&self, id: &str) -> Result<()> {
            self.inner.acquire_lease(id).await
        }
        async fn release_lease(&self, id: &str) -> Result<()> {
            self.inner.release_lease(id).await
        }
        async fn break_lease(&self) -> Result<()> {
            self.inner.break_lease().await
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn read_ahead_keeps_to_half_the_read_limit_as_it_is_now() {
        let mem = Arc::new(MemoryStore::with_drive(96 * MIB));
        let data = pattern(0, 96 * MIB);
        mem.poke(0, &data);
        mem.set_read_delay(Duration::from_millis(20));
        let store = Arc::new(Limited {
            inner: mem.clone(),
            limit: AtomicUsize::new(16),
            in_flight: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
            steps: AtomicUsize::new(0),
        });
        let drive = read_only(store.clone(), 256 * MIB, 32 * MIB).await;
        let read = |at: u64| {
            let drive = &drive;
            let data = &data;
            async move {
                let got = drive.read_at(at, MIB as usize).await.unwrap();
                assert_eq!(&got[..], &data[at as usize..(at + MIB) as usize]);
            }
        };
        for i in 0..24 {
            read(i * MIB).await;
        }
        let before = store.most.load(Ordering::SeqCst);
        assert!(before > 2, "read-ahead ran wide before the cut: {before}");
        // A 503 cuts the client's limit to 4: read-ahead keeps to 2 Gets
        // from then on, the workers already running included.
        store.limit.store(4, Ordering::SeqCst);
        store.most.store(0, Ordering::SeqCst);
        let steps = store.steps.load(Ordering::SeqCst);
        for i in 24..88 {
            read(i * MIB).await;
        }
        let after = store.most.load(Ordering::SeqCst);
        let steps = store.steps.load(Ordering::SeqCst) - steps;
        assert!(steps >= 10, "read-ahead went on: {steps} steps");
        assert!(after <= 2, "{after} read-ahead Gets in flight at once");
        drive.close().await.unwrap();
    }

    /// The window a stream reaches after the reads `(offset, len)` on a
    /// 48 MiB drive with a 16 MiB read-ahead cap (4 MiB steps, a floor of
    /// 8 MiB), and the most it may reach: the depth the link asks for.
    async fn window_after(reads: impl IntoIterator<Item = (u64, u64)>) -> (u64, u64) {
        let store = Arc::new(MemoryStore::with_drive(48 * MIB));
        let data = pattern(0, 48 * MIB);
        store.poke(0, &data);
        let drive = read_only(store, 128 * MIB, 16 * MIB).await;
        for (at, len) in reads {
            let got = drive.read_at(at, len as usize).await.unwrap();
            assert_eq!(&got[..], &data[at as usize..(at + len) as usize]);
        }
        let window = drive.inner.read_ahead.lock().unwrap().window;
        let step = drive.inner.read_ahead_step();
        let depth = drive.inner.link.estimate().depth_bytes(step, 16 * MIB);
        drive.close().await.unwrap();
        (window, depth)
    }

    #[tokio::test]
    async fn the_window_grows_with_a_reader_that_moves_on_and_reads_what_it_passes() {
        // A sequential reader doubles the window from the floor to the
        // depth; so does one whose reads arrive out of order (the loop
        // device's several in flight: each pair reversed).
        let (window, depth) = window_after((0..32).map(|i| (i * MIB, MIB))).await;
        assert_eq!(depth, 16 * MIB);
        assert_eq!(window, depth);
        // At the pace it always had: the floor from the fourth read (a
        // stream counts after three near reads), doubled once the reads
        // have moved 8 MiB on from there, at the twelfth.
        assert_eq!(
            window_after((0..11).map(|i| (i * MIB, MIB))).await.0,
            8 * MIB
        );
        assert_eq!(
            window_after((0..12).map(|i| (i * MIB, MIB))).await.0,
            16 * MIB
        );
        let shuffled = (0..32).map(|i| ((i / 2 * 2 + 1 - i % 2) * MIB, MIB));
        assert_eq!(window_after(shuffled).await.0, depth);
        // One that reads 64 KiB of every 2 MiB passes as far but asks for
        // 1 MiB: the floor. So does one that reads its first MiB again
        // and again: it asks for as much as a sequential reader, but does
        // not move on.
        let strided = (0..20).map(|i| (i * 2 * MIB, 64 * 1024));
        assert_eq!(window_after(strided).await.0, 8 * MIB);
        let repeated = (0..32).map(|_| (0, MIB));
        assert_eq!(window_after(repeated).await.0, 8 * MIB);
    }

    #[tokio::test]
    async fn no_read_ahead_starts_once_the_drive_is_closing() {
        let (store, drive) = far_link_drive(&[(0, 16 * MIB)]).await;
        drive.inner.read_ahead.lock().unwrap().window = 8 * MIB;
        drive.close().await.unwrap();
        // A read that was in flight through the close moves the stream on.
        drive.inner.read_ahead.lock().unwrap().last_end = 4 * MIB;
        let before = store.counts();
        assert!(drive.inner.next_read_ahead().is_none());
        assert_eq!(store.counts(), before);
    }
}
