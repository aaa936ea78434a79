//! Flushing: dirty pages become Put Page (update) and Clear Pages requests.
//!
//! A pass walks the dirty chunks in order and gathers contiguous dirty pages
//! into spans (at most 16 MiB), then cuts each span into runs: an all-zero
//! page that may hold data joins a clear run; an all-zero page that holds
//! none is skipped (counted as elided); any other page joins an update run of
//! at most 4 MiB. A short stretch of zero pages between data pages (a zero
//! sector inside a filesystem block) is written as part of the update rather
//! than splitting it into three requests. Runs span chunk boundaries and go
//! out in parallel (bounded). A background pass (the flusher's timer, or a
//! write stream that has just filled a whole 4 MiB window; not an fsync, a
//! close or a writer waiting for room) leaves the head of a write
//! stream still going, back to its last 4 MiB boundary of the drive, for its
//! next pass, so a long sequential write goes out in full, aligned 4 MiB
//! requests. A writer that finds the dirty budget full asks for a drain:
//! the flusher runs a full pass at once, and the writer goes on as soon as
//! enough pages are clean. A background or drain pass *follows* a write
//! stream: when its runs are all out and a request slot frees, it looks at
//! the dirty pages again and sends the whole 4 MiB Put Pages written since,
//! so the link stays busy instead of idling between passes; it skips the
//! pages of runs in flight, and stops taking work once anyone waits for
//! the flush lock (an fsync), the drive closes, a drain is wanted, or the
//! pass is `flush_delay` old (so a short run beside a stream waits at most
//! for the next pass). Any other pass does the same while its own
//! last runs are out, so its tail keeps the link busy too. Invariants: every request carries
//! the lease id; one pass at a time, and within a pass a page is never in
//! two runs in flight (so a page is never in two uploads at once); a page
//! written again after it was copied keeps its dirty bit (its generation
//! moved); the sparse map gains pages before an update is sent and loses them
//! only after a clear succeeded; pages reach the disk tier only once settled.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use tokio::task::JoinHandle;

use super::cache::ChunkRef;
use super::chunk::{PageBits, CHUNK_PAGES};
use super::counters::add;
use super::error::{Error, Result};
use super::extents::PageRange;
use super::Inner;
use crate::units::{MAX_PUT_PAGE_BYTES, PAGE_SIZE};

const MAX_UPDATE_PAGES: u64 = MAX_PUT_PAGE_BYTES / PAGE_SIZE;
/// Longest span gathered before it is cut: one full Put Page, so a long
/// sequential write still goes out in 4 MiB requests, and a span's copy is
/// freed as soon as its own requests are done (runs share their span's
/// buffer; 16 MiB spans kept up to 60 MiB of copies alive with 8 in flight).
/// Spans start at the first dirty page, not at 4 MiB boundaries of the
/// drive: aligned spans cost one more Put Page per flush pass that starts
/// mid-window (318 per GiB instead of 292 in the bench; BENCHMARKS.md).
const SPAN_PAGES: u64 = MAX_UPDATE_PAGES;
/// Zero stretches up to this long between data pages are written, not split out.
const ZERO_ISLAND_PAGES: usize = 8;
const PAGE: usize = PAGE_SIZE as usize;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Update,
    Clear,
}

/// What a dirty page needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Not all zero: Put Page.
    Data,
    /// All zero, may hold data in the blob: Clear Pages.
    ZeroHeld,
    /// All zero, holds nothing in the blob: nothing to send.
    ZeroNone,
}

/// Consecutive dirty pages that go out in one request.
struct Run {
    kind: Kind,
    pages: PageRange,
    /// Page contents, for updates.
    data: Bytes,
    /// Generation of each page when it was copied.
    gens: Vec<u32>,
    /// The chunks the run covers, in order (pinned until it settles).
    chunks: Vec<ChunkRef>,
}

/// Contiguous dirty pages, copied with their classes and generations.
struct Span {
    start: u64,
    classes: Vec<Class>,
    gens: Vec<u32>,
    data: Vec<u8>,
    chunks: Vec<ChunkRef>,
}

impl Span {
    fn end(&self) -> u64 {
        self.start + self.classes.len() as u64
    }
}

/// The chunks of `chunks` that hold pages of `pages`.
fn chunks_for(chunks: &[ChunkRef], pages: PageRange) -> Vec<ChunkRef> {
    let first = pages.start / CHUNK_PAGES as u64;
    let last = (pages.end - 1) / CHUNK_PAGES as u64;
    chunks
        .iter()
        .filter(|r| r.index >= first && r.index <= last)
        .cloned()
        .collect()
}

/// Reclassify short zero stretches lying between data pages as data.
fn absorb_zero_islands(classes: &mut [Class]) {
    let n = classes.len();
    let mut i = 0;
    while i < n {
        if classes[i] == Class::Data {
            i += 1;
            continue;
        }
        let j = (i..n).find(|&j| classes[j] == Class::Data).unwrap_or(n);
        if i > 0 && j < n && j - i <= ZERO_ISLAND_PAGES {
            classes[i..j].fill(Class::Data);
        }
        i = j;
    }
}

/// The stretches of `pages` (ascending) that fill at least one whole Put
/// Page, each cut down to whole Put Pages from its start: what a look of a
/// following pass may send. Deciding this from the dirty bits before
/// copying keeps a look beside many scattered dirty pages from copying
/// them all only to drop them as short.
fn whole_stretches(pages: impl IntoIterator<Item = u64>) -> Vec<PageRange> {
    let mut whole = Vec::new();
    let mut push = |s: u64, e: u64| {
        let len = (e - s) / MAX_UPDATE_PAGES * MAX_UPDATE_PAGES;
        if len > 0 {
            whole.push(PageRange::new(s, s + len));
        }
    };
    let mut cur: Option<(u64, u64)> = None;
    for p in pages {
        cur = match cur {
            Some((s, e)) if e == p => Some((s, e + 1)),
            Some((s, e)) => {
                push(s, e);
                Some((p, p + 1))
            }
            None => Some((p, p + 1)),
        };
    }
    if let Some((s, e)) = cur {
        push(s, e);
    }
    whole
}

/// Gathers spans of dirty pages from the given chunks and cuts them into
/// runs, lazily, so only a span and the runs in flight are copied at a time.
struct RunBuilder<'a> {
    inner: &'a Inner,
    /// A background pass leaves the update run ending at `hold.end_page`
    /// unsent back to its last 4 MiB boundary of the drive: the head of a
    /// write stream still going, which the next pass sends as part of a
    /// full, aligned 4 MiB request.
    hold: Option<Hold>,
    /// Pages left dirty for that reason.
    held_pages: u64,
    /// Pages of runs still in flight, which this builder must not copy
    /// again: a page is never in two uploads at once, so no older copy can
    /// land after a newer one.
    busy: Vec<PageRange>,
    /// Only whole Put Pages (the body of a sequential stream); shorter
    /// updates and clears stay dirty for a later pass, which may merge them.
    whole_only: bool,
    /// With `whole_only`: the stretches found whole before copying
    /// (`whole_stretches`); pages outside them are not copied.
    whole: Vec<PageRange>,
    chunks: VecDeque<ChunkRef>,
    /// Next page slot to look at in the front chunk.
    slot: usize,
    /// Which pages of the front chunk may hold data.
    has_data: Option<PageBits>,
    ready: VecDeque<Run>,
}

impl<'a> RunBuilder<'a> {
    fn new(inner: &'a Inner, chunks: VecDeque<ChunkRef>, hold: Option<Hold>) -> Self {
        RunBuilder {
            inner,
            hold,
            held_pages: 0,
            busy: Vec::new(),
            whole_only: false,
            whole: Vec::new(),
            chunks,
            slot: 0,
            has_data: None,
            ready: VecDeque::new(),
        }
    }

    fn data_map(&self, first_page: u64) -> PageBits {
        let mut bits = PageBits::default();
        let span = PageRange::new(first_page, first_page + CHUNK_PAGES as u64);
        for d in self.inner.extents().within(span) {
            for p in d.start..d.end {
                bits.set((p - first_page) as usize);
            }
        }
        bits
    }

    /// Whether `page` is dirty but must not be copied now: in a run in
    /// flight, or (for `whole_only`) outside every whole stretch.
    fn skipped(&self, page: u64) -> bool {
        if self.busy.iter().any(|b| b.contains(page)) {
            return true;
        }
        if !self.whole_only {
            return false;
        }
        let i = self.whole.partition_point(|w| w.end <= page);
        !self.whole.get(i).is_some_and(|w| w.contains(page))
    }

    /// The next span of contiguous dirty pages, or `None` when all are done.
    fn next_span(&mut self) -> Option<Span> {
        let mut span: Option<Span> = None;
        loop {
            let Some(front) = self.chunks.front().cloned() else {
                return span;
            };
            let first_page = front.index * CHUNK_PAGES as u64;
            let has_data = match self.has_data {
                Some(b) => b,
                None => *self.has_data.insert(self.data_map(first_page)),
            };
            let c = front.lock();
            while self.slot < CHUNK_PAGES {
                let slot = self.slot;
                let page = first_page + slot as u64;
                if !c.is_dirty(slot) || self.skipped(page) {
                    self.slot += 1;
                    if span.is_some() {
                        return span;
                    }
                    continue;
                }
                if let Some(s) = &span {
                    if s.end() != page || s.classes.len() as u64 >= SPAN_PAGES {
                        return span;
                    }
                }
                let s = span.get_or_insert_with(|| {
                    // One allocation of the span's size: growing by doubling
                    // would hold two copies at once and fragment the heap.
                    // A span that reaches the chunk's end may go on into the
                    // next chunk: it gets the largest size; a scattered one
                    // only its own pages (4 MiB for each 4 KiB write was
                    // most of a random-write flush's cost).
                    let run = (slot..CHUNK_PAGES)
                        .take_while(|&p| c.is_dirty(p) && !self.skipped(first_page + p as u64))
                        .count();
                    let pages = if slot + run == CHUNK_PAGES {
                        SPAN_PAGES
                    } else {
                        (run as u64).min(SPAN_PAGES)
                    };
                    Span {
                        start: page,
                        classes: Vec::with_capacity(pages as usize),
                        gens: Vec::with_capacity(pages as usize),
                        // Pooled: a fresh 4 MiB per span faulted in new
                        // pages for every Put Page of a sequential write.
                        data: crate::buffers::take((pages * PAGE_SIZE) as usize),
                        chunks: Vec::new(),
                    }
                });
                let bytes = c.page(slot);
                // An encrypting store must send zero pages too (only their
                // ciphertext reads back as zeros); discards still clear.
                // Zeros written to stay allocated (NBD's NO_HOLE) too.
                let class = if self.inner.store.writes_zero_pages()
                    || c.is_kept(slot)
                    || bytes.iter().any(|&b| b != 0)
                {
                    Class::Data
                } else if has_data.get(slot) {
                    Class::ZeroHeld
                } else {
                    Class::ZeroNone
                };
                s.classes.push(class);
                s.gens.push(c.generation(slot));
                s.data.extend_from_slice(bytes);
                if s.chunks.last().map(|r| r.index) != Some(front.index) {
                    s.chunks.push(front.clone());
                }
                self.slot += 1;
            }
            drop(c);
            self.chunks.pop_front();
            self.slot = 0;
            self.has_data = None;
        }
    }

    /// Cut a span into runs; pages needing nothing are settled here.
    fn cut(&mut self, span: Span) {
        let mut classes = span.classes;
        absorb_zero_islands(&mut classes);
        let data = crate::buffers::freeze(span.data);
        let n = classes.len();
        let mut i = 0;
        while i < n {
            let class = classes[i];
            let mut j = i + 1;
            while j < n
                && classes[j] == class
                && (class != Class::Data || ((j - i) as u64) < MAX_UPDATE_PAGES)
            {
                j += 1;
            }
            // The head of a stream still being written goes out only up to
            // its last 4 MiB boundary of the drive; the rest stays dirty, so
            // the stream's next requests start aligned.
            let mut sent = j;
            let end = span.start + j as u64;
            if let Some(h) = self
                .hold
                .filter(|h| class == Class::Data && h.end_page == end)
            {
                let keep = (end - end % MAX_UPDATE_PAGES).max(span.start + i as u64);
                // Only pages written since the previous pass stay back.
                if keep >= h.floor_page {
                    self.held_pages += end - keep;
                    sent = (keep - span.start) as usize;
                }
            }
            // Not a whole Put Page: left for a later pass.
            let short = class != Class::ZeroNone && ((sent - i) as u64) < MAX_UPDATE_PAGES;
            if sent == i || (self.whole_only && (short || class == Class::ZeroHeld)) {
                i = j;
                continue;
            }
            let pages = PageRange::new(span.start + i as u64, span.start + sent as u64);
            let chunks = chunks_for(&span.chunks, pages);
            let gens = &span.gens[i..sent];
            match class {
                Class::Data => self.ready.push_back(Run {
                    kind: Kind::Update,
                    pages,
                    data: data.slice(i * PAGE..sent * PAGE),
                    gens: gens.to_vec(),
                    chunks,
                }),
                Class::ZeroHeld => self.ready.push_back(Run {
                    kind: Kind::Clear,
                    pages,
                    data: Bytes::new(),
                    gens: gens.to_vec(),
                    chunks,
                }),
                Class::ZeroNone => {
                    // Already zero in the blob: clean unless written since.
                    self.inner.settle(pages, gens, &chunks);
                    add(&self.inner.meters.pages_elided, pages.len_pages());
                }
            }
            i = j;
        }
    }
}

impl Iterator for RunBuilder<'_> {
    type Item = Run;

    fn next(&mut self) -> Option<Run> {
        loop {
            if let Some(run) = self.ready.pop_front() {
                return Some(run);
            }
            let span = self.next_span()?;
            self.cut(span);
        }
    }
}

impl Inner {
    /// One flush pass (waits for a running one to end first). When the pass
    /// it waited for failed, that failure is the answer: in an outage the
    /// caller then waits for one pass, not two.
    pub(crate) async fn flush_pass(&self) -> Result<()> {
        let seen = self.passes.finished();
        let _g = self.flush_lock.lock().await;
        self.passes.failed_since(seen)?;
        self.flush_pass_locked().await
    }

    /// One flush pass; the caller holds `flush_lock`.
    pub(crate) async fn flush_pass_locked(&self) -> Result<()> {
        self.run_pass(None, false).await.map(|_| ())
    }

    /// The background flusher's pass: like [`Self::flush_pass`], but the
    /// head of a write stream still going (its last write less than
    /// `flush_delay` ago) may stay dirty back to its last 4 MiB boundary,
    /// so the next pass sends it in a full, aligned request. A page is held
    /// at most once: only pages written since the previous background pass
    /// may be held, and at a stream's first pass only when the stream has
    /// already written a full Put Page (a fast stream). A slow stream
    /// (appends of a few bytes at a time) is therefore never held, and no
    /// byte stays dirty longer than two background passes. Returns whether
    /// pages were held back, so the flusher comes again.
    async fn background_pass(&self) -> Result<bool> {
        let held = self.background_pass_locked().await?;
        // Outside the lock (the next pass need not wait for it): the
        // lineage's mark made known again if this pass's parallel writes
        // left it unknown, so a lease broken later with nothing written
        // since is told apart from one someone wrote under.
        self.settle_lineage().await;
        Ok(held)
    }

    async fn background_pass_locked(&self) -> Result<bool> {
        let _g = self.flush_lock.lock().await;
        let last = *self.last_write.lock().expect("last-write mutex poisoned");
        let hold = {
            let mut stream = self.stream.lock().expect("stream mutex poisoned");
            match (last, stream.as_mut()) {
                (Some((end, at)), Some(marks))
                    if at.elapsed() < self.flush_delay && end % PAGE_SIZE == 0 =>
                {
                    marks.hold(end)
                }
                _ => None,
            }
        };
        Ok(self.run_pass(hold, true).await? > 0)
    }

    /// Send every dirty page (but a held-back stream head, `hold`); returns
    /// the pages held back. The pass takes no new run after one fails (the
    /// rest stay dirty) and gives up when no run has finished for one retry
    /// budget of the store, so an outage costs one budget per pass however
    /// many runs are dirty, while a long pass that keeps finishing runs (tens
    /// of thousands of scattered pages) is never cut short. Its result is
    /// recorded for [`Self::flush_pass`].
    async fn run_pass(&self, hold: Option<Hold>, follow: bool) -> Result<u64> {
        let result = self.send_dirty(hold, follow).await;
        self.passes.record(&result);
        result
    }

    async fn send_dirty(&self, hold: Option<Hold>, follow: bool) -> Result<u64> {
        let dirty = self.cache.dirty_chunks();
        if dirty.is_empty() {
            return Ok(0);
        }
        self.lease.check()?;
        let began = std::time::Instant::now();
        let dirty_bytes = self.cache.dirty_bytes();
        let refs: VecDeque<ChunkRef> = dirty.iter().filter_map(|&i| self.cache.get(i)).collect();
        let mut builder = RunBuilder::new(self, refs, hold);
        let mut held = 0;
        let mut first_err = None;
        let mut runs = 0u64;
        let mut looks = 0u64;
        let budget = self.store.retry_budget();
        let mut deadline = tokio::time::Instant::now() + budget;
        // The pages of each run in flight: a later look at the dirty pages
        // leaves them alone until their run has settled.
        let mut busy: Vec<PageRange> = Vec::new();
        let mut sends = FuturesUnordered::new();
        // Whether a later look at the dirty pages may find whole Put Pages
        // this pass has not seen: a run settled or a window filled since
        // the last look.
        let mut look_again = false;
        // Runs of the pass's own first look still in flight.
        let mut own_in_flight = 0usize;
        loop {
            // After the first failure no new run starts: in an outage every
            // one would spend its own retry budget.
            while first_err.is_none() && sends.len() < self.flush_parallelism {
                let run = match builder.next() {
                    Some(run) => run,
                    // A pass that does not follow (an fsync's, a close's)
                    // still fills the slots its last runs free while they
                    // are out, so its tail does not idle the link.
                    None if ((follow && self.keeps_following(began)) || own_in_flight > 0)
                        && look_again
                        && !self.flush_lock.wanted() =>
                    {
                        // A following pass keeps the link busy: whole Put
                        // Pages written since it began go out as soon as a
                        // request slot frees, not after the pass's last
                        // request (a sequential write then idles between
                        // passes). Only whole ones, and never a page in
                        // flight; a flush waiting for the lock ends it,
                        // and so does `keeps_following`.
                        look_again = false;
                        looks += 1;
                        held += builder.held_pages;
                        builder = self.look_again(busy.clone());
                        continue;
                    }
                    None => break,
                };
                busy.push(run.pages);
                let pages = run.pages;
                let own = looks == 0;
                own_in_flight += usize::from(own);
                sends.push(async move { (pages, own, self.send_run(run).await) });
            }
            if sends.is_empty() {
                break;
            }
            tokio::select! {
                done = sends.next() => {
                    let Some((pages, own, r)) = done else { break };
                    runs += 1;
                    own_in_flight -= usize::from(own);
                    deadline = tokio::time::Instant::now() + budget;
                    if let Some(at) = busy.iter().position(|b| *b == pages) {
                        busy.swap_remove(at);
                    }
                    look_again = true;
                    if let Err(e) = r {
                        first_err.get_or_insert(e);
                    }
                }
                _ = self.window_full.notified(), if follow => look_again = true,
                // Nothing finished for a whole budget: storage does not
                // answer. The requests in flight are dropped here; their
                // pages stay dirty, and the store fences whatever of them
                // may still land.
                _ = tokio::time::sleep_until(deadline) => {
                    first_err.get_or_insert(Error::Stalled {
                        target: self.target.clone(),
                        secs: budget.as_secs(),
                    });
                    break;
                }
            }
        }
        held += builder.held_pages;
        tracing::debug!(
            target = %self.target,
            dirty_bytes,
            runs,
            looks,
            elapsed_ms = began.elapsed().as_millis() as u64,
            ok = first_err.is_none(),
            "flush pass"
        );
        match first_err {
            Some(e) => Err(e),
            None => Ok(held),
        }
    }

    /// Whether a following pass that began at `began` may take more work:
    /// not once the drive is closing or a writer waits for a drain (the
    /// flusher must come round to that), and not once the pass is
    /// `flush_delay` old. A following pass sends only whole Put Pages, so
    /// without the age limit a short run or a clear written beside a
    /// long stream would wait for the stream to end; with it, the next
    /// pass (at most one delay later) sends it.
    fn keeps_following(&self, began: std::time::Instant) -> bool {
        !self.stopping.load(Ordering::Acquire)
            && !self.drain_wanted.load(Ordering::Acquire)
            && began.elapsed() < self.flush_delay
    }

    /// A builder for another look at the dirty pages during a following
    /// pass: whole Put Pages only, none of the pages in `busy`.
    fn look_again(&self, busy: Vec<PageRange>) -> RunBuilder<'_> {
        let refs: Vec<ChunkRef> = self
            .cache
            .dirty_chunks()
            .iter()
            .filter_map(|&i| self.cache.get(i))
            .collect();
        // Whole-ness from the dirty bits alone (one chunk locked at a
        // time), so only pages that go out are copied.
        let mut pages = Vec::new();
        for r in &refs {
            let first = r.index * CHUNK_PAGES as u64;
            let c = r.lock();
            pages.extend(
                (0..CHUNK_PAGES)
                    .filter(|&slot| c.is_dirty(slot))
                    .map(|slot| first + slot as u64)
                    .filter(|p| !busy.iter().any(|b| b.contains(*p))),
            );
        }
        let whole = whole_stretches(pages);
        let refs: VecDeque<ChunkRef> = refs
            .into_iter()
            .filter(|r| {
                let first = r.index * CHUNK_PAGES as u64;
                let chunk = PageRange::new(first, first + CHUNK_PAGES as u64);
                whole
                    .iter()
                    .any(|w| w.start < chunk.end && chunk.start < w.end)
            })
            .collect();
        let mut b = RunBuilder::new(self, refs, None);
        b.busy = busy;
        b.whole_only = true;
        b.whole = whole;
        b
    }

    /// Pages `pages` reached the blob as copied at generations `gens`: clear
    /// the dirty bit of each one not written again since.
    fn settle(&self, pages: PageRange, gens: &[u32], chunks: &[ChunkRef]) {
        for r in chunks {
            let first = r.index * CHUNK_PAGES as u64;
            let from = pages.start.max(first);
            let to = pages.end.min(first + CHUNK_PAGES as u64);
            let mut c = r.lock();
            for page in from..to {
                let delta = c.settle((page - first) as usize, gens[(page - pages.start) as usize]);
                self.cache.note(r.index, delta);
            }
        }
        self.cache.cleaned.notify_waiters();
        // Durable now: the chunks' clean pages may go down to the disk tier.
        self.persist(chunks);
    }

    async fn send_run(&self, run: Run) -> Result<()> {
        self.lease.check()?;
        let Run {
            kind,
            pages,
            data,
            gens,
            chunks,
        } = run;
        let lease = self.lease.id();
        let sent = match kind {
            Kind::Update => {
                self.extents().insert(pages);
                add(&self.meters.put_page, 1);
                add(&self.meters.bytes_up, data.len() as u64);
                self.store
                    .write_pages(pages.bytes().start, data, lease)
                    .await
            }
            Kind::Clear => {
                add(&self.meters.clear_page, 1);
                let r = self.store.clear_pages(pages.bytes(), lease).await;
                if r.is_ok() {
                    self.extents().remove(pages);
                }
                r
            }
        };
        if let Err(e) = sent {
            return Err(self.write_error(e));
        }
        self.settle(pages, &gens, &chunks);
        Ok(())
    }
}

/// The lock that keeps flush passes one at a time (so a page is never in
/// two uploads at once), and knows whether anyone waits for it: a following
/// pass (the background flusher's) takes no new work then, so an fsync
/// waits for the requests in flight, not for a write stream to end.
#[derive(Default)]
pub(crate) struct FlushLock {
    lock: tokio::sync::Mutex<()>,
    waiting: AtomicUsize,
}

impl FlushLock {
    /// Wait for the lock.
    pub(crate) async fn lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        if let Ok(g) = self.lock.try_lock() {
            return g;
        }
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.waiting.fetch_add(1, Ordering::AcqRel);
        // Counted until it has the lock or gives up waiting (dropped).
        let _waiting = Waiting(&self.waiting);
        self.lock.lock().await
    }

    /// True while a pass runs (or a caller holds the lock otherwise).
    pub(crate) fn is_held(&self) -> bool {
        self.lock.try_lock().is_err()
    }

    /// True when a caller waits for the lock.
    fn wanted(&self) -> bool {
        self.waiting.load(Ordering::Acquire) > 0
    }
}

/// What a background pass may leave dirty: the update run ending at
/// `end_page`, back to its 4 MiB boundary, if that is not below `floor_page`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hold {
    end_page: u64,
    floor_page: u64,
}

/// Where a sequential write stream began and where it stood at the
/// previous background pass.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StreamMarks {
    start_bytes: u64,
    at_last_pass_bytes: Option<u64>,
}

impl StreamMarks {
    /// A stream whose first write begins at `offset_bytes`.
    pub(crate) fn starting_at(offset_bytes: u64) -> Self {
        StreamMarks {
            start_bytes: offset_bytes,
            at_last_pass_bytes: None,
        }
    }

    /// What a background pass may hold when the stream's last write ended
    /// at `end_bytes`; records the pass.
    fn hold(&mut self, end_bytes: u64) -> Option<Hold> {
        let hold = match self.at_last_pass_bytes {
            // Pages written since the previous pass only.
            Some(mark) => Some(mark),
            // The stream's first pass: only a stream that already wrote a
            // full Put Page is worth waiting for.
            None if end_bytes.saturating_sub(self.start_bytes) >= MAX_PUT_PAGE_BYTES => Some(0),
            None => None,
        };
        self.at_last_pass_bytes = Some(end_bytes);
        hold.map(|floor| Hold {
            end_page: end_bytes / PAGE_SIZE,
            floor_page: floor.div_ceil(PAGE_SIZE),
        })
    }
}

/// How the flush passes ended, so a caller that waited for a pass can take
/// its failure as the answer instead of starting another one.
#[derive(Default)]
pub(crate) struct PassLog {
    state: Mutex<(u64, Option<Error>)>,
    /// Signalled whenever a pass ends.
    pub(crate) ended: tokio::sync::Notify,
}

impl PassLog {
    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, Option<Error>)> {
        self.state.lock().expect("pass-log mutex poisoned")
    }

    /// Passes finished so far.
    pub(crate) fn finished(&self) -> u64 {
        self.lock().0
    }

    fn record(&self, result: &Result<u64>) {
        {
            let mut s = self.lock();
            s.0 += 1;
            s.1 = result.as_ref().err().cloned();
        }
        self.ended.notify_waiters();
    }

    /// The failure of the last pass, when it ended after `seen` passes.
    pub(crate) fn failed_since(&self, seen: u64) -> Result<()> {
        match &*self.lock() {
            (n, Some(e)) if *n > seen => Err(e.clone()),
            _ => Ok(()),
        }
    }

    /// The failure of the last pass, if it failed.
    pub(crate) fn last_failure(&self) -> Option<Error> {
        self.lock().1.clone()
    }
}

/// Start the background flusher: after a write, wait `flush_delay`, then
/// run a pass (and again after a failed one, unless the lease is lost). A
/// sequential stream that fills a whole 4 MiB window cuts the wait short:
/// the pass sends the whole windows behind the stream's head (which it
/// holds back as ever), so a long write keeps Put Pages going while it is
/// written instead of one pass per delay. A writer waiting for room asks
/// for a drain: a full pass at once, without the delay. It stops when
/// `close` signals `stop` (the drive awaits it).
pub(super) fn spawn_background(inner: &Arc<Inner>) -> JoinHandle<()> {
    let me = inner.clone();
    tokio::spawn(async move {
        loop {
            if !me.drain_wanted.load(Ordering::Acquire) {
                tokio::select! {
                    _ = me.kick.notified() => {}
                    _ = me.drain.notified() => {}
                    _ = me.stop.notified() => return,
                }
            }
            if !me.drain_wanted.load(Ordering::Acquire) {
                tokio::select! {
                    _ = tokio::time::sleep(me.flush_delay) => {}
                    _ = me.window_full.notified() => {}
                    _ = me.drain.notified() => {}
                    _ = me.stop.notified() => return,
                }
            }
            if me.stopping.load(Ordering::Acquire) {
                return;
            }
            let pass = if me.drain_wanted.swap(false, Ordering::AcqRel) {
                me.drain_pass().await
            } else {
                me.background_pass().await
            };
            match pass {
                Ok(false) => {}
                Ok(true) => me.kick.notify_one(),
                // Logged at error level already; retrying cannot help.
                Err(super::Error::LeaseLost { .. }) => {}
                Err(e) => {
                    // Data stays dirty; try again after another delay.
                    tracing::warn!(target = %me.target, error = %e, "background flush failed; will retry");
                    me.kick.notify_one();
                }
            }
        }
    })
}

impl Inner {
    /// Ask the background flusher for a full pass now (writers waiting for
    /// room).
    pub(crate) fn request_drain(&self) {
        self.drain_wanted.store(true, Ordering::Release);
        self.drain.notify_one();
    }

    /// A full pass for writers waiting for room: nothing held back.
    async fn drain_pass(&self) -> Result<bool> {
        let _g = self.flush_lock.lock().await;
        self.run_pass(None, true).await.map(|_| false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Class::{Data as D, ZeroHeld as H, ZeroNone as N};

    #[test]
    fn only_short_zero_stretches_between_data_are_absorbed() {
        let mut c = vec![N, D, N, H, D, N];
        absorb_zero_islands(&mut c);
        assert_eq!(c, vec![N, D, D, D, D, N], "edges stay, the middle joins");
        let mut long = vec![D];
        long.extend(std::iter::repeat_n(H, ZERO_ISLAND_PAGES + 1));
        long.push(D);
        let before = long.clone();
        absorb_zero_islands(&mut long);
        assert_eq!(long, before, "a long zero stretch is cleared, not written");
    }

    #[test]
    fn only_stretches_of_whole_put_pages_are_copied_by_a_look() {
        let m = MAX_UPDATE_PAGES;
        // Scattered 8-page writes, a stretch of 2.5 Put Pages, one of
        // exactly one, one a page short.
        let mut pages: Vec<u64> = (0..100).flat_map(|i| i * 64..i * 64 + 8).collect();
        let a = 10 * m;
        pages.extend(a..a + 2 * m + m / 2);
        let b = 20 * m + 3;
        pages.extend(b..b + m);
        let c = 30 * m;
        pages.extend(c..c + m - 1);
        assert_eq!(
            whole_stretches(pages),
            vec![PageRange::new(a, a + 2 * m), PageRange::new(b, b + m)],
            "whole Put Pages from each stretch's start; short ones are not copied"
        );
        assert!(whole_stretches(Vec::new()).is_empty());
    }
}
