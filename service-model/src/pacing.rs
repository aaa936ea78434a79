//! The caps: when each request may start, or that it may not ([`Pacer`]).
//!
//! Each cap is a virtual-time bucket (the generic cell rate algorithm): it
//! keeps the time at which everything admitted so far would have passed at
//! exactly the cap's rate, and a request may start once that time is less
//! than one burst ahead of the clock. A request takes its turn when it
//! arrives (so requests are served in the order they came), waits for the
//! latest of its caps' turns, and is refused (503 ServerBusy) when that
//! wait would exceed the queue bound; a refused request charges no cap.
//! Over any stretch in which requests keep waiting, a cap passes exactly its
//! rate, plus one burst at the start: the wake-up delays of the waiting
//! tasks never accumulate, since each turn is computed from the previous
//! turn, not from when a task woke.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::profile::{Caps, Profile};

/// Which cap refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    /// The blob's requests per second.
    BlobRequests,
    /// The blob's bytes per second.
    BlobBytes,
    /// The account's requests per second.
    AccountRequests,
    /// The account's bytes per second.
    AccountBytes,
}

impl Cap {
    /// The message the service puts in a 503's error body for this cap.
    pub fn message(self) -> &'static str {
        match self {
            Cap::BlobRequests | Cap::BlobBytes => "The server is busy.",
            Cap::AccountRequests => "Operations per second is over the account limit.",
            Cap::AccountBytes => "Egress is over the account limit.",
        }
    }
}

/// The answer of [`Pacer::admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Start at this time (now or later).
    StartAt(Instant),
    /// Refused: the wait would exceed the queue bound under this cap.
    Busy(Cap),
}

/// One cap's virtual clock.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    per_s: f64,
    /// One burst, as time at the cap's rate.
    tolerance: Duration,
    /// When everything admitted so far has passed at the cap's rate.
    tat: Instant,
}

impl Bucket {
    fn new(per_s: f64, burst: Duration, now: Instant) -> Bucket {
        Bucket {
            per_s,
            tolerance: burst,
            tat: now,
        }
    }

    /// The earliest a request may start under this cap.
    fn turn(&self, now: Instant) -> Instant {
        self.tat
            .checked_sub(self.tolerance)
            .map_or(now, |t| t.max(now))
    }

    /// Takes `units` from the time `from` on.
    fn charge(&mut self, from: Instant, units: f64) {
        self.tat = self.tat.max(from) + Duration::from_secs_f64(units / self.per_s);
    }
}

/// The buckets of one set of caps (a blob's or the account's).
#[derive(Debug, Clone, Copy)]
struct Buckets {
    requests: Option<Bucket>,
    bytes: Option<Bucket>,
}

impl Buckets {
    fn new(caps: &Caps, burst: Duration, now: Instant) -> Buckets {
        Buckets {
            requests: caps.requests_per_s.map(|r| Bucket::new(r, burst, now)),
            bytes: caps.bytes_per_s.map(|r| Bucket::new(r, burst, now)),
        }
    }

    /// The latest turn among the caps this request charges, and that cap.
    fn turn(&self, now: Instant, bytes: u64, caps: [Cap; 2]) -> Option<(Instant, Cap)> {
        let mut latest: Option<(Instant, Cap)> = None;
        let mut consider = |bucket: &Option<Bucket>, cap: Cap| {
            if let Some(b) = bucket {
                let t = b.turn(now);
                if latest.is_none_or(|(l, _)| t > l) {
                    latest = Some((t, cap));
                }
            }
        };
        consider(&self.requests, caps[0]);
        if bytes > 0 {
            consider(&self.bytes, caps[1]);
        }
        latest
    }

    fn charge(&mut self, from: Instant, bytes: u64) {
        if let Some(b) = &mut self.requests {
            b.charge(from, 1.0);
        }
        if bytes > 0 {
            if let Some(b) = &mut self.bytes {
                b.charge(from, bytes as f64);
            }
        }
    }

    /// True once nothing it admitted is still being paid for.
    fn idle(&self, now: Instant) -> bool {
        [self.requests, self.bytes]
            .iter()
            .flatten()
            .all(|b| b.tat <= now)
    }
}

/// Blobs kept before idle ones are forgotten (an idle blob's buckets are the
/// same as fresh ones).
const BLOBS_KEPT: usize = 4096;

/// The caps of the account and of every blob, and the queue bound.
#[derive(Debug)]
pub struct Pacer {
    blob_caps: Caps,
    burst: Duration,
    queue_bound: Duration,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    account: Buckets,
    blobs: HashMap<String, Buckets>,
}

impl Pacer {
    /// The caps of `profile`, all idle.
    pub fn new(profile: &Profile) -> Pacer {
        let now = Instant::now();
        Pacer {
            blob_caps: profile.blob,
            burst: profile.burst,
            queue_bound: profile.queue_bound,
            state: Mutex::new(State {
                account: Buckets::new(&profile.account, profile.burst, now),
                blobs: HashMap::new(),
            }),
        }
    }

    /// Takes a turn for a request on `blob` (`None`: not a blob request)
    /// that moves `bytes` of body: when it may start, or 503 when that is
    /// more than the queue bound away.
    pub fn admit(&self, blob: Option<&str>, bytes: u64) -> Admission {
        self.admit_at(blob, bytes, Instant::now())
    }

    /// As [`Self::admit`], with the clock read by the caller (`now`), so
    /// the caller can tell a request that waits from one that does not.
    pub fn admit_at(&self, blob: Option<&str>, bytes: u64, now: Instant) -> Admission {
        let mut state = self.state.lock().expect("pacer lock: no panic holds it");
        let State { account, blobs } = &mut *state;
        if blobs.len() > BLOBS_KEPT {
            blobs.retain(|_, b| !b.idle(now));
        }
        let mut blob_buckets = blob.map(|name| {
            blobs
                .entry(name.to_string())
                .or_insert_with(|| Buckets::new(&self.blob_caps, self.burst, now))
        });
        let turns = [
            account.turn(now, bytes, [Cap::AccountRequests, Cap::AccountBytes]),
            blob_buckets
                .as_ref()
                .and_then(|b| b.turn(now, bytes, [Cap::BlobRequests, Cap::BlobBytes])),
        ];
        let Some((start, cap)) = turns.into_iter().flatten().max_by_key(|(t, _)| *t) else {
            return Admission::StartAt(now);
        };
        if start > now + self.queue_bound {
            return Admission::Busy(cap);
        }
        // Each cap takes the request from its arrival on: a request held by
        // its blob's cap does not hold the account's queue for other blobs.
        account.charge(now, bytes);
        if let Some(b) = &mut blob_buckets {
            b.charge(now, bytes);
        }
        Admission::StartAt(start)
    }

    /// Charges `bytes` a request moved beyond what it was admitted for (a
    /// response whose size was not known from the request).
    pub fn owe(&self, blob: Option<&str>, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let now = Instant::now();
        let mut state = self.state.lock().expect("pacer lock: no panic holds it");
        let State { account, blobs } = &mut *state;
        let owe = |b: &mut Buckets| {
            if let Some(bucket) = &mut b.bytes {
                bucket.charge(now, bytes as f64);
            }
        };
        owe(account);
        if let Some(b) = blob.and_then(|name| blobs.get_mut(name)) {
            owe(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn requests_only(per_s: f64) -> Profile {
        let mut p = Profile::transparent();
        p.blob.requests_per_s = Some(per_s);
        p
    }

    #[tokio::test(start_paused = true)]
    async fn turns_are_spaced_at_the_rate_after_one_burst() {
        let pacer = Pacer::new(&requests_only(100.0));
        let t0 = Instant::now();
        // 100 ms of burst at 100/s: the first and ten more at once, then
        // one every 10 ms.
        let starts: Vec<Duration> = (0..30)
            .map(|_| match pacer.admit(Some("c/b"), 0) {
                Admission::StartAt(t) => t - t0,
                Admission::Busy(cap) => panic!("refused by {cap:?}"),
            })
            .collect();
        assert!(starts[..=10].iter().all(|d| d.is_zero()), "{starts:?}");
        for (i, d) in starts.iter().enumerate().skip(11) {
            let want = Duration::from_millis(10 * (i as u64 - 10));
            assert!(d.abs_diff(want) < Duration::from_micros(10), "{i}: {d:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_past_the_queue_bound_is_refused_and_charges_nothing() {
        let pacer = Pacer::new(&requests_only(10.0));
        // Two at once (the first and a burst of 100 ms at 10/s), then one
        // every 100 ms: the twelfth waits exactly 1 s, the thirteenth would
        // wait longer.
        for _ in 0..12 {
            assert!(matches!(pacer.admit(Some("c/b"), 0), Admission::StartAt(_)));
        }
        assert_eq!(
            pacer.admit(Some("c/b"), 0),
            Admission::Busy(Cap::BlobRequests)
        );
        // Another blob has caps of its own.
        assert_eq!(
            pacer.admit(Some("c/other"), 0),
            Admission::StartAt(Instant::now())
        );
        // The refusal took no turn: 100 ms later one more fits.
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(matches!(pacer.admit(Some("c/b"), 0), Admission::StartAt(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_and_account_caps_bind_too() {
        let mut p = Profile::transparent();
        p.blob.bytes_per_s = Some(1000.0);
        p.account.requests_per_s = Some(10.0);
        let pacer = Pacer::new(&p);
        let now = Instant::now();
        // 100 bytes of burst; 600 bytes pass at once, the next waits for the
        // 500 bytes over the burst: 0.5 s.
        assert_eq!(pacer.admit(Some("c/b"), 600), Admission::StartAt(now));
        assert_eq!(
            pacer.admit(Some("c/b"), 600),
            Admission::StartAt(now + Duration::from_millis(500))
        );
        // A request outside any blob is paced by the account alone (10/s,
        // one at once): the blob's queue does not hold it up. Two requests
        // were charged at 0 s: the third's turn is at 0.1 s, and ten more
        // fit within the 1 s bound.
        assert_eq!(
            pacer.admit(None, 0),
            Admission::StartAt(now + Duration::from_millis(100))
        );
        for i in 2..=10 {
            assert_eq!(
                pacer.admit(None, 0),
                Admission::StartAt(now + Duration::from_millis(100 * i))
            );
        }
        assert_eq!(pacer.admit(None, 0), Admission::Busy(Cap::AccountRequests));
    }
}
