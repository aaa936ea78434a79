//! The page cache's chunk table: which chunks are in memory, LRU order,
//! pinning, the memory bound, and the drive-wide dirty index.
//!
//! Memory is counted in the chunks' 4 KiB blocks plus a fixed cost per chunk
//! (`chunk.rs` says why). Pinning reserves the blocks an operation will
//! touch before anything is allocated: `try_pin_all` is told the pages the
//! caller works on, counts the blocks missing there (from each chunk's
//! allocation mask, readable without its lock), evicts clean unpinned chunks
//! until they fit, and allocates them. So the bound holds with any number of
//! operations at once, and a chunk that holds a few scattered pages costs a
//! few blocks, not 256 KiB.
//!
//! Invariants: the blocks in use plus the blocks reserved plus the chunks'
//! fixed cost never exceed the bound (but for the zero pages of a failed
//! clear, allocated without a reservation); a chunk is evicted only when it
//! is clean and unpinned (no [`ChunkRef`] outside the table). A caller
//! obtains all the chunks it needs for one step at once, so no one holds
//! some chunks while waiting for room for more (no deadlock). Lock order: a
//! chunk's mutex before the dirty index; the table's mutex only ever
//! `try_lock`s a chunk.

use std::collections::BTreeSet;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use lru::LruCache;
use tokio::sync::Notify;

use super::chunk::{
    block_mask, BlockPool, Chunk, DirtyDelta, BLOCK_BYTES, CHUNK_BYTES, CHUNK_OVERHEAD_BYTES,
};
use super::extents::PageRange;

/// A chunk and a copy of its allocation mask that the table reads without
/// taking the chunk's lock (updated whenever the lock is released; a stale
/// copy only ever shows fewer blocks, so estimates from it err on the safe
/// side).
pub(crate) struct Cell {
    alloc: AtomicU64,
    chunk: Mutex<Chunk>,
}

impl Cell {
    fn new(chunk: Chunk) -> Self {
        Cell {
            alloc: AtomicU64::new(chunk.allocated()),
            chunk: Mutex::new(chunk),
        }
    }

    fn lock(&self) -> ChunkGuard<'_> {
        ChunkGuard {
            guard: self
                .chunk
                .lock()
                .expect("chunk mutex poisoned: a panic happened while a chunk was locked"),
            alloc: &self.alloc,
        }
    }

    /// Bytes the chunk costs now, as the bound counts them.
    fn bytes(&self) -> u64 {
        CHUNK_OVERHEAD_BYTES + self.alloc.load(Ordering::Acquire).count_ones() as u64 * BLOCK_BYTES
    }
}

/// A locked chunk. Releasing it publishes the chunk's allocation mask.
pub(crate) struct ChunkGuard<'a> {
    guard: MutexGuard<'a, Chunk>,
    alloc: &'a AtomicU64,
}

impl Deref for ChunkGuard<'_> {
    type Target = Chunk;
    fn deref(&self) -> &Chunk {
        &self.guard
    }
}

impl DerefMut for ChunkGuard<'_> {
    fn deref_mut(&mut self) -> &mut Chunk {
        &mut self.guard
    }
}

impl Drop for ChunkGuard<'_> {
    fn drop(&mut self) {
        self.alloc.store(self.guard.allocated(), Ordering::Release);
    }
}

/// A pinned chunk: while it lives the chunk stays in memory.
pub(crate) struct ChunkRef {
    /// Chunk number (byte offset / CHUNK_BYTES).
    pub index: u64,
    cell: Option<Arc<Cell>>,
    unpinned: Arc<Notify>,
}

impl ChunkRef {
    /// Lock the chunk (never held across an await).
    pub fn lock(&self) -> ChunkGuard<'_> {
        self.cell
            .as_ref()
            .expect("cell is present until drop")
            .lock()
    }
}

impl Clone for ChunkRef {
    fn clone(&self) -> Self {
        ChunkRef {
            index: self.index,
            cell: self.cell.clone(),
            unpinned: self.unpinned.clone(),
        }
    }
}

impl Drop for ChunkRef {
    fn drop(&mut self) {
        drop(self.cell.take());
        self.unpinned.notify_waiters();
    }
}

#[derive(Default)]
struct DirtyIndex {
    chunks: BTreeSet<u64>,
    pages: u64,
    blocks: u64,
}

/// The chunk table.
pub(crate) struct Cache {
    table: Mutex<LruCache<u64, Arc<Cell>>>,
    /// The memory bound, in bytes.
    max_bytes: u64,
    blocks: Arc<BlockPool>,
    /// Blocks reserved by pins whose blocks are not allocated yet.
    reserved: AtomicU64,
    dirty: Mutex<DirtyIndex>,
    /// Signalled whenever a pin is dropped.
    pub unpinned: Arc<Notify>,
    /// Signalled whenever a fetch ends (pages filled or marks cleared).
    pub filled: Arc<Notify>,
    /// Signalled after dirty pages became clean (once per settled run or
    /// discard, not per page), for writers waiting for room.
    pub cleaned: Notify,
}

impl Cache {
    /// A cache of at most `max_bytes` of memory (at least one chunk's worth).
    pub fn new(max_bytes: u64) -> Self {
        let max_bytes = max_bytes.max(CHUNK_BYTES + CHUNK_OVERHEAD_BYTES);
        Cache {
            table: Mutex::new(LruCache::unbounded()),
            max_bytes,
            blocks: BlockPool::new((max_bytes / BLOCK_BYTES) as usize),
            reserved: AtomicU64::new(0),
            dirty: Mutex::new(DirtyIndex::default()),
            unpinned: Arc::new(Notify::new()),
            filled: Arc::new(Notify::new()),
            cleaned: Notify::new(),
        }
    }

    fn table(&self) -> MutexGuard<'_, LruCache<u64, Arc<Cell>>> {
        self.table.lock().expect("cache table mutex poisoned")
    }

    fn dirty(&self) -> MutexGuard<'_, DirtyIndex> {
        self.dirty.lock().expect("dirty index mutex poisoned")
    }

    /// Most chunks one caller may pin at once: a quarter of the memory in
    /// whole chunks.
    pub fn max_pins(&self) -> usize {
        ((self.max_bytes / (CHUNK_BYTES + CHUNK_OVERHEAD_BYTES)) / 4).max(1) as usize
    }

    fn pin(&self, index: u64, cell: &Arc<Cell>) -> ChunkRef {
        ChunkRef {
            index,
            cell: Some(cell.clone()),
            unpinned: self.unpinned.clone(),
        }
    }

    /// The chunk if it is in memory (does not touch the LRU order).
    pub fn get(&self, index: u64) -> Option<ChunkRef> {
        let table = self.table();
        table.peek(&index).map(|c| self.pin(index, c))
    }

    /// True when the chunk is in memory.
    pub fn contains(&self, index: u64) -> bool {
        self.table().contains(&index)
    }

    /// The chunks in memory among `range`, in no particular order.
    pub fn present_in(&self, range: std::ops::Range<u64>) -> Vec<u64> {
        let table = self.table();
        if (range.end - range.start) as usize <= table.len() {
            range.filter(|i| table.contains(i)).collect()
        } else {
            table
                .iter()
                .map(|(i, _)| *i)
                .filter(|i| range.contains(i))
                .collect()
        }
    }

    /// Memory counted against the bound: blocks in use and reserved, and
    /// the chunks' fixed cost (`chunks` of them).
    fn used(&self, chunks: usize) -> u64 {
        (self.blocks.in_use() + self.reserved.load(Ordering::Acquire)) * BLOCK_BYTES
            + chunks as u64 * CHUNK_OVERHEAD_BYTES
    }

    /// Pin every chunk of `indices` with blocks for the pages of `pages`
    /// (the pages the caller will read, fill or write), allocating missing
    /// chunks and blocks and evicting clean unpinned chunks to make room.
    /// `None` when there is no room now (then nothing was changed).
    pub fn try_pin_all(&self, indices: &[u64], pages: PageRange) -> Option<Vec<ChunkRef>> {
        let (refs, masks, reserved) = {
            let mut table = self.table();
            let mut masks = Vec::with_capacity(indices.len());
            let mut blocks = 0u64;
            let mut new_chunks = 0usize;
            for &i in indices {
                let want = block_mask(i, pages);
                let have = match table.peek(&i) {
                    Some(cell) => cell.alloc.load(Ordering::Acquire),
                    None => {
                        new_chunks += 1;
                        0
                    }
                };
                masks.push(want);
                blocks += (want & !have).count_ones() as u64;
            }
            let need = blocks * BLOCK_BYTES + new_chunks as u64 * CHUNK_OVERHEAD_BYTES;
            let used = self.used(table.len());
            if used + need > self.max_bytes {
                let mut short = used + need - self.max_bytes;
                let mut victims = Vec::new();
                for (i, cell) in table.iter().rev() {
                    if short == 0 {
                        break;
                    }
                    let evictable = !indices.contains(i)
                        && Arc::strong_count(cell) == 1
                        && cell
                            .chunk
                            .try_lock()
                            .map(|c| c.dirty_pages() == 0)
                            .unwrap_or(false);
                    if evictable {
                        short = short.saturating_sub(cell.bytes());
                        victims.push(*i);
                    }
                }
                if short > 0 {
                    return None;
                }
                for v in victims {
                    // The chunk (the table held its only reference) goes
                    // now, and its blocks back to the pool.
                    table.pop(&v);
                }
            }
            self.reserved.fetch_add(blocks, Ordering::AcqRel);
            let refs: Vec<ChunkRef> = indices
                .iter()
                .map(|&i| {
                    let cell =
                        table.get_or_insert(i, || Arc::new(Cell::new(Chunk::new(&self.blocks))));
                    self.pin(i, cell)
                })
                .collect();
            (refs, masks, blocks)
        };
        // Allocation takes the chunks' locks, so it happens outside the
        // table's. The reservation is released only after the blocks are
        // counted as in use; a block someone else allocated meanwhile was
        // reserved twice, and that spare goes back too.
        for (r, mask) in refs.iter().zip(masks) {
            r.lock().allocate(mask);
        }
        self.reserved.fetch_sub(reserved, Ordering::AcqRel);
        Some(refs)
    }

    /// Apply a chunk's dirtiness change to the index. Call while holding the
    /// chunk's lock, so the index never disagrees with the chunks.
    pub fn note(&self, index: u64, delta: DirtyDelta) {
        if delta == DirtyDelta::default() {
            return;
        }
        let mut d = self.dirty();
        d.pages = d.pages.wrapping_add_signed(delta.pages);
        d.blocks = d.blocks.wrapping_add_signed(delta.blocks);
        if delta.chunk > 0 {
            d.chunks.insert(index);
        } else if delta.chunk < 0 {
            d.chunks.remove(&index);
        }
    }

    /// The chunks holding dirty pages, in order.
    pub fn dirty_chunks(&self) -> Vec<u64> {
        self.dirty().chunks.iter().copied().collect()
    }

    /// Bytes of dirty pages.
    pub fn dirty_bytes(&self) -> u64 {
        self.dirty().pages * crate::units::PAGE_SIZE
    }

    /// Memory dirty data holds: the blocks holding dirty pages and the
    /// fixed cost of their chunks. This is what the dirty budget counts.
    pub fn dirty_memory(&self) -> u64 {
        let d = self.dirty();
        d.blocks * BLOCK_BYTES + d.chunks.len() as u64 * CHUNK_OVERHEAD_BYTES
    }

    /// Memory held by the cache.
    pub fn cache_bytes(&self) -> u64 {
        let chunks = self.table().len();
        self.used(chunks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drive::chunk::chunk_pages;

    const WHOLE: u64 = CHUNK_BYTES + CHUNK_OVERHEAD_BYTES;

    /// All pages of chunks `indices`.
    fn all(indices: &[u64]) -> PageRange {
        let first = indices.iter().min().copied().unwrap_or(0);
        let last = indices.iter().max().copied().unwrap_or(0);
        PageRange::new(chunk_pages(first).start, chunk_pages(last).end)
    }

    fn pin(cache: &Cache, indices: &[u64]) -> Option<Vec<ChunkRef>> {
        cache.try_pin_all(indices, all(indices))
    }

    #[test]
    fn eviction_takes_only_clean_unpinned_chunks_in_lru_order() {
        let cache = Cache::new(3 * WHOLE);
        let pins = pin(&cache, &[0, 1, 2]).expect("room for three");
        // Chunk 1 becomes dirty; chunk 2 stays pinned.
        {
            let mut c = pins[1].lock();
            let delta = c.write(0, &[1u8; 512]);
            cache.note(1, delta);
        }
        let keep2 = pins[2].clone();
        drop(pins);
        assert_eq!(cache.dirty_chunks(), vec![1]);
        // Only chunk 0 can go: it is clean and unpinned.
        let p3 = pin(&cache, &[3]).expect("chunk 0 is evictable");
        assert!(!cache.contains(0) && cache.contains(1) && cache.contains(2));
        // Now nothing is evictable: 1 dirty, 2 and 3 pinned.
        assert!(pin(&cache, &[4]).is_none());
        assert_eq!(cache.cache_bytes(), 3 * WHOLE);
        drop(keep2);
        drop(p3);
        let p = pin(&cache, &[4, 5]).expect("2 and 3 are clean now");
        assert_eq!(p.len(), 2);
        assert!(cache.contains(1), "the dirty chunk is never evicted");
    }

    #[test]
    fn scattered_pages_cost_blocks_not_chunks() {
        // Room for two whole chunks: 64 chunks with one 4 KiB block each fit.
        let cache = Cache::new(2 * WHOLE);
        let mut pins = Vec::new();
        for i in 0..64u64 {
            let page = chunk_pages(i).start + 8;
            let r = cache
                .try_pin_all(&[i], PageRange::new(page, page + 8))
                .expect("a block fits");
            {
                let mut c = r[0].lock();
                let d = c.write(8 * 512, &[i as u8; 4096]);
                cache.note(i, d);
            }
            pins.push(r);
        }
        assert_eq!(cache.dirty_bytes(), 64 * 4096);
        assert_eq!(
            cache.dirty_memory(),
            64 * (BLOCK_BYTES + CHUNK_OVERHEAD_BYTES)
        );
        assert!(cache.cache_bytes() <= 2 * WHOLE);
        // A whole chunk does not fit any more, and none can be evicted.
        assert!(pin(&cache, &[100]).is_none());
        // The blocks are counted once, however often they are pinned.
        let again = cache.try_pin_all(
            &[3],
            PageRange::new(chunk_pages(3).start + 8, chunk_pages(3).start + 16),
        );
        assert!(again.is_some());
        assert_eq!(
            cache.cache_bytes(),
            64 * (BLOCK_BYTES + CHUNK_OVERHEAD_BYTES)
        );
    }

    #[test]
    fn a_page_rewritten_after_its_copy_does_not_settle() {
        let cache = Cache::new(WHOLE);
        let pins = pin(&cache, &[0]).unwrap();
        let mut c = pins[0].lock();
        // Partly covered pages are filled first (here: never-written zeros).
        c.fill(0, None);
        c.fill(2, None);
        cache.note(0, c.write(100, &[1u8; 1000]));
        let gen = c.generation(0);
        cache.note(0, c.write(0, &[2u8; 10]));
        cache.note(0, c.settle(0, gen));
        assert!(c.is_dirty(0), "written again: stays dirty");
        for page in [1, 2] {
            let g = c.generation(page);
            cache.note(0, c.settle(page, g));
        }
        assert_eq!(c.dirty_pages(), 1);
        assert_eq!(cache.dirty_bytes(), 512);
        let g = c.generation(0);
        cache.note(0, c.settle(0, g));
        assert_eq!(cache.dirty_bytes(), 0);
        assert_eq!(cache.dirty_memory(), 0);
        assert!(cache.dirty_chunks().is_empty());
    }
}
