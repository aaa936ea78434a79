//! What the drive has measured of its link to the blob, from its own Gets,
//! and the two read decisions that follow from it: how deep read-ahead goes
//! and which holes between stored extents a Get reads along.
//!
//! What it owns: two estimates, kept small and updated as each Get
//! completes ([`Link::record`]):
//! - the **rate**: bytes per second the link delivers while the drive has
//!   Gets in flight: the bytes of large Gets (at least
//!   [`RATE_MIN_GET_BYTES`]) over the time at least one of them was in
//!   flight (the union of their intervals, so idle spells between reads
//!   do not count and concurrent Gets are not counted twice), taken over
//!   buckets of at least [`RATE_BUCKET`] and smoothed. Small Gets are left
//!   out: their time is mostly a round trip, so they would read a fast link
//!   as a slow one.
//! - the **round trip**: the time of small Gets (at most
//!   [`RTT_SMALL_GET_BYTES`]) less their body's time at the measured
//!   rate, smoothed low (it follows a lower sample at once by half, a
//!   higher one by a sixteenth), so Gets that waited behind others (for a
//!   slot of the client's limiter, or in the service's queue) barely move
//!   it. A sample whose body alone would take longer than the Get did is
//!   dropped (the rate is off then, not the round trip zero). Each Get
//!   is timed from when its answering attempt could go (`fetch.rs`,
//!   `PageStore::read_into`): a wait for a slot of the client's
//!   limit or a retry's back-off after a 503 is the service asking for
//!   less, and counted as round trip it would deepen read-ahead just
//!   then. Large Gets do not count: how much of their time was the link
//!   shared with the Gets beside them cannot be told from the drive (a
//!   pipeline of Gets and a batch sent at once take the same time each),
//!   and a guess that read sharing as round trip would deepen read-ahead,
//!   which adds sharing, which deepens it further. Filesystems make small
//!   reads (superblock, inode tables, extent blocks) on every mount, so a
//!   round trip is known early; until it is, depth and holes keep the
//!   configured values.
//!
//! It owns no I/O and no policy beyond these two decisions; `io.rs` and
//! `mod.rs` decide when a stream is sequential and run the read-ahead,
//! `fetch.rs` coalesces the Gets. Nothing here is needed for correctness:
//! an estimate that is off costs speed or requests, never data.
//!
//! Why these decisions (see ARCHITECTURE.md, "Read-ahead"):
//! - **Depth** ([`Estimate::depth_bytes`]): to keep the link busy with Gets
//!   of `step` bytes, one Get's body is on the wire while the next Gets are
//!   in their round trip: `step + rate x rtt` bytes in flight (the
//!   bandwidth-delay product plus the body being moved). The window holds
//!   twice that: what is in flight and as much again arrived ahead of the
//!   reader, so a reader consuming at the link's rate never waits for a Get
//!   to start; and one step more for the reads the reader has asked for
//!   and not yet had (the window counts from the reads completed, and the
//!   loop device keeps a few megabytes of reads in flight: without it a
//!   P30 blob's cold read kept two Gets in flight and reached 0.75 of its
//!   200 MB/s). On a standard blob (60 MiB/s, 5 ms) that is 16 MiB in
//!   4 MiB steps; on a P30 as much. On a local backend (a round trip
//!   under [`LOCAL_RTT`]: loopback, an emulator) it is the cap: a Get's
//!   time there is the server's work, not the wire. The configured read-ahead caps it
//!   (a user's setting wins) and is the depth until the link is measured,
//!   as before this estimate existed; a stream's window starts at the
//!   floor ([`floor_bytes`], two steps) and grows toward the depth only
//!   as its reader consumes it (`io.rs`).
//! - **Holes read along** ([`Estimate::read_along_hole_bytes`]): a hole of
//!   H bytes between two extents is read with them (the service returns
//!   zeros) when moving H bytes costs less than a request of its own, a
//!   round trip: `H < rate x rtt`. 256 KiB at 60 MiB/s is 4.2 ms, under a
//!   standard blob's 5 ms; on loopback almost any hole is read along.
//!   Before anything is measured it is [`DEFAULT_READ_HOLE_BYTES`].

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::units::{MAX_GET_BYTES, PAGE_SIZE};

/// Holes read along before the link is measured: the constant this
/// estimate replaced (a cold read of a fragmented ext4 region went from 282
/// Gets per 64 MiB to about 16 with it, on loopback).
pub(crate) const DEFAULT_READ_HOLE_BYTES: u64 = 256 * 1024;

/// Gets at least this large count toward the rate: their time is mostly
/// their body's.
pub(crate) const RATE_MIN_GET_BYTES: u64 = 1024 * 1024;

/// Gets at most this large count toward the round trip before the rate is
/// known (their body's time is small beside a round trip on any link).
const RTT_SMALL_GET_BYTES: u64 = 64 * 1024;

/// The least busy time a rate sample spans: long enough to hold several
/// Gets on loopback, a few on a slow link.
pub(crate) const RATE_BUCKET: Duration = Duration::from_millis(50);

/// A round trip shorter than this is a local backend (loopback, an
/// emulator next to the daemon), not a service across a network: a Get's
/// time there is the server's work, not the wire, so the link's product
/// says little about how many Gets keep it busy, and no service caps are
/// spent by reading deeper. Read-ahead goes to its cap there, eight Gets,
/// as before the link was measured: the product said 16 MiB (four Gets) on
/// loopback, where an earlier measurement of the fixed window read cold at
/// 194-205 MiB/s with 32 MiB against 143-184 with 16 (8 alternating pairs
/// of 16 and 32 MiB later showed no difference, 1.04 ± 0.08: the guard
/// keeps the known behaviour where the estimate says little).
pub(crate) const LOCAL_RTT: Duration = Duration::from_millis(1);

/// The shallowest read-ahead window of a sequential stream, in steps: one
/// Get being read while the next is on its way.
pub(crate) const FLOOR_STEPS: u64 = 2;

/// The shallowest window of a sequential stream: [`FLOOR_STEPS`] steps,
/// at most `cap_bytes`.
pub(crate) fn floor_bytes(step: u64, cap_bytes: u64) -> u64 {
    (FLOOR_STEPS * step.max(PAGE_SIZE)).min(cap_bytes)
}

/// The link as measured so far. Plain data, so the decisions can be tested
/// without a clock.
#[derive(Debug, Clone, Default)]
pub(crate) struct Estimate {
    /// Bytes per second while Gets are in flight; `None` until a bucket
    /// filled.
    rate_bytes_per_s: Option<f64>,
    /// Round-trip time in seconds; `None` until sampled.
    rtt_s: Option<f64>,
    /// The rate bucket being filled: bytes and busy seconds.
    bucket_bytes: u64,
    bucket_busy_s: f64,
    /// End of the latest large Get counted, for the union of intervals.
    busy_until: Option<Instant>,
}

impl Estimate {
    /// The link's rate in bytes per second, once measured.
    pub(crate) fn rate_bytes_per_s(&self) -> Option<f64> {
        self.rate_bytes_per_s
    }

    /// The round trip, once measured.
    pub(crate) fn rtt(&self) -> Option<Duration> {
        self.rtt_s.map(Duration::from_secs_f64)
    }

    /// Count one Get of `bytes` that was asked for at `started` and whose
    /// last byte came at `ended` (see the module head for what counts).
    pub(crate) fn record(&mut self, started: Instant, ended: Instant, bytes: u64) {
        let took = ended.saturating_duration_since(started).as_secs_f64();
        if bytes >= RATE_MIN_GET_BYTES {
            // Gets complete in about the order of their ends: what this one
            // adds to the union is the part after the latest end counted.
            let from = self.busy_until.map_or(started, |b| b.max(started));
            if ended > from {
                self.bucket_busy_s += (ended - from).as_secs_f64();
            }
            self.busy_until = Some(self.busy_until.map_or(ended, |b| b.max(ended)));
            self.bucket_bytes += bytes;
            if self.bucket_busy_s >= RATE_BUCKET.as_secs_f64() {
                let sample = self.bucket_bytes as f64 / self.bucket_busy_s;
                self.rate_bytes_per_s = Some(match self.rate_bytes_per_s {
                    Some(r) => r + (sample - r) / 4.0,
                    None => sample,
                });
                self.bucket_bytes = 0;
                self.bucket_busy_s = 0.0;
            }
        }
        if bytes > RTT_SMALL_GET_BYTES {
            return;
        }
        let body_s = self.rate_bytes_per_s.map_or(0.0, |r| bytes as f64 / r);
        let net = took - body_s;
        if net <= 0.0 {
            // Faster than its body at the measured rate: the rate is off
            // (the link was slower while it was measured), not the round
            // trip near zero. A zero here would read no hole along.
            return;
        }
        self.rtt_s = Some(match self.rtt_s {
            Some(rtt) if net < rtt => rtt + (net - rtt) / 2.0,
            Some(rtt) => rtt + (net - rtt) / 16.0,
            None => net,
        });
    }

    /// Bytes that take one round trip to move: the bandwidth-delay
    /// product, once both are measured.
    fn bdp_bytes(&self) -> Option<u64> {
        Some((self.rate_bytes_per_s? * self.rtt_s?) as u64)
    }

    /// The longest hole between two stored extents that a Get reads along
    /// rather than leaving it to split the Get in two: one round trip's
    /// worth of bytes at the measured rate (whole pages, at most one Get).
    pub(crate) fn read_along_hole_bytes(&self) -> u64 {
        let bytes = self.bdp_bytes().unwrap_or(DEFAULT_READ_HOLE_BYTES);
        bytes.min(MAX_GET_BYTES) / PAGE_SIZE * PAGE_SIZE
    }

    /// How deep a sequential stream's read-ahead goes at most, in whole
    /// `step`s: twice what keeps the link busy and a step (see the module
    /// head; the cap on a local backend, [`LOCAL_RTT`]), at
    /// least the floor, at most `cap_bytes` (the configured read-ahead,
    /// which also is the depth before the link is measured). A `cap_bytes`
    /// of 0 turns read-ahead off.
    pub(crate) fn depth_bytes(&self, step: u64, cap_bytes: u64) -> u64 {
        let floor = floor_bytes(step, cap_bytes);
        let step = step.max(PAGE_SIZE);
        let local = self.rtt_s.is_some_and(|r| r < LOCAL_RTT.as_secs_f64());
        let want = match self.bdp_bytes() {
            Some(_) if local => cap_bytes,
            Some(bdp) => (2 * (step + bdp) + step).div_ceil(step) * step,
            None => cap_bytes,
        };
        want.clamp(floor, cap_bytes)
    }
}

/// The drive's [`Estimate`], shared by its fetches.
#[derive(Debug, Default)]
pub(crate) struct Link {
    estimate: Mutex<Estimate>,
}

impl Link {
    /// Count one Get (see [`Estimate::record`]).
    pub(crate) fn record(&self, started: Instant, ended: Instant, bytes: u64) {
        self.lock().record(started, ended, bytes);
    }

    /// The estimate now.
    pub(crate) fn estimate(&self) -> Estimate {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Estimate> {
        self.estimate.lock().expect("link estimate mutex poisoned")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1024 * 1024;
    const KIB: u64 = 1024;

    /// `total` small Gets of `bytes`, one at a time, each taking `rtt`
    /// plus its body's time at `rate` bytes/s.
    fn small_gets(e: &mut Estimate, rate: f64, rtt: Duration, bytes: u64, total: u32) {
        let t0 = Instant::now();
        let each = rtt + Duration::from_secs_f64(bytes as f64 / rate);
        for i in 0..total {
            e.record(t0 + each * i, t0 + each * (i + 1), bytes);
        }
    }

    /// `total` Gets of `bytes` in a pipeline that keeps a link of `rate`
    /// bytes/s and round trip `rtt` busy: Get `i` is asked for when the
    /// body before it starts on the wire, one round trip before its own
    /// body, and its body follows the one before it.
    fn pipeline(e: &mut Estimate, rate: f64, rtt: Duration, bytes: u64, total: u32) {
        let t0 = Instant::now();
        let body = Duration::from_secs_f64(bytes as f64 / rate);
        for i in 0..total {
            e.record(t0 + body * i, t0 + rtt + body * (i + 1), bytes);
        }
    }

    fn measured(rate_mib: f64, rtt: Duration) -> Estimate {
        let mut e = Estimate::default();
        let rate = rate_mib * MIB as f64;
        // A mount's small reads, then a sequential stream of 4 MiB Gets.
        small_gets(&mut e, rate, rtt, 4 * KIB, 20);
        pipeline(&mut e, rate, rtt, 4 * MIB, 200);
        e
    }

    fn standard() -> Estimate {
        measured(60.0, Duration::from_millis(5))
    }

    #[test]
    fn nothing_measured_keeps_the_old_constants() {
        let e = Estimate::default();
        assert_eq!(e.read_along_hole_bytes(), DEFAULT_READ_HOLE_BYTES);
        assert_eq!(e.depth_bytes(4 * MIB, 32 * MIB), 32 * MIB);
        assert_eq!(e.depth_bytes(4 * MIB, 0), 0, "0 turns read-ahead off");
    }

    #[test]
    fn a_standard_blob_is_measured_near_its_targets() {
        let e = standard();
        let rate = e.rate_bytes_per_s().unwrap() / MIB as f64;
        assert!((55.0..=61.0).contains(&rate), "rate {rate} MiB/s");
        let rtt = e.rtt().unwrap().as_secs_f64() * 1e3;
        assert!((4.5..=5.5).contains(&rtt), "rtt {rtt} ms");
    }

    #[test]
    fn a_standard_blob_reads_a_256k_hole_along_but_not_a_512k_one() {
        let hole = standard().read_along_hole_bytes();
        assert!(hole > 256 * KIB && hole < 512 * KIB, "{hole}");
    }

    #[test]
    fn a_standard_blob_keeps_four_steps_ahead() {
        // 2 x (4 MiB + 60 MiB/s x 5 ms) + 4 MiB is 12.6 MiB: four steps.
        assert_eq!(standard().depth_bytes(4 * MIB, 32 * MIB), 16 * MIB);
        // The user's cap still wins.
        assert_eq!(standard().depth_bytes(4 * MIB, 8 * MIB), 8 * MIB);
    }

    #[test]
    fn a_long_fat_link_goes_deep_up_to_the_cap() {
        let e = measured(200.0, Duration::from_millis(45));
        // 200 MiB/s x 45 ms is 9 MiB in flight: 2 x 13 MiB + 4 MiB.
        assert_eq!(e.depth_bytes(4 * MIB, 64 * MIB), 32 * MIB);
        assert_eq!(e.depth_bytes(4 * MIB, 16 * MIB), 16 * MIB);
        assert_eq!(e.read_along_hole_bytes(), MAX_GET_BYTES);
    }

    #[test]
    fn loopback_reads_ahead_to_the_cap() {
        let e = measured(2000.0, Duration::from_micros(300));
        assert_eq!(e.depth_bytes(4 * MIB, 32 * MIB), 32 * MIB);
        assert_eq!(e.depth_bytes(4 * MIB, 8 * MIB), 8 * MIB);
        assert!(e.read_along_hole_bytes() >= 512 * KIB);
    }

    #[test]
    fn small_gets_alone_do_not_pass_for_a_slow_link() {
        let mut e = Estimate::default();
        small_gets(
            &mut e,
            60.0 * MIB as f64,
            Duration::from_millis(5),
            4 * KIB,
            400,
        );
        assert_eq!(e.rate_bytes_per_s(), None);
        assert_eq!(e.read_along_hole_bytes(), DEFAULT_READ_HOLE_BYTES);
        assert_eq!(e.depth_bytes(4 * MIB, 32 * MIB), 32 * MIB);
        let rtt = e.rtt().unwrap().as_secs_f64() * 1e3;
        assert!((4.9..=5.5).contains(&rtt), "rtt {rtt} ms");
    }

    #[test]
    fn large_gets_alone_leave_the_round_trip_unknown() {
        let mut e = Estimate::default();
        pipeline(
            &mut e,
            60.0 * MIB as f64,
            Duration::from_millis(5),
            4 * MIB,
            40,
        );
        assert!(e.rate_bytes_per_s().is_some());
        assert_eq!(e.rtt(), None);
        assert_eq!(e.depth_bytes(4 * MIB, 32 * MIB), 32 * MIB);
    }

    #[test]
    fn gets_that_waited_barely_move_the_round_trip() {
        let mut e = standard();
        let before = e.rtt().unwrap();
        // Ten small Gets that queued 100 ms for a slot.
        small_gets(
            &mut e,
            60.0 * MIB as f64,
            Duration::from_millis(105),
            4 * KIB,
            10,
        );
        let after = e.rtt().unwrap();
        assert!(after > before);
        assert!(after < Duration::from_millis(60), "{before:?} -> {after:?}");
        // and a few good samples bring it back.
        small_gets(
            &mut e,
            60.0 * MIB as f64,
            Duration::from_millis(5),
            4 * KIB,
            10,
        );
        assert!(e.rtt().unwrap() < Duration::from_millis(6));
    }

    #[test]
    fn a_get_faster_than_its_body_is_dropped_not_read_as_no_round_trip() {
        // Large Gets slowed to 10 MiB/s (another reader, a throttled
        // spell), then small Gets at the link's real speed: their body at
        // the rate measured takes longer than they did.
        let mut e = Estimate::default();
        small_gets(
            &mut e,
            60.0 * MIB as f64,
            Duration::from_millis(5),
            4 * KIB,
            20,
        );
        let before = e.rtt().unwrap();
        pipeline(
            &mut e,
            10.0 * MIB as f64,
            Duration::from_millis(5),
            4 * MIB,
            40,
        );
        small_gets(
            &mut e,
            60.0 * MIB as f64,
            Duration::from_millis(5),
            64 * KIB,
            20,
        );
        assert_eq!(e.rtt(), Some(before), "samples under zero are dropped");
        assert!(e.read_along_hole_bytes() > 0);
    }

    proptest! {
        /// Whatever was measured, the depth is whole steps within the floor
        /// and the cap, and a hole read along fits in one Get.
        #[test]
        fn decisions_stay_in_bounds(
            rate_mib in 1u64..4096,
            rtt_us in 50u64..200_000,
            small in 0u32..20,
            large in 0u32..40,
            cap_steps in 0u64..16,
        ) {
            let mut e = Estimate::default();
            let rate = (rate_mib * MIB) as f64;
            let rtt = Duration::from_micros(rtt_us);
            small_gets(&mut e, rate, rtt, 4 * KIB, small);
            pipeline(&mut e, rate, rtt, 4 * MIB, large);
            let step = 4 * MIB;
            let cap = cap_steps * step;
            let d = e.depth_bytes(step, cap);
            prop_assert!(d <= cap);
            prop_assert!(d >= (FLOOR_STEPS * step).min(cap));
            prop_assert_eq!(d % step, 0);
            let h = e.read_along_hole_bytes();
            prop_assert!(h <= MAX_GET_BYTES);
            prop_assert_eq!(h % PAGE_SIZE, 0);
        }

        /// A link measured farther away never reads fewer holes along nor
        /// reads ahead less deep (across a network: a local backend reads
        /// ahead to the cap, `LOCAL_RTT`).
        #[test]
        fn a_longer_round_trip_never_means_less(
            rate_mib in 1u64..2048,
            rtt_us in 1_000u64..100_000,
        ) {
            let rtt = Duration::from_micros(rtt_us);
            let a = measured(rate_mib as f64, rtt);
            let b = measured(rate_mib as f64, rtt * 2);
            prop_assert!(b.read_along_hole_bytes() >= a.read_along_hole_bytes());
            prop_assert!(b.depth_bytes(4 * MIB, 64 * MIB) >= a.depth_bytes(4 * MIB, 64 * MIB));
        }
    }
}
