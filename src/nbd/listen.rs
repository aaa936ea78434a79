//! Where an NBD server listens, and the accept loop: a Unix socket of mode
//! 0600 whose peers are checked (`SO_PEERCRED`: root or the server's own
//! user), or TCP, on loopback unless remote clients are allowed; at most
//! `max_connections` connections at once (more are closed at accept, with a
//! log line); a handshake that does not finish in time is dropped.
//!
//! A connection takes its slot at accept, before the handshake, and holds
//! it until it closes, busy or idle: a kernel `nbd-client` holds one for as
//! long as its device is connected, so idle connections are not cut by
//! default. What frees a slot: the client closing, a handshake not finished
//! in [`HANDSHAKE_TIMEOUT`], a framing error, a client that stops in a
//! WRITE's payload or falls behind in taking its replies, a TCP peer that
//! stops answering keepalive probes, and, only when asked for
//! (`--idle-timeout`), a connection with no request in flight for that
//! long.
//!
//! TCP has no peer check: on loopback every local user can connect, which
//! the README says.

use std::net::{SocketAddr, ToSocketAddrs};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use super::export::{ExportCounters, Exports};
use super::handshake::negotiate;
use super::{refusals, transmission};

/// Connections served at once by default.
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;
/// Time a client has to finish the handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Idle time before a TCP connection is probed.
const TCP_KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
/// Time between unanswered probes.
const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Unanswered probes before the connection is dropped (about 2.5 minutes
/// of silence in all).
const TCP_KEEPALIVE_PROBES: u32 = 9;

/// Where to listen, as `--nbd` gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// `unix:PATH`.
    Unix(PathBuf),
    /// `tcp:HOST:PORT`.
    Tcp(SocketAddr),
}

impl Endpoint {
    /// Parses `unix:PATH` or `tcp:HOST:PORT`; a TCP address other than
    /// loopback needs `allow_remote`.
    pub fn parse(text: &str, allow_remote: bool) -> Result<Endpoint, String> {
        if let Some(path) = text.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("--nbd unix:PATH needs a path".into());
            }
            return Ok(Endpoint::Unix(PathBuf::from(path)));
        }
        let Some(addr) = text.strip_prefix("tcp:") else {
            return Err(format!("--nbd {text}: give unix:PATH or tcp:HOST:PORT"));
        };
        let resolved: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| format!("--nbd {text}: not a HOST:PORT ({e})"))?
            .collect();
        let Some(first) = resolved.first().copied() else {
            return Err(format!("--nbd {text}: the host resolves to no address"));
        };
        if !allow_remote && !first.ip().is_loopback() {
            return Err(format!(
                "--nbd {text} is not a loopback address: NBD has no authentication, so \
                 serving other hosts needs --allow-remote"
            ));
        }
        Ok(Endpoint::Tcp(first))
    }
}

impl std::fmt::Display for Endpoint {
    /// `unix:PATH` or `tcp:IP:PORT`, as `--nbd` takes it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(path) => write!(f, "unix:{}", path.display()),
            Endpoint::Tcp(addr) => write!(f, "tcp:{addr}"),
        }
    }
}

/// A bound listener.
pub enum Listener {
    /// A Unix socket, its path and the (device, inode) it was made as: it
    /// is removed when the listener is dropped, only if the path still
    /// names that socket (another server may have replaced it since).
    Unix(UnixListener, PathBuf, (u64, u64)),
    /// A TCP socket.
    Tcp(TcpListener),
}

/// Makes the socket just bound at `path` 0600 without following a link:
/// in a directory others may write to, the path could be swapped for a
/// symbolic link between the bind and a plain chmod, which would then
/// change the mode of the link's target. Returns the socket's (device,
/// inode), taken from the same handle, so the identity the server later
/// checks before unlinking is the one it restricted.
fn restrict_socket(path: &std::path::Path) -> anyhow::Result<(u64, u64)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
    let cant = |e: std::io::Error| anyhow::anyhow!("cannot restrict {}: {e}", path.display());
    let handle = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(cant)?;
    let meta = handle.metadata().map_err(cant)?;
    if !meta.file_type().is_socket() {
        anyhow::bail!("{} is no longer the socket just made", path.display());
    }
    // The descriptor's own path: chmod of what was opened, not of the name.
    use std::os::fd::AsRawFd;
    std::fs::set_permissions(
        format!("/proc/self/fd/{}", handle.as_raw_fd()),
        std::fs::Permissions::from_mode(0o600),
    )
    .map_err(cant)?;
    Ok((meta.dev(), meta.ino()))
}

impl Listener {
    /// Binds `endpoint`. A Unix path that is a socket nobody answers on is
    /// replaced; anything else there is refused.
    pub fn bind(endpoint: &Endpoint) -> anyhow::Result<Listener> {
        match endpoint {
            Endpoint::Unix(path) => {
                remove_stale_socket(path)?;
                let listener = UnixListener::bind(path)
                    .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", path.display()))?;
                let made = restrict_socket(path)?;
                Ok(Listener::Unix(listener, path.clone(), made))
            }
            Endpoint::Tcp(addr) => {
                let listener = std::net::TcpListener::bind(addr)
                    .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
                listener.set_nonblocking(true)?;
                Ok(Listener::Tcp(TcpListener::from_std(listener)?))
            }
        }
    }

    /// The address clients use: `unix:PATH` or `tcp:IP:PORT` (the port
    /// the system chose for port 0).
    pub fn address(&self) -> String {
        match self {
            Listener::Unix(_, path, _) => format!("unix:{}", path.display()),
            Listener::Tcp(l) => match l.local_addr() {
                Ok(a) => format!("tcp:{a}"),
                Err(_) => "tcp:?".into(),
            },
        }
    }

    /// An NBD URI for export `name` (the form qemu and libnbd take).
    pub fn uri(&self, name: &str) -> String {
        match self {
            Listener::Unix(_, path, _) => format!("nbd+unix:///{name}?socket={}", path.display()),
            Listener::Tcp(l) => match l.local_addr() {
                Ok(a) => format!("nbd://{a}/{name}"),
                Err(_) => format!("nbd:///{name}"),
            },
        }
    }
}

/// The (device, inode) of the file at `path`, not following a link.
fn socket_identity(path: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path)?;
    Ok((meta.dev(), meta.ino()))
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path, made) = self {
            match socket_identity(path) {
                Ok(now) if now == *made => {
                    let _ = std::fs::remove_file(path);
                }
                Ok(_) => tracing::info!(
                    path = %path.display(),
                    "the NBD socket path names another file now; left in place"
                ),
                Err(_) => {}
            }
        }
    }
}

fn remove_stale_socket(path: &Path) -> anyhow::Result<()> {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !meta.file_type().is_socket() {
        anyhow::bail!(
            "cannot listen on {}: it exists and is not a socket",
            path.display()
        );
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        anyhow::bail!(
            "cannot listen on {}: another server is listening there",
            path.display()
        );
    }
    std::fs::remove_file(path)?;
    Ok(())
}

/// Limits of the accept loop.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once.
    pub max_connections: usize,
    /// Time a client has to finish the handshake.
    pub handshake_timeout: Duration,
    /// Payload bytes all connections together may have in flight.
    pub max_in_flight_bytes: u64,
    /// Time a client has to send a WRITE's payload, and the window in
    /// which it must take a share of its replies
    /// (`transmission::MIN_PROGRESS_BYTES`).
    pub io_timeout: Duration,
    /// How long a connection may have no request in flight before it is
    /// closed; `None` (the default): for as long as the client keeps it.
    pub idle_timeout: Option<Duration>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            max_in_flight_bytes: transmission::MAX_SERVER_IN_FLIGHT_BYTES,
            io_timeout: transmission::IO_TIMEOUT,
            idle_timeout: None,
        }
    }
}

/// Accepts and serves connections until `shutdown` completes; then stops
/// reading requests, waits for those in flight to be answered and returns.
/// The caller closes the exports' devices afterwards.
pub async fn serve(
    listener: &Listener,
    exports: Arc<Exports>,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let payload_budget = transmission::server_budget(limits.max_in_flight_bytes);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    let owner = crate::private_dir::euid();
    tokio::pin!(shutdown);
    let mut next_id = 0u64;
    // The counts of refusals left out are logged when their interval ends,
    // even when no later refusal of the kind comes.
    let reporter = tokio::spawn(async {
        let mut tick = tokio::time::interval(refusals::INTERVAL);
        loop {
            tick.tick().await;
            for (kind, left_out) in refusals::global().expired(std::time::Instant::now()) {
                refusals::log_left_out(kind, left_out);
            }
        }
    });
    loop {
        while connections.try_join_next().is_some() {}
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            a = accept(listener) => a,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "NBD accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        next_id += 1;
        let id = next_id;
        if let Some(uid) = peer.uid {
            if uid != 0 && uid != owner {
                if let Some(left_out) = admit_refusal("connection from another user") {
                    tracing::warn!(
                        connection = id,
                        uid,
                        left_out,
                        "NBD connection from another user refused (only root or uid {owner} may connect){}",
                        refusals::note(left_out)
                    );
                }
                ExportCounters::bump(&exports.counters.refused_connections, 1);
                continue;
            }
        }
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            if let Some(left_out) = admit_refusal("connection over the maximum") {
                tracing::warn!(
                    connection = id,
                    peer = %peer.name,
                    max = limits.max_connections,
                    left_out,
                    "NBD connection refused: the server already serves its maximum of connections{}",
                    refusals::note(left_out)
                );
            }
            ExportCounters::bump(&exports.counters.refused_connections, 1);
            continue;
        };
        ExportCounters::bump(&exports.counters.connections, 1);
        let exports = exports.clone();
        let stop = stop_rx.clone();
        let budget = payload_budget.clone();
        connections.spawn(async move {
            connection(stream, id, &peer.name, &exports, limits, budget, stop).await;
            drop(slot);
        });
    }
    let _ = stop_tx.send(true);
    while connections.join_next().await.is_some() {}
    reporter.abort();
    for (kind, left_out) in refusals::global().take_all() {
        refusals::log_left_out(kind, left_out);
    }
}

/// Whether a connection refused at accept is logged (`refusals.rs`), and
/// how many like it were left out since the last line.
fn admit_refusal(what: &'static str) -> Option<u64> {
    refusals::global().admit((what, 0), std::time::Instant::now())
}

/// Who connected.
struct Peer {
    uid: Option<u32>,
    name: String,
}

/// An accepted connection of either kind.
enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

/// The two halves of a connection, each usable on its own without a lock
/// between them (`into_split`), boxed.
type Halves = (
    Box<dyn AsyncRead + Unpin + Send>,
    Box<dyn AsyncWrite + Unpin + Send>,
);

impl Stream {
    fn into_halves(self) -> Halves {
        match self {
            Stream::Unix(s) => {
                let (r, w) = s.into_split();
                (Box::new(r), Box::new(w))
            }
            Stream::Tcp(s) => {
                let (r, w) = s.into_split();
                (Box::new(r), Box::new(w))
            }
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

async fn accept(listener: &Listener) -> std::io::Result<(Stream, Peer)> {
    match listener {
        Listener::Unix(l, _, _) => {
            let (s, _) = l.accept().await?;
            let cred = s.peer_cred()?;
            let peer = Peer {
                uid: Some(cred.uid()),
                name: format!("pid {}", cred.pid().unwrap_or(0)),
            };
            Ok((Stream::Unix(s), peer))
        }
        Listener::Tcp(l) => {
            let (s, addr) = l.accept().await?;
            let _ = s.set_nodelay(true);
            // A client host that vanishes (power lost, cable pulled) sends
            // no FIN: keepalive probes find it, and its connection slot
            // and payload budget come back.
            let keepalive = socket2::TcpKeepalive::new()
                .with_time(TCP_KEEPALIVE_IDLE)
                .with_interval(TCP_KEEPALIVE_INTERVAL)
                .with_retries(TCP_KEEPALIVE_PROBES);
            if let Err(e) = socket2::SockRef::from(&s).set_tcp_keepalive(&keepalive) {
                tracing::debug!(error = %e, "TCP keepalive not set");
            }
            Ok((
                Stream::Tcp(s),
                Peer {
                    uid: None,
                    name: addr.to_string(),
                },
            ))
        }
    }
}

async fn connection(
    mut stream: Stream,
    id: u64,
    peer: &str,
    exports: &Exports,
    limits: Limits,
    payload_budget: Arc<Semaphore>,
    stop: watch::Receiver<bool>,
) {
    // A server that stops does not wait for a handshake to finish.
    let mut stopping = stop.clone();
    let handshake = tokio::time::timeout(limits.handshake_timeout, negotiate(&mut stream, exports));
    let outcome = tokio::select! {
        r = handshake => r,
        _ = stopping.wait_for(|s| *s) => {
            tracing::debug!(connection = id, "NBD handshake cut short: the server stops");
            return;
        }
    };
    let negotiated = match outcome {
        Ok(Ok(Some(n))) => n,
        Ok(Ok(None)) => {
            tracing::debug!(connection = id, "NBD client ended the handshake");
            return;
        }
        // One line per kind and interval (`refusals.rs`): anyone who may
        // connect can fail handshakes as fast as they connect.
        Ok(Err(e)) => {
            if let Some(left_out) = admit_refusal("handshake failed") {
                tracing::warn!(
                    connection = id,
                    peer,
                    left_out,
                    "NBD handshake failed: {e}{}",
                    refusals::note(left_out)
                );
            }
            return;
        }
        Err(_) => {
            if let Some(left_out) = admit_refusal("handshake not finished in time") {
                tracing::warn!(
                    connection = id,
                    peer,
                    left_out,
                    "NBD handshake not finished in {} s: closed{}",
                    limits.handshake_timeout.as_secs(),
                    refusals::note(left_out)
                );
            }
            return;
        }
    };
    let export = negotiated.export.name.clone();
    tracing::info!(
        connection = id,
        peer,
        export = %export,
        structured = negotiated.structured,
        allocation = negotiated.allocation_context.is_some(),
        "NBD client connected"
    );
    let (reader, writer) = stream.into_halves();
    let end = transmission::serve(
        reader,
        writer,
        negotiated,
        payload_budget,
        transmission::Timeouts {
            io: limits.io_timeout,
            idle: limits.idle_timeout,
        },
        stop,
    )
    .await;
    match end {
        transmission::ConnectionEnd::Broken(why) => {
            tracing::warn!(connection = id, peer, export = %export, "NBD connection closed: {why}")
        }
        other => {
            tracing::info!(connection = id, peer, export = %export, "NBD connection ended: {other}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nbd::refusals::logged;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    #[test]
    fn many_failed_handshakes_log_few_lines() {
        const PEERS: usize = 40;
        let ((), log) = logged(async {
            let endpoint = Endpoint::Tcp("127.0.0.1:0".parse().unwrap());
            let listener = Listener::bind(&endpoint).unwrap();
            let Listener::Tcp(tcp) = &listener else {
                unreachable!()
            };
            let addr = tcp.local_addr().unwrap();
            let limits = Limits {
                handshake_timeout: Duration::from_millis(100),
                ..Limits::default()
            };
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let peers = async move {
                for i in 0..PEERS {
                    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
                    let mut greeting = [0u8; 18];
                    c.read_exact(&mut greeting).await.unwrap();
                    if i % 2 == 0 {
                        // Unknown client flags: a framing error.
                        c.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
                        let _ = c.read_to_end(&mut Vec::new()).await;
                    } else {
                        // Silence until the handshake's time is up.
                        let _ = c.read_to_end(&mut Vec::new()).await;
                    }
                }
                let _ = stop.send(());
            };
            let server = serve(
                &listener,
                Arc::new(Exports::new(Vec::new())),
                limits,
                async {
                    let _ = stopped.await;
                },
            );
            tokio::join!(server, peers);
        });
        for what in ["NBD handshake failed", "NBD handshake not finished"] {
            let lines = log.lines().filter(|l| l.contains(what)).count();
            assert!(
                (1..=2).contains(&lines),
                "{lines} lines '{what}' for {} peers:\n{log}",
                PEERS / 2
            );
        }
    }
}
