//! Rate-limited warnings for refused requests: a client that sends a
//! million bad requests gets a million error replies, not a million log
//! lines. The first refusal of a kind (command and error) is logged at
//! once; later ones within [`INTERVAL`] are counted, and the next line of
//! that kind after the interval says how many were left out. When no later
//! refusal comes, the server's reporter (`listen.rs`, every interval and at
//! exit) logs the count left out ([`Refusals::expired`]), so none is lost.
//! Connections refused at accept (over the maximum, another user), options
//! refused in the handshake (by option and reply) and failed or timed-out
//! handshakes go through the same limit.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// At most one line per kind of refusal in this time.
pub const INTERVAL: Duration = Duration::from_secs(10);

/// A kind of refusal: the command's name and the error answered.
pub type Kind = (&'static str, u32);

/// When a kind was last logged and how many refusals of it were not.
#[derive(Default)]
pub struct Refusals {
    kinds: Mutex<HashMap<Kind, (Instant, u64)>>,
}

impl Refusals {
    /// Whether a refusal of `kind` at `now` is logged, and how many of the
    /// same kind were left out since the last line; `None` to stay quiet.
    pub fn admit(&self, kind: Kind, now: Instant) -> Option<u64> {
        let mut kinds = self.kinds.lock().unwrap_or_else(|p| p.into_inner());
        match kinds.get_mut(&kind) {
            Some((last, left_out)) if now.duration_since(*last) < INTERVAL => {
                *left_out += 1;
                None
            }
            Some((last, left_out)) => {
                *last = now;
                Some(std::mem::take(left_out))
            }
            None => {
                kinds.insert(kind, (now, 0));
                Some(0)
            }
        }
    }
}

impl Refusals {
    /// The kinds whose interval has ended with refusals left out, with
    /// their counts; every kind whose interval has ended is forgotten, so
    /// its next refusal is logged at once.
    pub fn expired(&self, now: Instant) -> Vec<(Kind, u64)> {
        let mut kinds = self.kinds.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        kinds.retain(|kind, (last, left_out)| {
            if now.duration_since(*last) < INTERVAL {
                return true;
            }
            if *left_out > 0 {
                out.push((*kind, *left_out));
            }
            false
        });
        out
    }

    /// Every count left out so far (the server's exit), forgetting all.
    pub fn take_all(&self) -> Vec<(Kind, u64)> {
        let mut kinds = self.kinds.lock().unwrap_or_else(|p| p.into_inner());
        kinds
            .drain()
            .filter(|(_, (_, n))| *n > 0)
            .map(|(k, (_, n))| (k, n))
            .collect()
    }
}

/// The end of a refusal's line that says how many like it were not logged.
pub fn note(left_out: u64) -> String {
    if left_out == 0 {
        return String::new();
    }
    format!(
        " ({left_out} more like it in the last {} s not logged)",
        INTERVAL.as_secs()
    )
}

/// Logs the refusals of `kind` left out since its last line.
pub fn log_left_out(kind: Kind, left_out: u64) {
    tracing::warn!(
        command = kind.0,
        error = kind.1,
        left_out,
        "{left_out} more NBD refusals like the last one logged ({}) were not logged",
        kind.0
    );
}

/// The refusals of this process (all connections, all exports).
pub fn global() -> &'static Refusals {
    static REFUSALS: std::sync::OnceLock<Refusals> = std::sync::OnceLock::new();
    REFUSALS.get_or_init(Refusals::default)
}

/// Runs `f` on a current-thread runtime, returning its result and every
/// line logged meanwhile (from any task on that runtime).
#[cfg(test)]
pub(crate) fn logged<T>(f: impl std::future::Future<Output = T>) -> (T, String) {
    use std::sync::Arc;
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let out = tracing::subscriber::with_default(subscriber, || runtime.block_on(f));
    let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    (out, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_kind_per_interval_with_the_count_left_out() {
        let r = Refusals::default();
        let t0 = Instant::now();
        let kind = ("write", 1);
        assert_eq!(r.admit(kind, t0), Some(0));
        for i in 1..=5 {
            assert_eq!(r.admit(kind, t0 + Duration::from_millis(i)), None);
        }
        // Another kind is not held back by the first.
        assert_eq!(r.admit(("read", 22), t0), Some(0));
        assert_eq!(r.admit(kind, t0 + INTERVAL), Some(5));
        assert_eq!(r.admit(kind, t0 + INTERVAL + INTERVAL), Some(0));
    }

    #[test]
    fn a_count_left_out_is_reported_when_its_interval_ends_without_another_refusal() {
        let r = Refusals::default();
        let t0 = Instant::now();
        let kind = ("write", 1);
        assert_eq!(r.admit(kind, t0), Some(0));
        assert_eq!(r.admit(kind, t0 + Duration::from_millis(1)), None);
        assert_eq!(r.admit(kind, t0 + Duration::from_millis(2)), None);
        assert!(r.expired(t0 + Duration::from_secs(1)).is_empty(), "not yet");
        assert_eq!(r.expired(t0 + INTERVAL), vec![(kind, 2)]);
        assert!(r.expired(t0 + INTERVAL).is_empty(), "reported once");
        // Forgotten: the next one is logged at once.
        assert_eq!(r.admit(kind, t0 + INTERVAL), Some(0));
        assert_eq!(r.admit(kind, t0 + INTERVAL), None);
        assert_eq!(r.take_all(), vec![(kind, 1)], "at exit");
    }
}
