//! Fencing of page writes whose outcome is unknown, with the page blob's
//! sequence number.
//!
//! A Put Page or Clear Pages the client gave up on (its attempt timed out,
//! the connection dropped after the request went out, the caller dropped
//! the future) may still be applied by the service later: after its retry
//! and after a newer write to the same pages succeeded. The lease does not
//! stop it, since it carries our own lease id. So every fenced write
//! carries `x-ms-if-sequence-number-le: N`, where N is what this client
//! believes the blob's sequence number to be, and once an outcome is
//! unknown the blob's number is raised above N (Set Blob Properties,
//! `x-ms-sequence-number-action: max`) before the next write goes out. A
//! late request is then refused by the service with 412
//! `SequenceNumberConditionNotMet` instead of landing over newer data: the
//! service evaluates the condition and applies the write atomically, so
//! once the raise has returned, an old request has either landed already or
//! never will.
//!
//! Why sequence numbers and not something else: the lease id cannot change
//! mid-mount without a window where no write is allowed (Change Lease is
//! itself a request with an unknown outcome), ETag conditions (`If-Match`)
//! would serialise every write of a parallel flush, and the sequence number
//! is free: nothing else in blobdrive uses it, it costs one request per
//! unknown outcome, and a raise with `max` is idempotent, so retrying it is
//! harmless. Only a holder of the blob's lease can change the number, so
//! any change seen while the lease is held comes from this client.
//!
//! Invariants: the number a write carries never decreases; a write is never
//! sent while an unknown outcome is not yet fenced (`floor > current`).

use std::sync::Mutex;

/// Sequence-number state of one blob, shared by every write to it.
#[derive(Debug, Default)]
pub struct WriteFence {
    state: Mutex<FenceState>,
    /// Serialises raises, so concurrent writers that hit unknown outcomes
    /// cause one Set Blob Properties, not one each.
    raise: tokio::sync::Mutex<()>,
}

#[derive(Debug, Default, Clone, Copy)]
struct FenceState {
    /// The blob's sequence number as last known; `None` before the first
    /// write (learnt then with Get Blob Properties).
    current: Option<u64>,
    /// The number the blob must reach before the next write: one above the
    /// number a write with an unknown outcome carried.
    floor: u64,
    /// The service refused a write's number although no raise of ours
    /// explains it: read the number again before the next write.
    relearn: bool,
    /// Raise the number once it is first learnt (see [`WriteFence::new`]).
    raise_first: bool,
}

/// What a fenced write needs next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FenceStep {
    /// Send with `x-ms-if-sequence-number-le` set to this.
    Send(u64),
    /// The number is unknown: read it (Get Blob Properties) first.
    Learn,
    /// Raise the blob's number to at least this first.
    Raise(u64),
}

impl WriteFence {
    /// A fence that knows nothing yet about its blob, and raises the
    /// blob's number once before its first write: writes an earlier writer
    /// sent under the same lease (a daemon that crashed, and whose lease a
    /// new process took over with the same id) may still be in flight, and
    /// must not land over this one's.
    pub fn new() -> Self {
        let fence = WriteFence::default();
        fence.state().raise_first = true;
        fence
    }

    /// A fence that trusts the number it learns (no raise before the first
    /// write), for the tests of the other steps.
    #[cfg(test)]
    pub fn trusting() -> Self {
        WriteFence::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, FenceState> {
        self.state.lock().expect("fence mutex poisoned")
    }

    /// The sequence number writes carry now, once known.
    pub fn current(&self) -> Option<u64> {
        self.state().current
    }

    /// What has to happen before the next write.
    pub(crate) fn step(&self) -> FenceStep {
        let s = self.state();
        if s.relearn {
            return FenceStep::Learn;
        }
        match s.current {
            None => FenceStep::Learn,
            Some(c) if c < s.floor => FenceStep::Raise(s.floor),
            Some(c) => FenceStep::Send(c),
        }
    }

    /// The service reports the blob's number as `seen` (never lowers it).
    pub(crate) fn observed(&self, seen: u64) {
        let mut s = self.state();
        s.current = Some(s.current.map_or(seen, |c| c.max(seen)));
        s.relearn = false;
        if s.raise_first {
            s.raise_first = false;
            s.floor = s.floor.max(seen + 1);
        }
    }

    /// The service refused a write that carried `sent`
    /// (`SequenceNumberConditionNotMet`): the write did not land. Returns
    /// true when a raise since explains it (send again with the new number);
    /// otherwise the number is read again before the next write.
    pub(crate) fn refused(&self, sent: u64) -> bool {
        let mut s = self.state();
        if s.current.is_some_and(|c| c > sent) {
            return true;
        }
        s.relearn = true;
        false
    }

    /// A write that carried `sent` may still land: the blob's number must
    /// rise above it before the next write.
    pub(crate) fn outcome_unknown(&self, sent: u64) {
        let mut s = self.state();
        s.floor = s.floor.max(sent + 1);
    }

    /// Held while a raise is sent.
    pub(crate) async fn raising(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.raise.lock().await
    }
}

/// Marks a fenced write's outcome unknown unless disarmed: armed while an
/// attempt is in flight, so a future dropped mid-request (a flush pass
/// abandoned at its deadline) fences what it may have sent.
pub(crate) struct InFlight<'a> {
    fence: &'a WriteFence,
    sent: u64,
    armed: bool,
}

impl<'a> InFlight<'a> {
    pub(crate) fn arm(fence: &'a WriteFence, sent: u64) -> Self {
        InFlight {
            fence,
            sent,
            armed: true,
        }
    }

    /// The attempt ended with an answer: whether it landed is known.
    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.fence.outcome_unknown(self.sent);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_fence_raises_the_number_it_learns_before_its_first_write() {
        let f = WriteFence::new();
        assert_eq!(f.step(), FenceStep::Learn);
        f.observed(7);
        assert_eq!(
            f.step(),
            FenceStep::Raise(8),
            "an earlier writer's late request (number 7) must be fenced"
        );
        f.observed(8);
        assert_eq!(f.step(), FenceStep::Send(8));
    }

    #[test]
    fn an_unknown_outcome_asks_for_a_raise_above_what_it_carried() {
        let f = WriteFence::trusting();
        assert_eq!(f.step(), FenceStep::Learn);
        f.observed(7);
        assert_eq!(f.step(), FenceStep::Send(7));
        f.outcome_unknown(7);
        f.outcome_unknown(7);
        assert_eq!(f.step(), FenceStep::Raise(8), "one raise for both");
        f.observed(8);
        assert_eq!(f.step(), FenceStep::Send(8));
        f.observed(3);
        assert_eq!(f.current(), Some(8), "the number never goes down");
        assert!(
            f.refused(7),
            "a write sent before the raise just goes again"
        );
        assert!(!f.refused(8));
        assert_eq!(
            f.step(),
            FenceStep::Learn,
            "an unexplained refusal reads the number again"
        );
    }

    #[test]
    fn a_dropped_attempt_counts_as_unknown_and_a_disarmed_one_does_not() {
        let f = WriteFence::trusting();
        f.observed(1);
        InFlight::arm(&f, 1).disarm();
        assert_eq!(f.step(), FenceStep::Send(1));
        drop(InFlight::arm(&f, 1));
        assert_eq!(f.step(), FenceStep::Raise(2));
    }
}
