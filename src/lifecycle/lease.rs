//! The lease a lifecycle operation holds on a drive while it changes it
//! (`restore`, the offline `resize`): a fixed lease of [`LEASE_SECS`],
//! renewed in the background while the operation runs, and released when it
//! ends, whether it succeeded, failed or was interrupted (the commands turn
//! SIGINT and SIGTERM into a cancel that ends here too).
//!
//! Why not an infinite lease, as a mount holds (`drive/lease.rs`): a process
//! killed with SIGKILL, or a host that died, cannot release it, and an
//! infinite lease would leave the drive "mounted" until someone breaks it by
//! hand. A fixed lease that nobody renews expires by itself within its
//! duration; the drive is then free again.
//!
//! Invariants: every request the operation sends under the lease carries its
//! id, so one that lands after the release (or after the lease expired) is
//! refused by the service rather than applied; a renewal that finds the
//! lease gone (broken by someone) is logged at error level, and the next
//! request of the operation fails on its own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::blob::{BlobClient, BlobPath, Error as BlobError, RetryPolicy};

/// How long the lease lasts without a renewal: what a killed operation
/// leaves behind at most. The service allows 15-60 s.
pub const LEASE_SECS: u32 = 60;

/// How often the lease is renewed: a quarter of its duration, so that two
/// renewals lost to a short outage still leave it held.
const RENEW_EVERY: Duration = Duration::from_secs(LEASE_SECS as u64 / 4);

/// A fixed lease held by this process on one drive, renewed by a background
/// task until [`OperationLease::release`] or [`OperationLease::abandon`].
/// Dropped without either, it stops being renewed and expires by itself.
#[derive(Debug)]
pub struct OperationLease {
    client: BlobClient,
    path: BlobPath,
    id: String,
    lost: Arc<AtomicBool>,
    renewer: tokio::task::JoinHandle<()>,
}

impl OperationLease {
    /// Acquires a lease of [`LEASE_SECS`] on `path` with a new id and starts
    /// renewing it. The error is the service's (a lease conflict when
    /// someone holds it).
    pub async fn acquire(client: &BlobClient, path: &BlobPath) -> Result<Self, BlobError> {
        let id = uuid::Uuid::new_v4().to_string();
        client.acquire_lease(path, &id, Some(LEASE_SECS)).await?;
        tracing::debug!(drive = %path, seconds = LEASE_SECS, "lease acquired for the operation");
        let lost = Arc::new(AtomicBool::new(false));
        let renewer = tokio::spawn(renew(
            renewal_client(client),
            path.clone(),
            id.clone(),
            lost.clone(),
        ));
        Ok(OperationLease {
            client: client.clone(),
            path: path.clone(),
            id,
            lost,
            renewer,
        })
    }

    /// The lease id every request of the operation carries.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Stops renewing and releases the lease. A release that fails is
    /// logged, not returned: the operation's own result is what the caller
    /// reports, and the lease expires by itself within [`LEASE_SECS`].
    pub async fn release(self) {
        self.renewer.abort();
        if self.lost.load(Ordering::Acquire) {
            return;
        }
        match self.client.release_lease(&self.path, &self.id).await {
            Ok(()) => tracing::debug!(drive = %self.path, "operation lease released"),
            Err(e) => tracing::warn!(
                drive = %self.path,
                error = %e,
                "could not release the lease; it expires by itself within {LEASE_SECS} s"
            ),
        }
    }

    /// Stops renewing without releasing: the lease keeps the drive locked
    /// until it expires, within [`LEASE_SECS`]. For an operation that cannot
    /// tell whether the service is still changing the drive.
    pub fn abandon(self) {
        self.renewer.abort();
        tracing::debug!(
            drive = %self.path,
            "the lease is left to expire by itself within {LEASE_SECS} s"
        );
    }
}

impl Drop for OperationLease {
    fn drop(&mut self) {
        // `release` and `abandon` aborted it already; a lease dropped on an
        // unexpected path must not be renewed for ever either.
        self.renewer.abort();
    }
}

/// The client the renewals use: one renewal gives up within a renewal
/// period, so that the next one starts while the lease still holds.
fn renewal_client(client: &BlobClient) -> BlobClient {
    let policy = client.retry_policy();
    client.clone().with_retry(RetryPolicy {
        max_total: policy.max_total.min(RENEW_EVERY),
        attempt_timeout: policy.attempt_timeout.min(RENEW_EVERY),
        ..policy
    })
}

/// Renews the lease every [`RENEW_EVERY`] until aborted; stops when the
/// service says the lease is gone (someone broke or took it).
async fn renew(client: BlobClient, path: BlobPath, id: String, lost: Arc<AtomicBool>) {
    loop {
        tokio::time::sleep(RENEW_EVERY).await;
        match client.renew_lease(&path, &id).await {
            Ok(()) => tracing::trace!(drive = %path, "operation lease renewed"),
            Err(e) if e.is_lease_lost() || e.is_lease_conflict() || e.is_not_found() => {
                lost.store(true, Ordering::Release);
                tracing::error!(
                    drive = %path,
                    error = %e,
                    "the operation's lease is gone (broken or taken by someone else); its next request will be refused"
                );
                return;
            }
            Err(e) => tracing::warn!(
                drive = %path,
                error = %e,
                "could not renew the operation's lease; trying again in {} s",
                RENEW_EVERY.as_secs()
            ),
        }
    }
}
