//! The disk tier: clean pages of one drive kept on local disk, below the
//! memory cache, so a drive is warm again after a remount or a reboot.
//!
//! What it owns: one directory per blob (or snapshot) under the cache dir,
//! named by a hash of the blob's identity (endpoint, container, name,
//! snapshot time); in it the slab files (`slab.rs`), each with a fixed slot
//! for each of 256 chunks of 256 KiB, a slot holding only its chunk's known
//! pages (zero pages take no bytes, see `format.rs`), a lock file and a
//! record of the blob's ETag the slots belong to (`record.rs`). It knows
//! nothing of FUSE or of the drive's memory cache: the drive asks it for
//! chunks, hands it chunks to keep, and tells it which chunks changed.
//!
//! Why slabs: the first layout (`v1`) kept one file per chunk, written to a
//! temporary name and renamed. A full tier evicts and creates files all
//! the time, and after a tier was emptied ext4's inode allocation took up
//! to 37% of the daemon's CPU in a cold read. Slots at places fixed by
//! the chunk's index keep that layout's properties without a file per
//! chunk: no slot map to tear or rebuild (a slot's header names its chunk),
//! processes sharing a snapshot's directory find each other's chunks where
//! they expect them, and eviction punches the slot's blocks out. Reusing
//! evicted chunk files would have kept the files but not spared the inodes
//! of a tier that starts empty. A `v1` tier found at open is removed
//! ([`discard_old_layouts`]): nothing in it is read.
//!
//! Invariants:
//! - Nothing stale is served: a chunk is trusted only when the record says
//!   `clean` for the blob's current ETag (checked at open, under the lock);
//!   a chunk changed by a write is dropped from the index at once
//!   ([`DiskCache::invalidate`]) and a copy taken before that change is
//!   never installed (tickets, see [`DiskCache::store`]).
//! - Nothing torn is served: every slot carries a CRC-32C and its chunk's
//!   index, checked on each read; a bad slot counts in `bad_chunks`, is
//!   punched out, and reads as a miss. A slot is written in place under a
//!   byte-range lock (`slab.rs`), so several processes sharing a snapshot's
//!   directory never read half a slot while it is written.
//! - A copy refused by its ticket, or overwritten in place after the chunk
//!   changed, never outlives the mount: its slot is punched by the writer
//!   thread (or, where the punch fails, its header zeroed), and `finish`
//!   syncs the slabs this mount wrote or punched before it records
//!   `clean`. A slot that could be neither punched nor zeroed (or a writer
//!   thread that died) leaves the record `in-use`: the next open empties
//!   the directory.
//! - The bytes held stay under `max_bytes` (each slot's chunk rounded up to
//!   4 KiB, least recently used chunks evicted first, their blocks punched
//!   out). On a filesystem that cannot punch holes an evicted slot keeps
//!   its blocks (its header zeroed): from the first refused punch (at an
//!   eviction, or a repair at open) the mount stores no more copies, so
//!   the space used stays within the bound and one chunk. Processes
//!   sharing one snapshot's directory each keep their own account, so the
//!   bound there holds per process.
//! - Nobody else can read a page: the directories are 0700 and the files
//!   0600 from their creation (`private_dir`), a loose directory left by an
//!   older blobdrive is tightened at open, and a directory of
//!   another user, or one others may write to, turns the tier off with one
//!   line saying why. The cache dir itself is never changed (it may be
//!   shared); it must belong to this user or root.
//! - Every method here blocks on file I/O except [`DiskCache::store`],
//!   [`DiskCache::store_wait`], [`DiskCache::invalidate`] and the counters:
//!   the drive calls the others through `spawn_blocking`. Writes go to one
//!   writer thread through a bounded queue: a fill from the blob waits for
//!   room (so reads slow to the disk's pace rather than leave holes); a copy
//!   after a flush is dropped when the queue is full, never waited for.

mod format;
mod record;
mod slab;

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::Rng as _;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc::{Receiver, Sender};

use crate::private_dir;
pub use format::CachedChunk;
use record::{DirLock, LockMode, Record};
use slab::Slabs;
pub use slab::{Found as StoredChunk, SLAB_CHUNKS, SLOT_BYTES};

/// Pages per cached chunk (the drive's chunk size).
pub const PAGES: usize = 512;
/// Bytes per page.
pub const PAGE_BYTES: usize = crate::units::PAGE_SIZE as usize;
/// Default cache directory (`--cache-dir`).
pub const DEFAULT_CACHE_DIR: &str = "/var/cache/blobdrive";
/// Sub-directory holding the drives' directories, named for the layout version.
const LAYOUT: &str = "v2";
/// Layouts of older versions: removed when found, never read.
const OLD_LAYOUTS: &[&str] = &["v1"];
/// Chunk copies waiting for the writer at most (64 x 256 KiB).
const QUEUE_CHUNKS: usize = 64;
/// Bytes counted for the lock file, the record and the directories.
const OVERHEAD_BYTES: u64 = 16 * 1024;
/// Invalidations remembered at most (then they collapse into a floor).
const MAX_INVALIDATED: usize = 65_536;
/// Disk space is counted in blocks of this size.
const BLOCK_BYTES: u64 = 4096;
/// How long a reader waits for a directory another mount holds in a
/// conflicting mode before it runs without a disk tier (see
/// [`DiskCache::open`]); emptying and recording one takes milliseconds.
pub const READER_BUSY_WAIT: Duration = Duration::from_secs(1);
/// How long a reader waits while another reader sets the directory up.
pub const SETUP_BUSY_WAIT: Duration = Duration::from_secs(10);

/// What one attempt to open a drive's directory found.
enum Opened {
    /// The tier, ready.
    Ready(DiskCache),
    /// The directory is held by a mount in a conflicting mode.
    Busy,
    /// The tier cannot be used for this blob.
    Off,
}

/// Where the disk tier lives and how large it may grow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskCacheOptions {
    /// The cache directory (`--cache-dir`, default [`DEFAULT_CACHE_DIR`]).
    pub dir: PathBuf,
    /// Disk space one drive's cache may use (`--disk-cache-size`).
    pub max_bytes: u64,
}

/// One bit per page of a chunk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChunkBits([u64; PAGES / 64]);

impl ChunkBits {
    /// Is page `slot` set?
    pub fn get(&self, slot: usize) -> bool {
        self.0[slot / 64] & (1 << (slot % 64)) != 0
    }
    /// Set page `slot`.
    pub fn set(&mut self, slot: usize) {
        self.0[slot / 64] |= 1 << (slot % 64);
    }
    /// How many pages below `slot` are set.
    pub fn rank(&self, slot: usize) -> usize {
        let full: u32 = self.0[..slot / 64].iter().map(|w| w.count_ones()).sum();
        let part = self.0[slot / 64] & ((1u64 << (slot % 64)) - 1);
        (full + part.count_ones()) as usize
    }
    /// Pages set.
    pub fn count(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }
    pub(crate) fn words(&self) -> [u64; PAGES / 64] {
        self.0
    }
    pub(crate) fn set_word(&mut self, i: usize, w: u64) {
        self.0[i] = w;
    }
}

/// How a drive uses its cache directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// A read-write mount: alone in the directory; trusted again after a
    /// clean close only.
    Writer,
    /// A read-only or snapshot mount: shares the directory with other readers.
    Reader,
}

/// One chunk known to the index (its slot holds it).
#[derive(Debug, Clone, Copy)]
struct Entry {
    bytes: u64,
    last_use: u64,
}

#[derive(Default)]
struct Index {
    entries: HashMap<u64, Entry>,
    bytes: u64,
    clock: u64,
    /// Bumped by every invalidation; a copy carries the value it saw.
    seq: u64,
    /// Last invalidation of each chunk (since `floor`).
    invalidated: HashMap<u64, u64>,
    /// Copies with tickets below this are refused: the invalidations before
    /// it were forgotten to keep `invalidated` small.
    floor: u64,
    /// Chunks whose slot must be emptied by the writer.
    stale: HashSet<u64>,
}

impl Index {
    fn note_invalidated(&mut self, idx: u64, seq: u64) {
        if self.invalidated.len() >= MAX_INVALIDATED {
            // Forget them all: only copies in flight, taken before now, lose.
            self.invalidated.clear();
            self.floor = seq;
        }
        self.invalidated.insert(idx, seq);
    }

    /// May a copy of chunk `idx` taken at `ticket` be installed?
    fn fresh(&self, idx: u64, ticket: u64) -> bool {
        ticket >= self.floor && self.invalidated.get(&idx).is_none_or(|&n| n <= ticket)
    }

    fn remove(&mut self, idx: u64) {
        if let Some(e) = self.entries.remove(&idx) {
            self.bytes -= e.bytes;
        }
    }

    /// Drop least recently used entries until the total is at most `target`;
    /// returns the chunks whose slots must be emptied.
    fn shrink_to(&mut self, target: u64) -> Vec<u64> {
        if self.bytes <= target {
            return Vec::new();
        }
        let mut by_age: Vec<(u64, u64)> =
            self.entries.iter().map(|(i, e)| (e.last_use, *i)).collect();
        by_age.sort_unstable();
        let mut out = Vec::new();
        for (_, idx) in by_age {
            if self.bytes <= target {
                break;
            }
            self.remove(idx);
            out.push(idx);
        }
        out
    }
}

/// Counters of the disk tier.
#[derive(Debug, Default)]
struct Meters {
    bad_chunks: AtomicU64,
    dropped: AtomicU64,
}

struct Shared {
    chunks_dir: PathBuf,
    max_bytes: u64,
    index: Mutex<Index>,
    meters: Meters,
    /// A slot that had to be emptied may still hold its chunk (neither
    /// punched nor its header zeroed): `finish` must not record `clean`.
    unclean: AtomicBool,
    /// The filesystem cannot punch holes: evicted chunks keep their blocks,
    /// so no more copies are stored (see the module doc).
    punch_refused: AtomicBool,
    /// Other processes (readers of the same snapshot) may write slots here.
    shared_dir: bool,
    /// The slabs written or punched since open, for `finish` to sync.
    written: Mutex<HashSet<PathBuf>>,
    /// The directory's lock: held until `finish`, or until both the cache
    /// and its writer thread are gone (a dropped cache's last writes still
    /// happen under it).
    lock: Mutex<Option<DirLock>>,
}

impl Shared {
    fn index(&self) -> MutexGuard<'_, Index> {
        self.index.lock().expect("disk cache index mutex poisoned")
    }

    /// Remember the slabs `slabs` wrote, for `finish` to sync.
    fn note_written(&self, slabs: &mut Slabs) {
        self.written
            .lock()
            .expect("written mutex poisoned")
            .extend(slabs.take_written());
    }

    fn budget(&self) -> u64 {
        self.max_bytes.saturating_sub(OVERHEAD_BYTES)
    }
}

enum Job {
    Store {
        idx: u64,
        ticket: u64,
        chunk: Box<CachedChunk>,
    },
    Sync(mpsc::Sender<()>),
}

/// One drive's disk tier (see the module doc).
pub struct DiskCache {
    shared: Arc<Shared>,
    dir: PathBuf,
    identity: String,
    access: Access,
    tx: Mutex<Option<Sender<Job>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

/// The directory of the blob named `identity` under the cache dir.
pub fn drive_dir(cache_dir: &Path, identity: &str) -> PathBuf {
    cache_dir.join(LAYOUT).join(drive_dir_name(identity))
}

/// The name of a drive's directory (in every layout so far): the first 16
/// bytes of the SHA-256 of the blob's identity, in hex.
fn drive_dir_name(identity: &str) -> String {
    let hash = Sha256::digest(identity.as_bytes());
    hash[..16].iter().map(|b| format!("{b:02x}")).collect()
}

fn is_hex(name: &str, len: usize) -> bool {
    name.len() == len
        && name
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Does `path` look like one drive's directory of a layout root, as this
/// and older builds make them: a real directory of this user alone, named
/// by [`drive_dir_name`], holding only `lock`, a `record.json` that parses
/// and names a blob whose hash is that name, temporary records, and a
/// `chunks/` of regular files named by 16 hex digits (or temporary chunk
/// files of `v1`)? Only such a directory is ever removed: a cache dir may
/// hold other things under `v1/` or `v2/` by accident.
fn is_drive_dir(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    if !is_hex(name, 32) || !private_dir::is_ours_alone(path) {
        return false;
    }
    let Ok(entries) = std::fs::read_dir(path) else {
        return false;
    };
    entries.into_iter().all(|e| {
        let Ok(e) = e else { return false };
        let Ok(kind) = e.file_type() else {
            return false;
        };
        match e.file_name().to_str() {
            Some("lock") => kind.is_file(),
            Some("record.json") => {
                kind.is_file()
                    && record::read(path).is_some_and(|r| drive_dir_name(&r.identity) == name)
            }
            Some(n) if n.starts_with("record.json.tmp.") => kind.is_file(),
            Some("chunks") => kind.is_dir() && holds_only_chunk_files(&e.path()),
            _ => false,
        }
    })
}

fn holds_only_chunk_files(chunks_dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(chunks_dir) else {
        return false;
    };
    entries.into_iter().all(|e| {
        e.is_ok_and(|e| {
            e.file_type().is_ok_and(|t| t.is_file())
                && e.file_name()
                    .to_str()
                    .is_some_and(|n| is_hex(n, 16) || n.contains(".tmp."))
        })
    })
}

const fn round_up(bytes: u64) -> u64 {
    bytes.div_ceil(BLOCK_BYTES) * BLOCK_BYTES
}

/// Remove every slab file of a directory.
fn wipe(chunks_dir: &Path) -> io::Result<()> {
    match std::fs::remove_dir_all(chunks_dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    private_dir::ensure(chunks_dir)
}

/// Check the cache dir (never changed: it may be shared) and make or check
/// the private layout directory under it, before a drive's directory is
/// used (see `private_dir`). The error names the directory and what is wrong.
fn check_root(cache_dir: &Path) -> io::Result<()> {
    private_dir::check_parent(cache_dir)?;
    discard_old_layouts(cache_dir);
    private_dir::ensure(&cache_dir.join(LAYOUT))
}

/// Remove the tiers an older blobdrive kept in an older layout (nothing in
/// them is ever read): every drive's directory not locked by a running
/// mount of that version, then the layout directory once empty. Only what
/// [`clear_layout`] recognises as a drive's directory is touched. Trouble
/// is logged, never fatal: the tier works without it.
fn discard_old_layouts(cache_dir: &Path) {
    for old in OLD_LAYOUTS {
        let root = cache_dir.join(old);
        match clear_layout(&root) {
            Ok(done) => {
                if done.in_use == 0 && done.left.is_empty() {
                    let _ = std::fs::remove_dir(&root);
                }
                if done.removed > 0 {
                    tracing::info!(dir = %root.display(), removed = done.removed, in_use = done.in_use,
                        "disk cache: removed the tier of an older blobdrive (layout {old}); none of it is used");
                }
                log_left(&done.left);
            }
            Err(e) => tracing::warn!(dir = %root.display(), error = %e,
                "disk cache: cannot remove the tier of an older blobdrive"),
        }
    }
}

/// Name, once per process (an open may be retried many times), what a
/// layout root holds that is not a drive's directory.
fn log_left(left: &[PathBuf]) {
    static LOGGED: AtomicBool = AtomicBool::new(false);
    if !left.is_empty() && !LOGGED.swap(true, Ordering::Relaxed) {
        let names: Vec<String> = left.iter().map(|p| p.display().to_string()).collect();
        tracing::warn!(left = %names.join(", "),
            "disk cache: left alone, not the cache of a drive");
    }
}

/// The chunks present. Their order of use is not kept on disk; the least
/// recently used come first as well as the disk can tell: slabs by the time
/// they were last written (a slab written long ago holds chunks not kept
/// again since), then slot by slot.
fn scan(chunks_dir: &Path, repair: bool, punch_refused: &AtomicBool) -> io::Result<Index> {
    let mut found = slab::scan(chunks_dir, repair, punch_refused)?;
    let mut written: HashMap<PathBuf, std::time::SystemTime> = HashMap::new();
    for f in &found {
        if !written.contains_key(&f.file) {
            let at = std::fs::symlink_metadata(&f.file)
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            written.insert(f.file.clone(), at);
        }
    }
    // Stable: within a slab, the scan's slot order stays.
    found.sort_by_key(|f| written[&f.file]);
    let mut index = Index::default();
    for (n, found) in found.into_iter().enumerate() {
        index.entries.insert(
            found.index,
            Entry {
                bytes: found.bytes,
                last_use: n as u64,
            },
        );
        index.bytes += found.bytes;
    }
    index.clock = index.entries.len() as u64;
    Ok(index)
}

/// Every chunk the tier under `cache_dir` holds, drive by drive, as its
/// slab headers name them (checksums unchecked); for tests and tools that
/// look at the tier from outside. Blocks.
pub fn stored_chunks(cache_dir: &Path) -> io::Result<Vec<StoredChunk>> {
    let mut out = Vec::new();
    let drives = match std::fs::read_dir(cache_dir.join(LAYOUT)) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for d in drives {
        let chunks = d?.path().join("chunks");
        if chunks.is_dir() {
            out.extend(slab::scan(&chunks, false, &AtomicBool::new(false))?);
        }
    }
    Ok(out)
}

impl DiskCache {
    /// Open the tier of the blob `identity`, whose ETag now is `etag`.
    /// Chunks kept earlier are used only if the record vouches for that ETag;
    /// otherwise the directory is emptied. `None` when the directory is in use
    /// by a mount that conflicts (a writer, or readers of another ETag): the
    /// drive then runs without a disk tier. A reader that finds the directory
    /// busy tries again for a while (see `busy_wait`): another reader of the
    /// same snapshot holds it alone only while it empties and records it
    /// (several snapshot mounts started at once on a fresh cache). Blocks on
    /// file I/O.
    pub fn open(
        opts: &DiskCacheOptions,
        identity: &str,
        etag: Option<&str>,
        access: Access,
    ) -> io::Result<Option<DiskCache>> {
        let started = Instant::now();
        loop {
            match Self::try_open(opts, identity, etag, access)? {
                Opened::Ready(cache) => return Ok(Some(cache)),
                Opened::Off => return Ok(None),
                Opened::Busy if access == Access::Writer => return Ok(None),
                Opened::Busy if started.elapsed() >= Self::busy_wait(opts, identity, etag) => {
                    return Ok(None)
                }
                // Jittered, so two readers that both need the directory alone
                // do not keep colliding.
                Opened::Busy => {
                    std::thread::sleep(Duration::from_millis(rand::rng().random_range(5..=25)))
                }
            }
        }
    }

    /// How long a reader keeps trying a busy directory: long while nothing
    /// is recorded there yet or the record already vouches for this blob
    /// (another reader is setting it up, which ends soon even on a loaded
    /// host), short when it holds another blob state or a writer's (a
    /// conflict that lasts as long as that mount).
    fn busy_wait(opts: &DiskCacheOptions, identity: &str, etag: Option<&str>) -> Duration {
        match record::read(&drive_dir(&opts.dir, identity)) {
            None => SETUP_BUSY_WAIT,
            Some(r) if r.trusts(identity, etag) => SETUP_BUSY_WAIT,
            Some(_) => READER_BUSY_WAIT,
        }
    }

    /// One attempt of [`DiskCache::open`].
    fn try_open(
        opts: &DiskCacheOptions,
        identity: &str,
        etag: Option<&str>,
        access: Access,
    ) -> io::Result<Opened> {
        check_root(&opts.dir)?;
        let dir = drive_dir(&opts.dir, identity);
        let chunks_dir = dir.join("chunks");
        let mode = match access {
            Access::Writer => LockMode::Exclusive,
            Access::Reader => LockMode::Shared,
        };
        let Some(lock) = DirLock::try_take(&dir, mode)? else {
            return Ok(Opened::Busy);
        };
        let trusted = record::read(&dir).is_some_and(|r| r.trusts(identity, etag));
        let mut exclusive = access == Access::Writer;
        if !trusted {
            if etag.is_none() {
                // Without an ETag nothing could ever be trusted again.
                return Ok(Opened::Off);
            }
            if !exclusive {
                if !lock.try_convert(LockMode::Exclusive)? {
                    return Ok(Opened::Busy);
                }
                exclusive = true;
            }
            wipe(&chunks_dir)?;
        } else {
            private_dir::ensure(&chunks_dir)?;
        }
        let state = match access {
            Access::Writer => record::IN_USE,
            Access::Reader => record::CLEAN,
        };
        if access == Access::Writer || !trusted {
            record::write(
                &dir,
                &Record {
                    identity: identity.to_string(),
                    state: state.to_string(),
                    etag: etag.map(str::to_string),
                },
            )?;
        }
        let punch_refused = AtomicBool::new(false);
        let index = scan(&chunks_dir, exclusive, &punch_refused)?;
        if access == Access::Reader && exclusive && !lock.try_convert(LockMode::Shared)? {
            return Ok(Opened::Busy);
        }
        let shared = Arc::new(Shared {
            chunks_dir,
            max_bytes: opts.max_bytes,
            index: Mutex::new(index),
            meters: Meters::default(),
            unclean: AtomicBool::new(false),
            punch_refused,
            shared_dir: access == Access::Reader,
            written: Mutex::default(),
            lock: Mutex::new(Some(lock)),
        });
        let (tx, rx) = tokio::sync::mpsc::channel(QUEUE_CHUNKS);
        let worker = shared.clone();
        let writer = std::thread::Builder::new()
            .name("blobdrive-diskcache".into())
            .spawn(move || writer_loop(&worker, rx))?;
        let cache = DiskCache {
            shared,
            dir,
            identity: identity.to_string(),
            access,
            tx: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(writer)),
        };
        let over = cache.shared.index().shrink_to(cache.shared.budget());
        let mut slabs = Slabs::new(&cache.shared.chunks_dir, &cache.shared.punch_refused);
        erase_slots(&cache.shared, &mut slabs, &over);
        cache.shared.note_written(&mut slabs);
        // Read before logging: two index guards in one macro call deadlock.
        let (chunks, bytes) = {
            let index = cache.shared.index();
            (index.entries.len(), index.bytes)
        };
        tracing::info!(dir = %cache.dir.display(), trusted, chunks, bytes, "disk cache open");
        Ok(Opened::Ready(cache))
    }

    /// The directory of this drive's cache.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Is a slot holding chunk `idx` known (it may still turn out bad)?
    pub fn contains(&self, idx: u64) -> bool {
        self.shared.index().entries.contains_key(&idx)
    }

    /// May chunk `idx` be on disk? A reader's directory is shared, so other
    /// processes may have filled slots this index has not seen.
    pub fn may_hold(&self, idx: u64) -> bool {
        self.access == Access::Reader || self.contains(idx)
    }

    /// Read and verify chunk `idx`; `None` when absent or bad. Blocks.
    pub fn lookup(&self, idx: u64) -> Option<CachedChunk> {
        let known = {
            let mut index = self.shared.index();
            index.clock += 1;
            let now = index.clock;
            match index.entries.get_mut(&idx) {
                Some(e) => {
                    e.last_use = now;
                    true
                }
                None if self.access == Access::Reader => false,
                None => return None,
            }
        };
        let raw = match slab::read_slot(&self.shared.chunks_dir, idx) {
            Ok(Some(raw)) => raw,
            Ok(None) => {
                self.shared.index().remove(idx);
                return None;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Another process holds the slot: a miss, the slot stays.
                tracing::debug!(chunk = idx, "disk cache slot busy");
                return None;
            }
            Err(e) => {
                tracing::warn!(chunk = idx, error = %e, "disk cache read failed");
                self.shared.index().remove(idx);
                return None;
            }
        };
        let raw_len = raw.len();
        match format::decode(idx, raw) {
            Ok(chunk) => {
                if !known {
                    // Written by another reader of this directory: count it.
                    let mut index = self.shared.index();
                    if !index.entries.contains_key(&idx) {
                        let bytes = round_up(raw_len as u64);
                        let last_use = index.clock;
                        index.entries.insert(idx, Entry { bytes, last_use });
                        index.bytes += bytes;
                    }
                }
                Some(chunk)
            }
            Err(bad) => {
                self.shared
                    .meters
                    .bad_chunks
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(chunk = idx, ?bad, dir = %self.dir.display(), "bad disk cache chunk dropped");
                let mut index = self.shared.index();
                index.remove(idx);
                index.stale.insert(idx);
                None
            }
        }
    }

    /// The current ticket: take it while the chunk's content cannot change
    /// (under the chunk's lock) and hand it to [`DiskCache::store`].
    pub fn ticket(&self) -> u64 {
        self.shared.index().seq
    }

    /// Chunk `idx` changed (written or discarded): forget its slot now (the
    /// writer empties it), and refuse every copy of it taken before this call.
    pub fn invalidate(&self, idx: u64) {
        let mut index = self.shared.index();
        index.seq += 1;
        let seq = index.seq;
        index.note_invalidated(idx, seq);
        if index.entries.contains_key(&idx) {
            index.remove(idx);
            index.stale.insert(idx);
        }
    }

    /// [`DiskCache::invalidate`] every chunk of `range`: the invalidation is
    /// recorded for each chunk whether or not it has a slot yet (a copy of
    /// it may be on its way to the writer), and the slots there are emptied. A range
    /// too long to list raises the floor instead: every copy in flight loses.
    pub fn invalidate_range(&self, range: std::ops::Range<u64>) {
        let mut index = self.shared.index();
        index.seq += 1;
        let seq = index.seq;
        let chunks = range.end.saturating_sub(range.start);
        if chunks > (MAX_INVALIDATED / 2) as u64 {
            index.invalidated.clear();
            index.floor = seq;
        } else {
            for idx in range.clone() {
                index.note_invalidated(idx, seq);
            }
        }
        let hit: Vec<u64> = if chunks as usize <= index.entries.len() {
            range.filter(|i| index.entries.contains_key(i)).collect()
        } else {
            index
                .entries
                .keys()
                .copied()
                .filter(|i| range.contains(i))
                .collect()
        };
        for idx in hit {
            index.remove(idx);
            index.stale.insert(idx);
        }
    }

    /// Keep `chunk` in the slot of chunk `idx`, unless the chunk was
    /// invalidated after `ticket` was taken. Never waits: when the writer is
    /// behind, the copy is counted as dropped and given back, for the caller
    /// to keep or let go.
    pub fn store(&self, idx: u64, ticket: u64, chunk: CachedChunk) -> Result<(), Box<CachedChunk>> {
        let Some(tx) = self.sender() else {
            return Ok(());
        };
        let job = Job::Store {
            idx,
            ticket,
            chunk: Box::new(chunk),
        };
        match tx.try_send(job) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.shared.meters.dropped.fetch_add(1, Ordering::Relaxed);
                match e.into_inner() {
                    Job::Store { chunk, .. } => Err(chunk),
                    Job::Sync(_) => unreachable!("a store job was sent"),
                }
            }
        }
    }

    /// [`DiskCache::store`], waiting for room in the writer's queue.
    pub async fn store_wait(&self, idx: u64, ticket: u64, chunk: CachedChunk) {
        let Some(tx) = self.sender() else { return };
        if tx
            .send(Job::Store {
                idx,
                ticket,
                chunk: Box::new(chunk),
            })
            .await
            .is_err()
        {
            self.shared.meters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn sender(&self) -> Option<Sender<Job>> {
        self.tx
            .lock()
            .expect("disk cache queue mutex poisoned")
            .clone()
    }

    /// Wait until every copy handed to `store` so far is on disk (or
    /// refused) and stale slots are emptied. Blocks.
    pub fn sync(&self) {
        let (done_tx, done_rx) = mpsc::channel();
        if let Some(tx) = self.sender() {
            if tx.blocking_send(Job::Sync(done_tx)).is_ok() {
                let _ = done_rx.recv();
            }
        }
    }

    /// End of a mount: write what is queued, stop the writer, for a writer
    /// record the blob's ETag after its last flush (`Some`: the contents are
    /// trusted at the next open, once every slab is durable; `None`: they
    /// stay untrusted), and release the directory's lock. Blocks.
    pub fn finish(&self, final_etag: Option<&str>) -> io::Result<()> {
        self.sync();
        drop(
            self.tx
                .lock()
                .expect("disk cache queue mutex poisoned")
                .take(),
        );
        if let Some(h) = self.writer.lock().expect("writer mutex poisoned").take() {
            if h.join().is_err() {
                self.shared.unclean.store(true, Ordering::Relaxed);
            }
        }
        if !self.shared.index().stale.is_empty() {
            self.shared.unclean.store(true, Ordering::Relaxed);
        }
        let unclean = self.shared.unclean.load(Ordering::Relaxed);
        if unclean && self.access == Access::Writer && final_etag.is_some() {
            // The record stays `in-use`: the next open empties the directory.
            tracing::warn!(dir = %self.dir.display(),
                "disk cache: a slot could not be emptied; the tier is dropped at the next mount");
        }
        if self.access == Access::Writer && !unclean {
            if let Some(etag) = final_etag {
                // Slots are written and punched in place: what the record
                // vouches for must be on disk before it does.
                let written = self.shared.written.lock().expect("written mutex poisoned");
                slab::sync_all(&self.shared.chunks_dir, written.iter())?;
                record::write(
                    &self.dir,
                    &Record {
                        identity: self.identity.clone(),
                        state: record::CLEAN.to_string(),
                        etag: Some(etag.to_string()),
                    },
                )?;
            }
        }
        // The mount is over: others may use the directory now.
        drop(self.shared.lock.lock().expect("lock mutex poisoned").take());
        Ok(())
    }

    /// Disk space held by chunks (4 KiB blocks).
    pub fn bytes_held(&self) -> u64 {
        self.shared.index().bytes
    }

    /// Chunks found torn or corrupted since open.
    pub fn bad_chunks(&self) -> u64 {
        self.shared.meters.bad_chunks.load(Ordering::Relaxed)
    }

    /// Copies dropped because the writer was behind, or their slot was
    /// held by another process.
    pub fn dropped_copies(&self) -> u64 {
        self.shared.meters.dropped.load(Ordering::Relaxed)
    }
}

impl Drop for DiskCache {
    /// Without `finish`: stop the writer without waiting for it (it may be
    /// dropped on an async thread); the lock goes when the writer ends.
    fn drop(&mut self) {
        if let Ok(mut tx) = self.tx.lock() {
            drop(tx.take());
        }
    }
}

/// Empty the slots of `chunks`. A slot that cannot be emptied may still
/// hold a whole chunk the index no longer vouches for: the tier is marked
/// unclean, so `finish` does not record it `clean`.
fn erase_slots(shared: &Shared, slabs: &mut Slabs, chunks: &[u64]) {
    for &idx in chunks {
        if let Err(e) = slabs.erase(idx) {
            shared.unclean.store(true, Ordering::Relaxed);
            tracing::warn!(chunk = idx, error = %e, dir = %shared.chunks_dir.display(),
                "disk cache: could not empty a slot");
        }
    }
}

/// Empty the slots of invalidated chunks (only this thread writes slots,
/// so none of them can be filled again meanwhile).
fn erase_stale(shared: &Shared, slabs: &mut Slabs) {
    let stale: Vec<u64> = shared.index().stale.drain().collect();
    erase_slots(shared, slabs, &stale);
}

fn write_chunk(shared: &Shared, slabs: &mut Slabs, idx: u64, ticket: u64, chunk: &CachedChunk) {
    if slabs.punch_refused() {
        // Eviction frees nothing here: the tier keeps what it has.
        return;
    }
    let bytes = round_up(chunk.encoded_len() as u64);
    let before = {
        let index = shared.index();
        if !index.fresh(idx, ticket) {
            return;
        }
        index.entries.get(&idx).map(|e| e.bytes)
    };
    // A slot not known to hold a chunk no longer than this one may hold
    // anything (a bad slot being dropped); in a shared directory, another
    // reader may have rewritten any slot with a longer copy since.
    let clear_tail = shared.shared_dir || before.is_none_or(|b| b > bytes);
    let header = format::header(idx, chunk);
    if let Err(e) = slabs.write(idx, &header, &chunk.data, clear_tail) {
        if e.kind() == io::ErrorKind::WouldBlock {
            // Another process holds the slot: nothing was written.
            shared.meters.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        tracing::warn!(chunk = idx, error = %e, "disk cache write failed");
        shared.index().remove(idx);
        erase_slots(shared, slabs, &[idx]);
        return;
    }
    let evicted = {
        let mut index = shared.index();
        if !index.fresh(idx, ticket) {
            // Invalidated while it was written: the copy must not stay.
            index.remove(idx);
            drop(index);
            erase_slots(shared, slabs, &[idx]);
            return;
        }
        index.remove(idx);
        index.stale.remove(&idx);
        index.clock += 1;
        let last_use = index.clock;
        index.entries.insert(idx, Entry { bytes, last_use });
        index.bytes += bytes;
        let budget = shared.budget();
        if index.bytes > budget {
            // Evict to 90% so eviction runs once per many writes.
            index.shrink_to(budget / 10 * 9)
        } else {
            Vec::new()
        }
    };
    erase_slots(shared, slabs, &evicted);
}

fn writer_loop(shared: &Shared, mut rx: Receiver<Job>) {
    let mut slabs = Slabs::new(&shared.chunks_dir, &shared.punch_refused);
    while let Some(job) = rx.blocking_recv() {
        erase_stale(shared, &mut slabs);
        match job {
            Job::Store { idx, ticket, chunk } => {
                write_chunk(shared, &mut slabs, idx, ticket, &chunk);
            }
            Job::Sync(done) => {
                let _ = done.send(());
            }
        }
    }
    erase_stale(shared, &mut slabs);
    shared.note_written(&mut slabs);
}

/// What `clear` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cleared {
    /// Drive caches removed.
    pub removed: usize,
    /// Drive caches left because a mount is using them.
    pub in_use: usize,
    /// Entries left because they are not a drive's cache (or a layout
    /// directory that is a symbolic link, or not this user's alone).
    pub left: Vec<PathBuf>,
}

/// Empty the cache dir: remove every drive's cache not in use by a mount,
/// in this layout and in those of older versions (whose layout directory
/// goes too once empty). A missing directory is already empty. Blocks.
pub fn clear(cache_dir: &Path) -> io::Result<Cleared> {
    let mut out = clear_layout(&cache_dir.join(LAYOUT))?;
    for old in OLD_LAYOUTS {
        let root = cache_dir.join(old);
        let done = clear_layout(&root)?;
        if done.in_use == 0 && done.left.is_empty() {
            match std::fs::remove_dir(&root) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        out.removed += done.removed;
        out.in_use += done.in_use;
        out.left.extend(done.left);
    }
    Ok(out)
}

/// Remove every drive's directory under the layout directory `root` not in
/// use by a mount. A root that is a symbolic link, or not this user's
/// alone, is not read; entries that are not a drive's directory
/// ([`is_drive_dir`]) are left.
fn clear_layout(root: &Path) -> io::Result<Cleared> {
    let mut out = Cleared::default();
    match std::fs::symlink_metadata(root) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
        Ok(_) if !private_dir::is_ours_alone(root) => {
            out.left.push(root.to_path_buf());
            return Ok(out);
        }
        Ok(_) => {}
    }
    for entry in std::fs::read_dir(root)? {
        let path = entry?.path();
        if !is_drive_dir(&path) {
            out.left.push(path);
            continue;
        }
        match DirLock::try_take(&path, LockMode::Exclusive)? {
            Some(_lock) => {
                std::fs::remove_dir_all(&path)?;
                out.removed += 1;
            }
            None => out.in_use += 1,
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
