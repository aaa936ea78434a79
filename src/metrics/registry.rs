//! The process-wide registry of what a daemon measures per drive beyond the
//! drive's own counters: latency histograms and event counts. Recording is a
//! map lookup under a short lock plus atomic adds; the map holds one entry
//! per drive the process has touched (a handful), never per request.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use super::histogram::{Histogram, HistogramSnapshot};

/// An operation whose duration is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// One Put Page (update) request, retries included.
    PutPage,
    /// One Get Blob (ranged read) request, retries included.
    Get,
    /// One flush of a drive on fsync: every write accepted before it made
    /// durable in the blob.
    Fsync,
}

/// Why a request was retried, as the `reason` label shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum RetryReason {
    /// The service asked us to slow down: 503, 500 `ServerBusy`, or 429.
    Throttled,
    /// Another 5xx answer, or 408.
    ServerError,
    /// No answer: connection refused or reset, a timeout, a short body.
    Transport,
}

impl RetryReason {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            RetryReason::Throttled => "throttled",
            RetryReason::ServerError => "server_error",
            RetryReason::Transport => "transport",
        }
    }

    /// Classify a failure that is about to be retried, by the HTTP status
    /// of its answer (`None`: no answer) and the service's error code.
    pub fn of(status: Option<u16>, code: Option<&str>) -> Self {
        match (status, code) {
            (Some(503 | 429), _) | (Some(500), Some("ServerBusy")) => RetryReason::Throttled,
            (Some(_), _) => RetryReason::ServerError,
            (None, _) => RetryReason::Transport,
        }
    }

    /// Every reason, in label order.
    pub const ALL: [RetryReason; 3] = [
        RetryReason::Throttled,
        RetryReason::ServerError,
        RetryReason::Transport,
    ];
}

/// What is measured for one drive.
#[derive(Debug, Default)]
pub struct DriveMetrics {
    /// Put Page (update) latency.
    pub put_page: Histogram,
    /// Get Blob latency.
    pub get: Histogram,
    /// fsync (drive flush) latency.
    pub fsync: Histogram,
    /// Retries by [`RetryReason`] (index = position in `RetryReason::ALL`).
    retries: [AtomicU64; 3],
    /// Times the drive's lease was found lost (broken or taken over).
    pub leases_lost: AtomicU64,
    /// Recovery files written for data that could not be flushed.
    pub recovery_files: AtomicU64,
}

/// A copy of [`DriveMetrics`] for printing.
#[derive(Debug, Clone, PartialEq)]
pub struct DriveSnapshot {
    /// Put Page latency.
    pub put_page: HistogramSnapshot,
    /// Get latency.
    pub get: HistogramSnapshot,
    /// fsync latency.
    pub fsync: HistogramSnapshot,
    /// Retries by reason, in `RetryReason::ALL` order.
    pub retries: Vec<(RetryReason, u64)>,
    /// Leases lost.
    pub leases_lost: u64,
    /// Recovery files written.
    pub recovery_files: u64,
}

impl DriveMetrics {
    fn snapshot(&self) -> DriveSnapshot {
        DriveSnapshot {
            put_page: self.put_page.snapshot(),
            get: self.get.snapshot(),
            fsync: self.fsync.snapshot(),
            retries: RetryReason::ALL
                .iter()
                .zip(&self.retries)
                .map(|(r, n)| (*r, n.load(Ordering::Relaxed)))
                .collect(),
            leases_lost: self.leases_lost.load(Ordering::Relaxed),
            recovery_files: self.recovery_files.load(Ordering::Relaxed),
        }
    }
}

/// Every drive's metrics, by drive name (`container/blob`).
#[derive(Debug, Default)]
pub struct Registry {
    drives: Mutex<BTreeMap<String, Arc<DriveMetrics>>>,
}

impl Registry {
    /// The metrics of `drive`, made on first use.
    pub fn drive(&self, drive: &str) -> Arc<DriveMetrics> {
        let mut drives = self
            .drives
            .lock()
            .expect("metrics registry lock poisoned: a panic happened while holding it");
        if let Some(m) = drives.get(drive) {
            return m.clone();
        }
        let m = Arc::new(DriveMetrics::default());
        drives.insert(drive.to_string(), m.clone());
        m
    }

    /// A copy of every drive's metrics, by name.
    pub fn snapshot(&self) -> BTreeMap<String, DriveSnapshot> {
        let drives = self
            .drives
            .lock()
            .expect("metrics registry lock poisoned: a panic happened while holding it");
        drives
            .iter()
            .map(|(name, m)| (name.clone(), m.snapshot()))
            .collect()
    }
}

static REGISTRY: LazyLock<Registry> = LazyLock::new(Registry::default);

/// The process's registry.
pub fn registry() -> &'static Registry {
    &REGISTRY
}

/// Record that `op` on `drive` took `elapsed`.
pub fn observe(drive: &str, op: Operation, elapsed: Duration) {
    let m = registry().drive(drive);
    let h = match op {
        Operation::PutPage => &m.put_page,
        Operation::Get => &m.get,
        Operation::Fsync => &m.fsync,
    };
    h.observe(elapsed);
}

/// Record that a request on `target` failed (with HTTP `status` and service
/// error `code`, when it was answered) and is retried.
pub fn count_retry(target: &str, status: Option<u16>, code: Option<&str>) {
    let reason = RetryReason::of(status, code);
    let slot = RetryReason::ALL
        .iter()
        .position(|r| *r == reason)
        .expect("every reason is in RetryReason::ALL");
    registry().drive(target).retries[slot].fetch_add(1, Ordering::Relaxed);
}

/// Record that the lease of `drive` was found lost.
pub fn count_lease_lost(drive: &str) {
    registry()
        .drive(drive)
        .leases_lost
        .fetch_add(1, Ordering::Relaxed);
}

/// Record that a recovery file was written for `drive`.
pub fn count_recovery_file(drive: &str) {
    registry()
        .drive(drive)
        .recovery_files
        .fetch_add(1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttling_is_told_apart_from_other_server_errors() {
        assert_eq!(RetryReason::of(Some(503), None), RetryReason::Throttled);
        assert_eq!(RetryReason::of(Some(429), None), RetryReason::Throttled);
        assert_eq!(
            RetryReason::of(Some(500), Some("ServerBusy")),
            RetryReason::Throttled
        );
        assert_eq!(
            RetryReason::of(Some(500), Some("InternalError")),
            RetryReason::ServerError
        );
        assert_eq!(RetryReason::of(None, None), RetryReason::Transport);
    }

    #[test]
    fn events_are_counted_per_drive() {
        let r = Registry::default();
        r.drive("c/one").leases_lost.fetch_add(1, Ordering::Relaxed);
        r.drive("c/two").get.observe(Duration::from_millis(3));
        let s = r.snapshot();
        assert_eq!(s["c/one"].leases_lost, 1);
        assert_eq!(s["c/one"].get.count, 0);
        assert_eq!(s["c/two"].get.count, 1);
    }
}
