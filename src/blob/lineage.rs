//! The fencing epoch of a writer lineage: the one place that decides
//! whether a blob is still as a lineage of writers left it.
//!
//! A *lineage* is the writers of one attach under its one lease id: its
//! serving process, the successors that take over after a crash or an
//! upgrade, the salvage of what they leave, and a recovery file saved from
//! them. Its *mark* ([`Mark`]) is what it left the blob as: the sequence
//! number it raised the blob to (its *epoch*: every blobdrive writer
//! raises the number before its first write, `fence.rs`) and the ETag its
//! own last change returned (the fence keeps both and reports them, so the
//! attach's state, the disk tier and recovery files record them).
//!
//! The rule: nothing that would put a lineage's old data into the blob, or
//! trust old data of it (a takeover's replay of the write log, a salvage,
//! `recover`, an upgrade), goes ahead unless [`BlobClient::resume_lineage`]
//! says the blob is still as the lineage left it:
//! - its lease is still held under the lineage's id: no one else can have
//!   written since, because every retake of that lease is itself checked
//!   here; or
//! - the lease is free (released, or broken by someone), the sequence
//!   number is still the lineage's epoch (another blobdrive writer would
//!   have raised it) and the ETag is the one the lineage's own last change
//!   returned (any other writer changes it: a VM, AzCopy, an SDK, which
//!   never touch the number). The lease is then taken again with
//!   `If-Match` on that ETag, so nothing can come between the check and
//!   the lease.
//!
//! Anything else is a refusal ([`Refusal`]) that names what changed. A
//! lineage whose last change has no known ETag (a write's outcome was
//! unknown when it stopped) cannot show the blob is unchanged once its
//! lease is gone: that too is a refusal, never a guess. The disk tier asks
//! [`BlobClient::state_under_lease`] instead: it is recorded clean only at
//! a state read under the lease, which proves the lineage still held it.

use reqwest::Method;

use super::client::{BlobClient, Request, Resource};
use super::error::{Error, Result};
pub use super::fence::Mark;
use super::path::BlobPath;
use super::types::LeaseState;

/// How a lineage found its blob when it resumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Its lease was still held under its id.
    StillHeld,
    /// The lease was free and the blob unchanged since the mark; the lease
    /// is held again.
    AsLeft,
}

/// Why a lineage may not resume: what changed since it left the blob.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Another blobdrive writer raised the sequence number.
    #[error(
        "another blobdrive host wrote to {target} after this one lost it: its sequence number \
         is {now}, past the {left} this host left"
    )]
    EpochPassed {
        /// The blob.
        target: String,
        /// The lineage's epoch.
        left: u64,
        /// The blob's number now.
        now: u64,
    },
    /// Another writer changed the blob (its ETag).
    #[error(
        "{target} was changed after this host lost it: its ETag is {now}, not the {left} of \
         this host's last write"
    )]
    EtagChanged {
        /// The blob.
        target: String,
        /// The ETag of the lineage's last change.
        left: String,
        /// The blob's ETag now.
        now: String,
    },
    /// Another lease holder has the blob.
    #[error("{target} is leased by another host")]
    LeasedElsewhere {
        /// The blob.
        target: String,
    },
    /// The lineage still holds the lease: the host it ran on may still be
    /// writing.
    #[error(
        "{target} is still leased by the mount that saved this data; if that mount is gone \
         (its daemon ended, its host is down), add --break-lease"
    )]
    HeldByLineage {
        /// The blob.
        target: String,
    },
    /// The lease is gone and what the lineage left is not known.
    #[error(
        "{target} is no longer leased by this host, and the state this host left it in is not \
         known (its last write's outcome was unknown, or it was saved by an older blobdrive): \
         whether someone wrote since cannot be told"
    )]
    NotRecorded {
        /// The blob.
        target: String,
    },
}

/// Who takes a lineage's blob again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taker {
    /// A successor of the lineage on its host (the dead serving process's
    /// holder started it): it takes the lineage's own lease id again, and
    /// a lease still held under it is its own.
    Successor,
    /// `recover` of a file saved from the lineage: under a new lease id.
    /// A lease the lineage still holds may belong to a mount that is still
    /// writing, so it is broken only when `break_held` (the operator says
    /// that mount is gone); so is a lease another host holds.
    Recovery {
        /// The lease id `recover` holds from then on.
        lease_id: String,
        /// Break a lease found held.
        break_held: bool,
    },
}

/// A resume that could not be decided or was refused.
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    /// The blob changed since the lineage left it.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The service could not be asked.
    #[error(transparent)]
    Backend(#[from] Error),
}

impl Mark {
    /// Whether the blob, found with number `seq` and ETag `etag`, is as this
    /// mark left it; the refusal names what differs.
    pub fn compare(
        &self,
        target: &str,
        seq: Option<u64>,
        etag: Option<&str>,
    ) -> std::result::Result<(), Refusal> {
        if let (Some(left), Some(now)) = (self.epoch, seq) {
            if now != left {
                return Err(Refusal::EpochPassed {
                    target: target.to_string(),
                    left,
                    now,
                });
            }
        }
        let Some(left) = &self.etag else {
            return Err(Refusal::NotRecorded {
                target: target.to_string(),
            });
        };
        if etag != Some(left.as_str()) {
            return Err(Refusal::EtagChanged {
                target: target.to_string(),
                left: left.clone(),
                now: etag.unwrap_or("none").to_string(),
            });
        }
        Ok(())
    }
}

/// The service's answer to a request carrying a lease id that is not the
/// blob's active one.
fn lease_not_ours(e: &Error) -> Option<bool> {
    match e.code() {
        // Free: released or broken.
        Some("LeaseNotPresentWithBlobOperation") | Some("LeaseLost") => Some(false),
        // Held, under another id.
        Some("LeaseIdMismatchWithBlobOperation") => Some(true),
        _ => None,
    }
}

impl BlobClient {
    /// The blob's sequence number and ETag, read with `lease_id` as a
    /// condition: answered only while that lease is the blob's active one,
    /// so the state is one no one else can have changed while it was held.
    pub async fn state_under_lease(&self, path: &BlobPath, lease_id: &str) -> Result<Mark> {
        let req = Request::new("get properties", Method::HEAD, Resource::Blob(path))
            .lease(Some(lease_id));
        let resp = self.execute(req).await.0?;
        Ok(Mark {
            epoch: resp
                .header("x-ms-blob-sequence-number")
                .and_then(|v| v.parse().ok()),
            etag: resp.header("etag").map(str::to_string),
        })
    }

    /// Takes `path` again for the lineage whose lease id is `lineage_id`
    /// and which left it as `mark`, only if the blob is still as it was
    /// left (the rules are in this module's head): as its successor under
    /// that id, or for a recovery under a new one. On a refusal no lease
    /// is taken (one broken for a recovery stays broken).
    pub async fn resume_lineage(
        &self,
        path: &BlobPath,
        lineage_id: &str,
        mark: &Mark,
        taker: &Taker,
    ) -> std::result::Result<Standing, ResumeError> {
        let target = path.to_string();
        let elsewhere = || Refusal::LeasedElsewhere {
            target: target.clone(),
        };
        let (lease_id, break_held) = match taker {
            Taker::Successor => (lineage_id, false),
            Taker::Recovery {
                lease_id,
                break_held,
            } => (lease_id.as_str(), *break_held),
        };
        // The state the lease-holding lineage left, when it still holds it.
        let mut held_at: Option<Mark> = None;
        // Leased by someone else.
        let mut other_lease = false;
        match self.state_under_lease(path, lineage_id).await {
            Ok(now) => match taker {
                Taker::Successor => {
                    // Held all along, and the lineage's infinite lease: not
                    // taken again, since an acquire would also succeed on a
                    // lease someone broke since this read. If that happened,
                    // the successor's first write fails on the lease, and
                    // its next takeover finds the lease free and compares.
                    return Ok(Standing::StillHeld);
                }
                Taker::Recovery { .. } if !break_held => {
                    return Err(Refusal::HeldByLineage { target }.into())
                }
                Taker::Recovery { .. } => held_at = Some(now),
            },
            Err(e) => match lease_not_ours(&e) {
                Some(true) if !break_held => return Err(elsewhere().into()),
                Some(held) => other_lease = held,
                None => return Err(e.into()),
            },
        }
        if break_held && (held_at.is_some() || other_lease) {
            self.break_lease(path, Some(0)).await?;
        }
        let props = self.get_properties(path).await?;
        if props.lease_state == Some(LeaseState::Leased) {
            return Err(elsewhere().into());
        }
        // A lease the lineage held until the break above proves no one else
        // wrote: the state read under it is what the lineage left, unless
        // the lineage itself wrote after the file was saved (a successor
        // raises the epoch, and any change of the ETag the file knows).
        if let Some(held) = &held_at {
            let since_save = Mark {
                epoch: mark.epoch,
                etag: mark.etag.clone().or_else(|| held.etag.clone()),
            };
            since_save.compare(&target, held.epoch, held.etag.as_deref())?;
        }
        let expected = held_at.as_ref().unwrap_or(mark);
        expected.compare(&target, props.sequence_number, props.etag.as_deref())?;
        let etag = expected.etag.clone().unwrap_or_default();
        let taken = self
            .lease_request(
                "acquire lease",
                path,
                "acquire",
                &[
                    ("x-ms-lease-duration", "-1".to_string()),
                    ("x-ms-proposed-lease-id", lease_id.to_string()),
                    ("if-match", etag.clone()),
                ],
            )
            .await
            .0;
        match taken {
            Ok(_) if held_at.is_some() => Ok(Standing::StillHeld),
            Ok(_) => Ok(Standing::AsLeft),
            Err(e) if e.status == Some(412) => {
                // Changed between the read and the lease: say how.
                let now = self.get_properties(path).await?;
                expected.compare(&target, now.sequence_number, now.etag.as_deref())?;
                Err(Refusal::EtagChanged {
                    target,
                    left: etag,
                    now: now.etag.unwrap_or_default(),
                }
                .into())
            }
            Err(e) if e.is_lease_conflict() => Err(elsewhere().into()),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(epoch: u64, etag: &str) -> Mark {
        Mark {
            epoch: Some(epoch),
            etag: Some(etag.into()),
        }
    }

    #[test]
    fn a_blob_as_left_compares_equal_and_each_change_is_named() {
        let m = mark(5, "\"e1\"");
        assert_eq!(m.compare("c/d", Some(5), Some("\"e1\"")), Ok(()));
        let raised = m.compare("c/d", Some(6), Some("\"e2\"")).unwrap_err();
        assert!(matches!(
            raised,
            Refusal::EpochPassed {
                left: 5,
                now: 6,
                ..
            }
        ));
        assert!(
            raised.to_string().contains("another blobdrive host"),
            "{raised}"
        );
        let changed = m.compare("c/d", Some(5), Some("\"e9\"")).unwrap_err();
        assert!(changed.to_string().contains("\"e9\""), "{changed}");
        let unknown = Mark {
            epoch: Some(5),
            etag: None,
        };
        assert!(matches!(
            unknown.compare("c/d", Some(5), Some("\"e1\"")),
            Err(Refusal::NotRecorded { .. })
        ));
    }
}
