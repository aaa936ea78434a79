//! Disks users bring: dynamic VHDs made by qemu-img, uploaded as the fixed
//! drives they describe (only their data sent, resumable, attached); bad
//! VHDs refused with one line before anything is created; and a page blob
//! reached through a read-only blob SAS URL, as a managed-disk export hands
//! it out (`info`, `download`, `mount --read-only`).
//!
//! Real tools throughout: mkfs.ext4 makes the filesystem, qemu-img the VHDs,
//! the Python SDK the SAS, and the built binary does the rest against
//! Azurite. Tests print `SKIPPED` without qemu-img, root or loop devices, and
//! fail instead under `BLOBDRIVE_REQUIRE_FUSE=1`.

mod common;
mod system;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use blobdrive::transfer::{self, Progress, UploadOptions};
use blobdrive::units::MIB;
use blobdrive::vhd::Footer;
use common::ContainerGuard;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_blobdrive");

fn blobdrive(args: &[&str], run_dir: Option<&Path>) -> Output {
    blobdrive_as(args, run_dir, true)
}

/// Runs the binary with the test account configured (`account`), or with
/// none at all (a SAS URL brings its own).
fn blobdrive_as(args: &[&str], run_dir: Option<&Path>, account: bool) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    if account {
        cmd.env(
            "AZURE_STORAGE_CONNECTION_STRING",
            common::connection_string(),
        );
    } else {
        cmd.env_remove("AZURE_STORAGE_CONNECTION_STRING");
    }
    cmd.env("BLOBDRIVE_RECOVERY_DIR", common::recovery_dir())
        .env_remove("AZURE_STORAGE_ACCOUNT")
        .env_remove("AZURE_STORAGE_KEY")
        .env_remove("AZURE_STORAGE_SAS_TOKEN")
        .env_remove("RUST_LOG");
    if let Some(dir) = run_dir {
        cmd.env("BLOBDRIVE_RUN_DIR", dir);
    }
    cmd.output().expect("blobdrive runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Run, expect success, return stdout.
fn ok(args: &[&str]) -> String {
    let out = blobdrive(args, None);
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Run with no account configured, expect success, return stdout.
fn sas_ok(args: &[&str]) -> String {
    let out = blobdrive_as(args, None, false);
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// A refusal: exit 1, exactly one `blobdrive: ` line mentioning `needle`.
fn refused(args: &[&str], needle: &str) -> String {
    let out = blobdrive(args, None);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(
        err.starts_with("blobdrive: ") && err.contains(needle),
        "{args:?}: wanted {needle:?} in {err}"
    );
    err.trim_end().to_string()
}

fn sh(program: &str, args: &[&str]) {
    let out = Command::new(program).args(args).output().expect(program);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        text(&out.stderr)
    );
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

/// Whether the tools the test needs are there (qemu-img, and for mounts
/// root, FUSE and loop devices); prints SKIPPED or fails under CI.
fn can_run(test: &str, needs_mount: bool) -> bool {
    if needs_mount && !system::can_run(test, true) {
        return false;
    }
    !common::qemu::qemu_imgs(test).is_empty()
}

/// Deterministic bytes that do not compress to zero pages.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A sparse raw image of `size` bytes with `pieces` of 1 MiB of data at
/// the given MiB offsets.
fn sparse_raw(path: &Path, size: u64, at_mib: &[u64]) {
    let f = File::create(path).expect("create raw");
    f.set_len(size).expect("size raw");
    for (i, mib) in at_mib.iter().enumerate() {
        f.write_all_at(&pattern(MIB as usize, i as u64 + 1), mib * MIB)
            .expect("write raw");
    }
}

/// `qemu-img convert` of a raw image into a dynamic VHD (`force_size`
/// keeps the exact size; without it qemu rounds up to a CHS geometry).
fn to_dynamic_vhd(raw: &Path, vhd: &Path, force_size: bool) {
    let opts = if force_size {
        "subformat=dynamic,force_size=on"
    } else {
        "subformat=dynamic"
    };
    sh(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "vpc",
            "-o",
            opts,
            s(raw),
            s(vhd),
        ],
    );
}

fn same_file(a: &Path, b: &Path) -> bool {
    let (fa, fb) = (
        File::open(a).expect("open a"),
        File::open(b).expect("open b"),
    );
    let len = fa.metadata().expect("stat").len();
    if len != fb.metadata().expect("stat").len() {
        return false;
    }
    let (mut ba, mut bb) = (vec![0u8; MIB as usize], vec![0u8; MIB as usize]);
    let mut at = 0;
    while at < len {
        let n = (len - at).min(MIB) as usize;
        fa.read_exact_at(&mut ba[..n], at).expect("read a");
        fb.read_exact_at(&mut bb[..n], at).expect("read b");
        if ba[..n] != bb[..n] {
            return false;
        }
        at += n as u64;
    }
    true
}

/// Bytes of `path` that are not holes.
fn allocated_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).expect("stat").blocks() * 512
}

/// A read-only blob SAS (`sp=r`, no list) for C/B, as a URL: what
/// `az disk grant-access --access-level Read` hands out.
const PY_READ_SAS_URL: &str = r#"
import datetime, os, sys
from azure.storage.blob import BlobServiceClient, generate_blob_sas, BlobSasPermissions
s = BlobServiceClient.from_connection_string(os.environ["CS"])
sas = generate_blob_sas(s.account_name, sys.argv[1], sys.argv[2],
    account_key=s.credential.account_key, permission=BlobSasPermissions(read=True),
    expiry=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1))
print(s.get_blob_client(sys.argv[1], sys.argv[2]).url + "?" + sas)
"#;

/// Unmounts DIR (and so the drive) even when an assertion fails.
struct Attached<'a> {
    run_dir: &'a Path,
    dir: &'a Path,
}

impl Drop for Attached<'_> {
    fn drop(&mut self) {
        let out = blobdrive(&["unmount", s(self.dir)], Some(self.run_dir));
        if !out.status.success() {
            let _ = Command::new("umount").args(["-l", s(self.dir)]).output();
        }
    }
}

#[tokio::test]
async fn dynamic_vhd_uploads_as_its_fixed_drive_and_a_read_only_sas_url_reads_and_attaches_it() {
    let test =
        "dynamic_vhd_uploads_as_its_fixed_drive_and_a_read_only_sas_url_reads_and_attaches_it";
    if !can_run(test, true) {
        return;
    }
    let c = ContainerGuard::new("img-dyn").await;
    let tmp = tempfile::tempdir().expect("tempdir");
    // An ext4 filesystem of 256 MiB holding a few MiB of files.
    let files = tmp.path().join("files");
    std::fs::create_dir(&files).expect("mkdir");
    let payload = pattern(3 * MIB as usize + 4321, 9);
    std::fs::write(files.join("payload.bin"), &payload).expect("write payload");
    std::fs::write(files.join("hello.txt"), b"hello from a dynamic VHD\n").expect("write");
    let raw = tmp.path().join("fs.img");
    File::create(&raw)
        .and_then(|f| f.set_len(256 * MIB))
        .expect("raw image");
    sh(
        "mkfs.ext4",
        &[
            "-q",
            "-F",
            "-E",
            "lazy_itable_init=1",
            "-d",
            s(&files),
            s(&raw),
        ],
    );
    let vhd = tmp.path().join("fs.vhd");
    to_dynamic_vhd(&raw, &vhd, true);
    let vhd_len = std::fs::metadata(&vhd).expect("stat").len();
    assert!(vhd_len < 64 * MIB, "qemu made a {vhd_len}-byte dynamic VHD");

    // Upload into a container that does not exist yet: it is created.
    let container = common::unique_name("img-new");
    let target = format!("{container}/fs.vhd");
    let _new_container = DeleteContainer(&c.client, &container);
    let report: Value =
        serde_json::from_str(&ok(&["upload", s(&vhd), &target, "--json"])).expect("upload --json");
    println!("{report}");
    assert_eq!(report["kind"], "dynamic-vhd", "{report}");
    assert_eq!(report["complete"], true, "{report}");
    assert_eq!(report["data_bytes"], 256 * MIB, "{report}");
    // Only the data (what mkfs wrote, at most the raw image's allocated
    // bytes) and the footer are sent: not the 256 MiB of the disk.
    let sent = report["sent_bytes"].as_u64().expect("sent_bytes");
    let data = allocated_bytes(&raw);
    assert!(
        sent >= payload.len() as u64 && sent <= data + 512,
        "sent {sent} bytes for {data} bytes of data"
    );

    // A fixed VHD of the same size, with the dynamic disk's unique id, and
    // the creator every qemu sizes exactly.
    let info: Value = serde_json::from_str(&ok(&["info", &target, "--json"])).expect("info");
    assert_eq!(info["is_drive"], true, "{info}");
    assert_eq!(info["virtual_size_bytes"], 256 * MIB, "{info}");
    assert_eq!(info["creator_app"], "win", "{info}");
    let mut head = [0u8; 512];
    File::open(&vhd)
        .and_then(|f| f.read_exact_at(&mut head, 0))
        .expect("read the footer copy");
    let dynamic_id = Footer::parse_any(&head).expect("qemu's footer").unique_id;

    // The same blob through a read-only blob SAS URL, with no account
    // configured at all.
    let url = common::python(PY_READ_SAS_URL, &[&container, "fs.vhd"]);
    assert!(url.contains("sp=r&") && url.contains("sig="), "{url}");
    let info: Value = serde_json::from_str(&sas_ok(&["info", &url, "--json"])).expect("info");
    assert_eq!(info["virtual_size_bytes"], 256 * MIB, "{info}");
    assert_eq!(
        info["snapshots"],
        Value::Null,
        "snapshots are unknown: {info}"
    );
    let human = sas_ok(&["info", &url]);
    assert!(human.contains("snapshots      unknown"), "{human}");

    // Downloaded, it is the raw image byte for byte, with a fixed footer
    // that keeps the dynamic disk's unique id.
    let back = tmp.path().join("back.vhd");
    sas_ok(&["download", &url, s(&back)]);
    let mut tail = [0u8; 512];
    File::open(&back)
        .and_then(|f| f.read_exact_at(&mut tail, 256 * MIB))
        .expect("read the footer");
    let footer = Footer::parse(&tail, 256 * MIB + 512).expect("a fixed footer");
    assert_eq!(footer.unique_id, dynamic_id);
    File::options()
        .write(true)
        .open(&back)
        .and_then(|f| f.set_len(256 * MIB))
        .expect("cut the footer");
    assert!(
        same_file(&raw, &back),
        "the data area differs from the raw image"
    );
    // The SAS is what signs in: a wrong signature is refused.
    let forged = url.replace("sig=", "sig=AAAA");
    refused(&["info", &forged], "SAS");

    // And attached read-only through the SAS URL: the files read back.
    let run_dir = tmp.path().join("run");
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir");
    let out = blobdrive_as(
        &["mount", &url, s(&mnt), "--read-only"],
        Some(&run_dir),
        false,
    );
    assert!(out.status.success(), "mount: {}", text(&out.stderr));
    let attached = Attached {
        run_dir: &run_dir,
        dir: &mnt,
    };
    assert_eq!(
        std::fs::read(mnt.join("payload.bin")).expect("read"),
        payload
    );
    assert_eq!(
        std::fs::read_to_string(mnt.join("hello.txt")).expect("read"),
        "hello from a dynamic VHD\n"
    );
    drop(attached);
    assert!(!system::is_mounted(&mnt), "still mounted");
}

/// Deletes a container the test made by name (not through a guard), with a
/// fresh client: the test's connection pool belongs to its runtime, which is
/// blocked in this drop.
struct DeleteContainer<'a>(&'a blobdrive::blob::BlobClient, &'a str);

impl Drop for DeleteContainer<'_> {
    fn drop(&mut self) {
        let (account, name) = (self.0.account().clone(), self.1.to_string());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            if let Ok(client) = blobdrive::blob::BlobClient::new(account) {
                let _ = rt.block_on(client.delete_container(&name));
            }
        })
        .join();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupted_dynamic_upload_resumes_sending_only_the_rest() {
    if !can_run(
        "interrupted_dynamic_upload_resumes_sending_only_the_rest",
        false,
    ) {
        return;
    }
    let c = ContainerGuard::new("img-resume").await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let raw = tmp.path().join("disk.raw");
    // 1 MiB pieces in chunks 0, 2, 5, 9 and 14 of 4 MiB.
    sparse_raw(&raw, 64 * MIB, &[1, 9, 21, 38, 57]);
    let vhd = tmp.path().join("disk.vhd");
    to_dynamic_vhd(&raw, &vhd, true);
    let blob = c.path("disk.vhd");

    let first = transfer::upload(
        &c.client,
        &vhd,
        &blob,
        &UploadOptions {
            parallel: 2,
            stop_after_chunks: Some(6),
            ..Default::default()
        },
        &Progress::new(0),
    )
    .await
    .expect("first part");
    assert!(!first.complete);
    let second = transfer::upload(
        &c.client,
        &vhd,
        &blob,
        &UploadOptions {
            resume: true,
            ..Default::default()
        },
        &Progress::new(0),
    )
    .await
    .expect("resumed upload");
    assert!(second.complete);
    println!(
        "first run sent {} bytes, the resumed one {} (and verified {})",
        first.sent_bytes, second.sent_bytes, second.verified_bytes
    );
    // The first six chunks held three pieces, the rest two (plus the footer).
    assert_eq!(first.sent_bytes, 3 * MIB);
    assert_eq!(second.sent_bytes, 2 * MIB + 512);
    assert_eq!(second.chunks_mismatched, 0);
    let back = tmp.path().join("back.raw");
    ok(&[
        "download",
        &format!("{}/disk.vhd", c.name),
        s(&back),
        "--raw",
    ]);
    assert!(
        same_file(&raw, &back),
        "resumed upload differs from the raw image"
    );
}

/// Patch `bytes` at `offset` of a copy of `from`, written to `to`.
fn patched(from: &Path, to: &Path, offset: u64, bytes: &[u8]) -> PathBuf {
    std::fs::copy(from, to).expect("copy");
    File::options()
        .write(true)
        .open(to)
        .and_then(|f| f.write_all_at(bytes, offset))
        .expect("patch");
    to.to_path_buf()
}

/// One's complement of the byte sum of `b`, the 4 bytes at `skip` excluded:
/// the checksum of VHD footers and dynamic headers.
fn vhd_checksum(b: &[u8], skip: usize) -> [u8; 4] {
    let sum = b
        .iter()
        .enumerate()
        .filter(|(i, _)| !(skip..skip + 4).contains(i))
        .fold(0u32, |a, (_, x)| a.wrapping_add(u32::from(*x)));
    (!sum).to_be_bytes()
}

/// A copy of dynamic VHD `from` turned into a differencing disk over
/// `parent`: disk type 4 in both footers, the parent's name (UTF-16BE) in
/// the header.
fn differencing(from: &Path, to: &Path, parent: &str) -> PathBuf {
    std::fs::copy(from, to).expect("copy");
    let f = File::options()
        .read(true)
        .write(true)
        .open(to)
        .expect("open");
    let len = f.metadata().expect("stat").len();
    let mut footer = [0u8; 512];
    f.read_exact_at(&mut footer, 0).expect("read footer");
    footer[60..64].copy_from_slice(&4u32.to_be_bytes());
    let sum = vhd_checksum(&footer, 64);
    footer[64..68].copy_from_slice(&sum);
    f.write_all_at(&footer, 0).expect("write footer");
    f.write_all_at(&footer, len - 512).expect("write footer");
    let mut header = [0u8; 1024];
    f.read_exact_at(&mut header, 512).expect("read header");
    let name: Vec<u8> = parent.encode_utf16().flat_map(u16::to_be_bytes).collect();
    header[64..64 + name.len()].copy_from_slice(&name);
    let sum = vhd_checksum(&header, 36);
    header[36..40].copy_from_slice(&sum);
    f.write_all_at(&header, 512).expect("write header");
    to.to_path_buf()
}

#[tokio::test]
async fn bad_vhds_are_refused_with_one_line_and_nothing_is_created() {
    if !can_run(
        "bad_vhds_are_refused_with_one_line_and_nothing_is_created",
        false,
    ) {
        return;
    }
    let c = ContainerGuard::new("img-bad").await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let raw = tmp.path().join("disk.raw");
    sparse_raw(&raw, 16 * MIB, &[0, 5]);
    let good = tmp.path().join("good.vhd");
    to_dynamic_vhd(&raw, &good, true);
    // qemu's layout: footer copy at 0, header at 512, table at 1536.
    let table_at = 1536;

    // qemu cannot create VHD differencing disks: one by hand, from the
    // dynamic one (disk type 4 and a parent name, checksums resealed).
    let diff = differencing(&good, &tmp.path().join("diff.vhd"), "base.vhd");
    let past_end = patched(
        &good,
        &tmp.path().join("past-end.vhd"),
        table_at,
        &0x00F0_0000u32.to_be_bytes(),
    );
    let bad_header = patched(&good, &tmp.path().join("bad-header.vhd"), 512 + 40, b"\x01");
    let bad_footer = patched(&good, &tmp.path().join("bad-footer.vhd"), 48, b"\x01");
    let unrounded = tmp.path().join("chs.vhd");
    to_dynamic_vhd(&raw, &unrounded, false);

    for (file, needle) in [
        (&diff, "is a differencing VHD"),
        (&past_end, "block 0 at offset 8053063680 lies past the end"),
        (&bad_header, "dynamic header's checksum"),
        (&bad_footer, "the first footer: corrupted VHD footer"),
        (&unrounded, "--pad"),
    ] {
        let name = file.file_name().unwrap().to_str().unwrap().to_string();
        let line = refused(&["upload", s(file), &format!("{}/{name}", c.name)], needle);
        println!("{name}: {line}");
        let exists = c.client.get_properties(&c.path(&name)).await;
        assert!(
            exists.is_err_and(|e| e.is_not_found()),
            "{name}: a blob was created"
        );
    }
    let line = refused(
        &["upload", s(&diff), &format!("{}/d.vhd", c.name)],
        "Convert-VHD",
    );
    assert!(line.contains("base.vhd"), "names its parent: {line}");
}
