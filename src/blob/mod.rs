//! Azure Blob REST client: typed operations over HTTP, no cache, no FUSE.
//!
//! `BlobClient` (client.rs) is the one place that builds URLs, signs,
//! sends and retries; the operations are grouped by what they address
//! (`containers.rs`, `blobs.rs`, `lease.rs`). Names and accounts live in
//! `path.rs` and `account.rs`, signing in `auth.rs`, XML in `xml.rs`.

pub mod account;
mod auth;
mod blobs;
pub mod client;
mod containers;
pub mod error;
pub mod fence;
mod lease;
pub mod limiter;
pub mod lineage;
pub mod path;
pub mod probe;
pub mod retry;
pub mod token;
pub mod types;
pub mod xml;

pub use account::{Account, AccountOptions, AuthMode, CaFile, ClientOptions, Credential};
pub use blobs::{CopyState, CopyStatus, PageRangeDiff, CREATE_ID_METADATA};
pub use client::{BlobClient, BodySink, API_VERSION};
pub use error::{Error, ErrorKind, Result};
pub use fence::WriteFence;
pub use lease::RenewedLease;
pub use lineage::{Mark, Refusal, ResumeError, Standing, Taker};
pub use path::BlobPath;
pub use retry::RetryPolicy;
pub use types::{
    BlobItem, BlobListPage, BlobListing, BlobProperties, BlobType, ContainerItem, LeaseDuration,
    LeaseState, LeaseStatus, ListBlobsOptions, PageRangeList,
};
