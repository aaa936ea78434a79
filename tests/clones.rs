//! A clone attaches beside its source: a `copy` of an XFS drive, attached
//! read-write while its source is attached read-write, and a snapshot of
//! it attached read-only at the same time, all mounted and readable (XFS
//! refuses a second filesystem with a mounted one's UUID unless told
//! `nouuid`). Real Azurite, FUSE, loop devices and XFS, through the binary.
//!
//! Prints `SKIPPED` without root, /dev/fuse, loop devices or mkfs.xfs (a
//! failure under `BLOBDRIVE_REQUIRE_FUSE=1`); guards unmount everything.

mod common;
mod mount_support;
mod system;

use common::ContainerGuard;
use mount_support::*;

#[test]
fn an_xfs_copy_and_a_snapshot_attach_beside_their_source() {
    if !can_run(
        "an_xfs_copy_and_a_snapshot_attach_beside_their_source",
        true,
    ) {
        return;
    }
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let guard = rt.block_on(ContainerGuard::new("clone-xfs"));
    let source = format!("{}/src.vhd", guard.name);
    let copy = format!("{}/copy.vhd", guard.name);
    let sandbox = Sandbox::new(common::connection_string());
    sandbox.blobdrive_ok(&["create", &source, "--size", "320M", "--mkfs", "xfs"]);

    let src = sandbox.mount("src", Some(&source), &[]);
    std::fs::write(src.path("hello.txt"), b"from the source").expect("write");
    run("sync", &[]);
    sandbox.blobdrive_ok(&["copy", &source, &copy]);

    let (clone, told) = sandbox.mount_telling("copy", Some(&copy), &[]);
    assert_eq!(
        std::fs::read(clone.path("hello.txt")).expect("read in the copy"),
        b"from the source"
    );
    assert!(
        told.contains("blobdrive: warning: drive") && told.contains("mounted with nouuid"),
        "mount says it used nouuid: {told:?}"
    );
    std::fs::write(clone.path("only-in-copy.txt"), b"x").expect("write in the copy");
    assert!(!src.path("only-in-copy.txt").exists());

    let time = sandbox
        .blobdrive_ok(&["snapshot", &source])
        .trim()
        .to_string();
    let snap = sandbox.mount("snap", Some(&source), &["--snapshot", &time]);
    assert_eq!(
        std::fs::read(snap.path("hello.txt")).expect("read in the snapshot"),
        b"from the source"
    );
    snap.unmount();
    clone.unmount();
    src.unmount();
}

/// The loop device under attach directory `dir` (`list --mounted --json`).
fn loop_device_of(sandbox: &Sandbox, dir: &std::path::Path) -> String {
    let out = sandbox.blobdrive_ok(&["list", "--mounted", "--json"]);
    let list: serde_json::Value = serde_json::from_str(&out).expect("list --mounted --json");
    let dir = dir.canonicalize().expect("attach dir");
    list.as_array()
        .expect("an array")
        .iter()
        .find(|e| e["dir"].as_str().map(std::path::Path::new) == Some(dir.as_path()))
        .and_then(|e| e["loop_device"].as_str())
        .unwrap_or_else(|| panic!("{} is not in {out}", dir.display()))
        .to_string()
}

fn blkid_uuid(device: &str) -> String {
    run("blkid", &["-p", "-o", "value", "-s", "UUID", device])
        .trim()
        .to_string()
}

#[test]
fn copy_new_uuid_gives_the_copy_its_own_filesystem_uuids() {
    if !can_run(
        "copy_new_uuid_gives_the_copy_its_own_filesystem_uuids",
        true,
    ) {
        return;
    }
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let guard = rt.block_on(ContainerGuard::new("clone-uuid"));
    let sandbox = Sandbox::new(common::connection_string());
    let cases: [(&str, &[&str]); 2] = [
        ("xfs", &["--mkfs", "xfs"]),
        ("gpt-ext4", &["--mkfs", "ext4", "--partition-table", "gpt"]),
    ];
    for (name, layout) in cases {
        let source = format!("{}/{name}.vhd", guard.name);
        let copy = format!("{}/{name}-copy.vhd", guard.name);
        let mut create = vec!["create", source.as_str(), "--size", "320M"];
        create.extend(layout);
        sandbox.blobdrive_ok(&create);
        let src = sandbox.mount(&format!("{name}-src"), Some(&source), &[]);
        std::fs::write(src.path("hello.txt"), b"from the source").expect("write");
        run("sync", &[]);
        let out = sandbox.blobdrive_ok(&["copy", &source, &copy, "--new-uuid"]);
        assert!(out.contains("new UUID"), "{name}: {out}");
        let (clone, told) = sandbox.mount_telling(&format!("{name}-copy"), Some(&copy), &[]);
        assert!(
            !told.contains("nouuid"),
            "{name}: the copy needed no nouuid: {told}"
        );
        assert_eq!(
            std::fs::read(clone.path("hello.txt")).expect("read in the copy"),
            b"from the source"
        );
        let (a, b) = (
            blkid_uuid(&loop_device_of(&sandbox, &src.dir)),
            blkid_uuid(&loop_device_of(&sandbox, &clone.dir)),
        );
        assert!(!a.is_empty() && !b.is_empty(), "{name}: UUIDs {a:?} {b:?}");
        assert_ne!(a, b, "{name}: the copy has its own UUID");
        clone.unmount();
        src.unmount();
    }
}
