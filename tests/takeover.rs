//! The mount outlives its serving process: an attach's holder keeps the FUSE
//! connection and the write log, and a new serving process takes over when
//! one dies (`kill -9`, the OOM killer) or hangs (the watchdog). The
//! filesystem above sees a pause, never an I/O error, and loses no
//! acknowledged write.
//!
//! Each test runs fio with verification (`--verify=crc32c`, a backlog, and
//! `--verify_fatal`) on a filesystem of an attached drive, on its own host
//! namespace with a dedicated, disk-backed Azurite (see `netns/mod.rs`),
//! then checks that fio's file reads back the same after unmount and attach
//! again (its SHA-256 before and after; not fio's `--verify_only`, which
//! with `--verify_state_load` checks a window of recent writes and reports
//! an older block that a later, overlapping write of another size changed
//! as bad), the filesystem's checker, and the blob read by the official
//! Python SDK compared with the drive as blobdrive reads it.
//!
//! `BLOBDRIVE_TAKEOVER_KILLS` sets the kills per filesystem (default 20),
//! `BLOBDRIVE_TAKEOVER_UPGRADES` the upgrades (default 10),
//! `BLOBDRIVE_TAKEOVER_FIO_MB` the size of fio's file (default 384).

mod netns;
mod system;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use netns::{Host, Storage};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Dirty data that counts as "tens of MiB" at a kill.
const MANY_DIRTY_BYTES: u64 = 16 << 20;
/// A serving process is killed only after it served this long: quicker
/// kills in a row are what the holder's crash-loop breaker stops.
const SERVE_BEFORE_KILL: Duration = Duration::from_millis(2500);

/// fio's random read-write job with verification on `file`, its state
/// files in `aux`.
fn fio(file: &Path, aux: &Path, size_mb: u64, runtime: Duration) -> Command {
    let mut cmd = Command::new("fio");
    cmd.current_dir(aux).args([
        "--name=takeover",
        &format!("--filename={}", file.display()),
        &format!("--size={size_mb}M"),
        "--rw=randrw",
        "--bsrange=4k-1m",
        "--ioengine=libaio",
        "--iodepth=16",
        "--direct=1",
        "--verify=crc32c",
        "--verify_backlog=256",
        "--verify_fatal=1",
        &format!("--aux-path={}", aux.display()),
        "--randseed=4242",
    ]);
    cmd.args(["--time_based", &format!("--runtime={}", runtime.as_secs())]);
    cmd
}

fn start(mut cmd: Command, log: &Path) -> Child {
    let out = std::fs::File::create(log).expect("fio log");
    cmd.stdout(out.try_clone().unwrap())
        .stderr(out)
        .stdin(Stdio::null())
        .spawn()
        .expect("fio runs (scripts/setup.sh installs it)")
}

/// The last lines of the daemon's log, for a failure message.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.contains(" DEBUG ")).collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

/// Waits for `child`; panics with its log (and the daemon's, `daemon_log`)
/// if it fails or outlives `limit`.
fn finish(mut child: Child, log: &Path, daemon_log: &Path, limit: Duration, what: &str) {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait for fio") {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            assert!(
                status.success(),
                "{what}: fio failed ({status}):\n{text}\ndaemon log:\n{}",
                log_tail(daemon_log)
            );
            assert!(
                !text.contains("verify:") && !text.contains("bad magic"),
                "{what}: fio reports a verify error:\n{text}"
            );
            return;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!(
                "{what}: fio did not finish in {limit:?}:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What `stats` says about the attach at `dir`.
#[derive(Debug, Clone, Copy)]
struct Seen {
    pid: i32,
    takeovers: u64,
    dirty: u64,
    flushing: bool,
}

fn seen(host: &Host, dir: &Path, drive: &str) -> Seen {
    let stats = host.stats(dir);
    let device = &stats["devices"][drive];
    Seen {
        pid: stats["pid"].as_i64().expect("pid") as i32,
        takeovers: stats["daemon"]["takeovers"].as_u64().expect("takeovers"),
        dirty: device["dirty_bytes"].as_u64().unwrap_or(0),
        flushing: device["flushing"].as_bool().unwrap_or(false),
    }
}

/// Polls `stats` until `ready` holds (or `limit` passes); returns the last
/// answer.
fn poll_until(
    host: &Host,
    dir: &Path,
    drive: &str,
    limit: Duration,
    mut ready: impl FnMut(&Seen) -> bool,
) -> Option<Seen> {
    let started = Instant::now();
    while started.elapsed() < limit {
        let s = seen(host, dir, drive);
        if ready(&s) {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// The drive file as blobdrive reads it (a read-only namespace mount of its
/// container), for the checker and the comparison with the SDK.
fn drive_image(host: &Host, container: &str, blob: &str) -> (PathBuf, PathBuf) {
    let files = host.mount(container, "files", &["--read-only"]);
    let image = host.view(&files).join(blob);
    (files, image)
}

/// SHA-256 of the first `len` bytes of the page blob, read by the official
/// Python SDK (an independent client) inside the host's namespace.
fn sdk_sha256(host: &Host, storage: &Storage, container: &str, blob: &str, len: u64) -> String {
    let script = r#"
import hashlib, os, sys
from azure.storage.blob import BlobClient
c = BlobClient.from_connection_string(os.environ["CS"], sys.argv[1], sys.argv[2])
n = int(sys.argv[3]); h = hashlib.sha256(); at = 0
while at < n:
    k = min(32 << 20, n - at)
    h.update(c.download_blob(offset=at, length=k).readall()); at += k
print(h.hexdigest())
"#;
    let out = host
        .command(
            "python3",
            &["-c", script, container, blob, &len.to_string()],
        )
        .env("CS", storage.connection_string())
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "the SDK could not read the blob: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn file_sha256(path: &Path, len: u64) -> String {
    use sha2::Digest;
    use std::io::Read;
    let mut f = std::fs::File::open(path).expect("open the drive file");
    let mut h = sha2::Sha256::new();
    let mut left = len;
    let mut buf = vec![0u8; 4 << 20];
    while left > 0 {
        let n = (left as usize).min(buf.len());
        f.read_exact(&mut buf[..n]).expect("read the drive file");
        h.update(&buf[..n]);
        left -= n as u64;
    }
    format!("{:x}", h.finalize())
}

/// What every fio run here ends with: fio's file (`fio_bytes`) reads back
/// the same after a clean unmount and a fresh attach, which reads the blob;
/// the filesystem's checker is clean; and the blob, read by the SDK, is the
/// drive as blobdrive reads it.
fn check_after_fio(
    host: &Host,
    storage: &Storage,
    dir: &Path,
    (container, blob): (&str, &str),
    fs: &str,
    fio_bytes: u64,
) {
    let drive = format!("{container}/{blob}");
    let before = file_sha256(&host.view(dir).join("fio.dat"), fio_bytes);
    host.unmount(dir);
    let dir = host.mount(&drive, "m2", &[]);
    let after = file_sha256(&host.view(&dir).join("fio.dat"), fio_bytes);
    assert_eq!(
        after, before,
        "fio's file changed across unmount and attach"
    );
    host.unmount(&dir);
    let (files, image) = drive_image(host, container, blob);
    system::check_filesystem(&image, fs, "after the takeovers");
    let disk_bytes = std::fs::metadata(&image).expect("the drive file").len();
    assert_eq!(
        sdk_sha256(host, storage, container, blob, disk_bytes),
        file_sha256(&image, disk_bytes),
        "the blob, read by the SDK, differs from the drive as blobdrive reads it"
    );
    host.unmount(&files);
}

fn p50_and_max(mut stalls: Vec<Duration>) -> (Duration, Duration) {
    stalls.sort();
    (stalls[stalls.len() / 2], *stalls.last().unwrap())
}

fn kill_rounds(test: &str, fs: &str) {
    if !netns::can_run(test) {
        return;
    }
    let kills = env_u64("BLOBDRIVE_TAKEOVER_KILLS", 20);
    let size_mb = env_u64("BLOBDRIVE_TAKEOVER_FIO_MB", 384);
    let mut storage = Storage::start_on_disk();
    let host = storage.host(fs);
    let (container, blob) = ("takeover", "t.vhd");
    let drive = format!("{container}/{blob}");
    host.ok(&["create", &drive, "--size", "2G", "--mkfs", fs]);
    let dir = host.mount(&drive, "m", &["--flush-delay", "2s"]);
    let file = host.view(&dir).join("fio.dat");
    let aux = tempfile::tempdir().expect("fio's directory");
    let log = aux.path().join("fio.log");
    // Long enough for every kill; fio ends by itself.
    let runtime = Duration::from_secs(kills * 4 + 20);
    let fio_run = start(fio(&file, aux.path(), size_mb, runtime), &log);

    let mut stalls = Vec::new();
    let (mut with_dirty, mut in_flush) = (0, 0);
    let mut last_ready = Instant::now();
    for k in 0..kills {
        std::thread::sleep(SERVE_BEFORE_KILL.saturating_sub(last_ready.elapsed()));
        // Alternate the moments: with much dirty data, and inside a flush.
        let want_dirty = k % 2 == 0;
        let at = poll_until(&host, &dir, &drive, Duration::from_secs(20), |s| {
            if want_dirty {
                s.dirty >= MANY_DIRTY_BYTES
            } else {
                s.flushing
            }
        })
        .unwrap_or_else(|| seen(&host, &dir, &drive));
        with_dirty += (at.dirty >= MANY_DIRTY_BYTES) as u32;
        in_flush += at.flushing as u32;
        // SAFETY: plain syscall on the serving process of this host's attach.
        unsafe { libc::kill(at.pid, libc::SIGKILL) };
        let killed = Instant::now();
        let after = poll_until(&host, &dir, &drive, Duration::from_secs(60), |s| {
            s.pid != at.pid && s.takeovers == at.takeovers + 1
        })
        .unwrap_or_else(|| {
            panic!(
                "kill {k}: no process took over within a minute; log:\n{}",
                std::fs::read_to_string(host.log_path("m")).unwrap_or_default()
            )
        });
        stalls.push(killed.elapsed());
        last_ready = Instant::now();
        println!(
            "kill {k}: pid {} with {} MiB dirty{}, replaced by {} in {:?}",
            at.pid,
            at.dirty >> 20,
            if at.flushing { ", inside a flush" } else { "" },
            after.pid,
            killed.elapsed()
        );
    }
    finish(
        fio_run,
        &log,
        &host.log_path("m"),
        runtime + Duration::from_secs(300),
        "fio under kill -9",
    );
    let (p50, max) = p50_and_max(stalls);
    println!("{kills} kills: {with_dirty} with >= 16 MiB dirty, {in_flush} inside a flush; takeover p50 {p50:?}, max {max:?}");
    if kills >= 20 {
        assert!(
            with_dirty >= 5,
            "only {with_dirty} kills landed with tens of MiB dirty"
        );
        assert!(in_flush >= 5, "only {in_flush} kills landed inside a flush");
    }
    assert_eq!(seen(&host, &dir, &drive).takeovers, kills);

    // Everything fio wrote (its live verify checked it) reads back the same
    // after a clean unmount and a fresh attach, which reads the blob.
    check_after_fio(&host, &storage, &dir, (container, blob), fs, size_mb << 20);
}

#[test]
fn kill_9_of_the_serving_process_under_fio_loses_nothing_on_ext4() {
    kill_rounds("takeover_kill_ext4", "ext4");
}

#[test]
fn kill_9_of_the_serving_process_under_fio_loses_nothing_on_xfs() {
    kill_rounds("takeover_kill_xfs", "xfs");
}

/// A copy of the blobdrive binary in `dir` whose version tag says
/// `version` and whose state format tag says `format`: another build, as
/// far as an upgrade can tell (see `src/version.rs`).
fn patched_binary(dir: &Path, name: &str, version: &str, format: u64) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let mut bytes = std::fs::read(netns::BIN).expect("read the binary");
    let swaps = [
        (
            blobdrive::version::version_tag(&blobdrive::version::version()),
            blobdrive::version::version_tag(version),
        ),
        (
            blobdrive::version::state_format_tag(blobdrive::version::state_format()),
            blobdrive::version::state_format_tag(format),
        ),
    ];
    for (from, to) in swaps {
        let at = bytes
            .windows(from.len())
            .position(|w| w == from.as_slice())
            .expect("the binary carries its tags");
        bytes[at..at + to.len()].copy_from_slice(&to);
    }
    let path = dir.join(name);
    std::fs::write(&path, &bytes).expect("write the copy");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn upgrades_under_fio_lose_nothing_and_a_binary_of_another_format_is_refused() {
    if !netns::can_run("takeover_upgrade") {
        return;
    }
    let upgrades = env_u64("BLOBDRIVE_TAKEOVER_UPGRADES", 10);
    let size_mb = env_u64("BLOBDRIVE_TAKEOVER_FIO_MB", 384);
    let mut storage = Storage::start_on_disk();
    let host = storage.host("upgrade");
    let (container, blob) = ("upgrade", "u.vhd");
    let drive = format!("{container}/{blob}");
    host.ok(&["create", &drive, "--size", "2G", "--mkfs", "ext4"]);
    let dir = host.mount(&drive, "m", &[]);
    let bins = tempfile::tempdir().expect("a directory for the builds");
    let current = blobdrive::version::version();
    let format = blobdrive::version::state_format();
    let next = patched_binary(bins.path(), "blobdrive-next", "9.9.9-next", format);
    let other_format = patched_binary(bins.path(), "blobdrive-format", "9.9.9-other", format + 1);

    let file = host.view(&dir).join("fio.dat");
    let aux = tempfile::tempdir().expect("fio's directory");
    let log = aux.path().join("fio.log");
    let runtime = Duration::from_secs(upgrades * 3 + 20);
    let fio_run = start(fio(&file, aux.path(), size_mb, runtime), &log);
    std::thread::sleep(Duration::from_secs(3));

    // A build whose state format differs is refused; the daemon serves on.
    let before = seen(&host, &dir, &drive);
    let dir_s = dir.to_string_lossy().to_string();
    let refused = host.blobdrive(&[
        "upgrade",
        &dir_s,
        "--binary",
        &other_format.to_string_lossy(),
    ]);
    let line = String::from_utf8_lossy(&refused.stderr).to_string();
    assert_eq!(refused.status.code(), Some(1), "{line}");
    assert_eq!(line.trim().lines().count(), 1, "{line}");
    assert!(
        line.contains("format") && line.contains("nothing was changed"),
        "{line}"
    );
    assert_eq!(
        seen(&host, &dir, &drive).pid,
        before.pid,
        "a refused upgrade replaced the daemon"
    );

    let mut stalls = Vec::new();
    for i in 0..upgrades {
        let (binary, version) = if i % 2 == 0 {
            (next.clone(), "9.9.9-next".to_string())
        } else {
            (PathBuf::from(netns::BIN), current.clone())
        };
        std::thread::sleep(Duration::from_millis(1500));
        let out = host.ok(&[
            "upgrade",
            &dir_s,
            "--binary",
            &binary.to_string_lossy(),
            "--json",
        ]);
        let report: serde_json::Value = serde_json::from_str(&out).expect("upgrade --json");
        assert_eq!(report["version"], version.as_str(), "{out}");
        let stats = host.stats(&dir);
        assert_eq!(stats["daemon"]["version"], version.as_str());
        stalls.push(Duration::from_secs_f64(report["seconds"].as_f64().unwrap()));
        println!("upgrade {i}: {out}");
    }
    finish(
        fio_run,
        &log,
        &host.log_path("m"),
        runtime + Duration::from_secs(300),
        "fio under upgrades",
    );
    let (p50, max) = p50_and_max(stalls);
    println!("{upgrades} upgrades: handover p50 {p50:?}, max {max:?}");
    assert_eq!(seen(&host, &dir, &drive).takeovers, upgrades);

    check_after_fio(
        &host,
        &storage,
        &dir,
        (container, blob),
        "ext4",
        size_mb << 20,
    );
}

/// Writes `mb` MiB of a pattern to `path` and fsyncs it; returns its SHA-256.
fn write_pattern(path: &Path, mb: usize, seed: u8) -> String {
    use sha2::Digest;
    use std::io::Write;
    let mut f = std::fs::File::create(path).expect("create");
    let mut h = sha2::Sha256::new();
    for i in 0..mb {
        let chunk: Vec<u8> = (0..1 << 20).map(|j| (j as u8) ^ (i as u8) ^ seed).collect();
        f.write_all(&chunk).expect("write");
        h.update(&chunk);
    }
    f.sync_all().expect("fsync");
    format!("{:x}", h.finalize())
}

#[test]
fn a_stopped_serving_process_is_replaced_by_the_watchdog_and_writes_go_on() {
    if !netns::can_run("takeover_watchdog") {
        return;
    }
    let mut storage = Storage::start();
    let host = storage.host("hang");
    let drive = "hang/h.vhd";
    host.ok(&["create", drive, "--size", "256M", "--mkfs", "ext4"]);
    // A short watchdog, so the test does not wait the default 10 s.
    std::env::set_var("BLOBDRIVE_WATCHDOG_SECS", "3");
    let dir = host.mount(drive, "m", &[]);
    std::env::remove_var("BLOBDRIVE_WATCHDOG_SECS");
    let root = host.view(&dir);
    let before = seen(&host, &dir, drive);
    let first = write_pattern(&root.join("a"), 8, 1);
    // SAFETY: plain syscall on the serving process of this host's attach.
    unsafe { libc::kill(before.pid, libc::SIGSTOP) };
    let stopped = Instant::now();
    // Writes issued while it hangs wait, then complete once replaced.
    let writer = {
        let path = root.join("b");
        std::thread::spawn(move || write_pattern(&path, 16, 2))
    };
    let after = poll_until(&host, &dir, drive, Duration::from_secs(30), |s| {
        s.pid != before.pid
    })
    .expect("the watchdog replaced the stopped process within 30 s");
    let replaced = stopped.elapsed();
    let second = writer.join().expect("the writer");
    println!(
        "stopped process {} replaced by {} after {replaced:?}",
        before.pid, after.pid
    );
    assert!(
        replaced < Duration::from_secs(10),
        "the watchdog (3 s) took {replaced:?}"
    );
    assert_eq!(after.takeovers, 1);
    assert!(
        !registry_alive(before.pid),
        "the stopped process {} still exists",
        before.pid
    );
    host.unmount(&dir);
    let dir = host.mount(drive, "m2", &[]);
    let root = host.view(&dir);
    assert_eq!(sha_of(&root.join("a")), first);
    assert_eq!(sha_of(&root.join("b")), second);
    host.unmount(&dir);
}

fn registry_alive(pid: i32) -> bool {
    blobdrive::daemon::registry::process_alive(pid as u32)
}

fn sha_of(path: &Path) -> String {
    use sha2::Digest;
    let data = std::fs::read(path).expect("read back");
    format!("{:x}", sha2::Sha256::digest(&data))
}

#[test]
fn a_crash_loop_ends_the_attach_and_saves_the_logged_writes_to_a_recovery_file() {
    if !netns::can_run("takeover_crash_loop") {
        return;
    }
    crash_loop(false, false);
}

#[test]
fn a_salvage_of_an_encrypted_drive_saves_ciphertext_that_recover_puts_back() {
    if !netns::can_run("takeover_salvage_encrypted") {
        return;
    }
    crash_loop(false, true);
}

#[test]
fn a_salvage_saves_the_logged_writes_without_reaching_storage() {
    if !netns::can_run("takeover_salvage_outage") {
        return;
    }
    crash_loop(true, false);
}

/// Three serving processes killed in a row as soon as each serves, with
/// writes only the log holds; with `outage`, the host's network is down
/// from before the last kill until the attach has ended.
/// With `encrypted`, the drive is encrypted: the salvage seals the log's
/// plaintext with the drive's key.
fn crash_loop(outage: bool, encrypted: bool) {
    let mut storage = Storage::start();
    let host = storage.host("loop");
    let drive = "loop/l.vhd";
    let key = host.root.path().join("key");
    std::fs::write(&key, [0x42u8; 32]).unwrap();
    let key_s = key.to_string_lossy().to_string();
    let keyed: &[&str] = if encrypted {
        &["--encrypt", "--key-file", &key_s]
    } else {
        &[]
    };
    let mut create = vec!["create", drive, "--size", "256M", "--mkfs", "ext4"];
    create.extend(keyed);
    host.ok(&create);
    let key_flags: &[&str] = if encrypted {
        &["--key-file", &key_s]
    } else {
        &[]
    };
    // A long flush delay: what is written stays dirty, in the log only.
    let mut flags = vec!["--flush-delay", "10m"];
    flags.extend(key_flags);
    let dir = host.mount(drive, "m", &flags);
    let holder = host.holder_pid(&dir);
    let root = host.view(&dir);
    // A file whose blocks are in the blob, then overwritten in place with
    // O_DIRECT and no fsync: the new bytes are dirty in the daemon (and in
    // its write log) only, and no metadata changes.
    let file = root.join("unflushed");
    std::fs::write(&file, vec![0x11; 4 << 20]).unwrap();
    std::fs::File::open(&file).unwrap().sync_all().unwrap();
    let overwrite = format!(
        "tr '\\000' '\\132' < /dev/zero | dd of='{}' bs=1M count=4 oflag=direct conv=notrunc iflag=fullblock status=none",
        file.display()
    );
    let status = Command::new("bash")
        .args(["-c", &overwrite])
        .status()
        .unwrap();
    assert!(status.success(), "the O_DIRECT overwrite failed");
    let dirty = seen(&host, &dir, drive).dirty;
    assert!(dirty > 0, "nothing dirty to save");
    // Three serving processes in a row killed as soon as each serves.
    let link = |state: &str| {
        let status = host
            .command("ip", &["link", "set", "eth0", state])
            .status()
            .unwrap();
        assert!(status.success(), "ip link set eth0 {state}");
    };
    for k in 0..3 {
        let s = poll_until(&host, &dir, drive, Duration::from_secs(60), |s| {
            s.takeovers == k
        })
        .expect("a serving process");
        if outage && k == 2 {
            link("down");
        }
        // SAFETY: plain syscall on the serving process of this host's attach.
        unsafe { libc::kill(s.pid, libc::SIGKILL) };
    }
    if outage {
        // The salvage reads the write log alone: with the network still
        // down it saves the file, and the attach ends.
        system::wait_for(
            "the salvage to end the attach without storage",
            Duration::from_secs(120),
            || !registry_alive(holder),
        );
        assert_eq!(
            host.recovery_files().len(),
            1,
            "saved while storage was unreachable"
        );
        link("up");
    }
    system::wait_for(
        "the holder to end the attach",
        Duration::from_secs(if outage { 180 } else { 60 }),
        || !registry_alive(holder),
    );
    let log = std::fs::read_to_string(host.log_path("m")).unwrap_or_default();
    assert!(log.contains("in a row died within"), "{log}");
    let files = host.recovery_files();
    assert_eq!(
        files.len(),
        1,
        "one recovery file for the drive; log:\n{log}"
    );
    // The file holds what was written: `recover` puts it in the blob.
    let out = host.blobdrive(&["unmount", &dir.to_string_lossy()]);
    assert!(
        !out.status.success(),
        "the dead attach's unmount reports it"
    );
    let saved = std::fs::read(&files[0]).unwrap();
    let plain_run = [0x5au8; 4096];
    let holds_plaintext = saved.windows(4096).any(|w| w == plain_run);
    assert_eq!(
        holds_plaintext, !encrypted,
        "the file holds what the blob would: plaintext of a plain drive, ciphertext of an encrypted one"
    );
    host.ok(&["break-lease", drive]);
    let file = files[0].to_string_lossy().to_string();
    host.ok(&["recover", &file]);
    let dir = host.mount(drive, "m2", key_flags);
    let data = std::fs::read(host.view(&dir).join("unflushed")).expect("the file after recover");
    assert!(data.len() == 4 << 20 && data.iter().all(|b| *b == 0x5a));
    host.unmount(&dir);
}

/// A memory cgroup (v1) holding one process, removed on drop.
struct MemoryCgroup {
    path: PathBuf,
}

impl MemoryCgroup {
    fn new(name: &str) -> Option<MemoryCgroup> {
        let root = Path::new("/sys/fs/cgroup/memory");
        if !root.join("memory.limit_in_bytes").exists() {
            return None;
        }
        let path = root.join(name);
        std::fs::create_dir(&path).ok()?;
        Some(MemoryCgroup { path })
    }

    fn add(&self, pid: i32) {
        std::fs::write(self.path.join("cgroup.procs"), pid.to_string()).expect("move the process");
    }

    fn limit(&self, bytes: u64) {
        std::fs::write(self.path.join("memory.limit_in_bytes"), bytes.to_string())
            .expect("set the limit");
    }

    fn usage(&self) -> u64 {
        std::fs::read_to_string(self.path.join("memory.usage_in_bytes"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.path).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn the_oom_killer_taking_the_serving_process_costs_a_pause_not_the_drive() {
    if !netns::can_run("takeover_oom") {
        return;
    }
    let Some(group) = MemoryCgroup::new(&format!("blobdrive-oom-{}", std::process::id())) else {
        println!("SKIPPED: takeover_oom: no memory cgroup (v1) here");
        return;
    };
    let mut storage = Storage::start();
    let host = storage.host("oom");
    let drive = "oom/o.vhd";
    host.ok(&["create", drive, "--size", "1G", "--mkfs", "ext4"]);
    let dir = host.mount(drive, "m", &["--cache-size", "512M"]);
    let root = host.view(&dir);
    let written = write_pattern(&root.join("big"), 400, 7);
    // A fresh attach: the daemon's cache is cold, reading fills it.
    host.unmount(&dir);
    let dir = host.mount(drive, "m2", &["--cache-size", "512M"]);
    let root = host.view(&dir);
    let before = seen(&host, &dir, drive);
    group.add(before.pid);
    // Room for what it holds now and a little more: reading 400 MiB through
    // a 512 MiB cache pushes it over.
    group.limit(group.usage() + (64 << 20));
    // Reads through the page cache of the host are dropped first, so every
    // byte goes through the daemon.
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
    let read = sha_of(&root.join("big"));
    assert_eq!(read, written, "the file read across the OOM kill differs");
    let after = poll_until(&host, &dir, drive, Duration::from_secs(30), |s| {
        s.takeovers >= 1
    })
    .unwrap_or_else(|| {
        panic!(
            "the serving process was not OOM-killed and replaced; log:\n{}",
            std::fs::read_to_string(host.log_path("m2")).unwrap_or_default()
        )
    });
    assert_ne!(after.pid, before.pid);
    let log = std::fs::read_to_string(host.log_path("m2")).unwrap_or_default();
    assert!(log.contains("killed by signal 9"), "{log}");
    host.unmount(&dir);
}

/// systemd's side of what the unit template uses, for a daemon started by
/// the test: a notify socket that counts `READY=1`, keeps the descriptors
/// of `FDSTORE=1` by their `FDNAME`, closes them at `FDSTOREREMOVE=1`, and
/// starts the daemon with the kept ones (`LISTEN_FDS`, from descriptor 3),
/// as `Restart=` does. (The machines this suite runs on have no systemd.)
struct ServiceManager {
    socket: std::os::unix::net::UnixDatagram,
    path: PathBuf,
    store: Vec<(String, std::os::fd::OwnedFd)>,
    ready: usize,
}

impl ServiceManager {
    fn new(dir: &Path) -> Self {
        let path = dir.join("notify.sock");
        let socket = std::os::unix::net::UnixDatagram::bind(&path).expect("bind the notify socket");
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        ServiceManager {
            socket,
            path,
            store: Vec::new(),
            ready: 0,
        }
    }

    /// Handles the messages that arrived, for up to `limit`, until `done`.
    fn pump(&mut self, limit: Duration, done: impl Fn(&Self) -> bool) -> bool {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let started = Instant::now();
        while !done(self) {
            if started.elapsed() > limit {
                return false;
            }
            let mut buf = [0u8; 4096];
            let mut control = [0u64; 32];
            let mut iov = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            // SAFETY: a zeroed msghdr pointing at live buffers, for one call.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = std::mem::size_of_val(&control);
            // SAFETY: as above; the socket is open.
            let n =
                unsafe { libc::recvmsg(self.socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
            if n < 0 {
                continue; // the read timeout
            }
            let mut fds = Vec::new();
            // SAFETY: walking the control messages the kernel wrote.
            unsafe {
                let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
                while !cmsg.is_null() {
                    if (*cmsg).cmsg_level == libc::SOL_SOCKET
                        && (*cmsg).cmsg_type == libc::SCM_RIGHTS
                    {
                        let data = libc::CMSG_DATA(cmsg).cast::<libc::c_int>();
                        let count = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                            / std::mem::size_of::<libc::c_int>();
                        for i in 0..count {
                            fds.push(OwnedFd::from_raw_fd(*data.add(i)));
                        }
                    }
                    cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
                }
            }
            let text = String::from_utf8_lossy(&buf[..n as usize]).to_string();
            let lines: Vec<&str> = text.lines().collect();
            let name = lines
                .iter()
                .find_map(|l| l.strip_prefix("FDNAME="))
                .unwrap_or("stored")
                .to_string();
            if lines.contains(&"READY=1") {
                self.ready += 1;
            }
            if lines.contains(&"FDSTORE=1") {
                for fd in fds {
                    self.store.push((name.clone(), fd));
                }
            } else if lines.contains(&"FDSTOREREMOVE=1") {
                self.store.retain(|(n, _)| *n != name);
            }
        }
        true
    }

    fn names(&self) -> Vec<&str> {
        self.store.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// `blobdrive mount --foreground DRIVE DIR` as the unit's ExecStart,
    /// with the store's descriptors passed.
    fn start(&self, host: &Host, drive: &str, dir: &Path, log: &Path) -> Child {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        // Out of the way of 3.. first, where the child wants them.
        let high: Vec<i32> = self
            .store
            .iter()
            // SAFETY: duplicating a descriptor we own.
            .map(|(_, fd)| unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 100) })
            .collect();
        let (dir_s, log_s) = (dir.to_string_lossy(), log.to_string_lossy());
        // LISTEN_PID names the daemon: sh execs nsenter's program in place.
        let mut cmd = host.command(
            "sh",
            &[
                "-c",
                "LISTEN_PID=$$ exec \"$@\"",
                "sh",
                netns::BIN,
                "mount",
                "--foreground",
                drive,
                &dir_s,
                "--log-file",
                &log_s,
                "-v",
            ],
        );
        cmd.env("NOTIFY_SOCKET", &self.path).env("FDSTORE", "3");
        if !high.is_empty() {
            cmd.env("LISTEN_FDS", high.len().to_string())
                .env("LISTEN_FDNAMES", self.names().join(":"));
            let moves = high.clone();
            // SAFETY: dup2 only, between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    for (i, fd) in moves.iter().enumerate() {
                        if libc::dup2(*fd, 3 + i as i32) < 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                    Ok(())
                });
            }
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the daemon");
        for fd in high {
            // SAFETY: the duplicates made above, ours to close.
            unsafe { libc::close(fd) };
        }
        child
    }
}

#[test]
fn a_holder_killed_under_systemd_is_replaced_from_the_fd_store_and_loses_nothing() {
    if !netns::can_run("takeover_fd_store") {
        return;
    }
    let mut storage = Storage::start();
    let host = storage.host("fdstore");
    let drive = "fdstore/s.vhd";
    host.ok(&["create", drive, "--size", "256M", "--mkfs", "ext4"]);
    let mut systemd = ServiceManager::new(host.root.path());
    let dir = host.dir("m");
    let log = host.log_path("m");
    let mut first = systemd.start(&host, drive, &dir, &log);
    let all = |s: &ServiceManager| {
        let names = s.names();
        s.ready >= 1
            && ["blobdrive-fuse", "blobdrive-state", "blobdrive-log"]
                .iter()
                .all(|n| names.contains(n))
    };
    assert!(
        systemd.pump(Duration::from_secs(60), all),
        "READY=1 and the three descriptors in the store; got {:?}, ready {}\nlog:\n{}",
        systemd.names(),
        systemd.ready,
        log_tail(&log)
    );
    let stats = host.stats(&dir);
    assert_eq!(
        stats["daemon"]["holder_pid"].as_i64(),
        Some(first.id() as i64),
        "the unit's main process holds the attach"
    );
    let server = stats["pid"].as_i64().unwrap() as i32;
    let root = host.view(&dir);
    let synced = write_pattern(&root.join("a"), 8, 1);
    // Written through to the daemon (O_DIRECT) and not flushed: only the
    // write log has it when the holder dies.
    let out = Command::new("dd")
        .args([
            "if=/dev/urandom",
            &format!("of={}", root.join("b").display()),
            "bs=1M",
            "count=16",
            "oflag=direct",
            "status=none",
        ])
        .output()
        .expect("dd");
    assert!(out.status.success(), "dd: {:?}", out);
    let unsynced = sha_of(&root.join("b"));
    let dirty = seen(&host, &dir, drive).dirty;
    println!("dirty at the holder's kill: {dirty} bytes");

    // SAFETY: plain syscall on the daemon this test started.
    unsafe { libc::kill(first.id() as i32, libc::SIGKILL) };
    first.wait().expect("reap the killed holder");
    let started = Instant::now();
    while registry_alive(server) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the serving process {server} outlived its holder"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    systemd.pump(Duration::from_millis(300), |_| false);
    assert_eq!(
        systemd.names().len(),
        3,
        "the store keeps the attach after the holder's death"
    );

    // Restart=on-failure: the unit starts again with the store.
    let mut second = systemd.start(&host, drive, &dir, &log);
    // `stats` says the attach is gone until the new holder registers it.
    let started = Instant::now();
    let stats = loop {
        let out = host.blobdrive(&["stats", &dir.to_string_lossy(), "--json"]);
        if out.status.success() {
            let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            if stats["pid"].as_i64() != Some(server as i64) {
                break stats;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no takeover from the store\nlog:\n{}",
            log_tail(&log)
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    println!("taken over after {:?}", started.elapsed());
    assert!(stats["daemon"]["takeovers"].as_u64() >= Some(1), "{stats}");
    assert_eq!(
        stats["daemon"]["holder_pid"].as_i64(),
        Some(second.id() as i64)
    );
    assert_eq!(sha_of(&root.join("a")), synced);
    assert_eq!(
        sha_of(&root.join("b")),
        unsynced,
        "the unflushed write survived"
    );

    host.unmount(&dir);
    let status = second.wait().expect("the second daemon ends");
    assert!(status.success(), "{status}\nlog:\n{}", log_tail(&log));
    assert!(
        systemd.pump(Duration::from_secs(10), |s| s.store.is_empty()),
        "a clean stop empties the store: {:?}",
        systemd.names()
    );
    let dir = host.mount(drive, "m2", &[]);
    let root = host.view(&dir);
    assert_eq!(sha_of(&root.join("a")), synced);
    assert_eq!(sha_of(&root.join("b")), unsynced);
    host.unmount(&dir);
}

/// SIGHUP to the holder unmounts the attach cleanly, as SIGTERM does; a
/// SIGTERM the holder passed to a serving process that died before acting
/// on it reaches the process that takes over, which unmounts.
#[test]
fn a_stop_signal_reaches_the_serving_process_and_its_successor() {
    if !netns::can_run("takeover_stop_signals") {
        return;
    }
    let mut storage = Storage::start();
    let host = storage.host("stop");
    let drive = "stop/s.vhd";
    host.ok(&["create", drive, "--size", "64M", "--mkfs", "ext4"]);
    let signal = |pid: i32, sig: i32| {
        // SAFETY: plain syscall on a process of this host's attach.
        unsafe { libc::kill(pid, sig) };
    };

    let dir = host.mount(drive, "hup", &[]);
    let holder = host.holder_pid(&dir);
    std::fs::write(host.view(&dir).join("kept"), b"written before the stop").unwrap();
    signal(holder, libc::SIGHUP);
    system::wait_for("SIGHUP to end the attach", Duration::from_secs(60), || {
        !registry_alive(holder)
    });
    let log = std::fs::read_to_string(host.log_path("hup")).unwrap_or_default();
    assert!(log.contains("SIGHUP: unmounting"), "{log}");
    assert!(host.recovery_files().is_empty(), "a clean unmount: {log}");

    let dir = host.mount(drive, "term", &[]);
    let holder = host.holder_pid(&dir);
    let serving = seen(&host, &dir, drive).pid;
    // Stopped, the serving process cannot act on the SIGTERM the holder
    // passes it; it dies with the signal pending.
    signal(serving, libc::SIGSTOP);
    signal(holder, libc::SIGTERM);
    std::thread::sleep(Duration::from_secs(1));
    signal(serving, libc::SIGKILL);
    system::wait_for(
        "the successor to act on the SIGTERM",
        Duration::from_secs(120),
        || !registry_alive(holder),
    );
    let log = std::fs::read_to_string(host.log_path("term")).unwrap_or_default();
    assert!(
        log.contains("taking over") && log.contains("SIGTERM: unmounting"),
        "{log}"
    );
    assert!(host.recovery_files().is_empty(), "a clean unmount: {log}");
    let dir = host.mount(drive, "check", &[]);
    assert_eq!(
        std::fs::read(host.view(&dir).join("kept")).unwrap(),
        b"written before the stop"
    );
    host.unmount(&dir);
}
