//! Progress of a transfer: counters the workers bump, and a reporter thread
//! that shows them: a bar redrawn in place on stderr when both stdout and
//! stderr are terminals (bytes scanned, bytes sent, rate, ETA), plain log
//! lines on stderr every few seconds otherwise.
//!
//! Written here rather than taken from a crate: it is one line of text, and
//! the non-terminal mode (what CI logs and `| tee` see) matters as much as
//! the bar. The counters are plain atomics, so workers never wait on it.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::units::format_size;

/// Counters of one transfer. All in bytes except `requests`.
#[derive(Debug, Default)]
pub struct Progress {
    /// Bytes of the image to go through.
    pub total_bytes: AtomicU64,
    /// Bytes dealt with so far: read, found to be holes, or already in the
    /// blob (resume).
    pub scanned_bytes: AtomicU64,
    /// Bytes sent (upload) or received (download).
    pub transferred_bytes: AtomicU64,
    /// Bytes of data found to be zero pages (not sent or not written).
    pub zero_bytes: AtomicU64,
    /// Bytes skipped as holes (upload: of the file; download: of the blob).
    pub hole_bytes: AtomicU64,
    /// Bytes checked against the blob before resuming.
    pub verified_bytes: AtomicU64,
    /// Data requests made (Put Page, Clear Pages, Get Blob).
    pub requests: AtomicU64,
}

impl Progress {
    /// New zeroed counters for an image of `total_bytes`.
    pub fn new(total_bytes: u64) -> Arc<Progress> {
        let p = Progress::default();
        p.total_bytes.store(total_bytes, Ordering::Relaxed);
        Arc::new(p)
    }

    /// Read one counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    /// Add to one counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Display {
    /// Nothing.
    Quiet,
    /// A bar redrawn in place on stderr.
    Bar,
    /// A log line on stderr every few seconds.
    Lines,
}

impl Display {
    /// A bar when both stdout and stderr are terminals, lines otherwise
    /// (see [`Display::for_streams`]).
    pub fn auto() -> Display {
        Display::for_streams(
            std::io::stdout().is_terminal(),
            std::io::stderr().is_terminal(),
        )
    }

    /// The display for streams that are (or are not) terminals. The bar is
    /// drawn on stderr, but only when stdout is a terminal too: with stdout
    /// piped or redirected (`upload ... > summary.txt`, `| tee`) the run is
    /// being recorded, and a record wants lines, not carriage returns.
    pub fn for_streams(stdout_is_terminal: bool, stderr_is_terminal: bool) -> Display {
        if stdout_is_terminal && stderr_is_terminal {
            Display::Bar
        } else {
            Display::Lines
        }
    }
}

/// Seconds between two plain log lines.
const LINE_EVERY: Duration = Duration::from_secs(5);
/// Time between two redraws of the bar.
const BAR_EVERY: Duration = Duration::from_millis(200);

/// A thread that shows a [`Progress`] until [`Reporter::finish`].
#[derive(Debug)]
pub struct Reporter {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Reporter {
    /// Start showing `progress` of the transfer named `verb` ("upload").
    pub fn start(progress: Arc<Progress>, verb: &'static str, display: Display) -> Reporter {
        if display == Display::Quiet {
            return Reporter {
                stop: None,
                thread: None,
            };
        }
        let (tx, rx) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let started = Instant::now();
            let every = if display == Display::Bar {
                BAR_EVERY
            } else {
                LINE_EVERY
            };
            loop {
                let stopped =
                    !matches!(rx.recv_timeout(every), Err(mpsc::RecvTimeoutError::Timeout));
                // Nothing to show until the size is known (the blob is
                // still being created or inspected).
                if !stopped && Progress::get(&progress.total_bytes) == 0 {
                    continue;
                }
                let line = status_line(&progress, verb, started.elapsed());
                let mut err = std::io::stderr().lock();
                if display == Display::Bar {
                    // Clear the bar on the way out; the summary follows.
                    let shown = if stopped { String::new() } else { line };
                    let _ = write!(err, "\r\x1b[2K{shown}");
                } else if !stopped {
                    let _ = writeln!(err, "{line}");
                }
                let _ = err.flush();
                if stopped {
                    return;
                }
            }
        });
        Reporter {
            stop: Some(tx),
            thread: Some(thread),
        }
    }

    /// Stop showing progress (and clear the bar).
    pub fn finish(mut self) {
        self.stop_thread();
    }

    fn stop_thread(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

/// Bytes per second of `bytes` over `elapsed`.
pub fn rate(bytes: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs > 0.0 {
        bytes as f64 / secs
    } else {
        0.0
    }
}

/// `12.3 MiB/s`.
pub fn format_rate(bytes_per_sec: f64) -> String {
    format!("{}/s", format_size(bytes_per_sec as u64))
}

/// `1:02:03` or `2:03`.
pub fn format_duration(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

/// One status line: `upload  43% [#####     ] 880.0 MiB/2.0 GiB scanned,
/// 96.0 MiB sent, 45.1 MiB/s, ETA 0:20`.
pub fn status_line(p: &Progress, verb: &str, elapsed: Duration) -> String {
    let total = Progress::get(&p.total_bytes);
    let scanned = Progress::get(&p.scanned_bytes).min(total);
    let moved = Progress::get(&p.transferred_bytes);
    let verified = Progress::get(&p.verified_bytes);
    let fraction = if total > 0 {
        scanned as f64 / total as f64
    } else {
        1.0
    };
    const WIDTH: usize = 20;
    let filled = ((fraction * WIDTH as f64) as usize).min(WIDTH);
    let bar = format!("{}{}", "#".repeat(filled), " ".repeat(WIDTH - filled));
    let eta = if scanned > 0 && scanned < total {
        let left = elapsed.as_secs_f64() * (total - scanned) as f64 / scanned as f64;
        format!(", ETA {}", format_duration(Duration::from_secs_f64(left)))
    } else {
        String::new()
    };
    let verb_done = if verb == "upload" { "sent" } else { "received" };
    let check = if verified > 0 {
        format!(", {} verified", format_size(verified))
    } else {
        String::new()
    };
    format!(
        "{verb} {:3.0}% [{bar}] {}/{} scanned{check}, {} {verb_done}, {}{eta}",
        fraction * 100.0,
        format_size(scanned),
        format_size(total),
        format_size(moved),
        format_rate(rate(moved, elapsed)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_line_shows_fraction_rate_and_eta() {
        let p = Progress::new(100 << 20);
        Progress::add(&p.scanned_bytes, 50 << 20);
        Progress::add(&p.transferred_bytes, 20 << 20);
        let line = status_line(&p, "upload", Duration::from_secs(2));
        assert!(
            line.starts_with("upload  50% [##########          ]"),
            "{line}"
        );
        assert!(line.contains("50.0 MiB/100.0 MiB scanned"), "{line}");
        assert!(
            line.contains("20.0 MiB sent, 10.0 MiB/s, ETA 0:02"),
            "{line}"
        );
    }

    #[test]
    fn the_bar_needs_both_stdout_and_stderr_on_a_terminal() {
        assert_eq!(Display::for_streams(true, true), Display::Bar);
        assert_eq!(Display::for_streams(false, true), Display::Lines);
        assert_eq!(Display::for_streams(true, false), Display::Lines);
        assert_eq!(Display::for_streams(false, false), Display::Lines);
    }

    #[test]
    fn durations_read_like_clocks() {
        assert_eq!(format_duration(Duration::from_secs(62)), "1:02");
        assert_eq!(format_duration(Duration::from_secs(3723)), "1:02:03");
    }
}
