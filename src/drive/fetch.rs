//! Filling cache pages from the blob, each page fetched once.
//!
//! What it owns: turning "these pages must be valid" into few Get Blob
//! requests (only the parts the sparse map says may hold data, coalesced; the
//! rest become zeros; chunks the disk tier holds are read from it instead,
//! and what the blob returns is copied down to it), and making sure two
//! readers of the same missing page do not both fetch it: a fetch marks its
//! pages `fetching` in their chunks; others wait for it, or fetch themselves
//! if it failed. Invariants: a fill
//! never overwrites a valid page (it is at least as new as the blob); a
//! [`FetchJob`] that ends without filling (error, cancellation) clears its
//! marks in `Drop`, so nobody waits forever. A job pins its chunks.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::Notify;

use super::cache::ChunkRef;
use super::chunk::{chunk_pages, chunks_of};
use super::counters::add;
use super::disk_cache::CachedChunk;
use super::error::Result;
use super::extents::{intersect, PageRange};
use super::Inner;
use crate::units::{ByteRange, MAX_GET_BYTES, PAGE_SIZE};

/// Holes up to this size between two stored extents are read along with
/// them (the service returns zeros there): one 4 MiB Get costs about what a
/// 64 KiB one does, while each request has a fixed round trip. A cold read
/// of a fragmented ext4 region went from 282 Gets per 64 MiB to about 16.
const MAX_READ_HOLE_BYTES: u64 = 256 * 1024;

/// Get Blob requests one fetch has in flight; more only queue at the
/// service and hold more bodies in memory at once.
const GETS_IN_FLIGHT: usize = 8;

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
}

/// Where a job's pages come from.
pub(crate) struct Sources {
    /// The ranges read from the blob (sorted) and their bodies.
    pub blob: Vec<PageRange>,
    pub bodies: Vec<Bytes>,
    /// Chunks found in the disk tier; they give the job's data pages that
    /// the blob reads do not cover.
    pub disk: HashMap<u64, CachedChunk>,
}

impl Sources {
    /// Content of data page `page` (at `slot` of a chunk whose disk copy is
    /// `disk`): `None` for zeros.
    fn data_page<'a>(
        &'a self,
        page: u64,
        disk: Option<&'a CachedChunk>,
        slot: usize,
    ) -> Option<&'a [u8]> {
        let i = self.blob.partition_point(|f| f.end <= page);
        if let Some(f) = self.blob.get(i).filter(|f| f.start <= page) {
            let at = ((page - f.start) * PAGE_SIZE) as usize;
            return Some(&self.bodies[i][at..at + PAGE_SIZE as usize]);
        }
        let on_disk = disk.and_then(|c| c.page(slot));
        debug_assert!(on_disk.is_some(), "page {page} has no source");
        on_disk.flatten()
    }
}

/// Append `page` to sorted page ranges, merging with the last one.
fn push_page(ranges: &mut Vec<PageRange>, page: u64) {
    match ranges.last_mut() {
        Some(r) if r.end == page => r.end += 1,
        _ => ranges.push(PageRange::new(page, page + 1)),
    }
}

/// Append `next` (after every range in `fetch`) to the reads, merged into
/// the last read when the hole between them is small and the result stays
/// within one Get. Pages of a hole that are not this job's are read but
/// never filled (`finish` fills only `mine`).
fn push_coalesced(fetch: &mut Vec<PageRange>, next: PageRange) {
    if let Some(last) = fetch.last_mut() {
        if next.start >= last.end
            && next.start - last.end <= MAX_READ_HOLE_BYTES / PAGE_SIZE
            && next.end - last.start <= MAX_GET_BYTES / PAGE_SIZE
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

    /// Fill this job's pages from `src` (or leave them invalid when
    /// `None`), clear their marks and wake waiters. Pages outside the sparse
    /// map are zeros; the others come from the blob or the disk tier.
    fn finish(&mut self, src: Option<&Sources>) {
        self.done = true;
        for r in &self.refs {
            let span = chunk_pages(r.index);
            let disk = src.and_then(|s| s.disk.get(&r.index));
            let mut c = r.lock();
            for m in &self.mine {
                let part = intersect(span, *m);
                for page in part.start..part.end {
                    let slot = (page - span.start) as usize;
                    if let Some(src) = src {
                        let i = self.fetch.partition_point(|f| f.end <= page);
                        let content = match self.fetch.get(i) {
                            Some(f) if f.start <= page => src.data_page(page, disk, slot),
                            _ => None,
                        };
                        c.fill(slot, content);
                    }
                    c.set_fetching(slot, false);
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
        {
            let extents = self.extents();
            for m in &mine {
                stats.holes += intersect(*m, count).len_pages();
                for d in extents.within(*m) {
                    stats.holes -= intersect(d, count).len_pages();
                    let mut start = d.start;
                    while start < d.end {
                        let end = d.end.min(start + MAX_GET_BYTES / PAGE_SIZE);
                        push_coalesced(&mut fetch, PageRange::new(start, end));
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
        // Collected first: a lazy `map` in the stream would make the future
        // not provably `Send` for every lifetime (a known rustc limitation).
        let reads: Vec<_> = blob
            .iter()
            .map(|f| {
                add(&self.meters.get, 1);
                self.store.read(f.bytes())
            })
            .collect();
        // On error the job is dropped: its marks are cleared, pages stay invalid.
        let bodies: Vec<Bytes> = futures::stream::iter(reads)
            .buffered(GETS_IN_FLIGHT)
            .try_collect()
            .await?;
        for b in &bodies {
            add(&self.meters.bytes_down, b.len() as u64);
        }
        let pages = |v: &[PageRange]| v.iter().map(|r| r.len_pages()).sum::<u64>();
        self.note_disk(pages(&job.fetch), pages(&blob));
        let src = Sources { blob, bodies, disk };
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
        let (job, _, _) = self.reserve(&refs, &[window], PageRange::new(0, 0));
        Ok((!job.is_empty()).then_some(job))
    }
}

/// The cache has no room to pin a read-ahead's chunks now.
#[derive(Debug)]
pub(crate) struct NoRoom;
