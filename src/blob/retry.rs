//! The one retry policy of the blob layer: exponential backoff with jitter
//! for transient failures (5xx, 408, 429, timeouts, connection faults, short
//! bodies), never for other 4xx, within a bounded number of attempts and a
//! bounded total time. Each attempt also has its own timeout, so a dead
//! connection never hangs a caller.

use std::time::Duration;

use rand::Rng as _;

/// How failed requests are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (1 = no retry).
    pub max_attempts: u32,
    /// Delay before the first retry; doubles each time.
    pub base_delay: Duration,
    /// Ceiling of one delay.
    pub max_delay: Duration,
    /// No retry starts after this much time since the first attempt.
    pub max_total: Duration,
    /// Time limit of one attempt (connect, send, and read the whole body).
    pub attempt_timeout: Duration,
}

impl Default for RetryPolicy {
    /// 8 attempts, 200 ms doubling to at most 10 s, 2 minutes in all, 60 s
    /// per attempt (a 4 MiB Put Page on a slow link fits in it).
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 8,
            base_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(10),
            max_total: Duration::from_secs(120),
            attempt_timeout: Duration::from_secs(60),
        }
    }
}

/// Environment variable that bounds the total retry time, in seconds (tests
/// and impatient users; each attempt is bounded by it too).
pub const RETRY_TOTAL_ENV: &str = "BLOBDRIVE_RETRY_TOTAL_SECS";

impl RetryPolicy {
    /// The default policy, with `max_total` (and the per-attempt limit, which
    /// never exceeds it) from `BLOBDRIVE_RETRY_TOTAL_SECS` when set: the one
    /// place that variable is read.
    pub fn from_env() -> Self {
        let mut p = RetryPolicy::default();
        if let Some(secs) = std::env::var(RETRY_TOTAL_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|&s| s > 0)
        {
            p.max_total = Duration::from_secs(secs);
            p.attempt_timeout = p.attempt_timeout.min(p.max_total);
        }
        p
    }

    /// No retries at all.
    pub fn none() -> Self {
        RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        }
    }

    /// The delay before retry number `retry` (1-based): "equal jitter", a
    /// random value between half and all of `base * 2^(retry-1)`, capped.
    pub fn delay(&self, retry: u32) -> Duration {
        let exp = self
            .base_delay
            .saturating_mul(1u32 << (retry.saturating_sub(1)).min(20));
        let cap = exp.min(self.max_delay);
        let half = cap / 2;
        let jitter_ms = rand::rng().random_range(0..=half.as_millis().max(1) as u64);
        half + Duration::from_millis(jitter_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_and_stay_capped() {
        let p = RetryPolicy::default();
        for retry in 1..30 {
            let d = p.delay(retry);
            assert!(
                d <= p.max_delay + Duration::from_millis(1),
                "{retry}: {d:?}"
            );
        }
        let d1 = p.delay(1);
        assert!(d1 >= Duration::from_millis(100) && d1 <= Duration::from_millis(201));
        let d4 = p.delay(4);
        assert!(d4 >= Duration::from_millis(800), "{d4:?}");
    }
}
