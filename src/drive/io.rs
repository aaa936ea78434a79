//! Reads, writes and discards through the page cache.
//!
//! What it owns: getting the chunks an operation needs into memory (pinned,
//! all of one step at once), having their pages filled (`fetch.rs`), copying
//! bytes in or out, writer throttling at the dirty bound, and discard.
//! Invariants: no chunk lock is held across an await; a partial-page write
//! has the page filled first and then applies its bytes under the chunk's
//! lock, so two read-modify-writes of one page never lose an update.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use futures::StreamExt;

use super::cache::ChunkRef;
use super::chunk::{chunk_pages, chunks_of, CHUNK_BYTES, CHUNK_PAGES};
use super::counters::add;
use super::error::{Error, Result};
use super::extents::{intersect, PageRange};
use super::Inner;
use crate::units::{ByteRange, MAX_GET_BYTES, MAX_PUT_PAGE_BYTES, PAGE_SIZE};

/// How far a read may start from the end of the reads before it (either
/// way) and still count as sequential: the kernel's read-ahead window of a
/// loop device (2.5 MiB here) in requests of up to 1.25 MiB.
const SEQUENTIAL_SLACK_BYTES: u64 = 2 * 1024 * 1024;
/// Near reads in a row before read-ahead starts. Random 4 KiB reads over
/// 128 MiB land near by chance 3% of the time; with a 32 MiB window, even
/// that turned a fio random-read job into a stream of 4 MiB Gets (cold
/// random reads fell from 0.74 to 0.56 of the ceiling).
const SEQUENTIAL_STREAK: u32 = 3;

impl Inner {
    /// Pin `indices` with blocks for `pages`, waiting (and flushing, when
    /// dirty chunks fill the cache) until there is room. Never called while
    /// holding pins.
    pub(crate) async fn pin_all(&self, indices: &[u64], pages: PageRange) -> Result<Vec<ChunkRef>> {
        loop {
            let notified = self.cache.unpinned.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(refs) = self.cache.try_pin_all(indices, pages) {
                return Ok(refs);
            }
            if self.mode == super::Mode::ReadWrite && self.cache.dirty_bytes() > 0 {
                // In an outage, fail now rather than spend another budget.
                if let Some(e) = self.passes.last_failure() {
                    return Err(e);
                }
                self.flush_pass().await?;
                continue;
            }
            notified.await;
        }
    }

    /// Writers wait here while dirty data fills its budget (`max_dirty`),
    /// and only for room: the flusher is told to drain at once, and a writer
    /// goes on as soon as enough pages are clean, not when a whole pass
    /// ends. A failed pass is the waiting writers' answer. While the last
    /// pass failed (an outage), a writer that finds no room fails at once:
    /// the background flusher keeps trying, and each writer waiting a
    /// budget of its own would stall a filesystem's writeback for many
    /// budgets in a row.
    async fn throttle(&self) -> Result<()> {
        let seen = self.passes.finished();
        loop {
            let cleaned = self.cache.cleaned.notified();
            let passed = self.passes.ended.notified();
            tokio::pin!(cleaned, passed);
            cleaned.as_mut().enable();
            passed.as_mut().enable();
            if self.cache.dirty_memory() < self.max_dirty_bytes {
                return Ok(());
            }
            if let Some(e) = self.passes.last_failure() {
                return Err(e);
            }
            self.passes.failed_since(seen)?;
            self.lease.check()?;
            self.request_drain();
            tokio::select! {
                _ = cleaned => {}
                _ = passed => {}
            }
        }
    }

    /// Note a read of `[start, end)` in the stream state and say how many
    /// read-ahead workers the stream wants now (0: none). A sequential
    /// stream fetches up to its window beyond its reads; the window starts
    /// at the floor and doubles each time the reads have moved on by one
    /// window and asked for a window's worth of bytes, up to the depth the
    /// link asks for (`link.rs`, capped by `read_ahead_bytes`), so a
    /// reader that stops (or re-reads where it is), skips most of what it
    /// passes, or jumps elsewhere stops its growth, and a random reader
    /// gets none.
    fn note_read(&self, start: u64, end: u64) -> usize {
        let cap = self.read_ahead_bytes;
        let step = self.read_ahead_step();
        let mut st = self.read_ahead.lock().expect("read-ahead mutex poisoned");
        // The loop device and the kernel's own read-ahead send several reads
        // at once, which arrive out of order: a read that starts near where
        // reads have got to is still part of the sequential stream. Random
        // reads land near by chance too, so a stream counts only after a
        // few near reads in a row. Once a stream runs, a read up to its
        // window away from its edge, either way, is part of it too: the
        // reads that waited for one read-ahead Get (the loop device keeps
        // several megabytes of them in flight) all complete when it lands,
        // in any order, and would otherwise look like jumps (through the
        // model of a standard blob, 280 new streams in a 512 MiB read, each
        // back to the floor, the reader outrunning it in small Gets: 3.5
        // times the Gets).
        let slack = SEQUENTIAL_SLACK_BYTES.max(st.window);
        let near = st.last_end > 0 && start.abs_diff(st.last_end) <= slack;
        if !near {
            // A new stream: what was fetched for the old one says nothing
            // here, and its window starts again from the floor.
            *st = super::ReadAhead {
                last_end: end,
                fetched_until: end,
                ..Default::default()
            };
            return 0;
        }
        st.streak = st.streak.saturating_add(1);
        st.last_end = st.last_end.max(end);
        st.consumed = st.consumed.saturating_add(end.saturating_sub(start));
        if cap == 0 || st.streak < SEQUENTIAL_STREAK {
            return 0;
        }
        let depth = self.link.estimate().depth_bytes(step, cap);
        let edge = st.last_end;
        let was = st.window;
        if st.window == 0 {
            st.window = super::link::floor_bytes(step, cap);
            st.consumed = 0;
            st.grow_at = edge + st.window;
        } else if edge >= st.grow_at && st.consumed >= st.window {
            st.window = (2 * st.window).max(step);
            st.consumed = 0;
            st.grow_at = edge + st.window;
        }
        // A link found slower than it was thought shrinks it at once.
        st.window = st.window.min(depth);
        if st.window != was {
            let link = self.link.estimate();
            tracing::debug!(
                target = %self.target,
                window_bytes = st.window,
                rate_bytes_per_s = link.rate_bytes_per_s().map(|r| r as u64),
                rtt_us = link.rtt().map(|d| d.as_micros() as u64),
                "read-ahead window"
            );
        }
        let until = self.window_end(edge, st.window);
        if st.fetched_until.max(edge) + step > until {
            return 0; // less than a step to top up
        }
        st.window.div_ceil(step) as usize
    }

    /// Where a window of `window` bytes beyond reads that got to `edge`
    /// ends: on a whole step, so every Get after the first is a whole,
    /// aligned step (a ragged end would cut one step into two short Gets
    /// at every top-up: a third more requests per GiB), or at the end of
    /// the drive.
    fn window_end(&self, edge: u64, window: u64) -> u64 {
        let size = self.size_bytes();
        let step = self.read_ahead_step();
        match (edge + window).min(size) {
            end if end == size => end,
            end => end / step * step,
        }
    }

    /// The part of the read-ahead window one background job fetches: one
    /// Get, or half the window when that is smaller.
    pub(crate) fn read_ahead_step(&self) -> u64 {
        (self.read_ahead_bytes / 2).clamp(PAGE_SIZE, MAX_GET_BYTES)
    }

    /// The next step of the current stream's window that no read-ahead has
    /// started, reserved (its pages marked, so a reader arriving first
    /// waits for it): `None` when the window is full, there is no stream,
    /// or the cache has no room to pin it now, or the drive is closing (no
    /// Get after close). Steps whose pages are all
    /// valid, being fetched or holes are passed over. Read-ahead workers
    /// call it each time their Get completes, so the window is topped up
    /// as the link frees, not only when a read arrives.
    pub(crate) fn next_read_ahead(&self) -> Option<super::fetch::FetchJob> {
        let step = self.read_ahead_step();
        // Held while reserving, so two workers never take the same step;
        // nothing takes this lock while holding a cache or chunk lock.
        let mut st = self.read_ahead.lock().expect("read-ahead mutex poisoned");
        if st.window == 0 || self.ahead_off.load(Ordering::Acquire) {
            return None;
        }
        let end = self.window_end(st.last_end, st.window);
        loop {
            let from = st.last_end.max(st.fetched_until);
            if from >= end {
                return None;
            }
            // Steps end on multiples of the step, like the writes that
            // filled the blob, so each is one Get.
            let until = end.min((from / step + 1) * step);
            let job = self.reserve_read_ahead(from, until).ok()?;
            st.fetched_until = until;
            if job.is_some() {
                return job;
            }
        }
    }

    /// Read `[offset, offset + len)` clipped to the drive; also returns how
    /// many read-ahead workers the caller should have running in the
    /// background ([`Self::note_read`]).
    pub(crate) async fn read_at(&self, offset_bytes: u64, len: usize) -> Result<(Bytes, usize)> {
        self.check_open()?;
        let end = self
            .size_bytes()
            .min(offset_bytes.saturating_add(len as u64));
        if offset_bytes >= end {
            return Ok((Bytes::new(), 0));
        }
        let want = PageRange::covering(ByteRange::new(offset_bytes, end));
        // Filled in order, chunk by chunk: zeroing it first would cost one
        // more pass over every byte read.
        let mut out = crate::buffers::take((end - offset_bytes) as usize);
        let all: Vec<u64> = chunks_of(offset_bytes, end).collect();
        for batch in all.chunks(self.cache.max_pins()) {
            // Chunks not in memory whose pages hold no data read as zeros
            // without a request or an allocation.
            let mut need = Vec::with_capacity(batch.len());
            for &idx in batch {
                let part = intersect(chunk_pages(idx), want);
                if !self.cache.contains(idx) && !self.extents().any_in(part) {
                    add(&self.meters.cache_misses, part.len_pages());
                    add(&self.meters.pages_elided, part.len_pages());
                } else {
                    need.push(idx);
                }
            }
            let refs = if need.is_empty() {
                Vec::new()
            } else {
                let refs = self.pin_all(&need, want).await?;
                let stats = self.fill(&refs, &[want], want).await?;
                add(&self.meters.cache_misses, stats.misses);
                add(&self.meters.cache_hits, stats.hits);
                add(&self.meters.pages_elided, stats.holes);
                refs
            };
            for &idx in batch {
                let span = chunk_pages(idx);
                let from = offset_bytes.max(span.start * PAGE_SIZE);
                let to = end.min(span.end * PAGE_SIZE);
                match refs.iter().find(|r| r.index == idx) {
                    Some(r) => {
                        let base = span.start * PAGE_SIZE;
                        r.lock()
                            .copy_out((from - base) as usize, (to - base) as usize, &mut out);
                    }
                    None => out.resize(out.len() + (to - from) as usize, 0),
                }
            }
        }
        debug_assert_eq!(out.len() as u64, end - offset_bytes);
        let workers = self.note_read(offset_bytes, end);
        Ok((crate::buffers::freeze(out), workers))
    }

    fn check_range(&self, offset_bytes: u64, len_bytes: u64) -> Result<u64> {
        match offset_bytes.checked_add(len_bytes) {
            Some(end) if end <= self.size_bytes() => Ok(end),
            _ => Err(Error::OutOfRange {
                offset_bytes,
                len_bytes,
                size_bytes: self.size_bytes(),
            }),
        }
    }

    pub(crate) async fn write_at(&self, offset_bytes: u64, data: &[u8]) -> Result<()> {
        self.write_at_as(offset_bytes, data, false).await
    }

    /// [`Self::write_at`]; with `keep_allocated` (`data` is zeros) the whole
    /// pages written stay allocated in the blob: the flush sends them as
    /// data instead of turning them into a clear.
    pub(crate) async fn write_at_as(
        &self,
        offset_bytes: u64,
        data: &[u8],
        keep_allocated: bool,
    ) -> Result<()> {
        self.check_writable()?;
        let end = self.check_range(offset_bytes, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        let all: Vec<u64> = chunks_of(offset_bytes, end).collect();
        for batch in all.chunks(self.cache.max_pins()) {
            self.throttle().await?;
            self.check_writable()?;
            let b_start = offset_bytes.max(batch[0] * CHUNK_BYTES);
            let b_end = end.min((batch[batch.len() - 1] + 1) * CHUNK_BYTES);
            let refs = self
                .pin_all(batch, PageRange::covering(ByteRange::new(b_start, b_end)))
                .await?;
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
                if keep_allocated {
                    c.keep_allocated((from - base) as usize, src.len());
                }
                self.cache.note(r.index, delta);
                self.disk_invalidate(r.index);
            }
        }
        // The 4 MiB window of the drive this write may have completed: the
        // one behind a boundary the stream just went past, or, for a write
        // that arrived late (the loop device sends several at once), its own
        // window when the stream is already past it.
        let window = {
            let mut last = self.last_write.lock().expect("last-write mutex poisoned");
            let prev = *last;
            *last = Some((end, std::time::Instant::now()));
            match prev {
                // A write far from where the last one ended starts a new
                // stream: its progress is counted from here.
                Some((e, _)) if e.abs_diff(offset_bytes) <= MAX_PUT_PAGE_BYTES => {
                    const W: u64 = MAX_PUT_PAGE_BYTES;
                    let own = (end - 1) / W * W;
                    if e / W < end / W {
                        Some(end / W * W - W)
                    } else if own + W <= e {
                        Some(own)
                    } else {
                        None
                    }
                }
                _ => {
                    *self.stream.lock().expect("stream mutex poisoned") =
                        Some(super::flush::StreamMarks::starting_at(offset_bytes));
                    None
                }
            }
        };
        self.writes_accepted.fetch_add(1, Ordering::AcqRel);
        self.kick.notify_one();
        // A window all dirty cannot become a fuller Put Page by waiting. (One
        // with holes, writes still on their way, waits: a pass now would cut
        // it into ragged requests.)
        if window.is_some_and(|start| self.window_all_dirty(start)) {
            self.window_full.notify_one();
        }
        Ok(())
    }

    /// True when every page of the 4 MiB window of the drive starting at
    /// `start` is in memory and dirty: a whole Put Page waiting to go.
    fn window_all_dirty(&self, start: u64) -> bool {
        chunks_of(start, start + MAX_PUT_PAGE_BYTES).all(|idx| {
            self.cache
                .get(idx)
                .is_some_and(|r| r.lock().dirty_pages() == CHUNK_PAGES)
        })
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
        let lease = self.lease.id();
        let cleared: Vec<(PageRange, std::result::Result<(), crate::blob::Error>)> =
            futures::stream::iter(parts)
                .map(|part| async move {
                    add(&self.meters.clear_page, 1);
                    (part, self.store.clear_pages(part.bytes(), lease).await)
                })
                .buffer_unordered(self.flush_parallelism)
                .collect()
                .await;
        let mut failed = Vec::new();
        let mut first_err = None;
        for (part, r) in cleared {
            match r {
                Ok(()) => self.extents().remove(part),
                Err(e) => {
                    failed.push(part);
                    first_err.get_or_insert(self.write_error(e));
                }
            }
        }
        // Cached pages become zero: clean where the blob is now zero; dirty
        // where the clear failed (the blob may hold either), so a later
        // flush clears them and cache and blob agree again.
        let zeros = [0u8; PAGE_SIZE as usize];
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
                let slot = (page - span.start) as usize;
                let delta = if failed.iter().any(|f| page >= f.start && page < f.end) {
                    c.write(slot * PAGE_SIZE as usize, &zeros)
                } else {
                    c.zero_clean(slot)
                };
                self.cache.note(idx, delta);
            }
        }
        self.cache.cleaned.notify_waiters();
        self.writes_accepted.fetch_add(1, Ordering::AcqRel);
        // Disk copies taken before the clear (even of chunks not in memory)
        // must not be trusted: the chunks' clean pages go down again later.
        self.disk_invalidate_pages(whole);
        match first_err {
            Some(e) => {
                self.kick.notify_one();
                Err(e)
            }
            None => Ok(()),
        }
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
