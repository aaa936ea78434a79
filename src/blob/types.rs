//! Plain data the client returns: listings, properties, page ranges and the
//! lease enums. No behaviour beyond parsing the service's spellings.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::units::ByteRange;

/// The kind of blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum BlobType {
    /// A page blob (holds disks).
    PageBlob,
    /// A block blob.
    BlockBlob,
    /// An append blob.
    AppendBlob,
}

impl BlobType {
    /// Parse the service's spelling (`PageBlob`, `BlockBlob`, `AppendBlob`).
    pub fn parse(s: &str) -> Option<BlobType> {
        match s {
            "PageBlob" => Some(BlobType::PageBlob),
            "BlockBlob" => Some(BlobType::BlockBlob),
            "AppendBlob" => Some(BlobType::AppendBlob),
            _ => None,
        }
    }
}

/// Lease state of a blob or container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LeaseState {
    /// No lease; can be leased.
    Available,
    /// Leased.
    Leased,
    /// A fixed-duration lease ran out.
    Expired,
    /// Being broken; the break period has not ended.
    Breaking,
    /// Broken; can be leased again.
    Broken,
}

impl LeaseState {
    /// Parse the service's spelling (`available`, `leased`, ...).
    pub fn parse(s: &str) -> Option<LeaseState> {
        match s.to_ascii_lowercase().as_str() {
            "available" => Some(LeaseState::Available),
            "leased" => Some(LeaseState::Leased),
            "expired" => Some(LeaseState::Expired),
            "breaking" => Some(LeaseState::Breaking),
            "broken" => Some(LeaseState::Broken),
            _ => None,
        }
    }
}

/// Lease status: is the blob locked?
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LeaseStatus {
    /// A lease is held.
    Locked,
    /// No lease is held.
    Unlocked,
}

impl LeaseStatus {
    /// Parse the service's spelling (`locked`, `unlocked`).
    pub fn parse(s: &str) -> Option<LeaseStatus> {
        match s.to_ascii_lowercase().as_str() {
            "locked" => Some(LeaseStatus::Locked),
            "unlocked" => Some(LeaseStatus::Unlocked),
            _ => None,
        }
    }
}

/// Lease duration of a held lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LeaseDuration {
    /// Never expires (the mount lock).
    Infinite,
    /// 15-60 seconds.
    Fixed,
}

impl LeaseDuration {
    /// Parse the service's spelling (`infinite`, `fixed`).
    pub fn parse(s: &str) -> Option<LeaseDuration> {
        match s.to_ascii_lowercase().as_str() {
            "infinite" => Some(LeaseDuration::Infinite),
            "fixed" => Some(LeaseDuration::Fixed),
            _ => None,
        }
    }
}

/// One container in a listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerItem {
    /// Container name.
    pub name: String,
    /// `Last-Modified`, as the service wrote it.
    pub last_modified: Option<String>,
    /// ETag.
    pub etag: Option<String>,
    /// Lease state of the container.
    pub lease_state: Option<LeaseState>,
    /// Container metadata (only when asked for; empty otherwise).
    pub metadata: BTreeMap<String, String>,
}

/// One blob (or snapshot) in a listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlobItem {
    /// Blob name (decoded).
    pub name: String,
    /// Snapshot time when this entry is a snapshot.
    pub snapshot: Option<String>,
    /// Blob type.
    pub blob_type: Option<BlobType>,
    /// Size in bytes.
    pub content_length: u64,
    /// Lease state.
    pub lease_state: Option<LeaseState>,
    /// Lease status.
    pub lease_status: Option<LeaseStatus>,
    /// Lease duration, when leased.
    pub lease_duration: Option<LeaseDuration>,
    /// ETag.
    pub etag: Option<String>,
    /// `Last-Modified`, as the service wrote it.
    pub last_modified: Option<String>,
    /// `Content-MD5` (base64), if the blob has one.
    pub content_md5: Option<String>,
    /// Metadata (only with `include_metadata`).
    pub metadata: BTreeMap<String, String>,
}

/// Options of one List Blobs call.
#[derive(Debug, Clone, Default)]
pub struct ListBlobsOptions {
    /// Only names starting with this.
    pub prefix: Option<String>,
    /// Group names by this delimiter (usually `/`) into prefixes.
    pub delimiter: Option<String>,
    /// List snapshots too.
    pub include_snapshots: bool,
    /// Return metadata.
    pub include_metadata: bool,
    /// Continue from this marker.
    pub marker: Option<String>,
    /// At most this many entries per page (service default and maximum 5000).
    pub max_results: Option<u32>,
}

/// One page of a blob listing.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BlobListPage {
    /// Blobs (and snapshots) on this page.
    pub blobs: Vec<BlobItem>,
    /// Prefixes (virtual directories) on this page, with `delimiter`.
    pub prefixes: Vec<String>,
    /// Marker of the next page, if there is one.
    pub next_marker: Option<String>,
}

/// A whole blob listing (every page).
#[derive(Debug, Clone, Default, Serialize)]
pub struct BlobListing {
    /// All blobs (and snapshots).
    pub blobs: Vec<BlobItem>,
    /// All prefixes.
    pub prefixes: Vec<String>,
}

/// The result of one Get Page Ranges query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageRangeList {
    /// Ranges holding data, half-open, sorted, as the service returned them.
    pub ranges: Vec<ByteRange>,
    /// Blob size (`x-ms-blob-content-length`).
    pub blob_size_bytes: u64,
}

/// Where a server-side copy (Copy Blob) stands (`x-ms-copy-status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyStatus {
    /// The service is still copying.
    Pending,
    /// Every byte is in the destination.
    Success,
    /// Someone aborted it (Abort Copy Blob).
    Aborted,
    /// The service gave up (the description says why).
    Failed,
    /// A value this version does not know, as the service sent it: not
    /// known to be complete, so treated as a copy that is not.
    Unknown(String),
}

impl CopyStatus {
    /// From the service's spelling (`pending`, `success`, `aborted`,
    /// `failed`; anything else is kept as [`CopyStatus::Unknown`]).
    pub fn parse(s: &str) -> Option<CopyStatus> {
        Some(match s {
            "pending" => CopyStatus::Pending,
            "success" => CopyStatus::Success,
            "aborted" => CopyStatus::Aborted,
            "failed" => CopyStatus::Failed,
            other => CopyStatus::Unknown(other.to_string()),
        })
    }

    /// The service's spelling.
    pub fn as_str(&self) -> &str {
        match self {
            CopyStatus::Pending => "pending",
            CopyStatus::Success => "success",
            CopyStatus::Aborted => "aborted",
            CopyStatus::Failed => "failed",
            CopyStatus::Unknown(s) => s,
        }
    }
}

impl Serialize for CopyStatus {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Properties of a blob or snapshot (Get Blob Properties).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlobProperties {
    /// Blob type.
    pub blob_type: Option<BlobType>,
    /// Size in bytes.
    pub content_length: u64,
    /// ETag.
    pub etag: Option<String>,
    /// `Last-Modified`.
    pub last_modified: Option<String>,
    /// `x-ms-creation-time`.
    pub creation_time: Option<String>,
    /// Lease state.
    pub lease_state: Option<LeaseState>,
    /// Lease status.
    pub lease_status: Option<LeaseStatus>,
    /// Lease duration, when leased.
    pub lease_duration: Option<LeaseDuration>,
    /// `Content-Type`.
    pub content_type: Option<String>,
    /// `Content-MD5` (base64).
    pub content_md5: Option<String>,
    /// Page blob sequence number.
    pub sequence_number: Option<u64>,
    /// `x-ms-copy-status`: how the last Copy Blob into this blob (a copy or
    /// a restore) stands; `None` when it never was a copy destination.
    pub copy_status: Option<CopyStatus>,
    /// Metadata (`x-ms-meta-*`), names in lower case.
    pub metadata: BTreeMap<String, String>,
}
