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
    assert!(
        !c.shared.chunk_path(5).exists(),
        "the stale file is deleted"
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
    let path = c.shared.chunk_path(0);
    let mut raw = std::fs::read(&path).unwrap();
    raw[1000] ^= 1;
    std::fs::write(&path, raw).unwrap();
    assert_eq!(c.lookup(0), None);
    assert_eq!(c.bad_chunks(), 1);
    c.sync();
    assert!(!path.exists());
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
    let on_disk: u64 = std::fs::read_dir(c.dir().join("chunks"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(on_disk <= max, "{on_disk}");
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
