//! Upload and download against Azurite: sparse images send and store only
//! their data, a qemu-made fixed VHD with ext4 round-trips, interrupted and
//! killed uploads resume sending only the rest (corrupted chunks are caught
//! and re-sent), refusals are one line, and dense upload throughput.

mod common;

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blobdrive::blob::{BlobClient, BlobPath};
use blobdrive::drive::{BlobPageStore, PageStore};
use blobdrive::transfer::journal::Journal;
use blobdrive::transfer::{self, DownloadOptions, Progress, UploadOptions, UploadReport};
use blobdrive::units::ByteRange;
use blobdrive::vhd::Footer;
use bytes::Bytes;
use common::ContainerGuard;

const MIB: u64 = 1 << 20;

/// Deterministic incompressible bytes (splitmix64), never a zero page.
fn fill_random(buf: &mut [u8], seed: u64) {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for w in buf.chunks_mut(8) {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let b = z.to_le_bytes();
        w.copy_from_slice(&b[..w.len()]);
    }
}

fn random(len: u64, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len as usize];
    fill_random(&mut v, seed);
    v
}

/// A dense file of random bytes.
fn dense_file(path: &Path, len: u64, seed: u64) {
    let mut f = File::create(path).unwrap();
    let mut at = 0;
    while at < len {
        let n = (len - at).min(4 * MIB);
        f.write_all(&random(n, seed + at)).unwrap();
        at += n;
    }
    f.sync_all().unwrap();
}

/// Are two files byte-identical (and the same length)?
fn same_content(a: &Path, b: &Path) -> bool {
    let (mut fa, mut fb) = (File::open(a).unwrap(), File::open(b).unwrap());
    if fa.metadata().unwrap().len() != fb.metadata().unwrap().len() {
        return false;
    }
    let (mut ba, mut bb) = (vec![0u8; 4 << 20], vec![0u8; 4 << 20]);
    loop {
        let n = read_full(&mut fa, &mut ba);
        let m = read_full(&mut fb, &mut bb);
        if n != m || ba[..n] != bb[..m] {
            return false;
        }
        if n == 0 {
            return true;
        }
    }
}

fn read_full(f: &mut File, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]).unwrap() {
            0 => break,
            k => n += k,
        }
    }
    n
}

/// The blob's bytes in `range`.
async fn blob_bytes(client: &BlobClient, path: &BlobPath, range: ByteRange) -> Vec<u8> {
    let mut out = Vec::with_capacity(range.len() as usize);
    let mut at = range.start;
    while at < range.end {
        let end = (at + 4 * MIB).min(range.end);
        out.extend_from_slice(
            &client
                .get_blob_range(path, ByteRange::new(at, end))
                .await
                .unwrap(),
        );
        at = end;
    }
    out
}

/// Non-zero 512-byte pages of `data`, in bytes.
fn nonzero_bytes(data: &[u8]) -> u64 {
    data.chunks(512)
        .filter(|p| p.iter().any(|b| *b != 0))
        .count() as u64
        * 512
}

async fn upload(
    client: &BlobClient,
    file: &Path,
    blob: &BlobPath,
    opts: &UploadOptions,
) -> UploadReport {
    let progress = Progress::new(0);
    transfer::upload(client, file, blob, opts, &progress)
        .await
        .unwrap_or_else(|e| panic!("upload of {} failed: {e}", file.display()))
}

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_blobdrive"));
    c.env(
        "AZURE_STORAGE_CONNECTION_STRING",
        common::connection_string(),
    )
    .env("BLOBDRIVE_RECOVERY_DIR", common::recovery_dir())
    .env_remove("AZURE_STORAGE_ACCOUNT")
    .env_remove("AZURE_STORAGE_KEY")
    .env_remove("AZURE_STORAGE_SAS_TOKEN");
    c
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("blobdrive runs")
}

/// A refusal: non-zero exit, exactly one line on stderr mentioning `needle`.
fn assert_refused(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "should fail; stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(
        err.starts_with("blobdrive: ") && err.contains(needle),
        "{err}"
    );
}

fn loop_devices_usable() -> bool {
    let ok = Path::new("/dev/loop-control").exists() && unsafe { libc::geteuid() } == 0;
    if !ok {
        assert!(
            std::env::var("BLOBDRIVE_REQUIRE_FUSE").as_deref() != Ok("1"),
            "loop devices are required (BLOBDRIVE_REQUIRE_FUSE=1) but unusable"
        );
        println!("SKIPPED: loop devices need root and /dev/loop-control");
    }
    ok
}

fn sh(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd).args(args).output().expect(cmd);
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparse_2gib_image_sends_only_its_data_and_downloads_sparse() {
    let c = ContainerGuard::new("xfer-sparse").await;
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("sparse.img");
    let size = 2048 * MIB;
    let f = File::create(&src).unwrap();
    f.set_len(size).unwrap();
    // 24 blocks of 4 MiB of data spread over the disk, plus three small
    // writes, plus three 4 MiB regions of written zeros (data, not holes).
    let mut data_ranges = Vec::new();
    for i in 0..24u64 {
        let at = (i * 21 + 3) * 4 * MIB;
        f.write_all_at(&random(4 * MIB, i), at).unwrap();
        data_ranges.push(ByteRange::new(at, at + 4 * MIB));
    }
    for (i, at) in [
        (100u64, 777 * MIB + 4096),
        (101, 1500 * MIB + 512),
        (102, size - 64 * 1024),
    ] {
        f.write_all_at(&random(64 * 1024, i), at).unwrap();
        data_ranges.push(ByteRange::new(at, at + 64 * 1024));
    }
    for block in [100u64, 250, 400] {
        f.write_all_at(&vec![0u8; 4 * MIB as usize], block * 4 * MIB)
            .unwrap();
    }
    f.sync_all().unwrap();
    let data_bytes: u64 = data_ranges.iter().map(ByteRange::len).sum();
    let allocated = f.metadata().unwrap().blocks() * 512;
    assert!(
        allocated >= data_bytes + 12 * MIB,
        "written zeros are allocated: {allocated}"
    );
    drop(f);

    let blob = c.path("sparse.vhd");
    let report = upload(&c.client, &src, &blob, &UploadOptions::default()).await;
    println!(
        "2 GiB sparse: sent {:.1} MiB in {} requests, {:.1} MiB holes, {:.1} MiB zero pages, {:.2} s",
        report.sent_bytes as f64 / MIB as f64,
        report.requests,
        report.hole_bytes as f64 / MIB as f64,
        report.zero_bytes as f64 / MIB as f64,
        report.seconds
    );
    assert!(report.complete);
    assert_eq!(
        report.sent_bytes,
        data_bytes + 512,
        "data and the footer, nothing else"
    );
    assert!(report.sent_bytes <= 110 * MIB);
    assert!(
        report.zero_bytes >= 12 * MIB,
        "written zeros found as zero pages"
    );
    assert_eq!(report.scanned_bytes, size);

    // The blob stores exactly the data (and the footer).
    let store = BlobPageStore::new(c.client.clone(), blob.clone());
    let ranges = store.page_ranges(ByteRange::new(0, size)).await.unwrap();
    let stored: u64 = ranges.iter().map(ByteRange::len).sum();
    assert_eq!(stored, data_bytes);
    for r in &ranges {
        assert!(
            data_ranges
                .iter()
                .any(|d| d.start <= r.start && r.end <= d.end),
            "range {r:?} is not data"
        );
    }
    let footer = blob_bytes(&c.client, &blob, ByteRange::new(size, size + 512)).await;
    let footer = Footer::parse(footer.as_slice().try_into().unwrap(), size + 512).unwrap();
    assert_eq!(footer.current_size_bytes, size);
    let props = c.client.get_properties(&blob).await.unwrap();
    assert!(
        Journal::from_metadata(&props.metadata).is_none(),
        "record removed"
    );
    assert_eq!(
        props.lease_state,
        Some(blobdrive::blob::LeaseState::Available)
    );

    // Download: byte-identical, sparse.
    let back = tmp.path().join("back.img");
    let progress = Progress::new(0);
    let opts = DownloadOptions {
        raw: true,
        ..Default::default()
    };
    let d = transfer::download(&c.client, &blob, &back, &opts, &progress)
        .await
        .unwrap();
    println!(
        "2 GiB sparse download: received {:.1} MiB in {} requests, {:.2} s",
        d.received_bytes as f64 / MIB as f64,
        d.requests,
        d.seconds
    );
    assert_eq!(d.received_bytes, data_bytes);
    assert!(
        same_content(&src, &back),
        "download differs from the source"
    );
    let used = std::fs::metadata(&back).unwrap().blocks() * 512;
    println!("download uses {:.1} MiB of disk", used as f64 / MIB as f64);
    assert!(used <= 120 * MIB, "download uses {used} bytes");

    // Without --raw the file is the VHD; an existing file is refused.
    let vhd = tmp.path().join("back.vhd");
    let d = transfer::download(
        &c.client,
        &blob,
        &vhd,
        &DownloadOptions::default(),
        &Progress::new(0),
    )
    .await
    .unwrap();
    assert_eq!(d.file_bytes, size + 512);
    let err = transfer::download(
        &c.client,
        &blob,
        &vhd,
        &DownloadOptions::default(),
        &Progress::new(0),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_fixed_vhd_with_ext4_uploads_and_its_file_reads_back() {
    if !loop_devices_usable() {
        return;
    }
    let c = ContainerGuard::new("xfer-qemu").await;
    let tmp = tempfile::tempdir().unwrap();
    let raw = tmp.path().join("fs.img");
    File::create(&raw).unwrap().set_len(64 * MIB).unwrap();
    sh("mkfs.ext4", &["-q", "-F", raw.to_str().unwrap()]);
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let payload = random(3 * MIB + 123, 7);
    sh(
        "mount",
        &["-o", "loop", raw.to_str().unwrap(), mnt.to_str().unwrap()],
    );
    let written = std::fs::write(mnt.join("payload.bin"), &payload)
        .and_then(|()| std::fs::write(mnt.join("hello.txt"), b"hello from blobdrive\n"));
    sh("umount", &[mnt.to_str().unwrap()]);
    written.unwrap();
    let vhd = tmp.path().join("fs.vhd");
    sh(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "vpc",
            "-o",
            "subformat=fixed,force_size=on",
            raw.to_str().unwrap(),
            vhd.to_str().unwrap(),
        ],
    );
    assert_eq!(std::fs::metadata(&vhd).unwrap().len(), 64 * MIB + 512);

    let target = format!("{}/fs.vhd", c.name);
    let out = run(&["upload", vhd.to_str().unwrap(), &target]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = String::from_utf8_lossy(&out.stdout);
    println!("{summary}");
    assert!(summary.contains("fixed VHD"), "{summary}");

    // The footer is qemu's, kept as it was.
    let blob = c.path("fs.vhd");
    let mut vhd_footer = [0u8; 512];
    File::open(&vhd)
        .unwrap()
        .read_exact_at(&mut vhd_footer, 64 * MIB)
        .unwrap();
    let stored = blob_bytes(&c.client, &blob, ByteRange::new(64 * MIB, 64 * MIB + 512)).await;
    assert_eq!(stored, vhd_footer);
    assert_eq!(
        Footer::parse(&vhd_footer, 64 * MIB + 512)
            .unwrap()
            .creator_app_name(),
        "qem2"
    );

    // Attach with plain tools: download the data area, loop-mount read-only.
    let back = tmp.path().join("back.img");
    let out = run(&["download", &target, back.to_str().unwrap(), "--raw"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        same_content(&raw, &back),
        "data area differs from the ext4 image"
    );
    let mnt2 = tmp.path().join("mnt2");
    std::fs::create_dir(&mnt2).unwrap();
    sh(
        "mount",
        &[
            "-o",
            "loop,ro",
            back.to_str().unwrap(),
            mnt2.to_str().unwrap(),
        ],
    );
    let read = std::fs::read(mnt2.join("payload.bin"));
    let hello = std::fs::read_to_string(mnt2.join("hello.txt"));
    sh("umount", &[mnt2.to_str().unwrap()]);
    assert_eq!(read.unwrap(), payload);
    assert_eq!(hello.unwrap(), "hello from blobdrive\n");

    // And attached as a drive: `blobdrive mount C/B DIR --read-only`.
    let run_dir = tmp.path().join("run");
    let mnt3 = tmp.path().join("mnt3");
    std::fs::create_dir(&mnt3).unwrap();
    let attach = |args: &[&str]| {
        bin()
            .env("BLOBDRIVE_RUN_DIR", &run_dir)
            .args(args)
            .output()
            .expect("blobdrive runs")
    };
    /// Detaches the drive even when an assertion below fails.
    struct Detach<'a, F: Fn(&[&str]) -> Output>(&'a F, &'a Path);
    impl<F: Fn(&[&str]) -> Output> Drop for Detach<'_, F> {
        fn drop(&mut self) {
            let _ = (self.0)(&["unmount", self.1.to_str().unwrap()]);
        }
    }
    let out = attach(&["mount", &target, mnt3.to_str().unwrap(), "--read-only"]);
    assert!(
        out.status.success(),
        "attach: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let detach = Detach(&attach, &mnt3);
    assert_eq!(std::fs::read(mnt3.join("payload.bin")).unwrap(), payload);
    assert_eq!(
        std::fs::read_to_string(mnt3.join("hello.txt")).unwrap(),
        "hello from blobdrive\n"
    );
    std::mem::forget(detach);
    let out = attach(&["unmount", mnt3.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "unmount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Which chunks the blob's upload record has as done.
async fn recorded_chunks(client: &BlobClient, blob: &BlobPath) -> Vec<u64> {
    let props = client.get_properties(blob).await.unwrap();
    let j = Journal::from_metadata(&props.metadata)
        .expect("an interrupted upload leaves its record")
        .expect("record is valid");
    (0..j.done.len() as u64)
        .filter(|c| j.done[*c as usize].is_some())
        .collect()
}

async fn assert_no_footer(client: &BlobClient, blob: &BlobPath, data_len: u64) {
    let tail = blob_bytes(client, blob, ByteRange::new(data_len, data_len + 512)).await;
    assert!(
        Footer::parse(tail.as_slice().try_into().unwrap(), data_len + 512).is_err(),
        "an incomplete upload must not be a valid drive"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupted_upload_resumes_sending_only_the_rest() {
    let c = ContainerGuard::new("xfer-resume").await;
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("dense.img");
    let len = 64 * MIB;
    dense_file(&src, len, 1);
    let blob = c.path("dense.vhd");
    let first = upload(
        &c.client,
        &src,
        &blob,
        &UploadOptions {
            parallel: 4,
            stop_after_chunks: Some(6),
            ..Default::default()
        },
    )
    .await;
    assert!(!first.complete);
    let done = recorded_chunks(&c.client, &blob).await;
    assert!(done.len() >= 6 && done.len() < 16, "{done:?}");
    assert_no_footer(&c.client, &blob, len).await;

    // Without --resume (or --overwrite) the partial blob is refused.
    let err = transfer::upload(
        &c.client,
        &src,
        &blob,
        &UploadOptions::default(),
        &Progress::new(0),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("--resume"), "{err}");

    let second = upload(
        &c.client,
        &src,
        &blob,
        &UploadOptions {
            resume: true,
            ..Default::default()
        },
    )
    .await;
    let remaining = len - done.len() as u64 * 4 * MIB;
    println!(
        "first run sent {} MiB ({} chunks recorded); resume sent {} MiB (remaining {} MiB + footer), verified {} MiB",
        first.sent_bytes / MIB,
        done.len(),
        second.sent_bytes / MIB,
        remaining / MIB,
        second.verified_bytes / MIB
    );
    assert!(second.complete);
    assert_eq!(second.sent_bytes, remaining + 512);
    assert_eq!(second.chunks_mismatched, 0);
    assert_eq!(second.resumed_bytes, done.len() as u64 * 4 * MIB);
    let stored = blob_bytes(&c.client, &blob, ByteRange::new(0, len)).await;
    assert!(
        stored == std::fs::read(&src).unwrap(),
        "blob differs from the file"
    );
    let props = c.client.get_properties(&blob).await.unwrap();
    assert!(Journal::from_metadata(&props.metadata).is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_chunk_is_detected_on_resume_and_sent_again() {
    let c = ContainerGuard::new("xfer-corrupt").await;
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("img");
    let len = 32 * MIB;
    dense_file(&src, len, 2);
    // A zero region inside chunk 3: a stray page there must be caught too.
    File::options()
        .write(true)
        .open(&src)
        .unwrap()
        .write_all_at(&vec![0u8; MIB as usize], 13 * MIB)
        .unwrap();
    let blob = c.path("img.vhd");
    // The hook stops reading after five chunks: exactly chunks 0-4 are recorded.
    let first = upload(
        &c.client,
        &src,
        &blob,
        &UploadOptions {
            parallel: 1,
            stop_after_chunks: Some(5),
            ..Default::default()
        },
    )
    .await;
    assert!(!first.complete);
    let done = recorded_chunks(&c.client, &blob).await;
    assert_eq!(done, vec![0, 1, 2, 3, 4]);

    // Corrupt chunk 1 (other bytes over data) and chunk 3 (a page where the
    // image has zeros).
    let junk = Bytes::from(vec![0xEEu8; 8192]);
    c.client
        .put_pages(&blob, 4 * MIB + 65536, junk, None)
        .await
        .unwrap();
    let junk = Bytes::from(vec![0x55u8; 512]);
    c.client
        .put_pages(&blob, 13 * MIB + 4096, junk, None)
        .await
        .unwrap();

    let second = upload(
        &c.client,
        &src,
        &blob,
        &UploadOptions {
            resume: true,
            ..Default::default()
        },
    )
    .await;
    let data = std::fs::read(&src).unwrap();
    let resent: u64 = (0..8u64)
        .filter(|c| *c == 1 || *c == 3 || !done.contains(c))
        .map(|c| nonzero_bytes(&data[(c * 4 * MIB) as usize..((c + 1) * 4 * MIB) as usize]))
        .sum();
    println!(
        "resume: {} chunks mismatched, sent {} bytes (chunks 1, 3 and the unrecorded: {resent} + footer)",
        second.chunks_mismatched, second.sent_bytes
    );
    assert!(second.complete);
    assert_eq!(second.chunks_mismatched, 2);
    assert_eq!(second.sent_bytes, resent + 512);
    let stored = blob_bytes(&c.client, &blob, ByteRange::new(0, len)).await;
    assert!(stored == data, "blob differs from the file after resume");
    let store = BlobPageStore::new(c.client.clone(), blob.clone());
    let ranges = store
        .page_ranges(ByteRange::new(13 * MIB, 14 * MIB))
        .await
        .unwrap();
    assert!(ranges.is_empty(), "the stray page was cleared: {ranges:?}");
}

/// A size as `format_size` prints it (`128.0 MiB`), in bytes, and half a
/// unit of the last printed digit: how far the printed value may be off.
fn printed_size(text: &str) -> (u64, u64) {
    let (number, unit) = text
        .trim()
        .split_once(' ')
        .unwrap_or_else(|| panic!("not a size: {text:?}"));
    let unit = match unit {
        "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => MIB,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        _ => panic!("unknown unit in {text:?}"),
    };
    let value: f64 = number
        .parse()
        .unwrap_or_else(|_| panic!("not a size: {text:?}"));
    ((value * unit as f64).round() as u64, unit / 20)
}

/// The line of an upload summary that starts with `label` (`sent`), without it.
fn summary_line<'a>(summary: &'a str, label: &str) -> &'a str {
    summary
        .lines()
        .find_map(|l| l.trim_start().strip_prefix(label))
        .unwrap_or_else(|| panic!("no {label:?} line in the summary:\n{summary}"))
        .trim_start()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_killed_half_way_resumes_after_its_lease_lapses_and_sends_only_the_rest() {
    let c = ContainerGuard::new("xfer-kill").await;
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("big.img");
    let len = 256 * MIB;
    let chunk = 4 * MIB;
    let chunks = len / chunk;
    dense_file(&src, len, 3);
    let blob = c.path("big.vhd");
    let target = format!("{}/big.vhd", c.name);
    let mut child = bin()
        .args([
            "upload",
            src.to_str().unwrap(),
            &target,
            "--parallel",
            "2",
            "--lease-seconds",
            "15",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // SIGKILL it once about half of the chunks are recorded in the blob's
    // metadata (it records every 64 MiB sent, so this is the 128 MiB record).
    let deadline = Instant::now() + Duration::from_secs(120);
    let recorded = loop {
        assert!(Instant::now() < deadline, "upload recorded half too late");
        if let Ok(props) = c.client.get_properties(&blob).await {
            if let Some(Ok(j)) = Journal::from_metadata(&props.metadata) {
                if j.done_count() >= chunks / 2 {
                    child.kill().unwrap();
                    break j.done_count();
                }
            }
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "upload ended before it could be killed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    child.wait().unwrap();
    assert_no_footer(&c.client, &blob, len).await;
    // It may have recorded once more between the look and the kill.
    let at_kill = recorded_chunks(&c.client, &blob).await.len() as u64;
    println!("killed with {recorded} of {chunks} chunks recorded ({at_kill} at the end)");
    assert!(at_kill < chunks, "killed before the end");

    // The killed process's lease is still held: a mount (or upload) is refused.
    let out = run(&["upload", src.to_str().unwrap(), &target, "--overwrite"]);
    assert_refused(&out, "leased");

    let started = Instant::now();
    let out = run(&["upload", src.to_str().unwrap(), &target, "--resume"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!(
        "resumed in {:.1} s:\n{stdout}",
        started.elapsed().as_secs_f64()
    );

    // The summary: what was recorded counts as resumed, only the rest is sent.
    let (resumed, resumed_err) = printed_size(
        summary_line(&stdout, "resumed")
            .split(" already")
            .next()
            .unwrap(),
    );
    assert!(
        resumed.abs_diff(at_kill * chunk) <= resumed_err,
        "resumed {resumed} bytes, {at_kill} chunks were recorded:\n{stdout}"
    );
    // `sent` counts Put Page bodies only (the resume's verifying reads and
    // Clear Pages are requests, not bytes sent).
    let sent_line = summary_line(&stdout, "sent");
    let (sent, sent_err) = printed_size(
        sent_line
            .split(" in ")
            .next()
            .unwrap_or_else(|| panic!("sent line: {sent_line}")),
    );
    // The data is dense: every chunk not recorded is sent whole, then the footer.
    let rest = (chunks - at_kill) * chunk + 512;
    assert!(
        sent.abs_diff(rest) <= sent_err,
        "sent {sent} bytes, the rest is {rest}:\n{stdout}"
    );
    // Against what the test saw when it killed: no more than the remaining
    // data plus a chunk of slack, and about half of the image.
    let remaining = (chunks - recorded) * chunk;
    assert!(
        sent <= remaining + chunk,
        "sent {sent} bytes, {remaining} remained when killed:\n{stdout}"
    );
    assert!(
        sent <= len / 2 + chunk,
        "sent more than about half:\n{stdout}"
    );
    let stored = blob_bytes(&c.client, &blob, ByteRange::new(0, len)).await;
    assert!(
        stored == std::fs::read(&src).unwrap(),
        "blob differs from the file"
    );
    let tail = blob_bytes(&c.client, &blob, ByteRange::new(len, len + 512)).await;
    Footer::parse(tail.as_slice().try_into().unwrap(), len + 512).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_one_line_with_a_nonzero_exit() {
    let c = ContainerGuard::new("xfer-refuse").await;
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("disk.img");
    dense_file(&img, 16 * MIB, 4);
    let target = format!("{}/disk.vhd", c.name);
    let out = run(&["upload", img.to_str().unwrap(), &target]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // An existing blob.
    let out = run(&["upload", img.to_str().unwrap(), &target]);
    assert_refused(&out, "already exists");

    // A leased blob, even with --overwrite.
    let blob = c.path("disk.vhd");
    let lease = c
        .client
        .acquire_lease(&blob, &uuid::Uuid::new_v4().to_string(), None)
        .await
        .unwrap();
    let out = run(&["upload", img.to_str().unwrap(), &target, "--overwrite"]);
    assert_refused(&out, "leased");
    c.client.release_lease(&blob, &lease).await.unwrap();
    let out = run(&["upload", img.to_str().unwrap(), &target, "--overwrite"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A raw size that is not whole MiB, unless padded.
    let odd = tmp.path().join("odd.img");
    dense_file(&odd, 10 * MIB + 1000, 5);
    let odd_target = format!("{}/odd.vhd", c.name);
    let out = run(&["upload", odd.to_str().unwrap(), &odd_target]);
    assert_refused(&out, "not a whole number of MiB");
    let out = run(&["upload", odd.to_str().unwrap(), &odd_target, "--pad"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let props = c.client.get_properties(&c.path("odd.vhd")).await.unwrap();
    assert_eq!(props.content_length, 11 * MIB + 512);

    // A dynamic VHD whose size qemu rounded up to its CHS geometry (not
    // whole MiB; dynamic VHDs themselves upload, see tests/images.rs).
    let dynamic = tmp.path().join("dyn.vhd");
    sh(
        "qemu-img",
        &[
            "create",
            "-q",
            "-f",
            "vpc",
            "-o",
            "subformat=dynamic",
            dynamic.to_str().unwrap(),
            "32M",
        ],
    );
    let out = run(&[
        "upload",
        dynamic.to_str().unwrap(),
        &format!("{}/dyn.vhd", c.name),
    ]);
    assert_refused(&out, "is not a whole number of MiB");

    // Resume of a complete blob; download over an existing file.
    let out = run(&["upload", img.to_str().unwrap(), &target, "--resume"]);
    assert_refused(&out, "no interrupted upload");
    let out = run(&["download", &target, img.to_str().unwrap()]);
    assert_refused(&out, "already exists");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dense_256mib_upload_throughput_against_the_put_page_ceiling() {
    let c = ContainerGuard::new("xfer-bench").await;
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("dense.img");
    let len = 256 * MIB;
    dense_file(&src, len, 6);

    // The ceiling: the same bytes as bare 4 MiB Put Pages, 8 in flight.
    let raw = c.path("ceiling");
    c.client.create_page_blob(&raw, len).await.unwrap();
    let mut file = File::open(&src).unwrap();
    let mut blocks = Vec::new();
    for _ in 0..len / (4 * MIB) {
        let mut b = vec![0u8; 4 * MIB as usize];
        file.read_exact(&mut b).unwrap();
        blocks.push(Bytes::from(b));
    }
    let started = Instant::now();
    let client = Arc::new(c.client.clone());
    futures::future::try_join_all((0..8).map(|lane| {
        let (client, raw, blocks) = (client.clone(), raw.clone(), blocks.clone());
        async move {
            for (i, b) in blocks.into_iter().enumerate().skip(lane).step_by(8) {
                client.put_pages(&raw, i as u64 * 4 * MIB, b, None).await?;
            }
            Ok::<(), blobdrive::blob::Error>(())
        }
    }))
    .await
    .unwrap();
    let ceiling = len as f64 / MIB as f64 / started.elapsed().as_secs_f64();

    let report = upload(
        &c.client,
        &src,
        &c.path("dense.vhd"),
        &UploadOptions::default(),
    )
    .await;
    let mibs = report.rate() / MIB as f64;
    println!(
        "upload throughput: {mibs:.1} MiB/s (256 MiB dense, parallel 8, {} requests); \
         bare Put Page ceiling {ceiling:.1} MiB/s; ratio {:.2}",
        report.requests,
        mibs / ceiling
    );
    assert!(report.complete);
    assert_eq!(report.sent_bytes, len + 512);
}

/// Runs a command that must succeed; its stdout, trimmed.
fn ok(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "blobdrive {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `blobdrive snapshot C/B`: the new snapshot's time.
fn snapshot(drive: &str) -> String {
    let t = ok(&["snapshot", drive]);
    assert!(!t.is_empty() && !t.contains(' '), "snapshot printed {t:?}");
    t
}

/// A 16 MiB drive with data, and three snapshots T0, T1, T2 with writes
/// and a clear in between; returns the drive operand and the times.
async fn drive_with_three_snapshots(c: &ContainerGuard, name: &str) -> (String, [String; 3]) {
    let drive = format!("{}/{name}", c.name);
    ok(&["create", &drive, "--size", "16M"]);
    let blob = c.path(name);
    let put = |at: u64, len: u64, seed: u64| {
        let client = c.client.clone();
        let blob = blob.clone();
        async move {
            client
                .put_pages(&blob, at, random(len, seed).into(), None)
                .await
                .expect("put pages");
        }
    };
    put(0, 256 * 1024, 1).await;
    put(4 * MIB, MIB, 2).await;
    let t0 = snapshot(&drive);
    put(64 * 1024, 64 * 1024, 3).await;
    put(9 * MIB, 4096, 4).await;
    let t1 = snapshot(&drive);
    put(128 * 1024, 8192, 5).await;
    c.client
        .clear_pages(&blob, ByteRange::new(4 * MIB, 4 * MIB + 256 * 1024), None)
        .await
        .expect("clear pages");
    put(12 * MIB, 512 * 1024, 6).await;
    let t2 = snapshot(&drive);
    (drive, [t0, t1, t2])
}

/// `download --since T1` only updates a file whose record says it holds
/// snapshot T1 of that drive, in that mode, unchanged since: another
/// snapshot, no record (a plain copy), the live drive, another mode and a
/// file written to after the download are each refused with one line and
/// left as they were; `--since` needs `--snapshot`; the right T1 gives a file
/// equal to a full download of T2, and a second run has nothing to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn download_since_refuses_a_file_that_does_not_hold_t1() {
    let c = ContainerGuard::new("since-refuse").await;
    let (drive, [t0, t1, t2]) = drive_with_three_snapshots(&c, "d.vhd").await;
    let tmp = tempfile::tempdir().unwrap();
    let p = |n: &str| tmp.path().join(n).to_string_lossy().into_owned();
    let (held, full2) = (p("held.vhd"), p("full2.vhd"));
    ok(&["download", &drive, &held, "--snapshot", &t0]);
    ok(&["download", &drive, &full2, "--snapshot", &t2]);
    let before = std::fs::read(&held).unwrap();
    let since = |file: &str, t1: &str, extra: &[&str]| {
        let mut args = vec!["download", &drive, file, "--since", t1, "--snapshot", &t2];
        args.extend_from_slice(extra);
        run(&args)
    };

    // It holds T0, not T1 (same size: the size alone cannot tell).
    let out = since(&held, &t1, &[]);
    assert_refused(&out, &format!("holds snapshot {t0}"));
    assert_refused(&out, &format!("give --since {t0}"));
    // Another mode.
    assert_refused(&since(&held, &t0, &["--raw"]), "leave out --raw");
    // To the live drive: refused, the file must name a snapshot.
    let out = run(&["download", &drive, &held, "--since", &t0]);
    assert_refused(&out, "--since needs --snapshot T2");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        std::fs::read(&held).unwrap() == before,
        "refusals leave the file"
    );

    // A copy without the record: refused, and the advice writes a new file.
    let copy = p("copy.vhd");
    std::fs::copy(&held, &copy).unwrap();
    let out = since(&copy, &t0, &[]);
    assert_refused(&out, "has no download record");
    let line = String::from_utf8_lossy(&out.stderr);
    assert!(
        line.contains("NEW-FILE") && !line.contains("--overwrite"),
        "{line}"
    );
    // A download of the live drive names no snapshot.
    let live = p("live.vhd");
    ok(&["download", &drive, &live]);
    assert_refused(&since(&live, &t1, &[]), "holds the live drive");
    // Written to after the download (as a read-write mount of it would).
    let touched = p("touched.vhd");
    ok(&["download", &drive, &touched, "--snapshot", &t0]);
    std::thread::sleep(Duration::from_millis(20));
    File::options()
        .write(true)
        .open(&touched)
        .unwrap()
        .write_all_at(b"local change", 8 * MIB)
        .unwrap();
    assert_refused(
        &since(&touched, &t0, &[]),
        "was changed after blobdrive wrote it",
    );

    // The right T1: the same bytes as a full download of T2, then nothing to do.
    let text = ok(&["download", &drive, &held, "--since", &t0, "--snapshot", &t2]);
    assert!(text.starts_with("updated "), "{text}");
    assert!(
        same_content(Path::new(&held), Path::new(&full2)),
        "update equals full download"
    );
    let text = ok(&["download", &drive, &held, "--since", &t0, "--snapshot", &t2]);
    assert!(text.contains("already holds snapshot"), "{text}");
}

/// An update killed (SIGKILL) part way leaves a file that holds neither
/// state: an update to another snapshot is refused, and running the same
/// command again finishes it, byte for byte a full download of T2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn download_since_killed_mid_way_reruns_to_a_full_download() {
    let c = ContainerGuard::new("since-kill").await;
    let tmp = tempfile::tempdir().unwrap();
    let p = |n: &str| tmp.path().join(n).to_string_lossy().into_owned();
    let len = 128 * MIB;
    let img = tmp.path().join("src.img");
    dense_file(&img, len, 11);
    let drive = format!("{}/big.vhd", c.name);
    ok(&["upload", img.to_str().unwrap(), &drive]);
    std::fs::remove_file(&img).unwrap();
    let blob = c.path("big.vhd");
    let t1 = snapshot(&drive);
    let local = p("local.vhd");
    ok(&["download", &drive, &local, "--snapshot", &t1]);
    // T2: 4 KiB rewritten at the start of every 4 MiB, and 1 MiB cleared.
    let piece = |k: u64| random(4096, 100 + k);
    for k in 0..len / (4 * MIB) {
        c.client
            .put_pages(&blob, k * 4 * MIB, piece(k).into(), None)
            .await
            .expect("put pages");
    }
    c.client
        .clear_pages(&blob, ByteRange::new(100 * MIB, 101 * MIB), None)
        .await
        .expect("clear pages");
    let t2 = snapshot(&drive);
    c.client
        .put_pages(&blob, 50 * MIB, random(4096, 999).into(), None)
        .await
        .expect("put pages");
    let t3 = snapshot(&drive);

    let mut child = bin()
        .args([
            "download",
            &drive,
            &local,
            "--since",
            &t1,
            "--snapshot",
            &t2,
            "--parallel",
            "1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // SIGKILL it once the first changed range reached the file.
    let file = File::open(&local).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut head = vec![0u8; 4096];
    loop {
        assert!(Instant::now() < deadline, "the update never started");
        file.read_exact_at(&mut head, 0).unwrap();
        if head == piece(0) {
            child.kill().unwrap();
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the update ended before it could be killed"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    child.wait().unwrap();
    let mut tail = vec![0u8; 4096];
    file.read_exact_at(&mut tail, len - 4 * MIB).unwrap();
    assert!(
        tail != piece(len / (4 * MIB) - 1),
        "killed before the last range"
    );

    // Half T1, half T2: an update to another snapshot must not start from it.
    let out = run(&[
        "download",
        &drive,
        &local,
        "--since",
        &t1,
        "--snapshot",
        &t3,
    ]);
    assert_refused(
        &out,
        &format!("was being updated from snapshot {t1} to {t2}"),
    );
    // The same command again finishes it.
    let text = ok(&[
        "download",
        &drive,
        &local,
        "--since",
        &t1,
        "--snapshot",
        &t2,
    ]);
    assert!(text.contains("applied again"), "{text}");
    let full = p("full.vhd");
    ok(&["download", &drive, &full, "--snapshot", &t2]);
    sh("cmp", &[&local, &full]);
    // And it holds T2 now: on to T3.
    ok(&[
        "download",
        &drive,
        &local,
        "--since",
        &t2,
        "--snapshot",
        &t3,
    ]);
    ok(&["download", &drive, &full, "--snapshot", &t3, "--overwrite"]);
    sh("cmp", &[&local, &full]);
}

/// On a filesystem without user extended attributes (ramfs; also vfat, some
/// NFS) the record is the file FILE.blobdrive.json beside the download, and
/// is honoured the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn download_keeps_its_record_beside_the_file_where_xattrs_are_missing() {
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var("BLOBDRIVE_REQUIRE_FUSE").as_deref() != Ok("1"),
            "mounting ramfs needs root (BLOBDRIVE_REQUIRE_FUSE=1)"
        );
        println!("SKIPPED: mounting ramfs needs root");
        return;
    }
    let c = ContainerGuard::new("since-ramfs").await;
    let (drive, [t0, t1, t2]) = drive_with_three_snapshots(&c, "d.vhd").await;
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    sh("mount", &["-t", "ramfs", "ramfs", mnt.to_str().unwrap()]);
    /// Unmounts the ramfs however the test ends.
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _unmount = Unmount(&mnt);
    let local = mnt.join("d.vhd");
    let local_s = local.to_string_lossy().into_owned();
    ok(&["download", &drive, &local_s, "--snapshot", &t1]);
    let side = mnt.join("d.vhd.blobdrive.json");
    let record = std::fs::read_to_string(&side).expect("the record beside the file");
    assert!(record.contains(&t1), "{record}");
    assert_eq!(
        side.metadata().unwrap().mode() & 0o777,
        0o600,
        "the record is as private as the image"
    );
    let out = run(&[
        "download",
        &drive,
        &local_s,
        "--since",
        &t0,
        "--snapshot",
        &t2,
    ]);
    assert_refused(&out, &format!("holds snapshot {t1}"));
    ok(&[
        "download",
        &drive,
        &local_s,
        "--since",
        &t1,
        "--snapshot",
        &t2,
    ]);
    let full = tmp.path().join("full.vhd");
    ok(&[
        "download",
        &drive,
        full.to_str().unwrap(),
        "--snapshot",
        &t2,
    ]);
    assert!(same_content(&local, &full), "update equals full download");
    let record = std::fs::read_to_string(&side).unwrap();
    assert!(
        record.contains(&t2) && !record.contains("updating\":{"),
        "{record}"
    );
}

/// Runs blobdrive under umask 022 (the usual default): what it creates
/// would be 0644 unless it asks for less.
fn run_umask_022(args: &[&str]) -> Output {
    use std::os::unix::process::CommandExt;
    let mut cmd = bin();
    cmd.args(args);
    // SAFETY: umask is async-signal-safe; nothing else runs in the child.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0o022);
            Ok(())
        });
    }
    cmd.output().expect("blobdrive runs")
}

/// A downloaded image is as private as the drive it came from: under umask
/// 022 a download, a `--raw` one and a `--decrypt` one of an encrypted drive
/// are each created 0600 (the user may chmod them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downloads_are_created_readable_by_their_owner_only() {
    let c = ContainerGuard::new("dl-mode").await;
    let tmp = tempfile::tempdir().unwrap();
    let p = |n: &str| tmp.path().join(n).to_string_lossy().into_owned();
    let key = p("key");
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&key)
            .unwrap();
        f.write_all(&random(32, 7)).unwrap();
    }
    let plain = format!("{}/plain.vhd", c.name);
    let secret = format!("{}/secret.vhd", c.name);
    ok(&["create", &plain, "--size", "16M"]);
    ok(&[
        "create",
        &secret,
        "--size",
        "16M",
        "--encrypt",
        "--key-file",
        &key,
    ]);
    let cases: [(&str, Vec<&str>); 3] = [
        ("plain.vhd", vec!["download", &plain]),
        ("plain.img", vec!["download", &plain, "--raw"]),
        (
            "secret.img",
            vec![
                "download",
                &secret,
                "--raw",
                "--decrypt",
                "--key-file",
                &key,
            ],
        ),
    ];
    for (name, mut args) in cases {
        let file = p(name);
        args.insert(2, &file);
        let out = run_umask_022(&args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mode = std::fs::metadata(&file).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600, "{name} is {mode:o}");
    }
}

/// A full download of a drive written to meanwhile (here: Put Page in a loop,
/// as a read-write mount does) is refused with one line that says to
/// download a snapshot, and leaves nothing under FILE's name (no file, no
/// record, no temporary); a drive leased (mounted read-write) is warned
/// about up front, and one that stays still downloads with that warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn download_of_a_drive_written_meanwhile_is_refused_and_leaves_nothing() {
    let c = ContainerGuard::new("dl-live").await;
    let tmp = tempfile::tempdir().unwrap();
    let len = 64 * MIB;
    let img = tmp.path().join("src.img");
    dense_file(&img, len, 21);
    let drive = format!("{}/live.vhd", c.name);
    ok(&["upload", img.to_str().unwrap(), &drive]);
    std::fs::remove_file(&img).unwrap();
    let blob = c.path("live.vhd");
    let lease = c
        .client
        .acquire_lease(&blob, &uuid::Uuid::new_v4().to_string(), None)
        .await
        .unwrap();

    // The writer: 4 KiB at a new place every few milliseconds, with the lease.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (client, blob, lease, stop) =
            (c.client.clone(), blob.clone(), lease.clone(), stop.clone());
        tokio::spawn(async move {
            let mut k = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let at = (k * 4099 * 4096) % len;
                client
                    .put_pages(&blob, at, random(4096, 500 + k).into(), Some(&lease))
                    .await
                    .expect("put pages");
                k += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            k
        })
    };
    let dir = tmp.path().join("out");
    std::fs::create_dir(&dir).unwrap();
    let file = dir.join("live.vhd");
    let file_s = file.to_string_lossy().into_owned();
    let out = tokio::task::spawn_blocking({
        let (drive, file_s) = (drive.clone(), file_s.clone());
        move || run(&["download", &drive, &file_s, "--parallel", "1"])
    })
    .await
    .unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let writes = writer.await.unwrap();
    assert!(writes > 0, "the writer wrote");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a torn download was kept: {err}");
    let lines: Vec<&str> = err.trim_end().lines().collect();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("leased") && l.contains("snapshot")),
        "warned up front: {err}"
    );
    let last = lines.last().copied().unwrap_or_default();
    assert!(
        last.starts_with("blobdrive: the drive changed while it was downloaded")
            && last.contains(&format!("'blobdrive snapshot {drive}'")),
        "{err}"
    );
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(left.is_empty(), "nothing left behind: {left:?}");

    // Leased but still: the download goes through, with the warning.
    let out = run(&["download", &drive, &file_s]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("leased"), "{err}");
    c.client.release_lease(&blob, &lease).await.unwrap();
    let data = blob_bytes(&c.client, &blob, ByteRange::new(0, len + 512)).await;
    assert!(
        std::fs::read(&file).unwrap() == data,
        "the kept download is the drive"
    );
}

/// `download --since --raw` checks the VHD footer of T2 as a full `--raw`
/// download does: a T2 without a valid footer is refused with the same line,
/// and the file is left holding T1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn download_since_raw_refuses_a_t2_without_a_footer_as_a_full_raw_does() {
    let c = ContainerGuard::new("since-raw").await;
    let (drive, [t0, _, _]) = drive_with_three_snapshots(&c, "d.vhd").await;
    let tmp = tempfile::tempdir().unwrap();
    let p = |n: &str| tmp.path().join(n).to_string_lossy().into_owned();
    let held = p("held.img");
    ok(&["download", &drive, &held, "--snapshot", &t0, "--raw"]);
    let before = std::fs::read(&held).unwrap();
    // T3: the footer overwritten (as a damaged or foreign blob has).
    let blob = c.path("d.vhd");
    let size = c.client.get_properties(&blob).await.unwrap().content_length;
    c.client
        .put_pages(&blob, size - 512, vec![0xAB; 512].into(), None)
        .await
        .expect("put pages");
    // (`blobdrive snapshot` refuses a blob without a footer: the client's.)
    let t3 = c.client.snapshot(&blob).await.expect("snapshot");

    let full = run(&[
        "download",
        &drive,
        &p("full.img"),
        "--snapshot",
        &t3,
        "--raw",
    ]);
    assert_refused(&full, "--raw needs a fixed VHD");
    let out = run(&[
        "download",
        &drive,
        &held,
        "--since",
        &t0,
        "--snapshot",
        &t3,
        "--raw",
    ]);
    assert_refused(&out, "--raw needs a fixed VHD");
    let line = |o: &Output| {
        let e = String::from_utf8_lossy(&o.stderr).into_owned();
        e.split(": ").skip(2).collect::<Vec<_>>().join(": ")
    };
    assert_eq!(line(&out), line(&full), "the same check");
    assert!(std::fs::read(&held).unwrap() == before, "the file holds T0");
    let record = blobdrive::transfer::file_state::read(Path::new(&held))
        .unwrap()
        .unwrap();
    assert_eq!(record.snapshot.as_deref(), Some(t0.as_str()));
    assert!(record.updating.is_none(), "{record:?}");
}

/// Two `download --since` of one file at once: the second is refused with
/// one line while the first runs (it holds the file's lock), and the first
/// ends with the file byte for byte a full download of T2. A full download
/// over the file meanwhile is refused the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn download_since_twice_at_once_refuses_the_second() {
    let c = ContainerGuard::new("since-twice").await;
    let tmp = tempfile::tempdir().unwrap();
    let p = |n: &str| tmp.path().join(n).to_string_lossy().into_owned();
    let len = 128 * MIB;
    let img = tmp.path().join("src.img");
    dense_file(&img, len, 31);
    let drive = format!("{}/big.vhd", c.name);
    ok(&["upload", img.to_str().unwrap(), &drive]);
    std::fs::remove_file(&img).unwrap();
    let blob = c.path("big.vhd");
    let t1 = snapshot(&drive);
    let local = p("local.vhd");
    ok(&["download", &drive, &local, "--snapshot", &t1]);
    // T2: half of every 4 MiB rewritten (64 MiB to fetch), 1 MiB cleared.
    for k in 0..len / (4 * MIB) {
        c.client
            .put_pages(&blob, k * 4 * MIB, random(2 * MIB, 300 + k).into(), None)
            .await
            .expect("put pages");
    }
    c.client
        .clear_pages(&blob, ByteRange::new(102 * MIB, 103 * MIB), None)
        .await
        .expect("clear pages");
    let t2 = snapshot(&drive);

    let since = [
        "download",
        &drive,
        &local,
        "--since",
        &t1,
        "--snapshot",
        &t2,
    ];
    let mut first = bin()
        .args(since)
        .args(["--parallel", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once the first marked the file as being updated, start the second.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(Instant::now() < deadline, "the first update never started");
        let record = blobdrive::transfer::file_state::read(Path::new(&local)).unwrap();
        if record.is_some_and(|r| r.updating.is_some()) {
            break;
        }
        assert!(
            first.try_wait().unwrap().is_none(),
            "the first update ended before the second could start"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let second = run(&since);
    assert_refused(&second, &format!("another update of {local} is running"));
    let over = run(&["download", &drive, &local, "--snapshot", &t2, "--overwrite"]);
    assert_refused(&over, &format!("another update of {local} is running"));
    assert!(
        first.try_wait().unwrap().is_none(),
        "the first update ended before the others were refused: not a test of the lock"
    );
    let done = first.wait_with_output().unwrap();
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let full = p("full.vhd");
    ok(&["download", &drive, &full, "--snapshot", &t2]);
    sh("cmp", &[&local, &full]);
}
