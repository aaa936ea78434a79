//! The lease as a mount lock: a read-write open holds an infinite lease with
//! a proposed id (so a retried acquire is harmless), every write carries it,
//! and close releases it. A lease found lost on a write is remembered: from
//! then on writes and flushes fail with `LeaseLost`, and the loss is logged at
//! error level once. Read-only and snapshot opens hold no lease.
//!
//! A lease whose release failed (after a durable flush) stays held by its
//! id: this process remembers the id per blob, so a later open of the same
//! blob here proposes it again and gets the lease back instead of finding
//! the drive locked by itself.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use super::counters::{add, Meters};
use super::error::{Error, Result};
use super::store::PageStore;

/// The lease a drive holds (or the absence of one).
pub(crate) struct Lease {
    id: Option<String>,
    lost: AtomicBool,
    target: String,
    /// The blob's identity, under which an unreleased id is remembered.
    key: String,
}

/// Lease ids this process still holds because their release failed, by
/// blob identity.
fn unreleased() -> std::sync::MutexGuard<'static, HashMap<String, String>> {
    static IDS: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    IDS.get_or_init(Default::default)
        .lock()
        .expect("unreleased-lease mutex poisoned")
}

/// The id to propose for the blob known as `key`: the one this process
/// still holds on it, if a release failed, else a new one.
pub(crate) fn proposed_id(key: &str) -> String {
    unreleased()
        .get(key)
        .cloned()
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string())
}

impl Lease {
    /// No lease: read-only and snapshot drives.
    pub fn none(target: &str) -> Self {
        Lease {
            id: None,
            lost: AtomicBool::new(false),
            target: target.to_string(),
            key: String::new(),
        }
    }

    /// Acquire an infinite lease with `proposed_id`; `InUse` when someone
    /// else holds it.
    pub async fn acquire(
        store: &dyn PageStore,
        proposed_id: String,
        target: &str,
        key: &str,
        meters: &Meters,
    ) -> Result<Self> {
        add(&meters.lease, 1);
        match store.acquire_lease(&proposed_id).await {
            Ok(()) => {
                // Only a hint, as everywhere: with the full id, anyone who
                // also has the account's credentials writes past the lock.
                let hint: String = proposed_id.chars().take(8).collect();
                tracing::info!(target = %target, lease_id_hint = %hint, "lease acquired");
                unreleased().remove(key);
                Ok(Lease {
                    id: Some(proposed_id),
                    lost: AtomicBool::new(false),
                    target: target.to_string(),
                    key: key.to_string(),
                })
            }
            Err(e) if e.is_lease_conflict() => Err(Error::InUse {
                target: target.to_string(),
            }),
            Err(e) => Err(Error::Backend(e)),
        }
    }

    /// Take again the lease `id` of a writer lineage that left the blob as
    /// `mark`, only if the blob is still so (`blob/lineage.rs`): a refusal
    /// is [`Error::Fenced`], naming what changed.
    pub async fn resume(
        store: &dyn PageStore,
        id: String,
        mark: &crate::blob::Mark,
        target: &str,
        key: &str,
        meters: &Meters,
    ) -> Result<Self> {
        add(&meters.lease, 1);
        let standing = store.resume_lineage(&id, mark).await?;
        let hint: String = id.chars().take(8).collect();
        tracing::info!(target = %target, lease_id_hint = %hint, ?standing, "lease taken again: the blob is as this attach left it");
        unreleased().remove(key);
        Ok(Lease {
            id: Some(id),
            lost: AtomicBool::new(false),
            target: target.to_string(),
            key: key.to_string(),
        })
    }

    /// The lease id every write must carry.
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// `LeaseLost` once the lease was found lost.
    pub fn check(&self) -> Result<()> {
        if self.lost.load(Ordering::Acquire) {
            Err(self.lost_error())
        } else {
            Ok(())
        }
    }

    /// The error for a lost lease.
    pub fn lost_error(&self) -> Error {
        Error::LeaseLost {
            target: self.target.clone(),
        }
    }

    /// Record that the service refused our lease; logs loudly the first time.
    pub fn mark_lost(&self, cause: &crate::blob::Error) {
        if !self.lost.swap(true, Ordering::AcqRel) {
            crate::metrics::count_lease_lost(&self.target);
            tracing::error!(
                target = %self.target,
                error = %cause,
                "lease lost: the drive was taken over or its lease broken; writes now fail \
                 and unflushed data is kept in memory"
            );
        }
    }

    /// Release the lease (when held and not lost). The store retries a
    /// transient failure for its whole budget; a release that still fails
    /// is `ReleaseFailed` (the data is durable; the lock stays), and the id
    /// is remembered for the next open of this blob in this process.
    pub async fn release(&self, store: &dyn PageStore, meters: &Meters) -> Result<()> {
        let Some(id) = &self.id else { return Ok(()) };
        if self.lost.load(Ordering::Acquire) {
            return Ok(());
        }
        add(&meters.lease, 1);
        match store.release_lease(id).await {
            Ok(()) => {
                tracing::info!(target = %self.target, "lease released");
                Ok(())
            }
            Err(cause) => {
                tracing::error!(target = %self.target, error = %cause, "lease release failed; the data is durable, the drive stays locked");
                unreleased().insert(self.key.clone(), id.clone());
                Err(Error::ReleaseFailed {
                    target: self.target.clone(),
                    cause: Box::new(cause),
                })
            }
        }
    }
}
