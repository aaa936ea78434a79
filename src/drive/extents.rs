//! The sparse map: which pages of the data area may hold data in the blob.
//!
//! Invariant: the map is a superset of the pages that hold data in the blob.
//! A page outside it reads as zeros with no request; a page inside it may
//! still be zero (costing at most a needless read or clear). To keep this
//! true, pages are added before a Put Page is sent and removed only after a
//! Clear Pages succeeded. Ranges are kept disjoint, sorted and merged.

use std::collections::BTreeMap;

use crate::units::{ByteRange, PAGE_SIZE};

/// A half-open range of 512-byte pages `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PageRange {
    /// First page.
    pub start: u64,
    /// One past the last page.
    pub end: u64,
}

impl PageRange {
    /// Pages `[start, end)`.
    pub fn new(start: u64, end: u64) -> Self {
        debug_assert!(start <= end);
        PageRange { start, end }
    }

    /// The pages touched by a byte range (partial pages included).
    pub fn covering(bytes: ByteRange) -> Self {
        PageRange::new(bytes.start / PAGE_SIZE, bytes.end.div_ceil(PAGE_SIZE))
    }

    /// The same range in bytes.
    pub fn bytes(&self) -> ByteRange {
        ByteRange::new(self.start * PAGE_SIZE, self.end * PAGE_SIZE)
    }

    /// Number of pages.
    pub fn len_pages(&self) -> u64 {
        self.end - self.start
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.start >= self.end
    }

    /// True when `page` is one of these pages.
    pub fn contains(&self, page: u64) -> bool {
        self.start <= page && page < self.end
    }
}

/// The pages `a` and `b` share; empty (at the larger start) when they do
/// not overlap.
pub(crate) fn intersect(a: PageRange, b: PageRange) -> PageRange {
    let start = a.start.max(b.start);
    PageRange::new(start, a.end.min(b.end).max(start))
}

/// Disjoint, merged page ranges that may hold data.
#[derive(Debug, Default, Clone)]
pub struct Extents {
    /// start page -> end page.
    ranges: BTreeMap<u64, u64>,
}

impl Extents {
    /// An empty map (a never-written blob).
    pub fn new() -> Self {
        Self::default()
    }

    /// Mark `r` as possibly holding data.
    pub fn insert(&mut self, r: PageRange) {
        if r.is_empty() {
            return;
        }
        let (mut start, mut end) = (r.start, r.end);
        // Merge with a range that starts before and reaches `start`.
        if let Some((&s, &e)) = self.ranges.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
            }
        }
        // Swallow every range that starts inside [start, end].
        let inside: Vec<(u64, u64)> = self
            .ranges
            .range(start..=end)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in inside {
            self.ranges.remove(&s);
            end = end.max(e);
        }
        self.ranges.insert(start, end);
    }

    /// Mark `r` as holding no data.
    pub fn remove(&mut self, r: PageRange) {
        if r.is_empty() {
            return;
        }
        let hits: Vec<(u64, u64)> = self.overlapping(r).collect();
        for (s, e) in hits {
            self.ranges.remove(&s);
            if s < r.start {
                self.ranges.insert(s, r.start);
            }
            if e > r.end {
                self.ranges.insert(r.end, e);
            }
        }
    }

    fn overlapping(&self, r: PageRange) -> impl Iterator<Item = (u64, u64)> + '_ {
        let first = match self.ranges.range(..r.start).next_back() {
            Some((&s, &e)) if e > r.start => s,
            _ => r.start,
        };
        self.ranges
            .range(first..r.end)
            .map(|(&s, &e)| (s, e))
            .filter(move |&(_, e)| e > r.start)
    }

    /// True when any page of `r` may hold data.
    pub fn any_in(&self, r: PageRange) -> bool {
        !r.is_empty() && self.overlapping(r).next().is_some()
    }

    /// True when page `page` may hold data.
    pub fn contains(&self, page: u64) -> bool {
        self.any_in(PageRange::new(page, page + 1))
    }

    /// The parts of `r` that may hold data, clipped to `r`, in order.
    pub fn within(&self, r: PageRange) -> Vec<PageRange> {
        self.overlapping(r)
            .map(|(s, e)| PageRange::new(s.max(r.start), e.min(r.end)))
            .collect()
    }

    /// Number of pages that may hold data.
    pub fn len_pages(&self) -> u64 {
        self.ranges.iter().map(|(s, e)| e - s).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pr(s: u64, e: u64) -> PageRange {
        PageRange::new(s, e)
    }

    #[test]
    fn insert_merges_touching_and_overlapping_ranges() {
        let mut x = Extents::new();
        x.insert(pr(10, 20));
        x.insert(pr(30, 40));
        x.insert(pr(20, 30));
        assert_eq!(x.within(pr(0, 100)), vec![pr(10, 40)]);
        x.insert(pr(5, 12));
        x.insert(pr(38, 50));
        assert_eq!(x.within(pr(0, 100)), vec![pr(5, 50)]);
        assert_eq!(x.len_pages(), 45);
    }

    #[test]
    fn remove_splits_ranges_and_queries_clip() {
        let mut x = Extents::new();
        x.insert(pr(0, 100));
        x.remove(pr(10, 20));
        x.remove(pr(90, 200));
        assert_eq!(x.within(pr(0, 1000)), vec![pr(0, 10), pr(20, 90)]);
        assert_eq!(x.within(pr(5, 25)), vec![pr(5, 10), pr(20, 25)]);
        assert!(!x.any_in(pr(10, 20)));
        assert!(x.contains(9) && !x.contains(10) && x.contains(20));
    }

    #[test]
    fn extents_match_a_page_bitmap_model() {
        let mut x = Extents::new();
        let mut model = [false; 300];
        let mut seed = 0x1234_5678_u64;
        for i in 0..2000 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let s = (seed >> 33) % 300;
            let e = (s + (seed >> 20) % 40).min(300);
            if i % 3 == 0 {
                x.remove(pr(s, e));
            } else {
                x.insert(pr(s, e));
            }
            for (p, m) in model
                .iter_mut()
                .enumerate()
                .take(e as usize)
                .skip(s as usize)
            {
                let _ = p;
                *m = i % 3 != 0;
            }
            for (p, m) in model.iter().enumerate() {
                assert_eq!(x.contains(p as u64), *m, "page {p} after step {i}");
            }
        }
    }
}
