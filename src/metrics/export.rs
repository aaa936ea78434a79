//! Serving the metrics text: an HTTP listener answering `GET /metrics` (for a
//! Prometheus scrape) and a file rewritten periodically for node_exporter's
//! textfile collector.
//!
//! The listener binds loopback unless the user names another address and
//! says so (`--metrics-allow-remote`): the text names drives and containers,
//! which is nobody else's business by default. The HTTP side is deliberately
//! tiny (one request per connection, bounded size, one time limit on the
//! whole exchange, at most [`MAX_CONNECTIONS`] served at once while the
//! rest wait in the backlog) because all it ever answers is one page. The
//! file is written under a temporary name and renamed, so the collector
//! never reads half of it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::text::CONTENT_TYPE;

/// Something that renders the current metrics text.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// How often the textfile is rewritten.
pub const TEXTFILE_INTERVAL: Duration = Duration::from_secs(15);
/// Longest request head the listener reads.
const MAX_REQUEST_BYTES: usize = 8 * 1024;
/// Connections served at once. Scrapes come one at a time (Prometheus
/// keeps one per target), so this is room for several scrapers and a
/// curl or two, and a bound on what idle or slow clients can hold.
pub const MAX_CONNECTIONS: usize = 16;
/// Time a client has for the whole exchange: sending its request and
/// taking the reply (a page of a few hundred kilobytes at most).
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// The bounds of the listener.
#[derive(Debug, Clone, Copy)]
struct Limits {
    max_connections: usize,
    exchange_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: MAX_CONNECTIONS,
            exchange_timeout: EXCHANGE_TIMEOUT,
        }
    }
}

/// Parse `--metrics-listen`: `PORT` (loopback), `ADDR:PORT`, `[V6]:PORT` or
/// `localhost:PORT`. A non-loopback address is refused unless `allow_remote`.
pub fn parse_listen(value: &str, allow_remote: bool) -> anyhow::Result<SocketAddr> {
    let value = value.trim();
    let addr = if let Ok(port) = value.parse::<u16>() {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)
    } else if let Some(port) = value.strip_prefix("localhost:") {
        let port = port
            .parse::<u16>()
            .with_context(|| format!("invalid port in metrics address '{value}'"))?;
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)
    } else {
        value.parse::<SocketAddr>().with_context(|| {
            format!("invalid metrics address '{value}': give PORT, ADDR:PORT or [IPv6]:PORT")
        })?
    };
    if !addr.ip().is_loopback() && !allow_remote {
        bail!(
            "metrics address {addr} is not loopback; the metrics name your drives, so serving them \
             beyond this host needs --metrics-allow-remote too"
        );
    }
    Ok(addr)
}

/// Bind the listener (before the mount is reported ready, so a taken port
/// fails the mount with one line).
pub fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    let std_listener = std::net::TcpListener::bind(addr)
        .with_context(|| format!("cannot listen for metrics on {addr}"))?;
    std_listener.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(std_listener)
        .with_context(|| format!("cannot listen for metrics on {addr}"))
}

/// Answer scrapes until the task is aborted: at most [`MAX_CONNECTIONS`]
/// at once, each within [`EXCHANGE_TIMEOUT`].
pub async fn serve(listener: tokio::net::TcpListener, render: Render) {
    serve_with(listener, render, Limits::default()).await
}

async fn serve_with(listener: tokio::net::TcpListener, render: Render, limits: Limits) {
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    loop {
        // A slot first, then the accept: connections past the cap wait in
        // the kernel's backlog, holding no descriptor of the daemon's,
        // and are served in turn as slots free up (within the exchange
        // time at most), so a flood of idle connections delays a scrape
        // but neither fails it nor runs the daemon out of descriptors.
        // Closing them at once instead would need the accept (and its
        // descriptor) anyway and would fail a real scrape during a flood.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(conn) => conn,
            Err(err) => {
                tracing::warn!(%err, "metrics listener accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let render = render.clone();
        tokio::spawn(async move {
            // One limit on the whole exchange: a client that sends its
            // request slowly or never takes the reply is dropped alike.
            match tokio::time::timeout(limits.exchange_timeout, answer(stream, render)).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => tracing::debug!(%peer, %err, "metrics request failed"),
                Err(_) => tracing::debug!(%peer, "metrics exchange not finished in time: closed"),
            }
            drop(slot);
        });
    }
}

/// Read one request head and answer it.
async fn answer(mut stream: tokio::net::TcpStream, render: Render) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST_BYTES {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let request_line = String::from_utf8_lossy(&head);
    let mut words = request_line.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, content_type, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => ("200 OK", CONTENT_TYPE, render()),
        ("GET" | "HEAD", "/") => (
            "200 OK",
            "text/plain; charset=utf-8",
            "blobdrive metrics: see /metrics\n".to_string(),
        ),
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "not found\n".into(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "only GET\n".into(),
        ),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if method != "HEAD" {
        response.extend_from_slice(body.as_bytes());
    }
    stream.write_all(&response).await?;
    stream.shutdown().await
}

/// The textfile of the mount whose key is `mount_key` in `dir`
/// (`blobdrive_<key>.prom`; the collector reads only `*.prom`).
pub fn textfile_path(dir: &Path, mount_key: &str) -> PathBuf {
    dir.join(format!("blobdrive_{mount_key}.prom"))
}

/// Write `text` to `path` atomically: a temporary file in the same directory
/// (a name the collector ignores), then a rename over the old one.
///
/// The temporary name is predictable and the daemon runs as root, so
/// whatever is found at it (a leftover of ours after a crash, or a link
/// someone planted to have root overwrite another file) is removed first,
/// and the file is then made new, never opened through a link: a link
/// planted again in between makes the write fail, not follow it.
pub fn write_textfile(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    // `remove_file` removes a symbolic link itself, not its target.
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .and_then(|mut file| file.write_all(text.as_bytes()));
    // The rename replaces whatever is at `path`, a link included, without
    // following it.
    written
        .and_then(|()| std::fs::rename(&tmp, path))
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
}

/// Rewrite the textfile every [`TEXTFILE_INTERVAL`] until the task is
/// aborted; the caller removes the file when the mount ends.
pub async fn write_periodically(path: PathBuf, render: Render) {
    let mut warned = false;
    loop {
        let text = render();
        let p = path.clone();
        let written = tokio::task::spawn_blocking(move || write_textfile(&p, &text)).await;
        match written {
            Ok(Err(err)) if !warned => {
                tracing::warn!(file = %path.display(), %err, "cannot write the metrics textfile");
                warned = true;
            }
            Ok(Ok(())) => warned = false,
            _ => {}
        }
        tokio::time::sleep(TEXTFILE_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_port_means_loopback_and_remote_needs_asking() {
        assert_eq!(
            parse_listen("9100", false).unwrap(),
            "127.0.0.1:9100".parse().unwrap()
        );
        assert_eq!(
            parse_listen("localhost:9100", false).unwrap(),
            "127.0.0.1:9100".parse().unwrap()
        );
        assert_eq!(
            parse_listen("[::1]:9100", false).unwrap(),
            "[::1]:9100".parse().unwrap()
        );
        let e = parse_listen("0.0.0.0:9100", false).unwrap_err().to_string();
        assert!(e.contains("--metrics-allow-remote"), "{e}");
        assert!(parse_listen("0.0.0.0:9100", true).is_ok());
        assert!(parse_listen("nine", false).is_err());
    }

    /// A listener on a free loopback port served with `limits`, rendering
    /// `page`; its address.
    async fn listening(limits: Limits, page: String) -> SocketAddr {
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let render: Render = Arc::new(move || page.clone());
        tokio::spawn(serve_with(listener, render, limits));
        addr
    }

    /// A scrape of `addr`: the whole answer.
    async fn scrape(addr: SocketAddr) -> String {
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        conn.read_to_end(&mut answer).await.unwrap();
        String::from_utf8_lossy(&answer).into_owned()
    }

    /// Generous: only a hang or a refusal takes this long.
    const PATIENCE: Duration = Duration::from_secs(60);

    #[tokio::test]
    async fn idle_connections_past_the_cap_wait_and_a_scrape_is_answered_once_they_close() {
        let addr = listening(Limits::default(), "a 1\n".into()).await;
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        // Let the server take them (nothing to wait on from outside).
        tokio::time::sleep(Duration::from_millis(300)).await;
        // One more connection over the cap: its request is not served
        // while the idle ones hold every slot, and many more idle ones
        // behind it cost the daemon no descriptor.
        let waiting = tokio::spawn(scrape(addr));
        // Within the listen backlog, past which connects stall.
        for _ in 0..100 {
            idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished(), "a 17th connection was served");
        drop(idle);
        let answer = tokio::time::timeout(PATIENCE, waiting)
            .await
            .expect("the scrape was answered once the idle connections closed")
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
        assert!(answer.ends_with("a 1\n"), "{answer}");
    }

    #[tokio::test]
    async fn connections_that_stay_idle_or_take_no_reply_are_dropped_in_time() {
        // A page larger than the socket buffers, so a client that never
        // reads holds the server in the reply's write.
        let page = "x".repeat(32 << 20);
        let limits = Limits {
            max_connections: 4,
            exchange_timeout: Duration::from_millis(300),
        };
        let addr = listening(limits, page.clone()).await;
        let mut held = Vec::new();
        for _ in 0..limits.max_connections {
            let mut stuck = tokio::net::TcpStream::connect(addr).await.unwrap();
            stuck
                .write_all(b"GET /metrics HTTP/1.1\r\n\r\n")
                .await
                .unwrap();
            held.push(stuck);
        }
        for _ in 0..40 {
            held.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        // All of them kept open: each is dropped when its time is up.
        let answer = tokio::time::timeout(PATIENCE, scrape(addr))
            .await
            .expect("a scrape was answered while the others stayed open");
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{}", &answer[..40]);
        assert!(answer.ends_with(&page[page.len() - 10..]));
        // The clients that never read were cut short of the page.
        let mut got = Vec::new();
        let _ = held[0].read_to_end(&mut got).await;
        assert!(got.len() < page.len(), "a reply took longer than allowed");
    }

    #[test]
    fn the_textfile_is_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = textfile_path(dir.path(), "abc");
        write_textfile(&path, "a 1\n").unwrap();
        write_textfile(&path, "a 2\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a 2\n");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("blobdrive_abc.prom")]);
    }

    #[test]
    fn a_link_planted_at_the_temporary_name_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let victim = elsewhere.path().join("shadow");
        std::fs::write(&victim, "precious\n").unwrap();
        let path = textfile_path(dir.path(), "abc");
        // The temporary name is predictable: the pid is no secret.
        let tmp = dir
            .path()
            .join(format!(".blobdrive_abc.prom.{}.tmp", std::process::id()));
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        write_textfile(&path, "a 1\n").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a 1\n");
        assert!(!std::fs::symlink_metadata(&path).unwrap().is_symlink());
        assert!(std::fs::symlink_metadata(&tmp).is_err(), "the link is gone");
        // A stale temporary file of ours (a crash before the rename) is
        // replaced too.
        std::fs::write(&tmp, "stale and longer\n").unwrap();
        write_textfile(&path, "a 2\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a 2\n");
    }
}
