//! The proxy: accepts connections up to the limit, and on each serves one
//! request after another as the service would: it waits half a round trip
//! (the request's way in), takes the request's turn under the caps
//! ([`Pacer`]), answers 503 ServerBusy at once when the turn is past the
//! queue bound (without reading the request's body), else waits for the
//! turn, reads the body, passes the request to the upstream on a connection
//! of its own, reads the whole answer, and gives it back after the bodies'
//! time on the link and the other half of the round trip.
//!
//! The model's own pages (`GET /.model/stats`, `GET /.model/profile`) are
//! answered at once, uncounted, outside every cap.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::answers;
use crate::delay::DelayLine;
use crate::http::{Conn, Framing, Head};
use crate::pacing::{Admission, Pacer};
use crate::profile::Profile;
use crate::stats::Counters;
use crate::trace::{Line, Trace};

/// An upstream connection idle for this long is not used again: Azurite
/// (Node) closes idle connections after 5 s, and a request sent as it
/// closes one would be lost.
const UPSTREAM_IDLE: Duration = Duration::from_secs(2);

/// The longest the model reads and drops a refused request's body, so the
/// client reads the 503 rather than a reset.
const DISCARD_LIMIT: Duration = Duration::from_secs(5);

/// What every connection of one model shares.
#[derive(Debug)]
pub struct Shared {
    /// The model.
    pub profile: Profile,
    /// The caps.
    pub pacer: Pacer,
    /// What it did.
    pub counters: Counters,
    /// The upstream, `host:port`.
    pub upstream: String,
    /// Every request, one line each (when asked for).
    pub trace: Trace,
    /// Waits to the tenth of a millisecond.
    pub delays: DelayLine,
}

/// Accepts connections on `listener` for ever, each served on a task of
/// its own.
pub async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let conn = match listener.accept().await {
            Ok((conn, _)) => conn,
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if let Some(max) = shared.profile.max_connections {
            if shared.counters.open() >= max as u64 {
                shared.counters.refused();
                tracing::debug!("connection refused: {max} open");
                drop(conn);
                continue;
            }
        }
        shared.counters.opened();
        let shared = shared.clone();
        tokio::spawn(async move {
            if let Err(e) = serve(conn, &shared).await {
                tracing::debug!("connection ended: {e}");
            }
            shared.counters.closed();
        });
    }
}

/// The blob a request addresses, `account/container/blob` as sent, or
/// `None` for a request on the account or a container (path style: the
/// account is the first segment, as on Azurite).
pub fn blob_of(target: &str) -> Option<&str> {
    let path = target.split('?').next().unwrap_or_default();
    let rest = path.strip_prefix('/')?;
    let mut parts = rest.splitn(3, '/');
    let (account, container, blob) = (parts.next()?, parts.next()?, parts.next()?);
    (!account.is_empty() && !container.is_empty() && !blob.is_empty()).then_some(rest)
}

/// The body bytes a request will move, as far as its head tells: its own
/// `Content-Length` and, for a ranged Get Blob, the range's length. Other
/// Gets with a range (Get Page Ranges: `comp=pagelist`) answer far less
/// than their range: theirs is charged when it comes.
fn expected_bytes(head: &Head) -> u64 {
    let up = match head.request_body() {
        Ok(Framing::Length(n)) => n,
        _ => 0,
    };
    let get_blob = head.line[0] == "GET"
        && !head.line[1]
            .split_once('?')
            .is_some_and(|(_, q)| q.split('&').any(|kv| kv.starts_with("comp=")));
    let down = if get_blob {
        head.header("x-ms-range")
            .or_else(|| head.header("range"))
            .and_then(range_len)
            .unwrap_or(0)
    } else {
        0
    };
    up + down
}

/// The length of `bytes=S-E` (inclusive).
fn range_len(v: &str) -> Option<u64> {
    let (s, e) = v.trim().strip_prefix("bytes=")?.split_once('-')?;
    let (s, e): (u64, u64) = (s.trim().parse().ok()?, e.trim().parse().ok()?);
    (e >= s).then(|| e - s + 1)
}

/// The time `bytes` of body take on one connection's link.
fn link_time(profile: &Profile, bytes: u64) -> Duration {
    profile.link_bytes_per_s.map_or(Duration::ZERO, |bw| {
        Duration::from_secs_f64(bytes as f64 / bw)
    })
}

/// One round trip, drawn: `rtt` plus a uniform draw within `±jitter`.
fn draw_rtt(profile: &Profile) -> Duration {
    let j = profile.jitter.as_secs_f64();
    let r = profile.rtt.as_secs_f64();
    let d = if j > 0.0 {
        r + rand::rng().random_range(-j..=j)
    } else {
        r
    };
    Duration::from_secs_f64(d.max(0.0))
}

/// An upstream connection and when it was last used.
struct Upstream {
    conn: Conn,
    used: Instant,
}

async fn serve(client: TcpStream, shared: &Shared) -> io::Result<()> {
    let mut client = Conn::new(client);
    let mut upstream: Option<Upstream> = None;
    while let Some(head) = client.read_head().await? {
        let target = head.line[1].clone();
        if let Some(page) = target.strip_prefix("/.model/") {
            let answer = match page {
                "stats" => answers::json(&shared.counters.to_json()),
                "profile" => answers::json(&shared.profile.to_json()),
                _ => answers::not_found(),
            };
            client.write_all(&[&answer]).await?;
            continue;
        }
        shared.counters.request();
        let rtt = draw_rtt(&shared.profile);
        // The request's way to the service.
        shared.delays.sleep(rtt / 2).await;
        let blob = blob_of(&target);
        let charged = expected_bytes(&head);
        let arrived = Instant::now();
        let framing = head.request_body()?;
        match shared.pacer.admit_at(blob, charged, arrived) {
            Admission::Busy(cap) => {
                shared.counters.busy(cap);
                shared.trace.record(&Line {
                    arrived,
                    method: &head.line[0],
                    what: blob.unwrap_or(&target),
                    up: 0,
                    down: 0,
                    waited: Duration::ZERO,
                    upstream: Duration::ZERO,
                    status: 503,
                });
                tracing::debug!(?cap, %target, "503 ServerBusy");
                shared.delays.sleep(rtt - rtt / 2).await;
                let answer = answers::server_busy(cap, head.header("x-ms-version"));
                client.write_all(&[&answer]).await?;
                if let Framing::Length(n) = framing {
                    client.discard(n, DISCARD_LIMIT).await;
                }
                return Ok(());
            }
            Admission::StartAt(at) => {
                shared.delays.until(at.into_std()).await;
                shared
                    .counters
                    .admitted(at.saturating_duration_since(arrived));
            }
        }
        let admitted = Instant::now();
        let expect = head.has_token("expect", "100-continue");
        if expect {
            client
                .write_all(&[b"HTTP/1.1 100 Continue\r\n\r\n"])
                .await?;
        }
        let body = client.read_body(framing).await?;
        let sent = if expect {
            head.without("expect")
        } else {
            head.raw.clone()
        };
        let asked = Instant::now();
        let (answer, answer_body) =
            match exchange(&mut upstream, shared, &head, &sent, &body.wire).await {
                Ok(a) => a,
                Err(e) => {
                    // The client sees what it would see of a broken service: the
                    // connection closes.
                    shared.counters.upstream_error();
                    tracing::warn!(%target, "upstream failed: {e}");
                    return Err(e);
                }
            };
        let moved = body.payload_bytes + answer_body.payload_bytes;
        shared.pacer.owe(blob, moved.saturating_sub(charged));
        shared
            .counters
            .forwarded(body.payload_bytes, answer_body.payload_bytes);
        shared.trace.record(&Line {
            arrived,
            method: &head.line[0],
            what: blob.unwrap_or(&target),
            up: body.payload_bytes,
            down: answer_body.payload_bytes,
            waited: admitted.saturating_duration_since(arrived),
            upstream: asked.elapsed(),
            status: answer.status(),
        });
        // The bodies' time on this connection's link, and the answer's way back.
        shared
            .delays
            .sleep(link_time(&shared.profile, moved) + (rtt - rtt / 2))
            .await;
        client.write_all(&[&answer.raw, &answer_body.wire]).await?;
        let until_close = answer.response_body(&head.line[0])? == Framing::UntilClose;
        if until_close || head.has_token("connection", "close") {
            return Ok(());
        }
    }
    Ok(())
}

/// Sends one request upstream (on the kept connection when it is fresh
/// enough, else a new one) and reads its whole answer, interim `1xx`
/// answers skipped. A kept connection that fails before any answer came
/// (the upstream closed it meanwhile) is replaced once by a new one.
async fn exchange(
    upstream: &mut Option<Upstream>,
    shared: &Shared,
    head: &Head,
    sent_head: &[u8],
    body: &[u8],
) -> io::Result<(Head, crate::http::Body)> {
    if upstream
        .as_ref()
        .is_some_and(|u| u.used.elapsed() > UPSTREAM_IDLE)
    {
        *upstream = None;
    }
    let (mut up, answer) = match upstream.take() {
        Some(kept) => {
            let mut up = kept.conn;
            match send_and_read_head(&mut up, sent_head, body).await {
                Ok(answer) => (up, answer),
                Err(e) => {
                    tracing::debug!("kept upstream connection failed ({e}); a new one");
                    let mut up = Conn::new(TcpStream::connect(&shared.upstream).await?);
                    let answer = send_and_read_head(&mut up, sent_head, body).await?;
                    (up, answer)
                }
            }
        }
        None => {
            let mut up = Conn::new(TcpStream::connect(&shared.upstream).await?);
            let answer = send_and_read_head(&mut up, sent_head, body).await?;
            (up, answer)
        }
    };
    let framing = answer.response_body(&head.line[0])?;
    let answer_body = up.read_body(framing).await?;
    let keep = framing != Framing::UntilClose && !answer.has_token("connection", "close");
    if keep {
        *upstream = Some(Upstream {
            conn: up,
            used: Instant::now(),
        });
    }
    Ok((answer, answer_body))
}

/// Writes a request on `up` and reads the head of its final answer.
async fn send_and_read_head(up: &mut Conn, sent_head: &[u8], body: &[u8]) -> io::Result<Head> {
    up.write_all(&[sent_head, body]).await?;
    loop {
        let h = up.read_head().await?.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "upstream closed before answering",
            )
        })?;
        if h.status() >= 200 || h.status() == 0 {
            return Ok(h);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blob_is_account_container_and_name() {
        assert_eq!(
            blob_of("/devstoreaccount1/c/d/e.vhd?comp=page"),
            Some("devstoreaccount1/c/d/e.vhd")
        );
        assert_eq!(blob_of("/devstoreaccount1/c?restype=container"), None);
        assert_eq!(blob_of("/devstoreaccount1/c/"), None);
        assert_eq!(blob_of("/devstoreaccount1?comp=list"), None);
    }

    #[test]
    fn a_ranged_get_is_charged_its_range_and_a_put_its_body() {
        let get =
            Head::parse(b"GET /a/c/b HTTP/1.1\r\nx-ms-range: bytes=4096-8191\r\n\r\n".to_vec())
                .expect("a head");
        assert_eq!(expected_bytes(&get), 4096);
        let ranges = Head::parse(
            b"GET /a/c/b?comp=pagelist HTTP/1.1\r\nx-ms-range: bytes=0-1099511627775\r\n\r\n"
                .to_vec(),
        )
        .expect("a head");
        assert_eq!(
            expected_bytes(&ranges),
            0,
            "Get Page Ranges is charged its answer"
        );
        let put = Head::parse(
            b"PUT /a/c/b?comp=page HTTP/1.1\r\nx-ms-range: bytes=0-511\r\nContent-Length: 512\r\n\r\n"
                .to_vec(),
        )
        .expect("a head");
        assert_eq!(expected_bytes(&put), 512);
    }
}
