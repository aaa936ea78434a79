//! Opening a drive: the lease for read-write (taken first, so what is read
//! next is what it protects), the copy status (a drive a copy or restore
//! left incomplete is not opened read-write), size and footer checks, a
//! read-only open's reads pinned to the ETag it opened (so a change under it
//! fails its reads instead of mixing two states), the sparse map loaded
//! with Get Page Ranges in adaptive segments (small at first so a
//! fragmented blob never times out, growing while answers stay short, so an
//! empty 8 TiB drive opens in a few requests), and the disk tier (opened
//! after the lease, so its ETag check sees no one else's writes).

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::cache::Cache;
use super::chunk::{CHUNK_BYTES, CHUNK_OVERHEAD_BYTES};
use super::counters::{add, Meters};
use super::error::{Error, Result};
use super::extents::{Extents, PageRange};
use super::lease::Lease;
use super::store::PageStore;
use super::{DriveOptions, Inner, Mode, ReadAhead};
use crate::units::{ByteRange, PAGE_SIZE, VHD_FOOTER_BYTES};

/// Smallest cache, in chunks: enough for a few operations to pin at once.
pub(crate) const MIN_CACHE_CHUNKS: u64 = 8;

pub(super) async fn open_inner(store: Arc<dyn PageStore>, opts: DriveOptions) -> Result<Inner> {
    let meters = Meters::default();
    let target = opts.target.clone();
    // The lease first, then what it protects: the size, the footer and the
    // sparse map read afterwards are what no one else can change while the
    // drive is open (read before it, a resize landing in between would go
    // unseen).
    let lease = match opts.mode {
        Mode::ReadWrite => {
            let key = store.cache_identity().unwrap_or_else(|| target.clone());
            let id = opts
                .lease_id
                .clone()
                .unwrap_or_else(|| super::lease::proposed_id(&key));
            match &opts.lineage.resume {
                // A lineage's successor: only if no one came between.
                Some(mark) => {
                    Lease::resume(store.as_ref(), id, mark, &target, &key, &meters).await?
                }
                None => Lease::acquire(store.as_ref(), id, &target, &key, &meters).await?,
            }
        }
        Mode::ReadOnly | Mode::Snapshot => Lease::none(&target),
    };
    // Only an id given to the open can have been used before (an attach's,
    // which every serving process of the attach proposes again): a new
    // random one fences lazily, before its first write (`WriteFence::new`).
    let fence_with = lease.id().filter(|_| opts.lease_id.is_some());
    let read = match read_drive(store.as_ref(), opts.mode, fence_with, &target, &meters).await {
        Ok(x) => x,
        Err(e) => {
            // Do not leave the drive locked behind a failed open; if that
            // fails too, say so and how to free it.
            return match lease.release(store.as_ref(), &meters).await {
                Ok(()) => Err(e),
                Err(r) => {
                    let release = match r {
                        Error::ReleaseFailed { cause, .. } => cause.to_string(),
                        other => other.to_string(),
                    };
                    let hint: String = lease.id().unwrap_or("").chars().take(8).collect();
                    tracing::error!(
                        target = %target,
                        lease_id_hint = %hint,
                        error = %release,
                        "the open failed and so did releasing its lease: the drive may stay locked"
                    );
                    Err(Error::OpenFailedLocked {
                        target: target.clone(),
                        cause: Box::new(e),
                        release,
                    })
                }
            };
        }
    };
    let ReadDrive {
        size_bytes,
        extents,
        etag,
        metadata,
    } = read;
    if let (Mode::ReadWrite, Some(id)) = (opts.mode, lease.id()) {
        // The state read under the lease is the lineage's from here on:
        // recorded before anything is written, so a successor that finds
        // the lease broken can tell whether anyone wrote since.
        store.settle_lineage(id).await;
        if let Some(recorder) = &opts.lineage.recorder {
            store.record_lineage(recorder.clone());
        }
    }
    // The tier is trusted only at the ETag this open read (and pinned):
    // one recorded at a newer state is not this open's.
    let encrypted = crate::crypt::KeySlots::is_encrypted(&metadata);
    let disk = match &opts.disk_cache {
        Some(o) => {
            let etag = etag.as_deref();
            super::tier::open(store.as_ref(), o, opts.mode, &target, etag, encrypted).await
        }
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

    let budget = opts.memory_budget();
    let (cache_bytes, flush_parallelism) = (budget.cache_bytes, budget.flush_parallelism);
    // The budget counts the bookkeeping of the chunks holding dirty pages
    // too; whole chunks of dirty data get theirs on top, so the data part
    // of the budget stays whole Put Pages.
    let max_dirty_bytes =
        budget.dirty_bytes + budget.dirty_bytes / CHUNK_BYTES * CHUNK_OVERHEAD_BYTES;
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
        flush_lock: Default::default(),
        passes: Default::default(),
        stream: Mutex::new(None),
        max_dirty_bytes,
        flush_parallelism,
        flush_delay: opts.flush_delay,
        // Read-ahead beyond a quarter of the cache would evict itself before
        // the reader gets there.
        read_ahead_bytes: opts.read_ahead_bytes.min(cache_bytes / 4),
        read_ahead: Mutex::new(ReadAhead::default()),
        link: Default::default(),
        ahead: Default::default(),
        ahead_off: Default::default(),
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
        changed: AtomicBool::new(false),
        metadata_at_open: metadata,
    })
}

/// What an open read of the drive: the size of its data area, its sparse
/// map, and the ETag and metadata of the state they were read from.
struct ReadDrive {
    size_bytes: u64,
    extents: Extents,
    etag: Option<String>,
    metadata: std::collections::BTreeMap<String, String>,
}

/// Times a read-only open starts again when the blob changed while it read
/// the footer and the sparse map.
const PINNED_OPEN_TRIES: u32 = 3;

/// The size of the data area and the sparse map of the drive in `store`,
/// after checking its copy status and finding its footer. A read-only open
/// of a live blob (no lease keeps it still) pins every read to the ETag it
/// saw first, so the footer, the map and every later read are of one state
/// (`fetch.rs` turns a refused read into [`Error::Changed`]). A read-write
/// open under a lease id that was used before (`fence_with`: an attach's)
/// fences the writes sent earlier under it before it reads the footer and
/// the map (see
/// [`PageStore::fence_earlier_writes`]); the ETag it keeps is the one from
/// before that fence, whose raise of the sequence number changes no page,
/// so that the disk tier (recorded at the state of the last close) is not
/// told apart by the open's own raise.
async fn read_drive(
    store: &dyn PageStore,
    mode: Mode,
    fence_with: Option<&str>,
    target: &str,
    meters: &Meters,
) -> Result<ReadDrive> {
    let mut tries = 0;
    loop {
        tries += 1;
        let state = store.state().await?;
        add(&meters.get, 1);
        check_copy_status(target, mode, state.copy_status.as_ref())?;
        // Only a read-only open needs it (a lease or a snapshot keeps the
        // others still); any pin left on the store is lifted for them.
        store.pin_reads(match mode {
            Mode::ReadOnly => state.etag.as_deref(),
            Mode::ReadWrite | Mode::Snapshot => None,
        });
        if let (Mode::ReadWrite, Some(lease_id)) = (mode, fence_with) {
            store.fence_earlier_writes(Some(lease_id)).await?;
        }
        let read = async {
            let located = super::resize::locate_footer(store, state.size_bytes).await?;
            add(&meters.bytes_down, VHD_FOOTER_BYTES);
            if let Some(line) = located.unfinished_grow_line(target) {
                tracing::warn!(
                    target = %target,
                    size_bytes = located.offset_bytes,
                    blob_bytes = state.size_bytes,
                    "{line}"
                );
            }
            let extents = load_extents(store, located.offset_bytes, meters).await?;
            Ok::<_, Error>(ReadDrive {
                size_bytes: located.offset_bytes,
                extents,
                etag: state.etag.clone(),
                metadata: state.metadata.clone(),
            })
        };
        match read.await {
            Err(Error::Backend(e))
                if mode == Mode::ReadOnly
                    && super::store::is_changed(&e)
                    && tries < PINNED_OPEN_TRIES =>
            {
                tracing::debug!(target = %target, error = %e, "the drive changed while it opened; reading it again");
            }
            other => return other,
        }
    }
}

/// Refuses a read-write open of a drive whose copy or restore is pending,
/// failed or was aborted, or whose copy status this version does not know
/// (it may hold only part of its data); a read-only or snapshot open goes
/// ahead with a warning.
fn check_copy_status(
    target: &str,
    mode: Mode,
    status: Option<&crate::blob::CopyStatus>,
) -> Result<()> {
    let Some(problem) = super::error::copy_status_problem(target, status) else {
        return Ok(());
    };
    match (mode, status) {
        (Mode::ReadWrite, Some(status)) => Err(Error::CopyIncomplete {
            target: target.to_string(),
            status: status.clone(),
        }),
        _ => {
            tracing::warn!(target = %target, "{problem}");
            Ok(())
        }
    }
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use async_trait::async_trait;
    use bytes::Bytes;

    use super::*;
    use crate::blob::CopyStatus;
    use crate::drive::store::BlobState;
    use crate::drive::{Drive, MemoryStore};

    const MIB: u64 = 1 << 20;

    fn drive_store(size_bytes: u64) -> Arc<MemoryStore> {
        Arc::new(MemoryStore::with_drive(size_bytes))
    }

    fn opts(mode: Mode) -> DriveOptions {
        DriveOptions {
            mode,
            cache_bytes: 16 * MIB,
            ..DriveOptions::default()
        }
    }

    #[tokio::test]
    async fn a_drive_whose_copy_is_not_complete_does_not_open_read_write() {
        for status in [
            CopyStatus::Pending,
            CopyStatus::Failed,
            CopyStatus::Aborted,
            CopyStatus::parse("stalled").unwrap(),
        ] {
            let store = drive_store(MIB);
            store.set_copy_status(Some(status.clone()));
            let e = Drive::open(store.clone(), opts(Mode::ReadWrite))
                .await
                .err()
                .expect("refused read-write");
            assert!(matches!(&e, Error::CopyIncomplete { status: s, .. } if *s == status));
            let line = e.to_string();
            assert!(
                line.contains(&format!("copy status {}", status.as_str())),
                "{line}"
            );
            assert!(line.contains("does not attach read-write"), "{line}");
            assert_eq!(store.lease_holder(), None, "no lease left behind");
            // Looking is allowed.
            let ro = Drive::open(store.clone(), opts(Mode::ReadOnly))
                .await
                .unwrap();
            ro.close().await.unwrap();
        }
        let store = drive_store(MIB);
        store.set_copy_status(Some(CopyStatus::Success));
        let rw = Drive::open(store.clone(), opts(Mode::ReadWrite))
            .await
            .unwrap();
        rw.close().await.unwrap();
    }

    /// A blob that another host grows (all of it, footer moved) just before
    /// our lease lands on it.
    struct GrownBeforeTheLease {
        inner: Arc<MemoryStore>,
        grow_to: u64,
        done: std::sync::atomic::AtomicBool,
    }

    #[async_trait]
    impl PageStore for GrownBeforeTheLease {
        async fn size_bytes(&self) -> crate::blob::Result<u64> {
            self.inner.size_bytes().await
        }
        async fn state(&self) -> crate::blob::Result<BlobState> {
            self.inner.state().await
        }
        async fn page_ranges(&self, within: ByteRange) -> crate::blob::Result<Vec<ByteRange>> {
            self.inner.page_ranges(within).await
        }
        async fn read(&self, range: ByteRange) -> crate::blob::Result<Bytes> {
            self.inner.read(range).await
        }
        async fn write_pages(
            &self,
            offset_bytes: u64,
            data: Bytes,
            lease_id: Option<&str>,
        ) -> crate::blob::Result<()> {
            self.inner.write_pages(offset_bytes, data, lease_id).await
        }
        async fn clear_pages(
            &self,
            range: ByteRange,
            lease_id: Option<&str>,
        ) -> crate::blob::Result<()> {
            self.inner.clear_pages(range, lease_id).await
        }
        async fn fence_earlier_writes(&self, lease_id: Option<&str>) -> crate::blob::Result<()> {
            self.inner.fence_earlier_writes(lease_id).await
        }
        async fn resize(&self, blob_bytes: u64, lease_id: Option<&str>) -> crate::blob::Result<()> {
            self.inner.resize(blob_bytes, lease_id).await
        }
        async fn acquire_lease(&self, proposed_id: &str) -> crate::blob::Result<()> {
            if !self.done.swap(true, Ordering::AcqRel) {
                let size = self.inner.size_bytes().await? - VHD_FOOTER_BYTES;
                let found = super::super::resize::locate_footer(self.inner.as_ref(), size + 512)
                    .await
                    .unwrap();
                super::super::resize::move_footer(
                    self.inner.as_ref(),
                    &found.footer,
                    size,
                    self.grow_to,
                    None,
                )
                .await?;
            }
            self.inner.acquire_lease(proposed_id).await
        }
        async fn release_lease(&self, lease_id: &str) -> crate::blob::Result<()> {
            self.inner.release_lease(lease_id).await
        }
        async fn break_lease(&self) -> crate::blob::Result<()> {
            self.inner.break_lease().await
        }
    }

    #[tokio::test]
    async fn open_reads_the_size_and_footer_under_its_lease() {
        let inner = drive_store(MIB);
        let store = Arc::new(GrownBeforeTheLease {
            inner: inner.clone(),
            grow_to: 2 * MIB,
            done: Default::default(),
        });
        let drive = Drive::open(store, opts(Mode::ReadWrite)).await.unwrap();
        // What the lease protects is the grown drive, not the size read
        // before the lease was held.
        assert_eq!(drive.size_bytes(), 2 * MIB);
        drive.write_at(2 * MIB - 512, &[9u8; 512]).await.unwrap();
        drive.close().await.unwrap();
        assert_eq!(
            inner.contents(ByteRange::new(2 * MIB - 512, 2 * MIB)),
            vec![9u8; 512]
        );
    }

    #[tokio::test]
    async fn a_read_only_open_fails_every_read_once_the_blob_changed() {
        let store = drive_store(4 * MIB);
        store.poke(0, &[1u8; 4096]);
        store.poke(2 * MIB, &[2u8; 4096]);
        let ro = Drive::open(store.clone(), opts(Mode::ReadOnly))
            .await
            .unwrap();
        assert_eq!(&ro.read_at(0, 4096).await.unwrap()[..], &[1u8; 4096][..]);
        // Someone restores or overwrites the blob under the read-only open.
        store.poke(2 * MIB, &[3u8; 4096]);
        let e = ro.read_at(2 * MIB, 4096).await.unwrap_err();
        assert!(matches!(e, Error::Changed { .. }), "{e}");
        assert_eq!(e.errno(), libc::EIO);
        // Cached pages and holes of the old map fail too: never a mix.
        assert!(matches!(
            ro.read_at(0, 4096).await,
            Err(Error::Changed { .. })
        ));
        assert!(matches!(
            ro.read_at(3 * MIB, 4096).await,
            Err(Error::Changed { .. })
        ));
        ro.close().await.unwrap();
        // A new open sees the new state.
        let again = Drive::open(store.clone(), opts(Mode::ReadOnly))
            .await
            .unwrap();
        assert_eq!(
            &again.read_at(2 * MIB, 4096).await.unwrap()[..],
            &[3u8; 4096][..]
        );
        again.close().await.unwrap();
    }
    /// A blob that another host writes (and closes, recording its disk tier
    /// at the new ETag) while a read-only open reads its map.
    struct WrittenWhileOpening {
        inner: Arc<MemoryStore>,
        cache_dir: std::path::PathBuf,
        done: std::sync::atomic::AtomicBool,
        /// Our own pin: the writer's open lifts the shared store's.
        pinned: Mutex<Option<String>>,
    }

    #[async_trait]
    impl PageStore for WrittenWhileOpening {
        async fn size_bytes(&self) -> crate::blob::Result<u64> {
            self.inner.size_bytes().await
        }
        fn cache_identity(&self) -> Option<String> {
            self.inner.cache_identity()
        }
        async fn etag(&self) -> crate::blob::Result<Option<String>> {
            self.inner.etag().await
        }
        async fn state(&self) -> crate::blob::Result<BlobState> {
            self.inner.state().await
        }
        fn pin_reads(&self, etag: Option<&str>) {
            *self.pinned.lock().unwrap() = etag.map(str::to_string);
        }
        async fn page_ranges(&self, within: ByteRange) -> crate::blob::Result<Vec<ByteRange>> {
            let ranges = self.inner.page_ranges(within).await?;
            if !self.done.swap(true, Ordering::AcqRel) {
                let writer = Drive::open(
                    self.inner.clone(),
                    DriveOptions {
                        disk_cache: Some(crate::drive::disk_cache::DiskCacheOptions {
                            dir: self.cache_dir.clone(),
                            max_bytes: 64 * MIB,
                        }),
                        ..opts(Mode::ReadWrite)
                    },
                )
                .await
                .unwrap();
                writer.write_at(0, &[2u8; 4096]).await.unwrap();
                writer.close().await.unwrap();
            }
            Ok(ranges)
        }
        async fn read(&self, range: ByteRange) -> crate::blob::Result<Bytes> {
            let pinned = self.pinned.lock().unwrap().clone();
            self.inner.pin_reads(pinned.as_deref());
            let read = self.inner.read(range).await;
            self.inner.pin_reads(None);
            read
        }
        async fn write_pages(
            &self,
            offset_bytes: u64,
            data: Bytes,
            lease_id: Option<&str>,
        ) -> crate::blob::Result<()> {
            self.inner.write_pages(offset_bytes, data, lease_id).await
        }
        async fn clear_pages(
            &self,
            range: ByteRange,
            lease_id: Option<&str>,
        ) -> crate::blob::Result<()> {
            self.inner.clear_pages(range, lease_id).await
        }
        async fn fence_earlier_writes(&self, lease_id: Option<&str>) -> crate::blob::Result<()> {
            self.inner.fence_earlier_writes(lease_id).await
        }
        async fn resize(&self, blob_bytes: u64, lease_id: Option<&str>) -> crate::blob::Result<()> {
            self.inner.resize(blob_bytes, lease_id).await
        }
        async fn acquire_lease(&self, proposed_id: &str) -> crate::blob::Result<()> {
            self.inner.acquire_lease(proposed_id).await
        }
        async fn release_lease(&self, lease_id: &str) -> crate::blob::Result<()> {
            self.inner.release_lease(lease_id).await
        }
        async fn break_lease(&self) -> crate::blob::Result<()> {
            self.inner.break_lease().await
        }
    }

    #[tokio::test]
    async fn a_read_only_open_trusts_the_disk_tier_only_at_the_etag_it_pinned() {
        let dir = tempfile::tempdir().unwrap();
        let inner = drive_store(4 * MIB);
        inner.poke(0, &[1u8; 4096]);
        let store = Arc::new(WrittenWhileOpening {
            inner: inner.clone(),
            cache_dir: dir.path().to_path_buf(),
            done: Default::default(),
            pinned: Default::default(),
        });
        let ro = Drive::open(
            store,
            DriveOptions {
                disk_cache: Some(crate::drive::disk_cache::DiskCacheOptions {
                    dir: dir.path().to_path_buf(),
                    max_bytes: 64 * MIB,
                }),
                ..opts(Mode::ReadOnly)
            },
        )
        .await
        .unwrap();
        // The open pinned the state holding 1s; the tier was recorded at the
        // writer's newer state holding 2s: never served under this open.
        match ro.read_at(0, 4096).await {
            Ok(b) => assert!(
                b.iter().all(|&x| x == 1),
                "a page of another state: {:?}",
                &b[..8]
            ),
            Err(e) => assert!(matches!(e, Error::Changed { .. }), "{e}"),
        }
        ro.close().await.unwrap();
    }
    /// A blob whose lease cannot be released (the service refuses).
    struct ReleaseRefused(Arc<MemoryStore>);

    #[async_trait]
    impl PageStore for ReleaseRefused {
        async fn size_bytes(&self) -> crate::blob::Result<u64> {
            self.0.size_bytes().await
        }
        async fn state(&self) -> crate::blob::Result<BlobState> {
            self.0.state().await
        }
        async fn page_ranges(&self, within: ByteRange) -> crate::blob::Result<Vec<ByteRange>> {
            self.0.page_ranges(within).await
        }
        async fn read(&self, range: ByteRange) -> crate::blob::Result<Bytes> {
            self.0.read(range).await
        }
        async fn write_pages(
            &self,
            offset_bytes: u64,
            data: Bytes,
            lease_id: Option<&str>,
        ) -> crate::blob::Result<()> {
            self.0.write_pages(offset_bytes, data, lease_id).await
        }
        async fn fence_earlier_writes(&self, lease_id: Option<&str>) -> crate::blob::Result<()> {
            self.0.fence_earlier_writes(lease_id).await
        }
        async fn clear_pages(
            &self,
            range: ByteRange,
            lease_id: Option<&str>,
        ) -> crate::blob::Result<()> {
            self.0.clear_pages(range, lease_id).await
        }
        async fn resize(&self, blob_bytes: u64, lease_id: Option<&str>) -> crate::blob::Result<()> {
            self.0.resize(blob_bytes, lease_id).await
        }
        async fn acquire_lease(&self, proposed_id: &str) -> crate::blob::Result<()> {
            self.0.acquire_lease(proposed_id).await
        }
        async fn release_lease(&self, _lease_id: &str) -> crate::blob::Result<()> {
            Err(crate::blob::Error::service(
                "release lease",
                "c/d.vhd",
                500,
                Some("InternalError".into()),
                "the server failed",
            ))
        }
        async fn break_lease(&self) -> crate::blob::Result<()> {
            self.0.break_lease().await
        }
    }

    #[tokio::test]
    async fn a_failed_open_whose_lease_stays_says_how_to_free_it() {
        // Not a drive (no footer), and the lease the open took stays.
        let inner = Arc::new(MemoryStore::new(MIB + VHD_FOOTER_BYTES));
        let store = Arc::new(ReleaseRefused(inner.clone()));
        let e = Drive::open(
            store,
            DriveOptions {
                target: "c/d.vhd".into(),
                ..opts(Mode::ReadWrite)
            },
        )
        .await
        .err()
        .expect("not a drive");
        let line = e.to_string();
        assert!(
            line.contains("no VHD footer") || line.contains("footer"),
            "{line}"
        );
        assert!(line.contains("may stay locked"), "{line}");
        assert!(line.contains("'blobdrive break-lease c/d.vhd'"), "{line}");
        assert_eq!(e.errno(), libc::EINVAL, "the open's own failure");
        assert!(inner.lease_holder().is_some(), "the lease stayed");
    }

    /// A blob that records the order of what an open asks of it.
    struct CallOrder {
        inner: Arc<MemoryStore>,
        calls: Mutex<Vec<&'static str>>,
    }

    impl CallOrder {
        fn saw(&self, call: &'static str) {
            self.calls.lock().unwrap().push(call);
        }
    }

    #[async_trait]
    impl PageStore for CallOrder {
        async fn size_bytes(&self) -> crate::blob::Result<u64> {
            self.inner.size_bytes().await
        }
        async fn state(&self) -> crate::blob::Result<BlobState> {
            self.inner.state().await
        }
        async fn page_ranges(&self, within: ByteRange) -> crate::blob::Result<Vec<ByteRange>> {
            self.saw("page ranges");
            self.inner.page_ranges(within).await
        }
        async fn read(&self, range: ByteRange) -> crate::blob::Result<Bytes> {
            self.inner.read(range).await
        }
        async fn write_pages(
            &self,
            offset_bytes: u64,
            data: Bytes,
            lease_id: Option<&str>,
        ) -> crate::blob::Result<()> {
            self.inner.write_pages(offset_bytes, data, lease_id).await
        }
        async fn fence_earlier_writes(&self, lease_id: Option<&str>) -> crate::blob::Result<()> {
            self.saw("fence");
            self.inner.fence_earlier_writes(lease_id).await
        }
        async fn clear_pages(
            &self,
            range: ByteRange,
            lease_id: Option<&str>,
        ) -> crate::blob::Result<()> {
            self.inner.clear_pages(range, lease_id).await
        }
        async fn resize(&self, blob_bytes: u64, lease_id: Option<&str>) -> crate::blob::Result<()> {
            self.inner.resize(blob_bytes, lease_id).await
        }
        async fn acquire_lease(&self, proposed_id: &str) -> crate::blob::Result<()> {
            self.saw("lease");
            self.inner.acquire_lease(proposed_id).await
        }
        async fn release_lease(&self, lease_id: &str) -> crate::blob::Result<()> {
            self.inner.release_lease(lease_id).await
        }
        async fn break_lease(&self) -> crate::blob::Result<()> {
            self.inner.break_lease().await
        }
    }

    #[tokio::test]
    async fn an_attach_open_fences_earlier_writes_before_it_reads_the_map() {
        // A process that died holding the same lease may have a Put Page
        // in flight: it must be unable to land before the map is read, or
        // the map would miss pages the blob then holds.
        let inner = drive_store(MIB);
        let store = Arc::new(CallOrder {
            inner,
            calls: Mutex::new(Vec::new()),
        });
        let attach = DriveOptions {
            lease_id: Some("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0".into()),
            ..opts(Mode::ReadWrite)
        };
        let drive = Drive::open(store.clone(), attach).await.unwrap();
        drive.close().await.unwrap();
        let calls = store.calls.lock().unwrap().clone();
        let first = |c: &str| calls.iter().position(|x| *x == c).unwrap_or(usize::MAX);
        assert!(
            first("lease") < first("fence") && first("fence") < first("page ranges"),
            "{calls:?}"
        );
        // A new random lease id cannot have been used: it fences lazily.
        store.calls.lock().unwrap().clear();
        let drive = Drive::open(store.clone(), opts(Mode::ReadWrite))
            .await
            .unwrap();
        drive.close().await.unwrap();
        assert!(!store.calls.lock().unwrap().contains(&"fence"));
        // A read-only open has no lease and writes nothing: no fence.
        store.calls.lock().unwrap().clear();
        let ro = Drive::open(store.clone(), opts(Mode::ReadOnly))
            .await
            .unwrap();
        ro.close().await.unwrap();
        assert!(!store.calls.lock().unwrap().contains(&"fence"));
    }
}
