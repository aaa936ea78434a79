//! Live counters of one drive: requests by kind, bytes moved, cache hits and
//! misses (in pages), pages elided (zero pages neither read nor written).
//! misses of the disk tier, bad disk tier chunks. Counters only grow, except
//! the gauges (`dirty_bytes`, `cache_bytes`, `disk_bytes`) which are sampled
//! when a snapshot is taken.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// A snapshot of a drive's counters, for `blobdrive stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Get Blob requests (data reads, footer included).
    pub get: u64,
    /// Put Page (update) requests.
    pub put_page: u64,
    /// Put Page (clear) requests.
    pub clear_page: u64,
    /// Get Page Ranges requests.
    pub page_ranges: u64,
    /// Lease requests (acquire, release).
    pub lease: u64,
    /// Bytes read from the blob.
    pub bytes_down: u64,
    /// Bytes written to the blob (Put Page bodies).
    pub bytes_up: u64,
    /// Pages asked for by reads that were already in the cache.
    pub cache_hits: u64,
    /// Pages asked for by reads that were not in the cache.
    pub cache_misses: u64,
    /// Zero pages that were not read (no data in the blob) or not written
    /// (all zero and no data in the blob).
    pub pages_elided: u64,
    /// Bytes written to the drive and not yet durable in the blob.
    pub dirty_bytes: u64,
    /// Memory held by the page cache.
    pub cache_bytes: u64,
    /// Pages filled from the disk tier instead of the blob.
    pub disk_hits: u64,
    /// Pages read from the blob while the disk tier was on.
    pub disk_misses: u64,
    /// Disk tier files found torn or corrupted (dropped, read again).
    pub disk_bad_chunks: u64,
    /// Disk space held by the disk tier (0 when it is off).
    pub disk_bytes: u64,
    /// A flush pass is sending dirty pages now.
    pub flushing: bool,
}

/// The atomic counters a drive updates as it works.
#[derive(Debug, Default)]
pub(crate) struct Meters {
    pub get: AtomicU64,
    pub put_page: AtomicU64,
    pub clear_page: AtomicU64,
    pub page_ranges: AtomicU64,
    pub lease: AtomicU64,
    pub bytes_down: AtomicU64,
    pub bytes_up: AtomicU64,
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    pub pages_elided: AtomicU64,
    pub disk_hits: AtomicU64,
    pub disk_misses: AtomicU64,
}

/// Add `n` to a counter.
pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Meters {
    /// A snapshot, with the gauges filled in by the caller.
    pub fn snapshot(&self, dirty_bytes: u64, cache_bytes: u64) -> Counters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Counters {
            get: get(&self.get),
            put_page: get(&self.put_page),
            clear_page: get(&self.clear_page),
            page_ranges: get(&self.page_ranges),
            lease: get(&self.lease),
            bytes_down: get(&self.bytes_down),
            bytes_up: get(&self.bytes_up),
            cache_hits: get(&self.cache_hits),
            cache_misses: get(&self.cache_misses),
            pages_elided: get(&self.pages_elided),
            dirty_bytes,
            cache_bytes,
            disk_hits: get(&self.disk_hits),
            disk_misses: get(&self.disk_misses),
            disk_bad_chunks: 0,
            disk_bytes: 0,
            flushing: false,
        }
    }
}
