//! A loopback TCP proxy in front of Azurite that misbehaves on purpose.
//!
//! Two plans: `start` answers the first N requests with one fault (503
//! ServerBusy, dropped connection, short body, or no answer at all), then
//! forwards everything untouched; `start_random` draws a fault for each request
//! at given rates (503 ServerBusy, a reset in the middle of the request or of
//! the response, a delay), bounded by a count and a time window, from a seed.
//! To see every request, the random plan adds `Connection: close`, so each
//! connection carries one request. `cut` makes storage unreachable: every open
//! connection is reset and new ones are closed at once; `hang_all` makes it
//! hang (requests read, never answered) until turned off; `land_late` holds
//! one matching request and forwards it on its own connection after a delay,
//! whether or not the client still waits (a write that lands late).
//!
//! A third plan, `start_copy`, makes a server-side copy look slow, since
//! Azurite finishes every Copy Blob at once: the answer to Copy Blob into one
//! destination says `pending`, and the destination's properties (the copy's
//! polls) show `pending` with progress short of the total, or `failed` after
//! some polls; or the polls fail for a while as the copy goes on
//! ([`CopyPlan`]). It forwards one request per connection and records every
//! exchange ([`Exchange`]), so a test can check which requests a copy (or a
//! restore) sent (Abort Copy Blob, Delete Blob, lease releases) and in what
//! order.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// How a faulty request is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `503 Server Busy` with `x-ms-error-code: ServerBusy`.
    ServerBusy,
    /// Read the request, then close the connection without answering.
    Drop,
    /// `206` announcing and sending 10 bytes, whatever was asked for.
    ShortBody,
    /// Read the request and never answer (until the client gives up).
    Hang,
    /// Forward half of the request upstream, then reset both connections.
    ResetRequest,
    /// Forward the request, pass part of the response on, then reset.
    ResetResponse,
    /// Wait `Rates::delay`, then forward normally.
    Delay,
}

/// Fault rates of the random plan, in requests per thousand, with bounds.
#[derive(Debug, Clone, Copy)]
pub struct Rates {
    /// 503 ServerBusy answers.
    pub busy_per_mille: u32,
    /// Resets in the middle of the request.
    pub reset_request_per_mille: u32,
    /// Resets in the middle of the response.
    pub reset_response_per_mille: u32,
    /// Delayed answers.
    pub delay_per_mille: u32,
    /// How long a delayed answer waits.
    pub delay: Duration,
    /// No more faults after this many.
    pub max_faults: u64,
    /// No more faults after this long since the start.
    pub window: Duration,
}

impl Rates {
    /// No faults at all: every request forwarded on a connection of its
    /// own (so each one can be matched, e.g. by `land_late`).
    pub fn none() -> Rates {
        Rates {
            busy_per_mille: 0,
            reset_request_per_mille: 0,
            reset_response_per_mille: 0,
            delay_per_mille: 0,
            delay: Duration::ZERO,
            max_faults: 0,
            window: Duration::ZERO,
        }
    }

    /// 10% ServerBusy, 1% + 1% resets (request, response), 2% delays of
    /// 300 ms; at most 100,000 faults within 10 minutes.
    pub fn issue_default() -> Rates {
        Rates {
            busy_per_mille: 100,
            reset_request_per_mille: 10,
            reset_response_per_mille: 10,
            delay_per_mille: 20,
            delay: Duration::from_millis(300),
            max_faults: 100_000,
            window: Duration::from_secs(600),
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Plan {
    Fixed(Fault, u64),
    Random(Rates),
    Copy(CopyPlan),
}

/// How the copy plan shows the copy into its destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyPlan {
    /// Pending at every poll, each a little further, never done. Abort Copy
    /// Blob goes on to the upstream, which (Azurite: its copy is finished)
    /// refuses it.
    Pending,
    /// As `Pending`, but the proxy answers Abort Copy Blob itself, `204` as
    /// the service does for a pending copy (the upstream never sees it); the
    /// polls after it say `aborted`.
    PendingAbortAccepted,
    /// Pending for this many polls, then `failed` with
    /// [`COPY_FAILED_DESCRIPTION`].
    FailsAfter(u32),
    /// The first this many polls (`u32::MAX`: all) are answered `503
    /// ServerBusy` by the proxy itself (storage unreachable while the copy
    /// goes on); the later ones reach the upstream and are passed on as it
    /// answers them (Azurite: the copy finished).
    PollsFail(u32),
}

/// The `x-ms-copy-status-description` of a copy that [`CopyPlan::FailsAfter`]
/// fails (the service's form: status, code, message).
pub const COPY_FAILED_DESCRIPTION: &str =
    "500 InternalError \"Copy failed: the source could not be read (injected by the test proxy)\"";

/// One request the copy plan passed on, and the answer the client got.
#[derive(Debug, Clone)]
pub struct Exchange {
    /// `GET`, `PUT`, `HEAD`, `DELETE`, ...
    pub method: String,
    /// The path, e.g. `/devstoreaccount1/c/d.vhd`.
    pub path: String,
    /// The query string (without `?`); empty when there is none.
    pub query: String,
    /// Request headers, names in lower case.
    pub headers: Vec<(String, String)>,
    /// The status the client got.
    pub status: u16,
    /// The response headers the client got (after any rewriting), names in
    /// lower case.
    pub response_headers: Vec<(String, String)>,
}

impl Exchange {
    /// A request header (name in lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        find_header(&self.headers, name)
    }

    /// A response header (name in lower case).
    pub fn response_header(&self, name: &str) -> Option<&str> {
        find_header(&self.response_headers, name)
    }

    /// The value of query parameter `name` (as sent, not decoded).
    pub fn query_param(&self, name: &str) -> Option<&str> {
        self.query
            .split('&')
            .find_map(|kv| kv.split_once('=').filter(|(k, _)| *k == name))
            .map(|(_, v)| v)
    }

    /// True for Copy Blob (`PUT` with `x-ms-copy-source`, no `comp=`).
    pub fn is_copy_blob(&self) -> bool {
        self.method == "PUT"
            && self.header("x-ms-copy-source").is_some()
            && self.query_param("comp").is_none()
    }

    /// True for Abort Copy Blob (`PUT ?comp=copy&copyid=`, `x-ms-copy-action: abort`).
    pub fn is_abort_copy(&self) -> bool {
        self.method == "PUT"
            && self.query_param("comp") == Some("copy")
            && self.header("x-ms-copy-action") == Some("abort")
    }

    /// True for Get Blob Properties (`HEAD`, no `comp=`).
    pub fn is_properties(&self) -> bool {
        self.method == "HEAD" && self.query_param("comp").is_none()
    }
}

impl std::fmt::Display for Exchange {
    /// One line, without headers (which hold signatures): `PUT /a/c/b?comp=copy -> 204`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.method, self.path)?;
        if !self.query.is_empty() {
            write!(f, "?{}", self.query)?;
        }
        if let Some(action) = self.header("x-ms-copy-action") {
            write!(f, " [copy-action {action}]")?;
        }
        if self.header("x-ms-copy-source").is_some() {
            write!(f, " [copy-source]")?;
        }
        write!(f, " -> {}", self.status)?;
        if let Some(status) = self.response_header("x-ms-copy-status") {
            write!(f, " [copy-status {status}]")?;
        }
        if let Some(code) = self.response_header("x-ms-error-code") {
            write!(f, " [{code}]")?;
        }
        Ok(())
    }
}

/// `exchanges` one per line, for assertion messages.
pub fn show<'a>(exchanges: impl IntoIterator<Item = &'a Exchange>) -> String {
    exchanges.into_iter().map(|x| format!("\n  {x}")).collect()
}

fn find_header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// What the copy plan knows of the copy into its destination.
#[derive(Debug, Default)]
struct CopyWatch {
    /// The destination's path (`/account/container/blob`).
    dest: String,
    /// Copy Blob into `dest` was answered with success by the upstream.
    started: bool,
    /// Properties polls of `dest` answered since.
    polls: u32,
    /// The proxy accepted an Abort Copy Blob (`PendingAbortAccepted`).
    aborted: bool,
    /// Every exchange, in the order the answers went back.
    log: Vec<Exchange>,
}

/// Counts of what the proxy did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    /// Requests seen.
    pub seen: u64,
    /// 503 answers.
    pub busy: u64,
    /// Resets mid-request.
    pub reset_request: u64,
    /// Resets mid-response.
    pub reset_response: u64,
    /// Delays.
    pub delayed: u64,
}

struct Shared {
    plan: Plan,
    faulted: AtomicU64,
    seen: AtomicU64,
    by_kind: [AtomicU64; 7],
    rng: Mutex<StdRng>,
    started: Instant,
    down: AtomicBool,
    hang: AtomicBool,
    /// Bumped to reset every open connection.
    cut: watch::Sender<u64>,
    upstream: String,
    /// The next request whose head contains this (lower case) is held for
    /// the delay, then forwarded.
    late: Mutex<Option<(String, Duration)>>,
    /// The upstream's status for the late request, once it arrived there.
    late_status: watch::Sender<Option<u16>>,
    /// The copy plan's state (unused by the other plans).
    copy: Mutex<CopyWatch>,
}

/// A running proxy. Dropping it stops accepting new connections.
pub struct FaultProxy {
    /// `http://127.0.0.1:PORT/devstoreaccount1`-style endpoint (the upstream's path).
    pub endpoint: url::Url,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Start a proxy to `upstream` (an http URL) that answers the first
    /// `faults` requests (`u64::MAX`: all) with `fault`.
    pub async fn start(upstream: &url::Url, fault: Fault, faults: u64) -> FaultProxy {
        Self::start_plan(upstream, Plan::Fixed(fault, faults), 0).await
    }

    /// Start a proxy to `upstream` drawing faults at `rates` from `seed`.
    pub async fn start_random(upstream: &url::Url, rates: Rates, seed: u64) -> FaultProxy {
        Self::start_plan(upstream, Plan::Random(rates), seed).await
    }

    /// Start a proxy to `upstream` that shows a Copy Blob into `dest` as
    /// `plan` says and records every exchange ([`Self::exchanges`]). The
    /// names in `dest` must need no percent-encoding (the proxy compares
    /// paths as sent).
    pub async fn start_copy(
        upstream: &url::Url,
        dest: &blobdrive::blob::BlobPath,
        plan: CopyPlan,
    ) -> FaultProxy {
        let proxy = Self::start_plan(upstream, Plan::Copy(plan), 0).await;
        let base = upstream.path().trim_end_matches('/');
        proxy.shared.copy.lock().expect("copy lock").dest =
            format!("{base}/{}/{}", dest.container, dest.name);
        proxy
    }

    /// The exchanges the copy plan saw so far, in order.
    pub fn exchanges(&self) -> Vec<Exchange> {
        self.shared.copy.lock().expect("copy lock").log.clone()
    }

    /// The path (`/account/container/blob`) the copy plan watches.
    pub fn copy_dest(&self) -> String {
        self.shared.copy.lock().expect("copy lock").dest.clone()
    }

    async fn start_plan(upstream: &url::Url, plan: Plan, seed: u64) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let port = listener.local_addr().expect("local addr").port();
        let up_addr = format!(
            "{}:{}",
            upstream.host_str().expect("upstream host"),
            upstream.port_or_known_default().expect("upstream port")
        );
        let mut endpoint = upstream.clone();
        endpoint.set_host(Some("127.0.0.1")).expect("set host");
        endpoint.set_port(Some(port)).expect("set port");
        let (cut, _) = watch::channel(0u64);
        let shared = Arc::new(Shared {
            plan,
            faulted: AtomicU64::new(0),
            seen: AtomicU64::new(0),
            by_kind: Default::default(),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            started: Instant::now(),
            down: AtomicBool::new(false),
            hang: AtomicBool::new(false),
            cut,
            upstream: up_addr,
            late: Mutex::new(None),
            late_status: watch::channel(None).0,
            copy: Mutex::new(CopyWatch::default()),
        });
        let s2 = shared.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    return;
                };
                if s2.down.load(Ordering::SeqCst) {
                    let _ = conn.set_zero_linger();
                    drop(conn);
                    continue;
                }
                let s = s2.clone();
                let mut cut = s2.cut.subscribe();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = serve(conn, &s) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        FaultProxy {
            endpoint,
            shared,
            task,
        }
    }

    /// Requests answered with a fault so far.
    pub fn faulted(&self) -> u64 {
        self.shared.faulted.load(Ordering::SeqCst)
    }

    /// Requests seen so far (the first on each connection for `start`).
    pub fn seen(&self) -> u64 {
        self.shared.seen.load(Ordering::SeqCst)
    }

    /// What the proxy did so far.
    pub fn tally(&self) -> Tally {
        let k = |f: Fault| self.shared.by_kind[f as usize].load(Ordering::SeqCst);
        Tally {
            seen: self.seen(),
            busy: k(Fault::ServerBusy),
            reset_request: k(Fault::ResetRequest),
            reset_response: k(Fault::ResetResponse),
            delayed: k(Fault::Delay),
        }
    }

    /// While `on`, every request is read and never answered (a hung
    /// backend); turning it on resets the open connections.
    pub fn hang_all(&self, on: bool) {
        self.shared.hang.store(on, Ordering::SeqCst);
        if on {
            // Pooled connections would otherwise pass requests on untouched.
            self.shared.cut.send_modify(|g| *g += 1);
        }
    }

    /// Hold the next request whose head contains `needle` (case-insensitive)
    /// for `delay`, then forward it upstream on a connection of its own,
    /// even if the client gave up on it long before.
    pub fn land_late(&self, needle: &str, delay: Duration) {
        *self.shared.late.lock().expect("late lock") = Some((needle.to_ascii_lowercase(), delay));
        self.shared.late_status.send_replace(None);
    }

    /// True once the request `land_late` waits for has arrived (and is
    /// being held).
    pub fn late_held(&self) -> bool {
        self.shared.late.lock().expect("late lock").is_none()
    }

    /// Waits (at most `timeout`) until the late request reached the
    /// upstream and returns the status it got there.
    pub async fn late_landed(&self, timeout: Duration) -> Option<u16> {
        let mut rx = self.shared.late_status.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(Option::is_some))
            .await
            .ok()
            .and_then(|r| r.ok().and_then(|v| *v))
    }

    /// Storage unreachable from now on: open connections are reset, new ones
    /// closed at once.
    pub fn cut(&self) {
        self.shared.down.store(true, Ordering::SeqCst);
        self.shared.cut.send_modify(|g| *g += 1);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}

/// Read one HTTP request head and body (Content-Length framing only).
async fn read_request(conn: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(head_end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() >= head_end + 4 + len {
                return Ok(buf);
            }
        }
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The request with `Connection: close` added after its request line.
fn with_connection_close(request: &[u8]) -> Vec<u8> {
    let Some(line_end) = request.windows(2).position(|w| w == b"\r\n") else {
        return request.to_vec();
    };
    let mut out = Vec::with_capacity(request.len() + 20);
    out.extend_from_slice(&request[..line_end + 2]);
    out.extend_from_slice(b"Connection: close\r\n");
    out.extend_from_slice(&request[line_end + 2..]);
    out
}

/// The delay to hold `request` for, when it is the awaited late one.
fn take_late(shared: &Shared, request: &[u8]) -> Option<Duration> {
    let head_end = request.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&request[..head_end]).to_ascii_lowercase();
    let mut late = shared.late.lock().expect("late lock");
    match &*late {
        Some((needle, delay)) if head.contains(needle.as_str()) => {
            let delay = *delay;
            *late = None;
            Some(delay)
        }
        _ => None,
    }
}

fn draw(shared: &Shared) -> Option<Fault> {
    match shared.plan {
        Plan::Fixed(fault, faults) => shared
            .faulted
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < faults).then_some(n + 1)
            })
            .is_ok()
            .then_some(fault),
        Plan::Copy(_) => None,
        Plan::Random(r) => {
            if shared.started.elapsed() > r.window
                || shared.faulted.load(Ordering::SeqCst) >= r.max_faults
            {
                return None;
            }
            let x: u32 = shared.rng.lock().expect("rng lock").random_range(0..1000);
            let mut edge = 0;
            let mut pick = None;
            for (rate, fault) in [
                (r.busy_per_mille, Fault::ServerBusy),
                (r.reset_request_per_mille, Fault::ResetRequest),
                (r.reset_response_per_mille, Fault::ResetResponse),
                (r.delay_per_mille, Fault::Delay),
            ] {
                edge += rate;
                if x < edge {
                    pick = Some(fault);
                    break;
                }
            }
            if pick.is_some() {
                shared.faulted.fetch_add(1, Ordering::SeqCst);
            }
            pick
        }
    }
}

async fn serve(mut conn: TcpStream, shared: &Shared) -> std::io::Result<()> {
    let mut request = read_request(&mut conn).await?;
    shared.seen.fetch_add(1, Ordering::SeqCst);
    if let Plan::Copy(plan) = shared.plan {
        return serve_copy(conn, shared, plan, &request).await;
    }
    let random = matches!(shared.plan, Plan::Random(_));
    if random {
        request = with_connection_close(&request);
    }
    if let Some(delay) = take_late(shared, &request) {
        // Held, then sent on its own, outliving the client's connection.
        let upstream = shared.upstream.clone();
        let status = shared.late_status.clone();
        let request = if random {
            request
        } else {
            with_connection_close(&request)
        };
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let Ok(mut up) = TcpStream::connect(&upstream).await else {
                return;
            };
            if up.write_all(&request).await.is_err() {
                return;
            }
            let mut answer = Vec::new();
            let _ = up.read_to_end(&mut answer).await;
            let code = String::from_utf8_lossy(&answer)
                .split_whitespace()
                .nth(1)
                .and_then(|c| c.parse().ok());
            status.send_replace(code);
        });
        // The client hears nothing until it gives up.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        return Ok(());
    }
    let fault = if shared.hang.load(Ordering::SeqCst) {
        Some(Fault::Hang)
    } else {
        draw(shared)
    };
    if let Some(f) = fault {
        shared.by_kind[f as usize].fetch_add(1, Ordering::SeqCst);
    }
    let reset = |c: &TcpStream| {
        let _ = c.set_zero_linger();
    };
    match fault {
        None => {}
        Some(Fault::ServerBusy) => {
            conn.write_all(
                b"HTTP/1.1 503 Service Unavailable\r\nx-ms-error-code: ServerBusy\r\n\
Content-Type: application/xml\r\nConnection: close\r\nContent-Length: 100\r\n\r\n\
<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>ServerBusy</Code><Message>Busy.</Message></Error>",
            )
            .await?;
            let _ = conn.shutdown().await;
            return Ok(());
        }
        Some(Fault::Drop) => {
            let _ = conn.shutdown().await;
            return Ok(());
        }
        Some(Fault::ShortBody) => {
            conn.write_all(
                b"HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\nConnection: close\r\n\r\n0123456789",
            )
            .await?;
            let _ = conn.shutdown().await;
            return Ok(());
        }
        Some(Fault::Hang) => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            return Ok(());
        }
        Some(Fault::ResetRequest) => {
            let mut up = TcpStream::connect(&shared.upstream).await?;
            up.write_all(&request[..request.len() / 2]).await?;
            reset(&up);
            reset(&conn);
            return Ok(());
        }
        Some(Fault::ResetResponse) => {
            let mut up = TcpStream::connect(&shared.upstream).await?;
            up.write_all(&request).await?;
            let mut buf = vec![0u8; 64 * 1024];
            let n = up.read(&mut buf).await?;
            // Pass on part of what came (at least the status line when it is
            // all there is), then cut.
            let keep = (n / 2).max(n.min(12));
            conn.write_all(&buf[..keep]).await?;
            reset(&up);
            reset(&conn);
            return Ok(());
        }
        Some(Fault::Delay) => {
            let delay = match shared.plan {
                Plan::Random(r) => r.delay,
                Plan::Fixed(..) | Plan::Copy(_) => Duration::from_millis(300),
            };
            tokio::time::sleep(delay).await;
        }
    }
    let mut up = TcpStream::connect(&shared.upstream).await?;
    up.write_all(&request).await?;
    tokio::io::copy_bidirectional(&mut conn, &mut up).await?;
    Ok(())
}

/// A request or response head: its first line and its headers.
struct Head {
    line: String,
    headers: Vec<(String, String)>,
}

/// Splits an HTTP message into its head and the bytes after it.
fn split_head(message: &[u8]) -> Option<(Head, &[u8])> {
    let end = message.windows(4).position(|w| w == b"\r\n\r\n")?;
    let text = String::from_utf8_lossy(&message[..end]);
    let mut lines = text.split("\r\n");
    let line = lines.next()?.to_string();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Some((Head { line, headers }, &message[end + 4..]))
}

/// Replaces (or adds) header `name` (lower case).
fn set_header(headers: &mut Vec<(String, String)>, name: &str, value: &str) {
    headers.retain(|(k, _)| k != name);
    headers.push((name.to_string(), value.to_string()));
}

/// The copy plan: forwards `request` on a connection of its own, reads the
/// whole answer, rewrites it when it concerns the copy into the watched
/// destination, records the exchange and answers the client.
async fn serve_copy(
    mut conn: TcpStream,
    shared: &Shared,
    plan: CopyPlan,
    request: &[u8],
) -> std::io::Result<()> {
    let request = with_connection_close(request);
    let Some((req, _)) = split_head(&request) else {
        return Ok(());
    };
    let mut parts = req.line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let target = parts.next().unwrap_or_default();
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut exchange = Exchange {
        method,
        path: path.to_string(),
        query: query.to_string(),
        headers: req.headers,
        status: 0,
        response_headers: Vec::new(),
    };
    let ours = exchange.path == shared.copy.lock().expect("copy lock").dest;
    if let CopyPlan::PollsFail(n) = plan {
        let failed = {
            let mut watch = shared.copy.lock().expect("copy lock");
            let fail = ours && watch.started && exchange.is_properties() && watch.polls < n;
            if fail {
                watch.polls += 1;
            }
            fail
        };
        if failed {
            let answer = b"HTTP/1.1 503 Service Unavailable\r\nx-ms-error-code: ServerBusy\r\n\
Content-Length: 0\r\nConnection: close\r\n\r\n";
            exchange.status = 503;
            exchange.response_headers = split_head(answer)
                .map(|(h, _)| h.headers)
                .unwrap_or_default();
            shared.copy.lock().expect("copy lock").log.push(exchange);
            conn.write_all(answer).await?;
            let _ = conn.shutdown().await;
            return Ok(());
        }
    }
    if ours && exchange.is_abort_copy() && plan == CopyPlan::PendingAbortAccepted {
        // What the service answers for a copy still pending.
        let answer = b"HTTP/1.1 204 No Content\r\nx-ms-version: 2021-08-06\r\n\
Content-Length: 0\r\nConnection: close\r\n\r\n";
        exchange.status = 204;
        exchange.response_headers = split_head(answer)
            .map(|(h, _)| h.headers)
            .unwrap_or_default();
        {
            let mut watch = shared.copy.lock().expect("copy lock");
            watch.aborted = true;
            watch.log.push(exchange);
        }
        conn.write_all(answer).await?;
        let _ = conn.shutdown().await;
        return Ok(());
    }
    let mut up = TcpStream::connect(&shared.upstream).await?;
    up.write_all(&request).await?;
    let mut answer = Vec::new();
    up.read_to_end(&mut answer).await?;
    let Some((mut resp, body)) = split_head(&answer) else {
        // Not HTTP: pass it on as it came.
        conn.write_all(&answer).await?;
        return Ok(());
    };
    exchange.status = resp
        .line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let ok = (200..300).contains(&exchange.status);
    {
        let mut watch = shared.copy.lock().expect("copy lock");
        if ours && ok && exchange.is_copy_blob() {
            watch.started = true;
            watch.polls = 0;
            set_header(&mut resp.headers, "x-ms-copy-status", "pending");
        } else if ours
            && ok
            && watch.started
            && exchange.is_properties()
            && !matches!(plan, CopyPlan::PollsFail(_))
        {
            watch.polls += 1;
            let total: u64 = find_header(&resp.headers, "content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(1 << 20);
            // A little further at every poll, never all of it.
            let done = total / 64 * u64::from(watch.polls.min(63));
            let progress = format!("{done}/{total}");
            let status = match plan {
                _ if watch.aborted => "aborted",
                CopyPlan::FailsAfter(n) if watch.polls > n => "failed",
                _ => "pending",
            };
            set_header(&mut resp.headers, "x-ms-copy-status", status);
            set_header(&mut resp.headers, "x-ms-copy-progress", &progress);
            if status == "failed" {
                set_header(
                    &mut resp.headers,
                    "x-ms-copy-status-description",
                    COPY_FAILED_DESCRIPTION,
                );
            }
        }
        exchange.response_headers = resp.headers.clone();
        watch.log.push(exchange);
    }
    let mut out = Vec::with_capacity(answer.len() + 256);
    out.extend_from_slice(resp.line.as_bytes());
    out.extend_from_slice(b"\r\n");
    for (k, v) in &resp.headers {
        out.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    conn.write_all(&out).await?;
    let _ = conn.shutdown().await;
    Ok(())
}
