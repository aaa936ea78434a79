//! One chunk of the page cache: 512 consecutive pages (256 KiB of the drive)
//! with a valid bit, a dirty bit and a write generation per page, their
//! bytes held in 4 KiB blocks allocated only where the chunk holds pages.
//!
//! Why blocks: the chunk is the unit of the cache's table (LRU order,
//! pinning, the disk tier's files, the dirty index), and 256 KiB keeps that
//! table small and a sequential read to a few lookups per MiB. But memory in
//! whole chunks made scattered writes expensive: one 4 KiB write pinned
//! 256 KiB, so a 64 MiB dirty budget absorbed only 256 random writes (1 MiB
//! of data) before every further write waited for its own Put Page. With
//! memory in 4 KiB blocks (a filesystem block; the cache's memory grain), a
//! chunk holding one dirty 4 KiB write costs 4 KiB plus its bookkeeping,
//! and the dirty budget counts the blocks holding dirty pages: dirty data
//! counted as dirty data, at the granularity filesystems write in. A
//! 512-byte write still holds a whole block, so memory stays bounded by the
//! budget even then.
//!
//! Invariants: a valid page has a block; a dirty page is valid; while a
//! chunk is pinned a valid page never becomes invalid and a block is never
//! freed (blocks go back to the pool only when the whole chunk is evicted,
//! and only clean, unpinned chunks are evicted). Every write bumps the
//! page's generation, so the flusher clears a dirty bit only when the page
//! was not written again while its upload was in flight.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::extents::PageRange;
use crate::units::PAGE_SIZE;

/// Pages per chunk.
pub(crate) const CHUNK_PAGES: usize = 512;
/// Bytes per chunk.
pub(crate) const CHUNK_BYTES: u64 = CHUNK_PAGES as u64 * PAGE_SIZE;
/// Pages per block: the cache's memory grain.
pub(crate) const BLOCK_PAGES: usize = 8;
/// Bytes per block.
pub(crate) const BLOCK_BYTES: u64 = BLOCK_PAGES as u64 * PAGE_SIZE;
/// Blocks per chunk (one bit each in a `u64` mask).
pub(crate) const CHUNK_BLOCKS: usize = CHUNK_PAGES / BLOCK_PAGES;
/// Memory a chunk costs besides its blocks, as the cache counts it: the
/// chunk itself (bitmaps, block table) and its entry in the table.
pub(crate) const CHUNK_OVERHEAD_BYTES: u64 = 1024;
const PAGE: usize = PAGE_SIZE as usize;
const BLOCK: usize = BLOCK_BYTES as usize;

/// Chunk numbers touched by `[start, end)` bytes.
pub(crate) fn chunks_of(start: u64, end: u64) -> std::ops::Range<u64> {
    start / CHUNK_BYTES..end.div_ceil(CHUNK_BYTES)
}

/// The pages of chunk `index`, as a global page range.
pub(crate) fn chunk_pages(index: u64) -> PageRange {
    let first = index * CHUNK_PAGES as u64;
    PageRange::new(first, first + CHUNK_PAGES as u64)
}

/// The blocks of chunk `index` that hold pages of `pages`, as a mask.
pub(crate) fn block_mask(index: u64, pages: PageRange) -> u64 {
    let span = chunk_pages(index);
    let from = pages.start.max(span.start);
    let to = pages.end.min(span.end);
    if from >= to {
        return 0;
    }
    let first = ((from - span.start) as usize) / BLOCK_PAGES;
    let last = ((to - 1 - span.start) as usize) / BLOCK_PAGES;
    let width = last - first + 1;
    let ones = if width == 64 {
        u64::MAX
    } else {
        (1u64 << width) - 1
    };
    ones << first
}

const WORDS: usize = CHUNK_PAGES / 64;

/// One bit per page of a chunk.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PageBits([u64; WORDS]);

impl PageBits {
    pub fn get(&self, page: usize) -> bool {
        self.0[page / 64] & (1 << (page % 64)) != 0
    }
    pub fn set(&mut self, page: usize) {
        self.0[page / 64] |= 1 << (page % 64);
    }
    pub fn clear(&mut self, page: usize) {
        self.0[page / 64] &= !(1 << (page % 64));
    }
    /// True when any page of the block holding `page` has its bit set.
    fn any_in_block(&self, page: usize) -> bool {
        let shift = (page % 64) / BLOCK_PAGES * BLOCK_PAGES;
        (self.0[page / 64] >> shift) & 0xff != 0
    }
}

/// 4 KiB of page bytes with the pages' write generations.
struct Block {
    bytes: [u8; BLOCK],
    gens: [u32; BLOCK_PAGES],
}

/// A block owned by one chunk or by its pool's free list, carved from one
/// of the pool's slabs (see [`BlockPool`]); like a `Box`, the only handle
/// to its block.
struct BlockBox(NonNull<Block>);

// SAFETY: a `BlockBox` is the only handle to its block (it is created once
// per block when a slab is carved and moved, never copied, between the
// free list and chunks), so sending it to another thread moves the block's
// ownership like a `Box<Block>` would; `&BlockBox` gives only `&Block`,
// and `Block` is plain bytes.
unsafe impl Send for BlockBox {}
// SAFETY: as above: shared access gives `&Block` only.
unsafe impl Sync for BlockBox {}

impl std::ops::Deref for BlockBox {
    type Target = Block;
    fn deref(&self) -> &Block {
        // SAFETY: the pointer is into a live slab (slabs are unmapped only
        // when the pool drops, after every chunk holding its `Arc`), and
        // this handle is the block's only one.
        unsafe { self.0.as_ref() }
    }
}

impl std::ops::DerefMut for BlockBox {
    fn deref_mut(&mut self) -> &mut Block {
        // SAFETY: as in `deref`; `&mut self` is exclusive to the block.
        unsafe { self.0.as_mut() }
    }
}

/// Bytes of one slab of blocks.
const SLAB_BYTES: usize = 2 * 1024 * 1024;

/// One anonymous mapping that blocks are carved from.
struct Slab {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is only unmapped in `Drop`; the pool that owns it
// hands out its blocks one `BlockBox` each.
unsafe impl Send for Slab {}

impl Drop for Slab {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly one mapping made by `Slab::new`,
        // and no block of it is in use (the pool drops after its chunks).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

impl Slab {
    /// A zeroed mapping of `blocks` blocks, faulted in at once.
    fn new(blocks: usize) -> (Slab, Vec<BlockBox>) {
        let len = (blocks * std::mem::size_of::<Block>()).next_multiple_of(4096);
        // SAFETY: an anonymous private mapping at an address the kernel
        // chooses touches no existing memory.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            std::alloc::handle_alloc_error(
                std::alloc::Layout::from_size_align(len, 4096).expect("slab layout"),
            );
        }
        // Fault the whole slab in with one call rather than one trap per
        // 4 KiB page (best effort: older kernels refuse and the pages fault
        // in on first use). Not `MADV_HUGEPAGE`: with the kernel's default
        // `defrag` setting a huge-page fault may compact memory on the spot,
        // which cost more than it saved on a busy machine.
        // SAFETY: the range is the mapping just made.
        unsafe { libc::madvise(ptr, len, libc::MADV_POPULATE_WRITE) };
        let base = NonNull::new(ptr.cast::<Block>()).expect("mmap returned null");
        // Anonymous memory is zeros: every block starts valid as a `Block`
        // (all-zero bytes and generations).
        let boxes = (0..len / std::mem::size_of::<Block>())
            // SAFETY: `i` blocks past the start stay inside the mapping.
            .map(|i| BlockBox(unsafe { base.add(i) }))
            .collect();
        (
            Slab {
                ptr: base.cast(),
                len,
            },
            boxes,
        )
    }
}

/// Block memory kept for reuse, and the count of blocks in use, which is
/// the cache's memory. A dropped chunk gives its blocks back and a filling
/// chunk takes them, so a busy cache neither churns the allocator (churn
/// fragmented the heap: RSS 40-60 MiB above live data while writing 2 GiB
/// through a 256 MiB cache) nor touches fresh pages more than once.
/// Blocks are carved from 2 MiB slabs (anonymous mappings, faulted in with
/// one call each) rather than allocated one by one: in a
/// cold read through a new mount, the first `--cache-size` of blocks came
/// from malloc one at a time, each growing the thread's heap (`mprotect`)
/// and faulting in its pages, 14-22% of the daemon's CPU (`perf`:
/// `sysmalloc`, `exc_page_fault`, `clear_page_erms`). Slabs are kept until
/// the pool drops, so the pool holds at most the peak of blocks in use
/// (at least `max_free`'s worth once used), rounded up to a slab.
pub(crate) struct BlockPool {
    free: Mutex<(Vec<BlockBox>, Vec<Slab>)>,
    /// Blocks a new slab holds: 2 MiB's worth, or fewer for a small cache.
    slab_blocks: usize,
    /// Blocks held by chunks now.
    in_use: AtomicU64,
}

impl BlockPool {
    /// A pool for a cache of at most `max_free` blocks (slabs are sized to it).
    pub fn new(max_free: usize) -> Arc<Self> {
        Arc::new(BlockPool {
            free: Mutex::new((Vec::new(), Vec::new())),
            slab_blocks: max_free.clamp(1, SLAB_BYTES / std::mem::size_of::<Block>()),
            in_use: AtomicU64::new(0),
        })
    }

    /// Blocks held by chunks now.
    pub fn in_use(&self) -> u64 {
        self.in_use.load(Ordering::Acquire)
    }

    /// A block. Its bytes and generations are whatever the last user left
    /// (zeros when new): a chunk never shows a page before filling or
    /// writing it, and a generation is only ever compared with itself.
    fn take(&self) -> BlockBox {
        self.in_use.fetch_add(1, Ordering::AcqRel);
        let mut free = self.free.lock().expect("block pool mutex poisoned");
        let (list, slabs) = &mut *free;
        if let Some(b) = list.pop() {
            return b;
        }
        let (slab, mut boxes) = Slab::new(self.slab_blocks);
        slabs.push(slab);
        // Handed out from the start of the slab.
        boxes.reverse();
        let b = boxes.pop().expect("a slab holds a block");
        list.append(&mut boxes);
        b
    }

    fn give(&self, block: BlockBox) {
        self.in_use.fetch_sub(1, Ordering::AcqRel);
        let mut free = self.free.lock().expect("block pool mutex poisoned");
        free.0.push(block);
    }
}

/// 512 pages of cache with their state.
pub(crate) struct Chunk {
    blocks: [Option<BlockBox>; CHUNK_BLOCKS],
    /// Which blocks are allocated (bit per block).
    alloc: u64,
    pool: Arc<BlockPool>,
    valid: PageBits,
    dirty: PageBits,
    /// Pages a fetch is reading from the blob right now (others wait for it).
    fetching: PageBits,
    /// Zero pages that must stay allocated in the blob (written by
    /// [`Self::keep_allocated`], NBD's WRITE_ZEROES with NO_HOLE): the flush
    /// sends them as data instead of clearing or skipping them. Any other
    /// write or a discard of the page drops the mark.
    keep: PageBits,
    dirty_pages: usize,
}

/// What a state change did to a chunk's dirtiness, so the caller can keep the
/// drive-wide dirty index exact.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DirtyDelta {
    /// Pages that became dirty (positive) or clean (negative).
    pub pages: i64,
    /// Blocks that came to hold a dirty page (positive) or no longer do.
    pub blocks: i64,
    /// The chunk went from clean to dirty (+1) or dirty to clean (-1).
    pub chunk: i64,
}

impl Chunk {
    /// An empty chunk (nothing valid, no blocks) drawing blocks from `pool`.
    pub fn new(pool: &Arc<BlockPool>) -> Self {
        Chunk {
            blocks: std::array::from_fn(|_| None),
            alloc: 0,
            pool: pool.clone(),
            valid: PageBits::default(),
            dirty: PageBits::default(),
            fetching: PageBits::default(),
            keep: PageBits::default(),
            dirty_pages: 0,
        }
    }

    /// Which blocks are allocated (bit per block).
    pub fn allocated(&self) -> u64 {
        self.alloc
    }

    /// Allocate the blocks of `mask` that are missing; returns how many.
    pub fn allocate(&mut self, mask: u64) -> u64 {
        let mut missing = mask & !self.alloc;
        let n = missing.count_ones() as u64;
        while missing != 0 {
            let b = missing.trailing_zeros() as usize;
            self.blocks[b] = Some(self.pool.take());
            missing &= missing - 1;
        }
        self.alloc |= mask;
        n
    }

    fn block(&self, page: usize) -> &Block {
        self.blocks[page / BLOCK_PAGES]
            .as_deref()
            .expect("a valid page has a block")
    }

    fn block_mut(&mut self, page: usize) -> &mut Block {
        let b = page / BLOCK_PAGES;
        if self.blocks[b].is_none() {
            // Outside what the pin reserved (a failed clear's zero pages);
            // counted all the same.
            self.allocate(1 << b);
        }
        self.blocks[b].as_deref_mut().expect("just allocated")
    }

    pub fn is_valid(&self, page: usize) -> bool {
        self.valid.get(page)
    }

    pub fn is_dirty(&self, page: usize) -> bool {
        self.dirty.get(page)
    }

    /// True when the page must reach the blob as data even if all zeros.
    pub fn is_kept(&self, page: usize) -> bool {
        self.keep.get(page)
    }

    /// Marks the whole pages of `[at, at + len)` (bytes of the chunk) as
    /// zeros that stay allocated; call right after the [`Self::write`] of
    /// those zeros, under the same lock.
    pub fn keep_allocated(&mut self, at: usize, len: usize) {
        for page in at.div_ceil(PAGE)..(at + len) / PAGE {
            self.keep.set(page);
        }
    }

    pub fn is_fetching(&self, page: usize) -> bool {
        self.fetching.get(page)
    }

    /// Mark (or unmark) a page as being read from the blob by one fetch.
    pub fn set_fetching(&mut self, page: usize, on: bool) {
        if on {
            self.fetching.set(page)
        } else {
            self.fetching.clear(page)
        }
    }

    pub fn dirty_pages(&self) -> usize {
        self.dirty_pages
    }

    /// The write generation of a valid page.
    pub fn generation(&self, page: usize) -> u32 {
        self.block(page).gens[page % BLOCK_PAGES]
    }

    /// The bytes of one valid page.
    pub fn page(&self, page: usize) -> &[u8] {
        let at = (page % BLOCK_PAGES) * PAGE;
        &self.block(page).bytes[at..at + PAGE]
    }

    /// Append bytes `[from, to)` of the chunk to `out` (any alignment; the
    /// pages must be valid).
    pub fn copy_out(&self, from: usize, to: usize, out: &mut Vec<u8>) {
        let mut at = from;
        while at < to {
            let b = at / BLOCK;
            let end = to.min((b + 1) * BLOCK);
            let block = self.blocks[b].as_deref().expect("a valid page has a block");
            out.extend_from_slice(&block.bytes[at - b * BLOCK..end - b * BLOCK]);
            at = end;
        }
    }

    /// Fill an invalid page with what the blob holds (`None`: zeros). A valid
    /// page is left alone: it is at least as new as the blob.
    pub fn fill(&mut self, page: usize, content: Option<&[u8]>) {
        if self.valid.get(page) {
            return;
        }
        let at = (page % BLOCK_PAGES) * PAGE;
        let dst = &mut self.block_mut(page).bytes[at..at + PAGE];
        match content {
            Some(src) => dst.copy_from_slice(src),
            None => dst.fill(0),
        }
        self.valid.set(page);
    }

    /// Copy part of a Get body to byte `at` of the chunk, into the pages of
    /// `pages` (chunk slots) that are not valid; valid pages (written while
    /// the fetch ran) and pages outside `pages` are left alone. Nothing
    /// becomes valid: [`Self::received`] does that once the whole body came.
    pub fn receive(&mut self, at: usize, src: &[u8], pages: std::ops::Range<usize>) {
        let from = at.max(pages.start * PAGE);
        let to = (at + src.len()).min(pages.end * PAGE);
        let mut pos = from;
        while pos < to {
            let page = pos / PAGE;
            let b = page / BLOCK_PAGES;
            // A run of pages not valid, within one block.
            let mut end = to.min((page + 1) * PAGE);
            if self.valid.get(page) {
                pos = end;
                continue;
            }
            while end < to && end % BLOCK != 0 && !self.valid.get(end / PAGE) {
                end = to.min((end / PAGE + 1) * PAGE);
            }
            let block = self.block_mut(page);
            block.bytes[pos - b * BLOCK..end - b * BLOCK].copy_from_slice(&src[pos - at..end - at]);
            pos = end;
        }
    }

    /// A page whose bytes [`Self::receive`] wrote in full becomes valid,
    /// unless it is valid already (then it is at least as new as the blob).
    pub fn received(&mut self, page: usize) {
        if !self.valid.get(page) {
            debug_assert!(self.blocks[page / BLOCK_PAGES].is_some());
            self.valid.set(page);
        }
    }

    fn mark_dirty(&mut self, page: usize, delta: &mut DirtyDelta) {
        let g = &mut self.block_mut(page).gens[page % BLOCK_PAGES];
        *g = g.wrapping_add(1);
        if !self.dirty.get(page) {
            if !self.dirty.any_in_block(page) {
                delta.blocks += 1;
            }
            self.dirty.set(page);
            if self.dirty_pages == 0 {
                delta.chunk += 1;
            }
            self.dirty_pages += 1;
            delta.pages += 1;
        }
    }

    fn mark_clean(&mut self, page: usize, delta: &mut DirtyDelta) {
        if self.dirty.get(page) {
            self.dirty.clear(page);
            if !self.dirty.any_in_block(page) {
                delta.blocks -= 1;
            }
            self.dirty_pages -= 1;
            delta.pages -= 1;
            if self.dirty_pages == 0 {
                delta.chunk -= 1;
            }
        }
    }

    /// Copy `src` to byte `at` of the chunk. Every page touched must be valid
    /// already, or be covered entirely by `src`. Touched pages become dirty.
    pub fn write(&mut self, at: usize, src: &[u8]) -> DirtyDelta {
        let mut delta = DirtyDelta::default();
        if src.is_empty() {
            return delta;
        }
        let first = at / PAGE;
        let last = (at + src.len() - 1) / PAGE;
        for page in first..=last {
            let whole = at <= page * PAGE && at + src.len() >= (page + 1) * PAGE;
            assert!(
                whole || self.valid.get(page),
                "partial write into a page that was not filled first"
            );
            self.valid.set(page);
            self.keep.clear(page);
            self.mark_dirty(page, &mut delta);
        }
        let mut done = 0;
        while done < src.len() {
            let pos = at + done;
            let b = pos / BLOCK;
            let n = (src.len() - done).min((b + 1) * BLOCK - pos);
            let block = self.blocks[b].as_deref_mut().expect("marked above");
            block.bytes[pos - b * BLOCK..pos - b * BLOCK + n].copy_from_slice(&src[done..done + n]);
            done += n;
        }
        delta
    }

    /// Make a page zero and clean (its blob copy is being cleared). A page
    /// without a block was never valid here: it stays invalid, and a later
    /// read finds the cleared blob.
    pub fn zero_clean(&mut self, page: usize) -> DirtyDelta {
        let mut delta = DirtyDelta::default();
        if self.blocks[page / BLOCK_PAGES].is_none() {
            return delta;
        }
        let at = (page % BLOCK_PAGES) * PAGE;
        let block = self.block_mut(page);
        block.bytes[at..at + PAGE].fill(0);
        let g = &mut block.gens[page % BLOCK_PAGES];
        *g = g.wrapping_add(1);
        self.valid.set(page);
        self.keep.clear(page);
        self.mark_clean(page, &mut delta);
        delta
    }

    /// The page reached the blob as it was at generation `gen`: clear its
    /// dirty bit unless it was written again since.
    pub fn settle(&mut self, page: usize, gen: u32) -> DirtyDelta {
        let mut delta = DirtyDelta::default();
        if self.dirty.get(page) && self.generation(page) == gen {
            self.mark_clean(page, &mut delta);
        }
        delta
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        for b in self.blocks.iter_mut() {
            if let Some(block) = b.take() {
                self.pool.give(block);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_masks_cover_the_blocks_of_a_range() {
        assert_eq!(block_mask(0, PageRange::new(0, 1)), 1);
        assert_eq!(block_mask(0, PageRange::new(7, 9)), 0b11);
        assert_eq!(block_mask(0, PageRange::new(0, 512)), u64::MAX);
        assert_eq!(block_mask(1, PageRange::new(0, 513)), 1);
        assert_eq!(block_mask(1, PageRange::new(0, 512)), 0);
        assert_eq!(block_mask(0, PageRange::new(504, 2000)), 1 << 63);
    }

    #[test]
    fn a_scattered_write_costs_one_block_and_counts_one_dirty_block() {
        let pool = BlockPool::new(64);
        let mut c = Chunk::new(&pool);
        c.allocate(block_mask(0, PageRange::new(16, 24)));
        let d = c.write(16 * PAGE, &[7u8; BLOCK]);
        assert_eq!(pool.in_use(), 1);
        assert_eq!(
            d,
            DirtyDelta {
                pages: 8,
                blocks: 1,
                chunk: 1
            }
        );
        // A second write to the same block adds pages, not blocks.
        let d = c.write(16 * PAGE, &[8u8; PAGE]);
        assert_eq!(d.blocks, 0);
        let mut out = Vec::new();
        c.copy_out(16 * PAGE, 17 * PAGE + 3, &mut out);
        assert_eq!(&out[..PAGE], &[8u8; PAGE][..]);
        assert_eq!(&out[PAGE..], &[7u8; 3][..]);
        let mut total = DirtyDelta::default();
        for p in 16..24 {
            let d = c.settle(p, c.generation(p));
            total.pages += d.pages;
            total.blocks += d.blocks;
            total.chunk += d.chunk;
        }
        assert_eq!(
            total,
            DirtyDelta {
                pages: -8,
                blocks: -1,
                chunk: -1
            }
        );
        drop(c);
        assert_eq!(pool.in_use(), 0, "blocks go back with the chunk");
    }

    #[test]
    fn a_received_body_skips_valid_pages_and_pages_not_asked_for() {
        let pool = BlockPool::new(64);
        let mut c = Chunk::new(&pool);
        c.allocate(u64::MAX);
        // Page 2 was written while the fetch ran.
        c.write(2 * PAGE, &[9u8; PAGE]);
        let body: Vec<u8> = (0..20 * PAGE).map(|i| (i % 253) as u8).collect();
        // In uneven parts, as a connection delivers them; pages 1..18 asked for.
        let mut at = 0;
        for part in body.chunks(700) {
            c.receive(at, part, 1..18);
            at += part.len();
        }
        for p in 1..18 {
            c.received(p);
        }
        let mut out = Vec::new();
        c.copy_out(PAGE, 18 * PAGE, &mut out);
        assert_eq!(&out[..PAGE], &body[PAGE..2 * PAGE]);
        assert_eq!(
            &out[PAGE..2 * PAGE],
            &[9u8; PAGE][..],
            "a valid page is kept"
        );
        assert_eq!(&out[2 * PAGE..], &body[3 * PAGE..18 * PAGE]);
        assert!(!c.is_valid(0) && !c.is_valid(18));
    }

    #[test]
    fn a_write_across_blocks_lands_in_both() {
        let pool = BlockPool::new(64);
        let mut c = Chunk::new(&pool);
        c.allocate(u64::MAX);
        let data: Vec<u8> = (0..3 * BLOCK).map(|i| (i % 251) as u8).collect();
        c.write(BLOCK / 2, &data[..2 * BLOCK]);
        let mut out = Vec::new();
        c.copy_out(BLOCK / 2, BLOCK / 2 + 2 * BLOCK, &mut out);
        assert_eq!(out, &data[..2 * BLOCK]);
    }
}
