//! End-to-end tests of the namespace mount over the in-memory backend: real FUSE,
//! real loop devices with direct I/O, real ext4. Tests that need root, /dev/fuse
//! or loop devices print `SKIPPED: ...` where those are missing (a failure under
//! `BLOBDRIVE_REQUIRE_FUSE=1`).

mod common;
mod fuse_support;
mod system;

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use blobdrive::daemon::{request_stats, request_unmount, run_mount, MountOptions};
use blobdrive::fs::memory::MemoryCatalog;
use blobdrive::fs::{Catalog, EntryPath};
use fuse_support::*;

const MIB: u64 = 1024 * 1024;
const SNAPSHOT: &str = "2026-11-21T23:03:01.5600000Z";

fn path(container: &str, blob: &str) -> EntryPath {
    EntryPath {
        container: container.into(),
        blob: blob.into(),
        snapshot: None,
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

fn errno_of(err: &std::io::Error) -> i32 {
    err.raw_os_error()
        .unwrap_or_else(|| panic!("no errno in {err}"))
}

/// Deterministic bytes that are not all zeros.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn namespace_shows_containers_virtual_dirs_drives_and_read_only_snapshots() {
    if !can_run(
        "namespace_shows_containers_virtual_dirs_drives_and_read_only_snapshots",
        false,
    ) {
        return;
    }
    let catalog = MemoryCatalog::new();
    catalog.add_drive("alpha", "disk.vhd", 4 * MIB);
    catalog.add_drive("alpha", "dir/sub/inner.vhd", MIB);
    catalog.add_raw_page_blob("alpha", "raw.bin", 1024);
    catalog.add_block_blob("alpha", "notes.txt", b"hello".to_vec());
    catalog.add_container("beta");
    catalog
        .add_snapshot("alpha", "disk.vhd", SNAPSHOT)
        .expect("blob exists");

    let tmp = temp_dir();
    let mount = FuseMount::start(tmp.path(), catalog.clone(), MountOptions::default());
    assert_eq!(names(&mount.dir), ["alpha", "beta"]);
    let snapshot_name = format!("disk.vhd@{SNAPSHOT}");
    assert_eq!(
        names(&mount.path("alpha")),
        ["dir", "disk.vhd", &snapshot_name, "notes.txt", "raw.bin"]
    );
    assert_eq!(names(&mount.path("alpha/dir")), ["sub"]);
    assert_eq!(names(&mount.path("alpha/dir/sub")), ["inner.vhd"]);
    assert!(names(&mount.path("beta")).is_empty());

    let drive = std::fs::metadata(mount.path("alpha/disk.vhd")).expect("stat drive");
    assert!(drive.is_file());
    assert_eq!(drive.len(), 4 * MIB);
    assert_eq!(drive.permissions().mode() & 0o777, 0o644);
    assert_eq!(
        std::fs::metadata(mount.path("alpha/dir/sub/inner.vhd"))
            .unwrap()
            .len(),
        MIB
    );
    assert_eq!(
        std::fs::metadata(mount.path("alpha/raw.bin"))
            .unwrap()
            .len(),
        1024
    );
    assert!(std::fs::metadata(mount.path("alpha/dir")).unwrap().is_dir());
    let missing = std::fs::metadata(mount.path("alpha/nope")).unwrap_err();
    assert_eq!(errno_of(&missing), libc::ENOENT);

    let snapshot = mount.path(&format!("alpha/{snapshot_name}"));
    let meta = std::fs::metadata(&snapshot).expect("stat snapshot");
    assert_eq!(meta.len(), 4 * MIB);
    assert_eq!(meta.permissions().mode() & 0o777, 0o444);
    let err = OpenOptions::new().write(true).open(&snapshot).unwrap_err();
    assert_eq!(errno_of(&err), libc::EROFS, "writable open of a snapshot");
    assert_eq!(std::fs::read(&snapshot).unwrap(), vec![0; 4 * MIB as usize]);

    assert_eq!(
        std::fs::read(mount.path("alpha/notes.txt")).unwrap(),
        b"hello"
    );
    let err = OpenOptions::new()
        .write(true)
        .open(mount.path("alpha/notes.txt"))
        .unwrap_err();
    assert_eq!(errno_of(&err), libc::EROFS, "writable open of a block blob");
    mount.unmount().expect("clean unmount");

    // A one-container mount shows that container at the root.
    let opts = MountOptions {
        container: Some("alpha".into()),
        ..MountOptions::default()
    };
    let mount = FuseMount::start(tmp.path(), catalog, opts);
    assert_eq!(
        names(&mount.dir),
        ["dir", "disk.vhd", &snapshot_name, "notes.txt", "raw.bin"]
    );
    mount.unmount().expect("clean unmount");
}

#[test]
fn writes_reach_the_device_and_fsync_makes_them_durable() {
    if !can_run(
        "writes_reach_the_device_and_fsync_makes_them_durable",
        false,
    ) {
        return;
    }
    let catalog = MemoryCatalog::new();
    let disk = catalog.add_drive("c", "disk.vhd", 2 * MIB);
    let tmp = temp_dir();
    let mount = FuseMount::start(tmp.path(), catalog.clone(), MountOptions::default());

    let data = pattern(64 * 1024, 7);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(mount.path("c/disk.vhd"))
        .expect("O_DIRECT open of a drive");
    assert!(disk.is_leased(), "a writable open takes the lease");
    let mut aligned = AlignedBuf::new(data.len());
    aligned.as_mut().copy_from_slice(&data);
    file.write_all_at(aligned.as_ref(), MIB)
        .expect("direct write");
    assert_eq!(
        &disk.current_bytes()[MIB as usize..][..data.len()],
        &data[..]
    );
    assert_eq!(
        disk.dirty_pages(),
        data.len() / 512,
        "written, not yet durable"
    );

    // max_write is negotiated at 1 MiB: one aligned 1 MiB direct write is one request.
    let writes = disk.counters().writes;
    let mut big = AlignedBuf::new(MIB as usize);
    big.as_mut().copy_from_slice(&pattern(MIB as usize, 11));
    file.write_all_at(big.as_ref(), 0)
        .expect("1 MiB direct write");
    assert_eq!(
        disk.counters().writes,
        writes + 1,
        "1 MiB arrived in one FUSE write"
    );
    assert_eq!(&disk.current_bytes()[..MIB as usize], big.as_ref());

    let flushes = disk.counters().flushes;
    file.sync_all().expect("fsync");
    assert!(
        disk.counters().flushes > flushes,
        "fsync reached Device::flush"
    );
    assert_eq!(disk.dirty_pages(), 0);
    assert_eq!(
        &disk.durable_bytes()[MIB as usize..][..data.len()],
        &data[..]
    );

    // Discards from the loop device arrive as fallocate.
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    let zero = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
    use std::os::fd::AsRawFd;
    // SAFETY: plain syscalls on an open descriptor.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), punch, MIB as i64, 4096) };
    assert_eq!(rc, 0, "punch hole: {}", std::io::Error::last_os_error());
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), zero, MIB as i64 + 8192, 4096) };
    assert_eq!(rc, 0, "zero range: {}", std::io::Error::last_os_error());
    // Plain allocation inside the disk succeeds and changes nothing (a
    // page blob's pages need no allocation); past its end it is refused.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, 4096) };
    assert_eq!(
        rc,
        0,
        "plain allocation: {}",
        std::io::Error::last_os_error()
    );
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, 4 * MIB as i64) };
    assert_eq!(rc, -1, "plain allocation past the end of a fixed disk");
    assert_eq!(errno_of(&std::io::Error::last_os_error()), libc::EPERM);
    let counters = disk.counters();
    assert_eq!((counters.discards, counters.discard_bytes), (2, 8192));
    assert!(disk.current_bytes()[MIB as usize..][..4096]
        .iter()
        .all(|&b| b == 0));

    // A drive never grows.
    let mut file2 = OpenOptions::new()
        .write(true)
        .open(mount.path("c/disk.vhd"))
        .unwrap();
    file2.seek(SeekFrom::Start(2 * MIB)).unwrap();
    let err = file2.write_all(b"x").unwrap_err();
    assert_eq!(errno_of(&err), libc::ENOSPC);
    let err = file2.set_len(MIB).unwrap_err();
    assert_eq!(errno_of(&err), libc::EPERM);
    drop(file2);
    drop(file);

    mount.unmount().expect("clean unmount");
    assert!(!disk.is_leased(), "the last release gives the lease back");
    assert_eq!(disk.durable_bytes(), disk.current_bytes());
}

#[test]
fn unmount_request_flushes_first_and_refuses_while_a_file_is_open() {
    if !can_run(
        "unmount_request_flushes_first_and_refuses_while_a_file_is_open",
        false,
    ) {
        return;
    }
    let catalog = MemoryCatalog::new();
    let disk = catalog.add_drive("c", "disk.vhd", MIB);
    let tmp = temp_dir();
    let mount = FuseMount::start(tmp.path(), catalog.clone(), MountOptions::default());

    let file = OpenOptions::new()
        .write(true)
        .open(mount.path("c/disk.vhd"))
        .unwrap();
    file.write_all_at(&pattern(8192, 3), 4096).unwrap();
    assert!(disk.dirty_pages() > 0);

    let stats = request_stats(&mount.dir).expect("stats over the control socket");
    let device = &stats["devices"]["c/disk.vhd"];
    assert_eq!(device["writes"], 1, "stats: {stats}");
    assert_eq!(device["writable"], true, "stats: {stats}");

    let err = request_unmount(&mount.dir).expect_err("busy while a file is open");
    assert!(err.to_string().contains("busy"), "{err:#}");
    assert_eq!(disk.dirty_pages(), 0, "the refused unmount still flushed");
    assert_eq!(disk.durable_bytes(), disk.current_bytes());
    assert!(
        is_mounted(&mount.dir),
        "still serving after a refused unmount"
    );

    drop(file);
    mount.unmount().expect("unmount once nothing is open");
    assert!(!disk.is_leased());
    assert_eq!(disk.counters().closes, 1);
}

#[test]
fn read_only_mount_refuses_writes_with_erofs() {
    if !can_run("read_only_mount_refuses_writes_with_erofs", false) {
        return;
    }
    let catalog = MemoryCatalog::new();
    let disk = catalog.add_drive("c", "disk.vhd", MIB);
    let tmp = temp_dir();
    let opts = MountOptions {
        read_only: true,
        ..MountOptions::default()
    };
    let mount = FuseMount::start(tmp.path(), catalog.clone(), opts);
    let err = OpenOptions::new()
        .write(true)
        .open(mount.path("c/disk.vhd"))
        .unwrap_err();
    assert_eq!(errno_of(&err), libc::EROFS);
    let mut bytes = Vec::new();
    std::fs::File::open(mount.path("c/disk.vhd"))
        .unwrap()
        .read_to_end(&mut bytes)
        .unwrap();
    assert_eq!(bytes.len() as u64, MIB);
    assert_eq!(disk.counters().writable_opens, 0, "no lease taken");
    mount.unmount().expect("clean unmount");
}

#[test]
fn second_writer_is_refused_while_the_first_holds_the_lease() {
    if !can_run(
        "second_writer_is_refused_while_the_first_holds_the_lease",
        false,
    ) {
        return;
    }
    let catalog = MemoryCatalog::new();
    catalog.add_drive("c", "disk.vhd", MIB);
    catalog.add_snapshot("c", "disk.vhd", SNAPSHOT).unwrap();
    let tmp = temp_dir();
    let first = FuseMount::start(tmp.path(), catalog.clone(), MountOptions::default());
    let second = FuseMount::start(tmp.path(), catalog.clone(), MountOptions::default());

    let writer = OpenOptions::new()
        .write(true)
        .open(first.path("c/disk.vhd"))
        .unwrap();
    let err = OpenOptions::new()
        .write(true)
        .open(second.path("c/disk.vhd"))
        .unwrap_err();
    assert_eq!(errno_of(&err), libc::EBUSY);
    let snapshot = second.path(&format!("c/disk.vhd@{SNAPSHOT}"));
    assert_eq!(std::fs::read(snapshot).unwrap().len() as u64, MIB);
    // Read-only opens share the lease holder's device on the first mount.
    assert_eq!(
        std::fs::read(first.path("c/disk.vhd")).unwrap().len() as u64,
        MIB
    );
    drop(writer);
    // The kernel sends RELEASE after close(2) returns; the lease goes with it.
    let disk = catalog.disk(&path("c", "disk.vhd")).unwrap();
    wait_for("the lease to be released", Duration::from_secs(5), || {
        !disk.is_leased()
    });
    let again = OpenOptions::new()
        .write(true)
        .open(second.path("c/disk.vhd"));
    assert!(
        again.is_ok(),
        "writable once the first writer closed: {again:?}"
    );
    drop(again);
    second.unmount().unwrap();
    first.unmount().unwrap();
}

#[test]
fn ext4_on_a_direct_io_loop_device_survives_unmount_and_remount() {
    if !can_run(
        "ext4_on_a_direct_io_loop_device_survives_unmount_and_remount",
        true,
    ) {
        return;
    }
    let catalog = MemoryCatalog::new();
    let disk = catalog.add_drive("c", "disk.vhd", 64 * MIB);
    let tmp = temp_dir();
    let files: Vec<(String, Vec<u8>)> = (0..4)
        .map(|i| {
            (
                format!("file{i}.bin"),
                pattern(300_000 + i * 77_777, i as u8),
            )
        })
        .collect();

    let mount = FuseMount::start(tmp.path(), catalog.clone(), MountOptions::default());
    let lo = LoopDevice::attach_direct_io(&mount.path("c/disk.vhd"));
    let dio = std::fs::read_to_string(format!(
        "/sys/block/{}/loop/dio",
        lo.device.trim_start_matches("/dev/")
    ))
    .unwrap_or_default();
    assert_eq!(dio.trim(), "1", "loop device runs with direct I/O");
    run("mkfs.ext4", &["-q", "-F", &lo.device]);
    let ext4 = BlockMount::mount(&lo.device, &tmp.path().join("ext4"));
    std::fs::create_dir(ext4.dir.join("sub")).unwrap();
    for (name, data) in &files {
        std::fs::write(ext4.dir.join("sub").join(name), data).unwrap();
    }
    run("sync", &[]);
    ext4.unmount();
    lo.detach();
    mount.unmount().expect("clean FUSE unmount");
    assert!(!disk.is_leased());
    assert_eq!(disk.dirty_pages(), 0, "everything durable after unmount");
    assert_eq!(disk.durable_bytes(), disk.current_bytes());

    let mount = FuseMount::start(tmp.path(), catalog.clone(), MountOptions::default());
    let through_fuse = std::fs::read(mount.path("c/disk.vhd")).unwrap();
    assert!(
        through_fuse == disk.durable_bytes(),
        "FUSE reads equal the device's bytes"
    );
    let lo = LoopDevice::attach_direct_io(&mount.path("c/disk.vhd"));
    let ext4 = BlockMount::mount(&lo.device, &tmp.path().join("ext4"));
    for (name, data) in &files {
        let read = std::fs::read(ext4.dir.join("sub").join(name)).unwrap();
        assert!(&read == data, "{name} intact after remount");
    }
    ext4.unmount();
    lo.detach();
    mount.unmount().expect("clean FUSE unmount");
}

#[test]
fn fstrim_after_deleting_files_discards_on_the_device() {
    if !can_run("fstrim_after_deleting_files_discards_on_the_device", true) {
        return;
    }
    let catalog = MemoryCatalog::new();
    let disk = catalog.add_drive("c", "disk.vhd", 64 * MIB);
    let tmp = temp_dir();
    let mount = FuseMount::start(tmp.path(), catalog.clone(), MountOptions::default());
    let lo = LoopDevice::attach_direct_io(&mount.path("c/disk.vhd"));
    run("mkfs.ext4", &["-q", "-F", "-E", "nodiscard", &lo.device]);
    let ext4 = BlockMount::mount(&lo.device, &tmp.path().join("ext4"));
    for i in 0..4 {
        std::fs::write(
            ext4.dir.join(format!("big{i}")),
            pattern(4 * MIB as usize, i),
        )
        .unwrap();
    }
    run("sync", &[]);
    for i in 0..4 {
        std::fs::remove_file(ext4.dir.join(format!("big{i}"))).unwrap();
    }
    run("sync", &[]);
    let before = disk.counters();
    run("fstrim", &[&ext4.dir.to_string_lossy()]);
    let after = disk.counters();
    assert!(
        after.discards > before.discards,
        "fstrim produced discards: {after:?}"
    );
    assert!(
        after.discard_bytes - before.discard_bytes >= 16 * MIB,
        "the deleted 16 MiB were discarded: {after:?}"
    );
    ext4.unmount();
    lo.detach();
    mount.unmount().expect("clean FUSE unmount");
}

/// Kills a child process left running by a failed test.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[test]
fn sigterm_flushes_dirty_data_before_the_daemon_exits() {
    if !can_run("sigterm_flushes_dirty_data_before_the_daemon_exits", false) {
        return;
    }
    let tmp = temp_dir();
    let dir = tmp.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let image = tmp.path().join("durable.img");
    let child = spawn_child("foreground", &dir, &image, &tmp.path().join("log"));
    let _unmount = ForeignMount(dir.clone());
    let mut child = ChildGuard(child);
    wait_for("the child daemon's mount", Duration::from_secs(20), || {
        is_mounted(&dir)
    });

    let data = pattern(16 * 1024, 9);
    let file = OpenOptions::new()
        .write(true)
        .open(dir.join("disks/disk.vhd"))
        .unwrap();
    file.write_all_at(&data, 512 * 1024).unwrap();
    let durable = std::fs::read(&image).unwrap();
    assert!(
        durable[512 * 1024..][..data.len()] != data[..],
        "not durable before the signal"
    );

    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
    // The file is still open, so the daemon flushes, detaches lazily and waits.
    wait_for("flush after SIGTERM", Duration::from_secs(10), || {
        let durable = std::fs::read(&image).unwrap();
        durable[512 * 1024..][..data.len()] == data[..]
    });
    drop(file);
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "daemon still running after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        status.success(),
        "daemon exit status after SIGTERM: {status}"
    );
    assert!(!is_mounted(&dir));
}

#[test]
fn background_daemon_returns_when_ready_and_unmounts_on_request() {
    if !can_run(
        "background_daemon_returns_when_ready_and_unmounts_on_request",
        false,
    ) {
        return;
    }
    let tmp = temp_dir();
    let dir = tmp.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let image = tmp.path().join("durable.img");
    let _unmount = ForeignMount(dir.clone());
    let output = spawn_child("background", &dir, &image, &tmp.path().join("log"))
        .wait_with_output()
        .unwrap();
    assert!(
        output.status.success(),
        "launcher failed: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    assert!(is_mounted(&dir), "mounted as soon as the launcher returned");

    let stats = request_stats(&dir).expect("stats");
    let pid = stats["pid"].as_u64().expect("daemon pid in stats") as i32;
    let data = pattern(4096, 1);
    let file = OpenOptions::new()
        .write(true)
        .open(dir.join("disks/disk.vhd"))
        .unwrap();
    file.write_all_at(&data, 0).unwrap();
    drop(file);
    request_unmount(&dir).expect("unmount request");
    assert!(!is_mounted(&dir));
    assert_eq!(&std::fs::read(&image).unwrap()[..4096], &data[..]);
    wait_for("the daemon to exit", Duration::from_secs(10), || {
        !Path::new(&format!("/proc/{pid}")).exists() || is_zombie(pid)
    });
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

#[test]
fn background_daemon_reports_its_startup_error_to_the_launcher() {
    if !can_run(
        "background_daemon_reports_its_startup_error_to_the_launcher",
        false,
    ) {
        return;
    }
    let tmp = temp_dir();
    let dir = tmp.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let output = spawn_child(
        "background-failing",
        &dir,
        &tmp.path().join("img"),
        &tmp.path().join("log"),
    )
    .wait_with_output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "launcher test failed: {stdout}");
    assert!(
        stdout.contains("CHILD-ERROR: wrong account key for devstoreaccount1"),
        "launcher output: {stdout}"
    );
    assert!(!is_mounted(&dir));
}

/// Entry of the child daemons started by the tests above (ignored when run alone).
#[test]
#[ignore = "child process entry, started by other tests with CHILD_* variables"]
fn daemon_child_entry() {
    let (Ok(mode), Some(dir), Some(image), Some(log)) = (
        std::env::var(CHILD_MODE),
        std::env::var_os(CHILD_MOUNTPOINT),
        std::env::var_os(CHILD_IMAGE),
        std::env::var_os(CHILD_LOG),
    ) else {
        return;
    };
    let catalog = MemoryCatalog::new();
    let disk = catalog.add_drive("disks", "disk.vhd", CHILD_DRIVE_BYTES);
    disk.mirror_durable_to(image.into()).expect("image file");
    let opts = MountOptions {
        foreground: mode == "foreground",
        log_file: Some(log.into()),
        ..MountOptions::default()
    };
    let failing = mode == "background-failing";
    let result = run_mount(Path::new(&dir), &opts, move |_takeover| {
        let catalog = catalog.clone();
        async move {
            if failing {
                anyhow::bail!("wrong account key for devstoreaccount1");
            }
            Ok(catalog as Arc<dyn Catalog>)
        }
    });
    match result {
        Ok(()) => println!("CHILD-OK"),
        Err(err) => println!("CHILD-ERROR: {err:#}"),
    }
}

/// A 4 KiB-aligned buffer for O_DIRECT.
struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> Self {
        let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: non-zero size layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        AlignedBuf { ptr, len }
    }
    fn as_ref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes for the buffer's life.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, 4096).unwrap();
        // SAFETY: allocated with this layout in `new`.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}
