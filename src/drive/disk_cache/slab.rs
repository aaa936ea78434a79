//! Where a chunk lives on disk: slab files of fixed slots, so a tier that
//! fills and evicts all the time creates and deletes no file per chunk.
//!
//! Chunk `idx` lives in the slab file named `{idx / SLAB_CHUNKS:016x}`, in
//! slot `idx % SLAB_CHUNKS`, at offset `slot * SLOT_BYTES`: its encoded form
//! (`format.rs`: header, then the held non-zero pages) from the slot's
//! start, the rest of the slot a hole. The place of a chunk follows from its
//! index alone, so there is no slot map to keep, rebuild or tear: the index
//! in memory is rebuilt at open by reading the header of every slot that
//! holds data ([`scan`]), and processes sharing a snapshot's directory find
//! each other's chunks where they expect them. An evicted or invalidated
//! chunk's slot is punched out (`fallocate(PUNCH_HOLE)`): its blocks go back
//! to the filesystem, so the tier's bound holds in bytes on disk, and a slot
//! left so reads as empty. Where a punch fails (no hole support, or a full
//! filesystem that needs a block to split an extent) the slot's header is
//! zeroed instead, so it still reads as empty. A slab file is made once, the first time one of
//! its chunks is kept, and stays until the drive's directory is emptied or
//! a writer's open finds it holding no chunk: at most one file per 64 MiB
//! of the drive ever read.
//!
//! Invariants:
//! - A slot is written, read and punched only under an open-file-description
//!   lock on its byte range (`F_OFD_SETLK`; write for the writer, read for a
//!   lookup), so a lookup in this process or another never reads a slot half
//!   written by a live writer. The lock is tried for 100 ms at most: a slot
//!   held longer (by a stopped process) is a miss for a lookup and drops a
//!   copy, never a hang. What a crash tears is caught by the chunk's
//!   CRC-32C and index (`format::decode`): never served.
//! - Slab files are 0600 from their creation (`private_dir::open_file`).
//! - Only regular files named by 16 hex digits, of slabs whose chunk
//!   indexes fit in a `u64`, are slabs: anything else with such a name (a
//!   FIFO, a directory) is skipped, opened without waiting (`O_NONBLOCK`).
//! - Nothing here is durable until [`sync_all`]: the drive's record is set
//!   `clean` only after it (see `DiskCache::finish`).

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::format::{self, HEADER_BYTES};
use super::{round_up, BLOCK_BYTES, PAGES, PAGE_BYTES};
use crate::private_dir;

/// Chunks per slab file: 256 chunks of 256 KiB, 64 MiB of the drive.
pub const SLAB_CHUNKS: u64 = 256;
/// Bytes per slot: the largest encoded chunk, in whole 4 KiB blocks (so a
/// punched slot frees whole blocks and a full chunk needs no punch after it).
pub const SLOT_BYTES: u64 = round_up((HEADER_BYTES + PAGES * PAGE_BYTES) as u64);
/// Largest data length a header may claim.
const MAX_DATA_BYTES: usize = PAGES * PAGE_BYTES;

const _: () = assert!(SLOT_BYTES % BLOCK_BYTES == 0);

/// The slab file holding chunk `idx` and the offset of its slot there.
pub fn place(chunks_dir: &Path, idx: u64) -> (PathBuf, u64) {
    let slab = idx / SLAB_CHUNKS;
    (
        chunks_dir.join(format!("{slab:016x}")),
        (idx % SLAB_CHUNKS) * SLOT_BYTES,
    )
}

/// How long a slot lock is tried for before the slot counts as busy.
const LOCK_PATIENCE: Duration = Duration::from_millis(100);

/// An `F_OFD_SETLK` lock on one slot, released when dropped.
struct SlotLock<'a> {
    file: &'a File,
    offset: u64,
}

/// Set (or with `F_UNLCK` release) the lock of the slot at `offset`,
/// without waiting: `false` when another open file description holds a
/// conflicting one.
fn ofd_lock(file: &File, kind: libc::c_int, offset: u64) -> io::Result<bool> {
    // SAFETY: an all-zero `flock` is a valid value of this plain C struct.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = offset as libc::off_t;
    fl.l_len = SLOT_BYTES as libc::off_t;
    loop {
        // SAFETY: fcntl on a descriptor we own with a pointer to a live flock.
        let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
        if rc == 0 {
            return Ok(true);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => {}
            Some(libc::EAGAIN) | Some(libc::EACCES) => return Ok(false),
            _ => return Err(err),
        }
    }
}

impl<'a> SlotLock<'a> {
    /// Lock the slot at `offset`, trying for [`LOCK_PATIENCE`]: a slot is
    /// held for one slot's I/O, so a holder that keeps it longer is stopped
    /// (a frozen or stopped process sharing the directory), and waiting for
    /// it would hang this drive's reads. An error of kind `WouldBlock` then:
    /// a lookup is a miss, a copy is dropped.
    fn take(file: &'a File, offset: u64, write: bool) -> io::Result<Self> {
        let kind = if write { libc::F_WRLCK } else { libc::F_RDLCK };
        let started = Instant::now();
        let mut pause = Duration::from_micros(200);
        while !ofd_lock(file, kind, offset)? {
            if started.elapsed() >= LOCK_PATIENCE {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "slot locked by another process for too long",
                ));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(10));
        }
        Ok(SlotLock { file, offset })
    }
}

impl Drop for SlotLock<'_> {
    fn drop(&mut self) {
        // Closing the file would release it too; unlocking now lets a
        // waiting reader in before the next slot is written.
        let _ = ofd_lock(self.file, libc::F_UNLCK, self.offset);
    }
}

/// Free `[offset, offset + len)` of `file` (the file keeps its size).
fn punch(file: &File, offset: u64, len: u64) -> io::Result<()> {
    #[cfg(test)]
    if let Some(errno) = hooks::punch_fails(file) {
        return Err(io::Error::from_raw_os_error(errno));
    }
    // SAFETY: fallocate on a descriptor we own; no memory is passed.
    let rc = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Open the slab at `path`; `None` when it does not exist or is not a
/// regular file (a FIFO, a device or a directory with a slab's name is
/// skipped: never waited on, never an error that turns the tier off).
fn open_existing(path: &Path, write: bool) -> io::Result<Option<File>> {
    let file = match OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EISDIR | libc::ENXIO)) => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(file.metadata()?.is_file().then_some(file))
}

/// Open (or create, 0600) the slab at `path` for writing; an error when
/// something other than a regular file has its name.
fn open_or_create(path: &Path) -> io::Result<File> {
    let file = private_dir::open_file(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::other(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    Ok(file)
}

/// Read up to `buf.len()` bytes at `offset`; fewer only at the end of the file.
fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// The encoded bytes in chunk `idx`'s slot, for `format::decode` to check:
/// `None` when the slot (or its slab) is empty. A slot that is not empty
/// but not a whole chunk either comes back as what was there, and is
/// refused by `decode`. Blocks.
pub fn read_slot(chunks_dir: &Path, idx: u64) -> io::Result<Option<Bytes>> {
    let (path, offset) = place(chunks_dir, idx);
    let Some(file) = open_existing(&path, false)? else {
        return Ok(None);
    };
    let _lock = SlotLock::take(&file, offset, false)?;
    let mut header = [0u8; HEADER_BYTES];
    let n = read_full_at(&file, &mut header, offset)?;
    if header[..n].iter().all(|&b| b == 0) {
        return Ok(None);
    }
    let data_len = match format::peek(&header[..n]) {
        Some((_, len)) if len <= MAX_DATA_BYTES => len,
        _ => return Ok(Some(Bytes::copy_from_slice(&header[..n]))),
    };
    let mut raw = vec![0u8; HEADER_BYTES + data_len];
    raw[..HEADER_BYTES].copy_from_slice(&header);
    let got = read_full_at(
        &file,
        &mut raw[HEADER_BYTES..],
        offset + HEADER_BYTES as u64,
    )?;
    raw.truncate(HEADER_BYTES + got);
    Ok(Some(raw.into()))
}

/// The writer thread's handle on the slab files: the last one used stays
/// open (a sequential fill writes 256 chunks into one), and the slabs
/// written or punched are remembered for [`sync_all`].
pub struct Slabs<'a> {
    chunks_dir: PathBuf,
    open: Option<(PathBuf, File)>,
    written: HashSet<PathBuf>,
    punch_refused: &'a AtomicBool,
}

impl<'a> Slabs<'a> {
    /// The slabs of `chunks_dir`; `punch_refused` is set (and a warning
    /// logged, once) when the filesystem refuses to punch a hole.
    pub fn new(chunks_dir: &Path, punch_refused: &'a AtomicBool) -> Self {
        Slabs {
            chunks_dir: chunks_dir.to_path_buf(),
            open: None,
            written: HashSet::new(),
            punch_refused,
        }
    }

    /// The slabs written or punched since the last call.
    pub fn take_written(&mut self) -> HashSet<PathBuf> {
        std::mem::take(&mut self.written)
    }

    /// Has the filesystem refused to punch a hole?
    pub fn punch_refused(&self) -> bool {
        self.punch_refused.load(Ordering::Relaxed)
    }

    /// The slab at `path`, open for writing; `None` when it does not exist
    /// and `create` is false.
    fn file(&mut self, path: PathBuf, create: bool) -> io::Result<Option<&File>> {
        if self.open.as_ref().is_none_or(|(p, _)| *p != path) {
            let file = if create {
                open_or_create(&path)?
            } else {
                match open_existing(&path, true)? {
                    Some(f) => f,
                    None => return Ok(None),
                }
            };
            self.written.insert(path.clone());
            self.open = Some((path, file));
        }
        Ok(self.open.as_ref().map(|(_, f)| f))
    }

    /// Put chunk `idx`'s encoded form (`header` then `data`) in its slot.
    /// `clear_tail`: the slot may hold a longer chunk, whose blocks past
    /// this one's end must go. Blocks.
    pub fn write(
        &mut self,
        idx: u64,
        header: &[u8],
        data: &[u8],
        clear_tail: bool,
    ) -> io::Result<()> {
        let (path, offset) = place(&self.chunks_dir, idx);
        let mut refused = false;
        let file = self.file(path, true)?.expect("created when missing");
        {
            let _lock = SlotLock::take(file, offset, true)?;
            file.write_all_at(header, offset)?;
            file.write_all_at(data, offset + header.len() as u64)?;
            let end = round_up((header.len() + data.len()) as u64);
            if clear_tail && end < SLOT_BYTES {
                refused = punch_or_refuse(file, offset + end, SLOT_BYTES - end)?;
            }
        }
        #[cfg(test)]
        hooks::written(&self.chunks_dir);
        self.note_refused(refused);
        Ok(())
    }

    /// Empty chunk `idx`'s slot and give its blocks back. Blocks.
    pub fn erase(&mut self, idx: u64) -> io::Result<()> {
        let (path, offset) = place(&self.chunks_dir, idx);
        let Some(file) = self.file(path, false)? else {
            return Ok(());
        };
        let refused = {
            let _lock = SlotLock::take(file, offset, true)?;
            empty_slot(file, offset)?
        };
        self.note_refused(refused);
        Ok(())
    }

    fn note_refused(&mut self, refused: bool) {
        note_refused(self.punch_refused, &self.chunks_dir, refused);
    }
}

fn note_refused(flag: &AtomicBool, chunks_dir: &Path, refused: bool) {
    if refused && !flag.swap(true, Ordering::Relaxed) {
        tracing::warn!(dir = %chunks_dir.display(),
            "disk cache: this filesystem cannot punch holes, so evicted chunks keep their disk space; no more chunks are kept on disk until the next mount");
    }
}

/// Punch, or `true` when the filesystem cannot.
fn punch_or_refuse(file: &File, offset: u64, len: u64) -> io::Result<bool> {
    match punch(file, offset, len) {
        Ok(()) => Ok(false),
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(true),
        Err(e) => Err(e),
    }
}

/// Punch out the slot at `offset`, or where that fails (a filesystem that
/// cannot punch, or one that is full: a punch may need a block to split an
/// extent), zero its header so it still reads as empty; `true` when the
/// filesystem cannot punch holes. An error only when the header could not
/// be zeroed either: the slot may then still hold a whole chunk.
fn empty_slot(file: &File, offset: u64) -> io::Result<bool> {
    let refused = match punch_or_refuse(file, offset, SLOT_BYTES) {
        Ok(false) => return Ok(false),
        Ok(true) => true,
        Err(e) => {
            tracing::warn!(error = %e, "disk cache: cannot punch a slot out; zeroing its header");
            false
        }
    };
    zero_header(file, offset)?;
    Ok(refused)
}

fn zero_header(file: &File, offset: u64) -> io::Result<()> {
    #[cfg(test)]
    if let Some(errno) = hooks::zero_fails(file) {
        return Err(io::Error::from_raw_os_error(errno));
    }
    file.write_all_at(&[0u8; HEADER_BYTES], offset)
}

/// Make the slabs `written` (see [`Slabs::take_written`]) and the
/// directory `chunks_dir` durable. Blocks.
pub fn sync_all<'a>(
    chunks_dir: &Path,
    written: impl IntoIterator<Item = &'a PathBuf>,
) -> io::Result<()> {
    for path in written {
        if let Some(f) = open_existing(path, false)? {
            f.sync_all()?;
        }
    }
    File::open(chunks_dir)?.sync_all()
}

/// The slab a file's name says it is; `None` for another name, or for a
/// slab whose chunks' indexes would not fit in a `u64` (no drive has one).
fn slab_number(name: &std::ffi::OsStr) -> Option<u64> {
    let name = name.to_str()?;
    if name.len() != 16 {
        return None;
    }
    let slab = u64::from_str_radix(name, 16).ok()?;
    slab.checked_mul(SLAB_CHUNKS)?
        .checked_add(SLAB_CHUNKS - 1)?;
    Some(slab)
}

/// One chunk found in a slab by [`scan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The chunk's index.
    pub index: u64,
    /// The slab file holding it.
    pub file: PathBuf,
    /// Where its slot starts in that file.
    pub offset: u64,
    /// Disk space it takes (whole 4 KiB blocks).
    pub bytes: u64,
}

/// Next offset at or after `from` holding data, `None` past the last.
fn next_data(file: &File, from: u64) -> io::Result<Option<u64>> {
    // SAFETY: lseek on a descriptor we own.
    let at = unsafe { libc::lseek(file.as_raw_fd(), from as libc::off_t, libc::SEEK_DATA) };
    if at >= 0 {
        return Ok(Some(at as u64));
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ENXIO) {
        Ok(None)
    } else {
        Err(err)
    }
}

/// The chunks whose slots hold a header naming them and the length it
/// claims, slab by slab, slot by slot (holes skipped with `SEEK_DATA`).
/// Checksums are not read here: a lookup checks them. `repair` (the
/// directory is held alone): a slot that holds data but no such header,
/// left by a crash, is punched out, so the space counted is the space used
/// (`punch_refused` is set where the filesystem cannot), and a slab left
/// with no chunk is removed. Other files are left alone. Blocks.
pub fn scan(chunks_dir: &Path, repair: bool, punch_refused: &AtomicBool) -> io::Result<Vec<Found>> {
    let mut found = Vec::new();
    let mut names: Vec<(u64, PathBuf)> = std::fs::read_dir(chunks_dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| Some((slab_number(&e.file_name())?, e.path())))
        .collect();
    names.sort_unstable();
    for (slab, path) in names {
        let Some(file) = open_existing(&path, repair)? else {
            continue;
        };
        let file_len = file.metadata()?.len();
        let kept = found.len();
        let mut from = 0;
        while let Some(at) = next_data(&file, from)? {
            let slot = at / SLOT_BYTES;
            let offset = slot * SLOT_BYTES;
            if slot >= SLAB_CHUNKS {
                if repair {
                    file.set_len(SLAB_CHUNKS * SLOT_BYTES)?;
                }
                break;
            }
            let index = slab * SLAB_CHUNKS + slot;
            let mut header = [0u8; HEADER_BYTES];
            let n = read_full_at(&file, &mut header, offset)?;
            match format::peek(&header[..n]) {
                Some((i, len))
                    if i == index
                        && len <= MAX_DATA_BYTES
                        && offset + (HEADER_BYTES + len) as u64 <= file_len =>
                {
                    found.push(Found {
                        index,
                        file: path.clone(),
                        offset,
                        bytes: round_up((HEADER_BYTES + len) as u64),
                    })
                }
                _ if repair => {
                    let refused = empty_slot(&file, offset)?;
                    note_refused(punch_refused, chunks_dir, refused);
                }
                _ => {}
            }
            from = offset + SLOT_BYTES;
        }
        if repair && found.len() == kept {
            // No chunk left in it (a tier that evicted a whole slab, or a
            // crash's remains): its inode goes. Nothing it held was
            // servable, so the removal needs no sync.
            std::fs::remove_file(&path)?;
        }
    }
    Ok(found)
}

/// Failures injected by tests, per chunk directory (tests run in parallel,
/// each in its own temporary directory).
#[cfg(test)]
pub mod hooks {
    use std::fs::File;
    use std::os::fd::AsRawFd;
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    static PUNCH: Mutex<Vec<(PathBuf, i32)>> = Mutex::new(Vec::new());
    static ZERO: Mutex<Vec<(PathBuf, i32)>> = Mutex::new(Vec::new());
    type Hook = Box<dyn FnOnce() + Send>;
    static AFTER_WRITE: Mutex<Vec<(PathBuf, Hook)>> = Mutex::new(Vec::new());

    /// Run `hook` once, on the writer thread, right after the next slot
    /// written under `dir` (before the writer looks at its index again).
    pub fn after_write(dir: &Path, hook: impl FnOnce() + Send + 'static) {
        AFTER_WRITE
            .lock()
            .unwrap()
            .push((dir.to_path_buf(), Box::new(hook)));
    }

    pub(super) fn written(dir: &Path) {
        let hook = {
            let mut list = AFTER_WRITE.lock().unwrap();
            let at = list.iter().position(|(d, _)| d == dir);
            at.map(|i| list.swap_remove(i).1)
        };
        if let Some(hook) = hook {
            hook();
        }
    }

    /// Make every punch in a slab under `dir` fail with `errno`.
    pub fn fail_punch(dir: &Path, errno: i32) {
        PUNCH.lock().unwrap().push((dir.to_path_buf(), errno));
    }

    /// Make every header zeroing in a slab under `dir` fail with `errno`.
    pub fn fail_zero(dir: &Path, errno: i32) {
        ZERO.lock().unwrap().push((dir.to_path_buf(), errno));
    }

    fn lookup(list: &Mutex<Vec<(PathBuf, i32)>>, file: &File) -> Option<i32> {
        let path = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()?;
        let list = list.lock().unwrap();
        list.iter()
            .find(|(dir, _)| path.starts_with(dir))
            .map(|&(_, e)| e)
    }

    pub(super) fn punch_fails(file: &File) -> Option<i32> {
        lookup(&PUNCH, file)
    }

    pub(super) fn zero_fails(file: &File) -> Option<i32> {
        lookup(&ZERO, file)
    }
}
