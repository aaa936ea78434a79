//! Waits to the tenth of a millisecond ([`DelayLine`]): tokio's timer ticks
//! in whole milliseconds, so each of a request's waits (half a round trip
//! in, a turn under a cap, a body on the link plus half a round trip out)
//! would end up to a millisecond late, half a millisecond on average: a
//! 5 ms round trip would come out near 6 ms and a 2 ms one near 3 ms. One
//! thread holds every pending wake-up in deadline order and sleeps on a
//! channel's timed receive (a futex wait with a nanosecond timeout) until
//! the nearest.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Instant;

use tokio::sync::oneshot;

/// One pending wake-up: when, a tiebreak, and whom to wake.
struct Pending(Instant, u64, oneshot::Sender<()>);

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        (self.0, self.1) == (other.0, other.1)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.0, self.1).cmp(&(other.0, other.1))
    }
}

/// The thread that wakes waiting tasks on time. It ends when the line is
/// dropped.
#[derive(Debug)]
pub struct DelayLine {
    tx: mpsc::Sender<(Instant, oneshot::Sender<()>)>,
}

impl DelayLine {
    /// Starts the thread.
    pub fn new() -> DelayLine {
        let (tx, rx) = mpsc::channel::<(Instant, oneshot::Sender<()>)>();
        std::thread::Builder::new()
            .name("model-delays".into())
            .spawn(move || {
                let mut heap: BinaryHeap<Reverse<Pending>> = BinaryHeap::new();
                let mut seq = 0u64;
                loop {
                    let now = Instant::now();
                    while heap.peek().is_some_and(|Reverse(p)| p.0 <= now) {
                        let Reverse(Pending(_, _, wake)) = heap.pop().expect("peeked");
                        let _ = wake.send(());
                    }
                    let got = match heap.peek() {
                        Some(Reverse(p)) => rx.recv_timeout(p.0.saturating_duration_since(now)),
                        None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                    };
                    match got {
                        Ok((at, wake)) => {
                            seq += 1;
                            heap.push(Reverse(Pending(at, seq, wake)));
                        }
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
            })
            .expect("a thread can be started");
        DelayLine { tx }
    }

    /// Returns at `at` (at once when it has passed).
    pub async fn until(&self, at: Instant) {
        if at <= Instant::now() {
            return;
        }
        let (wake, woken) = oneshot::channel();
        if self.tx.send((at, wake)).is_err() {
            // The thread is gone (only at shutdown): fall back to the timer.
            tokio::time::sleep_until(at.into()).await;
            return;
        }
        let _ = woken.await;
    }

    /// Returns after `d`.
    pub async fn sleep(&self, d: std::time::Duration) {
        self.until(Instant::now() + d).await;
    }
}

impl Default for DelayLine {
    fn default() -> Self {
        DelayLine::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_wait_ends_within_a_fraction_of_a_millisecond() {
        let line = DelayLine::new();
        let mut late = Vec::new();
        for i in 0..50u64 {
            let want = Duration::from_micros(500 + 37 * i);
            let t = Instant::now();
            line.sleep(want).await;
            let took = t.elapsed();
            assert!(took >= want, "{took:?} < {want:?}");
            late.push(took - want);
        }
        late.sort();
        // The median, so a loaded machine's odd stall does not count.
        assert!(late[25] < Duration::from_micros(400), "{late:?}");
    }
}
