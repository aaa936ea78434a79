//! A loopback TCP proxy in front of Azurite that misbehaves on purpose for
//! the first N requests (503 ServerBusy, dropped connection, short body, or
//! no answer at all), then forwards everything untouched.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

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
}

/// A running proxy. Dropping it stops accepting new connections.
pub struct FaultProxy {
    /// `http://127.0.0.1:PORT/devstoreaccount1`-style endpoint (the upstream's path).
    pub endpoint: url::Url,
    faulted: Arc<AtomicU64>,
    seen: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Start a proxy to `upstream` (an http URL) that answers the first
    /// `faults` requests (`u64::MAX`: all) with `fault`.
    pub async fn start(upstream: &url::Url, fault: Fault, faults: u64) -> FaultProxy {
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
        let faulted = Arc::new(AtomicU64::new(0));
        let seen = Arc::new(AtomicU64::new(0));
        let (f2, s2) = (faulted.clone(), seen.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    return;
                };
                let (f, s, up) = (f2.clone(), s2.clone(), up_addr.clone());
                tokio::spawn(async move {
                    let _ = serve(conn, &up, fault, faults, &f, &s).await;
                });
            }
        });
        FaultProxy {
            endpoint,
            faulted,
            seen,
            task,
        }
    }

    /// Requests answered with a fault so far.
    pub fn faulted(&self) -> u64 {
        self.faulted.load(Ordering::SeqCst)
    }

    /// Requests (first on each connection) seen so far.
    pub fn seen(&self) -> u64 {
        self.seen.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
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

async fn serve(
    mut conn: TcpStream,
    upstream: &str,
    fault: Fault,
    faults: u64,
    faulted: &AtomicU64,
    seen: &AtomicU64,
) -> std::io::Result<()> {
    let request = read_request(&mut conn).await?;
    seen.fetch_add(1, Ordering::SeqCst);
    let take_fault = faulted
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
            (n < faults).then_some(n + 1)
        })
        .is_ok();
    if take_fault {
        match fault {
            Fault::ServerBusy => {
                conn.write_all(
                    b"HTTP/1.1 503 Service Unavailable\r\nx-ms-error-code: ServerBusy\r\n\
Content-Type: application/xml\r\nConnection: close\r\nContent-Length: 100\r\n\r\n\
<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>ServerBusy</Code><Message>Busy.</Message></Error>",
                )
                .await?;
            }
            Fault::Drop => {}
            Fault::ShortBody => {
                conn.write_all(
                    b"HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\nConnection: close\r\n\r\n0123456789",
                )
                .await?;
            }
            Fault::Hang => {
                tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
            }
        }
        let _ = conn.shutdown().await;
        return Ok(());
    }
    let mut up = TcpStream::connect(upstream).await?;
    up.write_all(&request).await?;
    tokio::io::copy_bidirectional(&mut conn, &mut up).await?;
    Ok(())
}
