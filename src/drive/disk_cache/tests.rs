use super::*;

fn opts(dir: &Path, max_bytes: u64) -> DiskCacheOptions {
    DiskCacheOptions {
        dir: dir.to_path_buf(),
        max_bytes,
    }
}

fn chunk(fill: u8, pages: usize) -> CachedChunk {
    let mut held = ChunkBits::default();
    for p in 0..pages {
        held.set(p);
    }
    CachedChunk::new(held, ChunkBits::default(), vec![fill; pages * PAGE_BYTES])
}

const MB: u64 = 1 << 20;

/// Flip one bit of byte `at` of chunk `idx`'s slot, in place.
fn flip(c: &DiskCache, idx: u64, at: u64) {
    use std::os::unix::fs::FileExt;
    let (path, offset) = slab::place(&c.shared.chunks_dir, idx);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, offset + at).unwrap();
    b[0] ^= 1;
    f.write_all_at(&b, offset + at).unwrap();
}

/// Disk space the slab files take (allocated blocks).
fn on_disk(c: &DiskCache) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(&c.shared.chunks_dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().blocks() * 512)
        .sum()
}

/// The inode numbers of the files in the drive's chunk directory.
fn inodes(c: &DiskCache) -> Vec<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut out: Vec<u64> = std::fs::read_dir(&c.shared.chunks_dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().ino())
        .collect();
    out.sort_unstable();
    out
}

/// Open, waiting a little while a dropped cache's writer still holds the lock.
fn open_when_free(o: &DiskCacheOptions, id: &str, etag: &str, access: Access) -> DiskCache {
    for _ in 0..200 {
        if let Some(c) = DiskCache::open(o, id, Some(etag), access).unwrap() {
            return c;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("the cache directory stays locked");
}

#[test]
fn a_stored_chunk_is_read_back_and_survives_a_clean_close() {
    let tmp = tempfile::tempdir().unwrap();
    let o = opts(tmp.path(), 64 * MB);
    let c = DiskCache::open(&o, "blob-a", Some("e1"), Access::Writer)
        .unwrap()
        .unwrap();
    let _ = c.store(3, c.ticket(), chunk(7, 10));
    c.sync();
    assert_eq!(c.lookup(3), Some(chunk(7, 10)));
    assert!(c.bytes_held() > 0);
    c.finish(Some("e2")).unwrap();
    drop(c);
    let again = DiskCache::open(&o, "blob-a", Some("e2"), Access::Writer)
        .unwrap()
        .unwrap();
    assert_eq!(again.lookup(3), Some(chunk(7, 10)));
}

#[test]
fn a_changed_etag_or_a_writer_without_clean_close_drops_everything() {
    let tmp = tempfile::tempdir().unwrap();
    let o = opts(tmp.path(), 64 * MB);
    let c = DiskCache::open(&o, "b", Some("e1"), Access::Writer)
        .unwrap()
        .unwrap();
    let _ = c.store(1, c.ticket(), chunk(1, 4));
    c.finish(Some("e1")).unwrap();
    drop(c);
    // Another client changed the blob: ETag e9.
    let c = DiskCache::open(&o, "b", Some("e9"), Access::Writer)
        .unwrap()
        .unwrap();
    assert_eq!(c.lookup(1), None);
    let _ = c.store(1, c.ticket(), chunk(2, 4));
    c.sync();
    drop(c); // a crash: no finish
    let c = open_when_free(&o, "b", "e9", Access::Writer);
    assert_eq!(c.lookup(1), None, "in-use record: nothing trusted");
}

#[test]
fn a_copy_taken_before_an_invalidation_is_never_installed() {
    let tmp = tempfile::tempdir().unwrap();
    let c = DiskCache::open(&opts(tmp.path(), 64 * MB), "b", Some("e"), Access::Writer)
        .unwrap()
        .unwrap();
    let _ = c.store(5, c.ticket(), chunk(1, 2));
    c.sync();
    let old = c.ticket();
    c.invalidate(5);
    assert!(!c.contains(5));
    let _ = c.store(5, old, chunk(2, 2));
    c.sync();
    assert_eq!(c.lookup(5), None);
    assert_eq!(
        slab::read_slot(&c.shared.chunks_dir, 5).unwrap(),
        None,
        "the stale slot is emptied"
    );
    let _ = c.store(5, c.ticket(), chunk(3, 2));
    c.sync();
    assert_eq!(c.lookup(5), Some(chunk(3, 2)));
}

#[test]
fn a_flipped_byte_is_detected_and_the_chunk_dropped() {
    let tmp = tempfile::tempdir().unwrap();
    let c = DiskCache::open(&opts(tmp.path(), 64 * MB), "b", Some("e"), Access::Writer)
        .unwrap()
        .unwrap();
    let _ = c.store(0, c.ticket(), chunk(9, 8));
    c.sync();
    flip(&c, 0, 1000);
    assert_eq!(c.lookup(0), None);
    assert_eq!(c.bad_chunks(), 1);
    c.sync();
    assert_eq!(slab::read_slot(&c.shared.chunks_dir, 0).unwrap(), None);
    assert_eq!(c.bytes_held(), 0);
}

#[test]
fn readers_share_a_directory_and_a_writer_is_kept_out() {
    let tmp = tempfile::tempdir().unwrap();
    let o = opts(tmp.path(), 64 * MB);
    let r1 = DiskCache::open(&o, "snap", Some("s"), Access::Reader)
        .unwrap()
        .unwrap();
    let _ = r1.store(2, r1.ticket(), chunk(4, 1));
    r1.sync();
    let r2 = DiskCache::open(&o, "snap", Some("s"), Access::Reader)
        .unwrap()
        .unwrap();
    assert_eq!(r2.lookup(2), Some(chunk(4, 1)));
    assert!(DiskCache::open(&o, "snap", Some("s"), Access::Writer)
        .unwrap()
        .is_none());
    // A reader seeing another ETag cannot reset a directory in use.
    assert!(DiskCache::open(&o, "snap", Some("other"), Access::Reader)
        .unwrap()
        .is_none());
    assert_eq!(clear(tmp.path()).unwrap().in_use, 1);
    r1.finish(None).unwrap();
    drop(r1);
    drop(r2);
    // r2's writer may still be ending: its lock goes with it.
    let mut removed = 0;
    for _ in 0..200 {
        removed = clear(tmp.path()).unwrap().removed;
        if removed == 1 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(removed, 1);
    assert!(std::fs::read_dir(tmp.path().join(LAYOUT))
        .unwrap()
        .next()
        .is_none());
}

#[test]
fn the_bytes_held_stay_under_the_bound() {
    let tmp = tempfile::tempdir().unwrap();
    let max = 2 * MB;
    let c = DiskCache::open(&opts(tmp.path(), max), "b", Some("e"), Access::Writer)
        .unwrap()
        .unwrap();
    for idx in 0..40 {
        let _ = c.store(idx, c.ticket(), chunk(idx as u8 + 1, PAGES));
        c.sync();
    }
    assert!(c.bytes_held() <= max, "{}", c.bytes_held());
    assert!(on_disk(&c) <= max, "{}", on_disk(&c));
    assert!(c.contains(39), "the newest chunk stays");
    assert!(!c.contains(0), "the oldest went first");
}

#[test]
fn rank_counts_pages_below() {
    let mut b = ChunkBits::default();
    for p in [0, 5, 63, 64, 200] {
        b.set(p);
    }
    assert_eq!(b.rank(0), 0);
    assert_eq!(b.rank(6), 2);
    assert_eq!(b.rank(64), 3);
    assert_eq!(b.rank(511), 5);
    assert_eq!(b.count(), 5);
}

#[test]
fn many_invalidations_collapse_into_a_floor_that_refuses_older_copies() {
    let tmp = tempfile::tempdir().unwrap();
    let c = DiskCache::open(&opts(tmp.path(), 64 * MB), "b", Some("e"), Access::Writer)
        .unwrap()
        .unwrap();
    let old = c.ticket();
    for idx in 100..100 + MAX_INVALIDATED as u64 + 10 {
        c.invalidate(idx);
    }
    assert!(c.shared.index().invalidated.len() <= MAX_INVALIDATED);
    // Chunk 7 was never invalidated, but its copy predates the floor.
    let _ = c.store(7, old, chunk(1, 1));
    let _ = c.store(8, c.ticket(), chunk(2, 1));
    c.sync();
    assert_eq!(c.lookup(7), None);
    assert_eq!(c.lookup(8), Some(chunk(2, 1)));
}

#[test]
fn a_range_invalidation_refuses_copies_in_flight_of_chunks_without_a_file() {
    let tmp = tempfile::tempdir().unwrap();
    let c = DiskCache::open(&opts(tmp.path(), 64 * MB), "r", Some("e"), Access::Writer)
        .unwrap()
        .unwrap();
    // Copies of chunks 5 and 6 are taken; neither has a file yet.
    let old = c.ticket();
    c.invalidate_range(4..6);
    let _ = c.store(5, old, chunk(1, 1));
    let _ = c.store(6, old, chunk(2, 1));
    c.sync();
    assert_eq!(
        c.lookup(5),
        None,
        "invalidated while its copy was in flight"
    );
    assert_eq!(c.lookup(6), Some(chunk(2, 1)), "outside the range");
    // A range too long to list refuses every copy taken before it.
    let old = c.ticket();
    c.invalidate_range(0..u64::MAX / 2);
    let _ = c.store(7, old, chunk(3, 1));
    c.sync();
    assert_eq!(c.lookup(7), None);
    let _ = c.store(7, c.ticket(), chunk(3, 1));
    c.sync();
    assert_eq!(c.lookup(7), Some(chunk(3, 1)), "later copies are kept");
}

#[test]
fn a_reader_waits_out_another_reader_setting_the_directory_up_but_a_writer_does_not() {
    let tmp = tempfile::tempdir().unwrap();
    let o = opts(tmp.path(), 64 * MB);
    // Another reader of the snapshot holds the directory alone while it
    // empties and records it.
    let setup = DirLock::try_take(&drive_dir(tmp.path(), "snap"), LockMode::Exclusive)
        .unwrap()
        .unwrap();
    let held = Duration::from_millis(100);
    let release = std::thread::spawn(move || {
        std::thread::sleep(held);
        drop(setup);
    });
    let started = Instant::now();
    let reader = DiskCache::open(&o, "snap", Some("s"), Access::Reader).unwrap();
    assert!(reader.is_some(), "the reader got the tier once it was free");
    assert!(started.elapsed() >= held);
    release.join().unwrap();
    // A writer conflicts with readers for as long as they are mounted:
    // waiting would only delay its mount.
    let started = Instant::now();
    assert!(DiskCache::open(&o, "snap", Some("s"), Access::Writer)
        .unwrap()
        .is_none());
    assert!(started.elapsed() < READER_BUSY_WAIT / 2);
}

#[test]
fn eviction_under_a_small_budget_keeps_disk_space_bounded_and_creates_no_file() {
    let tmp = tempfile::tempdir().unwrap();
    let max = 2 * MB;
    let c = DiskCache::open(&opts(tmp.path(), max), "b", Some("e"), Access::Writer)
        .unwrap()
        .unwrap();
    // Chunks of two slabs, so both exist after the first round.
    let round = |from: u64| {
        for idx in (from..from + 40).chain(SLAB_CHUNKS + from..SLAB_CHUNKS + from + 4) {
            let _ = c.store(
                idx,
                c.ticket(),
                chunk(idx as u8 | 1, PAGES - (idx % 3) as usize),
            );
            c.sync();
            assert!(on_disk(&c) <= max, "chunk {idx}: {} on disk", on_disk(&c));
        }
    };
    round(0);
    let files = inodes(&c);
    assert_eq!(files.len(), 2, "one file per slab");
    for from in [40, 80, 0] {
        round(from);
        assert_eq!(inodes(&c), files, "no file was made or removed");
    }
    assert!(c.bytes_held() <= max);
    assert!(on_disk(&c) >= max / 2, "the tier is used: {}", on_disk(&c));
    assert!(c.contains(SLAB_CHUNKS + 3), "the newest chunk stays");
}

#[test]
fn a_torn_or_misplaced_slot_is_never_served() {
    let tmp = tempfile::tempdir().unwrap();
    let o = opts(tmp.path(), 64 * MB);
    let c = DiskCache::open(&o, "b", Some("e"), Access::Writer)
        .unwrap()
        .unwrap();
    for idx in 0..3 {
        let _ = c.store(idx, c.ticket(), chunk(idx as u8 + 1, PAGES));
    }
    c.sync();
    // Chunk 2 torn: the slab ends in the middle of its data.
    let (path, offset) = slab::place(&c.shared.chunks_dir, 2);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(offset + 100_000).unwrap();
    // Chunk 1's slot holds chunk 0's bytes (a slot written at the wrong place).
    use std::os::unix::fs::FileExt;
    let mut raw = vec![0u8; SLOT_BYTES as usize];
    f.sync_all().unwrap();
    let r = std::fs::File::open(&path).unwrap();
    r.read_exact_at(&mut raw, 0).unwrap();
    f.write_all_at(&raw, SLOT_BYTES).unwrap();
    assert_eq!(c.lookup(2), None);
    assert_eq!(c.lookup(1), None);
    assert_eq!(c.bad_chunks(), 2);
    assert_eq!(
        c.lookup(0),
        Some(chunk(1, PAGES)),
        "its neighbours are fine"
    );
    // A good copy fetched again takes the slot back.
    let _ = c.store(1, c.ticket(), chunk(2, PAGES));
    c.sync();
    assert_eq!(c.lookup(1), Some(chunk(2, PAGES)));
    c.finish(Some("e")).unwrap();
    drop(c);
    let c = DiskCache::open(&o, "b", Some("e"), Access::Writer)
        .unwrap()
        .unwrap();
    assert!(!c.contains(2), "the torn slot was emptied");
    assert_eq!(c.lookup(1), Some(chunk(2, PAGES)));
}

#[test]
fn a_chunk_invalidated_after_its_copy_was_kept_is_not_trusted_after_a_remount() {
    let tmp = tempfile::tempdir().unwrap();
    let o = opts(tmp.path(), 64 * MB);
    let c = DiskCache::open(&o, "b", Some("e1"), Access::Writer)
        .unwrap()
        .unwrap();
    let _ = c.store(4, c.ticket(), chunk(1, PAGES));
    let _ = c.store(9, c.ticket(), chunk(2, PAGES));
    c.sync();
    // Chunk 4 is written; a copy of it taken before lands after.
    let old = c.ticket();
    c.invalidate(4);
    let _ = c.store(4, old, chunk(3, PAGES));
    // Chunk 9 likewise, while its slot holds a copy (refused before the
    // write; a change during the write is in
    // `a_chunk_invalidated_while_its_copy_is_written_is_not_kept`).
    let old9 = c.ticket();
    c.invalidate(9);
    let _ = c.store(9, old9, chunk(4, PAGES));
    c.finish(Some("e2")).unwrap();
    drop(c);
    let c = DiskCache::open(&o, "b", Some("e2"), Access::Writer)
        .unwrap()
        .unwrap();
    assert_eq!(c.lookup(4), None);
    assert_eq!(c.lookup(9), None);
    assert_eq!(c.bad_chunks(), 0);
    assert_eq!(c.bytes_held(), 0, "their slots were emptied");
}

/// The bytes of a chunk file of the first layout (`v1`), as older builds
/// wrote them: magic `BDCHUNK1`, index, held and zero bitmaps, data length,
/// CRC-32C of all of it before the CRC and of the data, then the data.
fn v1_chunk_file(idx: u64, fill: u8) -> Vec<u8> {
    let mut out = b"BDCHUNK1".to_vec();
    out.extend_from_slice(&idx.to_le_bytes());
    out.extend_from_slice(&[0xff; 64]);
    out.extend_from_slice(&[0; 64]);
    out.extend_from_slice(&((PAGES * PAGE_BYTES) as u32).to_le_bytes());
    let data = vec![fill; PAGES * PAGE_BYTES];
    let crc = crc32c::crc32c_append(crc32c::crc32c(&out), &data);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&data);
    out
}

/// A `v1` tier of blob `id` at ETag `etag` holding chunks 0..4, as an older
/// build leaves it after a clean close; returns its layout directory.
fn make_v1_tier(cache_dir: &Path, id: &str, etag: &str) -> PathBuf {
    let name = drive_dir(cache_dir, id).file_name().unwrap().to_owned();
    let root = cache_dir.join("v1");
    let dir = root.join(name);
    private_dir::ensure(&root).unwrap();
    private_dir::ensure(&dir).unwrap();
    private_dir::ensure(&dir.join("chunks")).unwrap();
    drop(
        DirLock::try_take(&dir, LockMode::Exclusive)
            .unwrap()
            .unwrap(),
    );
    let rec = Record {
        identity: id.to_string(),
        state: record::CLEAN.to_string(),
        etag: Some(etag.to_string()),
    };
    record::write(&dir, &rec).unwrap();
    for idx in 0..4 {
        std::fs::write(
            dir.join("chunks").join(format!("{idx:016x}")),
            v1_chunk_file(idx, 0x33),
        )
        .unwrap();
    }
    root
}

#[test]
fn a_v1_tier_left_by_an_older_build_is_removed_at_open_and_never_served() {
    let tmp = tempfile::tempdir().unwrap();
    let root = make_v1_tier(tmp.path(), "blob", "e1");
    assert_eq!(
        format::decode(0, v1_chunk_file(0, 1).into()),
        Err(format::Bad::Torn)
    );
    let c = DiskCache::open(
        &opts(tmp.path(), 64 * MB),
        "blob",
        Some("e1"),
        Access::Reader,
    )
    .unwrap()
    .unwrap();
    assert!(!root.exists(), "the v1 tier is gone");
    for idx in 0..4 {
        assert_eq!(c.lookup(idx), None, "chunk {idx} of the v1 tier");
    }
    assert_eq!(c.bad_chunks(), 0);
    assert_eq!(c.bytes_held(), 0);
}

#[test]
fn a_v1_tier_in_use_by_an_older_build_is_left_alone_and_clear_removes_it_after() {
    let tmp = tempfile::tempdir().unwrap();
    let root = make_v1_tier(tmp.path(), "blob", "e1");
    let old_dir = root.read_dir().unwrap().next().unwrap().unwrap().path();
    let held = DirLock::try_take(&old_dir, LockMode::Shared)
        .unwrap()
        .unwrap();
    let c = DiskCache::open(
        &opts(tmp.path(), 64 * MB),
        "blob",
        Some("e1"),
        Access::Reader,
    )
    .unwrap()
    .unwrap();
    assert!(
        old_dir.join("chunks").exists(),
        "a running older mount keeps its tier"
    );
    assert_eq!(c.lookup(0), None);
    c.finish(None).unwrap();
    drop(c);
    drop(held);
    let mut done = Cleared::default();
    for _ in 0..200 {
        done = clear(tmp.path()).unwrap();
        if done.in_use == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(
        done,
        Cleared {
            removed: 2,
            in_use: 0,
            left: Vec::new(),
        },
        "one drive of each layout"
    );
    assert!(!root.exists());
}

/// A writer's tier holding chunks 4 and 9 recorded `clean` at ETag `e1`,
/// reopened; its slots' failures are then injected by the caller.
fn reopened_with_two_chunks(o: &DiskCacheOptions) -> DiskCache {
    let c = DiskCache::open(o, "b", Some("e1"), Access::Writer)
        .unwrap()
        .unwrap();
    let _ = c.store(4, c.ticket(), chunk(1, PAGES));
    let _ = c.store(9, c.ticket(), chunk(2, PAGES));
    c.finish(Some("e1")).unwrap();
    drop(c);
    let c = open_when_free(o, "b", "e1", Access::Writer);
    assert_eq!(c.lookup(4), Some(chunk(1, PAGES)));
    c
}

#[test]
fn a_slot_that_cannot_be_punched_after_a_discard_is_not_served_after_a_remount() {
    let tmp = tempfile::tempdir().unwrap();
    let o = opts(tmp.path(), 64 * MB);
    let c = reopened_with_two_chunks(&o);
    // A full filesystem: punching needs a block to split the extent.
    slab::hooks::fail_punch(&c.shared.chunks_dir, libc::ENOSPC);
    c.invalidate(4);
    c.finish(Some("e2")).unwrap();
    drop(c);
    let c = open_when_free(&o, "b", "e2", Access::Writer);
    assert_eq!(c.lookup(4), None, "the discarded chunk's old copy");
    assert_eq!(
        c.lookup(9),
        Some(chunk(2, PAGES)),
        "its header was zeroed, the rest kept"
    );
}

#[test]
fn a_slot_that_cannot_be_emptied_at_all_leaves_the_tier_untrusted() {
    let tmp = tempfile::tempdir().unwrap();
    let o = opts(tmp.path(), 64 * MB);
    let c = reopened_with_two_chunks(&o);
    slab::hooks::fail_punch(&c.shared.chunks_dir, libc::ENOSPC);
    slab::hooks::fail_zero(&c.shared.chunks_dir, libc::EIO);
    c.invalidate(4);
    c.finish(Some("e2")).unwrap();
    assert_eq!(record::read(&c.dir).unwrap().state, record::IN_USE);
    drop(c);
    let c = open_when_free(&o, "b", "e2", Access::Writer);
    assert_eq!(c.lookup(4), None, "the discarded chunk's old copy");
    assert_eq!(c.lookup(9), None, "the whole tier was dropped");
}

#[test]
fn an_unrelated_directory_under_v1_survives_a_mount_and_cache_clear() {
    let tmp = tempfile::tempdir().unwrap();
    let root = make_v1_tier(tmp.path(), "blob", "e1");
    // A user's own directories that happen to sit in a v1/ there: one named
    // like a drive's cache but holding something else, one not.
    let mine = root.join("notes");
    let lookalike = root.join("0123456789abcdef0123456789abcdef");
    for d in [&mine, &lookalike] {
        private_dir::ensure(d).unwrap();
        std::fs::write(d.join("todo.txt"), b"keep me").unwrap();
    }
    let c = DiskCache::open(
        &opts(tmp.path(), 64 * MB),
        "blob",
        Some("e1"),
        Access::Writer,
    )
    .unwrap()
    .unwrap();
    c.finish(None).unwrap();
    drop(c);
    let done = clear(tmp.path()).unwrap();
    assert_eq!(done.left.len(), 2, "{done:?}");
    for d in [&mine, &lookalike] {
        assert_eq!(std::fs::read(d.join("todo.txt")).unwrap(), b"keep me");
    }
    assert_eq!(
        root.read_dir().unwrap().count(),
        2,
        "the old tier itself is gone"
    );
}

#[test]
fn a_symlinked_layout_root_is_not_followed_by_a_mount_or_cache_clear() {
    let tmp = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    // Something that has every look of a drive's cache, reached by a link.
    let target = make_v1_tier(elsewhere.path(), "blob", "e1");
    std::os::unix::fs::symlink(&target, tmp.path().join("v1")).unwrap();
    let c = DiskCache::open(
        &opts(tmp.path(), 64 * MB),
        "blob",
        Some("e1"),
        Access::Writer,
    )
    .unwrap()
    .unwrap();
    c.finish(None).unwrap();
    drop(c);
    let done = clear(tmp.path()).unwrap();
    assert_eq!(done.left, vec![tmp.path().join("v1")]);
    assert_eq!(
        target.read_dir().unwrap().count(),
        1,
        "the linked tier is untouched"
    );
    assert!(tmp.path().join("v1").symlink_metadata().is_ok());
}

/// Hold chunk `idx`'s slot as another process would: a write lock through
/// an open file description of its own (OFD locks conflict between
/// descriptions, in one process as across processes).
fn hold_slot(c: &DiskCache, idx: u64) -> std::fs::File {
    use std::os::fd::AsRawFd;
    let (path, offset) = slab::place(&c.shared.chunks_dir, idx);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    // SAFETY: an all-zero `flock` is a valid value of this plain C struct.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = offset as libc::off_t;
    fl.l_len = SLOT_BYTES as libc::off_t;
    // SAFETY: fcntl on a descriptor we own with a pointer to a live flock.
    assert_eq!(
        unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &fl) },
        0
    );
    f
}

#[test]
fn a_slot_held_by_a_stopped_process_is_a_miss_not_a_hang() {
    let tmp = tempfile::tempdir().unwrap();
    let o = opts(tmp.path(), 64 * MB);
    let c = Arc::new(
        DiskCache::open(&o, "b", Some("e"), Access::Reader)
            .unwrap()
            .unwrap(),
    );
    let _ = c.store(3, c.ticket(), chunk(1, PAGES));
    c.sync();
    let held = hold_slot(&c, 3);
    let (tx, rx) = mpsc::channel();
    let c2 = c.clone();
    std::thread::spawn(move || {
        let got = c2.lookup(3);
        let _ = c2.store(3, c2.ticket(), chunk(2, PAGES));
        c2.sync();
        let _ = tx.send(got);
    });
    let got = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the lookup and the store came back");
    assert_eq!(got, None, "a busy slot is a miss");
    assert_eq!(
        c.dropped_copies(),
        1,
        "the copy for the busy slot was dropped"
    );
    drop(held);
    assert_eq!(
        c.lookup(3),
        Some(chunk(1, PAGES)),
        "the slot kept its chunk"
    );
}

#[test]
fn on_a_filesystem_without_holes_the_tier_stops_growing_at_the_first_refused_punch() {
    let tmp = tempfile::tempdir().unwrap();
    let max = 2 * MB;
    let c = DiskCache::open(&opts(tmp.path(), max), "b", Some("e"), Access::Writer)
        .unwrap()
        .unwrap();
    slab::hooks::fail_punch(&c.shared.chunks_dir, libc::EOPNOTSUPP);
    let mut at_20 = 0;
    for idx in 0..40 {
        let _ = c.store(idx, c.ticket(), chunk(idx as u8 | 1, PAGES));
        c.sync();
        // The chunk whose eviction found the punch refused is the last.
        let used = on_disk(&c);
        assert!(used <= max + SLOT_BYTES, "chunk {idx}: {used} on disk");
        if idx == 20 {
            at_20 = used;
        }
    }
    assert_eq!(on_disk(&c), at_20, "the tier stopped growing");
    assert!(c.bytes_held() < max, "evicted, and nothing stored after");
    assert!(
        !c.contains(39),
        "no copy is stored once eviction frees nothing"
    );
}

#[test]
fn a_fifo_a_directory_or_a_huge_number_named_like_a_slab_is_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    let o = opts(tmp.path(), 64 * MB);
    let c = DiskCache::open(&o, "b", Some("e"), Access::Writer)
        .unwrap()
        .unwrap();
    let _ = c.store(1, c.ticket(), chunk(1, PAGES));
    let _ = c.store(SLAB_CHUNKS + 1, c.ticket(), chunk(2, PAGES));
    c.finish(Some("e")).unwrap();
    let chunks_dir = c.shared.chunks_dir.clone();
    drop(c);
    // Slab 1 replaced by a FIFO, slab 2 by a directory; a slab whose chunk
    // indexes overflow holds a well-formed slot.
    let fifo = chunks_dir.join(format!("{:016x}", 1));
    std::fs::remove_file(&fifo).unwrap();
    let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
    std::fs::create_dir(chunks_dir.join(format!("{:016x}", 2))).unwrap();
    std::fs::copy(
        chunks_dir.join(format!("{:016x}", 0)),
        chunks_dir.join(format!("{:016x}", u64::MAX)),
    )
    .unwrap();
    let (tx, rx) = mpsc::channel();
    let o2 = o.clone();
    std::thread::spawn(move || {
        let c = open_when_free(&o2, "b", "e", Access::Writer);
        let got = (c.lookup(1), c.lookup(SLAB_CHUNKS + 1));
        let _ = c.store(SLAB_CHUNKS + 2, c.ticket(), chunk(3, PAGES));
        let _ = c.store(2 * SLAB_CHUNKS, c.ticket(), chunk(3, PAGES));
        c.finish(Some("e")).unwrap();
        let _ = tx.send((got, c.bytes_held()));
    });
    let ((one, other), held) = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("open, lookups and stores came back");
    assert_eq!(one, Some(chunk(1, PAGES)), "the tier stayed on");
    assert_eq!(other, None, "the FIFO is no slab");
    assert_eq!(held, round_up(chunk(1, PAGES).encoded_len() as u64));
}

#[test]
fn a_slab_left_without_chunks_is_removed_at_the_next_open() {
    let tmp = tempfile::tempdir().unwrap();
    let o = opts(tmp.path(), 64 * MB);
    let c = DiskCache::open(&o, "b", Some("e"), Access::Writer)
        .unwrap()
        .unwrap();
    let _ = c.store(1, c.ticket(), chunk(1, PAGES));
    let _ = c.store(SLAB_CHUNKS + 1, c.ticket(), chunk(2, PAGES));
    c.sync();
    assert_eq!(inodes(&c).len(), 2);
    c.invalidate(SLAB_CHUNKS + 1);
    c.finish(Some("e")).unwrap();
    drop(c);
    let c = open_when_free(&o, "b", "e", Access::Writer);
    assert_eq!(inodes(&c).len(), 1, "the emptied slab is gone");
    assert_eq!(c.lookup(1), Some(chunk(1, PAGES)));
    assert_eq!(c.lookup(SLAB_CHUNKS + 1), None);
}

#[test]
fn after_a_reopen_the_slab_written_longest_ago_is_evicted_first() {
    let tmp = tempfile::tempdir().unwrap();
    let o = opts(tmp.path(), 64 * MB);
    let c = DiskCache::open(&o, "b", Some("e"), Access::Writer)
        .unwrap()
        .unwrap();
    // Slab 1 (high chunks) first, then slab 0 (low chunks, say the
    // filesystem's metadata read again and again).
    let _ = c.store(SLAB_CHUNKS, c.ticket(), chunk(1, PAGES));
    c.sync();
    let (old_slab, _) = slab::place(&c.shared.chunks_dir, SLAB_CHUNKS);
    let f = std::fs::File::options()
        .write(true)
        .open(&old_slab)
        .unwrap();
    f.set_modified(std::time::SystemTime::now() - Duration::from_secs(3600))
        .unwrap();
    let _ = c.store(0, c.ticket(), chunk(2, PAGES));
    c.finish(Some("e")).unwrap();
    drop(c);
    // Room for one chunk only: the open evicts the least recently used.
    let one = OVERHEAD_BYTES + SLOT_BYTES;
    let c = open_when_free(&opts(tmp.path(), one), "b", "e", Access::Writer);
    assert!(c.contains(0), "the slab written last stays");
    assert!(
        !c.contains(SLAB_CHUNKS),
        "the slab written longest ago goes"
    );
}

#[test]
fn a_reader_rewriting_a_slot_a_peer_filled_longer_leaves_no_blocks_uncounted() {
    let tmp = tempfile::tempdir().unwrap();
    let o = opts(tmp.path(), 64 * MB);
    let a = DiskCache::open(&o, "b", Some("e"), Access::Reader)
        .unwrap()
        .unwrap();
    let b = DiskCache::open(&o, "b", Some("e"), Access::Reader)
        .unwrap()
        .unwrap();
    let _ = a.store(5, a.ticket(), chunk(1, 8));
    a.sync();
    // Peer b keeps a full copy of the same chunk in the same slot.
    let _ = b.store(5, b.ticket(), chunk(1, PAGES));
    b.sync();
    let _ = a.store(5, a.ticket(), chunk(1, 8));
    a.sync();
    assert_eq!(on_disk(&a), round_up(chunk(1, 8).encoded_len() as u64));
}

#[test]
fn a_chunk_invalidated_while_its_copy_is_written_is_not_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let o = opts(tmp.path(), 64 * MB);
    let c = Arc::new(
        DiskCache::open(&o, "b", Some("e1"), Access::Writer)
            .unwrap()
            .unwrap(),
    );
    let _ = c.store(9, c.ticket(), chunk(1, PAGES));
    c.sync();
    // The next copy passes the first freshness check, then the chunk
    // changes while its slot is written.
    let peer = Arc::downgrade(&c);
    slab::hooks::after_write(&c.shared.chunks_dir, move || {
        if let Some(c) = peer.upgrade() {
            c.invalidate(9);
        }
    });
    let _ = c.store(9, c.ticket(), chunk(2, PAGES));
    c.sync();
    assert!(!c.contains(9));
    c.finish(Some("e2")).unwrap();
    drop(c);
    let c = open_when_free(&o, "b", "e2", Access::Writer);
    assert_eq!(c.lookup(9), None);
    assert_eq!(c.bytes_held(), 0, "its slot was emptied");
}

#[test]
fn where_holes_cannot_be_punched_an_invalidated_slot_reads_empty_after_a_remount() {
    let tmp = tempfile::tempdir().unwrap();
    let o = opts(tmp.path(), 64 * MB);
    let c = reopened_with_two_chunks(&o);
    slab::hooks::fail_punch(&c.shared.chunks_dir, libc::EOPNOTSUPP);
    c.invalidate(4);
    c.finish(Some("e2")).unwrap();
    drop(c);
    let c = open_when_free(&o, "b", "e2", Access::Writer);
    assert_eq!(c.lookup(4), None);
    assert_eq!(c.lookup(9), Some(chunk(2, PAGES)));
}
