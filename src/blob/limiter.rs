//! How many data requests of one kind (page writes, ranged reads) a client
//! keeps in flight: an AIMD controller shared by every clone of the client,
//! so every task using it slows together when the service says it is over
//! its targets. The commands make one client per drive, so in practice the
//! limit is per drive, which fits the service's targets: they are per blob
//! (a standard page blob's 60 MiB/s and 500 requests/s).
//!
//! Each attempt of a page write or ranged read takes a slot first and gives
//! it back with what the service answered. Slots are handed out in the
//! order they were asked for (a FIFO semaphore), so a new caller never
//! overtakes one that has waited. An answer that says the service is over
//! its targets (503 `ServerBusy`, 500 `OperationTimedOut`, 429) halves the
//! limit, from what was in flight when it came or half the limit, whichever
//! is more: a limit that had floated above what callers used still cuts at
//! once, but one lone 503 (the service also sends them while it moves a
//! partition) costs at most three quarters of the limit, not all of it.
//! Other answers from the same window of requests (those that took their
//! slot before that cut) neither cut again, as one overload usually answers
//! a whole burst, nor grow the limit, as they were sent at the old one.
//! Every answer to a request sent while at least half the limit was in use
//! adds `1 / limit` to it: about one slot more per two windows of requests,
//! as TCP's congestion window grows; a limit that callers do not use does
//! not grow. A retry takes its slot like any attempt, after its own
//! back-off: after a 503 the whole client sends less, instead of each
//! request retrying on its own.
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
//! Bounds: never below [`MIN_LIMIT`], 4, never above [`MAX_LIMIT`]. The
//! floor is not 1: an attempt that gets no answer holds its slot for up to
//! its timeout (60 s), so at a limit of 1 one lost request stops every
//! write or read of the client for that long, and 4 requests in flight are
//! far below any target the service throttles at. It starts
//! at [`INITIAL_LIMIT`], 32: what the engine's own bounds reach (8 Put
//! Pages of a flush; a loop device's or fio's 32 reads at once, one Get
//! each), so a fast link is never held back before the service has said
//! anything, and the first overload cuts from what was in flight.

use std::sync::Mutex;

use tokio::sync::Semaphore;

/// The fewest requests of a kind kept in flight (see the module head).
pub const MIN_LIMIT: usize = 4;
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
    /// Permits the semaphore still owes back after a cut took more than it
    /// had free: the next slots given back pay them instead of returning.
    debt: usize,
    /// Bumped at each cut: slots taken before it neither cut again nor grow.
    epoch: u64,
    /// Cuts so far.
    cuts: u64,
}

/// One kind of request's concurrency limit.
///
/// The semaphore holds the free slots: its permits plus the slots taken
/// minus `debt` is always the whole limit.
#[derive(Debug)]
pub struct Limiter {
    state: Mutex<State>,
    free: Semaphore,
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
        let initial = initial.clamp(MIN_LIMIT, MAX_LIMIT);
        Limiter {
            state: Mutex::new(State {
                limit: initial as f64,
                in_flight: 0,
                debt: 0,
                epoch: 0,
                cuts: 0,
            }),
            free: Semaphore::new(initial),
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

    /// A slot now, or `None` when the limit is in use (or others wait).
    pub fn try_acquire(&self) -> Option<Slot<'_>> {
        let permit = self.free.try_acquire().ok()?;
        permit.forget();
        Some(self.taken())
    }

    /// Wait for a slot, behind every caller already waiting.
    pub async fn acquire(&self) -> Slot<'_> {
        let permit = self
            .free
            .acquire()
            .await
            .expect("the limiter's semaphore is never closed");
        permit.forget();
        self.taken()
    }

    /// Account for a permit just taken from the semaphore.
    fn taken(&self) -> Slot<'_> {
        let mut s = self.lock();
        s.in_flight += 1;
        Slot {
            limiter: self,
            epoch: s.epoch,
            saturated: (s.in_flight * 2) as f64 >= s.limit,
            done: false,
        }
    }

    /// Set the limit, moving the semaphore's permits by the change in whole
    /// slots: a rise pays the debt first, a cut forgets free permits and
    /// owes the rest.
    fn set_limit(&self, s: &mut State, limit: f64) {
        let (old, new) = (s.limit as usize, limit as usize);
        s.limit = limit;
        if new > old {
            let rise = new - old;
            let paid = rise.min(s.debt);
            s.debt -= paid;
            self.free.add_permits(rise - paid);
        } else if new < old {
            let cut = old - new;
            s.debt += cut - self.free.forget_permits(cut);
        }
    }

    fn release(&self, slot: &Slot<'_>, signal: Option<Signal>) {
        let mut s = self.lock();
        let in_flight = s.in_flight;
        s.in_flight -= 1;
        if s.debt > 0 {
            s.debt -= 1;
        } else {
            self.free.add_permits(1);
        }
        if slot.epoch != s.epoch {
            // Sent before the last cut: its answer is about the old limit.
            return;
        }
        match signal {
            Some(Signal::Overloaded) => {
                // From what was in flight (not from a limit nobody used),
                // but never below half the limit for one answer alone.
                let base = (in_flight as f64).max(s.limit / 2.0);
                let cut = (base / 2.0).floor().max(MIN_LIMIT as f64);
                if cut < s.limit {
                    self.set_limit(&mut s, cut);
                }
                s.epoch += 1;
                s.cuts += 1;
            }
            Some(Signal::Answered) if slot.saturated => {
                let grown = (s.limit + 1.0 / s.limit).min(MAX_LIMIT as f64);
                self.set_limit(&mut s, grown);
            }
            _ => {}
        }
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
        let l = Limiter::new(64);
        window(&l, 48, Signal::Overloaded);
        assert_eq!(l.limit(), 24, "half of the 48 in flight, once");
        assert_eq!(l.cuts(), 1);
        window(&l, 24, Signal::Overloaded);
        assert_eq!(l.limit(), 12, "a later window cuts again");
    }

    #[test]
    fn a_lone_busy_answer_cuts_from_half_the_limit_and_never_below_the_floor() {
        let l = Limiter::new(32);
        window(&l, 1, Signal::Overloaded);
        assert_eq!(l.limit(), 8, "one 503 at 32 leaves 8, not 1");
        for _ in 0..10 {
            window(&l, 1, Signal::Overloaded);
        }
        assert_eq!(l.limit(), MIN_LIMIT);
        assert_eq!(l.free.available_permits(), MIN_LIMIT);
    }

    #[test]
    fn answers_to_slots_taken_before_a_cut_do_not_grow_the_new_limit() {
        let l = Limiter::new(8);
        let mut slots: Vec<_> = (0..8).map_while(|_| l.try_acquire()).collect();
        slots.pop().unwrap().finish(Signal::Overloaded);
        assert_eq!(l.limit(), 4);
        for s in slots {
            s.finish(Signal::Answered);
        }
        assert_eq!(l.limit(), 4, "seven answers sent at 8 do not add 7/4");
        assert_eq!(l.free.available_permits(), 4, "the cut's debt is paid");
    }

    #[test]
    fn a_waiter_gets_the_freed_slot_before_a_newcomer() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let l = Limiter::new(MIN_LIMIT);
            let mut held: Vec<_> = (0..MIN_LIMIT).map_while(|_| l.try_acquire()).collect();
            let waiter = l.acquire();
            tokio::pin!(waiter);
            // Queue the waiter.
            assert!(futures::poll!(waiter.as_mut()).is_pending());
            held.pop().unwrap().finish(Signal::Answered);
            assert!(l.try_acquire().is_none(), "the newcomer waits its turn");
            let slot = waiter.await;
            slot.finish(Signal::Answered);
            drop(held);
            assert_eq!(l.in_flight(), 0);
        });
    }

    #[test]
    fn waits_for_a_slot_freed_by_another() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let l = Limiter::new(MIN_LIMIT);
            let mut held: Vec<_> = (1..MIN_LIMIT).map_while(|_| l.try_acquire()).collect();
            let first = l.acquire().await;
            assert!(l.try_acquire().is_none());
            let waiter = async { l.acquire().await.finish(Signal::Answered) };
            let freer = async {
                tokio::task::yield_now().await;
                first.finish(Signal::Answered);
            };
            tokio::join!(waiter, freer);
            held.clear();
            assert_eq!(l.in_flight(), 0);
        });
    }

    proptest! {
        /// Whatever the answers and their order, the limit stays within its
        /// bounds, a slot is taken only while fewer than the limit are in
        /// flight, and every slot comes back: once all are given back, the
        /// free slots are exactly the limit.
        #[test]
        fn stays_within_bounds(steps in proptest::collection::vec((0usize..80, 0u8..4), 1..300)) {
            let l = Limiter::new(INITIAL_LIMIT);
            let mut held = Vec::new();
            for (n, kind) in steps {
                if kind == 3 {
                    let none_taken = held.is_empty();
                    for _ in 0..n {
                        match l.try_acquire() {
                            Some(s) => {
                                prop_assert!(l.in_flight() <= l.limit());
                                held.push(s);
                            }
                            None => break,
                        }
                    }
                    prop_assert!(n == 0 || !none_taken || !held.is_empty(), "a slot is always free when none is taken");
                    continue;
                }
                let signal = match kind {
                    0 => Signal::Answered,
                    1 => Signal::Overloaded,
                    _ => Signal::Unanswered,
                };
                if !held.is_empty() {
                    let at = n % held.len();
                    held.swap_remove(at).finish(signal);
                }
                prop_assert!((MIN_LIMIT..=MAX_LIMIT).contains(&l.limit()));
                prop_assert!(held.len() <= MAX_LIMIT);
            }
            held.clear();
            prop_assert_eq!(l.in_flight(), 0);
            prop_assert_eq!(l.free.available_permits(), l.limit());
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
