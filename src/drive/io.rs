//! Reads, writes and discards through the page cache.
//!
//! What it owns: getting the chunks an operation needs into memory (pinned),
//! filling invalid pages from the blob (only pages the sparse map says may
//! hold data, coalesced into few Get Blob requests; the rest are zeros), and
//! copying bytes in or out. Invariants: no chunk lock is held across an
//! await; a partial-page write fills the page and applies the bytes under the
//! chunk's lock, so two read-modify-writes of one page never lose an update;
//! a fill never overwrites a valid page (it is at least as new as the blob).

use bytes::Bytes;

use super::cache::ChunkRef;
use super::chunk::{CHUNK_BYTES, CHUNK_PAGES};
use super::counters::add;
use super::error::{Error, Result};
use super::extents::PageRange;
use super::Inner;
use crate::units::{ByteRange, MAX_PUT_PAGE_BYTES, PAGE_SIZE};

/// Largest single Get Blob a fill issues.
const MAX_GET_BYTES: u64 = 4 * 1024 * 1024;

/// What a fill found, for the hit/miss counters.
#[derive(Default)]
struct FillStats {
    hits: u64,
    misses: u64,
    holes: u64,
}

/// Chunk numbers touched by `[start, end)` bytes.
fn chunks_of(start: u64, end: u64) -> std::ops::Range<u64> {
    start / CHUNK_BYTES..end.div_ceil(CHUNK_BYTES)
}

/// The pages of chunk `index`, as a global page range.
fn chunk_pages(index: u64) -> PageRange {
    let first = index * CHUNK_PAGES as u64;
    PageRange::new(first, first + CHUNK_PAGES as u64)
}

fn intersect(a: PageRange, b: PageRange) -> PageRange {
    let start = a.start.max(b.start);
    PageRange::new(start, a.end.min(b.end).max(start))
}

impl Inner {
    /// Pin `indices`, waiting (and flushing, when dirty chunks fill the
    /// cache) until there is room. Never called while holding pins.
    async fn pin_all(&self, indices: &[u64]) -> Result<Vec<ChunkRef>> {
        loop {
            let notified = self.cache.unpinned.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(refs) = self.cache.try_pin_all(indices) {
                return Ok(refs);
            }
            if self.mode == super::Mode::ReadWrite && self.cache.dirty_chunk_bytes() > 0 {
                self.flush_pass().await?;
                continue;
            }
            notified.await;
        }
    }

    /// Writers wait here while dirty chunks pin too much memory: they run a
    /// flush pass themselves, so a failing flush surfaces as their error
    /// instead of a hang.
    async fn throttle(&self) -> Result<()> {
        while self.cache.dirty_chunk_bytes() >= self.max_dirty_bytes {
            let _g = self.flush_lock.lock().await;
            if self.cache.dirty_chunk_bytes() < self.max_dirty_bytes {
                break;
            }
            self.flush_pass_locked().await?;
        }
        Ok(())
    }

    /// Make every page of `want` (global pages, within the pinned `refs`)
    /// valid: pages that may hold data are read from the blob, the others
    /// become zeros.
    /// Hits, misses and holes are counted for the pages inside `count` only.
    async fn fill(
        &self,
        refs: &[ChunkRef],
        want: &[PageRange],
        count: PageRange,
    ) -> Result<FillStats> {
        let mut stats = FillStats::default();
        let mut missing: Vec<PageRange> = Vec::new();
        for r in refs {
            let span = chunk_pages(r.index);
            let c = r.lock();
            for w in want {
                let part = intersect(span, *w);
                for page in part.start..part.end {
                    let counted = page >= count.start && page < count.end;
                    if c.is_valid((page - span.start) as usize) {
                        stats.hits += counted as u64;
                        continue;
                    }
                    stats.misses += counted as u64;
                    match missing.last_mut() {
                        Some(m) if m.end == page => m.end += 1,
                        _ => missing.push(PageRange::new(page, page + 1)),
                    }
                }
            }
        }
        if missing.is_empty() {
            return Ok(stats);
        }
        let mut fetch: Vec<PageRange> = Vec::new();
        {
            let extents = self.extents();
            for m in &missing {
                stats.holes += intersect(*m, count).len_pages();
                for d in extents.within(*m) {
                    stats.holes -= intersect(d, count).len_pages();
                    let mut start = d.start;
                    while start < d.end {
                        let end = d.end.min(start + MAX_GET_BYTES / PAGE_SIZE);
                        fetch.push(PageRange::new(start, end));
                        start = end;
                    }
                }
            }
        }
        let reads = fetch.iter().map(|f| {
            add(&self.meters.get, 1);
            self.store.read(f.bytes())
        });
        let bodies: Vec<Bytes> = futures::future::try_join_all(reads).await?;
        for b in &bodies {
            add(&self.meters.bytes_down, b.len() as u64);
        }
        for r in refs {
            let span = chunk_pages(r.index);
            let mut c = r.lock();
            for m in &missing {
                let part = intersect(span, *m);
                for page in part.start..part.end {
                    let slot = (page - span.start) as usize;
                    // `fetch` is sorted and disjoint: find the range holding `page`.
                    let i = fetch.partition_point(|f| f.end <= page);
                    let content = match fetch.get(i) {
                        Some(f) if f.start <= page => {
                            let at = ((page - f.start) * PAGE_SIZE) as usize;
                            Some(&bodies[i][at..at + PAGE_SIZE as usize])
                        }
                        _ => None,
                    };
                    c.fill(slot, content);
                }
            }
        }
        Ok(stats)
    }

    /// Where a read of `[start, end)` should fetch up to, given how reads have
    /// been going: a sequential reader gets `read_ahead_bytes` beyond its
    /// read, fetched in large steps (half the window at a time).
    fn read_ahead_end(&self, start: u64, end: u64) -> u64 {
        let ra = self.read_ahead_bytes;
        let mut st = self.read_ahead.lock().expect("read-ahead mutex poisoned");
        let sequential = start == st.last_end && start > 0;
        st.last_end = end;
        if !sequential || ra == 0 {
            return end;
        }
        if st.fetched_until >= end + ra / 2 {
            return end;
        }
        let until = (end + ra).min(self.size_bytes);
        st.fetched_until = until;
        until
    }

    pub(crate) async fn read_at(&self, offset_bytes: u64, len: usize) -> Result<Bytes> {
        self.check_open()?;
        let end = self.size_bytes.min(offset_bytes.saturating_add(len as u64));
        if offset_bytes >= end {
            return Ok(Bytes::new());
        }
        let fetch_end = self.read_ahead_end(offset_bytes, end);
        let want = PageRange::covering(ByteRange::new(offset_bytes, end));
        let window = PageRange::covering(ByteRange::new(offset_bytes, fetch_end));
        let mut out = vec![0u8; (end - offset_bytes) as usize];
        let all: Vec<u64> = chunks_of(offset_bytes, fetch_end).collect();
        for batch in all.chunks(self.cache.max_pins()) {
            // Chunks not in memory whose pages hold no data read as zeros
            // (already in `out`) without a request or an allocation.
            let mut need = Vec::with_capacity(batch.len());
            for &idx in batch {
                let part = intersect(chunk_pages(idx), window);
                if !self.cache.contains(idx) && !self.extents().any_in(part) {
                    let asked = intersect(part, want).len_pages();
                    add(&self.meters.cache_misses, asked);
                    add(&self.meters.pages_elided, asked);
                } else {
                    need.push(idx);
                }
            }
            if need.is_empty() {
                continue;
            }
            let refs = self.pin_all(&need).await?;
            let stats = self.fill(&refs, &[window], want).await?;
            for r in &refs {
                let span = chunk_pages(r.index);
                let from = offset_bytes.max(span.start * PAGE_SIZE);
                let to = end.min(span.end * PAGE_SIZE);
                if from >= to {
                    continue;
                }
                let c = r.lock();
                let base = span.start * PAGE_SIZE;
                out[(from - offset_bytes) as usize..(to - offset_bytes) as usize]
                    .copy_from_slice(c.bytes((from - base) as usize, (to - base) as usize));
            }
            add(&self.meters.cache_misses, stats.misses);
            add(&self.meters.cache_hits, stats.hits);
            add(&self.meters.pages_elided, stats.holes);
        }
        Ok(Bytes::from(out))
    }

    fn check_range(&self, offset_bytes: u64, len_bytes: u64) -> Result<u64> {
        match offset_bytes.checked_add(len_bytes) {
            Some(end) if end <= self.size_bytes => Ok(end),
            _ => Err(Error::OutOfRange {
                offset_bytes,
                len_bytes,
                size_bytes: self.size_bytes,
            }),
        }
    }

    pub(crate) async fn write_at(&self, offset_bytes: u64, data: &[u8]) -> Result<()> {
        self.check_writable()?;
        let end = self.check_range(offset_bytes, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        let all: Vec<u64> = chunks_of(offset_bytes, end).collect();
        for batch in all.chunks(self.cache.max_pins()) {
            self.throttle().await?;
            self.check_writable()?;
            let refs = self.pin_all(batch).await?;
            let b_start = offset_bytes.max(batch[0] * CHUNK_BYTES);
            let b_end = end.min((batch[batch.len() - 1] + 1) * CHUNK_BYTES);
            // Pages only partly covered must be filled before the bytes land.
            let mut partial = Vec::new();
            let first = b_start / PAGE_SIZE;
            let last = (b_end - 1) / PAGE_SIZE;
            for page in [first, last] {
                let covered = b_start <= page * PAGE_SIZE && b_end >= (page + 1) * PAGE_SIZE;
                if !covered && partial.last() != Some(&PageRange::new(page, page + 1)) {
                    partial.push(PageRange::new(page, page + 1));
                }
            }
            if !partial.is_empty() {
                self.fill(&refs, &partial, PageRange::new(0, 0)).await?;
            }
            for r in &refs {
                let base = r.index * CHUNK_BYTES;
                let from = b_start.max(base);
                let to = b_end.min(base + CHUNK_BYTES);
                let src = &data[(from - offset_bytes) as usize..(to - offset_bytes) as usize];
                let mut c = r.lock();
                let delta = c.write((from - base) as usize, src);
                self.cache.note(r.index, delta);
            }
        }
        self.kick.notify_one();
        Ok(())
    }

    pub(crate) async fn discard(&self, offset_bytes: u64, len_bytes: u64) -> Result<()> {
        self.check_writable()?;
        let end = self.check_range(offset_bytes, len_bytes)?;
        if len_bytes == 0 {
            return Ok(());
        }
        let (first, last) = (offset_bytes.div_ceil(PAGE_SIZE), end / PAGE_SIZE);
        if first >= last {
            return self
                .write_at(offset_bytes, &vec![0u8; len_bytes as usize])
                .await;
        }
        let whole = PageRange::new(first, last);
        let head = whole.start * PAGE_SIZE - offset_bytes;
        if head > 0 {
            self.write_at(offset_bytes, &vec![0u8; head as usize])
                .await?;
        }
        let tail = end - whole.end * PAGE_SIZE;
        if tail > 0 {
            self.write_at(whole.end * PAGE_SIZE, &vec![0u8; tail as usize])
                .await?;
        }
        // No flush pass runs while the blob is cleared and the cache zeroed,
        // so no upload of an older page can land after the clear.
        let _g = self.flush_lock.lock().await;
        self.check_writable()?;
        let parts = self.extents().within(whole);
        for part in parts {
            add(&self.meters.clear_page, 1);
            if let Err(e) = self.store.clear_pages(part.bytes(), self.lease.id()).await {
                return Err(self.write_error(e));
            }
            self.extents().remove(part);
        }
        for idx in self
            .cache
            .present_in(chunks_of(whole.start * PAGE_SIZE, whole.end * PAGE_SIZE))
        {
            let Some(r) = self.cache.get(idx) else {
                continue;
            };
            let span = chunk_pages(idx);
            let part = intersect(span, whole);
            let mut c = r.lock();
            for page in part.start..part.end {
                let delta = c.zero_clean((page - span.start) as usize);
                self.cache.note(idx, delta);
            }
        }
        Ok(())
    }

    /// Turn a failed Put Page / Clear Pages into the drive's error, noting a
    /// lost lease.
    pub(crate) fn write_error(&self, e: crate::blob::Error) -> Error {
        if e.is_lease_lost() {
            self.lease.mark_lost(&e);
            self.lease.lost_error()
        } else {
            tracing::warn!(target = %self.target, error = %e, "write to the blob failed");
            Error::Backend(e)
        }
    }

    /// Every dirty page, as `(offset_bytes, bytes)` runs of at most 4 MiB.
    pub(crate) fn unflushed_data(&self) -> Vec<(u64, Bytes)> {
        let mut out: Vec<(u64, Vec<u8>)> = Vec::new();
        for idx in self.cache.dirty_chunks() {
            let Some(r) = self.cache.get(idx) else {
                continue;
            };
            let base_page = idx * CHUNK_PAGES as u64;
            let c = r.lock();
            for slot in 0..CHUNK_PAGES {
                if !c.is_dirty(slot) {
                    continue;
                }
                let at = (base_page + slot as u64) * PAGE_SIZE;
                match out.last_mut() {
                    Some((start, buf))
                        if *start + buf.len() as u64 == at
                            && (buf.len() as u64) < MAX_PUT_PAGE_BYTES =>
                    {
                        buf.extend_from_slice(c.page(slot))
                    }
                    _ => out.push((at, c.page(slot).to_vec())),
                }
            }
        }
        out.into_iter().map(|(o, b)| (o, Bytes::from(b))).collect()
    }
}
