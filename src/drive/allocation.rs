//! Which pages of a drive hold data: the sparse map merged with the cache's
//! dirty pages, for a block protocol's allocation map (NBD
//! `base:allocation`).
//!
//! Invariant: a page reported as a hole reads as zeros. The sparse map
//! alone is not enough: a page written but not yet flushed is only in the
//! cache, and a copy tool trusting the map would skip it. The dirty bits are
//! read first and the map second: a page flushed in between joined the map
//! before its Put Page was sent and lost its dirty bit only after, so it is
//! seen by one of the two reads; a page cleared in between really is zero.

use super::chunk::{chunk_pages, chunks_of, CHUNK_PAGES};
use super::extents::{intersect, Extents, PageRange};
use super::Inner;

/// One run of pages with the same allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    /// The pages.
    pub pages: PageRange,
    /// True when they may hold data (in the blob or dirty in the cache);
    /// false when they read as zeros and the blob stores nothing for them.
    pub data: bool,
}

impl Inner {
    /// The allocation of `pages`, clipped to the data area, as consecutive
    /// runs alternating between data and holes, in order.
    pub(crate) fn allocation(&self, pages: PageRange) -> Vec<Allocation> {
        let size_pages = self.size_bytes() / crate::units::PAGE_SIZE;
        let pages = PageRange::new(pages.start.min(size_pages), pages.end.min(size_pages));
        if pages.is_empty() {
            return Vec::new();
        }
        // Dirty pages first (see the module comment for why the order).
        let mut data = Extents::new();
        let wanted = chunks_of(
            pages.start * crate::units::PAGE_SIZE,
            pages.end * crate::units::PAGE_SIZE,
        );
        for idx in self.cache.dirty_chunks() {
            if !wanted.contains(&idx) {
                continue;
            }
            let Some(r) = self.cache.get(idx) else {
                continue;
            };
            let span = intersect(chunk_pages(idx), pages);
            let base = idx * CHUNK_PAGES as u64;
            let c = r.lock();
            let mut run: Option<u64> = None;
            for page in span.start..span.end {
                let dirty = c.is_dirty((page - base) as usize);
                match (dirty, run) {
                    (true, None) => run = Some(page),
                    (false, Some(start)) => {
                        data.insert(PageRange::new(start, page));
                        run = None;
                    }
                    _ => {}
                }
            }
            if let Some(start) = run {
                data.insert(PageRange::new(start, span.end));
            }
        }
        for r in self.extents().within(pages) {
            data.insert(r);
        }
        let mut out = Vec::new();
        let mut at = pages.start;
        for r in data.within(pages) {
            if r.start > at {
                out.push(Allocation {
                    pages: PageRange::new(at, r.start),
                    data: false,
                });
            }
            out.push(Allocation {
                pages: r,
                data: true,
            });
            at = r.end;
        }
        if at < pages.end {
            out.push(Allocation {
                pages: PageRange::new(at, pages.end),
                data: false,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::drive::{Drive, DriveOptions, MemoryStore, Mode};
    use crate::units::PAGE_SIZE;

    /// A fresh drive of `data_bytes` in memory, opened read-write.
    async fn new_drive(data_bytes: u64) -> Drive {
        let store = MemoryStore::new(data_bytes + crate::units::VHD_FOOTER_BYTES);
        store.poke(
            data_bytes,
            &crate::vhd::Footer::new_fixed(data_bytes).to_bytes(),
        );
        let store = Arc::new(store);
        let opts = DriveOptions {
            mode: Mode::ReadWrite,
            cache_bytes: 8 << 20,
            flush_delay: std::time::Duration::from_secs(3600),
            ..DriveOptions::default()
        };
        Drive::open(store, opts).await.expect("opens")
    }

    #[tokio::test]
    async fn dirty_pages_are_data_before_and_after_the_flush() {
        let data_bytes = 16u64 << 20;
        let drive = new_drive(data_bytes).await;
        let all = PageRange::new(0, data_bytes / PAGE_SIZE);
        assert_eq!(
            drive.allocation(all),
            vec![Allocation {
                pages: all,
                data: false
            }]
        );
        drive.write_at(4096, &[1u8; 1024]).await.unwrap();
        let expect = vec![
            Allocation {
                pages: PageRange::new(0, 8),
                data: false,
            },
            Allocation {
                pages: PageRange::new(8, 10),
                data: true,
            },
            Allocation {
                pages: PageRange::new(10, all.end),
                data: false,
            },
        ];
        assert_eq!(drive.allocation(all), expect, "dirty, not yet flushed");
        drive.flush().await.unwrap();
        assert_eq!(drive.allocation(all), expect, "flushed");
        drive.discard(4096, 1024).await.unwrap();
        assert_eq!(
            drive.allocation(all),
            vec![Allocation {
                pages: all,
                data: false
            }],
            "cleared"
        );
        drive.close().await.unwrap();
    }

    #[tokio::test]
    async fn zeros_written_to_stay_allocated_survive_the_flush_and_plain_zeros_do_not() {
        let data_bytes = 16u64 << 20;
        let drive = new_drive(data_bytes).await;
        let all = PageRange::new(0, data_bytes / PAGE_SIZE);
        drive.write_zeroes_allocated(1 << 20, 8192).await.unwrap();
        drive.write_at(2 << 20, &[0u8; 8192]).await.unwrap();
        drive.flush().await.unwrap();
        let data: Vec<PageRange> = drive
            .allocation(all)
            .into_iter()
            .filter(|a| a.data)
            .map(|a| a.pages)
            .collect();
        let kept = PageRange::new((1 << 20) / PAGE_SIZE, ((1 << 20) + 8192) / PAGE_SIZE);
        assert_eq!(data, vec![kept], "only the kept zeros are allocated");
        assert_eq!(drive.read_at(1 << 20, 8192).await.unwrap(), vec![0u8; 8192]);
        // A plain write over them drops the mark: zeros become a clear.
        drive.write_at(1 << 20, &[0u8; 8192]).await.unwrap();
        drive.flush().await.unwrap();
        assert!(drive.allocation(all).iter().all(|a| !a.data));
        drive.close().await.unwrap();
    }
}
