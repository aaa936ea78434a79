//! Flushing: dirty pages become Put Page (update) and Clear Pages requests.
//!
//! A pass walks the dirty chunks in order and cuts their dirty pages into
//! runs: an all-zero page that may hold data joins a clear run; an all-zero
//! page that holds none is skipped (counted as elided) and made clean at once;
//! any other page joins an update run of at most 4 MiB. Runs span chunk
//! boundaries and go out in parallel (bounded). Invariants: every request
//! carries the lease id; one pass at a time (so a page is never in two
//! uploads at once); a page written again while its run is in flight keeps
//! its dirty bit (its generation moved); the sparse map gains pages before an
//! update is sent and loses them only after a clear succeeded.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use tokio::task::JoinHandle;

use super::cache::ChunkRef;
use super::chunk::{PageBits, CHUNK_PAGES};
use super::counters::add;
use super::error::Result;
use super::extents::PageRange;
use super::Inner;
use crate::units::{MAX_PUT_PAGE_BYTES, PAGE_SIZE};

const MAX_UPDATE_PAGES: u64 = MAX_PUT_PAGE_BYTES / PAGE_SIZE;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Update,
    Clear,
}

/// Consecutive dirty pages that go out in one request.
struct Run {
    kind: Kind,
    pages: PageRange,
    /// Page contents, for updates.
    data: Vec<u8>,
    /// Generation of each page when it was copied.
    gens: Vec<u32>,
    /// The chunks the run covers, in order (pinned until it settles).
    chunks: Vec<ChunkRef>,
}

/// Cuts the dirty pages of the given chunks into runs, lazily, so that at
/// most `flush_parallelism` runs' data is copied at any time.
struct RunBuilder<'a> {
    inner: &'a Inner,
    chunks: VecDeque<ChunkRef>,
    /// Next page slot to look at in the front chunk.
    slot: usize,
    /// Which pages of the front chunk may hold data.
    has_data: Option<PageBits>,
    current: Option<Run>,
}

impl<'a> RunBuilder<'a> {
    fn new(inner: &'a Inner, chunks: VecDeque<ChunkRef>) -> Self {
        RunBuilder {
            inner,
            chunks,
            slot: 0,
            has_data: None,
            current: None,
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
}

impl Iterator for RunBuilder<'_> {
    type Item = Run;

    fn next(&mut self) -> Option<Run> {
        loop {
            let Some(front) = self.chunks.front().cloned() else {
                return self.current.take();
            };
            let first_page = front.index * CHUNK_PAGES as u64;
            let has_data = match self.has_data {
                Some(b) => b,
                None => *self.has_data.insert(self.data_map(first_page)),
            };
            let mut c = front.lock();
            while self.slot < CHUNK_PAGES {
                let slot = self.slot;
                if !c.is_dirty(slot) {
                    self.slot += 1;
                    continue;
                }
                let page = first_page + slot as u64;
                let zero = c.page(slot).iter().all(|&b| b == 0);
                let kind = match (zero, has_data.get(slot)) {
                    (false, _) => Kind::Update,
                    (true, true) => Kind::Clear,
                    (true, false) => {
                        // Already zero in the blob: nothing to send.
                        let gen = c.generation(slot);
                        let delta = c.settle(slot, gen);
                        self.inner.cache.note(front.index, delta);
                        add(&self.inner.meters.pages_elided, 1);
                        self.slot += 1;
                        continue;
                    }
                };
                if let Some(run) = &mut self.current {
                    let fits = run.kind == kind
                        && run.pages.end == page
                        && (kind == Kind::Clear || run.pages.len_pages() < MAX_UPDATE_PAGES);
                    if !fits {
                        // Emit the finished run; this page starts the next one.
                        return self.current.take();
                    }
                } else {
                    self.current = Some(Run {
                        kind,
                        pages: PageRange::new(page, page),
                        data: Vec::new(),
                        gens: Vec::new(),
                        chunks: Vec::new(),
                    });
                }
                let run = self.current.as_mut().expect("a run was just ensured");
                run.pages.end += 1;
                run.gens.push(c.generation(slot));
                if kind == Kind::Update {
                    run.data.extend_from_slice(c.page(slot));
                }
                if run.chunks.last().map(|r| r.index) != Some(front.index) {
                    run.chunks.push(front.clone());
                }
                self.slot += 1;
            }
            drop(c);
            self.chunks.pop_front();
            self.slot = 0;
            self.has_data = None;
        }
    }
}

impl Inner {
    /// One flush pass (waits for a running one to end first).
    pub(crate) async fn flush_pass(&self) -> Result<()> {
        let _g = self.flush_lock.lock().await;
        self.flush_pass_locked().await
    }

    /// One flush pass; the caller holds `flush_lock`.
    pub(crate) async fn flush_pass_locked(&self) -> Result<()> {
        let dirty = self.cache.dirty_chunks();
        if dirty.is_empty() {
            return Ok(());
        }
        self.lease.check()?;
        let refs: VecDeque<ChunkRef> = dirty.iter().filter_map(|&i| self.cache.get(i)).collect();
        let mut sends = futures::stream::iter(RunBuilder::new(self, refs))
            .map(|run| self.send_run(run))
            .buffer_unordered(self.flush_parallelism);
        let mut first_err = None;
        while let Some(r) = sends.next().await {
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
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
                    .write_pages(pages.bytes().start, Bytes::from(data), lease)
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
        // Settle: pages not written again since they were copied are clean.
        for r in &chunks {
            let first = r.index * CHUNK_PAGES as u64;
            let from = pages.start.max(first);
            let to = pages.end.min(first + CHUNK_PAGES as u64);
            let mut c = r.lock();
            for page in from..to {
                let delta = c.settle((page - first) as usize, gens[(page - pages.start) as usize]);
                self.cache.note(r.index, delta);
            }
        }
        Ok(())
    }
}

/// Start the background flusher: after a write, wait `flush_delay`, then
/// run a pass (and again after a failed one, unless the lease is lost). It stops when `close` signals `stop` (the drive awaits it).
pub(super) fn spawn_background(inner: &Arc<Inner>) -> JoinHandle<()> {
    let me = inner.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = me.kick.notified() => {}
                _ = me.stop.notified() => return,
            }
            tokio::select! {
                _ = tokio::time::sleep(me.flush_delay) => {}
                _ = me.stop.notified() => return,
            }
            if me.stopping.load(Ordering::Acquire) {
                return;
            }
            match me.flush_pass().await {
                Ok(()) => {}
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
