//! Every file operation of a namespace mount (`blobdrive mount [C] DIR`),
//! through the real binary, a real FUSE mount and the emulator: each one
//! gets a meaning or a refusal with the right errno, never `ENOSYS`; the
//! blob state after each is read by an independent client (the Python
//! `azure-storage-blob` SDK), and a new drive by `blobdrive info` and
//! `qemu-img info` too.
//!
//! Tests that need FUSE print `SKIPPED: ...` where it is missing (a failure
//! under `BLOBDRIVE_REQUIRE_FUSE=1`); every mount is unmounted and every
//! container deleted by guards, also when a test fails.

mod common;
mod mount_support;
mod system;

use std::ffi::CString;
use std::fs::OpenOptions;
use std::io::ErrorKind;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use common::{make_drive, ContainerGuard};
use mount_support::*;

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("tokio runtime")
}

/// The Python SDK's view of the account, one question per run:
/// `blob C B` (type, size, lease state and the footer's cookie, or null),
/// `container C` (exists), `lease C B` (an infinite lease, as another host
/// takes it), `break C B`, `snapshot C B` (its time), `block C B` (upload a
/// small block blob).
const SDK: &str = r#"
import json, os, sys
from azure.core.exceptions import ResourceNotFoundError
from azure.storage.blob import BlobServiceClient, BlobLeaseClient
svc = BlobServiceClient.from_connection_string(os.environ["CS"])
cmd, container = sys.argv[1], sys.argv[2]
if cmd == "container":
    print(json.dumps(svc.get_container_client(container).exists()))
    sys.exit()
blob = svc.get_blob_client(container, sys.argv[3])
if cmd == "blob":
    try:
        p = blob.get_blob_properties()
    except ResourceNotFoundError:
        print("null")
        sys.exit()
    kind = getattr(p.blob_type, "value", p.blob_type)
    cookie = ""
    if kind == "PageBlob" and p.size >= 512:
        cookie = blob.download_blob(offset=p.size - 512, length=8).readall().decode("latin1")
    print(json.dumps({"type": kind, "size": p.size, "lease": p.lease.state, "cookie": cookie}))
elif cmd == "lease":
    print(blob.acquire_lease(lease_duration=-1).id)
elif cmd == "break":
    BlobLeaseClient(blob).break_lease(lease_break_period=0)
elif cmd == "snapshot":
    print(blob.create_snapshot()["snapshot"])
elif cmd == "block":
    blob.upload_blob(b"hello")
"#;

fn sdk(args: &[&str]) -> String {
    common::python(SDK, args)
}

/// The blob as the SDK sees it, `None` when it does not exist.
fn sdk_blob(container: &str, blob: &str) -> Option<serde_json::Value> {
    let out = sdk(&["blob", container, blob]);
    let value: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("bad SDK answer ({e}): {out}"));
    (!value.is_null()).then_some(value)
}

fn sdk_container_exists(container: &str) -> bool {
    sdk(&["container", container]) == "true"
}

/// Asserts `result` failed with `errno` (named `what` in the message).
fn expect_errno<T: std::fmt::Debug>(what: &str, result: std::io::Result<T>, errno: i32) {
    match result {
        Ok(v) => panic!("{what}: expected errno {errno}, got success ({v:?})"),
        Err(e) => assert_eq!(
            e.raw_os_error(),
            Some(errno),
            "{what}: expected {}, got {e}",
            std::io::Error::from_raw_os_error(errno)
        ),
    }
}

fn cstr(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).expect("no NUL in a test path")
}

fn last_error(rc: libc::c_int) -> std::io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn fallocate(path: &Path, len: u64) -> std::io::Result<()> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    // SAFETY: a plain syscall on a descriptor this function owns.
    let rc = unsafe {
        libc::fallocate(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0,
            0,
            len as libc::off_t,
        )
    };
    last_error(rc)
}

fn setxattr(path: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    let name = CString::new(name).expect("no NUL");
    // SAFETY: valid C strings and a buffer of the given length.
    let rc = unsafe {
        libc::setxattr(
            cstr(path).as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    last_error(rc)
}

fn getxattr(path: &Path, name: &str) -> std::io::Result<String> {
    let name = CString::new(name).expect("no NUL");
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid C strings and a buffer of the given length.
    let n = unsafe {
        libc::getxattr(
            cstr(path).as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

fn mknod_fifo(path: &Path) -> std::io::Result<()> {
    // SAFETY: a valid C string.
    last_error(unsafe { libc::mknod(cstr(path).as_ptr(), libc::S_IFIFO | 0o644, 0) })
}

/// Runs a command-line tool; its exit status and stderr.
fn tool(program: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn truncate_fallocate_and_qemu_img_make_drives_as_create_does() {
    if !can_run(
        "truncate_fallocate_and_qemu_img_make_drives_as_create_does",
        false,
    ) {
        return;
    }
    let rt = runtime();
    let guard = rt.block_on(ContainerGuard::new("ns-create"));
    let c = guard.name.clone();
    let sandbox = Sandbox::new(common::connection_string());
    let mount = sandbox.mount("ns", Some(&c), &[]);

    // truncate -s 1G: a drive that blobdrive info and qemu-img read as 1 GiB.
    let (ok, err) = tool(
        "truncate",
        &["-s", "1G", &mount.path("t.vhd").to_string_lossy()],
    );
    assert!(ok, "truncate -s 1G failed: {err}\n{}", mount.log_text());
    let blob = sdk_blob(&c, "t.vhd").expect("truncate made a blob");
    assert_eq!(blob["type"], "PageBlob");
    assert_eq!(blob["size"], GIB + 512);
    assert_eq!(blob["cookie"], "conectix", "the blob ends in a VHD footer");
    assert_eq!(
        blob["lease"], "available",
        "the lease went with the last close"
    );
    let info = sandbox.blobdrive_ok(&["info", &format!("{c}/t.vhd"), "--json"]);
    let info: serde_json::Value = serde_json::from_str(&info).expect("info --json");
    assert_eq!(info["virtual_size_bytes"], GIB);
    assert_eq!(info["is_drive"], true);
    let qemu = Command::new("qemu-img")
        .args(["info", "--output=json", "-U"])
        .arg(mount.path("t.vhd"))
        .output()
        .expect("qemu-img runs");
    assert!(
        qemu.status.success(),
        "{}",
        String::from_utf8_lossy(&qemu.stderr)
    );
    let qemu: serde_json::Value = serde_json::from_slice(&qemu.stdout).expect("qemu-img json");
    assert_eq!(qemu["virtual-size"], GIB);
    assert_eq!(
        std::fs::metadata(mount.path("t.vhd")).expect("stat").len(),
        GIB
    );

    // fallocate -l and qemu-img create -f raw do the same.
    let (ok, err) = tool(
        "fallocate",
        &["-l", "32M", &mount.path("f.vhd").to_string_lossy()],
    );
    assert!(ok, "fallocate -l 32M failed: {err}\n{}", mount.log_text());
    assert_eq!(
        sdk_blob(&c, "f.vhd").expect("fallocate made a blob")["size"],
        32 * MIB + 512
    );
    let (ok, err) = tool(
        "qemu-img",
        &[
            "create",
            "-f",
            "raw",
            &mount.path("q.vhd").to_string_lossy(),
            "64M",
        ],
    );
    assert!(ok, "qemu-img create failed: {err}\n{}", mount.log_text());
    assert_eq!(
        sdk_blob(&c, "q.vhd").expect("qemu-img made a blob")["size"],
        64 * MIB + 512
    );

    // Writes through the handle that gave the size reach the new drive.
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(mount.path("w.vhd"))
        .expect("create w.vhd");
    file.set_len(16 * MIB).expect("size the new drive");
    file.write_all_at(b"written through the creating handle", 4096)
        .expect("write into the new drive");
    file.sync_all().expect("fsync");
    drop(file);
    let mut back = vec![0u8; 35];
    std::fs::File::open(mount.path("w.vhd"))
        .expect("open w.vhd")
        .read_exact_at(&mut back, 4096)
        .expect("read back");
    assert_eq!(&back, b"written through the creating handle");

    // A size the rules refuse: EINVAL, nothing made.
    let bad = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(mount.path("odd.vhd"))
        .expect("create odd.vhd");
    expect_errno(
        "ftruncate to 17.5 MiB",
        bad.set_len(17 * MIB + MIB / 2),
        libc::EINVAL,
    );
    expect_errno("ftruncate to 8 MiB", bad.set_len(8 * MIB), libc::EINVAL);
    drop(bad);
    assert!(
        sdk_blob(&c, "odd.vhd").is_none(),
        "a refused size made a blob"
    );

    // touch alone leaves nothing; other names cannot be created.
    let (ok, err) = tool("touch", &[&mount.path("empty.vhd").to_string_lossy()]);
    assert!(ok, "touch NAME.vhd failed: {err}");
    assert!(sdk_blob(&c, "empty.vhd").is_none(), "touch made a blob");
    // The kernel sends the release after close returns.
    wait_for(
        "a created file closed without a size to be gone",
        std::time::Duration::from_secs(5),
        || !mount.path("empty.vhd").exists(),
    );
    expect_errno(
        "creating notes.txt",
        std::fs::File::create(mount.path("notes.txt")),
        libc::EPERM,
    );
    assert!(sdk_blob(&c, "notes.txt").is_none());

    // An existing drive keeps its size; touch and chmod are accepted.
    let t = mount.path("t.vhd");
    let rw = OpenOptions::new().write(true).open(&t).expect("open t.vhd");
    expect_errno("ftruncate of a drive", rw.set_len(2 * GIB), libc::EPERM);
    drop(rw);
    expect_errno(
        "fallocate past a drive's end",
        fallocate(&t, 2 * GIB),
        libc::EPERM,
    );
    let (ok, err) = tool("touch", &[&t.to_string_lossy()]);
    assert!(ok, "touch of a drive failed: {err}");
    std::fs::set_permissions(&t, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    std::os::unix::fs::chown(&t, Some(0), Some(0)).expect("chown");
    assert_eq!(
        sdk_blob(&c, "t.vhd").expect("still there")["size"],
        GIB + 512
    );

    // Directories inside a container are the mount's until a drive is made in them.
    std::fs::create_dir(mount.path("sub")).expect("mkdir in a container");
    std::fs::create_dir(mount.path("sub/deeper")).expect("mkdir below it");
    std::fs::remove_dir(mount.path("sub/deeper")).expect("rmdir of an empty one");
    let (ok, err) = tool(
        "truncate",
        &["-s", "16M", &mount.path("sub/d.vhd").to_string_lossy()],
    );
    assert!(ok, "truncate in a new directory failed: {err}");
    assert_eq!(
        sdk_blob(&c, "sub/d.vhd").expect("sub/d.vhd made")["size"],
        16 * MIB + 512
    );
    expect_errno(
        "rmdir of a directory of blobs",
        std::fs::remove_dir(mount.path("sub")),
        libc::ENOTEMPTY,
    );
    mount.unmount();
}

#[test]
fn rm_deletes_a_drive_only_without_lease_and_snapshots() {
    if !can_run("rm_deletes_a_drive_only_without_lease_and_snapshots", false) {
        return;
    }
    let rt = runtime();
    let guard = rt.block_on(ContainerGuard::new("ns-rm"));
    let c = guard.name.clone();
    for name in ["leased.vhd", "snapped.vhd", "plain.vhd"] {
        rt.block_on(make_drive(&guard.client, &guard.path(name), 16 * MIB));
    }
    sdk(&["block", &c, "notes.txt"]);
    let sandbox = Sandbox::new(common::connection_string());
    let mount = sandbox.mount("ns", Some(&c), &[]);

    // Leased by another host: EBUSY, and the drive stays.
    sdk(&["lease", &c, "leased.vhd"]);
    expect_errno(
        "rm of a leased drive",
        std::fs::remove_file(mount.path("leased.vhd")),
        libc::EBUSY,
    );
    let blob = sdk_blob(&c, "leased.vhd").expect("the leased drive is kept");
    assert_eq!(blob["lease"], "leased");
    assert!(
        mount.log_text().contains("blobdrive break-lease"),
        "the log names the command: {}",
        mount.log_text()
    );
    sdk(&["break", &c, "leased.vhd"]);
    std::fs::remove_file(mount.path("leased.vhd")).expect("rm once the lease is broken");
    assert!(sdk_blob(&c, "leased.vhd").is_none());

    // Open read-write here (this mount holds the lease): EBUSY too.
    let held = OpenOptions::new()
        .write(true)
        .open(mount.path("plain.vhd"))
        .expect("open plain.vhd read-write");
    expect_errno(
        "rm of a drive open here",
        std::fs::remove_file(mount.path("plain.vhd")),
        libc::EBUSY,
    );
    drop(held);

    // With a snapshot: ENOTEMPTY until the snapshot is removed (rm NAME@TIME).
    let time = sdk(&["snapshot", &c, "snapped.vhd"]);
    std::thread::sleep(std::time::Duration::from_secs(6)); // the listing cache
    expect_errno(
        "rm of a drive with a snapshot",
        std::fs::remove_file(mount.path("snapped.vhd")),
        libc::ENOTEMPTY,
    );
    assert!(sdk_blob(&c, "snapped.vhd").is_some());
    std::fs::remove_file(mount.path(&format!("snapped.vhd@{time}"))).expect("rm of the snapshot");
    std::fs::remove_file(mount.path("snapped.vhd")).expect("rm once the snapshot is gone");
    assert!(sdk_blob(&c, "snapped.vhd").is_none());

    // A block blob is read-only here: EPERM, kept.
    expect_errno(
        "rm of a block blob",
        std::fs::remove_file(mount.path("notes.txt")),
        libc::EPERM,
    );
    assert!(sdk_blob(&c, "notes.txt").is_some());

    std::fs::remove_file(mount.path("plain.vhd")).expect("rm of a plain drive");
    assert!(sdk_blob(&c, "plain.vhd").is_none());
    mount.unmount();
}

#[test]
fn mkdir_and_rmdir_at_the_top_make_and_remove_containers() {
    if !can_run(
        "mkdir_and_rmdir_at_the_top_make_and_remove_containers",
        false,
    ) {
        return;
    }
    let rt = runtime();
    // Its drive keeps a container of this test in the account; the guard
    // removes it and the one made through the mount if the test fails.
    let guard = rt.block_on(ContainerGuard::new("ns-top"));
    let made = ContainerGuard {
        client: guard.client.clone(),
        name: common::unique_name("ns-mkdir"),
    };
    let sandbox = Sandbox::new(common::connection_string());
    let mount = sandbox.mount("account", None, &[]);

    expect_errno(
        "mkdir of a bad container name",
        std::fs::create_dir(mount.path("Bad_Name")),
        libc::EINVAL,
    );
    assert!(
        mount.log_text().contains("invalid container name"),
        "{}",
        mount.log_text()
    );
    std::fs::create_dir(mount.path(&made.name)).expect("mkdir makes a container");
    assert!(sdk_container_exists(&made.name));
    expect_errno(
        "mkdir of an existing container",
        std::fs::create_dir(mount.path(&made.name)),
        libc::EEXIST,
    );
    let (ok, err) = tool(
        "truncate",
        &[
            "-s",
            "16M",
            &mount
                .path(&format!("{}/d.vhd", made.name))
                .to_string_lossy(),
        ],
    );
    assert!(ok, "truncate in the new container: {err}");
    expect_errno(
        "rmdir of a container holding a drive",
        std::fs::remove_dir(mount.path(&made.name)),
        libc::ENOTEMPTY,
    );
    assert!(sdk_container_exists(&made.name));
    std::fs::remove_file(mount.path(&format!("{}/d.vhd", made.name))).expect("rm the drive");
    std::fs::remove_dir(mount.path(&made.name)).expect("rmdir of the empty container");
    assert!(!sdk_container_exists(&made.name));
    expect_errno(
        "creating a file at the top",
        std::fs::File::create(mount.path("top.vhd")),
        libc::EPERM,
    );
    mount.unmount();
}

#[test]
fn no_operation_answers_enosys_and_the_refused_ones_say_why() {
    if !can_run(
        "no_operation_answers_enosys_and_the_refused_ones_say_why",
        false,
    ) {
        return;
    }
    let rt = runtime();
    let guard = rt.block_on(ContainerGuard::new("ns-enosys"));
    let c = guard.name.clone();
    rt.block_on(make_drive(&guard.client, &guard.path("d.vhd"), 16 * MIB));
    let sandbox = Sandbox::new(common::connection_string());
    let mount = sandbox.mount("ns", Some(&c), &[]);
    let d = mount.path("d.vhd");

    // The system calls, errno by errno.
    expect_errno(
        "rename",
        std::fs::rename(&d, mount.path("e.vhd")),
        libc::EPERM,
    );
    expect_errno(
        "link",
        std::fs::hard_link(&d, mount.path("e.vhd")),
        libc::EPERM,
    );
    expect_errno(
        "symlink",
        std::os::unix::fs::symlink("d.vhd", mount.path("s.vhd")),
        libc::EPERM,
    );
    expect_errno("mknod", mknod_fifo(&mount.path("p.vhd")), libc::EPERM);
    expect_errno(
        "setxattr of blobdrive's attribute",
        setxattr(&d, "user.blobdrive.lease", b"x"),
        libc::EPERM,
    );
    expect_errno(
        "setxattr of another name",
        setxattr(&d, "user.note", b"x"),
        libc::EOPNOTSUPP,
    );
    expect_errno(
        "getxattr of a name it has not",
        getxattr(&d, "user.note"),
        libc::ENODATA,
    );
    assert!(
        sdk_blob(&c, "d.vhd").is_some(),
        "the refused changes kept the drive"
    );

    // The attributes show what info shows.
    assert_eq!(
        getxattr(&d, "user.blobdrive.lease").expect("lease"),
        "available"
    );
    assert_eq!(
        getxattr(&d, "user.blobdrive.snapshots").expect("snapshots"),
        "0"
    );
    assert_eq!(
        getxattr(&d, "user.blobdrive.stored_bytes").expect("stored"),
        "512"
    );
    let (ok, err) = tool("getfattr", &["-d", &d.to_string_lossy()]);
    assert!(ok, "getfattr -d: {err}");

    // The commands the README lists: none says "Function not implemented".
    let p = |name: &str| mount.path(name).to_string_lossy().into_owned();
    let commands: Vec<(&str, Vec<String>)> = vec![
        ("touch", vec![p("a.vhd")]),
        ("touch", vec![p("d.vhd")]),
        ("truncate", vec!["-s".into(), "16M".into(), p("b.vhd")]),
        ("fallocate", vec!["-l".into(), "16M".into(), p("c.vhd")]),
        ("mkdir", vec![p("dir")]),
        ("rmdir", vec![p("dir")]),
        ("rm", vec![p("b.vhd")]),
        ("mv", vec![p("c.vhd"), p("moved.vhd")]),
        ("ln", vec![p("c.vhd"), p("hard.vhd")]),
        ("ln", vec!["-s".into(), "c.vhd".into(), p("soft.vhd")]),
        ("chmod", vec!["600".into(), p("c.vhd")]),
        ("chown", vec!["0:0".into(), p("c.vhd")]),
        (
            "setfattr",
            vec![
                "-n".into(),
                "user.note".into(),
                "-v".into(),
                "1".into(),
                p("c.vhd"),
            ],
        ),
        ("rm", vec![p("c.vhd")]),
    ];
    for (program, args) in &commands {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (_, err) = tool(program, &args);
        assert!(
            !err.contains("Function not implemented"),
            "{program} {args:?} answered ENOSYS: {err}"
        );
    }
    assert!(sdk_blob(&c, "b.vhd").is_none(), "rm removed b.vhd");
    assert!(sdk_blob(&c, "c.vhd").is_none(), "rm removed c.vhd");
    assert!(sdk_blob(&c, "moved.vhd").is_none(), "mv made nothing");
    let log = mount.log_text();
    assert!(
        log.contains("'blobdrive copy"),
        "the rename refusal says what would do it: {log}"
    );
    mount.unmount();
}

#[test]
fn a_read_only_namespace_mount_answers_erofs_to_every_change() {
    if !can_run(
        "a_read_only_namespace_mount_answers_erofs_to_every_change",
        false,
    ) {
        return;
    }
    let rt = runtime();
    let guard = rt.block_on(ContainerGuard::new("ns-ro"));
    let c = guard.name.clone();
    rt.block_on(make_drive(&guard.client, &guard.path("d.vhd"), 16 * MIB));
    let sandbox = Sandbox::new(common::connection_string());
    let mount = sandbox.mount("ro", Some(&c), &["--read-only"]);
    let d = mount.path("d.vhd");
    let erofs = libc::EROFS;
    expect_errno("create", std::fs::File::create(mount.path("n.vhd")), erofs);
    expect_errno("mkdir", std::fs::create_dir(mount.path("dir")), erofs);
    expect_errno("rm", std::fs::remove_file(&d), erofs);
    expect_errno("rename", std::fs::rename(&d, mount.path("e.vhd")), erofs);
    expect_errno("link", std::fs::hard_link(&d, mount.path("e.vhd")), erofs);
    expect_errno(
        "symlink",
        std::os::unix::fs::symlink("d.vhd", mount.path("s.vhd")),
        erofs,
    );
    expect_errno(
        "chmod",
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o600)),
        erofs,
    );
    expect_errno(
        "chown",
        std::os::unix::fs::chown(&d, Some(0), Some(0)),
        erofs,
    );
    expect_errno(
        "setxattr",
        setxattr(&d, "user.blobdrive.lease", b"x"),
        erofs,
    );
    expect_errno(
        "open for writing",
        OpenOptions::new().write(true).open(&d).map(|_| ()),
        erofs,
    );
    let rmdir = std::fs::remove_dir(mount.path("nothing"));
    assert!(
        matches!(
            rmdir.as_ref().map_err(|e| e.kind()),
            Err(ErrorKind::NotFound)
        ) || rmdir.as_ref().err().and_then(|e| e.raw_os_error()) == Some(erofs),
        "rmdir: {rmdir:?}"
    );
    assert_eq!(
        getxattr(&d, "user.blobdrive.lease").expect("attributes read on a read-only mount"),
        "available"
    );
    assert!(sdk_blob(&c, "d.vhd").is_some());
    mount.unmount();
}
