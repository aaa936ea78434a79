//! Opening a drive: size and footer checks, the lease for read-write, and the
//! sparse map loaded with Get Page Ranges in adaptive segments (small at
//! first so a fragmented blob never times out, growing while answers stay
//! short, so an empty 8 TiB drive opens in a few requests), and the disk tier
//! (opened after the lease, so its ETag check sees no one else's writes).

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::cache::Cache;
use super::chunk::CHUNK_BYTES;
use super::counters::{add, Meters};
use super::error::{Error, Result};
use super::extents::{Extents, PageRange};
use super::lease::Lease;
use super::store::PageStore;
use super::{DriveOptions, Inner, Mode, ReadAhead};
use crate::units::{
    ByteRange, MAX_PAGE_BLOB_BYTES, MAX_PUT_PAGE_BYTES, PAGE_SIZE, VHD_FOOTER_BYTES,
};

/// Smallest cache, in chunks: enough for a few operations to pin at once.
const MIN_CACHE_CHUNKS: u64 = 8;

/// Validate the footer read from the end of the blob: a fixed VHD whose
/// size matches the blob's.
fn check_footer(footer: &[u8; 512], blob_bytes: u64) -> Result<()> {
    crate::vhd::Footer::parse(footer, blob_bytes)
        .map(|_| ())
        .map_err(|e| Error::NotADrive {
            reason: e.to_string(),
        })
}

pub(super) async fn open_inner(store: Arc<dyn PageStore>, opts: DriveOptions) -> Result<Inner> {
    let meters = Meters::default();
    let target = opts.target.clone();
    let blob_bytes = store.size_bytes().await?;
    if blob_bytes % PAGE_SIZE != 0
        || blob_bytes <= VHD_FOOTER_BYTES
        || blob_bytes > MAX_PAGE_BLOB_BYTES
    {
        return Err(Error::NotADrive {
            reason: format!("blob size {blob_bytes} is not a page blob holding a VHD"),
        });
    }
    let size_bytes = blob_bytes - VHD_FOOTER_BYTES;
    add(&meters.get, 1);
    let raw = store.read(ByteRange::new(size_bytes, blob_bytes)).await?;
    add(&meters.bytes_down, raw.len() as u64);
    let footer: &[u8; 512] = raw.as_ref().try_into().map_err(|_| Error::NotADrive {
        reason: "short read of the VHD footer".into(),
    })?;
    check_footer(footer, blob_bytes)?;

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
    let max_chunks =
        (opts.cache_bytes.saturating_sub(in_flight) / CHUNK_BYTES).max(MIN_CACHE_CHUNKS);
    let cache_bytes = max_chunks * CHUNK_BYTES;
    let mut max_dirty_bytes = opts.max_dirty_bytes.clamp(CHUNK_BYTES, cache_bytes / 2);
    // Whole Put Pages: a pass that writers wait for then sends full 4 MiB
    // requests of a sequential stream, not a 4 MiB and a 2 MiB one.
    if max_dirty_bytes >= MAX_PUT_PAGE_BYTES {
        max_dirty_bytes -= max_dirty_bytes % MAX_PUT_PAGE_BYTES;
    }
    Ok(Inner {
        store,
        mode: opts.mode,
        target,
        size_bytes,
        lease,
        cache: Cache::new(max_chunks as usize),
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
        stop: Notify::new(),
        stopping: AtomicBool::new(false),
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
