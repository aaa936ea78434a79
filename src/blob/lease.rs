//! Blob leases: acquire (infinite or 15-60 s, with a proposed id so a retry
//! is safe), renew, change, release and break. Snapshots cannot be leased.
//!
//! [`RenewedLease`] is a fixed-duration lease kept by a background renewal
//! for as long as an operation runs (`restore`, the offline `resize`): a
//! process killed with SIGKILL cannot release a lease, and a fixed one that
//! nobody renews expires by itself within its duration, where an infinite
//! one would lock the blob until someone breaks it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;

use super::client::{BlobClient, Request, Resource, Response};
use super::error::{Error, ErrorKind, Result};
use super::path::BlobPath;
use super::retry::RetryPolicy;

impl BlobClient {
    pub(super) async fn lease_request(
        &self,
        op: &'static str,
        path: &BlobPath,
        action: &str,
        headers: &[(&str, String)],
    ) -> (Result<Response>, u32) {
        if path.snapshot.is_some() {
            let e = Error::other(
                ErrorKind::InvalidInput,
                op,
                path.to_string(),
                "a snapshot cannot be leased",
            );
            return (Err(e), 0);
        }
        let mut req = Request::new(op, Method::PUT, Resource::Blob(path))
            .query("comp", "lease")
            .header("x-ms-lease-action", action);
        for (k, v) in headers {
            req = req.header(k, v.clone());
        }
        self.execute(req).await
    }

    /// Acquire a lease with `proposed_id` (a GUID) for `duration_secs`
    /// (15-60) or forever (`None`). Acquiring again with the id already held
    /// succeeds. Returns the lease id.
    pub async fn acquire_lease(
        &self,
        path: &BlobPath,
        proposed_id: &str,
        duration_secs: Option<u32>,
    ) -> Result<String> {
        const OP: &str = "acquire lease";
        let duration = match duration_secs {
            None => "-1".to_string(),
            Some(s) if (15..=60).contains(&s) => s.to_string(),
            Some(s) => {
                return Err(Error::other(
                    ErrorKind::InvalidInput,
                    OP,
                    path.to_string(),
                    format!("lease duration must be 15-60 s or infinite, not {s}"),
                ))
            }
        };
        let resp = self
            .lease_request(
                OP,
                path,
                "acquire",
                &[
                    ("x-ms-lease-duration", duration),
                    ("x-ms-proposed-lease-id", proposed_id.to_string()),
                ],
            )
            .await
            .0?;
        Ok(resp
            .header("x-ms-lease-id")
            .unwrap_or(proposed_id)
            .to_string())
    }

    /// Renew the lease `lease_id`.
    pub async fn renew_lease(&self, path: &BlobPath, lease_id: &str) -> Result<()> {
        self.lease_request(
            "renew lease",
            path,
            "renew",
            &[("x-ms-lease-id", lease_id.into())],
        )
        .await
        .0
        .map(|_| ())
    }

    /// Change the lease `lease_id` to `proposed_id`; returns the new id.
    pub async fn change_lease(
        &self,
        path: &BlobPath,
        lease_id: &str,
        proposed_id: &str,
    ) -> Result<String> {
        let resp = self
            .lease_request(
                "change lease",
                path,
                "change",
                &[
                    ("x-ms-lease-id", lease_id.into()),
                    ("x-ms-proposed-lease-id", proposed_id.into()),
                ],
            )
            .await
            .0?;
        Ok(resp
            .header("x-ms-lease-id")
            .unwrap_or(proposed_id)
            .to_string())
    }

    /// Release the lease `lease_id`.
    pub async fn release_lease(&self, path: &BlobPath, lease_id: &str) -> Result<()> {
        match self
            .lease_request(
                "release lease",
                path,
                "release",
                &[("x-ms-lease-id", lease_id.into())],
            )
            .await
        {
            (Ok(_), _) => Ok(()),
            // A retry after a first attempt that did release it.
            (Err(e), attempts)
                if attempts > 1 && e.code() == Some("LeaseNotPresentWithLeaseOperation") =>
            {
                Ok(())
            }
            (Err(e), _) => Err(e),
        }
    }

    /// Break the lease, whoever holds it, after `period_secs` (0-60; `None`:
    /// the service default, immediately for an infinite lease). Returns the
    /// seconds left until the blob can be leased again.
    pub async fn break_lease(&self, path: &BlobPath, period_secs: Option<u32>) -> Result<u32> {
        const OP: &str = "break lease";
        let mut headers = Vec::new();
        if let Some(p) = period_secs {
            if p > 60 {
                return Err(Error::other(
                    ErrorKind::InvalidInput,
                    OP,
                    path.to_string(),
                    format!("break period must be 0-60 s, not {p}"),
                ));
            }
            headers.push(("x-ms-lease-break-period", p.to_string()));
        }
        let resp = self.lease_request(OP, path, "break", &headers).await.0?;
        Ok(resp
            .header("x-ms-lease-time")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0))
    }
}

/// A fixed-duration lease held by this process on one blob and renewed in
/// the background every quarter of its duration (so that two renewals lost
/// to a short outage still leave it held), until [`RenewedLease::release`]
/// or [`RenewedLease::abandon`]. Dropped without either, it stops being
/// renewed and expires by itself.
///
/// The requests made under it must carry its id: one that lands after the
/// release, or after the lease expired, is then refused by the service. A
/// renewal that finds the lease gone (broken or taken by someone) is logged
/// at error level and the renewals stop; the next request under it fails.
#[derive(Debug)]
pub struct RenewedLease {
    client: BlobClient,
    path: BlobPath,
    id: String,
    secs: u32,
    lost: Arc<AtomicBool>,
    renewer: tokio::task::JoinHandle<()>,
}

impl RenewedLease {
    /// Acquires a lease of `secs` (15-60) on `path` with a new id and starts
    /// renewing it. The error is the service's (a lease conflict when
    /// someone holds it).
    pub async fn acquire(client: &BlobClient, path: &BlobPath, secs: u32) -> Result<Self> {
        let id = uuid::Uuid::new_v4().to_string();
        client.acquire_lease(path, &id, Some(secs)).await?;
        tracing::debug!(blob = %path, seconds = secs, "renewed lease acquired");
        let every = Duration::from_secs(u64::from(secs / 4));
        let lost = Arc::new(AtomicBool::new(false));
        let renewer = tokio::spawn(renew(
            renewal_client(client, every),
            path.clone(),
            id.clone(),
            every,
            lost.clone(),
        ));
        Ok(RenewedLease {
            client: client.clone(),
            path: path.clone(),
            id,
            secs,
            lost,
            renewer,
        })
    }

    /// The lease id every request under the lease carries.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Its duration in seconds: how long it outlives a process that can no
    /// longer renew it.
    pub fn secs(&self) -> u32 {
        self.secs
    }

    /// Stops renewing and releases the lease (nothing to do when a renewal
    /// found it gone). On an error the lease expires by itself within
    /// [`Self::secs`].
    pub async fn release(self) -> Result<()> {
        self.renewer.abort();
        if self.lost.load(Ordering::Acquire) {
            return Ok(());
        }
        self.client.release_lease(&self.path, &self.id).await?;
        tracing::debug!(blob = %self.path, "renewed lease released");
        Ok(())
    }

    /// Stops renewing without releasing: the blob stays locked until the
    /// lease expires, within [`Self::secs`]. For an operation that cannot
    /// tell whether the service is still changing the blob.
    pub fn abandon(self) {
        self.renewer.abort();
        tracing::debug!(blob = %self.path, "renewed lease left to expire");
    }
}

impl Drop for RenewedLease {
    fn drop(&mut self) {
        // `release` and `abandon` aborted it already; a lease dropped on an
        // unexpected path must not be renewed for ever either.
        self.renewer.abort();
    }
}

/// The client the renewals use: one renewal gives up within a renewal
/// period, so that the next one starts while the lease still holds.
fn renewal_client(client: &BlobClient, every: Duration) -> BlobClient {
    let policy = client.retry_policy();
    client.clone().with_retry(RetryPolicy {
        max_total: policy.max_total.min(every),
        attempt_timeout: policy.attempt_timeout.min(every),
        ..policy
    })
}

/// Renews the lease `id` every `every` until aborted; stops when the
/// service says the lease is gone.
async fn renew(
    client: BlobClient,
    path: BlobPath,
    id: String,
    every: Duration,
    lost: Arc<AtomicBool>,
) {
    loop {
        tokio::time::sleep(every).await;
        match client.renew_lease(&path, &id).await {
            Ok(()) => tracing::trace!(blob = %path, "lease renewed"),
            Err(e) if e.is_lease_lost() || e.is_lease_conflict() || e.is_not_found() => {
                lost.store(true, Ordering::Release);
                tracing::error!(
                    blob = %path,
                    error = %e,
                    "the lease is gone (broken or taken by someone else); the next request under it will be refused"
                );
                return;
            }
            Err(e) => tracing::warn!(
                blob = %path,
                error = %e,
                "could not renew the lease; trying again in {} s",
                every.as_secs()
            ),
        }
    }
}
