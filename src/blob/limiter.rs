//! How many data requests of one kind (page writes, ranged reads) a client
//! keeps in flight: an AIMD controller shared by every clone of the client,
//! so every drive and task using it slows together when the service says
//! it is over its targets.
//!
//! Each attempt of a page write or ranged read takes a slot first and gives
//! it back with what the service answered. An answer that says the service
//! is over its targets (503 `ServerBusy`, 500 `OperationTimedOut`, 429)
//! halves the limit, from the number of requests that were in flight when
//! it came (so a limit that had floated above what callers used still cuts
//! at once); other answers from the same window of requests (those that
//! took their slot before that cut) do not cut again, as one overload
//! usually answers a whole burst. Every answer to a request sent while at
//! least half the limit was in use adds `1 / limit` to it: about one slot
//! more per two windows of requests, as TCP's congestion window grows; a
//! limit that callers do not use does not grow. A retry takes its
//! slot like any attempt, after its own back-off: after a 503 the whole
//! client sends less, instead of each request retrying on its own.
//!
//! Why AIMD and not a latency-gradient limiter (Netflix's gradient2,
//! Vegas): the service gives an explicit signal when a blob or account is
//! over its target, and its throttling guidance is to back off on exactly
//! those answers. A request's latency on this link is mostly its body's
//! time on the wire (a 4 MiB Put Page takes 70 ms at 60 MiB/s, a 4 KiB one
//! a round trip), so a gradient would read a larger body as congestion
//! unless every sample were normalised by size, and the page cache mixes
//! sizes all the time. The crates that exist (rate_limiter_aimd, tower's
//! adaptive limiters) wrap a whole reqwest or tower service with latency
//! signals; this client's retry loop and fence sit inside one call, and
//! only the attempts must be counted, so the controller is this module.
//!
//! Bounds: never below [`MIN_LIMIT`], never above [`MAX_LIMIT`]. It starts
//! at [`INITIAL_LIMIT`], 32: what the engine's own bounds reach (8 Put
//! Pages of a flush; a loop device's or fio's 32 reads at once, one Get
//! each), so a fast link is never held back before the service has said
//! anything, and the first overload cuts from what was in flight.

use std::sync::Mutex;

use tokio::sync::Notify;

/// The fewest requests of a kind kept in flight.
pub const MIN_LIMIT: usize = 1;
/// The most requests of a kind kept in flight.
pub const MAX_LIMIT: usize = 64;
/// Where the limit starts.
pub const INITIAL_LIMIT: usize = 32;

/// What an attempt's answer says about the service's load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// An answer (success or an error that says nothing of load).
    Answered,
    /// The service is over its targets: 503, 500 `OperationTimedOut`, 429.
    Overloaded,
    /// No answer (a connection fault, a timeout on our side): says nothing
    /// either way.
    Unanswered,
}

#[derive(Debug)]
struct State {
    /// The limit, fractional so that additive increase can add `1/limit`.
    limit: f64,
    in_flight: usize,
    /// Bumped at each cut: slots taken before it do not cut again.
    epoch: u64,
    /// Cuts so far.
    cuts: u64,
}

/// One kind of request's concurrency limit.
#[derive(Debug)]
pub struct Limiter {
    state: Mutex<State>,
    freed: Notify,
}

impl Default for Limiter {
    fn default() -> Self {
        Limiter::new(INITIAL_LIMIT)
    }
}

/// A slot of a [`Limiter`]; give it back with [`Slot::finish`] (dropping
/// it gives it back without a signal, as for a cancelled attempt).
#[derive(Debug)]
pub struct Slot<'a> {
    limiter: &'a Limiter,
    epoch: u64,
    /// At least half the limit was in use when this slot was taken.
    saturated: bool,
    done: bool,
}

impl Limiter {
    /// A limiter starting at `initial` (clamped to the bounds).
    pub fn new(initial: usize) -> Self {
        Limiter {
            state: Mutex::new(State {
                limit: initial.clamp(MIN_LIMIT, MAX_LIMIT) as f64,
                in_flight: 0,
                epoch: 0,
                cuts: 0,
            }),
            freed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("limiter mutex poisoned")
    }

    /// The limit now (whole requests).
    pub fn limit(&self) -> usize {
        self.lock().limit as usize
    }

    /// Slots taken now.
    pub fn in_flight(&self) -> usize {
        self.lock().in_flight
    }

    /// Cuts made so far.
    pub fn cuts(&self) -> u64 {
        self.lock().cuts
    }

    /// A slot now, or `None` when the limit is in use.
    pub fn try_acquire(&self) -> Option<Slot<'_>> {
        let mut s = self.lock();
        if s.in_flight >= s.limit as usize {
            return None;
        }
        s.in_flight += 1;
        Some(Slot {
            limiter: self,
            epoch: s.epoch,
            saturated: (s.in_flight * 2) as f64 >= s.limit,
            done: false,
        })
    }

    /// Wait for a slot.
    pub async fn acquire(&self) -> Slot<'_> {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some(slot) = self.try_acquire() {
                return slot;
            }
            freed.await;
        }
    }

    fn release(&self, slot: &Slot<'_>, signal: Option<Signal>) {
        let mut s = self.lock();
        let in_flight = s.in_flight;
        s.in_flight -= 1;
        match signal {
            Some(Signal::Overloaded) if slot.epoch == s.epoch => {
                // From what was in flight, not from a limit nobody used.
                let base = s.limit.min(in_flight as f64);
                s.limit = (base / 2.0).floor().max(MIN_LIMIT as f64);
                s.epoch += 1;
                s.cuts += 1;
            }
            Some(Signal::Answered) if slot.saturated => {
                s.limit = (s.limit + 1.0 / s.limit).min(MAX_LIMIT as f64);
            }
            _ => {}
        }
        drop(s);
        self.freed.notify_waiters();
    }
}

impl Slot<'_> {
    /// Give the slot back with what the attempt's answer said.
    pub fn finish(mut self, signal: Signal) {
        self.done = true;
        self.limiter.release(&self, Some(signal));
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.limiter.release(self, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Take `n` slots at once and answer them all with `signal`.
    fn window(l: &Limiter, n: usize, signal: Signal) {
        let slots: Vec<_> = (0..n).map_while(|_| l.try_acquire()).collect();
        for s in slots {
            s.finish(signal);
        }
    }

    #[test]
    fn grows_while_in_use() {
        let l = Limiter::new(8);
        window(&l, 8, Signal::Answered);
        assert_eq!(l.limit(), 8, "one window adds less than a slot");
        window(&l, 8, Signal::Answered);
        assert_eq!(l.limit(), 9, "two add one");
    }

    #[test]
    fn does_not_grow_while_not_in_use_whole() {
        let l = Limiter::new(8);
        for _ in 0..100 {
            window(&l, 3, Signal::Answered);
        }
        assert_eq!(l.limit(), 8, "a limit nobody reaches says nothing");
    }

    #[test]
    fn one_burst_of_busy_answers_cuts_once_from_what_was_in_flight() {
        let l = Limiter::new(32);
        window(&l, 8, Signal::Overloaded);
        assert_eq!(l.limit(), 4, "half of the 8 in flight, once");
        assert_eq!(l.cuts(), 1);
        window(&l, 4, Signal::Overloaded);
        assert_eq!(l.limit(), 2, "a later window cuts again");
    }

    #[test]
    fn waits_for_a_slot_freed_by_another() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let l = Limiter::new(1);
            let first = l.acquire().await;
            assert!(l.try_acquire().is_none());
            let waiter = async { l.acquire().await.finish(Signal::Answered) };
            let freer = async {
                tokio::task::yield_now().await;
                first.finish(Signal::Answered);
            };
            tokio::join!(waiter, freer);
            assert_eq!(l.in_flight(), 0);
        });
    }

    proptest! {
        /// Whatever the answers, the limit stays within its bounds, slots
        /// never exceed it when taken, and every slot comes back.
        #[test]
        fn stays_within_bounds(steps in proptest::collection::vec((1usize..80, 0u8..3), 1..200)) {
            let l = Limiter::new(INITIAL_LIMIT);
            for (n, kind) in steps {
                let signal = match kind {
                    0 => Signal::Answered,
                    1 => Signal::Overloaded,
                    _ => Signal::Unanswered,
                };
                let slots: Vec<_> = (0..n).map_while(|_| l.try_acquire()).collect();
                prop_assert!(slots.len() <= MAX_LIMIT);
                prop_assert!(!slots.is_empty(), "at least one slot is always free when none is taken");
                for s in slots {
                    s.finish(signal);
                }
                prop_assert!((MIN_LIMIT..=MAX_LIMIT).contains(&l.limit()));
                prop_assert_eq!(l.in_flight(), 0);
            }
        }

        /// Answers alone bring a cut limit back to the maximum.
        #[test]
        fn recovers_after_busy_answers(cuts in 1usize..10) {
            let l = Limiter::new(MAX_LIMIT);
            for _ in 0..cuts {
                window(&l, MAX_LIMIT, Signal::Overloaded);
            }
            for _ in 0..2000 {
                window(&l, MAX_LIMIT, Signal::Answered);
            }
            prop_assert_eq!(l.limit(), MAX_LIMIT);
        }
    }
}
