//! The drive engine over the real REST client and Azurite: the model test,
//! sparse behaviour and the lease as mount lock, with the blob's bytes checked
//! by an independent client (the official Python SDK).

mod common;

use std::sync::Arc;

use blobdrive::blob::{BlobClient, BlobPath, LeaseState};
use blobdrive::drive::{BlobPageStore, Drive, DriveOptions, Error, Mode};
use blobdrive::vhd;
use common::ContainerGuard;
use rand::{Rng, SeedableRng};

const MIB: u64 = 1024 * 1024;

async fn make_drive(g: &ContainerGuard, name: &str, size: u64) -> BlobPath {
    let path = g.path(name);
    common::make_drive(&g.client, &path, size).await;
    path
}

fn options(mode: Mode, cache_bytes: u64) -> DriveOptions {
    DriveOptions {
        mode,
        cache_bytes,
        target: "test drive".into(),
        ..DriveOptions::default()
    }
}

async fn open(client: &BlobClient, path: &BlobPath, opts: DriveOptions) -> Result<Drive, Error> {
    Drive::open(
        Arc::new(BlobPageStore::new(client.clone(), path.clone())),
        opts,
    )
    .await
}

/// The whole blob as the Python SDK reads it (an independent client).
fn python_download(path: &BlobPath) -> Vec<u8> {
    let script = "import sys\n\
        from azure.storage.blob import BlobClient\n\
        b = BlobClient.from_connection_string(sys.argv[1], sys.argv[2], sys.argv[3])\n\
        sys.stdout.buffer.write(b.download_blob().readall())\n";
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            script,
            &common::connection_string(),
            &path.container,
            &path.name,
        ])
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "python SDK download failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Random unaligned writes, zero writes, discards, reads, flushes and reopens
/// against a plain `Vec<u8>`; then the blob, read by the Python SDK, must equal
/// the model with the footer intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_operations_on_azurite_match_a_vec_model_and_the_sdk_sees_them() {
    let g = ContainerGuard::new("drive-model").await;
    let size = 16 * MIB;
    let path = make_drive(&g, "model.vhd", size).await;
    let seed: u64 = std::env::var("BLOBDRIVE_DRIVE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    println!("seed {seed} (BLOBDRIVE_DRIVE_SEED reproduces it)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut model = vec![0u8; size as usize];
    // A 2 MiB cache over 16 MiB forces eviction and re-reads from the blob.
    let mut drive = open(&g.client, &path, options(Mode::ReadWrite, 2 * MIB))
        .await
        .unwrap();
    for step in 0..250 {
        let offset = rng.random_range(0..size);
        let len = rng.random_range(1..=(256 * 1024)).min(size - offset) as usize;
        match rng.random_range(0..10) {
            0..=3 => {
                let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                drive.write_at(offset, &data).await.unwrap();
                model[offset as usize..offset as usize + len].copy_from_slice(&data);
            }
            4 => {
                drive.write_at(offset, &vec![0; len]).await.unwrap();
                model[offset as usize..offset as usize + len].fill(0);
            }
            5 => {
                drive.discard(offset, len as u64).await.unwrap();
                model[offset as usize..offset as usize + len].fill(0);
            }
            6..=8 => {
                let got = drive.read_at(offset, len).await.unwrap();
                assert!(
                    got[..] == model[offset as usize..offset as usize + len],
                    "seed {seed} step {step}: read {offset}+{len} differs"
                );
            }
            _ => {
                if rng.random_bool(0.5) {
                    drive.flush().await.unwrap();
                } else {
                    drive.close().await.unwrap();
                    drive = open(&g.client, &path, options(Mode::ReadWrite, 2 * MIB))
                        .await
                        .unwrap();
                }
            }
        }
    }
    drive.close().await.unwrap();
    let blob = python_download(&path);
    assert_eq!(blob.len() as u64, size + 512);
    assert!(
        blob[..size as usize] == model[..],
        "seed {seed}: blob differs from the model"
    );
    let footer: [u8; 512] = blob[size as usize..].try_into().unwrap();
    vhd::Footer::parse(&footer, size + 512).expect("footer intact");
}

#[tokio::test]
async fn sparse_reads_and_writes_cost_only_the_requests_they_need() {
    let g = ContainerGuard::new("drive-sparse").await;
    let size = 1024 * MIB;
    let path = make_drive(&g, "sparse.vhd", size).await;
    let drive = open(&g.client, &path, options(Mode::ReadWrite, 64 * MIB))
        .await
        .unwrap();
    let opened = drive.counters();

    // Reading a never-written GiB makes no data request at all.
    let mut at = 0;
    while at < size {
        let got = drive.read_at(at, 4 * MIB as usize).await.unwrap();
        assert!(got.iter().all(|&b| b == 0));
        at += 4 * MIB;
    }
    let after_read = drive.counters();
    assert_eq!(
        after_read.get, opened.get,
        "no Get Blob for unwritten pages"
    );
    assert_eq!(after_read.bytes_down, opened.bytes_down);

    // A 4 KiB write into a fresh region needs no read-modify-write.
    drive
        .write_at(100 * MIB + 1000, &[7u8; 4096])
        .await
        .unwrap();
    drive.flush().await.unwrap();
    let after_small = drive.counters();
    assert_eq!(after_small.get, opened.get, "no read for a fresh region");

    // 64 MiB written sequentially go out in at most 17 Put Page requests.
    let block = vec![0x5au8; MIB as usize];
    for i in 0..64 {
        drive.write_at(200 * MIB + i * MIB, &block).await.unwrap();
    }
    drive.flush().await.unwrap();
    let puts = drive.counters().put_page - after_small.put_page;
    assert!(puts <= 17, "64 MiB took {puts} Put Page requests");

    // Zeros over written pages clear them: the blob stores less.
    let stored = |c: BlobClient, p: BlobPath| async move {
        let ranges = c.get_page_ranges(&p, None).await.unwrap().ranges;
        ranges.iter().map(|r| r.len()).sum::<u64>()
    };
    let before = stored(g.client.clone(), path.clone()).await;
    drive
        .write_at(200 * MIB, &vec![0u8; 32 * MIB as usize])
        .await
        .unwrap();
    drive.flush().await.unwrap();
    let after = stored(g.client.clone(), path.clone()).await;
    assert!(
        after + 32 * MIB <= before,
        "stored {before} -> {after} after zeroing 32 MiB"
    );
    drive.close().await.unwrap();
}

#[tokio::test]
async fn the_lease_is_the_mount_lock_on_azurite() {
    let g = ContainerGuard::new("drive-lock").await;
    let size = 16 * MIB;
    let path = make_drive(&g, "locked.vhd", size).await;
    let first = open(&g.client, &path, options(Mode::ReadWrite, 8 * MIB))
        .await
        .unwrap();
    first.write_at(0, b"first writer").await.unwrap();
    first.flush().await.unwrap();

    let second = open(&g.client, &path, options(Mode::ReadWrite, 8 * MIB)).await;
    assert!(
        matches!(second, Err(Error::InUse { .. })),
        "second writer must be refused while the lease is held"
    );

    // A snapshot opens (no lease) while the base is leased, and keeps old bytes.
    let snap = g.client.snapshot(&path).await.unwrap();
    first.write_at(0, b"later bytes!").await.unwrap();
    first.flush().await.unwrap();
    let snapshot_path = path.clone().with_snapshot(Some(&snap));
    let reader = open(&g.client, &snapshot_path, options(Mode::Snapshot, 8 * MIB))
        .await
        .unwrap();
    assert_eq!(&reader.read_at(0, 12).await.unwrap()[..], b"first writer");
    reader.close().await.unwrap();

    // Someone breaks the lease: the next flush fails loudly and keeps the data.
    g.client.break_lease(&path, Some(0)).await.unwrap();
    first.write_at(4096, b"unflushed").await.unwrap();
    let err = first.flush().await.unwrap_err();
    assert!(matches!(err, Error::LeaseLost { .. }), "{err}");
    assert!(
        first.unflushed_bytes() > 0,
        "dirty data must not be dropped"
    );

    // After close (which cannot flush) another writer may take the drive.
    let _ = first.close().await;
    let third = open(&g.client, &path, options(Mode::ReadWrite, 8 * MIB))
        .await
        .unwrap();
    third.close().await.unwrap();

    // A normal close releases the lease: the next writer gets in at once.
    let props = g.client.get_properties(&path).await.unwrap();
    assert_eq!(props.lease_state, Some(LeaseState::Available));
    let fourth = open(&g.client, &path, options(Mode::ReadWrite, 8 * MIB))
        .await
        .unwrap();
    fourth.close().await.unwrap();
}

/// Several tasks at once, each owning 1 MiB of the drive: unaligned writes,
/// discards, flushes and read-backs through a cache too small to hold them,
/// then the blob (read by the Python SDK) equals what the tasks wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn concurrent_tasks_on_azurite_match_the_model_and_the_sdk_sees_them() {
    let g = ContainerGuard::new("drive-concurrent").await;
    let (tasks, region) = (4u64, MIB);
    let size = 16 * MIB;
    let path = make_drive(&g, "conc.vhd", size).await;
    let seed: u64 = std::env::var("BLOBDRIVE_DRIVE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    println!("seed {seed} (BLOBDRIVE_DRIVE_SEED reproduces it)");
    let opts = DriveOptions {
        max_dirty_bytes: Some(MIB),
        flush_delay: std::time::Duration::from_millis(5),
        ..options(Mode::ReadWrite, 2 * MIB)
    };
    let drive = Arc::new(open(&g.client, &path, opts).await.unwrap());
    let mut handles = Vec::new();
    for t in 0..tasks {
        let drive = drive.clone();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ t);
        handles.push(tokio::spawn(async move {
            let base = t * region;
            let mut mine = vec![0u8; region as usize];
            for step in 0..40 {
                let offset = rng.random_range(0..region);
                let len = rng.random_range(1..=64 * 1024).min(region - offset) as usize;
                let at = offset as usize;
                match rng.random_range(0..8) {
                    0 => {
                        drive.discard(base + offset, len as u64).await.unwrap();
                        mine[at..at + len].fill(0);
                    }
                    1 => drive.flush().await.unwrap(),
                    _ => {
                        let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                        drive.write_at(base + offset, &data).await.unwrap();
                        mine[at..at + len].copy_from_slice(&data);
                    }
                }
                let back = drive.read_at(base, region as usize).await.unwrap();
                assert!(
                    back[..] == mine[..],
                    "seed {seed}: task {t} step {step} reads back other data"
                );
            }
            mine
        }));
    }
    let mut model = Vec::new();
    for h in handles {
        model.extend_from_slice(&h.await.unwrap());
    }
    drive.close().await.unwrap();
    let blob = python_download(&path);
    assert!(
        blob[..model.len()] == model[..],
        "seed {seed}: the blob differs from what the tasks wrote"
    );
    assert!(blob[model.len()..size as usize].iter().all(|&b| b == 0));
    let footer: &[u8; 512] = blob[size as usize..].try_into().expect("a 512-byte footer");
    vhd::Footer::parse(footer, blob.len() as u64).expect("the footer is intact");
}
