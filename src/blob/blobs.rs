//! Blob-level operations: properties, create (page and small block blobs),
//! Put Page (update and clear), Get Page Ranges (and their diff against a
//! snapshot), ranged reads, snapshot, resize, metadata, server-side copy
//! (start, state, abort) and delete.
//!
//! Invariants: a Put Page body is 512-aligned and at most 4 MiB, checked
//! before sending (Azurite does not enforce the limit); a create never
//! replaces an existing blob, nor does a copy unless it holds the
//! destination's lease (a restore); a ranged read returns exactly the bytes asked
//! for or fails; nothing writes to a snapshot.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use reqwest::Method;
use uuid::Uuid;

use super::client::{BlobClient, BodySink, Limit, Request, Resource, Response};
use super::error::{Error, ErrorKind, Result};
use super::fence::WriteFence;
use super::path::BlobPath;
use super::types::{
    BlobProperties, BlobType, LeaseDuration, LeaseState, LeaseStatus, PageRangeList,
};
use super::xml;
use crate::units::{ByteRange, MAX_PAGE_BLOB_BYTES, MAX_PUT_PAGE_BYTES, PAGE_SIZE};

/// Metadata key a create stamps on the blob, so that a create retried after
/// a lost answer recognises its own blob instead of reporting a conflict.
pub const CREATE_ID_METADATA: &str = "blobdrivecreateid";

/// Largest block blob `put_block_blob` sends in one request.
const MAX_SINGLE_PUT_BYTES: usize = 256 * 1024 * 1024;

fn invalid(op: &'static str, path: &BlobPath, msg: impl Into<String>) -> Error {
    Error::other(ErrorKind::InvalidInput, op, path.to_string(), msg)
}

fn no_snapshot(op: &'static str, path: &BlobPath) -> Result<()> {
    if path.snapshot.is_some() {
        return Err(invalid(op, path, "a snapshot is read-only"));
    }
    Ok(())
}

fn check_blob_size(op: &'static str, path: &BlobPath, size_bytes: u64) -> Result<()> {
    if size_bytes % PAGE_SIZE != 0 || size_bytes > MAX_PAGE_BLOB_BYTES {
        return Err(invalid(
            op,
            path,
            format!("page blob size {size_bytes} must be a multiple of 512 and at most 8 TiB"),
        ));
    }
    Ok(())
}

fn check_aligned(op: &'static str, path: &BlobPath, range: ByteRange) -> Result<()> {
    if range.start % PAGE_SIZE != 0 || range.end % PAGE_SIZE != 0 || range.is_empty() {
        return Err(invalid(
            op,
            path,
            format!(
                "range {}..{} must be non-empty and 512-byte aligned",
                range.start, range.end
            ),
        ));
    }
    Ok(())
}

/// `bytes=S-E` (inclusive) for a non-empty half-open range.
fn range_header(range: ByteRange) -> String {
    format!("bytes={}-{}", range.start, range.end - 1)
}

fn metadata_headers(
    op: &'static str,
    path: &BlobPath,
    metadata: &[(String, String)],
) -> Result<Vec<(String, String)>> {
    let mut out = Vec::with_capacity(metadata.len());
    for (k, v) in metadata {
        let ident = k
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ident {
            return Err(invalid(
                op,
                path,
                format!("metadata name {k:?} must be a C# identifier (letters, digits, _)"),
            ));
        }
        if !v.bytes().all(|b| (0x20..0x7f).contains(&b)) || v.trim() != v {
            return Err(invalid(
                op,
                path,
                format!("metadata value of {k} must be printable ASCII without leading or trailing spaces"),
            ));
        }
        out.push((format!("x-ms-meta-{}", k.to_ascii_lowercase()), v.clone()));
    }
    Ok(out)
}

fn properties_from(resp: &Response) -> BlobProperties {
    let h = |n: &str| resp.header(n).map(str::to_string);
    let metadata: BTreeMap<String, String> = resp
        .headers
        .iter()
        .filter_map(|(k, v)| {
            let name = k.as_str().strip_prefix("x-ms-meta-")?;
            Some((name.to_string(), v.to_str().ok()?.to_string()))
        })
        .collect();
    BlobProperties {
        blob_type: resp.header("x-ms-blob-type").and_then(BlobType::parse),
        content_length: resp
            .header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        etag: h("etag"),
        last_modified: h("last-modified"),
        creation_time: h("x-ms-creation-time"),
        lease_state: resp.header("x-ms-lease-state").and_then(LeaseState::parse),
        lease_status: resp
            .header("x-ms-lease-status")
            .and_then(LeaseStatus::parse),
        lease_duration: resp
            .header("x-ms-lease-duration")
            .and_then(LeaseDuration::parse),
        content_type: h("content-type"),
        content_md5: h("content-md5"),
        sequence_number: resp
            .header("x-ms-blob-sequence-number")
            .and_then(|v| v.parse().ok()),
        copy_status: resp.header("x-ms-copy-status").and_then(CopyStatus::parse),
        metadata,
    }
}

impl BlobClient {
    /// Properties of a blob or snapshot (type, size, lease, metadata, ...).
    pub async fn get_properties(&self, path: &BlobPath) -> Result<BlobProperties> {
        let req = Request::new("get properties", Method::HEAD, Resource::Blob(path));
        let resp = self.execute(req).await.0?;
        Ok(properties_from(&resp))
    }

    /// Create an empty page blob of `size_bytes` (a multiple of 512, at most
    /// 8 TiB). Never replaces an existing blob: then the error satisfies
    /// [`Error::is_already_exists`].
    pub async fn create_page_blob(&self, path: &BlobPath, size_bytes: u64) -> Result<()> {
        const OP: &str = "create page blob";
        no_snapshot(OP, path)?;
        check_blob_size(OP, path, size_bytes)?;
        let create_id = Uuid::new_v4().to_string();
        let req = Request::new(OP, Method::PUT, Resource::Blob(path))
            .header("x-ms-blob-type", "PageBlob")
            .header("x-ms-blob-content-length", size_bytes.to_string())
            .header("if-none-match", "*")
            .header(
                &format!("x-ms-meta-{CREATE_ID_METADATA}"),
                create_id.clone(),
            );
        match self.execute(req).await {
            (Ok(_), _) => Ok(()),
            (Err(e), attempts) if attempts > 1 && e.is_already_exists() => {
                // Did an earlier attempt of ours create it?
                let props = self.get_properties(path).await.map_err(|_| e.clone())?;
                if props.metadata.get(CREATE_ID_METADATA) == Some(&create_id) {
                    Ok(())
                } else {
                    Err(e)
                }
            }
            (Err(e), _) => Err(e),
        }
    }

    /// Create or replace a small block blob holding `data` (fixtures, tests).
    pub async fn put_block_blob(&self, path: &BlobPath, data: Bytes) -> Result<()> {
        const OP: &str = "put block blob";
        no_snapshot(OP, path)?;
        if data.len() > MAX_SINGLE_PUT_BYTES {
            return Err(invalid(
                OP,
                path,
                "block blob too large for one request (256 MiB)",
            ));
        }
        let req = Request::new(OP, Method::PUT, Resource::Blob(path))
            .header("x-ms-blob-type", "BlockBlob")
            .body(data);
        self.execute(req).await.0.map(|_| ())
    }

    /// Write `data` (512-aligned length, at most 4 MiB) at `offset_bytes`
    /// (512-aligned). Refused before sending when the shape is wrong.
    pub async fn put_pages(
        &self,
        path: &BlobPath,
        offset_bytes: u64,
        data: Bytes,
        lease_id: Option<&str>,
    ) -> Result<()> {
        self.put_pages_fenced(path, offset_bytes, data, lease_id, None)
            .await
    }

    /// [`Self::put_pages`], fenced by `fence` when given: a late copy of
    /// this write can never land over a newer one (see `fence.rs`).
    pub async fn put_pages_fenced(
        &self,
        path: &BlobPath,
        offset_bytes: u64,
        data: Bytes,
        lease_id: Option<&str>,
        fence: Option<&WriteFence>,
    ) -> Result<()> {
        const OP: &str = "put page";
        no_snapshot(OP, path)?;
        let len = data.len() as u64;
        if len > MAX_PUT_PAGE_BYTES {
            return Err(invalid(
                OP,
                path,
                format!("a Put Page carries at most 4 MiB ({MAX_PUT_PAGE_BYTES} bytes), not {len}"),
            ));
        }
        let range = ByteRange::new(offset_bytes, offset_bytes.saturating_add(len));
        check_aligned(OP, path, range)?;
        let req = Request::new(OP, Method::PUT, Resource::Blob(path))
            .query("comp", "page")
            .header("x-ms-page-write", "update")
            .header("x-ms-range", range_header(range))
            .lease(lease_id)
            .fenced(fence)
            .limited(Limit::Writes)
            .body(data);
        self.execute(req).await.0.map(|_| ())
    }

    /// Clear (zero and deallocate) the 512-aligned `range`, of any length.
    pub async fn clear_pages(
        &self,
        path: &BlobPath,
        range: ByteRange,
        lease_id: Option<&str>,
    ) -> Result<()> {
        self.clear_pages_fenced(path, range, lease_id, None).await
    }

    /// [`Self::clear_pages`], fenced by `fence` when given.
    pub async fn clear_pages_fenced(
        &self,
        path: &BlobPath,
        range: ByteRange,
        lease_id: Option<&str>,
        fence: Option<&WriteFence>,
    ) -> Result<()> {
        const OP: &str = "clear pages";
        no_snapshot(OP, path)?;
        check_aligned(OP, path, range)?;
        let req = Request::new(OP, Method::PUT, Resource::Blob(path))
            .query("comp", "page")
            .header("x-ms-page-write", "clear")
            .header("x-ms-range", range_header(range))
            .lease(lease_id)
            .fenced(fence)
            .limited(Limit::Writes);
        self.execute(req).await.0.map(|_| ())
    }

    /// The ranges holding data within `within` (the whole blob when `None`)
    /// in one query (following the service's markers if it paginates), and
    /// the blob size. Ranges are half-open, sorted, as the service gave them
    /// (not clipped to `within`).
    pub async fn get_page_ranges(
        &self,
        path: &BlobPath,
        within: Option<ByteRange>,
    ) -> Result<PageRangeList> {
        self.get_page_ranges_if(path, within, None).await
    }

    /// [`Self::get_page_ranges`], only while the blob's ETag is `if_match`
    /// (when given): once the blob changed the service answers 412
    /// `ConditionNotMet` instead of the ranges of another state.
    pub async fn get_page_ranges_if(
        &self,
        path: &BlobPath,
        within: Option<ByteRange>,
        if_match: Option<&str>,
    ) -> Result<PageRangeList> {
        const OP: &str = "get page ranges";
        if let Some(w) = within {
            if w.is_empty() {
                return Err(invalid(OP, path, "empty range"));
            }
        }
        let mut out = PageRangeList::default();
        let mut marker: Option<String> = None;
        loop {
            let mut req =
                Request::new(OP, Method::GET, Resource::Blob(path)).query("comp", "pagelist");
            if let Some(w) = within {
                req = req.header("x-ms-range", range_header(w));
            }
            if let Some(m) = &marker {
                req = req.query("marker", m.clone());
            }
            if let Some(etag) = if_match {
                req = req.header("if-match", etag);
            }
            let resp = self.execute(req).await.0?;
            out.blob_size_bytes = resp
                .header("x-ms-blob-content-length")
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| {
                    Error::other(
                        ErrorKind::Protocol,
                        OP,
                        path.to_string(),
                        "answer lacks x-ms-blob-content-length",
                    )
                })?;
            let (ranges, next) = xml::parse_page_list(&resp.body)
                .map_err(|m| Error::other(ErrorKind::Protocol, OP, path.to_string(), m))?;
            out.ranges.extend(ranges);
            match next {
                Some(m) => marker = Some(m),
                None => return Ok(out),
            }
        }
    }

    /// Read `range` of a blob or snapshot: exactly `range.len()` bytes, or an
    /// error (a short body is retried, then reported).
    pub async fn get_blob_range(&self, path: &BlobPath, range: ByteRange) -> Result<Bytes> {
        self.get_blob_range_if(path, range, None).await
    }

    /// [`Self::get_blob_range`], only while the blob's ETag is `if_match`
    /// (when given): a blob changed since fails with 412 `ConditionNotMet`.
    pub async fn get_blob_range_if(
        &self,
        path: &BlobPath,
        range: ByteRange,
        if_match: Option<&str>,
    ) -> Result<Bytes> {
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        let mut req = Request::new("get blob", Method::GET, Resource::Blob(path))
            .header("x-ms-range", range_header(range))
            .limited(Limit::Reads);
        if let Some(etag) = if_match {
            req = req.header("if-match", etag);
        }
        req.expect_body_len = Some(range.len());
        Ok(self.execute(req).await.0?.body)
    }

    /// Read `range` of the blob into `sink` as the body arrives (see
    /// [`BodySink`]): exactly `range.len()` bytes, or an error. A retried
    /// attempt sends the bytes again from offset 0.
    pub async fn get_blob_range_into(
        &self,
        path: &BlobPath,
        range: ByteRange,
        sink: BodySink<'_>,
    ) -> Result<()> {
        self.get_blob_range_into_if(path, range, sink, None)
            .await
            .map(|_| ())
    }

    /// [`Self::get_blob_range_into`], only while the blob's ETag is
    /// `if_match` (when given): a blob changed since fails with 412
    /// `ConditionNotMet`, before any byte of it reaches `sink`. Returns how
    /// long the attempt that answered took once it could go (no wait for a
    /// slot of the client's limit, no retry's back-off).
    pub async fn get_blob_range_into_if(
        &self,
        path: &BlobPath,
        range: ByteRange,
        sink: BodySink<'_>,
        if_match: Option<&str>,
    ) -> Result<Duration> {
        if range.is_empty() {
            return Ok(Duration::ZERO);
        }
        let mut req = Request::new("get blob", Method::GET, Resource::Blob(path))
            .header("x-ms-range", range_header(range))
            .limited(Limit::Reads);
        if let Some(etag) = if_match {
            req = req.header("if-match", etag);
        }
        req.expect_body_len = Some(range.len());
        req.sink = Some(sink);
        Ok(self.execute(req).await.0?.took)
    }

    /// Take a snapshot; returns its time (address it with
    /// `path.clone().with_snapshot(Some(&time))`).
    pub async fn snapshot(&self, path: &BlobPath) -> Result<String> {
        const OP: &str = "snapshot";
        no_snapshot(OP, path)?;
        let req = Request::new(OP, Method::PUT, Resource::Blob(path)).query("comp", "snapshot");
        let resp = self.execute(req).await.0?;
        resp.header("x-ms-snapshot")
            .map(str::to_string)
            .ok_or_else(|| {
                Error::other(
                    ErrorKind::Protocol,
                    OP,
                    path.to_string(),
                    "answer lacks x-ms-snapshot",
                )
            })
    }

    /// Change the size of a page blob (a multiple of 512, at most 8 TiB).
    pub async fn resize(
        &self,
        path: &BlobPath,
        size_bytes: u64,
        lease_id: Option<&str>,
    ) -> Result<()> {
        const OP: &str = "resize";
        no_snapshot(OP, path)?;
        check_blob_size(OP, path, size_bytes)?;
        let req = Request::new(OP, Method::PUT, Resource::Blob(path))
            .query("comp", "properties")
            .header("x-ms-blob-content-length", size_bytes.to_string())
            .lease(lease_id);
        self.execute(req).await.0.map(|_| ())
    }

    /// Raise the page blob's sequence number to at least `at_least`
    /// (`x-ms-sequence-number-action: max`, so a retry changes nothing) and
    /// return the number the blob holds now.
    pub async fn raise_sequence_number(
        &self,
        path: &BlobPath,
        at_least: u64,
        lease_id: Option<&str>,
    ) -> Result<u64> {
        Ok(self
            .raise_sequence_number_etag(path, at_least, lease_id)
            .await?
            .0)
    }

    /// [`Self::raise_sequence_number`], with the ETag the blob has after it.
    pub(crate) async fn raise_sequence_number_etag(
        &self,
        path: &BlobPath,
        at_least: u64,
        lease_id: Option<&str>,
    ) -> Result<(u64, Option<String>)> {
        const OP: &str = "raise sequence number";
        no_snapshot(OP, path)?;
        let req = Request::new(OP, Method::PUT, Resource::Blob(path))
            .query("comp", "properties")
            .header("x-ms-sequence-number-action", "max")
            .header("x-ms-blob-sequence-number", at_least.to_string())
            .lease(lease_id);
        let resp = self.execute(req).await.0?;
        let seq = resp
            .header("x-ms-blob-sequence-number")
            .and_then(|v| v.parse().ok())
            .unwrap_or(at_least);
        Ok((seq, resp.header("etag").map(str::to_string)))
    }

    /// Replace the blob's metadata with `metadata` (names are C#
    /// identifiers, values printable ASCII).
    pub async fn set_metadata(
        &self,
        path: &BlobPath,
        metadata: &[(String, String)],
        lease_id: Option<&str>,
    ) -> Result<()> {
        const OP: &str = "set metadata";
        no_snapshot(OP, path)?;
        let mut req = Request::new(OP, Method::PUT, Resource::Blob(path))
            .query("comp", "metadata")
            .lease(lease_id);
        req.headers.extend(metadata_headers(OP, path, metadata)?);
        self.execute(req).await.0.map(|_| ())
    }

    /// [`Self::set_metadata`], only if the blob's ETag is still `etag` (the
    /// one read with the metadata being replaced): a read-modify-write that
    /// another writer overtook fails with `ConditionNotMet` (412) instead of
    /// undoing that writer's change.
    pub async fn set_metadata_if_unchanged(
        &self,
        path: &BlobPath,
        metadata: &[(String, String)],
        etag: &str,
    ) -> Result<()> {
        const OP: &str = "set metadata";
        no_snapshot(OP, path)?;
        let mut req = Request::new(OP, Method::PUT, Resource::Blob(path))
            .query("comp", "metadata")
            .header("if-match", etag);
        req.headers.extend(metadata_headers(OP, path, metadata)?);
        self.execute(req).await.0.map(|_| ())
    }

    /// Delete a blob (with its snapshots when `include_snapshots`), or just
    /// the snapshot `path` names.
    pub async fn delete_blob(
        &self,
        path: &BlobPath,
        include_snapshots: bool,
        lease_id: Option<&str>,
    ) -> Result<()> {
        let mut req =
            Request::new("delete blob", Method::DELETE, Resource::Blob(path)).lease(lease_id);
        if include_snapshots && path.snapshot.is_none() {
            req = req.header("x-ms-delete-snapshots", "include");
        }
        match self.execute(req).await {
            (Ok(_), _) => Ok(()),
            // A retry after a first attempt that did delete it.
            (Err(e), attempts) if attempts > 1 && e.code() == Some("BlobNotFound") => Ok(()),
            (Err(e), _) => Err(e),
        }
    }
}

pub use super::types::CopyStatus;

/// The copy state of a destination blob (`x-ms-copy-*` headers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyState {
    /// The copy's id (what Abort Copy Blob takes).
    pub id: Option<String>,
    /// Pending, success, aborted or failed; `None` when the blob was never a copy destination.
    pub status: Option<CopyStatus>,
    /// Bytes copied so far and in all, from `x-ms-copy-progress` (`copied/total`).
    pub progress_bytes: Option<(u64, u64)>,
    /// Why a copy failed or was aborted, as the service says.
    pub description: Option<String>,
}

impl CopyState {
    fn from_response(resp: &Response) -> CopyState {
        let status = resp.header("x-ms-copy-status").and_then(CopyStatus::parse);
        let progress_bytes = resp.header("x-ms-copy-progress").and_then(|p| {
            let (done, total) = p.split_once('/')?;
            Some((done.trim().parse().ok()?, total.trim().parse().ok()?))
        });
        CopyState {
            id: resp.header("x-ms-copy-id").map(str::to_string),
            status,
            progress_bytes,
            description: resp
                .header("x-ms-copy-status-description")
                .map(str::to_string),
        }
    }
}

/// What changed between two states of a page blob, as the service answers
/// Get Page Ranges with `prevsnapshot` (half-open ranges).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageRangeDiff {
    /// Ranges written since the earlier state.
    pub written: Vec<ByteRange>,
    /// Ranges cleared since the earlier state. The service lists them;
    /// emulators may not (callers that need them exact derive them).
    pub cleared: Vec<ByteRange>,
    /// Size of the later state (`x-ms-blob-content-length`).
    pub blob_size_bytes: u64,
}

impl BlobClient {
    /// The URL of `path` (with `?snapshot=`) that the service itself can
    /// read as a copy source: in this account, signed by this account's SAS
    /// when the client uses one. It may hold a SAS signature: never log it.
    pub fn source_url(&self, path: &BlobPath) -> String {
        let ep = &self.account().endpoint;
        let mut url = format!("{}/{}", ep.as_str().trim_end_matches('/'), path.url_path());
        let mut sep = '?';
        if let Some(t) = &path.snapshot {
            url.push_str(&format!("?snapshot={}", super::path::encode_component(t)));
            sep = '&';
        }
        if let super::account::Credential::Sas(token) = &self.account().credential {
            if !token.is_empty() {
                url.push(sep);
                url.push_str(token);
            }
        }
        url
    }

    /// Start a server-side copy of `source_url` (a blob or snapshot the
    /// service can read: this account's, or another's with a SAS) into
    /// `dest`. With `lease_id == None` the copy never replaces an existing
    /// blob (`If-None-Match: *`; the error then satisfies
    /// [`Error::is_already_exists`]); with a lease id it overwrites the
    /// leased `dest` (a restore). Returns the state right after the start
    /// (within an account the service often finishes at once).
    pub async fn start_copy(
        &self,
        dest: &BlobPath,
        source_url: &str,
        lease_id: Option<&str>,
    ) -> Result<CopyState> {
        const OP: &str = "copy blob";
        no_snapshot(OP, dest)?;
        let mut req = Request::new(OP, Method::PUT, Resource::Blob(dest))
            .header("x-ms-copy-source", source_url);
        req = match lease_id {
            Some(id) => req.lease(Some(id)),
            None => req.header("if-none-match", "*"),
        };
        let resp = self.execute(req).await.0?;
        Ok(CopyState::from_response(&resp))
    }

    /// The copy state of `dest` now (one Get Blob Properties).
    pub async fn copy_state(&self, dest: &BlobPath) -> Result<CopyState> {
        let req = Request::new("get copy state", Method::HEAD, Resource::Blob(dest));
        let resp = self.execute(req).await.0?;
        Ok(CopyState::from_response(&resp))
    }

    /// Abort the pending copy `copy_id` into `dest` (Abort Copy Blob); the
    /// destination is left as an empty blob of the source's size.
    pub async fn abort_copy(&self, dest: &BlobPath, copy_id: &str) -> Result<()> {
        const OP: &str = "abort copy";
        no_snapshot(OP, dest)?;
        let req = Request::new(OP, Method::PUT, Resource::Blob(dest))
            .query("comp", "copy")
            .query("copyid", copy_id.to_string())
            .header("x-ms-copy-action", "abort");
        self.execute(req).await.0.map(|_| ())
    }

    /// The ranges of `path` (a blob or a later snapshot) written and cleared
    /// since its snapshot `prev_snapshot` (Get Page Ranges with
    /// `prevsnapshot`), every page of the answer.
    pub async fn get_page_ranges_diff(
        &self,
        path: &BlobPath,
        prev_snapshot: &str,
    ) -> Result<PageRangeDiff> {
        const OP: &str = "get page ranges diff";
        let mut out = PageRangeDiff::default();
        let mut marker: Option<String> = None;
        loop {
            let mut req = Request::new(OP, Method::GET, Resource::Blob(path))
                .query("comp", "pagelist")
                .query("prevsnapshot", prev_snapshot.to_string());
            if let Some(m) = &marker {
                req = req.query("marker", m.clone());
            }
            let resp = self.execute(req).await.0?;
            out.blob_size_bytes = resp
                .header("x-ms-blob-content-length")
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| {
                    Error::other(
                        ErrorKind::Protocol,
                        OP,
                        path.to_string(),
                        "answer lacks x-ms-blob-content-length",
                    )
                })?;
            let (written, cleared, next) = xml::parse_page_diff(&resp.body)
                .map_err(|m| Error::other(ErrorKind::Protocol, OP, path.to_string(), m))?;
            out.written.extend(written);
            out.cleared.extend(cleared);
            match next {
                Some(m) => marker = Some(m),
                None => return Ok(out),
            }
        }
    }
}
