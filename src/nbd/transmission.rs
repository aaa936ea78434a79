//! The transmission phase of one connection: requests read in order, served
//! concurrently on the export's device, replies written whole (one reply's
//! chunks never interleave with another's) in the order they complete.
//!
//! What each command does to the drive engine: READ is `Device::read_at`,
//! WRITE `write_at` (then `flush` with FUA), FLUSH `flush` (the blob has
//! every write completed before it, on any connection: they share one
//! cache), TRIM and WRITE_ZEROES `discard` (Clear Pages; with NO_HOLE zeros
//! are written instead), BLOCK_STATUS `Device::allocation` (the sparse map
//! merged with the dirty pages).
//!
//! Bad requests are refused with the specification's error and the
//! connection goes on: past the end (`NBD_EINVAL`, `NBD_ENOSPC` for
//! writes), over the maximum payload (`NBD_EINVAL`; a WRITE's payload is
//! read and dropped to stay in frame), a write to a read-only export
//! (`NBD_EPERM`), an unknown command (`NBD_EINVAL`). Only a wrong magic or
//! a truncated request closes it. Memory is bounded: the payloads of the
//! requests in flight on a connection stay under [`MAX_IN_FLIGHT_BYTES`],
//! those of all connections under the server's budget. A client that stops
//! in the middle of a WRITE's payload for [`IO_TIMEOUT`] (a suspended
//! `nbdcopy`) is disconnected, which frees the budget it held for every
//! other client.
//!
//! Replies are paced by progress, over the connection rather than per
//! reply: while any reply waits for the client, it must take at least
//! [`MIN_PROGRESS_BYTES`] of them in each [`IO_TIMEOUT`] (or all that
//! waited). One deadline per reply would let a slow loris keep its budget
//! for ever (a small reply taken just before each deadline), and cut off a
//! slow but steady reader whose large reply takes longer than the timeout;
//! with a progress window, a client that stalls anywhere in a reply, or
//! takes its replies slower than that rate, loses its connection within
//! one window, and any reader at least that fast is served.
//!
//! A connection that has no request in flight is idle; it keeps its
//! connection slot for as long as it stays open (a kernel `nbd-client` is
//! idle for hours between bursts) unless the server was given an idle
//! limit (`--idle-timeout`), after which it is closed.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{watch, Mutex, Semaphore};
use tokio::task::JoinSet;

use super::export::{Export, ExportCounters, MAX_PAYLOAD_BYTES, MIN_BLOCK_BYTES};
use super::handshake::Negotiated;
use super::proto::*;
use crate::fs::FsError;

/// Payload bytes a connection may have in flight (reads and writes).
pub const MAX_IN_FLIGHT_BYTES: u32 = 64 * 1024 * 1024;
/// Payload bytes all connections together may have in flight: what bounds
/// the server's memory for request data, whatever `--max-connections` is.
pub const MAX_SERVER_IN_FLIGHT_BYTES: u64 = 256 * 1024 * 1024;
/// Units of the in-flight budget (semaphore permits are counted in these).
pub const BUDGET_UNIT: u32 = 4096;

/// The server-wide payload budget every connection draws from (after its
/// own), in [`BUDGET_UNIT`]s.
pub fn server_budget(max_bytes: u64) -> Arc<Semaphore> {
    let units =
        (max_bytes / u64::from(BUDGET_UNIT)).max(u64::from(MAX_PAYLOAD_BYTES / BUDGET_UNIT));
    Arc::new(Semaphore::new(
        units.min(Semaphore::MAX_PERMITS as u64) as usize
    ))
}
/// Most block status descriptors in one reply (the specification's bound).
const MAX_DESCRIPTORS: usize = 1 << 20;
/// Most of a drive one BLOCK_STATUS looks at (the specification lets a
/// reply cover less than was asked): bounds the work and the reply, at
/// most one descriptor per 512-byte page, 1 MiB.
const BLOCK_STATUS_SCAN_BYTES: u64 = 64 << 20;
/// How long a client may take to send a WRITE's payload, and the window in
/// which it must take [`MIN_PROGRESS_BYTES`] of the replies waiting for it,
/// while the payload budget is held for it.
pub const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// The least a client must take of the replies waiting for it in each
/// [`IO_TIMEOUT`] (about 35 KB/s by default): slower, and its connection and
/// budget go to others.
pub const MIN_PROGRESS_BYTES: u64 = 1024 * 1024;
/// Replies go out in pieces of at most this, so the progress window is
/// checked within a large reply, not only at its end.
const REPLY_PIECE_BYTES: usize = 256 * 1024;
/// How long a stopping server waits for a client to take its replies.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// The read buffer of a connection.
const READ_BUFFER_BYTES: usize = 256 * 1024;
/// A reply up to this size goes out in one write (header and data copied
/// together); a larger one in two, without the copy.
const COALESCE_BYTES: usize = 64 * 1024;

/// What a request is answered with.
enum Reply {
    Done,
    Data(Bytes),
    Status(Vec<(u32, u32)>),
    Error(u32, String),
}

/// How a connection ended.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionEnd {
    /// The client sent `NBD_CMD_DISC` or closed its end between requests.
    #[error("disconnected")]
    Disconnected,
    /// The server is stopping.
    #[error("server stopping")]
    Stopping,
    /// No request was in flight for the server's idle limit.
    #[error("idle for {} s (--idle-timeout): closed", .0.as_secs_f64())]
    Idle(Duration),
    /// A framing error or a failed connection.
    #[error("{0}")]
    Broken(String),
}

/// The time limits of a connection.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// How long a client may take to send a WRITE's payload, and the window
    /// in which it must take [`MIN_PROGRESS_BYTES`] of its waiting replies.
    pub io: Duration,
    /// How long a connection may have no request in flight; `None`: for
    /// ever.
    pub idle: Option<Duration>,
}

/// Serves requests on `stream` until the client disconnects, the framing
/// breaks, the connection is idle past `timeouts.idle`, or `stop` turns
/// true; returns after every request read has been answered.
pub async fn serve<R, W>(
    reader: R,
    writer: W,
    session: Negotiated,
    server_budget: Arc<Semaphore>,
    timeouts: Timeouts,
    mut stop: watch::Receiver<bool>,
) -> ConnectionEnd
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let io_timeout = timeouts.io;
    // Buffered: a request header is 28 bytes, and reading each with its own
    // system call would cost more than serving it from the cache.
    let mut reader = tokio::io::BufReader::with_capacity(READ_BUFFER_BYTES, reader);
    let output = Arc::new(Mutex::new(Output::new(writer)));
    // Replies encoded and not yet written: while there are any, the client
    // is expected to be taking them.
    let waiting = Arc::new(AtomicUsize::new(0));
    let activity = Arc::new(Activity::new());
    let session = Arc::new(session);
    let budget = Arc::new(Semaphore::new((MAX_IN_FLIGHT_BYTES / BUDGET_UNIT) as usize));
    let mut tasks = JoinSet::new();
    // Set by a reply that could not be written in time: the stream is out
    // of frame, so the connection ends and no later reply is tried.
    let stalled = Arc::new(AtomicBool::new(false));
    let stalled_wake = Arc::new(tokio::sync::Notify::new());
    let end = loop {
        if stalled.load(Ordering::Acquire) {
            break stalled_end(io_timeout);
        }
        while tasks.try_join_next().is_some() {}
        let mut header = [0u8; REQUEST_BYTES];
        let read = tokio::select! {
            r = reader.read_exact(&mut header) => r,
            _ = stop.wait_for(|s| *s) => break ConnectionEnd::Stopping,
            _ = stalled_wake.notified() => break stalled_end(io_timeout),
            limit = activity.idle_for(timeouts.idle) => break ConnectionEnd::Idle(limit),
        };
        activity.touch();
        match read {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                break ConnectionEnd::Disconnected
            }
            Err(e) => break ConnectionEnd::Broken(format!("reading a request: {e}")),
        }
        let request = match Request::parse(&header) {
            Ok(r) => r,
            Err(e) => break ConnectionEnd::Broken(format!("{e}: closing the connection")),
        };
        if request.command == NBD_CMD_DISC {
            break ConnectionEnd::Disconnected;
        }
        // Payload budget: a WRITE's data, a READ's reply, the largest
        // BLOCK_STATUS reply its (clipped) range can need.
        let want = match request.command {
            NBD_CMD_WRITE | NBD_CMD_READ if request.len_bytes <= MAX_PAYLOAD_BYTES => {
                request.len_bytes.div_ceil(BUDGET_UNIT).max(1)
            }
            NBD_CMD_BLOCK_STATUS => {
                (u64::from(request.len_bytes).min(BLOCK_STATUS_SCAN_BYTES) / 512 * 8)
                    .div_ceil(u64::from(BUDGET_UNIT))
                    .max(1) as u32
            }
            _ => 1,
        };
        // A stop must not wait for a client that takes no replies. The
        // connection's own budget first, then the server's: one greedy
        // connection holds at most its own share of the server's.
        let permit = tokio::select! {
            p = budget.clone().acquire_many_owned(want) => match p {
                Ok(p) => p,
                Err(_) => break ConnectionEnd::Stopping,
            },
            _ = stop.wait_for(|s| *s) => break ConnectionEnd::Stopping,
        };
        let server_permit = tokio::select! {
            p = server_budget.clone().acquire_many_owned(want) => match p {
                Ok(p) => p,
                Err(_) => break ConnectionEnd::Stopping,
            },
            _ = stop.wait_for(|s| *s) => break ConnectionEnd::Stopping,
        };
        let mut payload = Bytes::new();
        if request.command == NBD_CMD_WRITE {
            let len = u64::from(request.len_bytes);
            if request.len_bytes > MAX_PAYLOAD_BYTES {
                // Stay in frame: read the payload and drop it.
                let copied = tokio::time::timeout(
                    io_timeout,
                    tokio::io::copy(&mut (&mut reader).take(len), &mut tokio::io::sink()),
                )
                .await;
                if !matches!(copied, Ok(Ok(n)) if n == len) {
                    break ConnectionEnd::Broken("truncated write payload".into());
                }
            } else {
                let mut buf = BytesMut::zeroed(request.len_bytes as usize);
                let read = tokio::select! {
                    r = tokio::time::timeout(io_timeout, reader.read_exact(&mut buf)) => r,
                    // Not acknowledged: nothing is lost by dropping it.
                    _ = stop.wait_for(|s| *s) => break ConnectionEnd::Stopping,
                };
                match read {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        break ConnectionEnd::Broken(format!("truncated write payload: {e}"))
                    }
                    // Not acknowledged either: the budget goes back.
                    Err(_) => {
                        break ConnectionEnd::Broken(format!(
                            "no write payload for {} s: disconnected (its payload budget freed)",
                            io_timeout.as_secs()
                        ))
                    }
                }
                payload = buf.freeze();
            }
        }
        let session = session.clone();
        let output = output.clone();
        let waiting = waiting.clone();
        let stalled = stalled.clone();
        let stalled_wake = stalled_wake.clone();
        let active = activity.start();
        tasks.spawn(async move {
            let _active = active;
            let reply = answer(&session, &request, payload).await;
            let bytes = encode(&session, &request, reply);
            let bytes = coalesce(bytes);
            waiting.fetch_add(1, Ordering::AcqRel);
            let mut out = output.lock().await;
            let sent = if stalled.load(Ordering::Acquire) {
                Sent::Skipped
            } else {
                out.send(&bytes, io_timeout).await
            };
            // The last reply waiting is out: whatever comes next starts a
            // new progress window (the client could take nothing meanwhile).
            if waiting.fetch_sub(1, Ordering::AcqRel) == 1 {
                out.idle = true;
            }
            drop(out);
            drop(permit);
            drop(server_permit);
            match sent {
                Sent::Done | Sent::Skipped => {}
                Sent::Gone(e) => {
                    tracing::debug!(error = %e, "NBD reply not sent: the client is gone")
                }
                Sent::TooSlow => {
                    stalled.store(true, Ordering::Release);
                    stalled_wake.notify_one();
                }
            }
        });
    };
    // Every request read was answered by the device before its reply is
    // written; at a stop, a client that does not take its replies within
    // the grace is dropped, so the final flush is never held up by it.
    let grace = match end {
        ConnectionEnd::Stopping => STOP_GRACE,
        _ => Duration::MAX,
    };
    let drained =
        tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(
            seconds = STOP_GRACE.as_secs(),
            "an NBD client took no replies after the stop; dropping its connection"
        );
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
    let _ = tokio::time::timeout(STOP_GRACE, async {
        let _ = output.lock().await.writer.shutdown().await;
    })
    .await;
    end
}

/// How a connection whose client did not take its replies in time ends.
fn stalled_end(io_timeout: Duration) -> ConnectionEnd {
    ConnectionEnd::Broken(format!(
        "the client took less than {} MiB of its replies in {} s: disconnected (its payload budget freed)",
        MIN_PROGRESS_BYTES >> 20,
        io_timeout.as_secs_f64()
    ))
}

/// What became of one reply.
enum Sent {
    Done,
    /// An earlier reply was too slow: the stream is out of frame.
    Skipped,
    /// The connection failed.
    Gone(std::io::Error),
    /// The client fell below the least progress.
    TooSlow,
}

/// The write half of a connection and the progress window of its client.
struct Output<W> {
    writer: W,
    /// When the current window began.
    window_start: Instant,
    /// Bytes taken in it.
    window_taken: u64,
    /// No reply waited after the last one written: the next opens a new
    /// window.
    idle: bool,
}

impl<W: AsyncWrite + Unpin> Output<W> {
    fn new(writer: W) -> Self {
        Output {
            writer,
            window_start: Instant::now(),
            window_taken: 0,
            idle: true,
        }
    }

    /// Writes one reply in pieces, each within the current window; a window
    /// in which the client took [`MIN_PROGRESS_BYTES`] gives way to the next.
    async fn send(&mut self, parts: &[Bytes], io_timeout: Duration) -> Sent {
        if self.idle {
            self.idle = false;
            self.window_start = Instant::now();
            self.window_taken = 0;
        }
        for part in parts {
            for piece in part.chunks(REPLY_PIECE_BYTES) {
                let deadline = tokio::time::Instant::from_std(self.window_start + io_timeout);
                match tokio::time::timeout_at(deadline, self.writer.write_all(piece)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Sent::Gone(e),
                    Err(_) => return Sent::TooSlow,
                }
                self.window_taken += piece.len() as u64;
                if self.window_taken >= MIN_PROGRESS_BYTES {
                    self.window_start = Instant::now();
                    self.window_taken = 0;
                }
            }
        }
        let deadline = tokio::time::Instant::from_std(self.window_start + io_timeout);
        match tokio::time::timeout_at(deadline, self.writer.flush()).await {
            Ok(Ok(())) => Sent::Done,
            Ok(Err(e)) => Sent::Gone(e),
            Err(_) => Sent::TooSlow,
        }
    }
}

/// What the idle limit watches: the requests in flight and when the last
/// one came or went.
struct Activity {
    in_flight: AtomicUsize,
    last: std::sync::Mutex<Instant>,
}

/// One request in flight; it is over when this is dropped (answered, or
/// its task aborted).
struct Active(Arc<Activity>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Activity {
    fn new() -> Self {
        Activity {
            in_flight: AtomicUsize::new(0),
            last: std::sync::Mutex::new(Instant::now()),
        }
    }

    /// Notes activity now.
    fn touch(&self) {
        *self.last.lock().expect("activity mutex poisoned") = Instant::now();
    }

    /// A request starts.
    fn start(self: &Arc<Self>) -> Active {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Active(self.clone())
    }

    /// Returns `limit` once no request has been in flight for `limit`;
    /// never without one.
    async fn idle_for(&self, limit: Option<Duration>) -> Duration {
        let Some(limit) = limit else {
            return std::future::pending().await;
        };
        loop {
            let due = *self.last.lock().expect("activity mutex poisoned") + limit;
            if self.in_flight.load(Ordering::Acquire) > 0 {
                // Busy: looked at again a limit later (a request that ends
                // meanwhile moves `last` on).
                tokio::time::sleep(limit).await;
            } else if Instant::now() >= due {
                return limit;
            } else {
                tokio::time::sleep_until(tokio::time::Instant::from_std(due)).await;
            }
        }
    }
}

/// Joins the parts of a small reply into one buffer, so it leaves in one
/// system call.
fn coalesce(parts: Vec<Bytes>) -> Vec<Bytes> {
    let total: usize = parts.iter().map(Bytes::len).sum();
    if parts.len() < 2 || total > COALESCE_BYTES {
        return parts;
    }
    let mut one = BytesMut::with_capacity(total);
    for p in &parts {
        one.put_slice(p);
    }
    vec![one.freeze()]
}

/// The error a device failure is answered with.
fn nbd_error(e: &FsError) -> u32 {
    match e.errno {
        libc::EROFS | libc::EPERM | libc::EACCES => NBD_EPERM,
        libc::ENOSPC => NBD_ENOSPC,
        libc::EINVAL => NBD_EINVAL,
        libc::ENOMEM => NBD_ENOMEM,
        _ => NBD_EIO,
    }
}

/// A refused request's reply; its warning is rate-limited per kind
/// (`refusals.rs`).
fn refused(request: &Request, error: u32, why: String) -> Reply {
    let kind = (request.command_name(), error);
    if let Some(left_out) = super::refusals::global().admit(kind, std::time::Instant::now()) {
        tracing::warn!(
            command = request.command_name(),
            command_number = request.command,
            offset_bytes = request.offset_bytes,
            len_bytes = request.len_bytes,
            left_out,
            "NBD request refused: {why}{}",
            super::refusals::note(left_out)
        );
    }
    Reply::Error(error, why)
}

/// Checks a request against the export and the agreed constraints.
fn check(session: &Negotiated, request: &Request) -> Result<(), Reply> {
    let export = &session.export;
    let size = export.device.size_bytes();
    let end = request
        .offset_bytes
        .checked_add(u64::from(request.len_bytes));
    let writes = matches!(
        request.command,
        NBD_CMD_WRITE | NBD_CMD_TRIM | NBD_CMD_WRITE_ZEROES
    );
    if writes && export.read_only {
        return Err(refused(
            request,
            NBD_EPERM,
            format!("export {} is read-only", export.name),
        ));
    }
    let ranged = matches!(
        request.command,
        NBD_CMD_READ | NBD_CMD_WRITE | NBD_CMD_TRIM | NBD_CMD_WRITE_ZEROES | NBD_CMD_BLOCK_STATUS
    );
    if !ranged {
        return Ok(());
    }
    if end.is_none_or(|end| end > size) {
        let error = if matches!(request.command, NBD_CMD_WRITE | NBD_CMD_WRITE_ZEROES) {
            NBD_ENOSPC
        } else {
            NBD_EINVAL
        };
        return Err(refused(
            request,
            error,
            format!("past the end of the export ({size} bytes)"),
        ));
    }
    if matches!(request.command, NBD_CMD_READ | NBD_CMD_WRITE)
        && request.len_bytes > MAX_PAYLOAD_BYTES
    {
        return Err(refused(
            request,
            NBD_EINVAL,
            format!("longer than the maximum payload ({MAX_PAYLOAD_BYTES} bytes)"),
        ));
    }
    let unaligned = request.offset_bytes % u64::from(MIN_BLOCK_BYTES) != 0
        || request.len_bytes % MIN_BLOCK_BYTES != 0;
    if session.block_sizes_agreed && unaligned {
        return Err(refused(
            request,
            NBD_EINVAL,
            format!("not aligned to the minimum block size ({MIN_BLOCK_BYTES} bytes)"),
        ));
    }
    Ok(())
}

async fn answer(session: &Negotiated, request: &Request, payload: Bytes) -> Reply {
    let export = &session.export;
    let counters = &export.counters;
    let reply = match check(session, request) {
        Err(reply) => reply,
        Ok(()) => match perform(session, export, request, payload).await {
            Ok(reply) => reply,
            Err(e) => {
                tracing::warn!(
                    export = %export.name,
                    command = request.command_name(),
                    offset_bytes = request.offset_bytes,
                    len_bytes = request.len_bytes,
                    error = %e,
                    "NBD request failed"
                );
                Reply::Error(nbd_error(&e), e.message)
            }
        },
    };
    if matches!(reply, Reply::Error(..)) {
        ExportCounters::bump(&counters.errors, 1);
    }
    reply
}

async fn perform(
    session: &Negotiated,
    export: &Export,
    request: &Request,
    payload: Bytes,
) -> Result<Reply, FsError> {
    let device = &export.device;
    let counters = &export.counters;
    let fua = request.flags & NBD_CMD_FLAG_FUA != 0;
    let offset = request.offset_bytes;
    let len = u64::from(request.len_bytes);
    match request.command {
        NBD_CMD_READ => {
            let data = device.read_at(offset, request.len_bytes as usize).await?;
            if data.len() as u64 != len {
                return Err(FsError::io(format!(
                    "short read: {} of {len} bytes",
                    data.len()
                )));
            }
            ExportCounters::bump(&counters.read_requests, 1);
            ExportCounters::bump(&counters.read_bytes, len);
            Ok(Reply::Data(data))
        }
        NBD_CMD_WRITE => {
            device.write_at(offset, &payload).await?;
            ExportCounters::bump(&counters.write_requests, 1);
            ExportCounters::bump(&counters.write_bytes, len);
            if fua {
                device.flush().await?;
                ExportCounters::bump(&counters.flushes, 1);
            }
            Ok(Reply::Done)
        }
        NBD_CMD_FLUSH => {
            device.flush().await?;
            ExportCounters::bump(&counters.flushes, 1);
            Ok(Reply::Done)
        }
        NBD_CMD_TRIM | NBD_CMD_WRITE_ZEROES => {
            if request.flags & NBD_CMD_FLAG_FAST_ZERO != 0 {
                return Ok(refused(
                    request,
                    NBD_ENOTSUP,
                    "fast zeroing was not offered".into(),
                ));
            }
            let keep = request.command == NBD_CMD_WRITE_ZEROES
                && request.flags & NBD_CMD_FLAG_NO_HOLE != 0;
            if keep {
                device.write_zeroes_allocated(offset, len).await?;
            } else {
                device.discard(offset, len).await?;
            }
            ExportCounters::bump(&counters.zeroes, 1);
            if fua {
                device.flush().await?;
                ExportCounters::bump(&counters.flushes, 1);
            }
            Ok(Reply::Done)
        }
        NBD_CMD_BLOCK_STATUS => {
            if session.allocation_context.is_none() {
                return Ok(refused(
                    request,
                    NBD_EINVAL,
                    "no metadata context was selected".into(),
                ));
            }
            let descriptors = allocation_descriptors(
                device.allocation(offset, len.min(BLOCK_STATUS_SCAN_BYTES)),
                request.flags & NBD_CMD_FLAG_REQ_ONE != 0,
            );
            if descriptors.is_empty() {
                return Ok(refused(request, NBD_EINVAL, "an empty range".into()));
            }
            ExportCounters::bump(&counters.block_status, 1);
            Ok(Reply::Status(descriptors))
        }
        _ => Ok(refused(request, NBD_EINVAL, "unknown command".into())),
    }
}

/// `base:allocation` descriptors for the extents a device reported: data
/// is status 0, a hole `NBD_STATE_HOLE | NBD_STATE_ZERO`; neighbours of the
/// same status merge; each length fits 32 bits (whole pages).
pub fn allocation_descriptors(extents: Vec<crate::fs::Extent>, only_one: bool) -> Vec<(u32, u32)> {
    const MAX_LEN: u64 = u32::MAX as u64 & !511;
    let mut out: Vec<(u64, u32)> = Vec::new();
    for e in extents.into_iter().filter(|e| e.len_bytes > 0) {
        let status = if e.data {
            0
        } else {
            NBD_STATE_HOLE | NBD_STATE_ZERO
        };
        match out.last_mut() {
            Some((len, s)) if *s == status => *len += e.len_bytes,
            _ => out.push((e.len_bytes, status)),
        }
    }
    let mut descriptors = Vec::new();
    for (mut len, status) in out {
        while len > 0 {
            let piece = len.min(MAX_LEN);
            descriptors.push((piece as u32, status));
            len -= piece;
        }
        if descriptors.len() >= MAX_DESCRIPTORS {
            break;
        }
    }
    descriptors.truncate(if only_one { 1 } else { MAX_DESCRIPTORS });
    descriptors
}

/// The bytes of a reply, in order.
fn encode(session: &Negotiated, request: &Request, reply: Reply) -> Vec<Bytes> {
    let cookie = request.cookie;
    if !session.structured {
        return match reply {
            Reply::Done => vec![Bytes::copy_from_slice(&simple_reply(cookie, 0))],
            Reply::Data(data) => vec![Bytes::copy_from_slice(&simple_reply(cookie, 0)), data],
            Reply::Error(e, _) => vec![Bytes::copy_from_slice(&simple_reply(cookie, e))],
            // Refused before: block status needs a structured reply.
            Reply::Status(_) => vec![Bytes::copy_from_slice(&simple_reply(cookie, NBD_EINVAL))],
        };
    }
    match reply {
        Reply::Done => vec![Bytes::copy_from_slice(&chunk_header(
            cookie,
            NBD_REPLY_FLAG_DONE,
            NBD_REPLY_TYPE_NONE,
            0,
        ))],
        Reply::Data(data) if data.is_empty() => vec![Bytes::copy_from_slice(&chunk_header(
            cookie,
            NBD_REPLY_FLAG_DONE,
            NBD_REPLY_TYPE_NONE,
            0,
        ))],
        Reply::Data(data) => {
            let mut head = BytesMut::with_capacity(28);
            head.put_slice(&chunk_header(
                cookie,
                NBD_REPLY_FLAG_DONE,
                NBD_REPLY_TYPE_OFFSET_DATA,
                8 + data.len() as u32,
            ));
            head.put_u64(request.offset_bytes);
            vec![head.freeze(), data]
        }
        Reply::Status(descriptors) => {
            let id = session.allocation_context.unwrap_or_default();
            vec![block_status_chunk(cookie, id, &descriptors).freeze()]
        }
        Reply::Error(e, message) => vec![error_chunk(cookie, e, &message).freeze()],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::Extent;

    #[test]
    fn allocation_merges_neighbours_and_honours_req_one() {
        let extents = vec![
            Extent {
                len_bytes: 4096,
                data: true,
            },
            Extent {
                len_bytes: 512,
                data: true,
            },
            Extent {
                len_bytes: 8192,
                data: false,
            },
        ];
        let hole = NBD_STATE_HOLE | NBD_STATE_ZERO;
        assert_eq!(
            allocation_descriptors(extents.clone(), false),
            vec![(4608, 0), (8192, hole)]
        );
        assert_eq!(allocation_descriptors(extents, true), vec![(4608, 0)]);
    }

    #[test]
    fn a_long_hole_is_cut_into_32_bit_descriptors() {
        let extents = vec![Extent {
            len_bytes: 8 << 30,
            data: false,
        }];
        let d = allocation_descriptors(extents, false);
        assert_eq!(d.iter().map(|(l, _)| u64::from(*l)).sum::<u64>(), 8 << 30);
        assert!(d.iter().all(|(l, _)| l % 512 == 0));
    }
}
