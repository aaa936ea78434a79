//! Serving the metrics text: an HTTP listener answering `GET /metrics` (for a
//! Prometheus scrape) and a file rewritten periodically for node_exporter's
//! textfile collector.
//!
//! The listener binds loopback unless the user names another address and
//! says so (`--metrics-allow-remote`): the text names drives and containers,
//! which is nobody else's business by default. The HTTP side is deliberately
//! tiny (one request per connection, bounded size and time) because all it
//! ever answers is one page. The file is written under a temporary name and
//! renamed, so the collector never reads half of it.

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
/// Time a client has to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

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

/// Answer scrapes until the task is aborted.
pub async fn serve(listener: tokio::net::TcpListener, render: Render) {
    loop {
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
            if let Err(err) = answer(stream, render).await {
                tracing::debug!(%peer, %err, "metrics request failed");
            }
        });
    }
}

/// Read one request head and answer it.
async fn answer(mut stream: tokio::net::TcpStream, render: Render) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    let read_head = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST_BYTES {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok::<_, std::io::Error>(())
    };
    if tokio::time::timeout(REQUEST_TIMEOUT, read_head)
        .await
        .is_err()
    {
        return Ok(());
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
