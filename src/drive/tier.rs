//! The drive's use of its disk tier (`disk_cache`): opening it for the blob,
//! looking chunks up before the blob is asked, keeping clean chunks after a
//! fill from the blob or a flush, dropping chunks that are written, and the
//! closing record.
//!
//! Policy: written pages are *invalidated* on write (the chunk's file is
//! forgotten at once) and reach the disk tier again only once they are
//! durable: after the flush that settles them, the chunk's clean pages are
//! copied down. A copy holds only pages that are valid, clean and not being
//! fetched, taken under the chunk's lock with a ticket, so a copy older than
//! the chunk's last write is never installed. Only pages the sparse map says
//! hold data are ever filled from disk. Cache trouble never fails the drive:
//! it is logged and the tier is off (or the chunk a miss).
//!
//! An encrypted drive's tier holds ciphertext: pages are sealed by the
//! store (`PageStore::seal_pages`: XTS with the data key, as in the blob)
//! on the way down and opened on the way up, and all-zero pages are kept as
//! ciphertext too, so a stolen cache directory shows no more than the blob
//! does to the account holder.

use std::collections::HashMap;
use std::sync::Arc;

use super::cache::ChunkRef;
use super::chunk::{Chunk, CHUNK_PAGES};
use super::counters::add;
use super::disk_cache::{Access, CachedChunk, ChunkBits, DiskCache, DiskCacheOptions};
use super::extents::PageRange;
use super::store::PageStore;
use super::{Inner, Mode};

const _: () = assert!(CHUNK_PAGES == super::disk_cache::PAGES);

/// Dropped copies kept for close at most (16 MiB); chunks past that are
/// remembered by index and copied again at close if still in memory.
const MAX_SKIPPED_COPIES: usize = 64;
/// Chunks remembered by index at most; more are left to be fetched again.
const MAX_SKIPPED_INDICES: usize = 4096;

/// Copies down to the tier that found its writer's queue full.
#[derive(Default)]
pub(super) struct Skipped {
    /// Kept whole: (chunk, ticket, copy). The ticket still guards them: a
    /// chunk written since is not installed.
    copies: Vec<(u64, u64, Box<CachedChunk>)>,
    /// Only the chunk's index.
    indices: Vec<u64>,
}

/// Open the disk tier of the blob in `store`, trusted only if it was
/// recorded at `etag`: the ETag of the state the open read its footer and
/// map from (after the lease, for a writer; pinned, for a reader). Never
/// an ETag read later: a tier recorded at a newer state than the open's
/// would serve that state's pages under this open's map. `encrypted`: the
/// blob's metadata says it is encrypted (see [`tier_identity`]).
pub(super) async fn open(
    store: &dyn PageStore,
    opts: &DiskCacheOptions,
    mode: Mode,
    target: &str,
    etag: Option<&str>,
    encrypted: bool,
) -> Option<Arc<DiskCache>> {
    let identity = tier_identity(store, encrypted)?;
    let etag = etag.map(str::to_string);
    let access = match mode {
        Mode::ReadWrite => Access::Writer,
        Mode::ReadOnly | Mode::Snapshot => Access::Reader,
    };
    let opts = opts.clone();
    let opened = tokio::task::spawn_blocking(move || {
        DiskCache::open(&opts, &identity, etag.as_deref(), access)
    })
    .await;
    match opened {
        Ok(Ok(Some(c))) => Some(Arc::new(c)),
        Ok(Ok(None)) => {
            tracing::info!(target = %target, "disk cache off: its directory is in use by another mount");
            None
        }
        Ok(Err(e)) => {
            tracing::warn!(target = %target, error = %e, "disk cache off: cannot open it");
            None
        }
        Err(e) => {
            tracing::warn!(target = %target, error = %e, "disk cache off: open task failed");
            None
        }
    }
}

/// The name the disk tier keeps `store`'s chunks under: the blob's identity
/// and, for a blob whose metadata says it is `encrypted`, the view of it. A
/// keyed (decrypting) view keeps every page sealed, holes too, so its
/// chunks are not the ciphertext view's of the same blob: they never share
/// a directory. Both views are named apart from a plain drive's name, so a
/// tier an older version kept under that one shared name is never trusted
/// by either.
pub(crate) fn tier_identity(store: &dyn PageStore, encrypted: bool) -> Option<String> {
    let blob = store.cache_identity()?;
    Some(
        match (encrypted || store.seals_pages(), store.seals_pages()) {
            (false, _) => blob,
            (true, true) => format!("{blob}\nkeyed view"),
            (true, false) => format!("{blob}\nciphertext view"),
        },
    )
}

/// A copy of the clean, valid pages of a chunk: which are held, which of
/// them are zeros (none when `zero_bits` is false: every held page is then
/// data) and the bytes of the others, packed in page order.
fn copy_clean(c: &Chunk, zero_bits: bool) -> (ChunkBits, ChunkBits, Vec<u8>) {
    let mut held = ChunkBits::default();
    let mut zero = ChunkBits::default();
    let mut data = Vec::new();
    for slot in 0..CHUNK_PAGES {
        if !c.is_valid(slot) || c.is_dirty(slot) || c.is_fetching(slot) {
            continue;
        }
        held.set(slot);
        let page = c.page(slot);
        if zero_bits && page.iter().all(|&b| b == 0) {
            zero.set(slot);
        } else {
            data.extend_from_slice(page);
        }
    }
    (held, zero, data)
}

/// The drive page numbers of the pages a disk chunk keeps bytes for
/// (held and not zero), in the order its data packs them.
fn packed_pages(index: u64, held: &ChunkBits, zero: &ChunkBits) -> Vec<u64> {
    (0..CHUNK_PAGES)
        .filter(|&slot| held.get(slot) && !zero.get(slot))
        .map(|slot| index * CHUNK_PAGES as u64 + slot as u64)
        .collect()
}

/// `chunk` (chunk `index` as read from disk) opened by `store`: its bytes
/// decrypted into plaintext when the store seals what it keeps locally.
fn opened(store: &dyn PageStore, index: u64, chunk: CachedChunk) -> CachedChunk {
    if !store.seals_pages() {
        return chunk;
    }
    let pages = packed_pages(index, &chunk.held, &chunk.zero);
    let mut data = chunk.data.to_vec();
    store.open_pages(&pages, &mut data);
    CachedChunk::new(chunk.held, chunk.zero, data)
}

/// Pages of `fetch` the disk chunks do not hold: what the blob must give,
/// cut into requests of at most `max_pages`.
pub(crate) fn not_on_disk(
    fetch: &[PageRange],
    disk: &HashMap<u64, CachedChunk>,
    max_pages: u64,
) -> Vec<PageRange> {
    let mut out: Vec<PageRange> = Vec::new();
    for f in fetch {
        for page in f.start..f.end {
            let idx = page / CHUNK_PAGES as u64;
            let slot = (page % CHUNK_PAGES as u64) as usize;
            if disk.get(&idx).is_some_and(|c| c.held.get(slot)) {
                continue;
            }
            match out.last_mut() {
                Some(r) if r.end == page && r.len_pages() < max_pages => r.end += 1,
                _ => out.push(PageRange::new(page, page + 1)),
            }
        }
    }
    out
}

impl Inner {
    /// The disk tier's chunks for the pages of `fetch` (empty when the tier
    /// is off or holds none of them).
    pub(crate) async fn disk_chunks(&self, fetch: &[PageRange]) -> HashMap<u64, CachedChunk> {
        let Some(disk) = &self.disk else {
            return HashMap::new();
        };
        let mut wanted: Vec<u64> = Vec::new();
        for f in fetch {
            let first = f.start / CHUNK_PAGES as u64;
            let last = (f.end - 1) / CHUNK_PAGES as u64;
            for idx in first..=last {
                if wanted.last() != Some(&idx) && disk.may_hold(idx) {
                    wanted.push(idx);
                }
            }
        }
        if wanted.is_empty() {
            return HashMap::new();
        }
        let disk = disk.clone();
        let store = self.store.clone();
        let found = tokio::task::spawn_blocking(move || {
            wanted
                .into_iter()
                .filter_map(|idx| disk.lookup(idx).map(|c| (idx, opened(&*store, idx, c))))
                .collect::<HashMap<_, _>>()
        })
        .await;
        found.unwrap_or_default()
    }

    /// Count a fill: `total` pages wanted from the blob's data, `from_blob`
    /// of them actually read from it.
    pub(crate) fn note_disk(&self, total: u64, from_blob: u64) {
        if self.disk.is_some() {
            add(&self.meters.disk_hits, total - from_blob);
            add(&self.meters.disk_misses, from_blob);
        }
    }

    /// Copies of the clean pages of `refs`, each with its ticket, sealed
    /// when the store seals what is kept locally (after the chunk's lock is
    /// let go: only the copy and the ticket need it).
    fn copies(&self, disk: &DiskCache, refs: &[ChunkRef]) -> Vec<(u64, u64, CachedChunk)> {
        let sealed = self.store.seals_pages();
        refs.iter()
            .filter_map(|r| {
                let c = r.lock();
                let (held, zero, mut data) = copy_clean(&c, !sealed);
                if held.count() == 0 {
                    return None;
                }
                let ticket = disk.ticket();
                drop(c);
                if sealed {
                    let pages = packed_pages(r.index, &held, &zero);
                    self.store.seal_pages(&pages, &mut data);
                }
                Some((r.index, ticket, CachedChunk::new(held, zero, data)))
            })
            .collect()
    }

    /// Copy the clean pages of `refs` down to the disk tier (never waits:
    /// a copy finding the queue full is dropped).
    pub(crate) fn persist(&self, refs: &[ChunkRef]) {
        let Some(disk) = &self.disk else { return };
        for (idx, ticket, copy) in self.copies(disk, refs) {
            if let Err(copy) = disk.store(idx, ticket, copy) {
                let mut skipped = self.disk_skipped.lock().expect("skipped mutex poisoned");
                if skipped.copies.len() < MAX_SKIPPED_COPIES {
                    skipped.copies.push((idx, ticket, copy));
                } else if skipped.indices.len() < MAX_SKIPPED_INDICES {
                    skipped.indices.push(idx);
                }
            }
        }
    }

    /// At close: send down, waiting for room, the copies after a flush that
    /// were dropped (the kept ones as they were, the others copied again if
    /// still in memory). Without it, a chunk ext4 wrote during a long read
    /// (an inode's atime), flushed while the read kept the writer's queue
    /// full and then evicted, was missing from the tier and fetched again
    /// at the next mount.
    pub(crate) async fn persist_skipped(&self) {
        let Some(disk) = &self.disk else { return };
        let Skipped {
            copies,
            mut indices,
        } = std::mem::take(&mut *self.disk_skipped.lock().expect("skipped mutex poisoned"));
        for (idx, ticket, copy) in copies {
            disk.store_wait(idx, ticket, *copy).await;
        }
        indices.sort_unstable();
        indices.dedup();
        let refs: Vec<ChunkRef> = indices.iter().filter_map(|&i| self.cache.get(i)).collect();
        self.persist_wait(refs).await;
    }

    /// Copy the clean pages of `refs` down to the disk tier, waiting for room.
    pub(crate) async fn persist_wait(&self, refs: Vec<ChunkRef>) {
        let Some(disk) = &self.disk else { return };
        let copies = self.copies(disk, &refs);
        drop(refs);
        for (idx, ticket, copy) in copies {
            disk.store_wait(idx, ticket, copy).await;
        }
    }

    /// Chunk `index` is being changed: call while holding its lock.
    pub(crate) fn disk_invalidate(&self, index: u64) {
        if let Some(disk) = &self.disk {
            disk.invalidate(index);
        }
    }

    /// Pages `pages` changed in the blob (cleared).
    pub(crate) fn disk_invalidate_pages(&self, pages: PageRange) {
        if let Some(disk) = &self.disk {
            let first = pages.start / CHUNK_PAGES as u64;
            let end = pages.end.div_ceil(CHUNK_PAGES as u64);
            disk.invalidate_range(first..end);
        }
    }

    /// End of the mount for the disk tier: write what is queued and, for a
    /// writer whose lease held to the end, record the blob's ETag after the
    /// last flush so the next open trusts the files. Call after the last
    /// flush and before the lease is released.
    pub(crate) async fn close_disk(&self) {
        let Some(disk) = self.disk.clone() else {
            return;
        };
        // Recorded clean only at a state read under this lineage's lease:
        // that read fails once someone broke the lease, even when this drive
        // never wrote again to notice (the local flag alone would record
        // the tier at a state holding the other writer's pages).
        let lease_id = self.lease.id().filter(|_| self.lease.check().is_ok());
        let etag = match (self.mode, lease_id) {
            (Mode::ReadWrite, Some(id)) => match self.store.state_under_lease(id).await {
                Ok(mark) => mark.etag,
                Err(e) => {
                    tracing::warn!(target = %self.target, error = %e, "disk cache not kept: the lease cannot be shown held at close");
                    None
                }
            },
            _ => None,
        };
        let target = self.target.clone();
        let done = tokio::task::spawn_blocking(move || disk.finish(etag.as_deref())).await;
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(target = %target, error = %e, "disk cache not kept"),
            Err(e) => tracing::warn!(target = %target, error = %e, "disk cache close task failed"),
        }
    }

    /// Disk space held by the tier and its bad chunks, for the counters.
    pub(crate) fn disk_gauges(&self) -> (u64, u64) {
        self.disk
            .as_ref()
            .map_or((0, 0), |d| (d.bytes_held(), d.bad_chunks()))
    }
}
