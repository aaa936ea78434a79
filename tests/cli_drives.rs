//! The drive commands as a user meets them: the real binary against Azurite
//! (`create`, `info`, `list`, `snapshot`, `break-lease`, `delete`), checked
//! from outside with the official Python SDK and qemu-img.
//!
//! Each test gets its own container. Tests that need qemu-img print
//! `SKIPPED: <why>` when it is missing, unless `BLOBDRIVE_REQUIRE_FUSE=1`.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Instant;

use blobdrive::blob::BlobPath;
use blobdrive::units::{ByteRange, MIB, TIB};
use bytes::Bytes;
use common::{python, ContainerGuard};
use serde_json::Value;

// ---- running the binary -------------------------------------------------

fn blobdrive(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_blobdrive"))
        .args(args)
        .env(
            "AZURE_STORAGE_CONNECTION_STRING",
            common::connection_string(),
        )
        .env_remove("RUST_LOG")
        .output()
        .expect("blobdrive runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Run, expect success, return stdout.
fn ok(args: &[&str]) -> String {
    let out = blobdrive(args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Run, expect exit `code` with exactly one `blobdrive: ` line on stderr and
/// no panic; return (that line, stdout).
fn fails(args: &[&str], code: i32) -> (String, String) {
    let out = blobdrive(args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: not one line: {err:?}");
    assert!(err.starts_with("blobdrive: "), "{args:?}: {err}");
    (err.trim_end().to_string(), text(&out.stdout))
}

fn json(args: &[&str]) -> Value {
    let out = ok(args);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {out}"))
}

// ---- outside tools ------------------------------------------------------

/// Upload FILE as a page blob C/B, padded with zeros to a multiple of 512;
/// all-zero 4 MiB chunks are skipped (they read as zeros anyway).
const PY_UPLOAD_PAGE_BLOB: &str = r#"
import os, sys
from azure.storage.blob import BlobClient
data = open(sys.argv[1], "rb").read()
data += b"\0" * (-len(data) % 512)
b = BlobClient.from_connection_string(os.environ["CS"], sys.argv[2], sys.argv[3])
b.create_page_blob(size=len(data))
chunk = 4 * 1024 * 1024
for off in range(0, len(data), chunk):
    part = data[off:off + chunk]
    if part.count(0) != len(part):
        b.upload_page(part, offset=off, length=len(part))
print(len(data))
"#;

/// Download C/B into FILE.
const PY_DOWNLOAD: &str = r#"
import os, sys
from azure.storage.blob import BlobClient
b = BlobClient.from_connection_string(os.environ["CS"], sys.argv[1], sys.argv[2])
with open(sys.argv[3], "wb") as f:
    b.download_blob().readinto(f)
print(os.path.getsize(sys.argv[3]))
"#;

/// Names (and snapshot times) of every blob in C whose name is B.
const PY_VERSIONS: &str = r#"
import os, sys
from azure.storage.blob import ContainerClient
c = ContainerClient.from_connection_string(os.environ["CS"], sys.argv[1])
print(sum(1 for b in c.list_blobs(name_starts_with=sys.argv[2], include=["snapshots"]) if b.name == sys.argv[2]))
"#;

/// True when qemu-img runs; otherwise prints why (or fails under CI).
fn have_qemu_img() -> bool {
    let ok = Command::new("qemu-img")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("BLOBDRIVE_REQUIRE_FUSE").is_none(),
            "qemu-img is required (apt-get install qemu-utils)"
        );
        println!("SKIPPED: qemu-img not installed (apt-get install qemu-utils)");
    }
    ok
}

fn qemu_img(args: &[&str]) -> String {
    let out = Command::new("qemu-img")
        .args(args)
        .output()
        .expect("qemu-img runs");
    assert!(
        out.status.success(),
        "qemu-img {args:?}: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// A raw 32 MiB image with a recognisable pattern in a few places.
fn raw_image(dir: &Path) -> std::path::PathBuf {
    let raw = dir.join("disk.raw");
    let mut data = vec![0u8; 32 * MIB as usize];
    for (i, b) in data[..64 * 1024].iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    let mid = 20 * MIB as usize;
    data[mid..mid + 4096].fill(0xa5);
    std::fs::write(&raw, &data).expect("write raw image");
    raw
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

// ---- the tests ----------------------------------------------------------

#[tokio::test]
async fn created_drive_is_read_by_qemu_img_as_a_fixed_vhd_of_the_same_size() {
    let qemus = common::qemu::qemu_imgs(
        "created_drive_is_read_by_qemu_img_as_a_fixed_vhd_of_the_same_size",
    );
    if qemus.is_empty() {
        return;
    }
    let c = ContainerGuard::new("cli-roundtrip").await;
    let name = format!("{}/disk.vhd", c.name);
    let out = ok(&["create", &name, "--size", "64M"]);
    assert!(out.contains(&name) && out.contains("64.0 MiB"), "{out}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("down.vhd");
    let size = python(PY_DOWNLOAD, &[&c.name, "disk.vhd", s(&file)]);
    assert_eq!(size, (64 * MIB + 512).to_string());
    // Every qemu in use, 7.2 (Debian 12) included, reads it at its size.
    for qemu in &qemus {
        let out = Command::new(qemu)
            .args(["info", "-f", "vpc", "--output=json", s(&file)])
            .output()
            .expect("qemu-img runs");
        assert!(out.status.success(), "{}", text(&out.stderr));
        let info: Value = serde_json::from_str(&text(&out.stdout)).expect("qemu-img JSON");
        assert_eq!(info["format"], "vpc", "{} {info}", qemu.display());
        assert_eq!(info["virtual-size"], 64 * MIB, "{} {info}", qemu.display());
    }
}

#[tokio::test]
async fn qemu_fixed_vhd_uploaded_with_the_sdk_is_a_drive() {
    if !have_qemu_img() {
        return;
    }
    let c = ContainerGuard::new("cli-qemu").await;
    let dir = tempfile::tempdir().unwrap();
    let raw = raw_image(dir.path());
    let vhd = dir.path().join("disk.vhd");
    qemu_img(&[
        "convert",
        "-f",
        "raw",
        "-O",
        "vpc",
        "-o",
        "subformat=fixed,force_size=on",
        s(&raw),
        s(&vhd),
    ]);
    python(PY_UPLOAD_PAGE_BLOB, &[s(&vhd), &c.name, "qemu.vhd"]);
    let name = format!("{}/qemu.vhd", c.name);
    let info = json(&["info", &name, "--json"]);
    assert_eq!(info["is_drive"], true, "{info}");
    assert_eq!(info["virtual_size_bytes"], 32 * MIB, "{info}");
    assert_eq!(info["blob_size_bytes"], 32 * MIB + 512, "{info}");
    assert_eq!(info["disk_type"], "fixed");
    assert!(info["creator_app"].as_str().unwrap().starts_with("qem"));
    // The data pages plus the footer, not the whole disk.
    let stored = info["stored_bytes"].as_u64().unwrap();
    assert!(
        (64 * 1024 + 4096 + 512..32 * MIB).contains(&stored),
        "{stored}"
    );
    let human = ok(&["info", &name]);
    assert!(human.contains("32.0 MiB (33554432 bytes)"), "{human}");
    let list = json(&["list", &c.name, "--json"]);
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list[0]["name"], name.as_str());
    assert_eq!(list[0]["size_bytes"], 32 * MIB);
}

#[tokio::test]
async fn new_one_tib_drive_stores_only_its_footer_and_is_created_fast() {
    let c = ContainerGuard::new("cli-1t").await;
    let name = format!("{}/big.vhd", c.name);
    let started = Instant::now();
    ok(&["create", &name, "--size", "1T"]);
    let took = started.elapsed();
    println!("create of a 1 TiB drive took {:.3} s", took.as_secs_f64());
    // The process start is in it too; "well under a second" on Azurite.
    assert!(took.as_secs_f64() < 1.0, "create took {took:?}");
    let info = json(&["info", &name, "--json"]);
    assert_eq!(info["virtual_size_bytes"], TIB, "{info}");
    assert_eq!(info["stored_bytes"], 512, "{info}");
    assert_eq!(info["creator_app"], "win");
    let human = ok(&["info", &name]);
    assert!(human.contains("stored         512 B"), "{human}");
}

#[tokio::test]
async fn create_never_replaces_an_existing_blob() {
    let c = ContainerGuard::new("cli-exists").await;
    let path = c.path("taken.vhd");
    c.client.create_page_blob(&path, MIB).await.unwrap();
    let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
    c.client
        .put_pages(&path, 4096, Bytes::from(data), None)
        .await
        .unwrap();
    let before = c
        .client
        .get_blob_range(&path, ByteRange::new(0, MIB))
        .await
        .unwrap();
    let etag = c.client.get_properties(&path).await.unwrap().etag;

    let name = format!("{}/taken.vhd", c.name);
    let (err, _) = fails(&["create", &name, "--size", "16M"], 1);
    assert!(
        err.contains("already exists") && err.contains(&name),
        "{err}"
    );

    let props = c.client.get_properties(&path).await.unwrap();
    assert_eq!(props.content_length, MIB, "size changed");
    assert_eq!(props.etag, etag, "blob was written");
    let after = c
        .client
        .get_blob_range(&path, ByteRange::new(0, MIB))
        .await
        .unwrap();
    assert_eq!(before, after, "bytes changed");
}

#[tokio::test]
async fn a_url_naming_another_account_is_refused_not_served_by_this_one() {
    // A drive of this account, and URLs naming a blob of the same name in
    // other accounts: without their SAS they would be read, resized or
    // copied here instead.
    let c = ContainerGuard::new("cli-url").await;
    let name = format!("{}/d.vhd", c.name);
    ok(&["create", &name, "--size", "16M"]);
    let etag = c
        .client
        .get_properties(&c.path("d.vhd"))
        .await
        .unwrap()
        .etag;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d.img");
    let endpoint = common::account().endpoint;
    let own = format!("{}/{name}", endpoint.as_str().trim_end_matches('/'));
    let mut other_port = endpoint.clone();
    other_port
        .set_port(Some(endpoint.port_or_known_default().unwrap() + 1))
        .unwrap();
    let mut elsewhere = vec![
        format!("https://evil.blob.core.windows.net/{name}"),
        format!("{}/{name}", other_port.as_str().trim_end_matches('/')),
    ];
    if endpoint.path().len() > 1 {
        // Path style (Azurite): the first segment names the account.
        elsewhere.push(own.replacen(endpoint.path(), "/otheraccount", 1));
    }
    for url in &elsewhere {
        for args in [
            vec!["download", url.as_str(), s(&file)],
            vec!["info", url.as_str()],
            vec!["resize", url.as_str(), "--size", "32M"],
            vec![
                "restore",
                url.as_str(),
                "--snapshot",
                "2026-01-01T00:00:00.0000000Z",
            ],
            vec![
                "diff",
                url.as_str(),
                "--from",
                "2026-01-01T00:00:00.0000000Z",
            ],
            vec!["key", "dump", url.as_str(), "--key-file", "/dev/null"],
            vec!["copy", url.as_str(), &format!("{}/copy.vhd", c.name)],
            vec!["delete", url.as_str()],
        ] {
            let (err, _) = fails(&args, 1);
            assert!(err.contains("names the account at"), "{args:?}: {err}");
        }
    }
    assert!(!file.exists(), "nothing downloaded");
    let props = c.client.get_properties(&c.path("d.vhd")).await.unwrap();
    assert_eq!((props.etag, props.content_length), (etag, 16 * MIB + 512));
    assert!(c.client.get_properties(&c.path("copy.vhd")).await.is_err());
    // The URL of this account's own drive works as its C/B does.
    assert!(ok(&["info", &own]).contains("16.0 MiB"));
}

#[tokio::test]
async fn bad_sizes_are_refused_before_anything_is_created() {
    let c = ContainerGuard::new("cli-sizes").await;
    let name = format!("{}/d.vhd", c.name);
    for (size, expected) in [
        ("1000000000", "use 953M or 954M"),
        ("16M1K", "invalid size"),
        ("1M", "smallest drive is 16M"),
        ("8T", "largest drive is 8388607M"),
    ] {
        let (err, _) = fails(&["create", &name, "--size", size], 2);
        assert!(err.contains(expected), "{size}: {err}");
    }
    // --mkfs works (tests/attach.rs); a filesystem it cannot make is refused first.
    let (err, _) = fails(&["create", &name, "--size", "16M", "--mkfs", "btrfs"], 2);
    assert!(err.contains("btrfs"), "{err}");
    assert!(c.client.get_properties(&c.path("d.vhd")).await.is_err());
}

#[tokio::test]
async fn block_blob_is_not_a_drive() {
    let c = ContainerGuard::new("cli-block").await;
    c.client
        .put_block_blob(&c.path("notes.txt"), Bytes::from_static(b"hello"))
        .await
        .unwrap();
    let name = format!("{}/notes.txt", c.name);
    let (err, out) = fails(&["info", &name], 1);
    assert_eq!(
        err,
        format!(
            "blobdrive: {name} is a block blob, not a drive (page blob with a fixed VHD footer)"
        )
    );
    assert!(out.is_empty());
    let (err, _) = fails(&["delete", &name], 1);
    assert!(err.contains("--force"), "{err}");
    let (err, _) = fails(&["snapshot", &name], 1);
    assert!(err.contains("not a drive"), "{err}");
    assert_eq!(json(&["list", &c.name, "--json"]), Value::Array(vec![]));
    let all = json(&["list", &c.name, "--json", "--all"]);
    assert_eq!(all[0]["is_drive"], false);
    assert_eq!(all[0]["note"], "block blob, not a drive");
    ok(&["delete", &name, "--force"]);
}

#[tokio::test]
async fn page_blob_without_footer_is_not_a_drive() {
    let c = ContainerGuard::new("cli-nofooter").await;
    c.client
        .create_page_blob(&c.path("empty.vhd"), 16 * MIB + 512)
        .await
        .unwrap();
    let name = format!("{}/empty.vhd", c.name);
    let (err, out) = fails(&["info", &name], 1);
    assert!(
        err.contains("is not a drive") && err.contains("no VHD footer"),
        "{err}"
    );
    // What info knows is still shown.
    assert!(
        out.contains("not a drive") && out.contains("blob size"),
        "{out}"
    );
    let out = blobdrive(&["info", &name, "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON even for a non-drive");
    assert_eq!(v["is_drive"], false);
    assert!(v["problem"].as_str().unwrap().contains("no VHD footer"));
    assert_eq!(v["virtual_size_bytes"], Value::Null);
    assert_eq!(json(&["list", &c.name, "--json"]), Value::Array(vec![]));
}

#[tokio::test]
async fn corrupted_footer_checksum_is_detected() {
    let c = ContainerGuard::new("cli-checksum").await;
    let name = format!("{}/bad.vhd", c.name);
    ok(&["create", &name, "--size", "16M"]);
    let path = c.path("bad.vhd");
    let range = ByteRange::new(16 * MIB, 16 * MIB + 512);
    let mut footer = c
        .client
        .get_blob_range(&path, range)
        .await
        .unwrap()
        .to_vec();
    footer[40] ^= 0x01; // original size: covered by the checksum
    c.client
        .put_pages(&path, 16 * MIB, Bytes::from(footer), None)
        .await
        .unwrap();
    let (err, _) = fails(&["info", &name], 1);
    assert!(err.contains("corrupted VHD footer"), "{err}");
    assert_eq!(json(&["list", &c.name, "--json"]), Value::Array(vec![]));
    let all = ok(&["list", &c.name, "--all"]);
    assert!(all.contains("corrupted VHD footer"), "{all}");
}

#[tokio::test]
async fn dynamic_vhd_is_refused() {
    if !have_qemu_img() {
        return;
    }
    let c = ContainerGuard::new("cli-dynamic").await;
    let dir = tempfile::tempdir().unwrap();
    let raw = raw_image(dir.path());
    let vhd = dir.path().join("dyn.vhd");
    qemu_img(&[
        "convert",
        "-f",
        "raw",
        "-O",
        "vpc",
        "-o",
        "subformat=dynamic",
        s(&raw),
        s(&vhd),
    ]);
    python(PY_UPLOAD_PAGE_BLOB, &[s(&vhd), &c.name, "dyn.vhd"]);
    let name = format!("{}/dyn.vhd", c.name);
    let (err, _) = fails(&["info", &name], 1);
    assert!(err.contains("dynamic") && err.contains("fixed"), "{err}");
}

#[tokio::test]
async fn leased_drive_is_shown_leased_and_deletable_only_after_break_lease() {
    let c = ContainerGuard::new("cli-lease").await;
    let name = format!("{}/locked.vhd", c.name);
    ok(&["create", &name, "--size", "16M"]);
    let path = c.path("locked.vhd");
    c.client
        .acquire_lease(&path, &uuid::Uuid::new_v4().to_string(), None)
        .await
        .unwrap();

    let info = json(&["info", &name, "--json"]);
    assert_eq!(info["lease_state"], "leased", "{info}");
    assert_eq!(info["lease_status"], "locked");
    assert_eq!(info["lease_duration"], "infinite");
    let list = json(&["list", &c.name, "--json"]);
    assert_eq!(list[0]["lease_state"], "leased", "{list}");
    assert!(ok(&["list", &c.name]).contains("leased (infinite)"));

    let (err, _) = fails(&["delete", &name], 1);
    assert_eq!(
        err,
        format!("blobdrive: drive {name} is mounted (leased); unmount it first or run 'blobdrive break-lease {name}' if that host is gone")
    );
    let (err, _) = fails(&["delete", &name, "--force", "--include-snapshots"], 1);
    assert!(err.contains("is mounted (leased)"), "{err}");
    assert!(c.client.get_properties(&path).await.is_ok(), "deleted");

    let out = ok(&["break-lease", &name]);
    assert!(out.starts_with("broke the lease on"), "{out}");
    let out = ok(&["break-lease", &name]);
    assert!(out.contains("was not leased"), "{out}");
    assert_eq!(json(&["info", &name, "--json"])["lease_state"], "broken");
    ok(&["delete", &name]);
    let (err, _) = fails(&["info", &name], 1);
    assert!(err.contains("does not exist"), "{err}");
}

#[tokio::test]
async fn snapshot_time_is_accepted_by_info_and_listed_by_the_base() {
    let c = ContainerGuard::new("cli-snap").await;
    let name = format!("{}/snap.vhd", c.name);
    ok(&["create", &name, "--size", "16M"]);
    let out = ok(&["snapshot", &name]);
    assert_eq!(out.lines().count(), 1, "{out:?}");
    let time = out.trim();
    // Data written after the snapshot is not in it.
    c.client
        .put_pages(&c.path("snap.vhd"), 0, Bytes::from(vec![7u8; 4096]), None)
        .await
        .unwrap();

    let snap = json(&["info", &name, "--snapshot", time, "--json"]);
    assert_eq!(snap["snapshot"], time, "{snap}");
    assert_eq!(snap["is_drive"], true);
    assert_eq!(snap["stored_bytes"], 512);
    let base = json(&["info", &name, "--json"]);
    assert_eq!(base["snapshots"], serde_json::json!([time]), "{base}");
    assert_eq!(base["stored_bytes"], 4096 + 512);
    assert!(ok(&["info", &name]).contains(time));
    assert_eq!(json(&["list", &c.name, "--json"])[0]["snapshots"], 1);
    let (err, _) = fails(
        &["info", &name, "--snapshot", "2001-01-01T00:00:00.0000000Z"],
        1,
    );
    assert!(err.contains("does not exist"), "{err}");

    let (err, _) = fails(&["delete", &name], 1);
    assert!(
        err.contains("has 1 snapshot;") && err.contains("--include-snapshots"),
        "{err}"
    );
    let out = ok(&["delete", &name, "--include-snapshots"]);
    assert!(out.contains("and its snapshot"), "{out}");
    assert_eq!(python(PY_VERSIONS, &[&c.name, "snap.vhd"]), "0");
}

#[tokio::test]
async fn list_json_has_the_documented_keys() {
    let c = ContainerGuard::new("cli-listjson").await;
    for (blob, size) in [("b.vhd", "32M"), ("a/deep.vhd", "16M")] {
        ok(&["create", &format!("{}/{blob}", c.name), "--size", size]);
    }
    c.client
        .put_block_blob(&c.path("readme.txt"), Bytes::from_static(b"x"))
        .await
        .unwrap();
    let keys = [
        "name",
        "container",
        "blob",
        "is_drive",
        "size_bytes",
        "blob_size_bytes",
        "lease_state",
        "lease_duration",
        "snapshots",
        "stored_bytes",
        "note",
    ];
    let list = json(&["list", &c.name, "--json"]);
    let rows = list.as_array().expect("an array");
    assert_eq!(rows.len(), 2, "{list}");
    for row in rows {
        let mut got: Vec<&str> = row
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        got.sort_unstable();
        let mut want = keys.to_vec();
        want.sort_unstable();
        assert_eq!(got, want);
        assert_eq!(row["is_drive"], true);
        assert_eq!(row["stored_bytes"], 512);
        assert_eq!(row["lease_state"], "available");
    }
    assert_eq!(rows[0]["blob"], "a/deep.vhd");
    assert_eq!(rows[1]["size_bytes"], 32 * MIB);
    let human = ok(&["list", &c.name]);
    assert!(
        human.contains("STORED") && human.contains("512 B"),
        "{human}"
    );
    // --no-stored skips the page-range queries; --stored is still accepted.
    let fast = json(&["list", &c.name, "--json", "--no-stored"]);
    assert_eq!(fast[0]["stored_bytes"], Value::Null, "{fast}");
    assert_eq!(json(&["list", &c.name, "--json", "--stored"]), list);
    // Every container: ours are in it too.
    let all = json(&["list", "--json"]);
    let names: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert!(names.contains(&format!("{}/b.vhd", c.name).as_str()));
    let table = ok(&["list", &c.name]);
    assert!(table.starts_with("NAME"), "{table}");
    assert!(table.contains("32.0 MiB"), "{table}");
}

#[tokio::test]
async fn wrong_key_gives_one_line_naming_the_account_not_the_key() {
    let c = ContainerGuard::new("cli-auth").await;
    let name = format!("{}/d.vhd", c.name);
    ok(&["create", &name, "--size", "16M"]);
    let account = common::account();
    let wrong_key = "d3JvbmcgYnV0IHZhbGlkIGJhc2U2NCBrZXkgZm9yIHRlc3Rpbmc=";
    let cs = format!(
        "DefaultEndpointsProtocol=http;AccountName={};AccountKey={wrong_key};BlobEndpoint={}",
        account.name,
        common::azurite_url()
    );
    let (err, _) = fails(&["info", &name, "--connection-string", &cs], 1);
    assert!(err.contains(&account.name), "{err}");
    assert!(!err.contains(wrong_key), "{err}");
    let path: BlobPath = c.path("d.vhd");
    assert!(c.client.get_properties(&path).await.is_ok());
}

/// An account SAS with `sp=cdr` (create, delete, read, but no write) for the
/// test account: Put Blob is allowed, Put Page is refused.
const PY_SAS_WITHOUT_WRITE: &str = r#"
import os, datetime
from azure.storage.blob import BlobServiceClient, generate_account_sas, ResourceTypes, AccountSasPermissions
s = BlobServiceClient.from_connection_string(os.environ["CS"])
print(generate_account_sas(s.account_name, s.credential.account_key,
    ResourceTypes(container=True, object=True),
    AccountSasPermissions(create=True, delete=True, read=True),
    datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)))
"#;

#[tokio::test]
async fn failed_footer_write_deletes_the_blob_it_created() {
    let c = ContainerGuard::new("cli-nofooterwrite").await;
    let sas = python(PY_SAS_WITHOUT_WRITE, &[]);
    let cs = format!(
        "BlobEndpoint={};SharedAccessSignature={sas}",
        common::azurite_url()
    );
    let name = format!("{}/half.vhd", c.name);
    let (err, out) = fails(
        &["create", &name, "--size", "16M", "--connection-string", &cs],
        1,
    );
    assert!(out.is_empty());
    assert!(
        err.contains("writing the VHD footer") && err.contains("the empty blob was deleted again"),
        "{err}"
    );
    let sig = sas
        .split('&')
        .find_map(|kv| kv.strip_prefix("sig="))
        .expect("SAS has a signature");
    assert!(!err.contains(sig), "signature leaked: {err}");
    let e = c
        .client
        .get_properties(&c.path("half.vhd"))
        .await
        .unwrap_err();
    assert!(e.is_not_found(), "{e}");
}
