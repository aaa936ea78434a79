//! The drive engine against the in-memory page store: model-based property
//! tests (every read equals a plain `Vec<u8>` model; after flush and reopen
//! the blob holds exactly the model), sparse behaviour counted in requests,
//! lease as mount lock, lost-lease handling, and the memory bound.

use std::sync::Arc;
use std::time::{Duration, Instant};

use blobdrive::blob;
use blobdrive::drive::{
    DiskCacheOptions, Drive, DriveOptions, Error, MemoryStore, Mode, PageStore,
};
use blobdrive::units::{ByteRange, PAGE_SIZE, VHD_FOOTER_BYTES};
use proptest::prelude::*;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

/// A minimal valid fixed VHD footer for a data area of `data_bytes`.
fn footer(data_bytes: u64) -> [u8; 512] {
    let mut f = [0u8; 512];
    f[0..8].copy_from_slice(b"conectix");
    f[8..12].copy_from_slice(&2u32.to_be_bytes());
    f[12..16].copy_from_slice(&0x0001_0000u32.to_be_bytes());
    f[16..24].copy_from_slice(&u64::MAX.to_be_bytes());
    f[40..48].copy_from_slice(&data_bytes.to_be_bytes());
    f[48..56].copy_from_slice(&data_bytes.to_be_bytes());
    f[60..64].copy_from_slice(&2u32.to_be_bytes());
    let sum: u32 = f.iter().map(|&b| b as u32).sum();
    f[64..68].copy_from_slice(&(!sum).to_be_bytes());
    f
}

/// A page blob holding a fresh fixed VHD with `data_bytes` of data area.
fn new_store(data_bytes: u64) -> Arc<MemoryStore> {
    let s = MemoryStore::new(data_bytes + VHD_FOOTER_BYTES);
    s.poke(data_bytes, &footer(data_bytes));
    Arc::new(s)
}

fn opts(mode: Mode) -> DriveOptions {
    DriveOptions {
        mode,
        target: "test/disk.vhd".into(),
        ..DriveOptions::default()
    }
}

async fn open(store: &Arc<MemoryStore>, o: DriveOptions) -> Drive {
    Drive::open(store.clone() as Arc<dyn PageStore>, o)
        .await
        .expect("open drive")
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

fn data_area(store: &MemoryStore, data_bytes: u64) -> Vec<u8> {
    store.contents(ByteRange::new(0, data_bytes))
}

// ---------------------------------------------------------------------------
// Model-based property tests
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Write {
        offset: u64,
        len: usize,
        seed: u8,
    },
    Zeros {
        offset: u64,
        len: usize,
    },
    Read {
        offset: u64,
        len: usize,
    },
    /// Read on from where the last read ended (sequential: read-ahead).
    ReadNext {
        len: usize,
    },
    Discard {
        offset: u64,
        len: u64,
    },
    Flush,
    Reopen,
    /// Close, let another client write 3 pages at `page`, open again.
    ReopenAfterForeignWrite {
        page: u64,
        seed: u8,
    },
    /// The store fails the next write with a transient error.
    Fault,
}

/// 3 MiB and a bit: not a whole number of chunks, to test the tail.
const MODEL_BYTES: u64 = 3 * MIB + 1536;

fn op_strategy() -> impl Strategy<Value = Op> {
    let offset = prop_oneof![
        0..MODEL_BYTES + 1000,
        (0..MODEL_BYTES / 512).prop_map(|p| p * 512),
        (MODEL_BYTES - 2000)..MODEL_BYTES + 10,
    ];
    let len = prop_oneof![1usize..700, 1usize..70_000, 200_000usize..600_000];
    prop_oneof![
        4 => (offset.clone(), len.clone(), any::<u8>())
            .prop_map(|(offset, len, seed)| Op::Write { offset, len, seed }),
        1 => (offset.clone(), len.clone()).prop_map(|(offset, len)| Op::Zeros { offset, len }),
        4 => (offset.clone(), len.clone()).prop_map(|(offset, len)| Op::Read { offset, len }),
        1 => (offset, len).prop_map(|(offset, len)| Op::Discard { offset, len: len as u64 }),
        1 => Just(Op::Flush),
        1 => Just(Op::Reopen),
        1 => (0..MODEL_BYTES / 512 - 3, any::<u8>())
            .prop_map(|(page, seed)| Op::ReopenAfterForeignWrite { page, seed }),
        1 => Just(Op::Fault),
        3 => (1usize..200_000).prop_map(|len| Op::ReadNext { len }),
    ]
}

/// Apply a write to the model, as the drive must (or refuse it).
fn model_write(model: &mut [u8], offset: u64, data: &[u8]) -> bool {
    let end = offset + data.len() as u64;
    if end > model.len() as u64 {
        return false;
    }
    model[offset as usize..end as usize].copy_from_slice(data);
    true
}

fn transient() -> blob::Error {
    blob::Error::service(
        "put page",
        "test/disk.vhd",
        503,
        Some("ServerBusy".into()),
        "busy",
    )
}

/// A write or discard either succeeded (the model already holds it) or met
/// the injected fault in a flush it had to wait for; then, like a disk after
/// EIO, the range holds old or new bytes, and the model adopts what the
/// drive reads there. Everything else must still match.
async fn failed_write(
    drive: &Drive,
    model: &mut [u8],
    r: Result<(), Error>,
    offset: u64,
    len: u64,
) {
    match r {
        Ok(()) => {}
        Err(Error::Backend(_)) => {
            let got = drive
                .read_at(offset, len as usize)
                .await
                .expect("read after fault");
            model[offset as usize..(offset + len) as usize].copy_from_slice(&got);
        }
        Err(e) => panic!("write failed: {e:?}"),
    }
}

/// `disk_tier`: with a disk cache below the memory cache (kept across reopens).
async fn run_model(
    ops: Vec<Op>,
    preload: Vec<(u64, u8)>,
    cache_bytes: u64,
    flush_delay_ms: u64,
    disk_tier: bool,
) {
    let cache_dir = tempfile::tempdir().expect("temp dir");
    let disk_cache = disk_tier.then(|| DiskCacheOptions {
        dir: cache_dir.path().to_path_buf(),
        max_bytes: 2 * MIB,
    });
    let store = new_store(MODEL_BYTES);
    let mut model = vec![0u8; MODEL_BYTES as usize];
    for (page, seed) in preload {
        let data = pattern(seed, 512 * 3);
        let at = page * 512;
        if at + data.len() as u64 <= MODEL_BYTES {
            store.poke(at, &data);
            model_write(&mut model, at, &data);
        }
    }
    let o = DriveOptions {
        cache_bytes,
        max_dirty_bytes: Some(cache_bytes / 4),
        flush_delay: Duration::from_millis(flush_delay_ms),
        flush_parallelism: 4,
        read_ahead_bytes: 256 * KIB,
        disk_cache: disk_cache.clone(),
        ..opts(Mode::ReadWrite)
    };
    let mut drive = open(&store, o.clone()).await;
    let mut last_end = 0u64;
    for op in ops {
        let op = match op {
            Op::ReadNext { len } => Op::Read {
                offset: last_end,
                len,
            },
            op => op,
        };
        match op {
            Op::Write { offset, len, seed } => {
                let data = pattern(seed, len);
                let r = drive.write_at(offset, &data).await;
                if model_write(&mut model, offset, &data) {
                    failed_write(&drive, &mut model, r, offset, len as u64).await;
                } else {
                    assert!(matches!(r, Err(Error::OutOfRange { .. })), "{r:?}");
                }
            }
            Op::Zeros { offset, len } => {
                let data = vec![0u8; len];
                let r = drive.write_at(offset, &data).await;
                if model_write(&mut model, offset, &data) {
                    failed_write(&drive, &mut model, r, offset, len as u64).await;
                } else {
                    assert!(matches!(r, Err(Error::OutOfRange { .. })), "{r:?}");
                }
            }
            Op::ReadNext { .. } => unreachable!("turned into a read above"),
            Op::Read { offset, len } => {
                last_end = (offset + len as u64).min(MODEL_BYTES);
                let got = drive.read_at(offset, len).await.expect("read");
                let start = (offset as usize).min(model.len());
                let end = (offset as usize + len).min(model.len());
                assert_eq!(got.len(), end - start, "read length at {offset}+{len}");
                assert!(
                    got[..] == model[start..end],
                    "read {offset}+{len} differs from model"
                );
            }
            Op::Discard { offset, len } => {
                let r = drive.discard(offset, len).await;
                if offset + len <= MODEL_BYTES {
                    model[offset as usize..(offset + len) as usize].fill(0);
                    failed_write(&drive, &mut model, r, offset, len).await;
                } else {
                    assert!(matches!(r, Err(Error::OutOfRange { .. })), "{r:?}");
                }
            }
            Op::Fault => store.fail_next_writes(1, transient()),
            Op::Flush => {
                if let Err(e) = drive.flush().await {
                    // Only the injected fault may fail it; a retry succeeds.
                    assert!(matches!(e, Error::Backend(_)), "{e:?}");
                    drive.flush().await.expect("flush after a transient fault");
                }
                assert_eq!(drive.unflushed_bytes(), 0);
                assert!(
                    data_area(&store, MODEL_BYTES) == model,
                    "store differs after flush"
                );
            }
            Op::Reopen | Op::ReopenAfterForeignWrite { .. } => {
                if let Err(e) = drive.close().await {
                    assert!(matches!(e, Error::Backend(_)), "{e:?}");
                    drive.close().await.expect("close after a transient fault");
                }
                assert!(
                    data_area(&store, MODEL_BYTES) == model,
                    "store differs after close"
                );
                if let Op::ReopenAfterForeignWrite { page, seed } = op {
                    let data = pattern(seed, 3 * 512);
                    store.poke(page * 512, &data);
                    model_write(&mut model, page * 512, &data);
                }
                drive = open(&store, o.clone()).await;
            }
        }
        let c = drive.counters();
        assert!(
            c.cache_bytes <= cache_bytes.max(2 * MIB),
            "cache over its bound: {c:?}"
        );
    }
    if let Err(e) = drive.close().await {
        assert!(matches!(e, Error::Backend(_)), "{e:?}");
        drive
            .close()
            .await
            .expect("final close after a transient fault");
    }
    assert!(
        data_area(&store, MODEL_BYTES) == model,
        "store differs from model at the end"
    );
    assert_eq!(
        store.contents(ByteRange::new(MODEL_BYTES, MODEL_BYTES + 512)),
        footer(MODEL_BYTES).to_vec(),
        "footer changed"
    );
    // Reading everything back through a fresh drive gives the model too
    // (from the disk tier, when there is one), twice.
    for _ in 0..2 {
        let o = DriveOptions {
            disk_cache: disk_cache.clone(),
            ..opts(Mode::ReadOnly)
        };
        let ro = open(&store, o).await;
        let all = ro.read_at(0, MODEL_BYTES as usize + 4096).await.unwrap();
        assert!(all[..] == model[..], "read-only reopen differs from model");
        ro.close().await.unwrap();
    }
}

/// Proptest cases: `PROPTEST_CASES` when set (for long soak runs), else `default`.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(48), ..ProptestConfig::default() })]

    #[test]
    fn random_ops_match_a_vec_model(
        ops in prop::collection::vec(op_strategy(), 1..40),
        preload in prop::collection::vec((0..MODEL_BYTES / 512, any::<u8>()), 0..20),
        small_cache in any::<bool>(),
        flush_delay_ms in prop_oneof![Just(0u64), Just(2), Just(10_000)],
        threads in any::<bool>(),
    ) {
        let cache = if small_cache { 2 * MIB } else { 64 * MIB };
        let rt = if threads {
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
        } else {
            runtime()
        };
        rt.block_on(run_model(ops, preload, cache, flush_delay_ms, false));
    }

    #[test]
    fn random_ops_with_the_disk_tier_match_a_vec_model(
        ops in prop::collection::vec(op_strategy(), 1..40),
        preload in prop::collection::vec((0..MODEL_BYTES / 512, any::<u8>()), 0..20),
        flush_delay_ms in prop_oneof![Just(0u64), Just(2), Just(10_000)],
        threads in any::<bool>(),
    ) {
        // A 2 MiB memory cache over a 3 MiB drive: reads go to the disk tier.
        let rt = if threads {
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
        } else {
            runtime()
        };
        rt.block_on(run_model(ops, preload, 2 * MIB, flush_delay_ms, true));
    }
}

// ---------------------------------------------------------------------------
// Concurrency
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct TaskWrite {
    offset: u64,
    len: usize,
}

fn concurrent_writes() -> impl Strategy<Value = Vec<Vec<TaskWrite>>> {
    let w = (0u64..(MIB - 1), 1usize..40_000).prop_map(|(offset, len)| TaskWrite { offset, len });
    prop::collection::vec(prop::collection::vec(w, 1..12), 2..5)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(24), ..ProptestConfig::default() })]

    /// Tasks writing and discarding disjoint regions (each task owns 1 MiB)
    /// at the same time, with reads, flushes and a small cache: the result equals the
    /// serial model, and each task reads back its own writes.
    #[test]
    fn concurrent_tasks_on_disjoint_ranges_match_serial_model(tasks in concurrent_writes()) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(3).enable_all().build().unwrap();
        rt.block_on(async move {
            let region = MIB;
            let size = region * tasks.len() as u64;
            let store = new_store(size);
            let o = DriveOptions { cache_bytes: 2 * MIB, max_dirty_bytes: Some(512 * KIB), flush_delay: Duration::from_millis(1), ..opts(Mode::ReadWrite) };
            let drive = Arc::new(open(&store, o).await);
            let mut handles = Vec::new();
            for (t, writes) in tasks.iter().cloned().enumerate() {
                let drive = drive.clone();
                handles.push(tokio::spawn(async move {
                    let base = t as u64 * region;
                    let mut mine = vec![0u8; region as usize];
                    for (i, w) in writes.iter().enumerate() {
                        let len = w.len.min((region - w.offset) as usize);
                        let data = if i % 4 == 3 {
                            drive.discard(base + w.offset, len as u64).await.unwrap();
                            vec![0u8; len]
                        } else {
                            let data = pattern((t * 16 + i) as u8, len);
                            drive.write_at(base + w.offset, &data).await.unwrap();
                            data
                        };
                        mine[w.offset as usize..w.offset as usize + len].copy_from_slice(&data);
                        if i % 3 == 1 {
                            drive.flush().await.unwrap();
                        }
                        let back = drive.read_at(base, region as usize).await.unwrap();
                        assert!(back[..] == mine[..], "task {t} reads back other data");
                    }
                    mine
                }));
            }
            let mut model = Vec::new();
            for h in handles {
                model.extend_from_slice(&h.await.unwrap());
            }
            drive.close().await.unwrap();
            assert!(data_area(&store, size) == model);
        });
    }

    /// Tasks writing overlapping ranges, each with its own constant byte:
    /// after flush every byte is zero or the byte of a task that wrote there.
    #[test]
    fn concurrent_tasks_on_overlapping_ranges_never_mix_in_foreign_bytes(tasks in concurrent_writes()) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(3).enable_all().build().unwrap();
        rt.block_on(async move {
            let size = MIB;
            let store = new_store(size);
            let o = DriveOptions { cache_bytes: 2 * MIB, max_dirty_bytes: Some(512 * KIB), flush_delay: Duration::from_millis(1), ..opts(Mode::ReadWrite) };
            let drive = Arc::new(open(&store, o).await);
            // Bit t+1 set: task t wrote this byte (zero is always allowed).
            let mut allowed = vec![1u8; size as usize];
            let mut handles = Vec::new();
            for (t, writes) in tasks.iter().cloned().enumerate() {
                let byte = t as u8 + 1;
                for w in &writes {
                    let len = w.len.min((size - w.offset) as usize);
                    for a in &mut allowed[w.offset as usize..w.offset as usize + len] {
                        *a |= 1 << byte;
                    }
                }
                let drive = drive.clone();
                handles.push(tokio::spawn(async move {
                    for w in writes {
                        let len = w.len.min((size - w.offset) as usize);
                        drive.write_at(w.offset, &vec![byte; len]).await.unwrap();
                    }
                }));
            }
            for h in handles {
                h.await.unwrap();
            }
            drive.close().await.unwrap();
            let got = data_area(&store, size);
            for (i, b) in got.iter().enumerate() {
                let bit = if *b == 0 { 1 } else { 1u8.checked_shl(*b as u32).unwrap_or(0) };
                assert!(allowed[i] & bit != 0, "byte {i} is {b}, allowed mask {:#b}", allowed[i]);
            }
        });
    }
}

/// s3backer's classic bug: concurrent read-modify-writes of one page that
/// holds data in the blob must not lose each other's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_partial_writes_to_one_page_lose_no_update() {
    for round in 0..20u64 {
        let store = new_store(MIB);
        store.poke(4096, &[7u8; 512]);
        let drive = Arc::new(open(&store, opts(Mode::ReadWrite)).await);
        let mut handles = Vec::new();
        for i in 0..64u64 {
            let drive = drive.clone();
            handles.push(tokio::spawn(async move {
                let at = 4096 + (i * 8 + round) % 512;
                drive.write_at(at, &[i as u8 + 100]).await.unwrap();
            }));
        }
        for h in handles {
            h.await.unwrap();
        }
        drive.close().await.unwrap();
        let page = store.contents(ByteRange::new(4096, 4608));
        for i in 0..64u64 {
            let at = ((i * 8 + round) % 512) as usize;
            assert_eq!(page[at], i as u8 + 100, "round {round}: write {i} lost");
        }
        assert_eq!(page.iter().filter(|&&b| b == 7).count(), 512 - 64);
    }
}

/// A page written again while its upload is in flight stays dirty, and the
/// next flush sends the new bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_rewritten_during_its_upload_stays_dirty() {
    let store = new_store(MIB);
    let o = DriveOptions {
        flush_delay: Duration::from_secs(60),
        ..opts(Mode::ReadWrite)
    };
    let drive = Arc::new(open(&store, o).await);
    drive.write_at(0, &[1u8; 512]).await.unwrap();
    store.set_write_delay(Duration::from_millis(300));
    let flusher = {
        let drive = drive.clone();
        tokio::spawn(async move { drive.flush().await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    drive.write_at(0, &[2u8; 512]).await.unwrap();
    flusher.await.unwrap().unwrap();
    assert_eq!(store.contents(ByteRange::new(0, 512)), vec![1u8; 512]);
    assert_eq!(
        drive.unflushed_bytes(),
        512,
        "the re-dirtied page must stay dirty"
    );
    store.set_write_delay(Duration::ZERO);
    drive.flush().await.unwrap();
    assert_eq!(drive.unflushed_bytes(), 0);
    assert_eq!(store.contents(ByteRange::new(0, 512)), vec![2u8; 512]);
    drive.close().await.unwrap();
}

// ---------------------------------------------------------------------------
// Sparse behaviour
// ---------------------------------------------------------------------------

#[tokio::test]
async fn reading_1_gib_of_a_never_written_drive_makes_no_data_request() {
    let store = new_store(1024 * MIB);
    let drive = open(&store, opts(Mode::ReadWrite)).await;
    let footer_reads = store.counts().reads;
    let zeros = vec![0u8; MIB as usize];
    let mut at = 0;
    while at < 1024 * MIB {
        let got = drive.read_at(at, MIB as usize).await.unwrap();
        assert!(got[..] == zeros[..]);
        at += MIB;
    }
    assert_eq!(
        store.counts().reads,
        footer_reads,
        "no Get Blob for unwritten pages"
    );
    let c = drive.counters();
    assert_eq!(c.get, 1, "only the footer was read: {c:?}");
    assert_eq!(c.pages_elided, 1024 * MIB / PAGE_SIZE);
    drive.close().await.unwrap();
}

#[tokio::test]
async fn write_into_unwritten_region_needs_no_read() {
    let store = new_store(64 * MIB);
    store.poke(0, &pattern(3, 4096));
    let drive = open(&store, opts(Mode::ReadWrite)).await;
    let reads = store.counts().reads;
    // Unaligned on both ends, in a region that holds nothing.
    drive
        .write_at(10 * MIB + 100, &pattern(9, 4096))
        .await
        .unwrap();
    drive.flush().await.unwrap();
    assert_eq!(
        store.counts().reads,
        reads,
        "no read-modify-write of empty pages"
    );
    // A partial write over a page that holds data must read it first.
    drive.write_at(100, &[0xAA; 10]).await.unwrap();
    assert_eq!(store.counts().reads, reads + 1);
    drive.close().await.unwrap();
    let mut expect = pattern(3, 512);
    expect[100..110].fill(0xAA);
    assert_eq!(store.contents(ByteRange::new(0, 512)), expect);
    let written = store.contents(ByteRange::new(10 * MIB + 100, 10 * MIB + 4196));
    assert_eq!(written, pattern(9, 4096));
}

#[tokio::test]
async fn writing_zeros_over_written_pages_clears_them() {
    let store = new_store(16 * MIB);
    let drive = open(&store, opts(Mode::ReadWrite)).await;
    drive
        .write_at(MIB, &pattern(5, 2 * MIB as usize))
        .await
        .unwrap();
    drive.flush().await.unwrap();
    let full = store.stored_bytes();
    assert_eq!(full, 2 * MIB + 512, "data plus footer");
    drive
        .write_at(MIB, &vec![0u8; 2 * MIB as usize])
        .await
        .unwrap();
    // Zeros where nothing was ever stored are skipped, not written.
    drive
        .write_at(8 * MIB, &vec![0u8; MIB as usize])
        .await
        .unwrap();
    drive.flush().await.unwrap();
    assert_eq!(store.stored_bytes(), 512, "only the footer is left");
    let c = drive.counters();
    assert!(c.clear_page >= 1 && c.put_page == 1, "{c:?}");
    assert!(c.pages_elided >= MIB / PAGE_SIZE, "{c:?}");
    drive.close().await.unwrap();
}

#[tokio::test]
async fn discard_clears_whole_pages_and_zeroes_edges() {
    let store = new_store(8 * MIB);
    let drive = open(&store, opts(Mode::ReadWrite)).await;
    drive
        .write_at(0, &pattern(1, 4 * MIB as usize))
        .await
        .unwrap();
    drive.flush().await.unwrap();
    drive.discard(1000, 2 * MIB).await.unwrap();
    let got = drive.read_at(0, 4 * MIB as usize).await.unwrap();
    let mut model = pattern(1, 4 * MIB as usize);
    model[1000..(1000 + 2 * MIB) as usize].fill(0);
    assert!(got[..] == model[..]);
    assert!(drive.counters().clear_page >= 1);
    drive.close().await.unwrap();
    assert!(data_area(&store, 4 * MIB) == model);
    // Whole pages inside the range are no longer stored.
    assert_eq!(store.stored_bytes(), 4 * MIB - (2 * MIB - 512) + 512);
}

async fn sequential_write_puts(cache_bytes: u64) -> u64 {
    let store = new_store(128 * MIB);
    let o = DriveOptions {
        cache_bytes,
        flush_delay: Duration::from_secs(60),
        ..opts(Mode::ReadWrite)
    };
    let drive = open(&store, o).await;
    let chunk = pattern(11, MIB as usize);
    for i in 0..64 {
        drive.write_at(i * MIB, &chunk).await.unwrap();
        assert!(drive.counters().cache_bytes <= cache_bytes);
    }
    drive.close().await.unwrap();
    assert_eq!(store.stored_bytes(), 64 * MIB + 512);
    drive.counters().put_page
}

#[tokio::test]
async fn writing_64_mib_sequentially_makes_at_most_17_put_pages() {
    let puts = sequential_write_puts(512 * MIB).await;
    assert!(puts <= 17, "{puts} put page requests");
    let puts = sequential_write_puts(16 * MIB).await;
    assert!(puts <= 17, "{puts} put page requests with a 16 MiB cache");
}

#[tokio::test]
async fn background_flushes_during_a_sequential_write_send_full_put_pages() {
    // The flusher runs many times while the stream goes on; each pass
    // would otherwise send the stream's short tail as one more request.
    let store = new_store(128 * MIB);
    let o = DriveOptions {
        flush_delay: STREAM_FLUSH_DELAY,
        ..opts(Mode::ReadWrite)
    };
    let drive = open(&store, o).await;
    let chunk = pattern(5, MIB as usize);
    let mut passes_seen = 0;
    // A pause of the stream longer than the flush delay (a loaded machine
    // can make a 3 ms sleep last that long) rightly lets a pass send the
    // tail: each such pause may cost one more request, and only those.
    let mut long_pauses = 0;
    let mut last_end = std::time::Instant::now();
    for i in 0..64 {
        if last_end.elapsed() >= STREAM_FLUSH_DELAY {
            long_pauses += 1;
        }
        drive.write_at(i * MIB, &chunk).await.unwrap();
        last_end = std::time::Instant::now();
        let before = drive.counters().put_page;
        tokio::time::sleep(Duration::from_millis(3)).await;
        passes_seen += (drive.counters().put_page > before) as u32;
    }
    drive.close().await.unwrap();
    assert_eq!(store.stored_bytes(), 64 * MIB + 512);
    let puts = drive.counters().put_page;
    assert!(passes_seen > 0, "no background flush ran during the stream");
    assert!(
        puts <= 17 + long_pauses,
        "{puts} put page requests for 64 MiB ({long_pauses} pauses longer than the flush delay)"
    );
}

/// The flush delay of `background_flushes_during_a_sequential_write_send_full_put_pages`.
const STREAM_FLUSH_DELAY: Duration = Duration::from_millis(20);

#[tokio::test]
async fn a_sequential_write_sends_each_whole_4_mib_window_without_waiting_for_the_delay() {
    // Write-behind: a window the stream has filled cannot become a fuller
    // Put Page by waiting, so it goes out while the stream is still being
    // written, even with an hour's flush delay; the head stays dirty.
    let store = new_store(64 * MIB);
    let o = DriveOptions {
        flush_delay: Duration::from_secs(3600),
        ..opts(Mode::ReadWrite)
    };
    let drive = open(&store, o).await;
    let chunk = pattern(8, MIB as usize);
    for i in 0..18 {
        drive.write_at(i * MIB, &chunk).await.unwrap();
    }
    // 18 MiB written: windows 0-3 (16 MiB) are whole, the head (2 MiB) is not.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    // Until the Put Pages are done and their pages clean, not just sent.
    while (drive.counters().put_page < 4 || drive.counters().dirty_bytes > 2 * MIB)
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let c = drive.counters();
    assert_eq!(c.put_page, 4, "whole windows sent before any flush");
    assert_eq!(c.dirty_bytes, 2 * MIB, "the stream's head waits");
    assert!(
        store.contents(ByteRange::new(0, 16 * MIB)) == chunk.repeat(16),
        "the sent windows hold what was written"
    );
    drive.close().await.unwrap();
    assert_eq!(drive.counters().put_page, 5);
}

#[tokio::test]
async fn sequential_reads_use_read_ahead_in_large_requests() {
    let store = new_store(32 * MIB);
    store.poke(0, &pattern(2, 16 * MIB as usize));
    let drive = open(&store, opts(Mode::ReadOnly)).await;
    let before = store.counts().reads;
    let mut at = 0;
    while at < 16 * MIB {
        let got = drive.read_at(at, 64 * KIB as usize).await.unwrap();
        assert_eq!(got.len(), 64 * KIB as usize);
        at += 64 * KIB;
    }
    let gets = store.counts().reads - before;
    assert!(
        gets <= 12,
        "{gets} Get Blob requests for a 16 MiB sequential scan"
    );
    // Read-ahead and readers never fetch the same page twice.
    assert_eq!(drive.counters().bytes_down, 16 * MIB + 512);
    assert!(drive.counters().cache_hits > 0);
}

#[tokio::test]
async fn a_long_sequential_scan_reads_the_blob_in_whole_read_ahead_steps() {
    // Each top-up of the window ends on a whole 4 MiB step, so a long scan
    // costs one Get per 4 MiB (plus the reads before the stream is seen),
    // not a whole and a ragged Get per top-up.
    let store = new_store(160 * MIB);
    store.poke(0, &pattern(4, 128 * MIB as usize));
    let drive = open(&store, opts(Mode::ReadOnly)).await;
    let before = store.counts().reads;
    // The loop device's 1280 KiB requests, cut by FUSE into 1 MiB and 256 KiB.
    let mut at = 0;
    while at < 125 * MIB {
        for len in [MIB, 256 * KIB] {
            let got = drive.read_at(at, len as usize).await.unwrap();
            assert_eq!(got.len(), len as usize);
            at += len;
        }
    }
    let gets = store.counts().reads - before;
    assert!(
        gets <= 125 / 4 + 6,
        "{gets} Get Blob requests for a 125 MiB scan in 1280 KiB reads"
    );
}

#[tokio::test]
async fn reads_arriving_out_of_order_still_get_read_ahead() {
    // The loop device sends several reads at once and they arrive out of
    // order: here the second half of every MiB is asked for before the first.
    let store = new_store(64 * MIB);
    let data = pattern(3, 32 * MIB as usize);
    store.poke(0, &data);
    let drive = open(&store, opts(Mode::ReadOnly)).await;
    let before = store.counts().reads;
    let half = 512 * KIB;
    for mib in 0..32u64 {
        for at in [mib * MIB + half, mib * MIB] {
            let got = drive.read_at(at, half as usize).await.unwrap();
            assert!(
                got[..] == data[at as usize..(at + half) as usize],
                "bytes at {at}"
            );
        }
    }
    let gets = store.counts().reads - before;
    assert!(
        gets <= 16,
        "{gets} Get Blob requests for 32 MiB read out of order"
    );
    assert_eq!(drive.counters().bytes_down, 32 * MIB + 512);
}

#[tokio::test]
async fn cold_read_of_fragmented_region_reads_small_holes_with_their_neighbours() {
    // 4 KiB of data every 64 KiB, like a fragmented ext4 region.
    let store = new_store(32 * MIB);
    for i in 0..256u64 {
        store.poke(i * 64 * KIB, &pattern(i as u8, 4096));
    }
    let drive = open(&store, opts(Mode::ReadOnly)).await;
    let before = store.counts().reads;
    let got = drive.read_at(0, 16 * MIB as usize).await.unwrap();
    let gets = store.counts().reads - before;
    assert!(
        gets <= 8,
        "{gets} Get Blob requests for 256 extents in 16 MiB"
    );
    for i in 0..256u64 {
        let at = (i * 64 * KIB) as usize;
        assert_eq!(&got[at..at + 4096], &pattern(i as u8, 4096)[..]);
        assert!(got[at + 4096..at + 64 * KIB as usize]
            .iter()
            .all(|&b| b == 0));
    }
}

#[tokio::test]
async fn empty_8_tib_drive_opens_with_few_page_range_requests() {
    let size = 8 * 1024 * 1024 * MIB - MIB;
    let store = new_store(size);
    store.poke(5 * 1024 * 1024 * MIB, &[1u8; 512]);
    let drive = open(&store, opts(Mode::ReadOnly)).await;
    assert!(store.counts().page_ranges <= 20, "{:?}", store.counts());
    assert_eq!(drive.size_bytes(), size);
    let got = drive.read_at(5 * 1024 * 1024 * MIB, 1024).await.unwrap();
    assert_eq!(&got[..512], &[1u8; 512]);
    assert_eq!(&got[512..], &[0u8; 512]);
}

// ---------------------------------------------------------------------------
// Opening
// ---------------------------------------------------------------------------

#[tokio::test]
async fn blob_without_vhd_footer_is_not_a_drive() {
    let store = Arc::new(MemoryStore::new(MIB));
    let r = Drive::open(store.clone() as Arc<dyn PageStore>, opts(Mode::ReadWrite)).await;
    assert!(matches!(r, Err(Error::NotADrive { .. })), "{:?}", r.err());
    assert_eq!(store.lease_holder(), None);
}

#[tokio::test]
async fn writes_past_the_end_never_touch_the_footer() {
    let store = new_store(MIB);
    let drive = open(&store, opts(Mode::ReadWrite)).await;
    let r = drive.write_at(MIB - 10, &[1u8; 20]).await;
    assert!(matches!(r, Err(Error::OutOfRange { .. })));
    assert_eq!(r.unwrap_err().errno(), libc::ENOSPC);
    assert!(drive.read_at(MIB - 10, 100).await.unwrap().len() == 10);
    assert!(drive.read_at(MIB + 5, 100).await.unwrap().is_empty());
    drive.close().await.unwrap();
    assert_eq!(
        store.contents(ByteRange::new(MIB, MIB + 512)),
        footer(MIB).to_vec()
    );
}

#[tokio::test]
async fn calls_after_close_fail_with_closed() {
    let store = new_store(MIB);
    let drive = open(&store, opts(Mode::ReadWrite)).await;
    drive.write_at(0, b"hello").await.unwrap();
    drive.close().await.unwrap();
    assert_eq!(&store.contents(ByteRange::new(0, 5)), b"hello");
    assert!(matches!(drive.read_at(0, 1).await, Err(Error::Closed)));
    assert!(matches!(drive.write_at(0, b"x").await, Err(Error::Closed)));
    assert!(matches!(drive.flush().await, Err(Error::Closed)));
    assert!(matches!(drive.close().await, Err(Error::Closed)));
}

// ---------------------------------------------------------------------------
// Lease as mount lock
// ---------------------------------------------------------------------------

#[tokio::test]
async fn second_writer_is_refused_while_lease_held() {
    let store = new_store(MIB);
    let first = open(&store, opts(Mode::ReadWrite)).await;
    assert_eq!(store.lease_holder().as_deref(), first.lease_id());
    let err = Drive::open(store.clone() as Arc<dyn PageStore>, opts(Mode::ReadWrite))
        .await
        .err()
        .expect("second open must fail");
    assert!(matches!(err, Error::InUse { .. }), "{err:?}");
    assert_eq!(err.errno(), libc::EBUSY);
    assert!(err.to_string().contains("break-lease"), "{err}");
    first.close().await.unwrap();
    assert_eq!(store.lease_holder(), None);
    let second = open(&store, opts(Mode::ReadWrite)).await;
    second.close().await.unwrap();
}

#[tokio::test]
async fn reopening_with_the_same_lease_id_is_retry_safe() {
    let store = new_store(MIB);
    let o = DriveOptions {
        lease_id: Some("0f8fad5b-d9cb-469f-a165-70867728950e".into()),
        ..opts(Mode::ReadWrite)
    };
    let first = open(&store, o.clone()).await;
    assert_eq!(
        first.lease_id(),
        Some("0f8fad5b-d9cb-469f-a165-70867728950e")
    );
    let again = open(&store, o).await;
    again.close().await.unwrap();
    drop(first);
}

#[tokio::test]
async fn read_only_and_snapshot_opens_work_while_leased() {
    let store = new_store(MIB);
    let rw = open(&store, opts(Mode::ReadWrite)).await;
    rw.write_at(0, b"flushed").await.unwrap();
    rw.flush().await.unwrap();
    let snap = Arc::new(store.snapshot());
    rw.write_at(0, b"FLUSHED").await.unwrap();
    rw.flush().await.unwrap();

    let ro = open(&store, opts(Mode::ReadOnly)).await;
    assert_eq!(ro.lease_id(), None);
    assert_eq!(&ro.read_at(0, 7).await.unwrap()[..], b"FLUSHED");
    let e = ro.write_at(0, b"x").await.unwrap_err();
    assert!(matches!(e, Error::ReadOnly));
    assert_eq!(e.errno(), libc::EROFS);
    assert!(matches!(ro.discard(0, 512).await, Err(Error::ReadOnly)));

    let sn = open(&snap, opts(Mode::Snapshot)).await;
    assert_eq!(&sn.read_at(0, 7).await.unwrap()[..], b"flushed");
    assert!(matches!(sn.write_at(0, b"x").await, Err(Error::ReadOnly)));
    sn.close().await.unwrap();
    ro.close().await.unwrap();
    rw.close().await.unwrap();
}

#[tokio::test]
async fn broken_lease_makes_flush_fail_and_keeps_unflushed_data() {
    let store = new_store(4 * MIB);
    let o = DriveOptions {
        flush_delay: Duration::from_secs(60),
        ..opts(Mode::ReadWrite)
    };
    let drive = open(&store, o).await;
    drive.write_at(0, &pattern(1, 8192)).await.unwrap();
    drive.flush().await.unwrap();
    drive
        .write_at(MIB + 100, &pattern(4, 64 * KIB as usize))
        .await
        .unwrap();
    let dirty = drive.unflushed_bytes();
    assert_eq!(dirty, 64 * KIB + 512);

    store.break_lease().await.unwrap();
    let e = drive.flush().await.unwrap_err();
    assert!(matches!(e, Error::LeaseLost { .. }), "{e:?}");
    assert_eq!(e.errno(), libc::EIO);
    assert_eq!(drive.unflushed_bytes(), dirty, "dirty data must be kept");
    let saved = drive.unflushed_data();
    let total: usize = saved.iter().map(|(_, b)| b.len()).sum();
    assert_eq!(total as u64, dirty);
    assert_eq!(saved[0].0, MIB);
    assert_eq!(&saved[0].1[100..200], &pattern(4, 100)[..]);
    // Reads still see the unflushed data; writes and close fail loudly.
    let got = drive.read_at(MIB + 100, 64 * KIB as usize).await.unwrap();
    assert!(got[..] == pattern(4, 64 * KIB as usize)[..]);
    assert!(matches!(
        drive.write_at(0, b"x").await,
        Err(Error::LeaseLost { .. })
    ));
    assert!(matches!(drive.close().await, Err(Error::LeaseLost { .. })));
    assert_eq!(drive.unflushed_bytes(), dirty);
    assert_eq!(
        store.contents(ByteRange::new(MIB, MIB + 512)),
        vec![0u8; 512]
    );
}

#[tokio::test]
async fn transient_write_failure_keeps_data_dirty_until_a_later_flush() {
    let store = new_store(4 * MIB);
    let o = DriveOptions {
        flush_delay: Duration::from_secs(60),
        ..opts(Mode::ReadWrite)
    };
    let drive = open(&store, o).await;
    drive
        .write_at(777, &pattern(8, 300 * KIB as usize))
        .await
        .unwrap();
    store.fail_next_writes(
        1,
        blob::Error::service(
            "put page",
            "test/disk.vhd",
            503,
            Some("ServerBusy".into()),
            "busy",
        ),
    );
    let e = drive.flush().await.unwrap_err();
    assert!(matches!(e, Error::Backend(_)), "{e:?}");
    assert_eq!(e.errno(), libc::EIO);
    assert!(drive.unflushed_bytes() > 0);
    drive.flush().await.unwrap();
    drive.close().await.unwrap();
    let mut model = vec![0u8; 4 * MIB as usize];
    model[777..777 + 300 * KIB as usize].copy_from_slice(&pattern(8, 300 * KIB as usize));
    assert!(data_area(&store, 4 * MIB) == model);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_flush_writes_dirty_data_after_the_delay() {
    let store = new_store(4 * MIB);
    let o = DriveOptions {
        flush_delay: Duration::from_millis(50),
        ..opts(Mode::ReadWrite)
    };
    let drive = open(&store, o).await;
    drive.write_at(0, b"later").await.unwrap();
    for _ in 0..100 {
        if drive.unflushed_bytes() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(drive.unflushed_bytes(), 0);
    assert_eq!(&store.contents(ByteRange::new(0, 5)), b"later");
    drive.close().await.unwrap();
}

// ---------------------------------------------------------------------------
// Memory bound
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writing_256_mib_with_a_16_mib_cache_stays_within_the_bound() {
    let cache = 16 * MIB;
    let size = 256 * MIB;
    let store = new_store(size);
    let o = DriveOptions {
        cache_bytes: cache,
        max_dirty_bytes: Some(8 * MIB),
        ..opts(Mode::ReadWrite)
    };
    let drive = Arc::new(open(&store, o).await);
    let chunk = pattern(6, MIB as usize);
    let mut at = 0;
    while at < size {
        drive.write_at(at, &chunk).await.unwrap();
        let c = drive.counters();
        assert!(
            c.cache_bytes <= cache,
            "cache {} over {cache}",
            c.cache_bytes
        );
        assert!(
            c.dirty_bytes <= cache,
            "dirty {} over {cache}",
            c.dirty_bytes
        );
        at += MIB;
    }
    // Reads through the same small cache stay bounded too.
    for i in (0..size).step_by(7 * MIB as usize) {
        let got = drive.read_at(i, MIB as usize).await.unwrap();
        assert!(got[..] == chunk[..]);
        assert!(drive.counters().cache_bytes <= cache);
    }
    drive.close().await.unwrap();
    assert_eq!(store.stored_bytes(), size + 512);
}

/// A flush that keeps failing reaches writers waiting on the dirty bound as
/// an error: they never hang, and nothing is dropped.
#[tokio::test]
async fn writers_get_the_flush_error_instead_of_hanging_at_the_dirty_bound() {
    let store = new_store(64 * MIB);
    let o = DriveOptions {
        cache_bytes: 4 * MIB,
        max_dirty_bytes: Some(MIB),
        flush_delay: Duration::from_secs(60),
        ..opts(Mode::ReadWrite)
    };
    let drive = open(&store, o).await;
    store.fail_next_writes(
        u32::MAX,
        blob::Error::service(
            "put page",
            "test/disk.vhd",
            500,
            Some("InternalError".into()),
            "down",
        ),
    );
    let mut failed = None;
    for i in 0..16 {
        if let Err(e) = drive.write_at(i * MIB, &pattern(1, MIB as usize)).await {
            failed = Some(e);
            break;
        }
        assert!(drive.counters().cache_bytes <= 4 * MIB);
    }
    let e = failed.expect("a write must report the failing flush");
    assert!(matches!(e, Error::Backend(_)), "{e:?}");
    let kept = drive.unflushed_bytes();
    assert!(kept >= MIB, "dirty data kept: {kept}");
    // The store recovers: everything accepted is written.
    store.fail_next_writes(0, blob::Error::service("put page", "t", 500, None, ""));
    drive.close().await.unwrap();
    assert_eq!(store.stored_bytes(), kept + 512);
}

#[tokio::test]
async fn counters_serialize_for_stats() {
    let store = new_store(4 * MIB);
    let drive = open(&store, opts(Mode::ReadWrite)).await;
    drive.write_at(0, &[1u8; 4096]).await.unwrap();
    drive.read_at(0, 4096).await.unwrap();
    drive.flush().await.unwrap();
    let c = drive.counters();
    assert_eq!((c.put_page, c.bytes_up, c.cache_hits), (1, 4096, 8));
    assert_eq!(c.lease, 1);
    let json = serde_json::to_value(c).unwrap();
    for key in [
        "get",
        "put_page",
        "clear_page",
        "page_ranges",
        "lease",
        "bytes_down",
        "bytes_up",
        "cache_hits",
        "cache_misses",
        "pages_elided",
        "dirty_bytes",
        "cache_bytes",
    ] {
        assert!(json.get(key).is_some(), "missing {key}");
    }
    drive.close().await.unwrap();
}

/// A zero sector inside a filesystem block does not split the block's
/// upload into three requests; long zero stretches are still cleared.
#[tokio::test]
async fn short_zero_stretches_inside_a_block_go_out_in_one_put_page() {
    let store = new_store(16 * MIB);
    let o = DriveOptions {
        flush_delay: Duration::from_secs(60),
        ..opts(Mode::ReadWrite)
    };
    let drive = open(&store, o).await;
    let mut block = pattern(3, 4096);
    block[1024..1536].fill(0);
    drive.write_at(MIB, &block).await.unwrap();
    drive.flush().await.unwrap();
    let c = drive.counters();
    assert_eq!((c.put_page, c.clear_page), (1, 0), "{c:?}");
    // 1 MiB of zeros in the middle of written data: cleared, not written.
    drive
        .write_at(2 * MIB, &pattern(4, 3 * MIB as usize))
        .await
        .unwrap();
    drive.flush().await.unwrap();
    drive
        .write_at(3 * MIB, &vec![0u8; MIB as usize])
        .await
        .unwrap();
    drive.flush().await.unwrap();
    let c2 = drive.counters();
    assert_eq!(c2.clear_page - c.clear_page, 1, "{c2:?}");
    drive.close().await.unwrap();
    assert_eq!(store.contents(ByteRange::new(MIB, MIB + 4096)), block);
    assert_eq!(store.stored_bytes(), 4096 + 2 * MIB + 512);
}

/// A read spanning data and a hole fetches only the data parts.
#[tokio::test]
async fn reads_across_data_and_holes_fetch_only_the_data() {
    let store = new_store(4 * MIB);
    store.poke(0, &pattern(1, 8 * 512));
    store.poke(64 * 512, &pattern(2, 8 * 512));
    store.poke(2 * MIB, &pattern(3, 8 * 512));
    let o = DriveOptions {
        read_ahead_bytes: 0,
        ..opts(Mode::ReadOnly)
    };
    let drive = open(&store, o).await;
    let before = store.counts();
    let got = drive.read_at(100, 80 * 512).await.unwrap();
    let after = store.counts();
    // A 28 KiB hole between two data ranges is read along with them (one
    // round trip costs more than the zeros), so this is one Get of 72 pages.
    assert_eq!(after.reads - before.reads, 1, "small holes ride along");
    assert_eq!(after.bytes_read - before.bytes_read, 72 * 512);
    let mut model = vec![0u8; 4 * MIB as usize];
    model[..4096].copy_from_slice(&pattern(1, 4096));
    model[64 * 512..64 * 512 + 4096].copy_from_slice(&pattern(2, 4096));
    model[2 * MIB as usize..2 * MIB as usize + 4096].copy_from_slice(&pattern(3, 4096));
    assert!(got[..] == model[100..100 + 80 * 512]);
    let c = drive.counters();
    assert_eq!(c.pages_elided, 81 - 16, "{c:?}");
    // Read again: all from the cache.
    drive.read_at(100, 80 * 512).await.unwrap();
    assert_eq!(store.counts().reads, after.reads);
    assert_eq!(drive.counters().cache_hits, 81);
    // Past a large hole only the data is fetched: the 2 MiB range is one more
    // Get of its 8 pages, the zeros between are never read.
    let far = drive
        .read_at(80 * 512, (2 * MIB + 4096 - 80 * 512) as usize)
        .await
        .unwrap();
    let end = store.counts();
    assert_eq!(end.reads - after.reads, 1);
    assert_eq!(end.bytes_read - after.bytes_read, 8 * 512);
    assert!(far[..] == model[80 * 512..2 * MIB as usize + 4096]);
}

/// The lease broken while only the background flusher is writing: the
/// flusher finds out, later writes fail, and the data stays reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_lost_in_background_flush_is_reported_to_the_next_write() {
    let store = new_store(4 * MIB);
    let o = DriveOptions {
        flush_delay: Duration::from_millis(30),
        ..opts(Mode::ReadWrite)
    };
    let drive = open(&store, o).await;
    store.break_lease().await.unwrap();
    drive.write_at(4096, &pattern(7, 4096)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let e = drive.write_at(0, b"more").await.unwrap_err();
    assert!(matches!(e, Error::LeaseLost { .. }), "{e:?}");
    assert_eq!(drive.unflushed_bytes(), 4096);
    assert_eq!(
        drive.unflushed_data(),
        vec![(4096, bytes::Bytes::from(pattern(7, 4096)))]
    );
}

#[test]
fn drive_and_its_futures_can_be_shared_across_tasks() {
    fn send_sync<T: Send + Sync>() {}
    fn send<F: Send>(_: &F) {}
    send_sync::<Drive>();
    send_sync::<Error>();
    let rt = runtime();
    rt.block_on(async {
        let store = new_store(MIB);
        let drive = open(&store, opts(Mode::ReadWrite)).await;
        let f = drive.close();
        send(&f);
        f.await.unwrap();
        let f = Drive::open(store.clone() as Arc<dyn PageStore>, opts(Mode::ReadOnly));
        send(&f);
        f.await.unwrap();
    });
}

/// Readers of the same missing pages share one fetch instead of each
/// sending its own Get Blob.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn concurrent_readers_of_a_cold_range_share_one_fetch() {
    let store = new_store(4 * MIB);
    store.poke(0, &pattern(5, 64 * KIB as usize));
    let drive = Arc::new(open(&store, opts(Mode::ReadOnly)).await);
    store.set_read_delay(Duration::from_millis(100));
    let before = store.counts();
    let mut handles = Vec::new();
    for i in 0..8u64 {
        let drive = drive.clone();
        handles.push(tokio::spawn(async move {
            // Overlapping reads of the same 64 KiB, at different offsets.
            let at = i * 512;
            let got = drive.read_at(at, (64 * KIB - at) as usize).await.unwrap();
            assert!(got[..] == pattern(5, 64 * KIB as usize)[at as usize..]);
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    // Which reader reserves first is up to the scheduler, so the range may be
    // cut into a few requests; what must never happen is a page fetched twice.
    let after = store.counts();
    let bytes = after.bytes_read - before.bytes_read;
    assert_eq!(
        bytes,
        64 * KIB,
        "{bytes} bytes fetched for one 64 KiB cold range"
    );
    let reads = after.reads - before.reads;
    assert!(
        reads < 8,
        "{reads} Get Blob requests: the readers did not share"
    );
}

/// A fetch that fails or is cancelled leaves its pages free: nobody waits
/// for it forever, and the next read fetches them.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_failed_or_cancelled_fetch_does_not_strand_its_pages() {
    let store = new_store(4 * MIB);
    store.poke(0, &pattern(5, 8192));
    let drive = Arc::new(open(&store, opts(Mode::ReadOnly)).await);
    // Cancelled: the read's future is dropped mid-fetch.
    store.set_read_delay(Duration::from_millis(200));
    let r = tokio::time::timeout(Duration::from_millis(20), drive.read_at(0, 8192)).await;
    assert!(r.is_err(), "the read was cancelled mid-fetch");
    // Failed: the leader's Get Blob fails while a second reader waits on it.
    store.fail_next_reads(
        1,
        blob::Error::service(
            "get blob",
            "test/disk.vhd",
            503,
            Some("ServerBusy".into()),
            "busy",
        ),
    );
    let leader = {
        let drive = drive.clone();
        tokio::spawn(async move { drive.read_at(0, 8192).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    store.set_read_delay(Duration::ZERO);
    let follower = tokio::time::timeout(Duration::from_secs(5), drive.read_at(0, 8192))
        .await
        .expect("no reader waits forever for a failed fetch")
        .unwrap();
    assert!(follower[..] == pattern(5, 8192)[..]);
    let e = leader.await.unwrap().unwrap_err();
    assert!(matches!(e, Error::Backend(_)), "{e:?}");
    let again = drive.read_at(0, 8192).await.unwrap();
    assert!(again[..] == pattern(5, 8192)[..]);
}

/// A discard whose Clear Pages fails leaves cache and blob able to agree:
/// the cached pages become zero and dirty, and the next flush clears them.
#[tokio::test]
async fn failed_discard_is_completed_by_the_next_flush() {
    let store = new_store(8 * MIB);
    let o = DriveOptions {
        flush_delay: Duration::from_secs(60),
        ..opts(Mode::ReadWrite)
    };
    let drive = open(&store, o).await;
    drive
        .write_at(0, &pattern(3, 2 * MIB as usize))
        .await
        .unwrap();
    drive.flush().await.unwrap();
    store.fail_next_writes(1, transient());
    let e = drive.discard(0, MIB).await.unwrap_err();
    assert!(matches!(e, Error::Backend(_)), "{e:?}");
    let got = drive.read_at(0, MIB as usize).await.unwrap();
    assert!(got.iter().all(|&b| b == 0), "the cache reads zeros");
    drive.flush().await.unwrap();
    drive.close().await.unwrap();
    assert!(store
        .contents(ByteRange::new(0, MIB))
        .iter()
        .all(|&b| b == 0));
    assert_eq!(store.stored_bytes(), MIB + 512);
}

/// Regression (proptest seed in drive.proptest-regressions): a discard
/// inside one page has no whole page to clear and zero-fills the bytes.
#[tokio::test]
async fn discard_inside_one_page_zero_fills_it() {
    let store = new_store(4 * MIB);
    let drive = open(&store, opts(Mode::ReadWrite)).await;
    drive.write_at(2665472, &[9u8; 512]).await.unwrap();
    drive.discard(2665473, 1).await.unwrap();
    drive.close().await.unwrap();
    let mut expect = vec![9u8; 512];
    expect[1] = 0;
    assert_eq!(store.contents(ByteRange::new(2665472, 2665984)), expect);
}

/// Scattered 4 KiB writes, each in a chunk of its own, stay in the cache
/// (no Put Page) up to the dirty budget, and a flush sends one Put Page
/// each. With the budget counted in pinned 256 KiB chunks, 2,048 such
/// writes needed 512 MiB; counted in 4 KiB blocks they need about 10 MiB.
#[tokio::test]
async fn scattered_small_writes_are_absorbed_until_the_flush() {
    let store = new_store(1024 * MIB);
    let o = DriveOptions {
        flush_delay: Duration::from_secs(3600),
        ..opts(Mode::ReadWrite)
    };
    let drive = open(&store, o).await;
    let chunk = 256 * KIB;
    for i in 0..2048u64 {
        let offset = 2 * i * chunk + (i * 37 % 64) * 4096;
        drive
            .write_at(offset, &pattern(i as u8, 4096))
            .await
            .unwrap();
    }
    let c = drive.counters();
    assert_eq!(c.put_page, 0, "sent before the flush");
    assert_eq!(c.dirty_bytes, 2048 * 4096);
    assert!(
        c.cache_bytes <= 2048 * (4096 + 1024),
        "{} bytes",
        c.cache_bytes
    );
    drive.flush().await.unwrap();
    assert_eq!(drive.counters().put_page, 2048);
    drive.close().await.unwrap();
    for i in [0u64, 1, 1000, 2047] {
        let offset = 2 * i * chunk + (i * 37 % 64) * 4096;
        let stored = store.contents(ByteRange::new(offset, offset + 4096));
        assert!(stored == pattern(i as u8, 4096), "block {i}");
    }
}

/// A pass that keeps finishing runs is not cut short however long it takes:
/// 2,048 scattered pages at one second per Put Page and 8 in flight take 256
/// seconds, twice the retry budget, and the flush succeeds. (Only a pass in
/// which nothing finishes for a whole budget is an outage.)
#[tokio::test(start_paused = true)]
async fn a_long_flush_that_keeps_finishing_runs_is_not_a_stall() {
    let store = new_store(1024 * MIB);
    let o = DriveOptions {
        flush_delay: Duration::from_secs(3600),
        ..opts(Mode::ReadWrite)
    };
    let drive = open(&store, o).await;
    for i in 0..2048u64 {
        drive
            .write_at(2 * i * 256 * KIB, &pattern(i as u8, 4096))
            .await
            .unwrap();
    }
    store.set_write_delay(Duration::from_secs(1));
    let began = tokio::time::Instant::now();
    drive.flush().await.expect("a slow flush is not an outage");
    assert!(
        began.elapsed() > Duration::from_secs(200),
        "{:?}",
        began.elapsed()
    );
    assert_eq!(drive.counters().dirty_bytes, 0);
    drive.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_run_beside_an_endless_stream_is_flushed_and_close_returns() {
    // A following pass sends only whole Put Pages; it must still end (at
    // `flush_delay`, or when the drive closes), or a short run written
    // beside a stream stays dirty, and a close waits, for as long as the
    // stream goes on.
    let store = new_store(128 * MIB);
    store.set_write_delay(Duration::from_millis(30));
    let o = DriveOptions {
        flush_delay: Duration::from_millis(200),
        ..opts(Mode::ReadWrite)
    };
    let drive = Arc::new(open(&store, o).await);
    let writer = {
        let drive = drive.clone();
        tokio::spawn(async move {
            let chunk = pattern(3, MIB as usize);
            let mut i = 0u64;
            // Ends when the drive is closed under it.
            while drive.write_at((i % 96) * MIB, &chunk).await.is_ok() {
                i += 1;
                tokio::task::yield_now().await;
            }
            i
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let short = pattern(9, 4096);
    drive.write_at(120 * MIB, &short).await.unwrap();
    let written = Instant::now();
    while store.contents(ByteRange::new(120 * MIB, 120 * MIB + 4096)) != short {
        assert!(
            written.elapsed() < Duration::from_secs(5),
            "a 4 KiB run beside the stream stayed dirty for 5 s (flush delay 200 ms)"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!writer.is_finished(), "the stream still runs");
    tokio::time::timeout(Duration::from_secs(20), drive.close())
        .await
        .expect("close returns while the stream goes on")
        .expect("close");
    let writes = writer.await.unwrap();
    assert!(writes > 8, "the stream wrote {writes} MiB");
}
