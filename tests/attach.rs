//! `blobdrive mount C/B DIR` end to end: real Azurite, real FUSE, loop devices
//! and ext4, driven through the built binary exactly as a user would
//! (`create --mkfs`, `mount`, `snapshot`, `unmount`, `mount -t blobdrive`,
//! fstab, systemd readiness, a `--cache-dir` disk tier shared by snapshot
//! attaches in separate daemons, `stats` and `cache clear`, and the private
//! FUSE mount served by blobdrive's own protocol layer).
//!
//! Each test gets its own run directory (control sockets, registry, private
//! FUSE mounts) and temp directory; a [`Site`] guard undoes every attach,
//! loop device and mount under them even when the test fails. Tests print
//! `SKIPPED` without root, /dev/fuse or loop devices, and fail instead under
//! `BLOBDRIVE_REQUIRE_FUSE=1`.

mod common;
mod system;

use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blobdrive::blob::{BlobPath, LeaseState};
use common::ContainerGuard;
use sha2::{Digest, Sha256};
use system::{is_mounted, wait_for};

const BIN: &str = env!("CARGO_BIN_EXE_blobdrive");

/// Whether the test can run (FUSE, root, loop devices and their tools).
fn can_run(test: &str) -> bool {
    system::can_run(test, true)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// One test's world: a run directory and a temp directory, and on drop the
/// removal of everything attached under them.
struct Site {
    run_dir: tempfile::TempDir,
    root: tempfile::TempDir,
}

impl Site {
    fn new() -> Site {
        let make = |prefix: &str| {
            tempfile::Builder::new()
                .prefix(prefix)
                .tempdir()
                .expect("temp dir")
        };
        Site {
            run_dir: make("blobdrive-attach-run-"),
            root: make("blobdrive-attach-"),
        }
    }

    /// A new directory under the site's temp directory.
    fn dir(&self, name: &str) -> PathBuf {
        let dir = self.root.path().join(name);
        std::fs::create_dir_all(&dir).expect("mkdir");
        dir.canonicalize().expect("canonical dir")
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("BLOBDRIVE_RUN_DIR", self.run_dir.path())
            .env("BLOBDRIVE_RECOVERY_DIR", common::recovery_dir())
            .env(
                "AZURE_STORAGE_CONNECTION_STRING",
                common::connection_string(),
            )
            .env_remove("NOTIFY_SOCKET");
        cmd
    }

    /// Runs `blobdrive ARGS`.
    fn blobdrive(&self, args: &[&str]) -> Output {
        self.command(BIN)
            .args(args)
            .output()
            .expect("run blobdrive")
    }

    /// Runs `blobdrive ARGS` and returns stdout; panics with stderr on failure.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.blobdrive(args);
        assert!(
            out.status.success(),
            "blobdrive {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Where the daemons of this site keep their sockets and registry: the
    /// run directory, or root's private directory in it once it is shared.
    fn private_run_dir(&self) -> PathBuf {
        let private = self.run_dir.path().join("blobdrive-0");
        if private.is_dir() {
            private
        } else {
            self.run_dir.path().to_path_buf()
        }
    }

    /// Registry entries (JSON) of this site.
    fn registry(&self) -> Vec<serde_json::Value> {
        let dir = self.private_run_dir().join("attach");
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .filter_map(|p| std::fs::read_to_string(p).ok())
            .filter_map(|t| serde_json::from_str(&t).ok())
            .collect()
    }

    /// Mounts, loop devices and sockets left under this site.
    fn leftovers(&self) -> Vec<String> {
        let roots = [
            self.run_dir.path().to_string_lossy().to_string(),
            self.root.path().to_string_lossy().to_string(),
        ];
        let mut found = Vec::new();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        for line in mounts.lines() {
            if let Some(point) = line.split(' ').nth(4) {
                if roots.iter().any(|r| point.starts_with(r.as_str())) {
                    found.push(format!("mount {point}"));
                }
            }
        }
        let loops = run_tool("losetup", &["-a"]).unwrap_or_default();
        for line in loops.lines() {
            if roots.iter().any(|r| line.contains(r.as_str())) {
                found.push(format!("loop {line}"));
            }
        }
        for entry in self.registry() {
            found.push(format!("registry {entry}"));
        }
        if let Ok(dir) = std::fs::read_dir(self.private_run_dir()) {
            for e in dir.filter_map(Result::ok) {
                if e.path().extension().is_some_and(|x| x == "sock") {
                    found.push(format!("socket {}", e.path().display()));
                }
            }
        }
        found
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        for entry in self.registry() {
            let dir = entry["dir"].as_str().unwrap_or_default().to_string();
            let out = self.blobdrive(&["unmount", &dir]);
            if out.status.success() {
                continue;
            }
            let _ = run_tool("umount", &["-l", &dir]);
            if let Some(dev) = entry["loop_device"].as_str() {
                let _ = run_tool("losetup", &["-d", dev]);
            }
            if let Some(fuse) = entry["fuse_dir"].as_str() {
                let _ = run_tool("umount", &["-l", fuse]);
            }
            // The holder first: it would replace a killed serving process.
            for key in ["holder_pid", "pid"] {
                if let Some(pid) = entry[key].as_i64() {
                    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                }
            }
        }
        // Whatever is still mounted under the site, innermost first.
        let mut leftovers = self.leftovers();
        leftovers.reverse();
        for item in leftovers {
            if let Some(point) = item.strip_prefix("mount ") {
                let _ = run_tool("umount", &["-l", point]);
            } else if let Some(line) = item.strip_prefix("loop ") {
                if let Some(dev) = line.split(':').next() {
                    let _ = run_tool("losetup", &["-d", dev]);
                }
            }
        }
    }
}

fn run_tool(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn lease_state(guard: &ContainerGuard, blob: &str) -> Option<LeaseState> {
    let path = guard.path(blob);
    runtime()
        .block_on(guard.client.get_properties(&path))
        .expect("properties")
        .lease_state
}

fn stderr_line(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(
        text.lines().count(),
        1,
        "expected one error line, got {text:?}"
    );
    text
}

fn sha(path: &Path) -> String {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    format!("{:x}", Sha256::digest(&data))
}

/// Every file under `dir` (lost+found aside) with its SHA-256.
fn file_sums(dir: &Path) -> Vec<(String, String)> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
        for entry in std::fs::read_dir(dir)
            .expect("readdir")
            .filter_map(Result::ok)
        {
            let path = entry.path();
            let rel = path
                .strip_prefix(base)
                .unwrap()
                .to_string_lossy()
                .to_string();
            if rel == "lost+found" {
                continue;
            }
            if path.is_dir() {
                walk(base, &path, out);
            } else {
                out.push((rel, sha(&path)));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn drive_name(guard: &ContainerGuard, blob: &str) -> String {
    format!("{}/{blob}", guard.name)
}

#[test]
fn attached_drive_keeps_its_files_across_unmount_and_mount_and_releases_its_lease() {
    if !can_run("attached_drive_keeps_its_files_across_unmount_and_mount_and_releases_its_lease") {
        return;
    }
    let site = Site::new();
    let guard = runtime().block_on(ContainerGuard::new("attach-roundtrip"));
    let drive = drive_name(&guard, "dir/disk.vhd");
    let created = site.ok(&["create", &drive, "--size", "64M", "--mkfs", "ext4"]);
    assert!(created.contains("formatted"), "{created}");
    let dir = site.dir("data");
    let dir_s = dir.to_string_lossy().to_string();

    site.ok(&["mount", &drive, &dir_s]);
    assert!(is_mounted(&dir));
    assert_eq!(
        lease_state(&guard, "dir/disk.vhd"),
        Some(LeaseState::Leased)
    );
    let listed = site.ok(&["list", "--mounted", "--json"]);
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed[0]["kind"], "attach");
    assert_eq!(listed[0]["drive"], drive.as_str());
    assert_eq!(listed[0]["dir"], dir_s.as_str());
    assert_eq!(listed[0]["mode"], "read-write");
    assert_eq!(listed[0]["fs_type"], "ext4");
    assert!(listed[0]["loop_device"]
        .as_str()
        .unwrap()
        .starts_with("/dev/loop"));

    std::fs::create_dir(dir.join("sub")).unwrap();
    let big = pattern(3 << 20, 7);
    std::fs::write(dir.join("sub/big.bin"), &big).unwrap();
    std::fs::write(dir.join("hello.txt"), b"hello, drive\n").unwrap();
    let stats = site.ok(&["stats", &dir_s, "--json"]);
    assert!(stats.contains("dir/disk.vhd"), "{stats}");

    site.ok(&["unmount", &dir_s]);
    assert!(!is_mounted(&dir));
    assert_eq!(
        lease_state(&guard, "dir/disk.vhd"),
        Some(LeaseState::Available)
    );
    assert!(site.leftovers().is_empty(), "{:?}", site.leftovers());

    site.ok(&["mount", &drive, &dir_s]);
    assert_eq!(std::fs::read(dir.join("sub/big.bin")).unwrap(), big);
    assert_eq!(
        std::fs::read_to_string(dir.join("hello.txt")).unwrap(),
        "hello, drive\n"
    );
    site.ok(&["unmount", &dir_s]);
    assert_eq!(
        lease_state(&guard, "dir/disk.vhd"),
        Some(LeaseState::Available)
    );
    assert!(site.leftovers().is_empty(), "{:?}", site.leftovers());
}

/// The private FUSE mount behind an attach is served by blobdrive's own
/// protocol layer (`fs/session.rs`, mounted with mount(2) as type
/// `fuse.blobdrive`), with node ids fixed by the drive's path: the root is 1,
/// the virtual directory 2, the drive file 3. Listing the private directory
/// (OPENDIR/READDIR, which a loop device never sends) shows the path, `stat`
/// gives the disk size, and extended attributes are refused (ENOSYS, which
/// the kernel reports as EOPNOTSUPP) while the filesystem above still writes.
#[test]
fn the_private_mount_of_an_attach_is_served_by_blobdrives_own_fuse_layer() {
    use std::os::unix::fs::MetadataExt;
    if !can_run("the_private_mount_of_an_attach_is_served_by_blobdrives_own_fuse_layer") {
        return;
    }
    let site = Site::new();
    let guard = runtime().block_on(ContainerGuard::new("attach-own-fuse"));
    let drive = drive_name(&guard, "dir/disk.vhd");
    site.ok(&["create", &drive, "--size", "64M", "--mkfs", "ext4"]);
    let dir = site.dir("data");
    let dir_s = dir.to_string_lossy().to_string();
    site.ok(&["mount", &drive, &dir_s]);

    let entry = site.registry().pop().expect("registry entry");
    let fuse_dir = PathBuf::from(entry["fuse_dir"].as_str().expect("fuse_dir"));
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let fstype = mountinfo
        .lines()
        .find(|l| l.split(' ').nth(4) == fuse_dir.to_str())
        .and_then(|l| l.split(" - ").nth(1))
        .and_then(|rest| rest.split(' ').next())
        .map(str::to_string);
    assert_eq!(
        fstype.as_deref(),
        Some("fuse.blobdrive"),
        "type of {}",
        fuse_dir.display()
    );

    let names = |path: &Path| -> Vec<String> {
        std::fs::read_dir(path)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    assert_eq!(names(&fuse_dir), ["dir"]);
    assert_eq!(names(&fuse_dir.join("dir")), ["disk.vhd"]);
    let file = fuse_dir.join("dir/disk.vhd");
    let ino = |path: &Path| std::fs::metadata(path).unwrap().ino();
    assert_eq!(
        (ino(&fuse_dir), ino(&fuse_dir.join("dir")), ino(&file)),
        (1, 2, 3)
    );
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 64 << 20);

    let path = std::ffi::CString::new(file.to_str().unwrap()).unwrap();
    let name = std::ffi::CString::new("user.blobdrive").unwrap();
    // SAFETY: both strings are NUL-terminated; a null buffer of size 0 asks
    // only for the size.
    let rc = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
    let err = std::io::Error::last_os_error();
    assert_eq!(
        (rc, err.raw_os_error()),
        (-1, Some(libc::EOPNOTSUPP)),
        "{err}"
    );

    let data = pattern(2 << 20, 3);
    std::fs::write(dir.join("after-xattr.bin"), &data).unwrap();
    site.ok(&["unmount", &dir_s]);
    site.ok(&["mount", &drive, &dir_s]);
    assert_eq!(std::fs::read(dir.join("after-xattr.bin")).unwrap(), data);
    site.ok(&["unmount", &dir_s]);
    assert!(site.leftovers().is_empty(), "{:?}", site.leftovers());
}

/// A read-only attach of a live drive holds no lease, so a restore from
/// another process goes ahead under it: the reader must not then serve a
/// mix of the old and the new state. Its reads of data it had not read
/// before fail with EIO (readers belong on snapshots).
#[test]
fn a_read_only_attach_of_a_live_drive_fails_reads_once_a_restore_changed_it() {
    if !can_run("a_read_only_attach_of_a_live_drive_fails_reads_once_a_restore_changed_it") {
        return;
    }
    let site = Site::new();
    let guard = runtime().block_on(ContainerGuard::new("attach-ro-live"));
    let drive = drive_name(&guard, "live.vhd");
    site.ok(&["create", &drive, "--size", "64M", "--mkfs", "ext4"]);
    let rw = site.dir("rw");
    let rw_s = rw.to_string_lossy().to_string();
    // State T1: two files; then big.bin rewritten in place.
    site.ok(&["mount", &drive, &rw_s]);
    std::fs::write(rw.join("small.txt"), b"first\n").unwrap();
    std::fs::write(rw.join("big.bin"), pattern(8 << 20, 1)).unwrap();
    site.ok(&["unmount", &rw_s]);
    let t1 = site.ok(&["snapshot", &drive]);
    site.ok(&["mount", &drive, &rw_s]);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(rw.join("big.bin"))
            .unwrap();
        f.write_all_at(&pattern(8 << 20, 2), 0).unwrap();
        f.sync_all().unwrap();
    }
    site.ok(&["unmount", &rw_s]);

    // A reader attaches the live drive read-only and reads one file. No
    // read-ahead: the daemon holds nothing of big.bin it was not asked for.
    let ro = site.dir("ro");
    let ro_s = ro.to_string_lossy().to_string();
    site.ok(&["mount", &drive, &ro_s, "--read-only", "--read-ahead", "0"]);
    assert_eq!(std::fs::read(ro.join("small.txt")).unwrap(), b"first\n");
    // Another process puts the drive back to T1 under the reader.
    site.ok(&["restore", &drive, "--snapshot", &t1, "--no-safety-snapshot"]);
    match std::fs::read(ro.join("big.bin")) {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}"),
        Ok(data) => panic!(
            "a read of the changed drive must fail, not return data of another state \
             (got {} bytes, {} the state the reader attached)",
            data.len(),
            if data == pattern(8 << 20, 2) {
                "equal to"
            } else {
                "not"
            }
        ),
    }
    site.ok(&["unmount", &ro_s]);
    assert!(site.leftovers().is_empty(), "{:?}", site.leftovers());
}

#[test]
fn three_snapshot_attaches_at_once_show_the_snapshot_while_the_writer_goes_on() {
    if !can_run("three_snapshot_attaches_at_once_show_the_snapshot_while_the_writer_goes_on") {
        return;
    }
    let site = Site::new();
    let guard = runtime().block_on(ContainerGuard::new("attach-snapshots"));
    let drive = drive_name(&guard, "live.vhd");
    site.ok(&["create", &drive, "--size", "64M", "--mkfs", "ext4"]);
    let dir = site.dir("live");
    let dir_s = dir.to_string_lossy().to_string();
    site.ok(&["mount", &drive, &dir_s]);
    for i in 0..4u8 {
        std::fs::write(dir.join(format!("static-{i}.bin")), pattern(200_000, i)).unwrap();
    }

    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let log = dir.join("log.txt");
        std::thread::spawn(move || {
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .expect("open log");
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                writeln!(file, "line {n:08} of the writer that never stops").expect("append");
                n += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            n
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    let time = site.ok(&["snapshot", &drive]);
    assert!(!time.is_empty());

    let views: Vec<PathBuf> = (0..3).map(|i| site.dir(&format!("snap{i}"))).collect();
    for view in &views {
        site.ok(&[
            "mount",
            &drive,
            &view.to_string_lossy(),
            "--snapshot",
            &time,
        ]);
    }
    let listed: serde_json::Value =
        serde_json::from_str(&site.ok(&["list", "--mounted", "--json"])).unwrap();
    let snapshot_attaches = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["mode"] == "snapshot" && e["snapshot"] == time.as_str())
        .count();
    assert_eq!(snapshot_attaches, 3);

    let first = file_sums(&views[0]);
    assert!(first.iter().any(|(name, _)| name == "log.txt"));
    for i in 0..4u8 {
        let name = format!("static-{i}.bin");
        let want = format!("{:x}", Sha256::digest(pattern(200_000, i)));
        assert!(first.contains(&(name, want)));
    }
    for view in &views[1..] {
        assert_eq!(
            file_sums(view),
            first,
            "every snapshot attach shows the same files"
        );
    }
    // The snapshot's log is a prefix of the live one, and the writer went on.
    let snap_log = std::fs::read(views[0].join("log.txt")).unwrap();
    assert!(!snap_log.is_empty());
    std::thread::sleep(Duration::from_millis(300));
    let live_log = std::fs::read(dir.join("log.txt")).unwrap();
    assert!(live_log.len() > snap_log.len(), "the writer went on");
    assert!(
        live_log.starts_with(&snap_log),
        "snapshot is a consistent prefix"
    );
    let write_in_snapshot = std::fs::write(views[0].join("new.txt"), b"x");
    assert!(write_in_snapshot.is_err(), "a snapshot attach is read-only");

    stop.store(true, Ordering::Relaxed);
    let lines = writer.join().expect("writer");
    assert!(lines > 0);
    for view in &views {
        site.ok(&["unmount", &view.to_string_lossy()]);
    }
    site.ok(&["unmount", &dir_s]);
    assert_eq!(lease_state(&guard, "live.vhd"), Some(LeaseState::Available));
    assert!(site.leftovers().is_empty(), "{:?}", site.leftovers());
}

#[test]
fn failed_attach_leaves_no_loop_device_fuse_mount_or_lease() {
    if !can_run("failed_attach_leaves_no_loop_device_fuse_mount_or_lease") {
        return;
    }
    let site = Site::new();
    let guard = runtime().block_on(ContainerGuard::new("attach-failures"));
    let dir = site.dir("target");
    let dir_s = dir.to_string_lossy().to_string();

    // A drive with no filesystem.
    let blank = drive_name(&guard, "blank.vhd");
    site.ok(&["create", &blank, "--size", "32M"]);
    let out = site.blobdrive(&["mount", &blank, &dir_s]);
    assert_eq!(out.status.code(), Some(1));
    let line = stderr_line(&out);
    assert!(line.contains("holds no filesystem"), "{line}");
    assert!(line.contains("--mkfs"), "{line}");
    assert!(!is_mounted(&dir));
    assert!(site.leftovers().is_empty(), "{:?}", site.leftovers());
    assert_eq!(
        lease_state(&guard, "blank.vhd"),
        Some(LeaseState::Available)
    );

    // A filesystem option the kernel refuses.
    let formatted = drive_name(&guard, "fs.vhd");
    site.ok(&["create", &formatted, "--size", "32M", "--mkfs", "ext4"]);
    let out = site.blobdrive(&["mount", &formatted, &dir_s, "-o", "no_such_option=1"]);
    assert_eq!(out.status.code(), Some(1));
    let line = stderr_line(&out);
    assert!(line.contains("cannot mount the ext4 filesystem"), "{line}");
    assert!(site.leftovers().is_empty(), "{:?}", site.leftovers());
    assert_eq!(lease_state(&guard, "fs.vhd"), Some(LeaseState::Available));

    // A drive leased by another host: refused with the way out, then taken over.
    let path: BlobPath = guard.path("fs.vhd");
    runtime()
        .block_on(
            guard
                .client
                .acquire_lease(&path, "11111111-2222-3333-4444-555555555555", None),
        )
        .expect("lease");
    let out = site.blobdrive(&["mount", &formatted, &dir_s]);
    assert_eq!(out.status.code(), Some(1));
    let line = stderr_line(&out);
    assert!(line.contains("in use elsewhere"), "{line}");
    assert!(line.contains("break-lease"), "{line}");
    assert!(site.leftovers().is_empty(), "{:?}", site.leftovers());
    site.ok(&["mount", &formatted, &dir_s, "--break-lease"]);
    assert!(is_mounted(&dir));
    site.ok(&["unmount", &dir_s]);
    assert_eq!(lease_state(&guard, "fs.vhd"), Some(LeaseState::Available));

    // A missing drive.
    let out = site.blobdrive(&["mount", &drive_name(&guard, "nope.vhd"), &dir_s]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr_line(&out).contains("does not exist"));
    assert!(site.leftovers().is_empty(), "{:?}", site.leftovers());
}

#[test]
fn unmount_refuses_while_busy_and_umount_from_outside_detaches_the_drive() {
    if !can_run("unmount_refuses_while_busy_and_umount_from_outside_detaches_the_drive") {
        return;
    }
    let site = Site::new();
    let guard = runtime().block_on(ContainerGuard::new("attach-busy"));
    let drive = drive_name(&guard, "busy.vhd");
    site.ok(&["create", &drive, "--size", "32M", "--mkfs", "ext4"]);
    let dir = site.dir("busy");
    let dir_s = dir.to_string_lossy().to_string();
    site.ok(&["mount", &drive, &dir_s]);
    let open = std::fs::File::create(dir.join("open.txt")).unwrap();
    let out = site.blobdrive(&["unmount", &dir_s]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr_line(&out).contains("busy"));
    assert!(is_mounted(&dir), "a refused unmount changes nothing");
    drop(open);

    // umount(8) by hand (or systemd stopping an fstab mount): the daemon notices.
    run_tool("umount", &[&dir_s]).expect("umount");
    wait_for("the daemon to detach", Duration::from_secs(30), || {
        site.leftovers().is_empty()
    });
    assert_eq!(lease_state(&guard, "busy.vhd"), Some(LeaseState::Available));
}

/// `/sbin/mount.blobdrive` → the test binary for the guard's life.
struct HelperLink {
    link: PathBuf,
    backup: Option<PathBuf>,
}

impl HelperLink {
    fn install() -> HelperLink {
        let link = PathBuf::from("/sbin/mount.blobdrive");
        let backup = if link.symlink_metadata().is_ok() {
            let backup = PathBuf::from("/sbin/mount.blobdrive.attach-test-backup");
            std::fs::rename(&link, &backup).expect("back up the installed helper");
            Some(backup)
        } else {
            None
        };
        std::os::unix::fs::symlink(BIN, &link).expect("install the helper symlink");
        HelperLink { link, backup }
    }
}

impl Drop for HelperLink {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.link);
        if let Some(backup) = &self.backup {
            let _ = std::fs::rename(backup, &self.link);
        }
    }
}

#[test]
fn mount_dash_t_blobdrive_and_an_fstab_line_attach_the_drive() {
    if !can_run("mount_dash_t_blobdrive_and_an_fstab_line_attach_the_drive") {
        return;
    }
    let site = Site::new();
    let guard = runtime().block_on(ContainerGuard::new("attach-helper"));
    let drive = drive_name(&guard, "helper.vhd");
    site.ok(&["create", &drive, "--size", "32M", "--mkfs", "ext4"]);
    let dir = site.dir("helper");
    let dir_s = dir.to_string_lossy().to_string();
    let _helper = HelperLink::install();

    let out = site
        .command("mount")
        .args([
            "-t",
            "blobdrive",
            &drive,
            &dir_s,
            "-o",
            "noatime,_netdev,nofail",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(is_mounted(&dir));
    let opts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let line = opts
        .lines()
        .find(|l| l.contains(&*dir_s))
        .unwrap()
        .to_string();
    assert!(
        line.contains(" ext4 ") && line.contains("noatime"),
        "{line}"
    );
    std::fs::write(dir.join("via-helper.txt"), b"mount -t blobdrive\n").unwrap();
    site.ok(&["unmount", &dir_s]);
    assert_eq!(
        lease_state(&guard, "helper.vhd"),
        Some(LeaseState::Available)
    );

    let fstab = site.root.path().join("fstab");
    std::fs::write(
        &fstab,
        format!(
            "# blobdrive test\n{drive} {dir_s} blobdrive ro,_netdev,nofail,\
             x-systemd.requires=network-online.target,comment=test 0 0\n"
        ),
    )
    .unwrap();
    let out = site
        .command("mount")
        .args(["-T", &fstab.to_string_lossy(), &dir_s])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("via-helper.txt")).unwrap(),
        "mount -t blobdrive\n"
    );
    assert!(
        std::fs::write(dir.join("x"), b"x").is_err(),
        "ro from fstab"
    );
    let listed: serde_json::Value =
        serde_json::from_str(&site.ok(&["list", "--mounted", "--json"])).unwrap();
    assert_eq!(listed[0]["mode"], "read-only");
    assert_eq!(
        lease_state(&guard, "helper.vhd"),
        Some(LeaseState::Available)
    );
    // umount(8), as systemd does for an fstab mount unit.
    run_tool("umount", &[&dir_s]).expect("umount");
    wait_for("the daemon to detach", Duration::from_secs(30), || {
        site.leftovers().is_empty()
    });
}

/// A container SAS that may read, write and lease (a read-write attach).
const PY_SAS_RW: &str = r#"
import os, sys, datetime
from azure.storage.blob import generate_container_sas, ContainerSasPermissions
cs = dict(kv.split("=", 1) for kv in os.environ["CS"].split(";") if kv)
print(generate_container_sas(cs["AccountName"], sys.argv[1], account_key=cs["AccountKey"],
    permission=ContainerSasPermissions(read=True, add=True, create=True, write=True,
                                       delete=True, list=True),
    expiry=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)))
"#;

/// Every process whose command line (`/proc/PID/cmdline`, which any local
/// user may read) `shows` the secret, as `PID: args`.
fn command_lines_showing(shows: impl Fn(&str) -> bool) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let line = String::from_utf8_lossy(&raw).replace('\0', " ");
        if shows(&line) {
            found.push(format!("{name}: {line}"));
        }
    }
    found
}

/// A drive attached by its SAS URL, by `blobdrive mount` and by
/// `mount -t blobdrive` (mount.blobdrive): while the mount lives, no
/// process's command line (the daemon's, the command's, the helper's)
/// shows the signature.
#[test]
fn a_sas_url_attach_leaves_no_signature_in_any_command_line() {
    if !can_run("a_sas_url_attach_leaves_no_signature_in_any_command_line") {
        return;
    }
    let site = Site::new();
    let guard = runtime().block_on(ContainerGuard::new("attach-sas"));
    let drive = drive_name(&guard, "sas.vhd");
    site.ok(&["create", &drive, "--size", "32M", "--mkfs", "ext4"]);
    let sas = common::python(PY_SAS_RW, &[&guard.name]);
    let sig = sas
        .split('&')
        .find_map(|kv| kv.strip_prefix("sig="))
        .expect("the SAS has a signature")
        .to_string();
    let url = format!("{}/{}/sas.vhd?{sas}", common::azurite_url(), guard.name);
    let dir = site.dir("sas");
    let dir_s = dir.to_string_lossy().to_string();
    // This test's signature, or any `sig=` next to its container (other
    // tests' SAS URLs may be in flight on this host).
    let shows_sas =
        |line: &str| line.contains(&sig) || (line.contains("sig=") && line.contains(&guard.name));

    // The SAS is the only credential the commands get.
    let out = site
        .command(BIN)
        .env_remove("AZURE_STORAGE_CONNECTION_STRING")
        .args(["mount", &url, &dir_s])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(is_mounted(&dir));
    std::fs::write(dir.join("by-url.txt"), b"attached by a SAS URL\n").unwrap();
    let shown = command_lines_showing(shows_sas);
    assert!(
        shown.is_empty(),
        "the signature is in a command line: {shown:?}"
    );
    site.ok(&["unmount", &dir_s]);

    let _helper = HelperLink::install();
    let out = site
        .command("mount")
        .env_remove("AZURE_STORAGE_CONNECTION_STRING")
        .args(["-t", "blobdrive", &url, &dir_s])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(dir.join("by-url.txt")).unwrap(),
        b"attached by a SAS URL\n"
    );
    let shown = command_lines_showing(shows_sas);
    assert!(
        shown.is_empty(),
        "the signature is in a command line: {shown:?}"
    );
    site.ok(&["unmount", &dir_s]);
    assert_eq!(lease_state(&guard, "sas.vhd"), Some(LeaseState::Available));
}

#[test]
fn unit_template_passes_systemd_analyze_verify() {
    if !blobdrive::attach::tool_exists("systemd-analyze") {
        assert!(
            std::env::var("BLOBDRIVE_REQUIRE_FUSE").as_deref() != Ok("1"),
            "systemd-analyze is required"
        );
        println!("SKIPPED: unit_template_passes_systemd_analyze_verify: no systemd-analyze");
        return;
    }
    let unit = include_str!("../scripts/blobdrive@.service");
    assert!(unit.contains("Type=notify"));
    assert!(
        !unit.to_ascii_lowercase().contains("accountkey="),
        "no secrets in the unit"
    );
    let dir = tempfile::tempdir().unwrap();
    let text = unit.replace("/usr/local/bin/blobdrive", BIN);
    std::fs::write(dir.path().join("blobdrive@.service"), text).unwrap();
    let instance = dir.path().join("blobdrive@demo.service");
    std::os::unix::fs::symlink(dir.path().join("blobdrive@.service"), &instance).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&instance)
        .env("SYSTEMD_LOG_LEVEL", "warning")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.trim().is_empty(),
        "systemd-analyze verify complained: {stderr}"
    );
}

#[test]
fn foreground_attach_tells_systemd_ready_only_once_dir_is_mounted() {
    if !can_run("foreground_attach_tells_systemd_ready_only_once_dir_is_mounted") {
        return;
    }
    let site = Site::new();
    let guard = runtime().block_on(ContainerGuard::new("attach-notify"));
    let drive = drive_name(&guard, "notify.vhd");
    site.ok(&["create", &drive, "--size", "32M", "--mkfs", "ext4"]);
    let dir = site.dir("notify");
    let socket_path = site.root.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut child = site
        .command(BIN)
        .args(["mount", &drive, &dir.to_string_lossy(), "--foreground"])
        .env("NOTIFY_SOCKET", &socket_path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut buf = [0u8; 256];
    let n = socket.recv(&mut buf).expect("READY=1 within 60 s");
    assert_eq!(&buf[..n], b"READY=1");
    assert!(is_mounted(&dir), "READY=1 only after DIR is mounted");
    std::fs::write(dir.join("ready.txt"), b"ready\n").unwrap();

    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let n = socket.recv(&mut buf).expect("STOPPING=1");
    assert_eq!(&buf[..n], b"STOPPING=1");
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "daemon exit {status}: {stderr}");
    assert!(!is_mounted(&dir));
    assert_eq!(
        lease_state(&guard, "notify.vhd"),
        Some(LeaseState::Available)
    );
    assert!(site.leftovers().is_empty(), "{:?}", site.leftovers());

    // The data written before SIGTERM was flushed.
    site.ok(&["mount", &drive, &dir.to_string_lossy(), "--read-only"]);
    assert_eq!(
        std::fs::read_to_string(dir.join("ready.txt")).unwrap(),
        "ready\n"
    );
    site.ok(&["unmount", &dir.to_string_lossy()]);
}

#[test]
fn xfs_snapshot_attaches_beside_its_live_drive() {
    if !can_run("xfs_snapshot_attaches_beside_its_live_drive") {
        return;
    }
    if !blobdrive::attach::tool_exists("mkfs.xfs") {
        assert!(
            std::env::var("BLOBDRIVE_REQUIRE_FUSE").as_deref() != Ok("1"),
            "mkfs.xfs is required"
        );
        println!("SKIPPED: xfs_snapshot_attaches_beside_its_live_drive: no mkfs.xfs");
        return;
    }
    let site = Site::new();
    let guard = runtime().block_on(ContainerGuard::new("attach-xfs"));
    let drive = drive_name(&guard, "x.vhd");
    // mkfs.xfs refuses filesystems under 300 MB.
    site.ok(&["create", &drive, "--size", "320M", "--mkfs", "xfs"]);
    let live = site.dir("live");
    let then = site.dir("then");
    site.ok(&["mount", &drive, &live.to_string_lossy()]);
    std::fs::write(live.join("f.txt"), b"before\n").unwrap();
    let time = site.ok(&["snapshot", &drive]);
    std::fs::write(live.join("f.txt"), b"after\n").unwrap();
    // Same filesystem UUID as the live mount: read-only xfs needs nouuid.
    site.ok(&[
        "mount",
        &drive,
        &then.to_string_lossy(),
        "--snapshot",
        &time,
    ]);
    assert_eq!(
        std::fs::read_to_string(then.join("f.txt")).unwrap(),
        "before\n"
    );
    assert_eq!(
        std::fs::read_to_string(live.join("f.txt")).unwrap(),
        "after\n"
    );
    site.ok(&["unmount", &then.to_string_lossy()]);
    site.ok(&["unmount", &live.to_string_lossy()]);
    assert!(site.leftovers().is_empty(), "{:?}", site.leftovers());
}

/// The one device's counters in `blobdrive stats DIR --json`.
fn device_stats(site: &Site, dir: &Path) -> serde_json::Value {
    let stats: serde_json::Value =
        serde_json::from_str(&site.ok(&["stats", &dir.to_string_lossy(), "--json"]))
            .expect("stats is JSON");
    let devices = stats["devices"].as_object().expect("stats has devices");
    assert_eq!(devices.len(), 1, "one drive per attach: {stats}");
    devices.values().next().expect("one device").clone()
}

fn counter(device: &serde_json::Value, name: &str) -> u64 {
    device[name]
        .as_u64()
        .unwrap_or_else(|| panic!("stats has no counter {name}: {device}"))
}

/// A loop device queue setting of `device` (`/dev/loopN`), in KiB.
fn queue_kib(device: &str, name: &str) -> u64 {
    let dev = device.trim_start_matches("/dev/");
    std::fs::read_to_string(format!("/sys/block/{dev}/queue/{name}"))
        .unwrap_or_else(|e| panic!("{dev} queue/{name}: {e}"))
        .trim()
        .parse()
        .expect("a number")
}

/// `cat` and `cp` read a file 128 KiB at a time and ask for sequential
/// read-ahead, which doubles the kernel's. Through an attached drive their
/// reads reach the daemon as 1 MiB FUSE requests, the largest the
/// connection takes: the loop device sends requests of that size (the
/// kernel's 1280 KiB arrived cut in two) and its read-ahead (512 KiB,
/// 1 MiB doubled) keeps ext4 from caching the file in 2 MiB folios, which
/// cost the daemon twice the CPU per byte on a VM. `stats` counts the
/// FUSE reads (`fuse_read_requests`, `fuse_read_bytes`, and their
/// Prometheus totals), from which the mean request is read.
#[test]
fn cat_of_a_file_reaches_the_daemon_as_whole_1_mib_fuse_reads() {
    if !can_run("cat_of_a_file_reaches_the_daemon_as_whole_1_mib_fuse_reads") {
        return;
    }
    let site = Site::new();
    let guard = runtime().block_on(ContainerGuard::new("attach-fuse-reads"));
    let drive = drive_name(&guard, "reads.vhd");
    site.ok(&["create", &drive, "--size", "128M", "--mkfs", "ext4"]);
    let dir = site.dir("data");
    let dir_s = dir.to_string_lossy().to_string();
    let data = pattern(64 << 20, 3);
    site.ok(&["mount", &drive, &dir_s]);
    std::fs::write(dir.join("file"), &data).unwrap();
    site.ok(&["unmount", &dir_s]);

    // A new attach: nothing of the file in the kernel's cache.
    site.ok(&["mount", &drive, &dir_s]);
    let listed: serde_json::Value =
        serde_json::from_str(&site.ok(&["list", "--mounted", "--json"])).unwrap();
    let loop_dev = listed[0]["loop_device"].as_str().expect("a loop device");
    let largest = 1024.min(queue_kib(loop_dev, "max_hw_sectors_kb"));
    assert_eq!(queue_kib(loop_dev, "max_sectors_kb"), largest);
    assert_eq!(queue_kib(loop_dev, "read_ahead_kb"), 512);

    let before = device_stats(&site, &dir);
    let cat = Command::new("cat")
        .arg(dir.join("file"))
        .output()
        .expect("run cat");
    assert!(
        cat.status.success() && cat.stdout == data,
        "cat reads the file"
    );
    let after = device_stats(&site, &dir);
    let requests = counter(&after, "fuse_read_requests") - counter(&before, "fuse_read_requests");
    let bytes = counter(&after, "fuse_read_bytes") - counter(&before, "fuse_read_bytes");
    println!("cat of 64 MiB: {requests} FUSE reads, {bytes} bytes");
    assert!(bytes >= data.len() as u64, "{before}\n{after}");
    // The first requests are smaller while the kernel's read-ahead grows,
    // and ext4 reads the file's metadata in 4 KiB blocks; with the kernel's
    // defaults the mean was 640 KiB (1 MiB and 256 KiB, in turn).
    assert!(
        bytes / requests >= largest * 1024 * 3 / 4,
        "mean FUSE read {} KiB, wanted about {largest} KiB",
        bytes / requests / 1024
    );
    let metrics = site.ok(&["stats", &dir_s, "--prometheus"]);
    let line = format!("blobdrive_fuse_read_requests_total{{drive=\"{drive}\"}} ");
    assert!(metrics.contains(&line), "{metrics}");
    assert!(
        metrics.contains("blobdrive_fuse_read_bytes_total{"),
        "{metrics}"
    );
    site.ok(&["unmount", &dir_s]);
    assert!(site.leftovers().is_empty(), "{:?}", site.leftovers());
}

/// The drives' directories of a disk tier (`DIR/v2/<hash>`).
fn cached_drives(cache_dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(cache_dir.join("v2")) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect()
}

/// Chunks (256 KiB of pages each) of every drive under a disk tier.
fn cached_chunks(cache_dir: &Path) -> usize {
    blobdrive::drive::disk_cache::stored_chunks(cache_dir)
        .unwrap()
        .len()
}

#[test]
fn three_snapshot_attaches_share_one_disk_cache_that_cache_clear_empties() {
    if !can_run("three_snapshot_attaches_share_one_disk_cache_that_cache_clear_empties") {
        return;
    }
    let site = Site::new();
    let guard = runtime().block_on(ContainerGuard::new("attach-diskcache"));
    let drive = drive_name(&guard, "cached.vhd");
    site.ok(&["create", &drive, "--size", "64M", "--mkfs", "ext4"]);
    let live = site.dir("live");
    let live_s = live.to_string_lossy().to_string();
    site.ok(&["mount", &drive, &live_s]);
    let data = pattern(16 << 20, 5);
    std::fs::write(live.join("data.bin"), &data).unwrap();
    site.ok(&["unmount", &live_s]);
    let time = site.ok(&["snapshot", &drive]);

    let cache = site.dir("cache");
    let cache_s = cache.to_string_lossy().to_string();
    let views: Vec<PathBuf> = (0..3).map(|i| site.dir(&format!("snap{i}"))).collect();
    let attach = |view: &Path| {
        site.ok(&[
            "mount",
            &drive,
            &view.to_string_lossy(),
            "--snapshot",
            &time,
            "--cache-dir",
            &cache_s,
        ]);
    };

    // The first attach reads everything from the blob and fills the tier.
    attach(&views[0]);
    assert!(
        std::fs::read(views[0].join("data.bin")).unwrap() == data,
        "first snapshot attach reads the data"
    );
    let first = device_stats(&site, &views[0]);
    assert!(
        counter(&first, "bytes_down") >= data.len() as u64,
        "the first attach read from the blob: {first}"
    );
    assert_eq!(counter(&first, "disk_hits"), 0, "{first}");
    // Fills reach the disk in the background: wait until every page read
    // from the blob is on disk.
    wait_for(
        "the first attach's tier to fill",
        Duration::from_secs(30),
        || {
            let d = device_stats(&site, &views[0]);
            counter(&d, "disk_bytes") >= counter(&d, "disk_misses") * 512
        },
    );

    // Two more attaches of the same snapshot, beside the first: served by
    // the tier the first one filled, with (next to) no data from the blob.
    for view in &views[1..] {
        attach(view);
        assert!(
            std::fs::read(view.join("data.bin")).unwrap() == data,
            "{} reads the data",
            view.display()
        );
        let d = device_stats(&site, view);
        println!(
            "{}: get {}, bytes_down {}, disk_hits {}, disk_misses {}, disk_bytes {}",
            view.display(),
            counter(&d, "get"),
            counter(&d, "bytes_down"),
            counter(&d, "disk_hits"),
            counter(&d, "disk_misses"),
            counter(&d, "disk_bytes"),
        );
        assert!(
            counter(&d, "disk_hits") * 512 >= data.len() as u64,
            "the data came from the disk tier: {d}"
        );
        assert!(
            counter(&d, "bytes_down") < data.len() as u64 / 16
                && counter(&d, "disk_misses") * 512 < data.len() as u64 / 16,
            "next to nothing came from the blob: {d}"
        );
    }
    let listed: serde_json::Value =
        serde_json::from_str(&site.ok(&["list", "--mounted", "--json"])).unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(3), "{listed}");
    assert_eq!(
        cached_drives(&cache).len(),
        1,
        "one cache for the snapshot, not one per attach"
    );

    // `stats` shows the tier's hits, misses and size, as JSON and as text.
    let text = site.ok(&["stats", &views[2].to_string_lossy()]);
    for field in ["disk_hits", "disk_misses", "disk_bytes", "disk_bad_chunks"] {
        assert!(text.contains(field), "stats text lacks {field}:\n{text}");
        counter(&device_stats(&site, &views[2]), field);
    }

    // While mounted, `cache clear` leaves the snapshot's cache alone.
    let busy = site.ok(&["cache", "clear", "--cache-dir", &cache_s]);
    assert!(busy.contains("removed the cache of 0 drive(s)"), "{busy}");
    assert!(busy.contains("left 1 in use"), "{busy}");
    assert!(cached_chunks(&cache) > 0);
    for view in &views {
        site.ok(&["unmount", &view.to_string_lossy()]);
    }
    assert!(site.leftovers().is_empty(), "{:?}", site.leftovers());
    let cleared = site.ok(&["cache", "clear", "--cache-dir", &cache_s]);
    assert!(
        cleared.contains("removed the cache of 1 drive(s)"),
        "{cleared}"
    );
    assert!(!cleared.contains("in use"), "{cleared}");
    assert!(cached_drives(&cache).is_empty(), "the tier is empty");

    // A new attach finds nothing on disk: every page comes from the blob again.
    attach(&views[0]);
    assert!(std::fs::read(views[0].join("data.bin")).unwrap() == data);
    let d = device_stats(&site, &views[0]);
    assert_eq!(counter(&d, "disk_hits"), 0, "the tier was emptied: {d}");
    assert!(counter(&d, "bytes_down") >= data.len() as u64, "{d}");
    site.ok(&["unmount", &views[0].to_string_lossy()]);
    assert!(site.leftovers().is_empty(), "{:?}", site.leftovers());
}

/// The built binary, copied where the unprivileged user `nobody` can run it
/// (the target directory may sit under a directory only root may enter).
fn binary_for_nobody(site: &Site) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = site.root.path().join("bin");
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join("blobdrive");
    std::fs::copy(BIN, &bin).unwrap();
    for p in [site.root.path(), &dir] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

/// `program ARGS` run as the user `nobody` (no groups), with this site's
/// environment.
fn as_nobody(site: &Site, program: &Path, args: &[&str]) -> Output {
    site.command("setpriv")
        .args([
            "--reuid",
            "nobody",
            "--regid",
            "nogroup",
            "--clear-groups",
            "--",
        ])
        .arg(program)
        .args(args)
        .current_dir("/")
        .stdin(Stdio::null())
        .output()
        .expect("run setpriv")
}

/// Every directory and file under `dir`, `dir` included.
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    let mut at = 0;
    while at < out.len() {
        if std::fs::symlink_metadata(&out[at]).is_ok_and(|m| m.is_dir()) {
            let mut children: Vec<PathBuf> = std::fs::read_dir(&out[at])
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            children.sort();
            out.extend(children);
        }
        at += 1;
    }
    out
}

/// The paths of `paths` the user `nobody` can open (a directory: list).
fn opened_by_nobody(site: &Site, paths: &[PathBuf]) -> Vec<String> {
    let script = "import os, sys\n\
        for p in sys.argv[1:]:\n\
        \x20   try:\n\
        \x20       os.listdir(p) if os.path.isdir(p) else open(p, 'rb').close()\n\
        \x20       print(p)\n\
        \x20   except OSError:\n\
        \x20       pass\n";
    let mut args = vec!["-c".to_string(), script.to_string()];
    args.extend(paths.iter().map(|p| p.to_string_lossy().into_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = as_nobody(site, Path::new("/usr/bin/python3"), &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn no_other_user_can_read_the_disk_tier_of_an_attach() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !can_run("no_other_user_can_read_the_disk_tier_of_an_attach") {
        return;
    }
    let site = Site::new();
    binary_for_nobody(&site); // opens the site's directory to other users
    let guard = runtime().block_on(ContainerGuard::new("attach-tier-modes"));
    let drive = drive_name(&guard, "plain.vhd");
    site.ok(&["create", &drive, "--size", "64M", "--mkfs", "ext4"]);
    let dir = site.dir("data");
    let dir_s = dir.to_string_lossy().to_string();
    site.ok(&["mount", &drive, &dir_s]);
    let data = pattern(4 << 20, 3);
    std::fs::write(dir.join("secret.bin"), &data).unwrap();
    site.ok(&["unmount", &dir_s]);

    // A tier an older blobdrive made, in its layout (v1: one file per
    // chunk) and with its modes (0755 and 0644, as the umask gave), and a
    // layout directory of this version left loose the same way.
    let cache = site.dir("cache");
    let cache_s = cache.to_string_lossy().to_string();
    let old_chunks = cache
        .join("v1")
        .join("0123456789abcdef0123456789abcdef")
        .join("chunks");
    std::fs::create_dir_all(&old_chunks).unwrap();
    std::fs::write(old_chunks.join("0000000000000000"), b"BDCHUNK1").unwrap();
    std::fs::create_dir(cache.join("v2")).unwrap();
    for d in ["v1", "v2"] {
        std::fs::set_permissions(cache.join(d), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o755)).unwrap();

    site.ok(&[
        "mount",
        &drive,
        &dir_s,
        "--read-only",
        "--cache-dir",
        &cache_s,
    ]);
    assert!(std::fs::read(dir.join("secret.bin")).unwrap() == data);
    let filled = || counter(&device_stats(&site, &dir), "disk_bytes") >= data.len() as u64;
    let started = std::time::Instant::now();
    while !filled() && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(filled(), "the tier filled: {}", device_stats(&site, &dir));
    assert!(cached_chunks(&cache) > 0, "the tier holds chunks");
    assert!(
        !cache.join("v1").exists(),
        "the older layout's tier is removed"
    );
    let held = tree(&cache.join("v2"));
    assert!(held.len() > 4, "{held:?}");
    let opened = opened_by_nobody(&site, &held);
    assert!(opened.is_empty(), "nobody can open: {opened:?}");
    for path in &held {
        let mode = std::fs::symlink_metadata(path).unwrap().mode() & 0o777;
        let want = if path.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(mode, want, "{} has mode {mode:o}", path.display());
    }
    // The directory the user named is left as it was.
    assert_eq!(std::fs::metadata(&cache).unwrap().mode() & 0o7777, 0o755);
    site.ok(&["unmount", &dir_s]);
    assert!(site.leftovers().is_empty(), "{:?}", site.leftovers());
}

#[test]
fn another_user_cannot_control_a_mount_and_a_shared_run_dir_keeps_its_mode() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !can_run("another_user_cannot_control_a_mount_and_a_shared_run_dir_keeps_its_mode") {
        return;
    }
    let site = Site::new();
    let bin = binary_for_nobody(&site);
    // A shared run directory, as /tmp is.
    let run = site.run_dir.path();
    std::fs::set_permissions(run, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let guard = runtime().block_on(ContainerGuard::new("attach-control-peer"));
    let drive = drive_name(&guard, "owned.vhd");
    site.ok(&["create", &drive, "--size", "64M", "--mkfs", "ext4"]);
    let dir = site.dir("data");
    let dir_s = dir.to_string_lossy().to_string();
    site.ok(&["mount", &drive, &dir_s]);
    std::fs::write(dir.join("kept.txt"), b"still here\n").unwrap();

    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().mode() & 0o7777;
    assert_eq!(
        mode(run),
        0o1777,
        "the run directory given is never changed"
    );
    let private = run.join("blobdrive-0");
    assert_eq!(mode(&private), 0o700, "root's private directory in it");
    assert_eq!(std::fs::metadata(&private).unwrap().uid(), 0);

    // `nobody` asks for an unmount and the stats: refused, one line each.
    for args in [["unmount", &dir_s], ["stats", &dir_s]] {
        let out = as_nobody(&site, &bin, &args);
        assert!(!out.status.success(), "nobody ran {args:?}");
        let line = stderr_line(&out);
        assert!(line.starts_with("blobdrive: "), "{line}");
    }
    assert!(is_mounted(&dir), "the mount stays");

    // Even with the directory opened up by hand, the daemon itself obeys
    // only root and the user who mounted it.
    let socket = std::fs::read_dir(&private)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "sock"))
        .expect("the control socket");
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).unwrap();
    let client = "import socket, sys\n\
        s = socket.socket(socket.AF_UNIX)\n\
        s.connect(sys.argv[1])\n\
        try:\n\
        \x20   s.sendall(sys.argv[2].encode() + b'\\n')\n\
        except BrokenPipeError:\n\
        \x20   pass\n\
        print(s.makefile().readline().strip())\n";
    for request in ["unmount", "flush", "grow 134217728", "stats"] {
        let out = as_nobody(
            &site,
            Path::new("/usr/bin/python3"),
            &["-c", client, &socket.to_string_lossy(), request],
        );
        let answer = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            answer.starts_with("error permission denied"),
            "{request} by nobody: {answer:?} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(is_mounted(&dir), "the mount stays");
    assert_eq!(
        std::fs::read(dir.join("kept.txt")).unwrap(),
        b"still here\n"
    );
    assert_eq!(
        lease_state(&guard, "owned.vhd"),
        Some(LeaseState::Leased),
        "the drive was not closed"
    );
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();

    // Root controls it.
    assert!(site.ok(&["stats", &dir_s, "--json"]).contains("owned.vhd"));
    site.ok(&["unmount", &dir_s]);
    assert!(!is_mounted(&dir));
    assert_eq!(mode(run), 0o1777);
    assert!(site.leftovers().is_empty(), "{:?}", site.leftovers());
}

/// Binds control sockets at argv[2:] (making their directories 0700) and
/// writes argv[1] whenever anyone connects to one: a stand-in daemon that
/// another user planted under a mount's name.
const PY_PLANTED_SOCKETS: &str = r#"
import os, select, socket, sys
marker, paths = sys.argv[1], sys.argv[2:]
socks = []
for p in paths:
    os.makedirs(os.path.dirname(p), mode=0o700, exist_ok=True)
    s = socket.socket(socket.AF_UNIX)
    s.bind(p)
    s.listen(4)
    socks.append(s)
open(marker + ".ready", "w").close()
while True:
    ready, _, _ = select.select(socks, [], [], 60)
    if not ready:
        break
    for s in ready:
        c, _ = s.accept()
        open(marker, "w").write("asked")
        c.sendall(b'{"devices": {"spoofed/by-nobody.vhd": {}}}\n')
        c.close()
"#;

#[test]
fn root_never_asks_a_socket_another_user_left_under_a_mounts_name() {
    use std::os::unix::fs::PermissionsExt;
    let site = Site::new();
    // A shared run directory, as /tmp is: anyone may create in it.
    let base = site.root.path().join("shared-run");
    std::fs::create_dir(&base).unwrap();
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::fs::set_permissions(site.root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = site.dir("not-yours");
    let key = blobdrive::daemon::mountpoint::mount_key(&dir.canonicalize().unwrap());
    let sock = format!("{key}.sock");
    let marker = base.join("asked");
    // `nobody` plants a socket of that name in the shared directory and in
    // its own private directory there.
    let mut planter = site
        .command("setpriv")
        .args([
            "--reuid",
            "nobody",
            "--regid",
            "nogroup",
            "--clear-groups",
            "--",
        ])
        .args(["/usr/bin/python3", "-c", PY_PLANTED_SOCKETS])
        .arg(&marker)
        .arg(base.join(&sock))
        .arg(base.join("blobdrive-65534").join(&sock))
        .current_dir("/")
        .spawn()
        .expect("run python as nobody");
    let ready = base.join("asked.ready");
    let started = Instant::now();
    while !ready.exists() && started.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(ready.exists(), "the planted sockets are bound");
    let out = site
        .command(BIN)
        .env("BLOBDRIVE_RUN_DIR", &base)
        .args(["stats", &dir.to_string_lossy(), "--json"])
        .output()
        .unwrap();
    let _ = planter.kill();
    let _ = planter.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(!stdout.contains("spoofed"), "{stdout}");
    assert!(!marker.exists(), "root asked a socket another user planted");
}
