//! End-to-end tests of the namespace mount (`blobdrive mount [C] DIR`) through
//! the real binary against the real emulator: loop devices with direct I/O, ext4,
//! fstrim, the mount lock between two mounts, snapshots, a 5,000-blob listing,
//! flushing on unmount and on SIGTERM, stats, read-only mounts and the errors a
//! user meets. Byte checks go through an independent client (the Python SDK) or
//! the raw REST client, never through the code under test alone.
//!
//! Tests that need FUSE or loop devices print `SKIPPED: ...` where those are
//! missing (a failure under `BLOBDRIVE_REQUIRE_FUSE=1`).

mod common;
mod mount_support;
mod system;

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use blobdrive::blob::{Account, BlobClient, BlobPath, LeaseState};
use blobdrive::units::ByteRange;
use blobdrive::vhd::Footer;
use common::{make_drive, ContainerGuard};
use futures::stream::{self, StreamExt};
use mount_support::*;
use rand::RngCore;
use sha2::{Digest, Sha256};

const MIB: u64 = 1024 * 1024;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("tokio runtime")
}

/// Bytes the blob actually stores (sum of its page ranges, footer included).
async fn stored_bytes(client: &BlobClient, path: &BlobPath) -> u64 {
    client
        .get_page_ranges(path, None)
        .await
        .expect("get page ranges")
        .ranges
        .iter()
        .map(|r| r.len())
        .sum()
}

fn random_bytes(len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    rand::rng().fill_bytes(&mut buf);
    buf
}

fn hex_sha256(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// SHA-256 of a whole file, read in 1 MiB pieces.
fn file_sha256(path: &Path) -> String {
    let mut file =
        std::fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; MIB as usize];
    loop {
        let n = file.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// SHA-256 of bytes `0..len` of a blob, read by the Azure Python SDK.
fn python_blob_sha256(account: &Account, container: &str, blob: &str, len: u64) -> String {
    let script = r#"
import hashlib, os, sys
from azure.storage.blob import BlobServiceClient
svc = BlobServiceClient.from_connection_string(os.environ["CS"])
blob = svc.get_blob_client(sys.argv[1], sys.argv[2])
length = int(sys.argv[3])
h = hashlib.sha256()
step = 8 << 20
for off in range(0, length, step):
    n = min(step, length - off)
    data = blob.download_blob(offset=off, length=n).readall()
    assert len(data) == n, (off, n, len(data))
    h.update(data)
print(h.hexdigest())
"#;
    common::python_with(
        &account.connection_string(),
        script,
        &[container, blob, &len.to_string()],
    )
}

/// Wall-clock time of each step of a test, for the TIMING lines.
struct Steps {
    start: Instant,
    last: Instant,
    done: Vec<(&'static str, Duration)>,
}

impl Steps {
    fn new() -> Steps {
        let now = Instant::now();
        Steps {
            start: now,
            last: now,
            done: Vec::new(),
        }
    }

    fn done(&mut self, step: &'static str) {
        let now = Instant::now();
        self.done.push((step, now - self.last));
        self.last = now;
    }

    fn report(&self) -> String {
        let steps: Vec<String> = self
            .done
            .iter()
            .map(|(name, d)| format!("{name} {d:.2?}"))
            .collect();
        format!("{:.2?} total ({})", self.start.elapsed(), steps.join(", "))
    }
}

fn errno_of(err: &std::io::Error) -> i32 {
    err.raw_os_error()
        .unwrap_or_else(|| panic!("no errno in {err}"))
}

fn stderr_line(out: &std::process::Output) -> String {
    let text = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(
        text.lines().count(),
        1,
        "expected exactly one line on stderr, got: {text:?}"
    );
    text
}

/// Writes files of random content (three of 3 MiB, twenty small ones, one in a
/// subdirectory) under `root`; returns their checksums by relative name.
fn write_random_files(root: &Path) -> BTreeMap<String, String> {
    let mut sums = BTreeMap::new();
    std::fs::create_dir_all(root.join("nested/deeper")).expect("mkdir");
    let mut files: Vec<(String, usize)> =
        (0..3).map(|i| (format!("big{i}.bin"), 3 << 20)).collect();
    files.extend((0..20).map(|i| (format!("small{i}.txt"), 1 + i * 397)));
    files.push(("nested/deeper/leaf.bin".into(), 777_777));
    for (name, len) in files {
        let data = random_bytes(len);
        let mut f = std::fs::File::create(root.join(&name)).expect("create file");
        f.write_all(&data).expect("write file");
        f.sync_all().expect("fsync file");
        sums.insert(name, hex_sha256(&data));
    }
    sums
}

fn check_files(root: &Path, sums: &BTreeMap<String, String>) {
    for (name, sum) in sums {
        assert_eq!(&file_sha256(&root.join(name)), sum, "{name} changed");
    }
}

#[test]
fn ext4_on_a_drive_file_survives_unmount_and_remount_byte_for_byte() {
    if !can_run(
        "ext4_on_a_drive_file_survives_unmount_and_remount_byte_for_byte",
        true,
    ) {
        return;
    }
    let rt = runtime();
    let guard = rt.block_on(ContainerGuard::new("e2e-ext4"));
    let size = 64 * MIB;
    let path = guard.path("disks/d.vhd");
    rt.block_on(make_drive(&guard.client, &path, size));
    let sandbox = Sandbox::new(common::connection_string());

    let mut steps = Steps::new();
    let mount = sandbox.mount("account", None, &[]);
    steps.done("mount");
    let file = mount.path(&format!("{}/disks/d.vhd", guard.name));
    assert_eq!(std::fs::metadata(&file).expect("stat drive").len(), size);
    let lo = LoopDevice::attach_direct_io(&file);
    steps.done("losetup");
    run("mkfs.ext4", &["-q", "-F", &lo.device]);
    steps.done("mkfs.ext4");
    let ext = BlockMount::mount(&lo.device, &sandbox.dir("ext4"));
    steps.done("mount ext4");
    let sums = write_random_files(&ext.dir);
    run("sync", &[]);
    steps.done("write+fsync files");
    ext.unmount();
    steps.done("umount ext4");
    lo.detach();
    steps.done("losetup -d");
    mount.unmount();
    steps.done("blobdrive unmount");
    println!(
        "TIMING ext4 round trip ({} files, about 10 MiB): {}",
        sums.len(),
        steps.report()
    );

    // The blob, read by an independent client, is the disk image, and its
    // footer is still a valid fixed VHD footer.
    let by_sdk = python_blob_sha256(&common::account(), &guard.name, "disks/d.vhd", size);
    let footer = rt
        .block_on(
            guard
                .client
                .get_blob_range(&path, ByteRange::new(size, size + 512)),
        )
        .expect("read footer");
    let footer: [u8; 512] = footer.as_ref().try_into().expect("512-byte footer");
    Footer::parse(&footer, size + 512).expect("footer still valid");

    let snapshot = rt.block_on(guard.client.snapshot(&path)).expect("snapshot");

    // A fresh mount (this time of the container alone) shows the same bytes and
    // the same files; so does the snapshot, loop-mounted read-only.
    let mut steps = Steps::new();
    let mount = sandbox.mount("container", Some(&guard.name), &[]);
    steps.done("mount");
    let snap_lo = LoopDevice::attach_read_only(&mount.path(&format!("disks/d.vhd@{snapshot}")));
    let snap_ext = BlockMount::mount_with(&snap_lo.device, &sandbox.dir("snap"), "ro,noload");
    check_files(&snap_ext.dir, &sums);
    snap_ext.unmount();
    snap_lo.detach();
    steps.done("snapshot: losetup -r, mount ro, verify");
    let file = mount.path("disks/d.vhd");
    assert_eq!(
        file_sha256(&file),
        by_sdk,
        "drive file differs from the blob"
    );
    steps.done("read 64 MiB drive file");
    let lo = LoopDevice::attach_direct_io(&file);
    let ext = BlockMount::mount(&lo.device, &sandbox.dir("ext4-again"));
    steps.done("losetup+mount ext4");
    check_files(&ext.dir, &sums);
    steps.done("verify files");
    ext.unmount();
    lo.detach();
    mount.unmount();
    steps.done("unmount all");
    println!("TIMING remount and verify: {}", steps.report());
}

#[test]
fn fstrim_after_deleting_files_lowers_the_stored_bytes() {
    if !can_run("fstrim_after_deleting_files_lowers_the_stored_bytes", true) {
        return;
    }
    let rt = runtime();
    let guard = rt.block_on(ContainerGuard::new("e2e-trim"));
    let size = 64 * MIB;
    let path = guard.path("t.vhd");
    rt.block_on(make_drive(&guard.client, &path, size));
    let sandbox = Sandbox::new(common::connection_string());
    let mount = sandbox.mount("ns", Some(&guard.name), &[]);
    let lo = LoopDevice::attach_direct_io(&mount.path("t.vhd"));
    run("mkfs.ext4", &["-q", "-F", &lo.device]);
    let ext = BlockMount::mount(&lo.device, &sandbox.dir("ext4"));
    for i in 0..4 {
        std::fs::write(ext.path(&format!("f{i}")), random_bytes(4 << 20)).expect("write");
    }
    run("sync", &[]);
    let full = rt.block_on(stored_bytes(&guard.client, &path));
    assert!(
        full > 16 * MIB,
        "16 MiB written but only {full} bytes stored"
    );

    for i in 0..4 {
        std::fs::remove_file(ext.path(&format!("f{i}"))).expect("rm");
    }
    run("sync", &[]);
    let trimmed = run("fstrim", &["-v", &ext.dir.to_string_lossy()]);
    println!("{trimmed}");
    let start = Instant::now();
    let mut now = full;
    while start.elapsed() < Duration::from_secs(20) {
        now = rt.block_on(stored_bytes(&guard.client, &path));
        if now + 12 * MIB < full {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    println!(
        "stored bytes: {full} after writing, {now} {:.2?} after fstrim",
        start.elapsed()
    );
    assert!(
        now + 12 * MIB < full,
        "fstrim did not free the deleted files' pages: {full} -> {now}"
    );
    ext.unmount();
    lo.detach();
    mount.unmount();
}

#[test]
fn second_mount_cannot_write_a_held_drive_but_reads_its_snapshot() {
    if !can_run(
        "second_mount_cannot_write_a_held_drive_but_reads_its_snapshot",
        false,
    ) {
        return;
    }
    let rt = runtime();
    let guard = rt.block_on(ContainerGuard::new("e2e-lock"));
    let size = 8 * MIB;
    let path = guard.path("d.vhd");
    rt.block_on(make_drive(&guard.client, &path, size));
    let old = random_bytes(MIB as usize);
    rt.block_on(guard.client.put_pages(&path, 0, old.clone().into(), None))
        .expect("write old content");
    let snapshot = rt.block_on(guard.client.snapshot(&path)).expect("snapshot");

    let sandbox = Sandbox::new(common::connection_string());
    let first = sandbox.mount("first", None, &[]);
    let second = sandbox.mount("second", None, &[]);
    let drive_in = |m: &DaemonMount| m.path(&format!("{}/d.vhd", guard.name));

    let new = random_bytes(MIB as usize);
    let writer = OpenOptions::new()
        .read(true)
        .write(true)
        .open(drive_in(&first))
        .expect("first mount opens the drive for writing");
    writer.write_all_at(&new, 0).expect("write");
    writer.sync_all().expect("fsync");

    let err = OpenOptions::new()
        .write(true)
        .open(drive_in(&second))
        .expect_err("a second writer must be refused while the lease is held");
    assert_eq!(errno_of(&err), libc::EBUSY, "second writer: {err}");

    // Readers need no lease: the live drive shows the durable new content, the
    // snapshot the old one.
    let mut live = vec![0u8; MIB as usize];
    std::fs::File::open(drive_in(&second))
        .expect("read-only open while leased")
        .read_exact_at(&mut live, 0)
        .expect("read live drive");
    assert!(live == new, "a reader sees the fsynced content");
    let snap_name = format!("d.vhd@{snapshot}");
    let container_dir = second.path(&guard.name);
    let listed: Vec<String> = std::fs::read_dir(&container_dir)
        .expect("list container")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(listed.contains(&snap_name), "{snap_name} not in {listed:?}");
    let snap_file = container_dir.join(&snap_name);
    assert_eq!(std::fs::metadata(&snap_file).expect("stat").len(), size);
    let mut snap = vec![0u8; MIB as usize];
    std::fs::File::open(&snap_file)
        .expect("open snapshot")
        .read_exact_at(&mut snap, 0)
        .expect("read snapshot");
    assert!(snap == old, "the snapshot shows the old content");
    let err = OpenOptions::new()
        .write(true)
        .open(&snap_file)
        .expect_err("snapshots are read-only");
    assert_eq!(errno_of(&err), libc::EROFS, "snapshot write: {err}");

    // Once the first mount lets go, the second may write. close(2) returns
    // before FUSE's release reaches the daemon, which then lets the lease go.
    drop(writer);
    wait_for("the first mount's release", Duration::from_secs(10), || {
        rt.block_on(guard.client.get_properties(&path))
            .is_ok_and(|p| p.lease_state == Some(LeaseState::Available))
    });
    let again = OpenOptions::new()
        .write(true)
        .open(drive_in(&second))
        .expect("writable open after the first writer closed");
    drop(again);
    second.unmount();
    first.unmount();
    let props = rt
        .block_on(guard.client.get_properties(&path))
        .expect("props");
    assert_eq!(
        props.lease_state,
        Some(LeaseState::Available),
        "lease released"
    );
}

#[test]
fn listing_a_container_of_5000_blobs_shows_every_name_once() {
    if !can_run(
        "listing_a_container_of_5000_blobs_shows_every_name_once",
        false,
    ) {
        return;
    }
    const COUNT: usize = 5000;
    let rt = runtime();
    let guard = rt.block_on(ContainerGuard::new("e2e-list"));
    let start = Instant::now();
    let mut names: Vec<String> = (0..COUNT).map(|i| format!("blob-{i:05}.txt")).collect();
    names.extend(["sub/a", "sub/b", "sub/c"].map(String::from));
    rt.block_on(async {
        let results: Vec<_> = stream::iter(names.iter())
            .map(|name| {
                let client = guard.client.clone();
                let path = guard.path(name);
                async move { client.put_block_blob(&path, "x".into()).await }
            })
            .buffer_unordered(32)
            .collect()
            .await;
        for r in results {
            r.expect("put block blob");
        }
    });
    println!("setup: {} blobs in {:.2?}", names.len(), start.elapsed());

    let sandbox = Sandbox::new(common::connection_string());
    let mount = sandbox.mount("ns", Some(&guard.name), &[]);
    let start = Instant::now();
    let mut listed: Vec<String> = std::fs::read_dir(&mount.dir)
        .expect("list the container")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    let first_listing = start.elapsed();
    listed.sort();
    let mut expected: Vec<String> = names[..COUNT].to_vec();
    expected.push("sub".into());
    expected.sort();
    assert_eq!(listed.len(), expected.len(), "entries (duplicates?)");
    assert!(listed == expected, "listing differs from the blobs created");
    let mut sub: Vec<String> = std::fs::read_dir(mount.path("sub"))
        .expect("list sub")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    sub.sort();
    assert_eq!(sub, ["a", "b", "c"]);
    let last = std::fs::metadata(mount.path("blob-04999.txt")).expect("stat last blob");
    assert_eq!(last.len(), 1);
    let start = Instant::now();
    let again = std::fs::read_dir(&mount.dir).expect("list again").count();
    assert_eq!(again, expected.len());
    println!(
        "TIMING listing of {} entries: {first_listing:.2?} first, {:.2?} cached",
        expected.len(),
        start.elapsed()
    );
    mount.unmount();
}

async fn blob_bytes(client: &BlobClient, path: &BlobPath, offset: u64, len: usize) -> Vec<u8> {
    client
        .get_blob_range(path, ByteRange::new(offset, offset + len as u64))
        .await
        .expect("read blob")
        .to_vec()
}

#[test]
fn unmount_right_after_writes_leaves_them_in_the_blob() {
    if !can_run("unmount_right_after_writes_leaves_them_in_the_blob", false) {
        return;
    }
    let rt = runtime();
    let guard = rt.block_on(ContainerGuard::new("e2e-unmount"));
    let path = guard.path("d.vhd");
    rt.block_on(make_drive(&guard.client, &path, 16 * MIB));
    let sandbox = Sandbox::new(common::connection_string());
    let mount = sandbox.mount("ns", Some(&guard.name), &[]);

    // Writes still dirty (the flush delay is 1 s) when unmount is asked while
    // the file is open: unmount refuses (busy) but flushes first.
    let big = random_bytes(3 * MIB as usize);
    let small = random_bytes(1000);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(mount.path("d.vhd"))
        .expect("open drive");
    file.write_all_at(&big, MIB).expect("write big");
    file.write_all_at(&small, 12_345).expect("write unaligned");
    let out = mount.try_unmount();
    assert!(!out.status.success(), "unmount of a busy mount must fail");
    let line = stderr_line(&out);
    assert!(line.contains("busy"), "unclear refusal: {line}");
    assert!(
        is_mounted(&mount.dir),
        "a refused unmount leaves the mount up"
    );
    assert!(rt.block_on(blob_bytes(&guard.client, &path, MIB, big.len())) == big);
    assert!(rt.block_on(blob_bytes(&guard.client, &path, 12_345, small.len())) == small);

    // Write, close, unmount at once: everything is in the blob.
    let more = random_bytes(2 * MIB as usize + 4096);
    file.write_all_at(&more, 8 * MIB + 512).expect("write more");
    drop(file);
    mount.unmount();
    assert!(rt.block_on(blob_bytes(&guard.client, &path, 8 * MIB + 512, more.len())) == more);
    let props = rt
        .block_on(guard.client.get_properties(&path))
        .expect("props");
    assert_eq!(
        props.lease_state,
        Some(LeaseState::Available),
        "lease released"
    );
}

/// The peak resident memory of process `pid` (`VmHWM`), in bytes.
fn peak_rss(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("daemon status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kib * 1024
}

/// Writing 2 GiB through a mount with `--cache-size 64M`: the drive's cache
/// never holds more than 64 MiB, and the daemon's peak memory stays within
/// the cache plus 64 MiB (the binary, buffers, the runtime), every byte in
/// the blob at the end.
#[test]
fn writing_2_gib_with_a_64_mib_cache_stays_within_the_bound() {
    if !can_run(
        "writing_2_gib_with_a_64_mib_cache_stays_within_the_bound",
        false,
    ) {
        return;
    }
    let rt = runtime();
    // 2 GiB in an emulator of its own, not in the one every test shares.
    let azurite = common::private_azurite::PrivateAzurite::start();
    let account = common::private_azurite::account_or_shared(&azurite);
    let guard = rt.block_on(ContainerGuard::new_in(&account, "e2e-memory"));
    let path = guard.path("big.vhd");
    let total = 2048 * MIB;
    rt.block_on(make_drive(&guard.client, &path, total));
    let sandbox = Sandbox::new(account.connection_string());
    let mount = sandbox.mount("ns", Some(&guard.name), &["--cache-size", "64M"]);
    let file = OpenOptions::new()
        .write(true)
        .open(mount.path("big.vhd"))
        .expect("open drive");
    // 4 MiB of random bytes, each MiB written with a different first byte so
    // no two MiB of the drive are alike.
    let mut block = random_bytes(4 * MIB as usize);
    let mut hasher = Sha256::new();
    let mut max_cache = 0;
    for i in 0..total / (4 * MIB) {
        for mib in 0..4 {
            block[(mib * MIB) as usize] = (i * 4 + mib) as u8;
        }
        file.write_all_at(&block, i * 4 * MIB).expect("write");
        hasher.update(&block);
        if i % 16 == 0 {
            let stats = sandbox.stats(&mount.dir);
            let cache = stats["devices"][format!("{}/big.vhd", guard.name)]["cache_bytes"]
                .as_u64()
                .expect("stats show the drive's cache bytes");
            max_cache = max_cache.max(cache);
        }
    }
    file.sync_all().expect("fsync");
    let peak = peak_rss(mount.pid);
    drop(file);
    mount.unmount();
    println!(
        "2 GiB written: cache at most {} MiB, daemon peak RSS {} MiB",
        max_cache / MIB,
        peak / MIB
    );
    assert!(max_cache <= 64 * MIB, "cache held {max_cache} bytes");
    assert!(
        peak <= 128 * MIB,
        "daemon peak RSS {} MiB with a 64 MiB cache",
        peak / MIB
    );
    let expect = format!("{:x}", hasher.finalize());
    assert_eq!(
        python_blob_sha256(&account, &guard.name, "big.vhd", total),
        expect,
        "the blob holds what was written"
    );
    rt.block_on(guard.client.delete_blob(&path, true, None))
        .expect("delete the 2 GiB drive (frees Azurite's memory)");
}

#[test]
fn sigterm_flushes_dirty_data_and_the_foreground_daemon_exits_zero() {
    if !can_run(
        "sigterm_flushes_dirty_data_and_the_foreground_daemon_exits_zero",
        false,
    ) {
        return;
    }
    let rt = runtime();
    let guard = rt.block_on(ContainerGuard::new("e2e-sigterm"));
    let path = guard.path("d.vhd");
    rt.block_on(make_drive(&guard.client, &path, 16 * MIB));
    let sandbox = Sandbox::new(common::connection_string());
    let daemon = sandbox.mount_foreground("fg", Some(&guard.name), &[]);

    let data = random_bytes(5 * MIB as usize + 1536);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(daemon.dir.join("d.vhd"))
        .expect("open drive");
    file.write_all_at(&data, 3 * MIB + 1024).expect("write");
    send_signal(daemon.pid(), libc::SIGTERM);
    // The daemon flushes, then detaches the busy mount lazily and waits for
    // this last open file; the data is durable before that.
    wait_for("the lazy unmount", Duration::from_secs(20), || {
        !is_mounted(&daemon.dir)
    });
    assert!(
        rt.block_on(blob_bytes(&guard.client, &path, 3 * MIB + 1024, data.len())) == data,
        "SIGTERM did not flush the dirty data: {}",
        daemon.log_text()
    );
    drop(file);
    let log = daemon.log.clone();
    let status = daemon.wait(Duration::from_secs(20));
    assert!(
        status.success(),
        "daemon exit {status}: {}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
    let props = rt
        .block_on(guard.client.get_properties(&path))
        .expect("props");
    assert_eq!(
        props.lease_state,
        Some(LeaseState::Available),
        "lease released"
    );
}

#[test]
fn stats_json_counts_the_put_pages_of_an_open_drive() {
    if !can_run("stats_json_counts_the_put_pages_of_an_open_drive", false) {
        return;
    }
    let rt = runtime();
    let guard = rt.block_on(ContainerGuard::new("e2e-stats"));
    let path = guard.path("d.vhd");
    rt.block_on(make_drive(&guard.client, &path, 8 * MIB));
    let sandbox = Sandbox::new(common::connection_string());
    let mount = sandbox.mount("ns", None, &[]);
    let file = OpenOptions::new()
        .write(true)
        .open(mount.path(&format!("{}/d.vhd", guard.name)))
        .expect("open drive");
    file.write_all_at(&random_bytes(MIB as usize), 0)
        .expect("write");
    file.sync_all().expect("fsync");
    let stats = sandbox.stats(&mount.dir);
    assert_eq!(stats["pid"].as_i64(), Some(mount.pid as i64));
    let device = &stats["devices"][format!("{}/d.vhd", guard.name)];
    assert!(
        device["put_page"].as_u64().unwrap_or(0) > 0,
        "no put_page counted: {stats}"
    );
    assert!(device["bytes_up"].as_u64().unwrap_or(0) >= MIB, "{stats}");
    assert_eq!(device["writable"], serde_json::Value::Bool(true), "{stats}");
    assert_eq!(device["open"], serde_json::Value::Bool(true), "{stats}");
    let text = sandbox.blobdrive_ok(&["stats", &mount.dir.to_string_lossy()]);
    assert!(text.contains("put_page"), "text stats: {text}");

    // After the writer exits (like `dd` would), its counters are still shown.
    drop(file);
    let key = format!("{}/d.vhd", guard.name);
    let mut stats = sandbox.stats(&mount.dir);
    wait_for("the last release", Duration::from_secs(10), || {
        stats = sandbox.stats(&mount.dir);
        stats["devices"][&key]["open"] == serde_json::Value::Bool(false)
    });
    let device = &stats["devices"][&key];
    assert!(device["put_page"].as_u64().unwrap_or(0) > 0, "{stats}");
    assert_eq!(device["dirty_bytes"].as_u64(), Some(0), "{stats}");
    mount.unmount();
}

#[test]
fn read_only_mount_refuses_writes_with_erofs() {
    if !can_run("read_only_mount_refuses_writes_with_erofs", false) {
        return;
    }
    let rt = runtime();
    let guard = rt.block_on(ContainerGuard::new("e2e-ro"));
    let path = guard.path("d.vhd");
    rt.block_on(make_drive(&guard.client, &path, 4 * MIB));
    let content = random_bytes(4096);
    rt.block_on(
        guard
            .client
            .put_pages(&path, 0, content.clone().into(), None),
    )
    .expect("put pages");
    let sandbox = Sandbox::new(common::connection_string());
    let mount = sandbox.mount("ro", Some(&guard.name), &["--read-only"]);
    let err = OpenOptions::new()
        .write(true)
        .open(mount.path("d.vhd"))
        .expect_err("writable open on a read-only mount");
    assert_eq!(errno_of(&err), libc::EROFS, "{err}");
    let mut read = vec![0u8; 4096];
    std::fs::File::open(mount.path("d.vhd"))
        .expect("read-only open")
        .read_exact_at(&mut read, 0)
        .expect("read");
    assert!(read == content);
    mount.unmount();
    let props = rt
        .block_on(guard.client.get_properties(&path))
        .expect("props");
    assert_eq!(
        props.lease_state,
        Some(LeaseState::Available),
        "never leased"
    );
}

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.parse::<u32>().is_err() {
            continue;
        }
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(needle) {
                found.push(format!("{name}: {cmdline}"));
            }
        }
    }
    found
}

#[test]
fn mounting_a_missing_container_fails_in_one_line_and_leaves_nothing_behind() {
    if !can_run(
        "mounting_a_missing_container_fails_in_one_line_and_leaves_nothing_behind",
        false,
    ) {
        return;
    }
    let sandbox = Sandbox::new(common::connection_string());
    let dir = sandbox.dir("missing");
    let container = common::unique_name("e2e-missing");
    let out = sandbox.blobdrive(&["mount", &container, &dir.to_string_lossy()]);
    assert!(
        !out.status.success(),
        "mount of a missing container succeeded"
    );
    let line = stderr_line(&out);
    assert!(
        line.contains(&container),
        "the error does not name the container: {line}"
    );
    assert!(
        !is_mounted(&dir),
        "a failed mount left {} mounted",
        dir.display()
    );
    let leftovers = processes_mentioning(&dir.to_string_lossy());
    assert!(leftovers.is_empty(), "daemons left behind: {leftovers:?}");
    let sockets: Vec<_> = std::fs::read_dir(sandbox.root.path().join("run"))
        .expect("run dir")
        .collect();
    assert!(
        sockets.is_empty(),
        "control sockets left behind: {sockets:?}"
    );
    println!("missing container: {line}");
}

#[test]
fn unmount_of_a_plain_directory_fails_in_one_line() {
    if !can_run("unmount_of_a_plain_directory_fails_in_one_line", false) {
        return;
    }
    let sandbox = Sandbox::new(common::connection_string());
    let dir = sandbox.dir("plain");
    let out = sandbox.blobdrive(&["unmount", &dir.to_string_lossy()]);
    assert!(
        !out.status.success(),
        "unmount of a plain directory succeeded"
    );
    let line = stderr_line(&out);
    assert!(
        line.contains(&*dir.to_string_lossy()) && line.contains("not a blobdrive mount"),
        "unclear error: {line}"
    );
    println!("plain directory: {line}");
}

#[test]
fn unmount_after_the_daemon_was_killed_removes_the_dead_mount() {
    if !can_run(
        "unmount_after_the_daemon_was_killed_removes_the_dead_mount",
        false,
    ) {
        return;
    }
    let rt = runtime();
    let guard = rt.block_on(ContainerGuard::new("e2e-killed"));
    rt.block_on(make_drive(&guard.client, &guard.path("d.vhd"), 4 * MIB));
    let sandbox = Sandbox::new(common::connection_string());
    let mount = sandbox.mount("ns", Some(&guard.name), &[]);
    let dir = mount.dir.to_string_lossy().to_string();
    send_signal(mount.pid, libc::SIGKILL);
    wait_for("the daemon to die", Duration::from_secs(10), || {
        std::fs::metadata(&mount.dir).is_err()
    });

    // Every command names the dead mount and what to do, in one line.
    let out = sandbox.blobdrive(&["stats", &dir]);
    assert!(!out.status.success());
    let line = stderr_line(&out);
    assert!(
        line.contains("gone") && line.contains("blobdrive unmount"),
        "{line}"
    );
    let out = sandbox.blobdrive(&["mount", &guard.name, &dir]);
    assert!(!out.status.success());
    let line = stderr_line(&out);
    assert!(line.contains("dead mount"), "{line}");

    // unmount removes it, and says that unflushed writes are lost (non-zero).
    let out = sandbox.blobdrive(&["unmount", &dir]);
    assert!(!out.status.success(), "a crash is not a clean unmount");
    let line = stderr_line(&out);
    assert!(line.contains("removed the dead mount"), "{line}");
    assert!(!is_mounted(&mount.dir), "the dead mount is still there");
    let out = sandbox.blobdrive(&["unmount", &dir]);
    assert!(stderr_line(&out).contains("not a blobdrive mount"));

    // The directory is usable again.
    drop(mount);
    let again = sandbox.mount("ns", Some(&guard.name), &[]);
    assert_eq!(
        std::fs::metadata(again.path("d.vhd")).expect("stat").len(),
        4 * MIB
    );
    again.unmount();
}

/// The bytes of scattered block `i` and where it goes: every other chunk
/// (256 KiB), at a different 4 KiB block in each, so no two writes are
/// adjacent and none can share a Put Page. Shared by the writer and the
/// checker below.
const PY_BLOCKS: &str = r#"
import hashlib
def block(i):
    return hashlib.sha256(b"%d" % i).digest() * 128
def offset(i):
    return 2 * i * 262144 + (i * 37 % 64) * 4096
"#;

/// Writes blocks `0..argv[2]` into the file `argv[1]`, says `written`, waits
/// for a line, fsyncs, says `synced`, waits for a line, closes. The test
/// reads the daemon's stats in between: from a process of its own, since a
/// process that forks while holding the file open closes a copy of it in
/// the child, and FUSE turns every close into a flush.
const PY_SCATTER_WRITER: &str = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY)
for i in range(int(sys.argv[2])):
    os.pwrite(fd, block(i), offset(i))
print("written", flush=True)
sys.stdin.readline()
os.fsync(fd)
print("synced", flush=True)
sys.stdin.readline()
os.close(fd)
"#;

/// Checks, with the official SDK, that the data area of blob `argv[2]`
/// (`argv[4]` bytes) holds data exactly at blocks `0..argv[3]`, and that
/// every 16th holds its bytes.
const PY_CHECK_BLOCKS: &str = r#"
import os, sys
from azure.storage.blob import BlobServiceClient
svc = BlobServiceClient.from_connection_string(os.environ["CS"])
blob = svc.get_blob_client(sys.argv[1], sys.argv[2])
n, size = int(sys.argv[3]), int(sys.argv[4])
ranges, _ = blob.get_page_ranges()
got = sorted((r["start"], r["end"] + 1 - r["start"]) for r in ranges if r["start"] < size)
expect = sorted((offset(i), 4096) for i in range(n))
assert got == expect, ("page ranges differ", len(got), len(expect), got[:4], expect[:4])
# Every 16th block's bytes (each download costs the SDK tens of ms).
for i in range(0, n, 16):
    data = blob.download_blob(offset=offset(i), length=4096).readall()
    assert data == block(i), i
print(n)
"#;

/// Scattered 4 KiB writes (a database's, a journal's) are absorbed by the
/// cache: 2,048 of them, each in a chunk of its own, make no Put Page until
/// fsync (the old budget, counted in pinned 256 KiB chunks, held 256), and
/// fsync sends exactly one Put Page each. An independent client then finds
/// exactly those blocks in the blob, each with its bytes.
#[test]
fn scattered_4_kib_writes_are_absorbed_and_fsync_sends_one_put_page_each() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    if !can_run(
        "scattered_4_kib_writes_are_absorbed_and_fsync_sends_one_put_page_each",
        false,
    ) {
        return;
    }
    const WRITES: u64 = 2048;
    let rt = runtime();
    // Each write becomes a page range of its own, and Azurite's cost per
    // request on a blob grows with its ranges: an emulator of its own.
    let azurite = common::private_azurite::PrivateAzurite::start();
    let account = common::private_azurite::account_or_shared(&azurite);
    let guard = rt.block_on(ContainerGuard::new_in(&account, "e2e-scatter"));
    let path = guard.path("d.vhd");
    let size = 1024 * MIB;
    rt.block_on(make_drive(&guard.client, &path, size));
    let sandbox = Sandbox::new(account.connection_string());
    // No background flush during the test: only fsync sends.
    let mount = sandbox.mount("ns", Some(&guard.name), &["--flush-delay", "1h"]);
    let mut writer = Command::new("python3")
        .arg("-c")
        .arg(format!("{PY_BLOCKS}{PY_SCATTER_WRITER}"))
        .arg(mount.path("d.vhd"))
        .arg(WRITES.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut said = BufReader::new(writer.stdout.take().expect("piped stdout")).lines();
    let mut tell = writer.stdin.take().expect("piped stdin");
    let mut next = |expect: &str| {
        let line = said.next().and_then(|l| l.ok()).unwrap_or_default();
        assert_eq!(line, expect, "the writer stopped early");
    };
    next("written");
    let key = format!("{}/d.vhd", guard.name);
    let before = sandbox.stats(&mount.dir);
    let device = &before["devices"][&key];
    assert_eq!(
        device["put_page"].as_u64(),
        Some(0),
        "writes were sent before fsync: {before}"
    );
    assert_eq!(
        device["dirty_bytes"].as_u64(),
        Some(WRITES * 4096),
        "{before}"
    );
    writeln!(tell, "fsync").expect("tell the writer");
    next("synced");
    let after = sandbox.stats(&mount.dir);
    let device = &after["devices"][&key];
    assert_eq!(device["put_page"].as_u64(), Some(WRITES), "{after}");
    assert_eq!(device["dirty_bytes"].as_u64(), Some(0), "{after}");
    writeln!(tell, "close").expect("tell the writer");
    assert!(writer.wait().expect("wait for the writer").success());
    mount.unmount();
    let checked = common::python_with(
        &account.connection_string(),
        &format!("{PY_BLOCKS}{PY_CHECK_BLOCKS}"),
        &[&guard.name, "d.vhd", &WRITES.to_string(), &size.to_string()],
    );
    assert_eq!(checked, WRITES.to_string());
}
