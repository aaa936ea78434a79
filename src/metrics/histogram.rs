//! A lock-free latency histogram with fixed buckets, in the shape Prometheus
//! expects (cumulative bucket counts, a sum and a count).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the buckets, in seconds: from a fast local round trip
/// (1 ms) to a request that spent its retry budget (2 minutes).
pub const BUCKET_BOUNDS_SECS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// Durations seen by one operation of one drive.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); the last slot is `+Inf`.
    buckets: [AtomicU64; BUCKET_BOUNDS_SECS.len() + 1],
    /// Sum of all observations in microseconds (integer, so it can be atomic).
    sum_micros: AtomicU64,
    count: AtomicU64,
}

/// A consistent-enough copy of a [`Histogram`] for printing.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// Cumulative counts: observations at most `BUCKET_BOUNDS_SECS[i]`; the
    /// last entry is the `+Inf` bucket and equals `count`.
    pub cumulative: Vec<u64>,
    /// Sum of the observations, in seconds.
    pub sum_secs: f64,
    /// Number of observations.
    pub count: u64,
}

impl Histogram {
    /// Record one duration.
    pub fn observe(&self, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        let slot = BUCKET_BOUNDS_SECS
            .iter()
            .position(|&bound| secs <= bound)
            .unwrap_or(BUCKET_BOUNDS_SECS.len());
        self.buckets[slot].fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// A copy for printing. The `+Inf` bucket is computed from the buckets,
    /// so the printed histogram is always self-consistent even while
    /// observations race with the copy.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut cumulative = Vec::with_capacity(self.buckets.len());
        let mut running = 0u64;
        for bucket in &self.buckets {
            running += bucket.load(Ordering::Relaxed);
            cumulative.push(running);
        }
        HistogramSnapshot {
            count: running,
            cumulative,
            sum_secs: self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_cumulative_buckets() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(500)); // <= 1 ms
        h.observe(Duration::from_millis(20)); // <= 25 ms
        h.observe(Duration::from_secs(500)); // +Inf only
        let s = h.snapshot();
        assert_eq!(s.count, 3);
        assert_eq!(s.cumulative[0], 1);
        assert_eq!(s.cumulative[4], 2);
        assert_eq!(s.cumulative[BUCKET_BOUNDS_SECS.len() - 1], 2);
        assert_eq!(*s.cumulative.last().unwrap(), 3);
        assert!((s.sum_secs - 500.0205).abs() < 1e-6, "{}", s.sum_secs);
    }
}
