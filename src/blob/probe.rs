//! Probes for `blobdrive doctor`: questions to the service that change
//! nothing. Whether the endpoint answers (and its TLS certificate holds) and
//! what its clock says come from one anonymous request; whether the
//! credentials may write or lease a blob comes from requests the service
//! authorizes first and then refuses for a harmless reason:
//!
//! - write: Clear Pages of the 512 bytes just past the blob's end. An
//!   authorized caller gets 416 `InvalidPageRange` (or 412 when another host
//!   holds the lease), never a change: the range is outside the blob.
//! - lease: Release Lease with a random lease id. An authorized caller gets
//!   409 (`LeaseNotPresentWithLeaseOperation` or
//!   `LeaseIdMismatchWithLeaseOperation`); a release with an id nobody holds
//!   cannot free anyone's lease.
//!
//! A 403 `AuthorizationPermissionMismatch` to either means the credentials
//! do not allow it; another 403 means they were refused altogether.

use std::time::{Duration, Instant, SystemTime};

use reqwest::Method;

use super::client::{BlobClient, Request, Resource};
use super::error::{Error, ErrorKind, Result};
use super::path::BlobPath;

/// What the anonymous request to the endpoint found.
#[derive(Debug, Clone)]
pub struct EndpointAnswer {
    /// HTTP status of the answer (any status proves the endpoint answers).
    pub status: u16,
    /// The service's clock minus ours, in seconds (`None` without a `Date`).
    pub clock_skew_secs: Option<i64>,
    /// Round trip of the request.
    pub round_trip: Duration,
    /// `true` when the endpoint is HTTPS (so TLS was verified).
    pub tls: bool,
}

/// Ask `account`'s blob endpoint anything, without credentials, within
/// `timeout`: a transport error says the endpoint is unreachable or its
/// certificate is not trusted; an answer gives its clock.
pub async fn endpoint(client: &BlobClient, timeout: Duration) -> Result<EndpointAnswer> {
    let account = client.account();
    let fail =
        |msg: String| Error::other(ErrorKind::Transport, "reach endpoint", &account.name, msg);
    let builder = reqwest::Client::builder()
        .connect_timeout(timeout)
        .timeout(timeout);
    let http = super::client::trust_ca_file(builder, account)
        .map_err(fail)?
        .build()
        .map_err(|e| fail(format!("cannot build the HTTP client: {}", e.without_url())))?;
    let mut url = account.endpoint.clone();
    url.set_query(Some("comp=list"));
    let started = Instant::now();
    let answer = http.get(url).send().await.map_err(|e| {
        let e = e.without_url();
        let mut chain = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            chain.push_str(": ");
            chain.push_str(&s.to_string());
            source = s.source();
        }
        fail(chain)
    })?;
    let round_trip = started.elapsed();
    let clock_skew_secs = answer
        .headers()
        .get(reqwest::header::DATE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| httpdate::parse_http_date(v).ok())
        .map(|theirs| {
            let ours = SystemTime::now() - round_trip / 2;
            match theirs.duration_since(ours) {
                Ok(ahead) => ahead.as_secs() as i64,
                Err(behind) => -(behind.duration().as_secs() as i64),
            }
        });
    Ok(EndpointAnswer {
        status: answer.status().as_u16(),
        clock_skew_secs,
        round_trip,
        tls: account.endpoint.scheme() == "https",
    })
}

/// Whether the credentials may write pages to `path` of `blob_size_bytes`
/// (see the module doc: nothing is written). `Ok(true)`: allowed;
/// `Ok(false)`: refused with 403; `Err`: the probe itself failed.
pub async fn may_write(client: &BlobClient, path: &BlobPath, blob_size_bytes: u64) -> Result<bool> {
    let start = blob_size_bytes;
    let req = Request::new("probe write", Method::PUT, Resource::Blob(path))
        .query("comp", "page")
        .header("x-ms-page-write", "clear")
        .header("x-ms-range", format!("bytes={start}-{}", start + 511))
        // Never true: a second guard should a service ignore the range.
        .header("if-match", "\"0x0000000000000000\"");
    authorized(client.execute(req).await.0, &[416, 412])
}

/// Whether the credentials may lease `path` (see the module doc: a release
/// with a random id changes nothing).
pub async fn may_lease(client: &BlobClient, path: &BlobPath) -> Result<bool> {
    let req = Request::new("probe lease", Method::PUT, Resource::Blob(path))
        .query("comp", "lease")
        .header("x-ms-lease-action", "release")
        .header("x-ms-lease-id", uuid::Uuid::new_v4().to_string());
    authorized(client.execute(req).await.0, &[409, 412])
}

/// An answer with one of `harmless` statuses, or a success, means authorized.
fn authorized<T>(outcome: Result<T>, harmless: &[u16]) -> Result<bool> {
    match outcome {
        Ok(_) => Ok(true),
        Err(e) if e.status.is_some_and(|s| harmless.contains(&s)) => Ok(true),
        Err(e) if e.code() == Some("AuthorizationPermissionMismatch") => Ok(false),
        Err(e) => Err(e),
    }
}
