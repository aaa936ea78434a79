//! The NBD server's protocol, in process, over the in-memory device
//! (`fs::memory`), with the tests' own client (`tests/nbd_support/`): the
//! answers to bad input the specification prescribes, the connection bound,
//! and a fuzz target over the handshake and the request parser. What real
//! clients see against Azurite is in `tests/nbd.rs`.

mod nbd_support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use blobdrive::fs::memory::{MemoryCatalog, MemoryDisk};
use blobdrive::fs::{Catalog, EntryPath};
use blobdrive::nbd::proto::*;
use blobdrive::nbd::{Endpoint, Export, Exports, Limits, Listener};
use nbd_support::{descriptors, go_data, meta_data, Client};
use proptest::prelude::*;

const MIB: u64 = 1024 * 1024;

/// A server on a Unix socket in a temp dir, stopped (and joined) on drop.
struct Server {
    socket: PathBuf,
    disks: Vec<Arc<MemoryDisk>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Server {
    /// Exports `c/rw` (read-write, 4 MiB) and `c/ro` (read-only, 1 MiB).
    fn start(limits: Limits) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("nbd.sock");
        let catalog = MemoryCatalog::new();
        let rw = catalog.add_drive("c", "rw", 4 * MIB);
        let ro = catalog.add_drive("c", "ro", MIB);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let endpoint = Endpoint::Unix(socket.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let open = |blob: &str, writable| {
                    let path = EntryPath {
                        container: "c".into(),
                        blob: blob.into(),
                        snapshot: None,
                    };
                    let catalog = catalog.clone();
                    async move { catalog.open(&path, writable).await.expect("opens") }
                };
                let exports = Arc::new(Exports::new(vec![
                    Arc::new(Export::new("c/rw", open("rw", true).await, false)),
                    Arc::new(Export::new("c/ro", open("ro", false).await, true)),
                ]));
                let listener = Listener::bind(&endpoint).expect("binds");
                ready_tx.send(()).expect("test waits");
                blobdrive::nbd::serve(&listener, exports.clone(), limits, async {
                    let _ = stop_rx.await;
                })
                .await;
                for e in exports.all() {
                    e.device.close().await.expect("closes");
                }
            });
        });
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("server ready");
        Server {
            socket,
            disks: vec![rw, ro],
            stop: Some(stop_tx),
            thread: Some(thread),
            _dir: dir,
        }
    }

    fn client(&self) -> Client {
        Client::connect(&self.socket)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn options_out_of_order_or_unknown_are_refused_and_negotiation_goes_on() {
    let server = Server::start(Limits::default());
    let mut c = server.client();
    // Extended headers first, as newer qemu asks: not offered.
    let r = c.ask(NBD_OPT_EXTENDED_HEADERS, &[]);
    assert_eq!(r.last().unwrap().reply, NBD_REP_ERR_UNSUP);
    // A metadata context before structured replies: out of order.
    let r = c.ask(
        NBD_OPT_SET_META_CONTEXT,
        &meta_data("c/rw", &[BASE_ALLOCATION]),
    );
    assert_eq!(r.last().unwrap().reply, NBD_REP_ERR_INVALID);
    // An option no one defined.
    let r = c.ask(0x4242, b"anything");
    assert_eq!(r.last().unwrap().reply, NBD_REP_ERR_UNSUP);
    // A malformed GO (a name longer than the data).
    let mut bad = go_data("c/rw", &[]);
    bad[3] = 200;
    let r = c.ask(NBD_OPT_GO, &bad);
    assert_eq!(r.last().unwrap().reply, NBD_REP_ERR_INVALID);
    // An export that does not exist.
    let r = c.ask(NBD_OPT_GO, &go_data("c/nothing", &[]));
    assert_eq!(r.last().unwrap().reply, NBD_REP_ERR_UNKNOWN);
    // The list names both drives.
    let r = c.ask(NBD_OPT_LIST, &[]);
    let names: Vec<String> = r
        .iter()
        .filter(|r| r.reply == NBD_REP_SERVER)
        .map(|r| String::from_utf8_lossy(&r.data[4..]).into_owned())
        .collect();
    assert_eq!(names, vec!["c/rw", "c/ro"]);
    // And the negotiation still ends in transmission.
    let (size, flags) = c.go_structured("c/rw");
    assert_eq!(size, 4 * MIB);
    assert_ne!(flags & NBD_FLAG_CAN_MULTI_CONN, 0);
    assert_eq!(flags & NBD_FLAG_READ_ONLY, 0);
    let a = c.call(NBD_CMD_WRITE, 0, 4096, 512, &[7u8; 512]);
    assert_eq!(a.error, 0);
    let a = c.call(NBD_CMD_READ, 0, 4096, 512, &[]);
    assert_eq!((a.error, a.data), (0, vec![7u8; 512]));
}

#[test]
fn bad_requests_get_the_specifications_errors_and_the_connection_stays() {
    let server = Server::start(Limits::default());
    let mut c = server.client();
    let (size, _) = c.go_structured("c/rw");
    let past = c.call(NBD_CMD_READ, 0, size - 512, 1024, &[]);
    assert_eq!(past.error, NBD_EINVAL, "a read past the end");
    let past = c.call(NBD_CMD_WRITE, 0, size, 512, &[1u8; 512]);
    assert_eq!(past.error, NBD_ENOSPC, "a write past the end");
    let huge = 64 * 1024 * 1024;
    let over = c.call(NBD_CMD_READ, 0, 0, huge, &[]);
    assert_eq!(over.error, NBD_EINVAL, "a read over the maximum payload");
    // A write over the maximum: its payload is read and dropped.
    let over = c.call(NBD_CMD_WRITE, 0, 0, huge, &vec![9u8; huge as usize]);
    assert!(
        [NBD_EINVAL, NBD_ENOSPC].contains(&over.error),
        "a write over the maximum payload (and past this small export's end): {}",
        over.error
    );
    let unaligned = c.call(NBD_CMD_READ, 0, 100, 512, &[]);
    assert_eq!(
        unaligned.error, NBD_EINVAL,
        "an unaligned read after GO asked for block sizes"
    );
    let unknown = c.call(99, 0, 0, 512, &[]);
    assert_eq!(unknown.error, NBD_EINVAL, "an unknown command");
    // Still in frame: a good request works, and nothing was written.
    let a = c.call(NBD_CMD_READ, 0, 0, 4096, &[]);
    assert_eq!((a.error, a.data), (0, vec![0u8; 4096]));
    assert!(server.disks[0].current_bytes().iter().all(|b| *b == 0));
}

#[test]
fn a_read_only_export_refuses_writes_with_eperm() {
    let server = Server::start(Limits::default());
    let mut c = server.client();
    let (_, flags) = c.go_structured("c/ro");
    assert_ne!(flags & NBD_FLAG_READ_ONLY, 0);
    for command in [NBD_CMD_WRITE, NBD_CMD_TRIM, NBD_CMD_WRITE_ZEROES] {
        let payload = if command == NBD_CMD_WRITE {
            vec![1u8; 512]
        } else {
            vec![]
        };
        let a = c.call(command, 0, 0, 512, &payload);
        assert_eq!(a.error, NBD_EPERM, "command {command}");
    }
    assert_eq!(c.call(NBD_CMD_FLUSH, 0, 0, 0, &[]).error, 0);
}

#[test]
fn a_bad_magic_closes_only_its_connection() {
    let server = Server::start(Limits::default());
    let mut other = server.client();
    other.go_structured("c/rw");
    let mut c = server.client();
    c.go_structured("c/rw");
    c.send(&[0xde; REQUEST_BYTES]);
    assert!(
        c.closed_by_server(),
        "a framing error closes the connection"
    );
    let a = other.call(NBD_CMD_WRITE, 0, 0, 512, &[3u8; 512]);
    assert_eq!(a.error, 0, "the other connection is unaffected");
}

#[test]
fn block_status_reports_the_devices_allocation_and_needs_a_context() {
    let server = Server::start(Limits::default());
    let mut c = server.client();
    c.go_structured("c/rw");
    // The memory device reports everything as data (the trait's default):
    // the server passes what the device says, merged and in 32-bit pieces.
    let a = c.call(NBD_CMD_BLOCK_STATUS, 0, 0, 1 << 20, &[]);
    assert_eq!(a.error, 0);
    assert_eq!(descriptors(&a.data), vec![(1 << 20, 0)]);
    let one = c.call(NBD_CMD_BLOCK_STATUS, NBD_CMD_FLAG_REQ_ONE, 0, 4096, &[]);
    assert_eq!(descriptors(&one.data), vec![(4096, 0)]);
    // Without a context selected, block status is refused.
    let mut plain = server.client();
    plain.ask(NBD_OPT_STRUCTURED_REPLY, &[]);
    plain.structured = true;
    plain.go("c/rw");
    assert_eq!(
        plain.call(NBD_CMD_BLOCK_STATUS, 0, 0, 4096, &[]).error,
        NBD_EINVAL
    );
}

#[test]
fn a_flood_of_connections_is_bounded() {
    let server = Server::start(Limits {
        max_connections: 2,
        ..Limits::default()
    });
    let mut a = server.client();
    let mut b = server.client();
    a.go_structured("c/rw");
    b.go_structured("c/rw");
    // The third is accepted by the kernel and closed by the server at once.
    let mut third = std::os::unix::net::UnixStream::connect(&server.socket).expect("connects");
    third
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 18];
    let n = std::io::Read::read(&mut third, &mut buf).unwrap_or(0);
    assert_eq!(n, 0, "no greeting past the bound");
    assert_eq!(a.call(NBD_CMD_WRITE, 0, 0, 512, &[1u8; 512]).error, 0);
    drop(b);
    // A slot frees when a client leaves.
    let mut again = None;
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(20));
        let mut s = std::os::unix::net::UnixStream::connect(&server.socket).expect("connects");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        if std::io::Read::read(&mut s, &mut buf).unwrap_or(0) > 0 {
            again = Some(s);
            break;
        }
    }
    assert!(again.is_some(), "a new client is served once one left");
}

#[test]
fn a_client_that_stalls_in_a_write_payload_is_dropped_and_frees_the_budget_for_others() {
    let max = u64::from(blobdrive::nbd::export::MAX_PAYLOAD_BYTES);
    // The whole server budget is one maximal payload.
    let server = Server::start(Limits {
        max_in_flight_bytes: max,
        io_timeout: Duration::from_secs(1),
        ..Limits::default()
    });
    let mut stalled = server.client();
    stalled.go_structured("c/rw");
    // A WRITE header announcing the largest payload, then nothing (a
    // suspended client): the server holds the whole budget for it.
    let header = Request {
        flags: 0,
        command: NBD_CMD_WRITE,
        cookie: 1,
        offset_bytes: 0,
        len_bytes: max as u32,
    }
    .encode();
    stalled.send(&header);
    stalled.send(&[0u8; 4096]);
    std::thread::sleep(Duration::from_millis(300));
    let mut other = server.client();
    other.go_structured("c/rw");
    let started = std::time::Instant::now();
    assert_eq!(other.call(NBD_CMD_WRITE, 0, 0, 512, &[7u8; 512]).error, 0);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "served once the stalled client was dropped"
    );
    assert!(
        stalled.closed_by_server(),
        "the stalled client is disconnected"
    );
}

#[test]
fn a_client_that_takes_no_replies_is_dropped_and_frees_the_budget_for_others() {
    let max = u64::from(blobdrive::nbd::export::MAX_PAYLOAD_BYTES);
    let server = Server::start(Limits {
        max_in_flight_bytes: max,
        io_timeout: Duration::from_secs(1),
        ..Limits::default()
    });
    let mut deaf = server.client();
    deaf.go_structured("c/rw");
    // Reads of the whole 4 MiB drive, their replies never taken: together
    // they hold the whole server budget.
    for _ in 0..(max / (4 * MIB)) {
        deaf.request(NBD_CMD_READ, 0, 0, (4 * MIB) as u32, &[]);
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut other = server.client();
    other.go_structured("c/rw");
    let started = std::time::Instant::now();
    assert_eq!(other.call(NBD_CMD_WRITE, 0, 0, 512, &[7u8; 512]).error, 0);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "served once the deaf client was dropped"
    );
}

/// Reads one structured reply off `stream` in pieces of at most `piece`
/// bytes, calling `between` after each; `None` once the server closed the
/// connection.
fn take_reply(
    stream: &mut std::os::unix::net::UnixStream,
    piece: usize,
    mut between: impl FnMut(),
) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut data = Vec::new();
    loop {
        let mut head = [0u8; 20];
        stream.read_exact(&mut head).ok()?;
        assert_eq!(&head[..4], &NBD_STRUCTURED_REPLY_MAGIC.to_be_bytes());
        let flags = u16::from_be_bytes(head[4..6].try_into().unwrap());
        let len = u32::from_be_bytes(head[16..20].try_into().unwrap()) as usize;
        let mut payload = vec![0u8; len];
        let mut at = 0;
        while at < len {
            let n = piece.min(len - at);
            stream.read_exact(&mut payload[at..at + n]).ok()?;
            at += n;
            between();
        }
        let kind = u16::from_be_bytes(head[6..8].try_into().unwrap());
        if kind == NBD_REPLY_TYPE_OFFSET_DATA {
            data.extend_from_slice(&payload[8..]);
        }
        if flags & NBD_REPLY_FLAG_DONE != 0 {
            return Some(data);
        }
    }
}

#[test]
fn a_slow_reader_that_keeps_taking_its_reply_is_served_past_the_io_timeout() {
    let io_timeout = Duration::from_secs(4);
    let server = Server::start(Limits {
        io_timeout,
        ..Limits::default()
    });
    let mut c = server.client();
    c.go_structured("c/rw");
    let pattern: Vec<u8> = (0..4 * MIB).map(|i| (i % 251) as u8).collect();
    assert_eq!(
        c.call(NBD_CMD_WRITE, 0, 0, (4 * MIB) as u32, &pattern)
            .error,
        0
    );
    c.request(NBD_CMD_READ, 0, 0, (4 * MIB) as u32, &[]);
    // 64 KiB every 100 ms: about 640 KiB/s, well over the least progress
    // the server asks for (1 MiB per io timeout), but the whole reply takes
    // longer than the io timeout.
    let started = std::time::Instant::now();
    let data = take_reply(&mut c.stream, 64 * 1024, || {
        std::thread::sleep(Duration::from_millis(100))
    })
    .expect("the slow reader gets its whole reply");
    assert!(
        started.elapsed() > io_timeout,
        "the reply took longer than the io timeout ({:?})",
        started.elapsed()
    );
    assert!(data == pattern, "the reply is the data written");
    assert_eq!(c.call(NBD_CMD_WRITE, 0, 0, 512, &[1u8; 512]).error, 0);
}

#[test]
fn a_client_that_stalls_mid_reply_is_dropped_and_frees_the_budget_for_others() {
    let max = u64::from(blobdrive::nbd::export::MAX_PAYLOAD_BYTES);
    let server = Server::start(Limits {
        max_in_flight_bytes: max,
        io_timeout: Duration::from_secs(1),
        ..Limits::default()
    });
    let mut stalled = server.client();
    stalled.go_structured("c/rw");
    // Reads of the whole drive that together hold the server's budget.
    for _ in 0..(max / (4 * MIB)) {
        stalled.request(NBD_CMD_READ, 0, 0, (4 * MIB) as u32, &[]);
    }
    // Half of the first reply, then nothing.
    let mut head = [0u8; 28];
    std::io::Read::read_exact(&mut stalled.stream, &mut head).expect("reply header");
    let mut half = vec![0u8; (2 * MIB) as usize];
    std::io::Read::read_exact(&mut stalled.stream, &mut half).expect("half the data");
    let mut other = server.client();
    other.go_structured("c/rw");
    let started = std::time::Instant::now();
    assert_eq!(other.call(NBD_CMD_WRITE, 0, 0, 512, &[7u8; 512]).error, 0);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "served once the stalled client was dropped"
    );
    // What the socket still holds of the first reply, then the end.
    let mut rest = vec![0u8; MIB as usize];
    let closed = loop {
        match std::io::Read::read(&mut stalled.stream, &mut rest) {
            Ok(0) => break true,
            Ok(_) => {}
            Err(e) => {
                break !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                )
            }
        }
    };
    assert!(closed, "the stalled client is disconnected");
}

#[test]
fn a_client_that_takes_each_reply_in_time_but_too_slowly_overall_is_dropped() {
    // Small replies, each taken within the io timeout, so slowly that the
    // client holds the server's whole budget for minutes: a slow loris.
    // Progress is measured over the connection, not per reply.
    let max = u64::from(blobdrive::nbd::export::MAX_PAYLOAD_BYTES);
    let io_timeout = Duration::from_secs(2);
    let server = Server::start(Limits {
        max_in_flight_bytes: max,
        io_timeout,
        ..Limits::default()
    });
    let mut loris = server.client();
    loris.go_structured("c/rw");
    let reply = 256 * 1024;
    for _ in 0..(max / reply) {
        loris.request(NBD_CMD_READ, 0, 0, reply as u32, &[]);
    }
    let mut stream = loris.stream.try_clone().expect("clones the socket");
    let reader = std::thread::spawn(move || {
        let mut taken = 0;
        // One reply every three quarters of the io timeout.
        while take_reply(&mut stream, reply as usize, || {}).is_some() {
            taken += 1;
            std::thread::sleep(io_timeout * 3 / 4);
        }
        taken
    });
    std::thread::sleep(Duration::from_millis(300));
    let mut other = server.client();
    other.go_structured("c/rw");
    let started = std::time::Instant::now();
    assert_eq!(other.call(NBD_CMD_WRITE, 0, 0, 512, &[7u8; 512]).error, 0);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "served once the slow loris was dropped"
    );
    let taken = reader.join().expect("the reader ends");
    assert!(
        (taken as u64) < max / reply,
        "the slow loris was dropped before taking all its replies ({taken})"
    );
}

#[test]
fn an_idle_connection_is_closed_only_with_an_idle_timeout() {
    let idle = Duration::from_secs(1);
    let server = Server::start(Limits {
        max_connections: 1,
        idle_timeout: Some(idle),
        ..Limits::default()
    });
    let mut c = server.client();
    c.go_structured("c/rw");
    // Requests a little closer together than the limit keep it open.
    for _ in 0..4 {
        assert_eq!(c.call(NBD_CMD_WRITE, 0, 0, 512, &[5u8; 512]).error, 0);
        std::thread::sleep(idle / 2);
    }
    let started = std::time::Instant::now();
    assert!(c.closed_by_server(), "an idle client is disconnected");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "soon after the idle timeout"
    );
    // Its slot is free again.
    let mut next = server.client();
    next.go_structured("c/rw");
    assert_eq!(next.call(NBD_CMD_READ, 0, 0, 512, &[]).data, vec![5u8; 512]);

    // Without one (the default), an idle client keeps its connection.
    let server = Server::start(Limits::default());
    let mut c = server.client();
    c.go_structured("c/rw");
    c.stream
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let mut b = [0u8; 1];
    let idle_read = std::io::Read::read(&mut c.stream, &mut b);
    assert!(
        matches!(&idle_read, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "nothing but silence from the server: {idle_read:?}"
    );
    assert_eq!(c.call(NBD_CMD_WRITE, 0, 0, 512, &[6u8; 512]).error, 0);
}

// ---------------------------------------------------------------- fuzzing

/// Cases: `BLOBDRIVE_FUZZ_CASES`, else a CI-sized default.
fn fuzz_cases(default: u32) -> u32 {
    std::env::var("BLOBDRIVE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// An option as a client might send it: a known one with plausible data,
/// mutated, or anything.
fn any_option() -> impl Strategy<Value = (u32, Vec<u8>)> {
    let known = prop_oneof![
        Just((NBD_OPT_STRUCTURED_REPLY, vec![])),
        Just((NBD_OPT_LIST, vec![])),
        Just((
            NBD_OPT_INFO,
            go_data("c/rw", &[NBD_INFO_BLOCK_SIZE, NBD_INFO_NAME])
        )),
        Just((
            NBD_OPT_SET_META_CONTEXT,
            meta_data("c/rw", &[BASE_ALLOCATION])
        )),
        Just((NBD_OPT_LIST_META_CONTEXT, meta_data("", &[]))),
        Just((NBD_OPT_LIST_META_CONTEXT, meta_data("c/ro", &["base:"]))),
        Just((NBD_OPT_EXTENDED_HEADERS, vec![])),
        Just((NBD_OPT_STARTTLS, vec![])),
    ];
    let mutated = (known, any::<usize>(), any::<u8>(), any::<bool>()).prop_map(
        |((option, mut data), at, byte, truncate)| {
            if !data.is_empty() {
                let i = at % data.len();
                if truncate {
                    data.truncate(i);
                } else {
                    data[i] = byte;
                }
            }
            (option, data)
        },
    );
    prop_oneof![
        3 => mutated,
        1 => (0u32..16, proptest::collection::vec(any::<u8>(), 0..64)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: fuzz_cases(2_000), ..ProptestConfig::default() })]

    /// Any sequence of options: the negotiation never panics, every answer
    /// is a well-formed option reply for the option asked, and a GO it
    /// accepts leads to an export that exists.
    #[test]
    fn handshake_options_never_panic(options in proptest::collection::vec(any_option(), 1..12)) {
        let catalog = MemoryCatalog::new();
        catalog.add_drive("c", "rw", MIB);
        catalog.add_drive("c", "ro", MIB);
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let exports = rt.block_on(async {
            let mut out = Vec::new();
            for (blob, writable) in [("rw", true), ("ro", false)] {
                let path = EntryPath { container: "c".into(), blob: blob.into(), snapshot: None };
                let device = catalog.open(&path, writable).await.unwrap();
                out.push(Arc::new(Export::new(format!("c/{blob}"), device, !writable)));
            }
            Exports::new(out)
        });
        let mut state = blobdrive::nbd::handshake::State::default();
        for (option, data) in options {
            match state.option(option, &data, &exports, true) {
                blobdrive::nbd::handshake::Step::Reply(bytes)
                | blobdrive::nbd::handshake::Step::Abort(bytes) => {
                    let mut at = 0;
                    while at < bytes.len() {
                        prop_assert!(bytes.len() >= at + 20);
                        prop_assert_eq!(&bytes[at..at + 8], &NBD_REP_MAGIC.to_be_bytes());
                        prop_assert_eq!(&bytes[at + 8..at + 12], &option.to_be_bytes());
                        let len = u32::from_be_bytes(bytes[at + 16..at + 20].try_into().unwrap());
                        at += 20 + len as usize;
                    }
                    prop_assert_eq!(at, bytes.len());
                }
                blobdrive::nbd::handshake::Step::Go(_, negotiated) => {
                    prop_assert!(exports.find(&negotiated.export.name).is_some());
                    break;
                }
                blobdrive::nbd::handshake::Step::Close(_) => break,
            }
        }
    }

    /// Any 28 bytes: the request parser accepts exactly those with the
    /// request magic, and what it accepts encodes back to the same bytes.
    #[test]
    fn request_headers_parse_only_with_the_magic(mut bytes in proptest::array::uniform28(any::<u8>()), magic in any::<bool>()) {
        if magic {
            bytes[..4].copy_from_slice(&NBD_REQUEST_MAGIC.to_be_bytes());
        }
        match Request::parse(&bytes) {
            Ok(request) => prop_assert_eq!(request.encode(), bytes),
            Err(_) => prop_assert_ne!(&bytes[..4], &NBD_REQUEST_MAGIC.to_be_bytes()),
        }
    }

    /// Option payloads of any bytes never panic the payload parsers.
    #[test]
    fn option_payloads_never_panic(data in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = InfoRequest::parse(&data);
        let _ = MetaContextRequest::parse(&data);
    }
}

#[test]
fn an_old_style_export_name_client_gets_simple_replies() {
    let server = Server::start(Limits::default());
    // Without NBD_OPT_GO: the export's size and flags right after the name,
    // then simple replies.
    let mut c = server.client();
    c.option(NBD_OPT_EXPORT_NAME, b"c/rw");
    let mut head = [0u8; 10];
    std::io::Read::read_exact(&mut c.stream, &mut head).expect("size and flags");
    assert_eq!(u64::from_be_bytes(head[..8].try_into().unwrap()), 4 * MIB);
    let flags = u16::from_be_bytes(head[8..].try_into().unwrap());
    assert_ne!(flags & NBD_FLAG_HAS_FLAGS, 0);
    assert_eq!(c.call(NBD_CMD_WRITE, 0, 512, 512, &[5u8; 512]).error, 0);
    let a = c.call(NBD_CMD_READ, 0, 512, 512, &[]);
    assert_eq!((a.error, a.data), (0, vec![5u8; 512]));
    // Block status needs structured replies and a context.
    assert_eq!(
        c.call(NBD_CMD_BLOCK_STATUS, 0, 0, 512, &[]).error,
        NBD_EINVAL
    );
    // An unknown name has no error reply: the connection closes.
    let mut bad = server.client();
    bad.option(NBD_OPT_EXPORT_NAME, b"c/none");
    assert!(bad.closed_by_server());
}

#[test]
fn a_client_stuck_in_the_handshake_does_not_hold_the_server_up() {
    let server = Server::start(Limits::default());
    // Reads the greeting and says nothing more.
    let _idle = std::os::unix::net::UnixStream::connect(&server.socket).expect("connects");
    std::thread::sleep(Duration::from_millis(100));
    let start = std::time::Instant::now();
    drop(server);
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "the server waited {:?} for a handshake",
        start.elapsed()
    );
}
