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
//! The fence also keeps what its writer lineage left the blob as (see
//! `lineage.rs`): the number it raised the blob to (the lineage's epoch)
//! and the ETag its own last change returned. That ETag is known only when
//! the change was the lineage's only one in flight from its sending to its
//! answer: with two in flight, the service may have applied them in either
//! order, so which ETag is the blob's is not known until a read under the
//! lease says (`settled`).
//!
//! Invariants: the number a write carries never decreases; a write is never
//! sent while an unknown outcome is not yet fenced (`floor > current`); the
//! recorded ETag is always one that this lineage's own change produced, or
//! none.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// What a writer lineage left its blob as (`lineage.rs` decides what it
/// proves).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    /// The blob's sequence number as the lineage last raised or read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    /// The ETag the lineage's own last change returned (or the blob had
    /// when read under its lease), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
}

/// Where a fence reports its lineage's mark each time it changes (the
/// attach's shared state, so that a successor knows it).
pub type MarkRecorder = Arc<dyn Fn(&Mark) + Send + Sync>;

/// Sequence-number state of one blob, shared by every write to it.
#[derive(Default)]
pub struct WriteFence {
    state: Mutex<FenceState>,
    /// Serialises raises, so concurrent writers that hit unknown outcomes
    /// cause one Set Blob Properties, not one each.
    raise: tokio::sync::Mutex<()>,
    /// Told every change of the mark, under the state's lock (so marks are
    /// recorded in the order they were made).
    recorder: Mutex<Option<MarkRecorder>>,
    /// Raises that failed so far.
    raise_failures: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for WriteFence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteFence")
            .field("state", &*self.state())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default, Clone)]
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
    /// Changes of this lineage (page writes, raises) sent and not answered.
    changes_in_flight: u32,
    /// Two changes were in flight at once since the last moment none was.
    overlapped: bool,
    /// Changes begun so far (tells a settle whether one began meanwhile).
    changes_begun: u64,
    /// The ETag this lineage's own last change returned, when known.
    own_etag: Option<String>,
}

/// How a change of the blob (a page write, a raise) ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ChangeEnd {
    /// Applied; the service answered with this ETag.
    Landed(Option<String>),
    /// Refused or never sent: the blob is as it was.
    NotLanded,
    /// It may have been applied or not.
    Unknown,
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

    /// Reports every later change of the mark to `recorder` (and the mark
    /// as it is now).
    pub fn record_with(&self, recorder: MarkRecorder) {
        let s = self.state();
        recorder(&s.mark());
        *self.recorder.lock().expect("recorder mutex poisoned") = Some(recorder);
    }

    /// Tells the recorder, if any, the mark of `s` (called with the state
    /// locked, after each change of it).
    fn record(&self, s: &FenceState) {
        if let Some(r) = self
            .recorder
            .lock()
            .expect("recorder mutex poisoned")
            .as_ref()
        {
            r(&s.mark());
        }
    }

    /// What this lineage left the blob as, as far as this fence knows.
    pub fn mark(&self) -> Mark {
        self.state().mark()
    }

    /// A change of the blob is being sent; ended by the guard's
    /// [`Change::ended`], or as [`ChangeEnd::Unknown`] when the guard is
    /// dropped first (a caller abandoned at a deadline).
    pub(crate) fn change(&self) -> Change<'_> {
        self.change_began();
        Change {
            fence: self,
            open: true,
        }
    }

    /// A change of the blob is being sent.
    pub(crate) fn change_began(&self) {
        let mut s = self.state();
        if s.changes_in_flight > 0 {
            s.overlapped = true;
        }
        s.changes_in_flight += 1;
        s.changes_begun += 1;
    }

    /// A change begun with [`Self::change_began`] ended so.
    pub(crate) fn change_ended(&self, end: ChangeEnd) {
        let mut s = self.state();
        s.changes_in_flight = s.changes_in_flight.saturating_sub(1);
        let before = s.own_etag.clone();
        match end {
            ChangeEnd::Landed(etag) if !s.overlapped => s.own_etag = etag,
            ChangeEnd::Landed(_) | ChangeEnd::Unknown => s.own_etag = None,
            ChangeEnd::NotLanded => {
                if s.overlapped {
                    s.own_etag = None;
                }
            }
        }
        if s.changes_in_flight == 0 {
            s.overlapped = false;
        }
        if s.own_etag != before {
            self.record(&s);
        }
    }

    /// Whether the ETag of the lineage's last change must be read (under
    /// the lease) to be known; with the count of changes begun, which
    /// [`Self::settled`] is given back.
    pub(crate) fn unsettled(&self) -> Option<u64> {
        let s = self.state();
        (s.own_etag.is_none() && s.changes_in_flight == 0).then_some(s.changes_begun)
    }

    /// The blob read under this lineage's lease answered `seq` and `etag`,
    /// and no change had begun since `begun` ([`Self::unsettled`]): that
    /// state is the lineage's last change.
    pub(crate) fn settled(&self, begun: u64, seq: u64, etag: Option<String>) {
        let mut s = self.state();
        if s.changes_begun != begun || s.changes_in_flight != 0 {
            return;
        }
        // Learnt as any reading of the number is: a new fence still
        // raises it before its first write, which is what tells a lineage
        // that left the blob at this number that another writer came.
        s.learn(seq);
        s.own_etag = etag;
        self.record(&s);
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
        let before = s.current;
        s.learn(seen);
        if s.current != before {
            self.record(&s);
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

    /// Raises that failed so far (a writer that waited for another's raise
    /// takes its failure as its own answer).
    pub(crate) fn raise_failures(&self) -> u64 {
        self.raise_failures
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// A raise failed.
    pub(crate) fn raise_failed(&self) {
        self.raise_failures
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Held while a raise is sent.
    pub(crate) async fn raising(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.raise.lock().await
    }
}

impl FenceState {
    fn learn(&mut self, seen: u64) {
        self.current = Some(self.current.map_or(seen, |c| c.max(seen)));
        self.relearn = false;
        if self.raise_first {
            self.raise_first = false;
            self.floor = self.floor.max(seen + 1);
        }
    }

    fn mark(&self) -> Mark {
        Mark {
            epoch: self.current,
            etag: self.own_etag.clone(),
        }
    }
}

/// A change of the blob in flight, counted by its fence until it ends.
pub(crate) struct Change<'a> {
    fence: &'a WriteFence,
    open: bool,
}

impl Change<'_> {
    /// The change ended so.
    pub(crate) fn ended(mut self, end: ChangeEnd) {
        self.open = false;
        self.fence.change_ended(end);
    }
}

impl Drop for Change<'_> {
    fn drop(&mut self) {
        if self.open {
            self.fence.change_ended(ChangeEnd::Unknown);
        }
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
        fence.change_began();
        InFlight {
            fence,
            sent,
            armed: true,
        }
    }

    /// The attempt ended with an answer: whether it landed is known
    /// (`Some(etag)` when it did, with the ETag it returned).
    pub(crate) fn disarm(mut self, landed: Option<Option<String>>) {
        self.armed = false;
        self.fence.change_ended(match landed {
            Some(etag) => ChangeEnd::Landed(etag),
            None => ChangeEnd::NotLanded,
        });
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.fence.outcome_unknown(self.sent);
            self.fence.change_ended(ChangeEnd::Unknown);
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
        InFlight::arm(&f, 1).disarm(None);
        assert_eq!(f.step(), FenceStep::Send(1));
        drop(InFlight::arm(&f, 1));
        assert_eq!(f.step(), FenceStep::Raise(2));
    }

    #[test]
    fn a_number_read_under_the_lease_at_open_is_still_raised_before_the_first_write() {
        let f = WriteFence::new();
        let begun = f.unsettled().expect("nothing known at open");
        f.settled(begun, 3, Some("e".into()));
        assert_eq!(
            f.step(),
            FenceStep::Raise(4),
            "every writer raises the number: a lineage that left it at 3 sees it passed"
        );
    }

    #[test]
    fn only_a_change_alone_in_flight_tells_the_lineage_its_etag() {
        let f = WriteFence::trusting();
        f.observed(4);
        let begun = f.unsettled().expect("nothing known yet");
        f.settled(begun, 4, Some("e0".into()));
        assert_eq!(
            f.mark(),
            Mark {
                epoch: Some(4),
                etag: Some("e0".into())
            }
        );
        InFlight::arm(&f, 4).disarm(Some(Some("e1".into())));
        assert_eq!(
            f.mark().etag.as_deref(),
            Some("e1"),
            "alone: its ETag is the blob's"
        );
        let a = InFlight::arm(&f, 4);
        let b = InFlight::arm(&f, 4);
        b.disarm(Some(Some("e3".into())));
        a.disarm(Some(Some("e2".into())));
        assert_eq!(
            f.mark().etag,
            None,
            "two at once: either may have been applied last"
        );
        let begun = f.unsettled().expect("unknown and quiet: settle it");
        f.settled(begun, 4, Some("e3".into()));
        assert_eq!(f.mark().etag.as_deref(), Some("e3"));
        drop(InFlight::arm(&f, 4));
        assert_eq!(f.mark().etag, None, "an unknown outcome forgets it");
        let begun = f.unsettled().unwrap();
        InFlight::arm(&f, 5).disarm(None);
        f.settled(begun, 5, Some("stale".into()));
        assert_eq!(
            f.mark().etag,
            None,
            "a change begun since makes the read stale"
        );
    }

    #[test]
    fn every_change_of_the_mark_reaches_the_recorder_in_order() {
        let f = WriteFence::trusting();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let into = seen.clone();
        f.record_with(Arc::new(move |m: &Mark| {
            into.lock().unwrap().push(m.clone())
        }));
        f.settled(0, 2, Some("a".into()));
        InFlight::arm(&f, 2).disarm(Some(Some("b".into())));
        f.observed(3);
        let seen = seen.lock().unwrap();
        let last = seen.last().unwrap();
        assert_eq!(
            last,
            &Mark {
                epoch: Some(3),
                etag: Some("b".into())
            }
        );
        assert_eq!(
            seen.len(),
            4,
            "at recording, settled, landed, raised: {seen:?}"
        );
    }
}
