//! Opening a drive: size and footer checks, the lease for read-write, and the
//! sparse map loaded with Get Page Ranges in adaptive segments (small at
//! first so a fragmented blob never times out, growing while answers stay
//! short, so an empty 8 TiB drive opens in a few requests), and the disk tier
//! (opened after the lease, so its ETag check sees no one else's writes).

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::cache::Cache;
use super::chunk::{CHUNK_BYTES, CHUNK_OVERHEAD_BYTES};
use super::counters::{add, Meters};
use super::error::Result;
use super::extents::{Extents, PageRange};
use super::lease::Lease;
use super::store::PageStore;
use super::{DriveOptions, Inner, Mode, ReadAhead};
use crate::units::{ByteRange, MAX_PUT_PAGE_BYTES, PAGE_SIZE, VHD_FOOTER_BYTES};

/// Smallest cache, in chunks: enough for a few operations to pin at once.
const MIN_CACHE_CHUNKS: u64 = 8;

pub(super) async fn open_inner(store: Arc<dyn PageStore>, opts: DriveOptions) -> Result<Inner> {
    let meters = Meters::default();
    let target = opts.target.clone();
    let blob_bytes = store.size_bytes().await?;
    add(&meters.get, 1);
    let located = super::resize::locate_footer(store.as_ref(), blob_bytes).await?;
    add(&meters.bytes_down, VHD_FOOTER_BYTES);
    if located.interrupted_grow {
        tracing::warn!(
            target = %target,
            size_bytes = located.offset_bytes,
            blob_bytes,
            "a resize of this drive was interrupted; it opens at its old size ('blobdrive resize' finishes it)"
        );
    }
    let size_bytes = located.offset_bytes;

    let lease = match opts.mode {
        Mode::ReadWrite => {
            let key = store.cache_identity().unwrap_or_else(|| target.clone());
            let id = opts
                .lease_id
                .clone()
                .unwrap_or_else(|| super::lease::proposed_id(&key));
            Lease::acquire(store.as_ref(), id, &target, &key, &meters).await?
        }
        Mode::ReadOnly | Mode::Snapshot => Lease::none(&target),
    };
    let extents = match load_extents(store.as_ref(), size_bytes, &meters).await {
        Ok(x) => x,
        Err(e) => {
            // Do not leave the drive locked behind a failed open.
            let _ = lease.release(store.as_ref(), &meters).await;
            return Err(e);
        }
    };
    let disk = match &opts.disk_cache {
        Some(o) => super::tier::open(store.as_ref(), o, opts.mode, &target).await,
        None => None,
    };
    tracing::info!(
        target = %target,
        disk_cache = disk.is_some(),
        size_bytes,
        stored_bytes = extents.len_pages() * PAGE_SIZE,
        mode = ?opts.mode,
        "drive open"
    );

    // Requests in flight hold copies of their pages (Put Page bodies, Get
    // bodies): they come out of the same budget as the cached chunks, so
    // `cache_bytes` bounds all the data memory of the drive.
    let in_flight = (opts.flush_parallelism.max(1) as u64 * MAX_PUT_PAGE_BYTES)
        .min(opts.cache_bytes / 8)
        .max(MAX_PUT_PAGE_BYTES);
    let flush_parallelism = (in_flight / MAX_PUT_PAGE_BYTES) as usize;
    let cache_bytes = opts
        .cache_bytes
        .saturating_sub(in_flight)
        .max(MIN_CACHE_CHUNKS * CHUNK_BYTES);
    // By default a quarter of the cache, but at least one Put Page.
    let mut max_dirty_bytes = opts
        .max_dirty_bytes
        .unwrap_or((cache_bytes / 4).max(MAX_PUT_PAGE_BYTES))
        .clamp(CHUNK_BYTES, cache_bytes / 2);
    // Whole Put Pages: a pass that writers wait for then sends full 4 MiB
    // requests of a sequential stream, not a 4 MiB and a 2 MiB one.
    if max_dirty_bytes >= MAX_PUT_PAGE_BYTES {
        max_dirty_bytes -= max_dirty_bytes % MAX_PUT_PAGE_BYTES;
    }
    // The budget counts the bookkeeping of the chunks holding dirty pages
    // too; whole chunks of dirty data get theirs on top, so the data part
    // of the budget stays whole Put Pages.
    let max_dirty_bytes = max_dirty_bytes + max_dirty_bytes / CHUNK_BYTES * CHUNK_OVERHEAD_BYTES;
    Ok(Inner {
        store,
        mode: opts.mode,
        target,
        size_bytes: std::sync::atomic::AtomicU64::new(size_bytes),
        lease,
        cache: Cache::new(cache_bytes),
        disk,
        extents: Mutex::new(extents),
        meters,
        flush_lock: tokio::sync::Mutex::new(()),
        passes: Default::default(),
        stream: Mutex::new(None),
        max_dirty_bytes,
        flush_parallelism,
        flush_delay: opts.flush_delay,
        // Read-ahead beyond a quarter of the cache would evict itself before
        // the reader gets there.
        read_ahead_bytes: opts.read_ahead_bytes.min(cache_bytes / 4),
        read_ahead: Mutex::new(ReadAhead::default()),
        last_write: Mutex::new(None),
        closed: AtomicBool::new(false),
        writes_accepted: Default::default(),
        kick: Notify::new(),
        window_full: Notify::new(),
        drain_wanted: AtomicBool::new(false),
        drain: Notify::new(),
        stop: Notify::new(),
        stopping: AtomicBool::new(false),
        disk_skipped: Mutex::new(Default::default()),
    })
}

/// The sparse map of the data area, from Get Page Ranges. The store cuts the
/// query into segments the service can answer in time (`BlobPageStore`
/// adapts their size to how fragmented the blob is), so it is asked once.
async fn load_extents(store: &dyn PageStore, size_bytes: u64, meters: &Meters) -> Result<Extents> {
    let mut extents = Extents::new();
    add(&meters.page_ranges, 1);
    for r in store.page_ranges(ByteRange::new(0, size_bytes)).await? {
        extents.insert(PageRange::covering(r));
    }
    Ok(extents)
}
