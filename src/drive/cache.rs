//! The page cache's chunk table: which chunks are in memory, LRU order,
//! pinning, and the drive-wide dirty index.
//!
//! Invariants: at most `max_chunks` chunks are in memory, so cache memory never
//! exceeds the configured bound; a chunk is evicted only when it is clean and
//! unpinned (no [`ChunkRef`] outside the table). A caller obtains all the chunks
//! it needs for one step at once, so no one holds some chunks while waiting for
//! room for more (no deadlock). Lock order: a chunk's mutex before the dirty
//! index; the table's mutex only ever `try_lock`s a chunk.

use std::collections::BTreeSet;
use std::ops::Deref;
use std::sync::{Arc, Mutex, MutexGuard};

use lru::LruCache;
use tokio::sync::Notify;

use super::chunk::{BufferPool, Chunk, DirtyDelta, CHUNK_BYTES};

type Cell = Mutex<Chunk>;

/// A pinned chunk: while it lives the chunk stays in memory.
pub(crate) struct ChunkRef {
    /// Chunk number (byte offset / CHUNK_BYTES).
    pub index: u64,
    cell: Option<Arc<Cell>>,
    unpinned: Arc<Notify>,
}

impl ChunkRef {
    /// Lock the chunk (never held across an await).
    pub fn lock(&self) -> MutexGuard<'_, Chunk> {
        self.deref()
            .lock()
            .expect("chunk mutex poisoned: a panic happened while a chunk was locked")
    }
}

impl Deref for ChunkRef {
    type Target = Cell;
    fn deref(&self) -> &Cell {
        self.cell.as_ref().expect("cell is present until drop")
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
}

/// The chunk table.
pub(crate) struct Cache {
    table: Mutex<LruCache<u64, Arc<Cell>>>,
    max_chunks: usize,
    buffers: Arc<BufferPool>,
    dirty: Mutex<DirtyIndex>,
    /// Signalled whenever a pin is dropped.
    pub unpinned: Arc<Notify>,
    /// Signalled whenever a fetch ends (pages filled or marks cleared).
    pub filled: Arc<Notify>,
}

impl Cache {
    /// A cache of at most `max_chunks` chunks.
    pub fn new(max_chunks: usize) -> Self {
        Cache {
            table: Mutex::new(LruCache::unbounded()),
            max_chunks,
            buffers: BufferPool::new(max_chunks),
            dirty: Mutex::new(DirtyIndex::default()),
            unpinned: Arc::new(Notify::new()),
            filled: Arc::new(Notify::new()),
        }
    }

    fn table(&self) -> MutexGuard<'_, LruCache<u64, Arc<Cell>>> {
        self.table.lock().expect("cache table mutex poisoned")
    }

    fn dirty(&self) -> MutexGuard<'_, DirtyIndex> {
        self.dirty.lock().expect("dirty index mutex poisoned")
    }

    /// Most chunks one caller may pin at once.
    pub fn max_pins(&self) -> usize {
        (self.max_chunks / 4).max(1)
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

    /// Pin every chunk of `indices`, allocating the missing ones and evicting
    /// clean unpinned chunks to make room. `None` when there is no room now
    /// (then nothing was changed).
    pub fn try_pin_all(&self, indices: &[u64]) -> Option<Vec<ChunkRef>> {
        let mut table = self.table();
        let missing = indices.iter().filter(|i| !table.contains(i)).count();
        let free = self.max_chunks.saturating_sub(table.len());
        if missing > free {
            let need = missing - free;
            let victims: Vec<u64> = table
                .iter()
                .rev()
                .filter(|(i, cell)| {
                    !indices.contains(i)
                        && Arc::strong_count(cell) == 1
                        && cell
                            .try_lock()
                            .map(|c| c.dirty_pages() == 0)
                            .unwrap_or(false)
                })
                .map(|(i, _)| *i)
                .take(need)
                .collect();
            if victims.len() < need {
                return None;
            }
            for v in victims {
                table.pop(&v);
            }
        }
        let refs = indices
            .iter()
            .map(|&i| {
                let cell =
                    table.get_or_insert(i, || Arc::new(Mutex::new(Chunk::new(&self.buffers))));
                self.pin(i, cell)
            })
            .collect();
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

    /// Memory pinned by chunks that hold dirty pages.
    pub fn dirty_chunk_bytes(&self) -> u64 {
        self.dirty().chunks.len() as u64 * CHUNK_BYTES
    }

    /// Memory held by the cache.
    pub fn cache_bytes(&self) -> u64 {
        self.table().len() as u64 * CHUNK_BYTES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_takes_only_clean_unpinned_chunks_in_lru_order() {
        let cache = Cache::new(3);
        let pins = cache.try_pin_all(&[0, 1, 2]).expect("room for three");
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
        let p3 = cache.try_pin_all(&[3]).expect("chunk 0 is evictable");
        assert!(!cache.contains(0) && cache.contains(1) && cache.contains(2));
        // Now nothing is evictable: 1 dirty, 2 and 3 pinned.
        assert!(cache.try_pin_all(&[4]).is_none());
        assert_eq!(cache.cache_bytes(), 3 * CHUNK_BYTES);
        drop(keep2);
        drop(p3);
        let p = cache.try_pin_all(&[4, 5]).expect("2 and 3 are clean now");
        assert_eq!(p.len(), 2);
        assert!(cache.contains(1), "the dirty chunk is never evicted");
    }

    #[test]
    fn a_page_rewritten_after_its_copy_does_not_settle() {
        let cache = Cache::new(1);
        let pins = cache.try_pin_all(&[0]).unwrap();
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
        assert!(cache.dirty_chunks().is_empty());
    }
}
