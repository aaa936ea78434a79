//! `blobdrive serve` against Azurite, checked with clients no one here wrote:
//! qemu-img and qemu-io (qemu-utils), nbdinfo and nbdcopy (libnbd-bin), fio's
//! nbd engine; the Python SDK reads the blob independently. The tests' own
//! client (`tests/nbd_support/`) drives what those tools cannot: two
//! connections, one writing and one flushing, before a `kill -9`.
//!
//! Every server runs in a guard that stops it (SIGTERM, then SIGKILL) even
//! when the test fails; containers are deleted by their guards.

mod common;
mod mount_support;
mod nbd_support;
mod system;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use blobdrive::nbd::proto::*;
use common::ContainerGuard;
use mount_support::{process_alive, promtool_check, send_signal, Sandbox};

const MIB: u64 = 1024 * 1024;

/// Whether the NBD clients are installed; prints `SKIPPED` (or fails under
/// `BLOBDRIVE_REQUIRE_FUSE=1`, which CI sets) when one is missing.
fn clients_present(test: &str) -> bool {
    let missing: Vec<&str> = ["qemu-img", "qemu-io", "nbdinfo", "nbdcopy", "fio"]
        .into_iter()
        .filter(|tool| !blobdrive::attach::tool_exists(tool))
        .collect();
    if missing.is_empty() {
        return true;
    }
    let why = format!(
        "{} not installed (qemu-utils, libnbd-bin, fio)",
        missing.join(", ")
    );
    if std::env::var(system::REQUIRE_ENV).as_deref() == Ok("1") {
        panic!("{test}: cannot run ({why}) and {}=1", system::REQUIRE_ENV);
    }
    println!("SKIPPED: {test}: {why}");
    false
}

/// A `blobdrive serve ... --json --foreground` process, stopped on drop.
struct Served {
    child: Option<Child>,
    socket: PathBuf,
    stderr: PathBuf,
    stdout: Option<BufReader<std::process::ChildStdout>>,
    /// The first line (`"event": "serving"`).
    ready: serde_json::Value,
}

impl Served {
    /// Starts `serve DRIVES --nbd unix:SOCKET --json EXTRA` and waits for
    /// its ready line.
    fn start(sandbox: &Sandbox, name: &str, drives: &[&str], extra: &[&str]) -> Served {
        let socket = sandbox.root.path().join(format!("{name}.sock"));
        let nbd = format!("unix:{}", socket.display());
        Served::start_at(sandbox, name, drives, &nbd, extra)
    }

    /// Starts `serve DRIVES --nbd NBD --json EXTRA`.
    fn start_at(
        sandbox: &Sandbox,
        name: &str,
        drives: &[&str],
        nbd: &str,
        extra: &[&str],
    ) -> Served {
        let socket = PathBuf::from(nbd.strip_prefix("unix:").unwrap_or_default());
        let stderr = sandbox.root.path().join(format!("{name}.log"));
        let mut args = vec!["serve"];
        args.extend(drives);
        args.extend(["--nbd", nbd, "--json", "--foreground", "-v"]);
        args.extend(extra);
        let child = sandbox
            .command(&args)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).expect("log file"))
            .spawn()
            .expect("starts blobdrive serve");
        let mut served = Served {
            child: Some(child),
            socket,
            stderr,
            stdout: None,
            ready: serde_json::Value::Null,
        };
        let stdout = served.child.as_mut().unwrap().stdout.take().unwrap();
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        let read = reader.read_line(&mut line);
        assert!(
            matches!(read, Ok(n) if n > 0),
            "serve printed no ready line: {}",
            served.log()
        );
        served.ready = serde_json::from_str(&line).expect("the ready line is JSON");
        assert_eq!(served.ready["event"], "serving");
        served.stdout = Some(reader);
        served
    }

    fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.socket.display())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    /// SIGTERM, wait; returns the exit status and the `stopped` line.
    fn stop(mut self) -> (std::process::ExitStatus, serde_json::Value) {
        send_signal(self.pid(), libc::SIGTERM);
        let status = self.wait(Duration::from_secs(60));
        let mut line = String::new();
        let _ = self.stdout.take().unwrap().read_line(&mut line);
        let stopped = serde_json::from_str(&line).unwrap_or(serde_json::Value::Null);
        (status, stopped)
    }

    /// SIGKILL, wait.
    fn kill(mut self) {
        send_signal(self.pid(), libc::SIGKILL);
        self.wait(Duration::from_secs(10));
    }

    fn wait(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("still running");
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                return status;
            }
            if start.elapsed() > timeout {
                let _ = child.kill();
                panic!("serve did not stop in {timeout:?}: {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = child.id() as i32;
            send_signal(pid, libc::SIGTERM);
            let start = Instant::now();
            while process_alive(pid) && start.elapsed() < Duration::from_secs(20) {
                if child.try_wait().ok().flatten().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn sandbox() -> Sandbox {
    Sandbox::new(common::connection_string())
}

/// Runs a tool; returns stdout, panics with stderr on failure.
fn tool(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{program} runs: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The data extents `nbdinfo --map --json` shows, as `(offset, length)`;
/// every other extent must be `hole,zero` (type 3).
fn data_extents(uri: &str) -> Vec<(u64, u64)> {
    let out = tool("nbdinfo", &["--map", "--json", uri]);
    let map: serde_json::Value = serde_json::from_str(&out).expect("nbdinfo --json is JSON");
    let mut data = Vec::new();
    for e in map.as_array().expect("a list of extents") {
        let (offset, length, kind) = (
            e["offset"].as_u64().unwrap(),
            e["length"].as_u64().unwrap(),
            e["type"].as_u64().unwrap(),
        );
        match kind {
            0 => data.push((offset, length)),
            3 => {}
            other => panic!("extent {e} has type {other}: neither data nor hole+zero"),
        }
    }
    data
}

/// The blob's page ranges below `data_bytes` (the footer excluded), as the
/// Python SDK reports them: `(offset, length)`.
fn sdk_page_ranges(container: &str, blob: &str, data_bytes: u64) -> Vec<(u64, u64)> {
    const PY: &str = r#"
import os, sys
from azure.storage.blob import BlobClient
b = BlobClient.from_connection_string(os.environ["CS"], sys.argv[1], sys.argv[2])
print(";".join("%d-%d" % (r["start"], r["end"]) for r in b.get_page_ranges()[0]))
"#;
    let out = common::python(PY, &[container, blob]);
    out.split(';')
        .filter(|r| !r.is_empty())
        .map(|r| {
            let (s, e) = r.split_once('-').unwrap();
            let (s, e): (u64, u64) = (s.parse().unwrap(), e.parse().unwrap());
            (s, e + 1 - s)
        })
        .filter(|(s, _)| *s < data_bytes)
        .collect()
}

/// `len` bytes at `offset` of the blob, read by the Python SDK.
fn sdk_read(container: &str, blob: &str, offset: u64, len: u64) -> Vec<u8> {
    const PY: &str = r#"
import os, sys
from azure.storage.blob import BlobClient
b = BlobClient.from_connection_string(os.environ["CS"], sys.argv[1], sys.argv[2])
print(b.download_blob(offset=int(sys.argv[3]), length=int(sys.argv[4])).readall().hex())
"#;
    let hex = common::python(
        PY,
        &[container, blob, &offset.to_string(), &len.to_string()],
    );
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

fn read_file_at(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path).expect("opens");
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, offset).expect("reads");
    buf
}

#[tokio::test(flavor = "multi_thread")]
async fn qemu_writes_match_a_download_and_read_back_through_a_mount_after_the_export_stops() {
    let test = "qemu_writes_match_a_download_and_read_back_through_a_mount_after_the_export_stops";
    if !clients_present(test) || !system::can_run(test, false) {
        return;
    }
    let g = ContainerGuard::new("nbd-qemu").await;
    let drive = format!("{}/disk.vhd", g.name);
    let sb = sandbox();
    sb.blobdrive_ok(&["create", &drive, "--size", "64M"]);
    let served = Served::start(&sb, "a", &[&drive], &[]);
    let uri = served.uri(&drive);
    let info = tool("qemu-img", &["info", "--output=json", &uri]);
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["virtual-size"], 64 * MIB);
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0xab 1M 64k",
            "-c",
            "write -P 0xcd 10M 1M",
            "-c",
            "write -z 10M 4k",
            "-c",
            "discard 1M 4k",
            "-c",
            "flush",
            &uri,
        ],
    );
    let local = sb.root.path().join("download.raw");
    sb.blobdrive_ok(&["download", &drive, &local.to_string_lossy(), "--raw"]);
    tool(
        "qemu-img",
        &[
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            &uri,
            &local.to_string_lossy(),
        ],
    );
    let (status, stopped) = served.stop();
    assert!(status.success(), "serve exits 0 after SIGTERM");
    let counters = &stopped["exports"][0]["counters"];
    assert!(counters["write_bytes"].as_u64().unwrap() >= 64 * 1024 + MIB);
    // The blob has it, with the export gone: read through a namespace mount.
    let mount = sb.mount("ns", Some(&g.name), &["--read-only"]);
    let file = mount.path("disk.vhd");
    assert_eq!(read_file_at(&file, MIB, 4096), vec![0u8; 4096], "discarded");
    assert_eq!(
        read_file_at(&file, MIB + 4096, 60 * 1024),
        vec![0xab; 60 * 1024]
    );
    assert_eq!(
        read_file_at(&file, 10 * MIB, 4096),
        vec![0u8; 4096],
        "zeroed"
    );
    assert_eq!(
        read_file_at(&file, 10 * MIB + 4096, 1020 * 1024),
        vec![0xcd; 1020 * 1024]
    );
    mount.unmount();
}

#[tokio::test(flavor = "multi_thread")]
async fn nbdinfo_map_lists_the_written_extents_as_data_before_and_after_the_flush() {
    let test = "nbdinfo_map_lists_the_written_extents_as_data_before_and_after_the_flush";
    if !clients_present(test) {
        return;
    }
    let g = ContainerGuard::new("nbd-map").await;
    let drive = format!("{}/disk.vhd", g.name);
    let sb = sandbox();
    sb.blobdrive_ok(&["create", &drive, "--size", "64M"]);
    // An hour's flush delay: the writes stay dirty in the cache until the
    // explicit flush, so the first map must come from the cache.
    let served = Served::start(&sb, "a", &[&drive], &["--flush-delay", "1h"]);
    let uri = served.uri(&drive);
    let written = [(MIB, 64 * 1024), (5 * MIB, 4096), (40 * MIB, 3 * MIB)];
    // The tests' own client: qemu-io would flush when it closes.
    let mut c = nbd_support::Client::connect(&served.socket);
    c.go_structured(&drive);
    for (offset, len) in written {
        let data = vec![0x5a; len as usize];
        assert_eq!(c.call(NBD_CMD_WRITE, 0, offset, len as u32, &data).error, 0);
    }
    assert_eq!(data_extents(&uri), written, "dirty pages are data");
    assert!(
        sdk_page_ranges(&g.name, "disk.vhd", 64 * MIB).is_empty(),
        "nothing was flushed yet"
    );
    assert_eq!(c.call(NBD_CMD_FLUSH, 0, 0, 0, &[]).error, 0);
    assert_eq!(data_extents(&uri), written, "flushed pages are data");
    assert_eq!(
        sdk_page_ranges(&g.name, "disk.vhd", 64 * MIB),
        written,
        "the blob's page ranges are the map's data extents"
    );
    // qemu's write-zeroes: without -u it sends NO_HOLE (the zeros stay
    // allocated), with -u it lets the server punch a hole (Clear Pages).
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -z 20M 64k",
            "-c",
            "write -z -u 30M 64k",
            "-c",
            "write -z -u 40M 4k",
            &uri,
        ],
    );
    let after = vec![
        (MIB, 64 * 1024),
        (5 * MIB, 4096),
        (20 * MIB, 64 * 1024),
        (40 * MIB + 4096, 3 * MIB - 4096),
    ];
    assert_eq!(
        data_extents(&uri),
        after,
        "NO_HOLE zeros stay data, trims are holes"
    );
    assert_eq!(sdk_page_ranges(&g.name, "disk.vhd", 64 * MIB), after);
    let (status, _) = served.stop();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn nbdcopy_of_a_sparse_8_gib_drive_reads_only_its_data() {
    let test = "nbdcopy_of_a_sparse_8_gib_drive_reads_only_its_data";
    if !clients_present(test) {
        return;
    }
    let g = ContainerGuard::new("nbd-copy").await;
    let drive = format!("{}/disk.vhd", g.name);
    let sb = sandbox();
    sb.blobdrive_ok(&["create", &drive, "--size", "8G"]);
    let writer = Served::start(&sb, "w", &[&drive], &[]);
    let uri = writer.uri(&drive);
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0x11 0 1M",
            "-c",
            "write -P 0x22 5G 2M",
            "-c",
            "flush",
            &uri,
        ],
    );
    assert!(writer.stop().0.success());
    let data_bytes = 3 * MIB;
    let reader = Served::start(&sb, "r", &[&drive], &["--read-only"]);
    let local = sb.root.path().join("copy.raw");
    tool("nbdcopy", &[&reader.uri(&drive), &local.to_string_lossy()]);
    let (status, stopped) = reader.stop();
    assert!(status.success());
    let read = stopped["exports"][0]["counters"]["read_bytes"]
        .as_u64()
        .unwrap();
    assert!(
        read <= data_bytes + MIB,
        "nbdcopy asked for {read} bytes of a drive holding {data_bytes}"
    );
    assert_eq!(std::fs::metadata(&local).unwrap().len(), 8 << 30);
    assert_eq!(
        read_file_at(&local, 0, MIB as usize),
        vec![0x11; MIB as usize]
    );
    assert_eq!(
        read_file_at(&local, 5 << 30, 2 * MIB as usize),
        vec![0x22; 2 * MIB as usize]
    );
    assert_eq!(read_file_at(&local, 3 << 30, 4096), vec![0; 4096]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_read_write_export_of_a_drive_in_use_is_refused_in_one_line() {
    let g = ContainerGuard::new("nbd-busy").await;
    let drive = format!("{}/disk.vhd", g.name);
    let sb = sandbox();
    sb.blobdrive_ok(&["create", &drive, "--size", "16M"]);
    let first = Served::start(&sb, "a", &[&drive], &[]);
    let nbd = format!("unix:{}", sb.root.path().join("b.sock").display());
    let out = sb.blobdrive(&["serve", &drive, "--nbd", &nbd]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("in use elsewhere"), "{stderr}");
    // A socket another server listens on is not taken over.
    let taken = format!("unix:{}", first.socket.display());
    let out = sb.blobdrive(&["serve", &drive, "--read-only", "--nbd", &taken]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("another server is listening there"),
        "{stderr}"
    );
    // Read-only exports hold no lease: any number may run beside it.
    let ro = Served::start(&sb, "c", &[&drive], &["--read-only"]);
    assert_eq!(ro.ready["exports"][0]["read_only"], true);
    assert!(ro.stop().0.success());
    assert!(first.stop().0.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_export_is_read_only_and_refuses_writes_with_eperm() {
    let test = "a_snapshot_export_is_read_only_and_refuses_writes_with_eperm";
    if !clients_present(test) {
        return;
    }
    let g = ContainerGuard::new("nbd-snap").await;
    let drive = format!("{}/disk.vhd", g.name);
    let sb = sandbox();
    sb.blobdrive_ok(&["create", &drive, "--size", "16M"]);
    let writer = Served::start(&sb, "w", &[&drive], &[]);
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0x77 0 64k",
            "-c",
            "flush",
            &writer.uri(&drive),
        ],
    );
    let time = sb.blobdrive_ok(&["snapshot", &drive]).trim().to_string();
    let snap = Served::start(&sb, "s", &[&drive], &["--snapshot", &time]);
    let name = format!("{drive}@{time}");
    assert_eq!(snap.ready["exports"][0]["name"], name.as_str());
    let info = tool("nbdinfo", &["--json", &snap.uri(&name)]);
    assert!(info.contains("\"is_read_only\": true"), "{info}");
    let mut c = nbd_support::Client::connect(&snap.socket);
    c.go_structured(&name);
    let a = c.call(NBD_CMD_WRITE, 0, 0, 512, &[1u8; 512]);
    assert_eq!(a.error, NBD_EPERM);
    let a = c.call(NBD_CMD_READ, 0, 0, 4096, &[]);
    assert_eq!((a.error, a.data), (0, vec![0x77; 4096]));
    drop(c);
    assert!(snap.stop().0.success());
    assert!(writer.stop().0.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_write_on_one_connection_flushed_on_another_survives_a_kill() {
    let g = ContainerGuard::new("nbd-kill").await;
    let drive = format!("{}/disk.vhd", g.name);
    let sb = sandbox();
    sb.blobdrive_ok(&["create", &drive, "--size", "16M"]);
    let served = Served::start(&sb, "a", &[&drive], &["--flush-delay", "1h"]);
    let mut a = nbd_support::Client::connect(&served.socket);
    let (_, flags) = a.go_structured(&drive);
    assert_ne!(
        flags & NBD_FLAG_CAN_MULTI_CONN,
        0,
        "multi-conn is announced"
    );
    let mut b = nbd_support::Client::connect(&served.socket);
    b.go_structured(&drive);
    let pattern: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
    assert_eq!(a.call(NBD_CMD_WRITE, 0, MIB, 8192, &pattern).error, 0);
    assert_eq!(b.call(NBD_CMD_FLUSH, 0, 0, 0, &[]).error, 0);
    served.kill();
    assert_eq!(sdk_read(&g.name, "disk.vhd", MIB, 8192), pattern);
    // The killed server left its lease: break it so the container goes.
    sb.blobdrive_ok(&["break-lease", &drive]);
}

#[tokio::test(flavor = "multi_thread")]
async fn fio_nbd_engine_random_read_write_verifies() {
    let test = "fio_nbd_engine_random_read_write_verifies";
    if !clients_present(test) {
        return;
    }
    let g = ContainerGuard::new("nbd-fio").await;
    let drive = format!("{}/disk.vhd", g.name);
    let sb = sandbox();
    sb.blobdrive_ok(&["create", &drive, "--size", "64M"]);
    let served = Served::start(&sb, "a", &[&drive], &[]);
    let uri = format!("--uri={}", served.uri(&drive));
    tool(
        "fio",
        &[
            "--name=nbd",
            "--ioengine=nbd",
            &uri,
            "--rw=randrw",
            "--bs=4k",
            "--size=32M",
            "--iodepth=16",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--randseed=1234",
            // No verify state file in the working directory.
            "--verify_state_save=0",
        ],
    );
    let (status, stopped) = served.stop();
    assert!(status.success(), "serve stops cleanly");
    assert_eq!(stopped["exports"][0]["counters"]["errors"], 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tcp_export_on_loopback_serves_the_same_drive() {
    let test = "a_tcp_export_on_loopback_serves_the_same_drive";
    if !clients_present(test) {
        return;
    }
    let g = ContainerGuard::new("nbd-tcp").await;
    let drive = format!("{}/disk.vhd", g.name);
    let sb = sandbox();
    sb.blobdrive_ok(&["create", &drive, "--size", "16M"]);
    // Port 0: the system picks one, and the ready line says which.
    let served = Served::start_at(
        &sb,
        "t",
        &[&drive],
        "tcp:127.0.0.1:0",
        &["--metrics-listen", "0"],
    );
    let endpoint = served.ready["endpoint"].as_str().unwrap().to_string();
    let addr = endpoint.strip_prefix("tcp:").expect("a tcp endpoint");
    let uri = served.ready["exports"][0]["uri"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(uri, format!("nbd://{addr}/{drive}"));
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0x42 4k 4k",
            "-c",
            "read -P 0x42 4k 4k",
            &uri,
        ],
    );
    let size = tool("nbdinfo", &["--size", &uri]);
    assert_eq!(size.trim(), (16 * MIB).to_string());
    // The server's end of a TCP connection is probed (keepalive): `ss`
    // shows its timer while the client idles in the handshake.
    let idle = std::net::TcpStream::connect(addr).expect("connects");
    let port = addr.rsplit(':').next().unwrap();
    let filter = format!("( sport = :{port} )");
    let start = Instant::now();
    loop {
        let ss = tool("ss", &["-tnoH", "state", "established", &filter]);
        if ss.contains("timer:(keepalive") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no keepalive timer on the server's socket: {ss}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(idle);
    // --metrics-listen serves the exported drive's counters for Prometheus.
    let metrics = served.ready["metrics"]
        .as_str()
        .expect("the metrics address");
    let mut http = std::net::TcpStream::connect(metrics).expect("metrics listener");
    std::io::Write::write_all(&mut http, b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut http, &mut text).unwrap();
    assert!(text.contains(&format!("drive=\"{drive}\"")), "{text}");
    assert!(served.stop().0.success());
    assert_eq!(sdk_read(&g.name, "disk.vhd", 4096, 4096), vec![0x42; 4096]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_background_server_returns_once_it_serves_and_releases_the_lease_at_sigterm() {
    let test = "a_background_server_returns_once_it_serves_and_releases_the_lease_at_sigterm";
    if !clients_present(test) {
        return;
    }
    let g = ContainerGuard::new("nbd-bg").await;
    let drive = format!("{}/disk.vhd", g.name);
    let sb = sandbox();
    sb.blobdrive_ok(&["create", &drive, "--size", "16M"]);
    let socket = sb.root.path().join("bg.sock");
    let log = sb.root.path().join("bg.log");
    let nbd = format!("unix:{}", socket.display());
    let out = sb.blobdrive_ok(&[
        "serve",
        &drive,
        "--nbd",
        &nbd,
        "--json",
        "--log-file",
        &log.to_string_lossy(),
        "-v",
    ]);
    let ready: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON line");
    let pid = ready["pid"].as_i64().expect("the daemon's pid") as i32;
    // Stopped even if the test fails from here on.
    let daemon = KilledOnDrop(pid);
    assert!(
        process_alive(pid),
        "the daemon serves after the command returned"
    );
    let uri = ready["exports"][0]["uri"].as_str().unwrap().to_string();
    tool("qemu-io", &["-f", "raw", "-c", "write -P 0x33 0 64k", &uri]);
    send_signal(pid, libc::SIGTERM);
    let start = Instant::now();
    while process_alive(pid) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "still running after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(daemon);
    assert!(!socket.exists(), "the socket is removed");
    assert_eq!(sdk_read(&g.name, "disk.vhd", 0, 4096), vec![0x33; 4096]);
    // The lease went with it: a read-write export starts again.
    let again = Served::start(&sb, "again", &[&drive], &[]);
    assert!(again.stop().0.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_write_export_of_an_attached_drive_is_refused_and_a_read_only_one_is_not() {
    let test = "a_read_write_export_of_an_attached_drive_is_refused_and_a_read_only_one_is_not";
    if !clients_present(test) || !system::can_run(test, true) {
        return;
    }
    let g = ContainerGuard::new("nbd-attached").await;
    let drive = format!("{}/disk.vhd", g.name);
    let sb = sandbox();
    sb.blobdrive_ok(&["create", &drive, "--size", "64M", "--mkfs", "ext4"]);
    let attached = sb.mount("attached", Some(&drive), &[]);
    let nbd = format!("unix:{}", sb.root.path().join("x.sock").display());
    let out = sb.blobdrive(&["serve", &drive, "--nbd", &nbd]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("in use elsewhere"), "{stderr}");
    let ro = Served::start(&sb, "ro", &[&drive], &["--read-only"]);
    let size = tool("nbdinfo", &["--size", &ro.uri(&drive)]);
    assert_eq!(size.trim(), (64 * MIB).to_string());
    assert!(ro.stop().0.success());
    attached.unmount();
}

#[tokio::test(flavor = "multi_thread")]
async fn one_server_exports_several_drives_by_name() {
    let test = "one_server_exports_several_drives_by_name";
    if !clients_present(test) {
        return;
    }
    let g = ContainerGuard::new("nbd-many").await;
    let (a, b) = (format!("{}/a.vhd", g.name), format!("{}/b.vhd", g.name));
    let sb = sandbox();
    sb.blobdrive_ok(&["create", &a, "--size", "16M"]);
    sb.blobdrive_ok(&["create", &b, "--size", "32M"]);
    let served = Served::start(&sb, "m", &[&a, &b], &[]);
    let list = tool(
        "nbdinfo",
        &[
            "--list",
            &format!("nbd+unix:///?socket={}", served.socket.display()),
        ],
    );
    assert!(list.contains(&format!("export=\"{a}\"")), "{list}");
    assert!(list.contains(&format!("export=\"{b}\"")), "{list}");
    assert_eq!(
        tool("nbdinfo", &["--size", &served.uri(&a)]).trim(),
        (16 * MIB).to_string()
    );
    assert_eq!(
        tool("nbdinfo", &["--size", &served.uri(&b)]).trim(),
        (32 * MIB).to_string()
    );
    assert!(served.stop().0.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn writes_an_export_cannot_flush_after_its_lease_was_broken_go_to_a_recovery_file() {
    let g = ContainerGuard::new("nbd-lost").await;
    let drive = format!("{}/disk.vhd", g.name);
    let sb = sandbox();
    sb.blobdrive_ok(&["create", &drive, "--size", "16M"]);
    let served = Served::start(&sb, "a", &[&drive], &["--flush-delay", "1h"]);
    let mut c = nbd_support::Client::connect(&served.socket);
    c.go_structured(&drive);
    assert_eq!(c.call(NBD_CMD_WRITE, 0, MIB, 4096, &[0x61; 4096]).error, 0);
    // Another host takes the drive over.
    sb.blobdrive_ok(&["break-lease", &drive]);
    let flush = c.call(NBD_CMD_FLUSH, 0, 0, 0, &[]);
    assert_eq!(flush.error, NBD_EIO, "a flush without the lease fails");
    drop(c);
    let log = served.stderr.clone();
    let (status, _) = served.stop();
    assert_eq!(status.code(), Some(1), "the unflushed data is reported");
    let text = std::fs::read_to_string(log).unwrap_or_default();
    assert!(
        text.contains("run 'blobdrive recover"),
        "the error names the file: {text}"
    );
    let saved: Vec<_> = std::fs::read_dir(sb.recovery_dir())
        .expect("a recovery directory")
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "bdrec"))
        .collect();
    assert_eq!(saved.len(), 1, "one recovery file for the drive");
}

/// The recovery files in the sandbox's recovery directory.
fn saved_files(sb: &Sandbox) -> Vec<PathBuf> {
    std::fs::read_dir(sb.recovery_dir())
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "bdrec"))
                .collect()
        })
        .unwrap_or_default()
}

/// What the blob holds at `offset`, read by the test's own client.
async fn blob_at(g: &ContainerGuard, drive: &str, offset: u64, len: u64) -> Vec<u8> {
    let path = blobdrive::blob::BlobPath::parse(drive).expect("a blob path");
    g.client
        .get_blob_range(
            &path,
            blobdrive::units::ByteRange::new(offset, offset + len),
        )
        .await
        .expect("read the blob")
        .to_vec()
}

#[tokio::test(flavor = "multi_thread")]
async fn recover_refuses_a_file_whose_drive_another_host_wrote_after_the_break_though_it_stopped_before_the_save(
) {
    // Host A: a write acknowledged and not flushed.
    let g = ContainerGuard::new("nbd-fence").await;
    let drive = format!("{}/disk.vhd", g.name);
    let sb = sandbox();
    sb.blobdrive_ok(&["create", &drive, "--size", "16M"]);
    let a = Served::start(&sb, "a", &[&drive], &["--flush-delay", "10m"]);
    let mut c = nbd_support::Client::connect(&a.socket);
    c.go_structured(&drive);
    let ours = vec![0xaa; MIB as usize];
    assert_eq!(c.call(NBD_CMD_WRITE, 0, 0, MIB as u32, &ours).error, 0);
    // An operator breaks A's lease; host B writes the same bytes and is done
    // (it releases its lease) before A saves anything.
    sb.blobdrive_ok(&["break-lease", &drive]);
    let b = Served::start(&sb, "b", &[&drive], &[]);
    let mut cb = nbd_support::Client::connect(&b.socket);
    cb.go_structured(&drive);
    let theirs = vec![0xbb; MIB as usize];
    assert_eq!(cb.call(NBD_CMD_WRITE, 0, 0, MIB as u32, &theirs).error, 0);
    assert_eq!(cb.call(NBD_CMD_FLUSH, 0, 0, 0, &[]).error, 0);
    drop(cb);
    assert!(b.stop().0.success(), "B unmounts cleanly");
    // A's flush fails; its unmount saves the data.
    assert_eq!(c.call(NBD_CMD_FLUSH, 0, 0, 0, &[]).error, NBD_EIO);
    drop(c);
    assert_eq!(a.stop().0.code(), Some(1));
    let saved = saved_files(&sb);
    assert_eq!(saved.len(), 1, "one recovery file for A's data");
    let file = saved[0].to_string_lossy().to_string();

    let out = sb.blobdrive(&["recover", &file]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("another blobdrive host wrote") && stderr.contains("--force"),
        "names what changed and how to override: {stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert_eq!(
        blob_at(&g, &drive, 0, MIB).await,
        theirs,
        "B's write survives"
    );
    assert!(saved[0].exists(), "a refused file is kept");
    // Forced, the operator's call: A's pages go in.
    sb.blobdrive_ok(&["recover", &file, "--force"]);
    assert_eq!(blob_at(&g, &drive, 0, MIB).await, ours);
}

/// The rows of `list --mounted --json` that are exports (`"kind": "nbd"`).
/// A background server's pid, killed (SIGKILL) when dropped if still alive,
/// so a failing test leaves no server behind.
struct KilledOnDrop(i32);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        if process_alive(self.0) {
            send_signal(self.0, libc::SIGKILL);
        }
    }
}

fn listed_exports(sb: &Sandbox) -> Vec<serde_json::Value> {
    let out = sb.blobdrive_ok(&["list", "--mounted", "--json"]);
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).expect("list --mounted is JSON");
    rows.into_iter().filter(|r| r["kind"] == "nbd").collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_background_server_is_listed_counted_logged_and_stopped_by_unmount_after_its_final_flush()
{
    let g = ContainerGuard::new("nbd-ctl").await;
    let drive = format!("{}/disk.vhd", g.name);
    let sb = sandbox();
    sb.blobdrive_ok(&["create", &drive, "--size", "16M"]);
    let socket = sb.root.path().join("ctl.sock");
    let nbd = format!("unix:{}", socket.display());
    let textfiles = sb.dir("textfiles");
    // No --log-file: the log goes to the run directory. A long flush delay
    // keeps the write dirty until the final flush.
    let out = sb.blobdrive_ok(&[
        "serve",
        &drive,
        "--nbd",
        &nbd,
        "--json",
        "--flush-delay",
        "1h",
        "--metrics-textfile",
        &textfiles.to_string_lossy(),
        "-v",
    ]);
    let ready: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON line");
    let pid = ready["pid"].as_i64().expect("the daemon's pid") as i32;
    let _daemon = KilledOnDrop(pid);
    let mut c = nbd_support::Client::connect(&socket);
    c.go_structured(&drive);
    assert_eq!(c.call(NBD_CMD_WRITE, 0, 0, 4096, &[0x5a; 4096]).error, 0);
    // Past the end: refused, counted, and the connection stays.
    assert_eq!(
        c.call(NBD_CMD_READ, 0, 64 * MIB, 4096, &[]).error,
        NBD_EINVAL
    );
    drop(c);

    let rows = listed_exports(&sb);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["drive"], drive.as_str());
    assert_eq!(rows[0]["nbd"], nbd.as_str());
    assert_eq!(rows[0]["mode"], "read-write");
    assert_eq!(rows[0]["pid"].as_i64(), Some(i64::from(pid)));
    assert_eq!(rows[0]["alive"], true);
    let log = PathBuf::from(rows[0]["log_file"].as_str().expect("a default log file"));
    assert!(log.starts_with(sb.root.path().join("run")), "{log:?}");

    // A package upgrade (`upgrade --all`) cannot hand a server over: it
    // names it as left on the old binary, and that is not a failure.
    let upgraded: Vec<serde_json::Value> =
        serde_json::from_str(&sb.blobdrive_ok(&["upgrade", "--all", "--json"]))
            .expect("upgrade --all --json is JSON");
    assert!(
        upgraded
            .iter()
            .any(|r| r["endpoint"] == nbd.as_str() && r["left"] == "an NBD server"),
        "{upgraded:?}"
    );

    // `stats` by the socket path, and by the export's name.
    let stats: serde_json::Value =
        serde_json::from_str(&sb.blobdrive_ok(&["stats", &socket.to_string_lossy(), "--json"]))
            .expect("stats is JSON");
    assert_eq!(stats["endpoint"], nbd.as_str());
    let counters = &stats["devices"][drive.as_str()];
    assert_eq!(counters["nbd_write_requests"], 1, "{stats}");
    assert_eq!(counters["nbd_errors"], 1, "{stats}");
    let text = sb.blobdrive_ok(&["stats", &drive, "--prometheus"]);
    for line in [
        format!("blobdrive_nbd_requests_total{{drive=\"{drive}\",command=\"write\"}} 1"),
        format!("blobdrive_nbd_bytes_total{{drive=\"{drive}\",direction=\"write\"}} 4096"),
        format!("blobdrive_nbd_refused_requests_total{{drive=\"{drive}\"}} 1"),
        "blobdrive_nbd_connections_total 1".to_string(),
    ] {
        assert!(text.lines().any(|l| l == line), "no {line} in:\n{text}");
    }
    if blobdrive::attach::tool_exists("promtool") {
        promtool_check(&text);
    }
    // node_exporter's textfile, written at once and removed at the end.
    let prom = || {
        std::fs::read_dir(&textfiles)
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "prom"))
    };
    let file = prom().expect("a textfile");
    let written = std::fs::read_to_string(&file).unwrap();
    assert!(
        written.contains("blobdrive_nbd_connections_total"),
        "{written}"
    );

    // `unmount SOCKET` returns once the final flush is in the blob.
    sb.blobdrive_ok(&["unmount", &socket.to_string_lossy()]);
    assert_eq!(sdk_read(&g.name, "disk.vhd", 0, 4096), vec![0x5a; 4096]);
    let start = Instant::now();
    while process_alive(pid) {
        assert!(start.elapsed() < Duration::from_secs(10), "still running");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(listed_exports(&sb).is_empty(), "forgotten once stopped");
    assert!(prom().is_none(), "the textfile is removed");
    assert!(!socket.exists(), "the socket is removed");
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(logged.contains("NBD server stopped"), "{logged}");
    // The lease went with it: the drive attaches (here, exports) again.
    let again = Served::start(&sb, "again", &[&drive], &[]);
    assert!(again.stop().0.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn unmount_of_a_server_whose_final_flush_fails_exits_non_zero_and_names_the_recovery_file() {
    let g = ContainerGuard::new("nbd-stopfail").await;
    let drive = format!("{}/disk.vhd", g.name);
    let sb = sandbox();
    sb.blobdrive_ok(&["create", &drive, "--size", "16M"]);
    let mut served = Served::start(&sb, "a", &[&drive], &["--flush-delay", "1h"]);
    let mut c = nbd_support::Client::connect(&served.socket);
    c.go_structured(&drive);
    assert_eq!(c.call(NBD_CMD_WRITE, 0, MIB, 4096, &[0x61; 4096]).error, 0);
    drop(c);
    // Another host takes the drive over: the final flush cannot be sent.
    sb.blobdrive_ok(&["break-lease", &drive]);
    let out = sb.blobdrive(&["unmount", &drive]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("blobdrive recover"), "{stderr}");
    assert_eq!(
        served.wait(Duration::from_secs(30)).code(),
        Some(1),
        "the server says it too"
    );
    let saved = std::fs::read_dir(sb.recovery_dir())
        .expect("a recovery directory")
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "bdrec"))
        .count();
    assert_eq!(saved, 1, "one recovery file for the drive");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_of_a_served_drive_first_flushes_what_its_clients_wrote() {
    let g = ContainerGuard::new("nbd-snap").await;
    let drive = format!("{}/disk.vhd", g.name);
    let sb = sandbox();
    sb.blobdrive_ok(&["create", &drive, "--size", "16M"]);
    let served = Served::start(&sb, "a", &[&drive], &["--flush-delay", "1h"]);
    let mut c = nbd_support::Client::connect(&served.socket);
    c.go_structured(&drive);
    assert_eq!(c.call(NBD_CMD_WRITE, 0, 0, 4096, &[0x7e; 4096]).error, 0);
    assert_eq!(
        sdk_read(&g.name, "disk.vhd", 0, 4096),
        vec![0; 4096],
        "not flushed yet"
    );
    let time = sb.blobdrive_ok(&["snapshot", &drive]);
    assert!(!time.trim().is_empty());
    assert_eq!(sdk_read(&g.name, "disk.vhd", 0, 4096), vec![0x7e; 4096]);
    drop(c);
    assert!(served.stop().0.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_stops_leaves_the_socket_another_server_made_at_its_path() {
    let test = "a_server_that_stops_leaves_the_socket_another_server_made_at_its_path";
    if !clients_present(test) {
        return;
    }
    let g = ContainerGuard::new("nbd-sock").await;
    let drive = format!("{}/disk.vhd", g.name);
    let sb = sandbox();
    sb.blobdrive_ok(&["create", &drive, "--size", "16M"]);
    let first = Served::start(&sb, "s", &[&drive], &["--read-only"]);
    // Someone removes its sockets (NBD and control) and a second server
    // listens at the same path.
    std::fs::remove_file(&first.socket).unwrap();
    for entry in std::fs::read_dir(sb.root.path().join("run")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|x| x == "sock") {
            std::fs::remove_file(path).unwrap();
        }
    }
    let second = Served::start(&sb, "s", &[&drive], &["--read-only"]);
    assert!(first.stop().0.success());
    assert!(second.socket.exists(), "the second server's socket stays");
    // Its registry entry and control socket stay too.
    let rows = listed_exports(&sb);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["pid"].as_i64(), Some(i64::from(second.pid())));
    let stats = sb.blobdrive_ok(&["stats", &second.socket.to_string_lossy(), "--json"]);
    assert!(stats.contains("\"serving\""), "{stats}");
    let size = tool("nbdinfo", &["--size", &second.uri(&drive)]);
    assert_eq!(size.trim(), (16 * MIB).to_string());
    let path = second.socket.clone();
    assert!(second.stop().0.success());
    assert!(!path.exists(), "removed by the server that made it");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_unmount_during_a_slow_final_flush_waits_for_the_same_answer_and_never_advises_break_lease(
) {
    use common::fault_proxy::{Fault, FaultProxy};
    let g = ContainerGuard::new("nbd-stop2").await;
    let drive = format!("{}/disk.vhd", g.name);
    let proxy = FaultProxy::start(&common::account().endpoint, Fault::ServerBusy, 0).await;
    let mut account = common::account();
    account.endpoint = proxy.endpoint.clone();
    // Storage hangs during the final flush, which gives up after a few
    // seconds (and saves a recovery file): a slow stop, with one answer.
    let sb = Sandbox::new(account.connection_string()).with_env("BLOBDRIVE_RETRY_TOTAL_SECS", "6");
    sb.blobdrive_ok(&["create", &drive, "--size", "16M"]);
    let mut served = Served::start(&sb, "a", &[&drive], &["--flush-delay", "1h"]);
    let mut c = nbd_support::Client::connect(&served.socket);
    c.go_structured(&drive);
    assert_eq!(c.call(NBD_CMD_WRITE, 0, 0, 4096, &[0x33; 4096]).error, 0);
    drop(c);
    proxy.hang_all(true);
    let socket = served.socket.to_string_lossy().to_string();
    let first = sb
        .command(&["unmount", &socket])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs unmount");
    let start = Instant::now();
    while !served
        .log()
        .contains("stop requested over the control socket")
    {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{}",
            served.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // While it flushes, the server still answers: `stats` says so.
    let stats: serde_json::Value =
        serde_json::from_str(&sb.blobdrive_ok(&["stats", &socket, "--json"])).expect("JSON");
    assert_eq!(stats["state"], "stopping", "{stats}");
    let text = sb.blobdrive_ok(&["stats", &socket]);
    assert!(text.contains("(stopping: final flush)"), "{text}");
    // Its socket stays bound: a new server at the same path is refused in
    // one line (it would otherwise lose its entry and socket to this
    // one's end).
    let nbd = format!("unix:{socket}");
    let other = sb
        .command(&[
            "serve",
            &drive,
            "--read-only",
            "--foreground",
            "--nbd",
            &nbd,
        ])
        .env(
            "AZURE_STORAGE_CONNECTION_STRING",
            common::connection_string(),
        )
        .output()
        .unwrap();
    let why = String::from_utf8_lossy(&other.stderr);
    assert!(!other.status.success(), "{why}");
    assert!(why.contains("another server is listening there"), "{why}");
    // Two more (by the export's name and by the endpoint) wait for the end.
    let later: Vec<_> = [drive.as_str(), nbd.as_str()]
        .iter()
        .map(|target| {
            sb.command(&["unmount", target])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("runs unmount")
        })
        .collect();
    let mut outputs = vec![first.wait_with_output().unwrap()];
    outputs.extend(later.into_iter().map(|c| c.wait_with_output().unwrap()));
    for out in &outputs {
        let e = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{e}");
        assert!(e.contains("blobdrive recover"), "the final result: {e}");
        assert!(
            !e.contains("break-lease"),
            "no advice to break the lease: {e}"
        );
        assert_eq!(e.trim().lines().count(), 1, "one line: {e}");
    }
    assert_eq!(served.wait(Duration::from_secs(30)).code(), Some(1));
    proxy.hang_all(false);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_whose_run_directory_others_may_write_to_is_refused_in_one_line() {
    use std::os::unix::fs::PermissionsExt;
    let g = ContainerGuard::new("nbd-rundir").await;
    let drive = format!("{}/disk.vhd", g.name);
    let sb = sandbox();
    sb.blobdrive_ok(&["create", &drive, "--size", "16M"]);
    // Anyone may write to it, and it is not sticky: not a run directory.
    let shared = sb.dir("shared");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let socket = sb.root.path().join("r.sock");
    let nbd = format!("unix:{}", socket.display());
    for foreground in [false, true] {
        let mut args = vec!["serve", drive.as_str(), "--read-only", "--nbd", &nbd];
        if foreground {
            args.push("--foreground");
        }
        let out = sb
            .command(&args)
            .env("BLOBDRIVE_RUN_DIR", &shared)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "refused: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains("run directory"), "{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_refused_connections_is_logged_once_then_counted_at_exit() {
    let g = ContainerGuard::new("nbd-flood").await;
    let drive = format!("{}/disk.vhd", g.name);
    let sb = sandbox();
    sb.blobdrive_ok(&["create", &drive, "--size", "16M"]);
    let served = Served::start(
        &sb,
        "f",
        &[&drive],
        &["--read-only", "--max-connections", "1"],
    );
    let mut c = nbd_support::Client::connect(&served.socket);
    c.go_structured(&drive);
    for _ in 0..20 {
        let mut s = std::os::unix::net::UnixStream::connect(&served.socket).expect("connects");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(std::io::Read::read(&mut s, &mut buf).unwrap_or(0), 0);
    }
    drop(c);
    let log = served.stderr.clone();
    assert!(served.stop().0.success());
    let text = std::fs::read_to_string(log).unwrap();
    let refused = text
        .lines()
        .filter(|l| l.contains("maximum of connections"))
        .count();
    assert_eq!(refused, 1, "one line for the flood:\n{text}");
    assert!(
        text.contains("19 more NBD refusals like the last one logged"),
        "the rest counted at exit:\n{text}"
    );
}

/// `Max open files` of process `pid`: (soft, hard).
fn open_file_limits(pid: i32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("a Max open files line");
    let mut words = line["Max open files".len()..].split_whitespace();
    (
        words.next().unwrap().to_string(),
        words.next().unwrap().to_string(),
    )
}

fn open_descriptors(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_raises_its_open_file_limit_and_idle_metrics_connections_hold_few_descriptors() {
    let g = ContainerGuard::new("nbd-fds").await;
    let drive = format!("{}/disk.vhd", g.name);
    let sb = sandbox();
    sb.blobdrive_ok(&["create", &drive, "--size", "16M"]);
    // Started as from a shell with the usual soft limit of 1024 (inherited
    // from this process; only lowered, never raised, here).
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct given.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_cur = limit.rlim_cur.min(1024);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
    let served = Served::start(&sb, "m", &[&drive], &["--metrics-listen", "0"]);
    let (soft, hard) = open_file_limits(served.pid());
    assert_eq!(soft, hard, "the server's soft limit is its hard limit");
    let metrics = served.ready["metrics"]
        .as_str()
        .expect("the metrics address")
        .to_string();
    let before = open_descriptors(served.pid());
    // Idle connections (no request): at most 16 are taken at once, the
    // rest wait in the listen backlog without a descriptor of the server's.
    let idle: Vec<_> = (0..100)
        .map(|_| std::net::TcpStream::connect(&metrics).expect("connects"))
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let during = open_descriptors(served.pid());
    assert!(
        during <= before + 16 + 8,
        "{before} descriptors before 100 idle connections, {during} with them"
    );
    // A scrape behind them is answered once they close.
    let scrape = std::thread::spawn(move || {
        let mut http = std::net::TcpStream::connect(&metrics).expect("metrics listener");
        std::io::Write::write_all(&mut http, b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut text = String::new();
        std::io::Read::read_to_string(&mut http, &mut text).unwrap();
        text
    });
    drop(idle);
    let text = scrape.join().unwrap();
    assert!(text.contains(&format!("drive=\"{drive}\"")), "{text}");
    assert!(served.stop().0.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn unmount_never_takes_a_live_server_whose_control_socket_refuses_for_dead() {
    let g = ContainerGuard::new("nbd-live").await;
    let drive = format!("{}/disk.vhd", g.name);
    let sb = sandbox();
    sb.blobdrive_ok(&["create", &drive, "--size", "16M"]);
    let served = Served::start(&sb, "l", &[&drive], &["--flush-delay", "1h"]);
    // Its control socket refuses (as one whose listener is gone would).
    let control = std::fs::read_dir(sb.root.path().join("run"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "sock"))
        .expect("a control socket");
    std::fs::remove_file(&control).unwrap();
    drop(std::os::unix::net::UnixListener::bind(&control).unwrap());
    let out = sb.blobdrive(&["unmount", &drive]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("is running"), "{stderr}");
    assert!(!stderr.contains("break-lease"), "{stderr}");
    assert!(control.exists(), "nothing of the live server is removed");
    assert_eq!(listed_exports(&sb).len(), 1, "still listed");
    // It still serves, and SIGTERM still stops it cleanly.
    let mut c = nbd_support::Client::connect(&served.socket);
    c.go_structured(&drive);
    assert_eq!(c.call(NBD_CMD_WRITE, 0, 0, 4096, &[0x44; 4096]).error, 0);
    drop(c);
    assert!(served.stop().0.success());
    assert_eq!(sdk_read(&g.name, "disk.vhd", 0, 4096), vec![0x44; 4096]);
}

/// A field of `/proc/PID/status` in bytes (`VmHWM`, `VmRSS`: given in kB).
fn proc_status_bytes(pid: i32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("process status");
    let line = status
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}: not a number of kB"));
    kib * 1024
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_pipelined_no_hole_write_zeroes_stays_within_the_memory_bound() {
    // Each WRITE_ZEROES of 1 MiB with NO_HOLE is charged one budget unit, so
    // one connection may have hundreds waiting for the dirty budget at once:
    // what each of them holds while it waits must not grow the server past
    // --cache-size plus 64 MiB. The client keeps WINDOW requests in flight,
    // as qemu does, so requests keep arriving while others complete.
    const FLOOD: u64 = 480;
    const WINDOW: u64 = 200;
    const CACHE: u64 = 64 * MIB;
    let g = ContainerGuard::new("nbd-zeroes").await;
    let drive = format!("{}/disk.vhd", g.name);
    let sb = sandbox();
    sb.blobdrive_ok(&["create", &drive, "--size", "1G"]);
    let served = Served::start(&sb, "z", &[&drive], &["--cache-size", "64M"]);
    let mut c = nbd_support::Client::connect(&served.socket);
    c.go_structured(&drive);
    // A page of data in every MiB the flood zeroes, in the blob, so zeros
    // read back are the flood's, not a new drive's.
    let page = vec![0xA5u8; 4096];
    for i in 0..FLOOD {
        assert_eq!(c.call(NBD_CMD_WRITE, 0, i * MIB, 4096, &page).error, 0);
    }
    assert_eq!(c.call(NBD_CMD_FLUSH, 0, 0, 0, &[]).error, 0);
    let baseline = proc_status_bytes(served.pid(), "VmHWM");
    let mut sent = std::collections::HashSet::new();
    let mut next = 0;
    let zero = |c: &mut nbd_support::Client, i: u64| {
        c.request(
            NBD_CMD_WRITE_ZEROES,
            NBD_CMD_FLAG_NO_HOLE,
            i * MIB,
            MIB as u32,
            &[],
        )
    };
    while next < WINDOW {
        sent.insert(zero(&mut c, next));
        next += 1;
    }
    for _ in 0..FLOOD {
        let (cookie, answer) = c.answer_any();
        assert_eq!(answer.error, 0, "WRITE_ZEROES {cookie} answered");
        assert!(sent.remove(&cookie), "one answer per request ({cookie})");
        if next < FLOOD {
            sent.insert(zero(&mut c, next));
            next += 1;
        }
    }
    let peak = proc_status_bytes(served.pid(), "VmHWM");
    assert!(
        peak <= baseline + CACHE + 64 * MIB,
        "the server's peak RSS {} MiB is over its baseline {} MiB + --cache-size 64 MiB + 64 MiB",
        peak / MIB,
        baseline / MIB
    );
    for i in 0..FLOOD {
        let read = c.call(NBD_CMD_READ, 0, i * MIB, 4096, &[]);
        assert_eq!(read.error, 0);
        assert!(read.data.iter().all(|b| *b == 0), "MiB {i} reads as zeros");
    }
    let whole = c.call(NBD_CMD_READ, 0, 0, (32 * MIB) as u32, &[]);
    assert!(
        whole.data.iter().all(|b| *b == 0),
        "the first 32 MiB read as zeros"
    );
    drop(c);
    let log = served.stderr.clone();
    let (status, _) = served.stop();
    assert!(
        status.success(),
        "{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
    // And the blob has the zeros, once the server stopped.
    let last = sdk_read(&g.name, "disk.vhd", (FLOOD - 1) * MIB, 4096);
    assert!(last.iter().all(|b| *b == 0), "the blob holds the zeros");
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_timeout_frees_the_slot_of_an_idle_client_and_says_so() {
    let g = ContainerGuard::new("nbd-idle").await;
    let drive = format!("{}/disk.vhd", g.name);
    let sb = sandbox();
    sb.blobdrive_ok(&["create", &drive, "--size", "16M"]);
    let served = Served::start(
        &sb,
        "i",
        &[&drive],
        &[
            "--read-only",
            "--max-connections",
            "1",
            "--idle-timeout",
            "1s",
        ],
    );
    let mut idle = nbd_support::Client::connect(&served.socket);
    idle.go_structured(&drive);
    assert_eq!(idle.call(NBD_CMD_READ, 0, 0, 4096, &[]).error, 0);
    assert!(idle.closed_by_server(), "the idle client is disconnected");
    let mut next = nbd_support::Client::connect(&served.socket);
    next.go_structured(&drive);
    assert_eq!(next.call(NBD_CMD_READ, 0, 0, 4096, &[]).error, 0);
    drop(next);
    let log = served.stderr.clone();
    assert!(served.stop().0.success());
    let text = std::fs::read_to_string(log).unwrap();
    assert!(
        text.contains("idle for 1 s (--idle-timeout)"),
        "the log says why:\n{text}"
    );
}

#[test]
fn a_bad_idle_timeout_is_a_usage_error_in_one_line() {
    let sb = sandbox();
    for bad in ["0", "soon", "8d", "169h"] {
        let out = sb.blobdrive(&[
            "serve",
            "c/d.vhd",
            "--nbd",
            "unix:/nonexistent/x.sock",
            "--idle-timeout",
            bad,
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        assert!(
            stderr.starts_with("blobdrive: ")
                && stderr.contains(&format!(
                    "invalid value '{bad}' for '--idle-timeout <DURATION>'"
                ))
                && stderr.contains("at most a week"),
            "{stderr}"
        );
    }
}
