//! The disk tier on Azurite: warm reads after a reopen need no data request,
//! a blob changed by another client or a corrupted cache file never serves
//! wrong bytes, snapshot mounts share one cache, and the cache stays bounded.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blobdrive::blob::{BlobClient, BlobPath};
use blobdrive::drive::disk_cache::{self, StoredChunk};
use blobdrive::drive::{BlobPageStore, DiskCacheOptions, Drive, DriveOptions, Mode};
use blobdrive::vhd;
use bytes::Bytes;
use common::ContainerGuard;

const MIB: u64 = 1 << 20;
const READ_BYTES: usize = MIB as usize;

/// Deterministic, incompressible-looking content for `[offset, offset + len)`.
fn pattern(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            let x = ((offset + i) / 8) ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            (x.wrapping_mul(0xbf58_476d_1ce4_e5b9) >> ((offset + i) % 8 * 8)) as u8
        })
        .collect()
}

/// A drive of `size` bytes whose first `data` bytes hold `pattern(seed, ..)`.
async fn make_drive(g: &ContainerGuard, name: &str, size: u64, data: u64, seed: u64) -> BlobPath {
    let path = g.path(name);
    let c = &g.client;
    c.create_page_blob(&path, size + 512).await.unwrap();
    c.put_pages(
        &path,
        size,
        Bytes::copy_from_slice(&vhd::Footer::new_fixed(size).to_bytes()),
        None,
    )
    .await
    .unwrap();
    let step = 4 * MIB;
    let mut at = 0;
    while at < data {
        let n = step.min(data - at) as usize;
        c.put_pages(&path, at, pattern(seed, at, n).into(), None)
            .await
            .unwrap();
        at += n as u64;
    }
    path
}

fn opts(mode: Mode, dir: &Path, max_bytes: u64) -> DriveOptions {
    DriveOptions {
        mode,
        cache_bytes: 16 * MIB,
        disk_cache: Some(DiskCacheOptions {
            dir: dir.to_path_buf(),
            max_bytes,
        }),
        ..DriveOptions::default()
    }
}

async fn open(client: &BlobClient, path: &BlobPath, o: DriveOptions) -> Drive {
    let store = Arc::new(BlobPageStore::new(client.clone(), path.clone()));
    Drive::open(store, o).await.expect("drive opens")
}

/// Read `[0, len)` in 1 MiB reads; returns the bytes.
async fn read_all(d: &Drive, len: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len as usize);
    let mut at = 0;
    while at < len {
        let b = d.read_at(at, READ_BYTES).await.unwrap();
        assert!(!b.is_empty());
        out.extend_from_slice(&b);
        at += b.len() as u64;
    }
    out.truncate(len as usize);
    out
}

/// Every chunk the cache dir holds, by chunk index.
fn chunks_held(dir: &Path) -> Vec<StoredChunk> {
    let mut out = disk_cache::stored_chunks(dir).unwrap();
    out.sort_by_key(|c| c.index);
    out
}

/// Disk space used under `dir` (allocated blocks).
fn disk_usage(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        for e in std::fs::read_dir(&p).into_iter().flatten() {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() {
                stack.push(e.path());
            } else {
                total += m.blocks() * 512;
            }
        }
    }
    total
}

fn rate(bytes: u64, took: Duration) -> f64 {
    bytes as f64 / MIB as f64 / took.as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_after_reopen_come_from_disk_with_no_data_request() {
    let g = ContainerGuard::new("dcache-warm").await;
    let size = 256 * MIB;
    let data = 128 * MIB;
    let path = make_drive(&g, "warm.vhd", size, data, 1).await;
    let cache = tempfile::tempdir().unwrap();

    // First mount, read-write: everything comes from the blob.
    let d = open(&g.client, &path, opts(Mode::ReadWrite, cache.path(), GIB)).await;
    let cold = Instant::now();
    let first = read_all(&d, data).await;
    let cold = cold.elapsed();
    assert!(first == pattern(1, 0, data as usize), "cold read is right");
    let c = d.counters();
    assert_eq!(c.disk_hits, 0);
    assert_eq!(c.disk_misses, data / 512);
    d.close().await.unwrap();

    // Second mount: a new drive over a new store.
    let d = open(&g.client, &path, opts(Mode::ReadWrite, cache.path(), GIB)).await;
    let warm = Instant::now();
    let second = read_all(&d, data).await;
    let warm = warm.elapsed();
    assert!(second == first, "warm read is right");
    let c = d.counters();
    assert_eq!(c.get, 1, "only the footer was read from the blob");
    assert_eq!(c.bytes_down, 512);
    assert_eq!(c.disk_hits, data / 512);
    assert_eq!(c.disk_misses, 0);
    assert!(c.disk_bytes >= data);
    d.close().await.unwrap();

    // The same bytes from a local file, for comparison.
    let local = cache.path().join("local.bin");
    std::fs::write(&local, &first).unwrap();
    let t = Instant::now();
    let read_back = tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut f = std::fs::File::open(local).unwrap();
        let mut buf = vec![0u8; READ_BYTES];
        let mut n = 0u64;
        loop {
            let k = f.read(&mut buf).unwrap();
            if k == 0 {
                break n;
            }
            n += k as u64;
        }
    })
    .await
    .unwrap();
    let file = t.elapsed();
    assert_eq!(read_back, data);
    println!(
        "disk tier, {} MiB: cold (Azurite) {:.0} MiB/s, warm (disk tier) {:.0} MiB/s, \
         local file {:.0} MiB/s, warm/local = {:.2}",
        data / MIB,
        rate(data, cold),
        rate(data, warm),
        rate(data, file),
        file.as_secs_f64() / warm.as_secs_f64()
    );
}

const GIB: u64 = 1 << 30;

#[tokio::test]
async fn written_pages_reach_the_disk_tier_after_their_flush() {
    let g = ContainerGuard::new("dcache-write").await;
    let size = 64 * MIB;
    let path = make_drive(&g, "w.vhd", size, 0, 0).await;
    let cache = tempfile::tempdir().unwrap();
    let d = open(&g.client, &path, opts(Mode::ReadWrite, cache.path(), GIB)).await;
    let written = pattern(7, 0, 8 * MIB as usize);
    d.write_at(4096, &written).await.unwrap();
    d.close().await.unwrap();

    let d = open(&g.client, &path, opts(Mode::ReadWrite, cache.path(), GIB)).await;
    let back = d.read_at(4096, written.len()).await.unwrap();
    assert!(back[..] == written[..]);
    let c = d.counters();
    assert_eq!(c.get, 1, "written data came back from the disk tier: {c:?}");
    assert!(c.disk_hits >= written.len() as u64 / 512);
    // Overwrite part of it: the new bytes win, now and after a reopen.
    d.write_at(1 << 20, &[0xAB; 8192]).await.unwrap();
    let now = d.read_at(1 << 20, 8192).await.unwrap();
    assert!(now.iter().all(|&b| b == 0xAB));
    d.close().await.unwrap();
    let d = open(&g.client, &path, opts(Mode::ReadOnly, cache.path(), GIB)).await;
    let again = d.read_at(1 << 20, 8192).await.unwrap();
    assert!(again.iter().all(|&b| b == 0xAB));
    assert_eq!(d.counters().get, 1);
    d.close().await.unwrap();
}

#[tokio::test]
async fn a_blob_changed_by_another_client_drops_the_cache() {
    let g = ContainerGuard::new("dcache-changed").await;
    let size = 32 * MIB;
    let data = 16 * MIB;
    let path = make_drive(&g, "c.vhd", size, data, 2).await;
    let cache = tempfile::tempdir().unwrap();
    let d = open(&g.client, &path, opts(Mode::ReadWrite, cache.path(), GIB)).await;
    read_all(&d, data).await;
    d.close().await.unwrap();

    // Another client writes 1 MiB in the middle.
    let fresh = pattern(99, 5 * MIB, MIB as usize);
    g.client
        .put_pages(&path, 5 * MIB, fresh.clone().into(), None)
        .await
        .unwrap();

    for mode in [Mode::ReadOnly, Mode::ReadWrite] {
        let d = open(&g.client, &path, opts(mode, cache.path(), GIB)).await;
        let all = read_all(&d, data).await;
        assert!(
            all[5 * MIB as usize..6 * MIB as usize] == fresh[..],
            "{mode:?}: new bytes"
        );
        assert!(all[..5 * MIB as usize] == pattern(2, 0, 5 * MIB as usize)[..]);
        let c = d.counters();
        if mode == Mode::ReadOnly {
            assert_eq!(c.disk_hits, 0, "the whole cache was dropped");
            assert!(c.disk_misses >= data / 512, "the tier is on: {c:?}");
            assert!(c.bytes_down >= data);
        }
        d.close().await.unwrap();
    }
}

#[tokio::test]
async fn a_tier_whose_lease_was_broken_is_not_recorded_clean_at_another_hosts_state() {
    let g = ContainerGuard::new("dcache-broken").await;
    let size = 32 * MIB;
    let data = 8 * MIB;
    let path = make_drive(&g, "b.vhd", size, data, 4).await;
    let cache = tempfile::tempdir().unwrap();
    let d = open(&g.client, &path, opts(Mode::ReadWrite, cache.path(), GIB)).await;
    read_all(&d, data).await;
    // Another host breaks the lease and writes; this drive has nothing
    // dirty, so no request of its own notices before it closes.
    g.client.break_lease(&path, Some(0)).await.unwrap();
    let theirs = pattern(77, 2 * MIB, MIB as usize);
    g.client
        .put_pages(&path, 2 * MIB, theirs.clone().into(), None)
        .await
        .unwrap();
    let _ = d.close().await;

    for mode in [Mode::ReadWrite, Mode::ReadOnly] {
        let d = open(&g.client, &path, opts(mode, cache.path(), GIB)).await;
        let all = read_all(&d, data).await;
        assert!(
            all[2 * MIB as usize..3 * MIB as usize] == theirs[..],
            "{mode:?}: the other host's bytes, not the tier's"
        );
        assert!(all[..2 * MIB as usize] == pattern(4, 0, 2 * MIB as usize)[..]);
        d.close().await.unwrap();
    }
}

#[tokio::test]
async fn a_corrupted_cache_file_is_detected_and_reads_stay_right() {
    let g = ContainerGuard::new("dcache-corrupt").await;
    let size = 32 * MIB;
    let data = 8 * MIB;
    let path = make_drive(&g, "x.vhd", size, data, 3).await;
    let cache = tempfile::tempdir().unwrap();
    let d = open(&g.client, &path, opts(Mode::ReadOnly, cache.path(), GIB)).await;
    read_all(&d, data).await;
    d.close().await.unwrap();

    let chunks = chunks_held(cache.path());
    assert_eq!(chunks.len() as u64, data / (256 * 1024));
    let victim = &chunks[5];
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&victim.file)
            .unwrap();
        for at in [200, 50_000, 200_000] {
            let mut b = [0u8];
            f.read_exact_at(&mut b, victim.offset + at).unwrap();
            f.write_all_at(&[b[0] ^ 0x5a], victim.offset + at).unwrap();
        }
    }

    let d = open(&g.client, &path, opts(Mode::ReadOnly, cache.path(), GIB)).await;
    let all = read_all(&d, data).await;
    assert!(all == pattern(3, 0, data as usize), "reads are right");
    let c = d.counters();
    assert_eq!(c.disk_bad_chunks, 1);
    assert_eq!(c.get, 2, "footer, and the bad chunk again from the blob");
    assert_eq!(c.bytes_down, 512 + 256 * 1024);
    d.close().await.unwrap();
    // The bad chunk was replaced by a good copy.
    let d = open(&g.client, &path, opts(Mode::ReadOnly, cache.path(), GIB)).await;
    read_all(&d, data).await;
    assert_eq!((d.counters().get, d.counters().disk_bad_chunks), (1, 0));
    d.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_snapshot_mounts_share_one_cache() {
    let g = ContainerGuard::new("dcache-snap").await;
    let size = 64 * MIB;
    let data = 32 * MIB;
    let base = make_drive(&g, "s.vhd", size, data, 4).await;
    let time = g.client.snapshot(&base).await.unwrap();
    // The base changes after the snapshot; the snapshot does not.
    g.client
        .put_pages(&base, 0, vec![0xEE; MIB as usize].into(), None)
        .await
        .unwrap();
    let mut snap = base.clone();
    snap.snapshot = Some(time);
    let cache = tempfile::tempdir().unwrap();
    let mut drives = Vec::new();
    for _ in 0..3 {
        drives.push(open(&g.client, &snap, opts(Mode::Snapshot, cache.path(), GIB)).await);
    }
    let want = pattern(4, 0, data as usize);
    assert!(read_all(&drives[0], data).await == want);
    // Wait until the first mount's copies are on disk.
    let deadline = Instant::now() + Duration::from_secs(60);
    while drives[0].counters().disk_bytes < data && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for d in &drives[1..] {
        assert!(read_all(d, data).await == want);
        let c = d.counters();
        assert_eq!(c.get, 1, "only the footer: {c:?}");
        assert_eq!(c.disk_hits, data / 512);
    }
    assert_eq!(chunks_held(cache.path()).len() as u64, data / (256 * 1024));
    for d in drives {
        d.close().await.unwrap();
    }
}

/// Several snapshot mounts started at once (fstab at boot) on a fresh cache:
/// one of them empties and records the directory while the others wait, and
/// every one of them gets the tier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_mounts_opened_at_once_on_a_fresh_cache_all_use_it() {
    let g = ContainerGuard::new("dcache-race").await;
    let base = make_drive(&g, "r.vhd", 16 * MIB, 4 * MIB, 9).await;
    let mut snap = base.clone();
    snap.snapshot = Some(g.client.snapshot(&base).await.unwrap());
    let want = pattern(9, 0, 512 * 1024);
    for round in 0..10 {
        let cache = tempfile::tempdir().unwrap();
        let o = || opts(Mode::Snapshot, cache.path(), GIB);
        let (a, b, c) = tokio::join!(
            open(&g.client, &snap, o()),
            open(&g.client, &snap, o()),
            open(&g.client, &snap, o()),
        );
        for d in [&a, &b, &c] {
            assert!(d.read_at(0, want.len()).await.unwrap()[..] == want[..]);
            let k = d.counters();
            assert!(
                k.disk_hits + k.disk_misses > 0,
                "round {round}: a mount runs without the disk tier: {k:?}"
            );
        }
        for d in [a, b, c] {
            d.close().await.unwrap();
        }
    }
}

#[tokio::test]
async fn the_disk_tier_stays_under_its_bound() {
    let g = ContainerGuard::new("dcache-bound").await;
    let size = 64 * MIB;
    let data = 48 * MIB;
    let max = 8 * MIB;
    let path = make_drive(&g, "b.vhd", size, data, 5).await;
    let cache = tempfile::tempdir().unwrap();
    let d = open(&g.client, &path, opts(Mode::ReadWrite, cache.path(), max)).await;
    assert!(read_all(&d, data).await == pattern(5, 0, data as usize));
    d.close().await.unwrap();
    let used = disk_usage(cache.path());
    println!("disk tier bound {max} bytes, used {used} bytes after reading {data}");
    assert!(used <= max, "{used} > {max}");
    assert!(used >= max / 2, "the cache is used: {used}");
    // What is left is the most recent part and is served from disk.
    let d = open(&g.client, &path, opts(Mode::ReadOnly, cache.path(), max)).await;
    let tail = d.read_at(data - MIB, MIB as usize).await.unwrap();
    assert!(tail[..] == pattern(5, data - MIB, MIB as usize)[..]);
    assert_eq!(d.counters().get, 1);
    d.close().await.unwrap();
}

#[tokio::test]
async fn cache_clear_empties_the_cache_dir() {
    let g = ContainerGuard::new("dcache-clear").await;
    let path = make_drive(&g, "c.vhd", 16 * MIB, 4 * MIB, 6).await;
    let cache = tempfile::tempdir().unwrap();
    let d = open(&g.client, &path, opts(Mode::ReadOnly, cache.path(), GIB)).await;
    read_all(&d, 4 * MIB).await;
    let busy = blobdrive::drive::disk_cache::clear(cache.path()).unwrap();
    assert_eq!(busy.in_use, 1, "a mounted drive's cache is left alone");
    d.close().await.unwrap();
    drop(d);
    let done = blobdrive::drive::disk_cache::clear(cache.path()).unwrap();
    assert_eq!(done.removed, 1);
    assert!(chunks_held(cache.path()).is_empty());
}

/// The closing record relies on this: the ETag read after the last flush,
/// under the lease, is still the blob's ETag after release and re-acquire.
#[tokio::test]
async fn lease_acquire_and_release_keep_the_etag_but_put_page_changes_it() {
    let g = ContainerGuard::new("dcache-etag").await;
    let path = make_drive(&g, "e.vhd", 16 * MIB, 0, 0).await;
    let c = &g.client;
    let etag = || async { c.get_properties(&path).await.unwrap().etag.unwrap() };
    let e0 = etag().await;
    let id = uuid::Uuid::new_v4().to_string();
    c.acquire_lease(&path, &id, None).await.unwrap();
    assert_eq!(etag().await, e0, "acquire keeps the ETag");
    c.put_pages(&path, 0, vec![1u8; 512].into(), Some(&id))
        .await
        .unwrap();
    let e1 = etag().await;
    assert_ne!(e1, e0, "put page changes the ETag");
    c.release_lease(&path, &id).await.unwrap();
    assert_eq!(etag().await, e1, "release keeps the ETag");
}

#[tokio::test]
async fn a_writer_that_crashed_leaves_nothing_trusted() {
    let g = ContainerGuard::new("dcache-crash").await;
    let size = 16 * MIB;
    let data = 4 * MIB;
    let path = make_drive(&g, "k.vhd", size, data, 8).await;
    let cache = tempfile::tempdir().unwrap();
    let d = open(&g.client, &path, opts(Mode::ReadWrite, cache.path(), GIB)).await;
    read_all(&d, data).await;
    d.write_at(0, &[0x11; 4096]).await.unwrap();
    d.flush().await.unwrap();
    drop(d); // no close: like a crash
    g.client.break_lease(&path, Some(0)).await.unwrap();
    // Wait for the dropped drive's cache writer to let go of the directory.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let d = open(&g.client, &path, opts(Mode::ReadWrite, cache.path(), GIB)).await;
    let all = read_all(&d, data).await;
    let mut want = pattern(8, 0, data as usize);
    want[..4096].fill(0x11);
    assert!(all == want);
    let c = d.counters();
    assert_eq!(c.disk_hits, 0, "no clean close record: nothing trusted");
    assert_eq!(c.disk_misses, data / 512, "the tier is on, and empty");
    assert!(c.bytes_down >= data);
    d.close().await.unwrap();
}

/// A tier an older blobdrive left (layout v1: one file per chunk, in a
/// directory named like this version's) that claims, under a clean record
/// of the blob's current ETag, other bytes than the blob's: it is removed at
/// the next mount, and every read comes from the blob.
#[tokio::test]
async fn a_tier_left_by_an_older_blobdrive_is_removed_and_never_served() {
    let g = ContainerGuard::new("dcache-v1").await;
    let data = 4 * MIB;
    let path = make_drive(&g, "v.vhd", 16 * MIB, data, 10).await;
    let cache = tempfile::tempdir().unwrap();
    // This version's tier of the blob gives the directory name and a record
    // that vouches for the blob's ETag; the older layout gets both.
    let d = open(&g.client, &path, opts(Mode::ReadOnly, cache.path(), GIB)).await;
    read_all(&d, data).await;
    d.close().await.unwrap();
    let old = cache.path().join("v1");
    std::fs::rename(cache.path().join("v2"), &old).unwrap();
    let drive_dir = std::fs::read_dir(&old)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let chunks = drive_dir.join("chunks");
    std::fs::remove_dir_all(&chunks).unwrap();
    std::fs::create_dir(&chunks).unwrap();
    for idx in 0..data / (256 * 1024) {
        std::fs::write(chunks.join(format!("{idx:016x}")), v1_chunk_file(idx, 0x33)).unwrap();
    }

    let d = open(&g.client, &path, opts(Mode::ReadOnly, cache.path(), GIB)).await;
    assert!(!old.exists(), "the older tier is gone");
    assert!(read_all(&d, data).await == pattern(10, 0, data as usize));
    let c = d.counters();
    assert_eq!(
        c.disk_hits, 0,
        "nothing of the older tier was served: {c:?}"
    );
    assert!(c.bytes_down >= data);
    d.close().await.unwrap();
}

/// A chunk file as blobdrive's first tier layout wrote it: magic
/// `BDCHUNK1`, chunk index, held and zero page bitmaps, data length, the
/// CRC-32C of all that and the data, then the data (every page held, `fill`).
fn v1_chunk_file(idx: u64, fill: u8) -> Vec<u8> {
    let mut out = b"BDCHUNK1".to_vec();
    out.extend_from_slice(&idx.to_le_bytes());
    out.extend_from_slice(&[0xff; 64]);
    out.extend_from_slice(&[0; 64]);
    out.extend_from_slice(&(256u32 * 1024).to_le_bytes());
    let data = vec![fill; 256 * 1024];
    let crc = crc32c::crc32c_append(crc32c::crc32c(&out), &data);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&data);
    out
}

/// Take a write lock on `chunk`'s slot through an open file description of
/// our own, as a stopped process sharing the directory would hold it.
fn hold_slot(chunk: &StoredChunk) -> std::fs::File {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&chunk.file)
        .unwrap();
    // SAFETY: an all-zero `flock` is a valid value of this plain C struct.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = chunk.offset as libc::off_t;
    fl.l_len = disk_cache::SLOT_BYTES as libc::off_t;
    // SAFETY: fcntl on a descriptor we own with a pointer to a live flock.
    assert_eq!(
        unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &fl) },
        0
    );
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_held_by_a_stopped_process_does_not_hang_reads() {
    let g = ContainerGuard::new("dcache-held").await;
    let size = 32 * MIB;
    let data = 4 * MIB;
    let path = make_drive(&g, "held.vhd", size, data, 7).await;
    let cache = tempfile::tempdir().unwrap();
    let d = open(&g.client, &path, opts(Mode::ReadOnly, cache.path(), GIB)).await;
    read_all(&d, data).await;
    d.close().await.unwrap();

    let held = hold_slot(&chunks_held(cache.path())[0]);
    let d = open(&g.client, &path, opts(Mode::ReadOnly, cache.path(), GIB)).await;
    let got = tokio::time::timeout(Duration::from_secs(20), d.read_at(0, 256 * 1024))
        .await
        .expect("the read came back")
        .unwrap();
    assert!(
        got[..] == pattern(7, 0, 256 * 1024)[..],
        "the read is right"
    );
    assert!(d.counters().get >= 2, "the held chunk came from the blob");
    d.close().await.unwrap();
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discarded_range_reads_zeros_after_a_remount() {
    let g = ContainerGuard::new("dcache-discard").await;
    let size = 32 * MIB;
    let data = 4 * MIB;
    let path = make_drive(&g, "discard.vhd", size, data, 8).await;
    let cache = tempfile::tempdir().unwrap();
    let d = open(&g.client, &path, opts(Mode::ReadWrite, cache.path(), GIB)).await;
    read_all(&d, data).await;
    d.close().await.unwrap();
    // Its chunks are on disk only, not in memory, when the discard comes.
    let d = open(&g.client, &path, opts(Mode::ReadWrite, cache.path(), GIB)).await;
    d.discard(0, MIB).await.unwrap();
    d.close().await.unwrap();
    let d = open(&g.client, &path, opts(Mode::ReadWrite, cache.path(), GIB)).await;
    let all = read_all(&d, data).await;
    assert!(all[..MIB as usize].iter().all(|&b| b == 0), "discarded");
    assert!(all[MIB as usize..] == pattern(8, MIB, (data - MIB) as usize)[..]);
    d.close().await.unwrap();
}
