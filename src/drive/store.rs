//! `PageStore`: the narrow view of one page blob that the drive engine needs.
//!
//! Two implementations: the REST client bound to one blob (`BlobPageStore`,
//! in `blob_store.rs`) and an in-memory store (`MemoryStore`, in `memory.rs`)
//! that is the reference model for property tests. All offsets are in bytes
//! and must be 512-byte aligned where the method says so; the store does not
//! know about the VHD footer (the drive keeps writes away from it).

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::blob::error::Result;
use crate::blob::fence::MarkRecorder;
use crate::blob::{BodySink, CopyStatus, Mark, ResumeError, Standing};
pub use crate::units::ByteRange;

/// What the engine reads of a blob's properties, in one request: enough to
/// open a drive (its size, whether a copy into it is complete, a grow's
/// recorded intent) and to notice later that it changed (its ETag).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlobState {
    /// Size of the whole blob in bytes, footer included.
    pub size_bytes: u64,
    /// The ETag (every write, resize or metadata change moves it).
    pub etag: Option<String>,
    /// How the last Copy Blob into it (a copy or a restore) stands.
    pub copy_status: Option<CopyStatus>,
    /// Its metadata, names in lower case.
    pub metadata: BTreeMap<String, String>,
}

/// One page blob (or one snapshot of it), as the drive engine sees it.
#[async_trait]
pub trait PageStore: Send + Sync + 'static {
    /// Size of the whole blob in bytes, footer included.
    async fn size_bytes(&self) -> Result<u64>;

    /// A name of this blob (or snapshot) that every process on the host
    /// derives alike and no other blob shares: the key of its disk cache.
    /// `None`: the blob cannot have a disk cache.
    fn cache_identity(&self) -> Option<String> {
        None
    }

    /// Whether all-zero pages the engine writes must be sent (as an
    /// encrypting store needs: only their ciphertext reads back as zeros),
    /// instead of being skipped or cleared. Discards still clear.
    fn writes_zero_pages(&self) -> bool {
        false
    }

    /// `data` (whole pages at `offset_bytes`) as this store would put it in
    /// the blob: what a recovery file keeps, so it never holds more than the
    /// blob would (an encrypting store gives ciphertext).
    fn as_stored(&self, _offset_bytes: u64, data: Bytes) -> Bytes {
        data
    }

    /// Whether pages kept outside the blob (the disk tier) must be sealed
    /// with [`PageStore::seal_pages`] and opened with
    /// [`PageStore::open_pages`]. A sealed copy keeps all-zero pages as
    /// data too, so it does not show which pages are zeros.
    fn seals_pages(&self) -> bool {
        false
    }

    /// Seal packed pages for keeping on local disk (the disk tier), in
    /// place: page `i` of `buf` is drive page `pages[i]`. An encrypting store
    /// encrypts them as it would for the blob, so the local copy reveals no
    /// more than the blob; the default keeps them as they are.
    fn seal_pages(&self, _pages: &[u64], _buf: &mut [u8]) {}

    /// The reverse of [`PageStore::seal_pages`].
    fn open_pages(&self, _pages: &[u64], _buf: &mut [u8]) {}

    /// Ranged reads the client may keep in flight now (its adaptive limit,
    /// `blob/limiter.rs`), shared by foreground reads and read-ahead;
    /// `None` when the store has no such limit.
    fn read_limit(&self) -> Option<usize> {
        None
    }

    /// The blob's ETag now (every write changes it). `None` when unknown,
    /// which keeps the disk cache off.
    async fn etag(&self) -> Result<Option<String>> {
        Ok(None)
    }

    /// The blob's size, ETag, copy status and metadata, from one read of its
    /// properties. The default knows only the size and the ETag.
    async fn state(&self) -> Result<BlobState> {
        Ok(BlobState {
            size_bytes: self.size_bytes().await?,
            etag: self.etag().await?,
            ..BlobState::default()
        })
    }

    /// Set (`Some`) or remove (`None`) one metadata entry, keeping the
    /// others, with the lease id when one is held. The caller holds the
    /// lease (or knows nobody else writes), so the read-modify-write of the
    /// whole metadata loses nobody's change. The default store has no
    /// metadata and refuses.
    async fn set_metadata_entry(
        &self,
        name: &str,
        _value: Option<&str>,
        _lease_id: Option<&str>,
    ) -> Result<()> {
        Err(crate::blob::Error::other(
            crate::blob::ErrorKind::InvalidInput,
            "set metadata",
            name,
            "this store keeps no metadata",
        ))
    }

    /// From now on, every read ([`Self::read`], [`Self::read_into`],
    /// [`Self::read_stored`], [`Self::page_ranges`]) answers only while the
    /// blob's ETag is `etag`; once the blob changed it fails with an error
    /// for which [`is_changed`] holds, and no byte of the new state is
    /// given. What a read-only open of a live blob (no lease) uses to never
    /// serve a mix of two states. `None` lifts the condition. The default
    /// store ignores it.
    fn pin_reads(&self, _etag: Option<&str>) {}

    /// The ranges within `within` that hold data (page ranges), sorted,
    /// non-overlapping, clipped to `within`. Implementations may query the
    /// service in several segments.
    async fn page_ranges(&self, within: ByteRange) -> Result<Vec<ByteRange>>;

    /// Read `range` (any alignment). Returns exactly `range.len()` bytes.
    async fn read(&self, range: ByteRange) -> Result<Bytes>;

    /// Read `range` (any alignment) into `sink` as the data arrives (see
    /// [`BodySink`]): the engine fills its cache blocks from the
    /// connection's buffers, with no whole body in between. Exactly
    /// `range.len()` bytes reach the sink when this succeeds; a retried
    /// request may send some again from offset 0. The default reads the
    /// whole body with [`Self::read`] (a store that transforms the data, as
    /// an encrypting one does, keeps it).
    ///
    /// Returns how long the attempt that answered took once it could go:
    /// after any wait for a slot of the client's limit and any retry's
    /// back-off, which say nothing of the link (the drive's link estimate,
    /// `link.rs`, is measured from it). `None`: the store has neither, and
    /// the caller times the whole call (the default).
    async fn read_into(&self, range: ByteRange, sink: BodySink<'_>) -> Result<Option<Duration>> {
        let body = self.read(range).await?;
        sink(0, &body);
        Ok(None)
    }

    /// Read `range` as stored, with no transformation a wrapping store
    /// applies to the data area: how a VHD footer (always plaintext) is read
    /// where it may lie inside the data area, as after an interrupted grow.
    async fn read_stored(&self, range: ByteRange) -> Result<Bytes> {
        self.read(range).await
    }

    /// Write `data` at `offset_bytes` (both 512-aligned, at most 4 MiB)
    /// with the lease id, when one is held.
    async fn write_pages(
        &self,
        offset_bytes: u64,
        data: Bytes,
        lease_id: Option<&str>,
    ) -> Result<()>;

    /// Clear (zero and deallocate) the 512-aligned `range`.
    async fn clear_pages(&self, range: ByteRange, lease_id: Option<&str>) -> Result<()>;

    /// Makes sure no page write sent before now under this lease can land
    /// any more (a blob raises its sequence number, see `blob/fence.rs`):
    /// called by an open under a lease id used before (an attach's) once the
    /// lease is held and before the sparse map is read, so a write of a
    /// process that died holding the same lease can neither land over this
    /// one's nor change the blob after its map was read.
    async fn fence_earlier_writes(&self, lease_id: Option<&str>) -> Result<()>;

    /// Change the size of the whole blob to `blob_size_bytes` (a multiple of
    /// 512) with the lease id, when one is held: pages past a new, smaller
    /// end are gone; pages of a larger one hold no data.
    async fn resize(&self, blob_size_bytes: u64, lease_id: Option<&str>) -> Result<()>;

    /// Acquire an infinite lease with `proposed_id`. Acquiring again with the
    /// id already held succeeds (retry-safe).
    async fn acquire_lease(&self, proposed_id: &str) -> Result<()>;

    /// Release the lease `lease_id`.
    async fn release_lease(&self, lease_id: &str) -> Result<()>;

    /// Break whatever lease is held, immediately.
    async fn break_lease(&self) -> Result<()>;

    /// The longest one request may take, retries included: a flush pass
    /// gives up after this long, so an outage costs a bounded wait.
    fn retry_budget(&self) -> Duration {
        crate::blob::RetryPolicy::default().max_total
    }

    /// What this store's writer lineage left the blob as, as far as it
    /// knows (`blob/lineage.rs`); None for a store without one.
    fn lineage_mark(&self) -> Option<Mark> {
        None
    }

    /// Reports every change of the lineage's mark to `recorder`.
    fn record_lineage(&self, _recorder: MarkRecorder) {}

    /// Takes the lease `lease_id` of a lineage that left the blob as `mark`
    /// again, only if the blob is still as it was left. The default, for a
    /// store without lineages, takes the lease.
    async fn resume_lineage(
        &self,
        lease_id: &str,
        _mark: &Mark,
    ) -> std::result::Result<Standing, ResumeError> {
        self.acquire_lease(lease_id).await?;
        Ok(Standing::StillHeld)
    }

    /// The blob's state read under the lease `lease_id` (an error when that
    /// lease is not the blob's active one). The default reads the ETag.
    async fn state_under_lease(&self, _lease_id: &str) -> Result<Mark> {
        Ok(Mark {
            epoch: None,
            etag: self.etag().await?,
        })
    }

    /// Makes the lineage's mark known again when its last change's ETag is
    /// not (two changes answered in flight together): reads it under the
    /// lease. A failure leaves it unknown (logged), as a refusal later is
    /// the safe side.
    async fn settle_lineage(&self, _lease_id: &str) {}
}

/// True when a read pinned with [`PageStore::pin_reads`] failed because the
/// blob is no longer the state it was pinned to: changed (412
/// `ConditionNotMet`) or gone (404).
pub fn is_changed(e: &crate::blob::Error) -> bool {
    e.code() == Some("ConditionNotMet")
        || (e.status == Some(412) && e.code().is_none())
        || e.is_not_found()
}
