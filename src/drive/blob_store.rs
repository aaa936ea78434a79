//! `BlobPageStore`: the [`PageStore`] of one page blob (or snapshot) over the
//! REST client.
//!
//! Owns the segmenting of Get Page Ranges. A fragmented blob can make one
//! query run past the service's time limit, so ranges are asked for in
//! segments whose size adapts to what the service returns: the first segment
//! covers 256 MiB; a segment that comes back with few ranges (sparse space)
//! lets the next one grow fourfold, one with many ranges halves it (never
//! below 128 MiB), and a segment that times out is retried at half its size.
//! An empty 8 TiB blob takes about ten requests; a densely written one keeps
//! about a thousand ranges per request. Invariants: a snapshot is read-only
//! here: writes and leases on it are refused before anything is sent; once
//! reads are pinned to an ETag ([`PageStore::pin_reads`]) every Get and Get
//! Page Ranges carries `If-Match`, so the service refuses to answer from a
//! later state of the blob.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use super::store::{BlobState, PageStore};
use crate::blob::fence::MarkRecorder;
use crate::blob::{
    BlobClient, BlobPath, Error, ErrorKind, Mark, Result, ResumeError, Standing, WriteFence,
};
use crate::metrics;
use crate::units::ByteRange;

/// First Get Page Ranges segment.
pub const FIRST_SEGMENT_BYTES: u64 = 256 << 20;
/// Smallest segment (the service is always fast enough for it).
pub const MIN_SEGMENT_BYTES: u64 = 128 << 20;
/// Ranges per answer the segment size aims at.
const TARGET_RANGES_PER_SEGMENT: usize = 1000;

/// One page blob or snapshot, as the drive engine sees it.
#[derive(Debug, Clone)]
pub struct BlobPageStore {
    client: BlobClient,
    path: BlobPath,
    /// Fences every page write of this store (shared by its clones).
    fence: Arc<WriteFence>,
    /// The ETag every read is conditional on, once pinned (shared by its
    /// clones).
    pinned: Arc<Mutex<Option<String>>>,
}

impl BlobPageStore {
    /// The store of `path` (a snapshot when `path.snapshot` is set: read-only).
    pub fn new(client: BlobClient, path: BlobPath) -> Self {
        BlobPageStore {
            client,
            path,
            fence: Arc::new(WriteFence::new()),
            pinned: Arc::new(Mutex::new(None)),
        }
    }

    /// The ETag reads are pinned to, if any.
    fn if_match(&self) -> Option<String> {
        self.pinned.lock().expect("pinned mutex poisoned").clone()
    }

    /// The blob this store addresses.
    pub fn path(&self) -> &BlobPath {
        &self.path
    }

    /// The client (for counters such as `retries`).
    pub fn client(&self) -> &BlobClient {
        &self.client
    }

    /// The `drive` label of this store's metrics (the blob's name, as the
    /// drive and the client's retry counts name it).
    fn label(&self) -> String {
        self.path.to_string()
    }

    fn writable(&self, op: &'static str) -> Result<()> {
        if self.path.snapshot.is_some() {
            return Err(Error::other(
                ErrorKind::InvalidInput,
                op,
                self.path.to_string(),
                "a snapshot is read-only",
            ));
        }
        Ok(())
    }
}

/// Is this failure a sign that the segment was too large for the service?
fn segment_too_large(e: &Error) -> bool {
    e.code() == Some("OperationTimedOut")
        || (e.kind == ErrorKind::Transport && e.message.contains("timed out"))
}

/// The next segment size after one of `len` bytes returned `count` ranges.
fn next_segment(len: u64, count: usize) -> u64 {
    if count < TARGET_RANGES_PER_SEGMENT / 4 {
        len.saturating_mul(4)
    } else if count > TARGET_RANGES_PER_SEGMENT * 2 {
        (len / 2).max(MIN_SEGMENT_BYTES)
    } else {
        len
    }
}

/// Append `r` clipped to `within`, merging with the last range if adjacent.
fn push_clipped(out: &mut Vec<ByteRange>, r: ByteRange, within: ByteRange) {
    let start = r.start.max(within.start);
    let end = r.end.min(within.end);
    if start >= end {
        return;
    }
    if let Some(last) = out.last_mut() {
        if start <= last.end {
            last.end = last.end.max(end);
            return;
        }
    }
    out.push(ByteRange::new(start, end));
}

#[async_trait]
impl PageStore for BlobPageStore {
    async fn size_bytes(&self) -> Result<u64> {
        Ok(self.client.get_properties(&self.path).await?.content_length)
    }

    fn read_limit(&self) -> Option<usize> {
        Some(self.client.concurrency_limits().1)
    }

    fn cache_identity(&self) -> Option<String> {
        let p = &self.path;
        Some(format!(
            "{}\n{}\n{}\n{}",
            self.client.account().endpoint,
            p.container,
            p.name,
            p.snapshot.as_deref().unwrap_or("")
        ))
    }

    async fn etag(&self) -> Result<Option<String>> {
        Ok(self.client.get_properties(&self.path).await?.etag)
    }

    fn lineage_mark(&self) -> Option<Mark> {
        Some(self.fence.mark())
    }

    fn record_lineage(&self, recorder: MarkRecorder) {
        self.fence.record_with(recorder)
    }

    async fn resume_lineage(
        &self,
        lease_id: &str,
        mark: &Mark,
    ) -> std::result::Result<Standing, ResumeError> {
        self.writable("acquire lease")?;
        self.client
            .resume_lineage(&self.path, lease_id, mark, &crate::blob::Taker::Successor)
            .await
    }

    async fn state_under_lease(&self, lease_id: &str) -> Result<Mark> {
        self.client.state_under_lease(&self.path, lease_id).await
    }

    async fn settle_lineage(&self, lease_id: &str) {
        let Some(begun) = self.fence.unsettled() else {
            return;
        };
        match self.client.state_under_lease(&self.path, lease_id).await {
            Ok(m) => self
                .fence
                .settled(begun, m.epoch.unwrap_or_default(), m.etag),
            Err(e) => {
                tracing::debug!(target_blob = %self.path, error = %e, "cannot read the blob's ETag under the lease")
            }
        }
    }

    async fn state(&self) -> Result<BlobState> {
        let p = self.client.get_properties(&self.path).await?;
        Ok(BlobState {
            size_bytes: p.content_length,
            etag: p.etag,
            copy_status: p.copy_status,
            metadata: p.metadata,
        })
    }

    async fn set_metadata_entry(
        &self,
        name: &str,
        value: Option<&str>,
        lease_id: Option<&str>,
    ) -> Result<()> {
        self.writable("set metadata")?;
        // Set Blob Metadata replaces all of it: keep the rest (key slots).
        let mut metadata = self.client.get_properties(&self.path).await?.metadata;
        match value {
            Some(v) => metadata.insert(name.to_string(), v.to_string()),
            None => metadata.remove(name),
        };
        let pairs: Vec<(String, String)> = metadata.into_iter().collect();
        // A change of the blob: the lineage's ETag is read again later.
        let _change = self.fence.change();
        self.client.set_metadata(&self.path, &pairs, lease_id).await
    }

    fn pin_reads(&self, etag: Option<&str>) {
        *self.pinned.lock().expect("pinned mutex poisoned") = etag.map(str::to_string);
    }

    async fn page_ranges(&self, within: ByteRange) -> Result<Vec<ByteRange>> {
        let mut out = Vec::new();
        if within.is_empty() {
            return Ok(out);
        }
        let mut pos = within.start;
        let mut end = within.end;
        let mut seg = FIRST_SEGMENT_BYTES;
        while pos < end {
            let seg_end = pos.saturating_add(seg).min(end);
            let list = match self
                .client
                .get_page_ranges_if(
                    &self.path,
                    Some(ByteRange::new(pos, seg_end)),
                    self.if_match().as_deref(),
                )
                .await
            {
                Ok(l) => l,
                Err(e) if segment_too_large(&e) && seg_end - pos > MIN_SEGMENT_BYTES => {
                    seg = ((seg_end - pos) / 2).max(MIN_SEGMENT_BYTES);
                    tracing::debug!(target_blob = %self.path, seg, "page ranges timed out; halving segment");
                    continue;
                }
                Err(e) => return Err(e),
            };
            for r in &list.ranges {
                push_clipped(&mut out, *r, ByteRange::new(pos, seg_end));
            }
            // Nothing lies past the end of the blob.
            end = end.min(list.blob_size_bytes.max(pos));
            seg = next_segment(seg_end - pos, list.ranges.len());
            pos = seg_end;
        }
        Ok(out)
    }

    async fn read(&self, range: ByteRange) -> Result<Bytes> {
        let started = std::time::Instant::now();
        let out = self
            .client
            .get_blob_range_if(&self.path, range, self.if_match().as_deref())
            .await;
        metrics::observe(&self.label(), metrics::Operation::Get, started.elapsed());
        out
    }

    async fn read_into(
        &self,
        range: ByteRange,
        sink: crate::blob::BodySink<'_>,
    ) -> Result<Option<Duration>> {
        let started = std::time::Instant::now();
        let out = self
            .client
            .get_blob_range_into_if(&self.path, range, sink, self.if_match().as_deref())
            .await;
        metrics::observe(&self.label(), metrics::Operation::Get, started.elapsed());
        out.map(Some)
    }

    async fn write_pages(
        &self,
        offset_bytes: u64,
        data: Bytes,
        lease_id: Option<&str>,
    ) -> Result<()> {
        self.writable("put page")?;
        let started = std::time::Instant::now();
        let out = self
            .client
            .put_pages_fenced(&self.path, offset_bytes, data, lease_id, Some(&self.fence))
            .await;
        metrics::observe(
            &self.label(),
            metrics::Operation::PutPage,
            started.elapsed(),
        );
        out
    }

    async fn fence_earlier_writes(&self, lease_id: Option<&str>) -> Result<()> {
        self.writable("fence writes")?;
        self.client
            .fence_now(&self.path, &self.fence, lease_id)
            .await
            .map(|_| ())
    }

    async fn clear_pages(&self, range: ByteRange, lease_id: Option<&str>) -> Result<()> {
        self.writable("clear pages")?;
        self.client
            .clear_pages_fenced(&self.path, range, lease_id, Some(&self.fence))
            .await
    }

    async fn resize(&self, blob_size_bytes: u64, lease_id: Option<&str>) -> Result<()> {
        self.writable("resize")?;
        // A change of the blob: the lineage's ETag is read again later.
        let _change = self.fence.change();
        self.client
            .resize(&self.path, blob_size_bytes, lease_id)
            .await
    }

    async fn acquire_lease(&self, proposed_id: &str) -> Result<()> {
        self.writable("acquire lease")?;
        self.client
            .acquire_lease(&self.path, proposed_id, None)
            .await
            .map(|_| ())
    }

    fn retry_budget(&self) -> Duration {
        self.client.retry_policy().max_total
    }

    async fn release_lease(&self, lease_id: &str) -> Result<()> {
        self.writable("release lease")?;
        self.client.release_lease(&self.path, lease_id).await
    }

    async fn break_lease(&self) -> Result<()> {
        self.writable("break lease")?;
        self.client
            .break_lease(&self.path, Some(0))
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_grow_over_sparse_space_and_shrink_over_dense() {
        assert_eq!(
            next_segment(FIRST_SEGMENT_BYTES, 0),
            FIRST_SEGMENT_BYTES * 4
        );
        assert_eq!(next_segment(FIRST_SEGMENT_BYTES, 1000), FIRST_SEGMENT_BYTES);
        assert_eq!(next_segment(FIRST_SEGMENT_BYTES, 5000), MIN_SEGMENT_BYTES);
        assert_eq!(next_segment(MIN_SEGMENT_BYTES, 5000), MIN_SEGMENT_BYTES);
        // An empty 8 TiB blob: 256M, 1G, 4G, ... needs few requests.
        let (mut pos, mut seg, mut n) = (0u64, FIRST_SEGMENT_BYTES, 0);
        while pos < crate::units::MAX_PAGE_BLOB_BYTES {
            pos += seg;
            seg = next_segment(seg, 0);
            n += 1;
        }
        assert!(n <= 10, "{n} requests");
    }

    #[test]
    fn clipping_merges_ranges_split_at_segment_borders() {
        let mut out = Vec::new();
        let w = ByteRange::new(0, 2048);
        push_clipped(&mut out, ByteRange::new(0, 1024), w);
        push_clipped(&mut out, ByteRange::new(1024, 1536), w);
        push_clipped(&mut out, ByteRange::new(1536 + 512, 4096), w);
        assert_eq!(out, vec![ByteRange::new(0, 1536)]);
    }
}
