//! The model holds what it promises: each cap (a blob's requests and bytes
//! per second, the account's) passes its rate to within 5% under a load
//! that keeps it busy; past the queue bound the answer is the service's 503
//! ServerBusy, sent before the request's body is read; the latency is the
//! round trip plus the body's time on the link; connections over the limit
//! are closed unserved.
//!
//! The upstream is a stub of this file (it answers at once), so what is
//! measured is the model's own pacing, not a backend's speed. The rates are
//! measured over 4 s after the first burst is spent; they hold on a loaded
//! machine because the model computes each turn from the previous turn, not
//! from when a task woke (`pacing.rs`): only the load must keep each cap
//! busy, which a few dozen requests in flight do at these rates.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use service_model::http::{Conn, Framing, Head};
use service_model::{Profile, ServiceModel};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

const MIB: u64 = 1 << 20;

/// An upstream that answers at once: a ranged `GET` with that many zero
/// bytes, a `PUT` with `201` once its body is read, anything else `200`
/// with no body. Counts the requests it saw.
async fn stub_upstream() -> (String, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let seen = Arc::new(AtomicU64::new(0));
    let counter = seen.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let seen = counter.clone();
            tokio::spawn(async move {
                let mut conn = Conn::new(conn);
                while let Ok(Some(head)) = conn.read_head().await {
                    seen.fetch_add(1, Ordering::SeqCst);
                    let framing = head.request_body().expect("framing");
                    if conn.read_body(framing).await.is_err() {
                        return;
                    }
                    let len = head
                        .header("x-ms-range")
                        .and_then(|r| r.strip_prefix("bytes="))
                        .and_then(|r| r.split_once('-'))
                        .map(|(s, e)| e.parse::<u64>().unwrap() - s.parse::<u64>().unwrap() + 1)
                        .unwrap_or(0);
                    let status = if head.line[0] == "PUT" {
                        "201 Created"
                    } else {
                        "200 OK"
                    };
                    let answer = format!("HTTP/1.1 {status}\r\nContent-Length: {len}\r\n\r\n");
                    let body = vec![0u8; len as usize];
                    if conn.write_all(&[answer.as_bytes(), &body]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

/// A request of the load: method, blob path, range length for a `GET`
/// (0: none), body length for a `PUT`.
#[derive(Clone, Copy)]
struct Req {
    method: &'static str,
    blob: u32,
    bytes: u64,
}

/// One answer: when it arrived, its status, its request's body bytes plus
/// its own, and the blob it addressed.
#[derive(Clone, Copy, Debug)]
struct Done {
    at: Instant,
    status: u16,
    bytes: u64,
    blob: u32,
}

/// Sends `req` on `conn` (connecting first when it is `None`) and reads the
/// answer; the connection is dropped after a `503` (the model closes it).
/// Returns the answer's head and the body bytes moved both ways.
async fn send(conn: &mut Option<Conn>, addr: SocketAddr, req: Req) -> (Head, u64) {
    if conn.is_none() {
        *conn = Some(Conn::new(TcpStream::connect(addr).await.expect("connect")));
    }
    let c = conn.as_mut().expect("just connected");
    let path = format!("/devstoreaccount1/c/blob{}", req.blob);
    let head = match req.method {
        "GET" if req.bytes > 0 => format!(
            "GET {path} HTTP/1.1\r\nx-ms-range: bytes=0-{}\r\nx-ms-version: 2021-08-06\r\n\r\n",
            req.bytes - 1
        ),
        "PUT" => format!(
            "PUT {path}?comp=page HTTP/1.1\r\nContent-Length: {}\r\nx-ms-version: 2021-08-06\r\n\r\n",
            req.bytes
        ),
        m => format!("{m} {path} HTTP/1.1\r\n\r\n"),
    };
    let body = if req.method == "PUT" {
        vec![7u8; req.bytes as usize]
    } else {
        Vec::new()
    };
    c.write_all(&[head.as_bytes(), &body]).await.expect("send");
    let answer = c.read_head().await.expect("read").expect("an answer");
    let framing = answer.response_body(req.method).expect("framing");
    let got = c.read_body(framing).await.expect("body");
    let busy = answer.status() == 503;
    if busy {
        *conn = None;
    }
    let moved = got.payload_bytes + if busy { 0 } else { body.len() as u64 };
    (answer, moved)
}

/// `workers` connections each sending `pick(worker)` requests back to back
/// for `run`; every answer.
async fn load(
    addr: SocketAddr,
    workers: u32,
    run: Duration,
    pick: impl Fn(u32) -> Req + Send + Sync + 'static,
) -> Vec<Done> {
    let done = Arc::new(Mutex::new(Vec::new()));
    let pick = Arc::new(pick);
    let end = Instant::now() + run;
    let mut tasks = Vec::new();
    for w in 0..workers {
        let (done, pick) = (done.clone(), pick.clone());
        tasks.push(tokio::spawn(async move {
            let mut conn = None;
            while Instant::now() < end {
                let req = pick(w);
                let (head, bytes) = send(&mut conn, addr, req).await;
                done.lock().unwrap().push(Done {
                    at: Instant::now(),
                    status: head.status(),
                    bytes,
                    blob: req.blob,
                });
            }
        }));
    }
    for t in tasks {
        t.await.expect("worker");
    }
    let done = done.lock().unwrap().clone();
    done
}

/// The steady state of a load of [`RUN`]: from [`WARM`] in (the first
/// burst spent, the queues full) for [`SPAN`].
const RUN: Duration = Duration::from_secs(6);
const WARM: Duration = Duration::from_secs(1);
const SPAN: Duration = Duration::from_secs(4);

/// Per second over the steady state of a load started at `t0`: successful
/// answers (`bytes` false) or the body bytes they moved, of those `keep`
/// selects.
fn rate(done: &[Done], t0: Instant, bytes: bool, keep: impl Fn(&Done) -> bool) -> f64 {
    let from = t0 + WARM;
    let total: u64 = done
        .iter()
        .filter(|d| d.at >= from && d.at < from + SPAN && d.status < 300 && keep(d))
        .map(|d| if bytes { d.bytes } else { 1 })
        .sum();
    total as f64 / SPAN.as_secs_f64()
}

fn within_5_percent(what: &str, got: f64, cap: f64) {
    let ratio = got / cap;
    eprintln!("{what}: {got:.1}/s against {cap:.1}/s (ratio {ratio:.3})");
    assert!(
        (0.95..=1.05).contains(&ratio),
        "{what}: {got:.1}/s against a cap of {cap:.1}/s (ratio {ratio:.3})"
    );
}

/// No latency, no cap, and a queue bound long enough that the rate tests
/// see no 503: they measure the pacing.
fn patient() -> Profile {
    let mut p = Profile::transparent();
    p.queue_bound = Duration::from_secs(30);
    p
}

fn standard() -> Profile {
    Profile::named("standard").expect("standard exists")
}

async fn start(upstream: &str, profile: Profile) -> ServiceModel {
    ServiceModel::start("127.0.0.1:0".parse().unwrap(), upstream, profile)
        .await
        .expect("the model starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_blob_is_held_to_the_standard_request_cap() {
    let (upstream, _) = stub_upstream().await;
    let mut p = patient();
    p.blob.requests_per_s = standard().blob.requests_per_s;
    let cap = p.blob.requests_per_s.unwrap();
    let model = start(&upstream, p).await;
    let t0 = Instant::now();
    // Two blobs, 16 connections each: each has a cap of its own.
    let done = load(model.addr(), 32, RUN, |w| Req {
        method: "HEAD",
        blob: w % 2,
        bytes: 0,
    })
    .await;
    assert!(
        done.iter().all(|d| d.status == 200),
        "no 503 below the bound"
    );
    for blob in 0..2 {
        within_5_percent(
            &format!("blob {blob}, requests"),
            rate(&done, t0, false, |d| d.blob == blob),
            cap,
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_blob_is_held_to_the_standard_byte_cap_both_ways() {
    let (upstream, _) = stub_upstream().await;
    let mut p = patient();
    p.blob.bytes_per_s = standard().blob.bytes_per_s;
    let cap = p.blob.bytes_per_s.unwrap();
    let model = start(&upstream, p).await;
    let t0 = Instant::now();
    // Blob 0 written with 1 MiB Put Pages, blob 1 read with 1 MiB Gets.
    let done = load(model.addr(), 8, RUN, |w| Req {
        method: if w % 2 == 0 { "PUT" } else { "GET" },
        blob: w % 2,
        bytes: MIB,
    })
    .await;
    assert!(
        done.iter().all(|d| d.status < 300),
        "no 503 below the bound"
    );
    within_5_percent(
        "blob 0, Put Page bytes",
        rate(&done, t0, true, |d| d.blob == 0),
        cap,
    );
    within_5_percent(
        "blob 1, Get bytes",
        rate(&done, t0, true, |d| d.blob == 1),
        cap,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_account_caps_hold_across_blobs() {
    let (upstream, _) = stub_upstream().await;
    let mut p = patient();
    p.account.requests_per_s = Some(400.0);
    p.account.bytes_per_s = Some(16.0 * MIB as f64);
    let model = start(&upstream, p).await;
    let t0 = Instant::now();
    // Eight blobs, none capped alone: 64 KiB Gets, 400/s would be 25 MiB/s,
    // so the byte cap binds first (256/s).
    let done = load(model.addr(), 32, RUN, |w| Req {
        method: "GET",
        blob: w % 8,
        bytes: 64 * 1024,
    })
    .await;
    within_5_percent(
        "account, Get bytes",
        rate(&done, t0, true, |_| true),
        16.0 * MIB as f64,
    );
    // Small requests: now the request cap binds.
    let t0 = Instant::now();
    let done = load(model.addr(), 32, RUN, |w| Req {
        method: "HEAD",
        blob: w % 8,
        bytes: 0,
    })
    .await;
    within_5_percent("account, requests", rate(&done, t0, false, |_| true), 400.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_queue_bound_the_answer_is_server_busy_before_the_body() {
    let (upstream, seen) = stub_upstream().await;
    let mut p = Profile::transparent();
    p.blob.requests_per_s = Some(20.0);
    p.queue_bound = Duration::from_millis(250);
    let model = start(&upstream, p).await;
    // 20/s with 100 ms of burst and a 250 ms bound: the first 3 pass at
    // once, the next 5 wait (up to 250 ms), then every turn is too far.
    let t0 = Instant::now();
    let done = load(model.addr(), 16, Duration::from_millis(100), |_| Req {
        method: "HEAD",
        blob: 0,
        bytes: 0,
    })
    .await;
    let ok = done.iter().filter(|d| d.status == 200).count();
    let busy = done.iter().filter(|d| d.status == 503).count();
    assert_eq!(ok + busy, done.len(), "only 200 and 503: {done:?}");
    assert!(busy > 0, "over the bound some are refused");
    let slow = done
        .iter()
        .filter(|d| d.status == 200 && d.at - t0 > Duration::from_millis(100))
        .count();
    assert!(slow > 0, "below the bound requests wait rather than fail");
    let stats = model.stats();
    assert_eq!(stats["busy"], busy as u64);
    assert_eq!(stats["busy_by_cap"]["blob_requests"], busy as u64);
    assert!(stats["queued"].as_u64().unwrap() > 0);
    // A Put Page whose head comes without its body, on a blob that just
    // had its turn at 1 request/s: the answer is the service's 503, and the
    // request never reaches the upstream.
    let mut p = Profile::transparent();
    p.blob.requests_per_s = Some(1.0);
    p.queue_bound = Duration::from_millis(250);
    let model = start(&upstream, p).await;
    let mut conn = None;
    let (first, _) = send(
        &mut conn,
        model.addr(),
        Req {
            method: "HEAD",
            blob: 0,
            bytes: 0,
        },
    )
    .await;
    assert_eq!(first.status(), 200);
    let before = seen.load(Ordering::SeqCst);
    let mut c = Conn::new(TcpStream::connect(model.addr()).await.unwrap());
    let head = "PUT /devstoreaccount1/c/blob0?comp=page HTTP/1.1\r\n\
x-ms-version: 2021-08-06\r\nContent-Length: 4194304\r\n\r\n";
    c.write_all(&[head.as_bytes()]).await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(5), c.read_head())
        .await
        .expect("answered without the body")
        .unwrap()
        .expect("an answer");
    assert_eq!(answer.status(), 503);
    assert_eq!(answer.header("x-ms-error-code"), Some("ServerBusy"));
    assert_eq!(answer.header("x-ms-version"), Some("2021-08-06"));
    assert!(answer.has_token("connection", "close"));
    let body = c
        .read_body(answer.response_body("PUT").unwrap())
        .await
        .unwrap();
    let xml = String::from_utf8_lossy(&body.wire);
    assert!(
        xml.contains("<Error><Code>ServerBusy</Code><Message>The server is busy."),
        "{xml}"
    );
    assert_eq!(
        seen.load(Ordering::SeqCst),
        before,
        "the upstream never saw it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_is_a_round_trip_with_jitter_plus_the_body_on_the_link() {
    let (upstream, _) = stub_upstream().await;
    let mut p = Profile::transparent();
    p.rtt = Duration::from_millis(20);
    p.jitter = Duration::from_millis(4);
    p.link_bytes_per_s = Some(10.0 * MIB as f64);
    let model = start(&upstream, p).await;
    let mut conn = None;
    let mut took = Vec::new();
    for _ in 0..40 {
        let t = Instant::now();
        send(
            &mut conn,
            model.addr(),
            Req {
                method: "HEAD",
                blob: 0,
                bytes: 0,
            },
        )
        .await;
        took.push(t.elapsed());
    }
    // A sleep never ends early: no answer comes before rtt - jitter; the
    // mean is rtt, plus what a loaded machine adds (generous).
    let min = *took.iter().min().unwrap();
    let mean = took.iter().sum::<Duration>() / took.len() as u32;
    assert!(min >= Duration::from_millis(16), "min {min:?}");
    assert!(
        mean >= Duration::from_millis(19) && mean < Duration::from_millis(35),
        "mean {mean:?}"
    );
    // 1 MiB at 10 MiB/s: 100 ms more.
    let t = Instant::now();
    send(
        &mut conn,
        model.addr(),
        Req {
            method: "GET",
            blob: 0,
            bytes: MIB,
        },
    )
    .await;
    let get = t.elapsed();
    assert!(
        get >= Duration::from_millis(116) && get < Duration::from_millis(200),
        "1 MiB Get took {get:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_limit_are_closed_unserved() {
    let (upstream, _) = stub_upstream().await;
    let mut p = Profile::transparent();
    p.max_connections = Some(4);
    let model = start(&upstream, p).await;
    let mut open = Vec::new();
    for _ in 0..4 {
        let mut conn = None;
        let (head, _) = send(
            &mut conn,
            model.addr(),
            Req {
                method: "HEAD",
                blob: 0,
                bytes: 0,
            },
        )
        .await;
        assert_eq!(head.status(), 200);
        open.push(conn);
    }
    let mut fifth = Conn::new(TcpStream::connect(model.addr()).await.unwrap());
    fifth
        .write_all(&[b"HEAD /devstoreaccount1/c/blob0 HTTP/1.1\r\n\r\n"])
        .await
        .ok();
    let answer = tokio::time::timeout(Duration::from_secs(5), fifth.read_head())
        .await
        .expect("closed at once");
    assert!(matches!(answer, Ok(None) | Err(_)), "no answer: {answer:?}");
    assert_eq!(model.stats()["refused_connections"], 1);
    // One closes: a new one is served.
    open.pop();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut conn = None;
    let (head, _) = send(
        &mut conn,
        model.addr(),
        Req {
            method: "HEAD",
            blob: 0,
            bytes: 0,
        },
    )
    .await;
    assert_eq!(head.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_pages_show_its_counters_and_profile() {
    let (upstream, _) = stub_upstream().await;
    let model = start(&upstream, standard()).await;
    let mut c = Conn::new(TcpStream::connect(model.addr()).await.unwrap());
    for (page, key) in [("profile", "queue_bound_ms"), ("stats", "busy_share")] {
        let req = format!("GET /.model/{page} HTTP/1.1\r\n\r\n");
        c.write_all(&[req.as_bytes()]).await.unwrap();
        let head = c.read_head().await.unwrap().unwrap();
        assert_eq!(head.status(), 200);
        let body = c
            .read_body(Framing::Length(
                head.header("content-length").unwrap().parse().unwrap(),
            ))
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body.wire).unwrap();
        assert!(v.get(key).is_some(), "{page}: {v}");
    }
    assert_eq!(
        model.stats()["requests"],
        0,
        "the model's own pages are not counted"
    );
}

/// 5,000 requests/s through the debug build, client and stub in the same
/// process: on a 2-core machine at a load average of 14 the load reached
/// 0.97 of the cap (the machine, not the pacing, fell short). The cap is
/// never exceeded by more than 5%; from below, only a model that could not
/// pass 80% of it would fail here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_p30_request_cap_of_5000_per_second_holds_too() {
    let (upstream, _) = stub_upstream().await;
    let mut p = patient();
    p.blob.requests_per_s = Profile::named("p30").unwrap().blob.requests_per_s;
    let cap = p.blob.requests_per_s.unwrap();
    let model = start(&upstream, p).await;
    let t0 = Instant::now();
    let done = load(model.addr(), 64, RUN, |_| Req {
        method: "HEAD",
        blob: 0,
        bytes: 0,
    })
    .await;
    let got = rate(&done, t0, false, |_| true);
    eprintln!(
        "p30 blob, requests: {got:.1}/s against {cap:.1}/s (ratio {:.3})",
        got / cap
    );
    assert!(
        (0.8..=1.05).contains(&(got / cap)),
        "{got:.1}/s against a cap of {cap:.1}/s"
    );
}
