//! An optional record of every request the model served, one line each,
//! for looking at what a client did over time (how many requests it kept
//! in flight, how long each waited for a cap and for the upstream).
//!
//! Tab-separated, after a header line: milliseconds since the model
//! started at the request's arrival, method, the blob (or the path), body
//! bytes up and down, milliseconds waited for a cap, milliseconds the
//! upstream took, the status given to the client (503: refused).

use std::fs::File;
use std::io::{LineWriter, Write as _};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// One request, as the trace records it.
#[derive(Debug, Clone)]
pub struct Line<'a> {
    /// When it arrived (after the way in).
    pub arrived: Instant,
    /// `GET`, `PUT`, ...
    pub method: &'a str,
    /// The blob, or the path when it names none.
    pub what: &'a str,
    /// Body bytes from the client.
    pub up: u64,
    /// Body bytes to the client.
    pub down: u64,
    /// Time waited for the caps.
    pub waited: Duration,
    /// Time the upstream took (zero when refused).
    pub upstream: Duration,
    /// Status given to the client.
    pub status: u16,
}

/// Where lines go, if anywhere.
#[derive(Debug)]
pub struct Trace {
    started: Instant,
    out: Option<Mutex<LineWriter<File>>>,
}

impl Trace {
    /// No trace.
    pub fn off() -> Trace {
        Trace {
            started: Instant::now(),
            out: None,
        }
    }

    /// A trace into a new file at `path`.
    pub fn to_file(path: &Path) -> std::io::Result<Trace> {
        let mut out = LineWriter::new(File::create(path)?);
        writeln!(
            out,
            "t_ms\tmethod\tblob\tup_bytes\tdown_bytes\twait_ms\tupstream_ms\tstatus"
        )?;
        Ok(Trace {
            started: Instant::now(),
            out: Some(Mutex::new(out)),
        })
    }

    /// Records one request (a failed write is dropped: the trace is an aid).
    pub fn record(&self, line: &Line<'_>) {
        let Some(out) = &self.out else { return };
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let mut out = out.lock().expect("trace lock: no panic holds it");
        let _ = writeln!(
            out,
            "{:.3}\t{}\t{}\t{}\t{}\t{:.3}\t{:.3}\t{}",
            ms(line.arrived.saturating_duration_since(self.started)),
            line.method,
            line.what,
            line.up,
            line.down,
            ms(line.waited),
            ms(line.upstream),
            line.status
        );
    }
}
