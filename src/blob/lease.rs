//! Blob leases: acquire (infinite or 15-60 s, with a proposed id so a retry
//! is safe), renew, change, release and break. Snapshots cannot be leased.

use reqwest::Method;

use super::client::{BlobClient, Request, Resource, Response};
use super::error::{Error, ErrorKind, Result};
use super::path::BlobPath;

impl BlobClient {
    async fn lease_request(
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
