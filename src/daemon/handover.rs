//! What a serving process leaves for the next one of the same attach, in a
//! small memory file the holder keeps open (`holder.rs`): what INIT
//! settled on the FUSE connection, the file handles the kernel holds, the
//! liveness beat the holder's watchdog reads, and the counters `stats`
//! shows (takeovers, start times).
//!
//! Every field is an atomic at a fixed offset (little-endian); the layout
//! carries a format version, and a process refuses a state of another
//! version with one line (the running process keeps serving).

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use crate::fs::session::InitResult;
use crate::fs::wire::InitOut;
use crate::shared_memory::SharedMemory;

const MAGIC: u64 = u64::from_le_bytes(*b"BDSTATE1");
const BYTES: usize = 4096;

const F_MAGIC: usize = 0;
const F_VERSION: usize = 8;
/// Bit 0: a process of this attach became ready once (a death after it is
/// a crash to recover, not a failed start). Bit 1: INIT is known.
const F_FLAGS: usize = 16;
const F_TAKEOVERS: usize = 24;
const F_HEARTBEAT: usize = 32;
const F_HOLDER_PID: usize = 40;
const F_SERVER_PID: usize = 48;
const F_HOLDER_STARTED: usize = 56;
const F_SERVER_STARTED: usize = 64;
/// When the current serving process began serving (Unix milliseconds).
const F_SERVING_SINCE: usize = 72;
// INIT: kernel minor, kernel flags, then the reply's fields.
const F_INIT: usize = 128;
const INIT_FIELDS: usize = 11;
// File handles: (fh, ino, writable + 1; 0 = free) per slot.
const F_HANDLES: usize = 512;
const HANDLE_SLOTS: usize = 64;
// The binary an upgrade asked for: its length, then its path.
const F_UPGRADE_LEN: usize = 2048;
const F_UPGRADE_PATH: usize = 2056;
const UPGRADE_PATH_MAX: usize = 1024;
// The lease id every serving process of the attach proposes.
const F_LEASE_ID: usize = 3584;
const LEASE_ID_BYTES: usize = 36;
// The mark of the attach's writer lineage (`blob/lineage.rs`): a
// generation (odd while being written, 0 before the first), the epoch plus
// one (0: none), the ETag's length and its bytes. These bytes were unused
// in the layout's first release, so a state made by it reads as "no mark
// recorded" and the format stays 1: either binary can take over from the
// other (an upgrade and its rollback).
const F_MARK_GEN: usize = 80;
const F_MARK_EPOCH: usize = 88;
const F_MARK_ETAG_LEN: usize = 96;
const F_MARK_ETAG: usize = 3200;
const MARK_ETAG_MAX: usize = 256;
// The size of the drive's data area as the serving process last opened it
// (0: not known), for a salvage that cannot ask storage.
const F_DRIVE_BYTES: usize = 104;

const READY: u64 = 1;
const INIT_KNOWN: u64 = 2;

/// Milliseconds since the Unix epoch (the state's clock).
pub fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A file handle the kernel holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeptHandle {
    /// The number the kernel uses.
    pub fh: u64,
    /// Node id of the file.
    pub ino: u64,
    /// Opened for writing.
    pub writable: bool,
}

/// The state of one attach, shared by its holder and its serving process.
pub struct Handover {
    mem: SharedMemory,
    /// Serialises handle slot updates within one process.
    slots: Mutex<()>,
}

impl Handover {
    /// A new state, in a new memory file.
    pub fn create() -> io::Result<Self> {
        let mem = SharedMemory::create("blobdrive-state", BYTES)?;
        // The service gives a lease again to the id that holds it, and to no
        // other: one id for the attach's life, whichever process serves.
        let lease_id = uuid::Uuid::new_v4().to_string();
        // SAFETY: the range lies inside the new mapping; no one else has it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                lease_id.as_ptr(),
                mem.as_ptr().add(F_LEASE_ID),
                LEASE_ID_BYTES,
            )
        };
        mem.u64_at(F_VERSION)
            .store(crate::version::state_format(), Ordering::Relaxed);
        mem.u64_at(F_MAGIC).store(MAGIC, Ordering::Release);
        Ok(Handover {
            mem,
            slots: Mutex::new(()),
        })
    }

    /// The state in memory file `mem`; refused when it is not one, or of
    /// another format version.
    pub fn open(mem: SharedMemory) -> io::Result<Self> {
        if mem.len() < BYTES || mem.u64_at(F_MAGIC).load(Ordering::Acquire) != MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the attach's state is not one blobdrive wrote",
            ));
        }
        let version = mem.u64_at(F_VERSION).load(Ordering::Acquire);
        let ours = crate::version::state_format();
        if version != ours {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the running daemon's state has format version {version}; this blobdrive \
                     reads version {ours}"
                ),
            ));
        }
        Ok(Handover {
            mem,
            slots: Mutex::new(()),
        })
    }

    /// The memory file.
    pub fn memory(&self) -> &SharedMemory {
        &self.mem
    }

    fn field(&self, offset: usize) -> &std::sync::atomic::AtomicU64 {
        self.mem.u64_at(offset)
    }

    /// A serving process became ready (once per attach).
    pub fn set_ready(&self) {
        self.field(F_FLAGS).fetch_or(READY, Ordering::AcqRel);
    }

    /// The current serving process serves from now on.
    pub fn set_serving(&self) {
        self.field(F_SERVING_SINCE)
            .store(unix_now_ms(), Ordering::Release);
        self.set_ready();
    }

    /// When the current (or last) serving process began serving, in Unix
    /// milliseconds; 0 before any did.
    pub fn serving_since_ms(&self) -> u64 {
        self.field(F_SERVING_SINCE).load(Ordering::Acquire)
    }

    /// True once a serving process was ready.
    pub fn was_ready(&self) -> bool {
        self.field(F_FLAGS).load(Ordering::Acquire) & READY != 0
    }

    /// Counts one more takeover; returns the count.
    pub fn count_takeover(&self) -> u64 {
        self.field(F_TAKEOVERS).fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Takeovers since the attach.
    pub fn takeovers(&self) -> u64 {
        self.field(F_TAKEOVERS).load(Ordering::Acquire)
    }

    /// One beat of the serving process's liveness.
    pub fn beat(&self) {
        self.field(F_HEARTBEAT).fetch_add(1, Ordering::AcqRel);
    }

    /// Beats so far.
    pub fn beats(&self) -> u64 {
        self.field(F_HEARTBEAT).load(Ordering::Acquire)
    }

    /// Records the holder (pid, start time in Unix seconds).
    pub fn set_holder(&self, pid: u32, started_unix_secs: u64) {
        self.field(F_HOLDER_PID)
            .store(pid as u64, Ordering::Release);
        self.field(F_HOLDER_STARTED)
            .store(started_unix_secs, Ordering::Release);
    }

    /// Records the serving process (pid, start time in Unix seconds).
    pub fn set_server(&self, pid: u32, started_unix_secs: u64) {
        self.field(F_SERVER_PID)
            .store(pid as u64, Ordering::Release);
        self.field(F_SERVER_STARTED)
            .store(started_unix_secs, Ordering::Release);
    }

    /// The serving process's pid (once it began its start).
    pub fn server_pid(&self) -> u32 {
        self.field(F_SERVER_PID).load(Ordering::Acquire) as u32
    }

    /// The holder's pid.
    pub fn holder_pid(&self) -> u32 {
        self.field(F_HOLDER_PID).load(Ordering::Acquire) as u32
    }

    /// The holder's start time (Unix seconds).
    pub fn holder_started(&self) -> u64 {
        self.field(F_HOLDER_STARTED).load(Ordering::Acquire)
    }

    /// The serving process's start time (Unix seconds).
    pub fn server_started(&self) -> u64 {
        self.field(F_SERVER_STARTED).load(Ordering::Acquire)
    }

    /// The lease id every serving process of this attach proposes.
    pub fn lease_id(&self) -> String {
        // SAFETY: inside the mapping, written once at creation.
        let bytes = unsafe {
            std::slice::from_raw_parts(self.mem.as_ptr().add(F_LEASE_ID), LEASE_ID_BYTES)
        };
        String::from_utf8_lossy(bytes).into_owned()
    }

    /// Records what the attach's writer lineage left its blob as. One
    /// writer at a time (the serving process, under its fence's lock); a
    /// reader after that process died sees the last complete record, or
    /// none if it died mid-write. An ETag too long to keep records none.
    pub fn set_mark(&self, mark: &crate::blob::Mark) {
        let gen = self.field(F_MARK_GEN);
        let g = gen.load(Ordering::Acquire);
        let odd = if g % 2 == 1 { g } else { g + 1 };
        gen.store(odd, Ordering::Relaxed);
        // The odd generation is seen before any byte of the new record.
        std::sync::atomic::fence(Ordering::Release);
        let etag = mark
            .etag
            .as_deref()
            .filter(|e| e.len() <= MARK_ETAG_MAX)
            .unwrap_or("");
        // SAFETY: inside the mapping (the range is below BYTES); only this
        // process writes it, readers check the generation around it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                etag.as_ptr(),
                self.mem.as_ptr().add(F_MARK_ETAG),
                etag.len(),
            )
        };
        self.field(F_MARK_ETAG_LEN)
            .store(etag.len() as u64, Ordering::Release);
        self.field(F_MARK_EPOCH).store(
            mark.epoch.map_or(0, |e| e.saturating_add(1)),
            Ordering::Release,
        );
        gen.store(odd + 1, Ordering::Release);
    }

    /// The mark last recorded with [`Self::set_mark`]; None when none was
    /// (a state of the first release, a lineage that never opened) or the
    /// last record was torn.
    pub fn mark(&self) -> Option<crate::blob::Mark> {
        let gen = self.field(F_MARK_GEN);
        let g = gen.load(Ordering::Acquire);
        if g == 0 || g % 2 == 1 {
            return None;
        }
        let len = (self.field(F_MARK_ETAG_LEN).load(Ordering::Acquire) as usize).min(MARK_ETAG_MAX);
        let epoch = self.field(F_MARK_EPOCH).load(Ordering::Acquire);
        // SAFETY: inside the mapping.
        let bytes =
            unsafe { std::slice::from_raw_parts(self.mem.as_ptr().add(F_MARK_ETAG), len) }.to_vec();
        // The record's bytes are read before the generation is checked again.
        std::sync::atomic::fence(Ordering::Acquire);
        if gen.load(Ordering::Relaxed) != g {
            return None;
        }
        Some(crate::blob::Mark {
            epoch: epoch.checked_sub(1),
            etag: (len > 0).then(|| String::from_utf8_lossy(&bytes).into_owned()),
        })
    }

    /// Records the size of the drive's data area.
    pub fn set_drive_bytes(&self, bytes: u64) {
        self.field(F_DRIVE_BYTES).store(bytes, Ordering::Release);
    }

    /// The size recorded with [`Self::set_drive_bytes`]; None when none was.
    pub fn drive_bytes(&self) -> Option<u64> {
        Some(self.field(F_DRIVE_BYTES).load(Ordering::Acquire)).filter(|b| *b > 0)
    }

    /// Records the binary the next serving process runs (an upgrade).
    pub fn set_upgrade(&self, path: &std::path::Path) -> io::Result<()> {
        use std::os::unix::ffi::OsStrExt;
        let bytes = path.as_os_str().as_bytes();
        if bytes.len() > UPGRADE_PATH_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the path of the new binary is longer than {UPGRADE_PATH_MAX} bytes"),
            ));
        }
        // SAFETY: the range lies inside the mapping (offsets fixed above,
        // well below its 4 KiB); only this process writes it now.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.mem.as_ptr().add(F_UPGRADE_PATH),
                bytes.len(),
            );
        }
        self.field(F_UPGRADE_LEN)
            .store(bytes.len() as u64, Ordering::Release);
        Ok(())
    }

    /// The binary an upgrade asked for, once (cleared as it is read).
    pub fn take_upgrade(&self) -> Option<std::path::PathBuf> {
        use std::os::unix::ffi::OsStrExt;
        let len = self.field(F_UPGRADE_LEN).swap(0, Ordering::AcqRel) as usize;
        if len == 0 || len > UPGRADE_PATH_MAX {
            return None;
        }
        // SAFETY: inside the mapping; the writer stored the bytes before
        // the length (Release), read after it (Acquire).
        let bytes =
            unsafe { std::slice::from_raw_parts(self.mem.as_ptr().add(F_UPGRADE_PATH), len) };
        Some(std::path::PathBuf::from(std::ffi::OsStr::from_bytes(bytes)))
    }

    /// Records what INIT settled.
    pub fn set_init(&self, init: &InitResult) {
        let r = &init.reply;
        let values: [u64; INIT_FIELDS] = [
            init.kernel_minor as u64,
            init.kernel_flags,
            r.major as u64,
            r.minor as u64,
            r.max_readahead as u64,
            r.flags,
            r.max_background as u64,
            r.congestion_threshold as u64,
            r.max_write as u64,
            r.time_gran as u64,
            r.max_pages as u64,
        ];
        for (i, v) in values.iter().enumerate() {
            self.field(F_INIT + 8 * i).store(*v, Ordering::Relaxed);
        }
        self.field(F_FLAGS).fetch_or(INIT_KNOWN, Ordering::AcqRel);
    }

    /// What INIT settled, once it happened.
    pub fn init(&self) -> Option<InitResult> {
        if self.field(F_FLAGS).load(Ordering::Acquire) & INIT_KNOWN == 0 {
            return None;
        }
        let v: Vec<u64> = (0..INIT_FIELDS)
            .map(|i| self.field(F_INIT + 8 * i).load(Ordering::Relaxed))
            .collect();
        Some(InitResult {
            kernel_minor: v[0] as u32,
            kernel_flags: v[1],
            reply: InitOut {
                major: v[2] as u32,
                minor: v[3] as u32,
                max_readahead: v[4] as u32,
                flags: v[5],
                max_background: v[6] as u16,
                congestion_threshold: v[7] as u16,
                max_write: v[8] as u32,
                time_gran: v[9] as u32,
                max_pages: v[10] as u16,
            },
        })
    }

    fn slot(&self, i: usize) -> [&std::sync::atomic::AtomicU64; 3] {
        let base = F_HANDLES + 24 * i;
        [
            self.field(base),
            self.field(base + 8),
            self.field(base + 16),
        ]
    }

    /// Records a handle the kernel now holds (before the open is answered).
    /// False when every slot is taken: a takeover could not serve it.
    pub fn keep_handle(&self, handle: KeptHandle) -> bool {
        let _one = self.slots.lock().expect("handle slots mutex poisoned");
        for i in 0..HANDLE_SLOTS {
            let [fh, ino, used] = self.slot(i);
            if used.load(Ordering::Acquire) == 0 {
                fh.store(handle.fh, Ordering::Relaxed);
                ino.store(handle.ino, Ordering::Relaxed);
                // Written last: a slot is whole once it says it is used.
                used.store(1 + handle.writable as u64, Ordering::Release);
                return true;
            }
        }
        false
    }

    /// Forgets handle `fh` (released).
    pub fn forget_handle(&self, fh: u64) {
        let _one = self.slots.lock().expect("handle slots mutex poisoned");
        for i in 0..HANDLE_SLOTS {
            let [slot_fh, _, used] = self.slot(i);
            if used.load(Ordering::Acquire) != 0 && slot_fh.load(Ordering::Relaxed) == fh {
                used.store(0, Ordering::Release);
            }
        }
    }

    /// The handles the kernel holds.
    pub fn handles(&self) -> Vec<KeptHandle> {
        (0..HANDLE_SLOTS)
            .filter_map(|i| {
                let [fh, ino, used] = self.slot(i);
                match used.load(Ordering::Acquire) {
                    0 => None,
                    u => Some(KeptHandle {
                        fh: fh.load(Ordering::Relaxed),
                        ino: ino.load(Ordering::Relaxed),
                        writable: u == 2,
                    }),
                }
            })
            .collect()
    }
}

impl crate::fs::session::ConnectionRecord for Handover {
    fn initialised(&self, init: &InitResult) {
        self.set_init(init);
    }

    fn opened(&self, fh: u64, ino: u64, writable: bool) -> bool {
        self.keep_handle(KeptHandle { fh, ino, writable })
    }

    fn released(&self, fh: u64) {
        self.forget_handle(fh);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reopen(state: &Handover) -> Handover {
        let fd = state.memory().fd().try_clone_to_owned().unwrap();
        Handover::open(SharedMemory::open(fd).unwrap()).unwrap()
    }

    #[test]
    fn the_next_process_reads_init_handles_and_counters() {
        let state = Handover::create().unwrap();
        assert!(state.init().is_none());
        let init = InitResult {
            kernel_minor: 45,
            kernel_flags: 0x1234_5678_9abc,
            reply: InitOut {
                major: 7,
                minor: 45,
                max_readahead: 131072,
                flags: 0x40_0000_1234,
                max_background: 128,
                congestion_threshold: 96,
                max_write: 1 << 20,
                time_gran: 1,
                max_pages: 256,
            },
        };
        state.set_init(&init);
        let a = KeptHandle {
            fh: 1,
            ino: 3,
            writable: true,
        };
        let b = KeptHandle {
            fh: 2,
            ino: 3,
            writable: false,
        };
        assert!(state.keep_handle(a) && state.keep_handle(b));
        state.forget_handle(1);
        state.set_ready();
        state.count_takeover();
        let next = reopen(&state);
        assert_eq!(next.init(), Some(init));
        assert_eq!(next.handles(), vec![b]);
        assert!(next.was_ready());
        assert_eq!(next.takeovers(), 1);
    }

    #[test]
    fn the_next_process_reads_the_lineage_mark_and_a_first_release_state_has_none() {
        let state = Handover::create().unwrap();
        assert_eq!(state.mark(), None, "nothing recorded yet");
        let mark = crate::blob::Mark {
            epoch: Some(0),
            etag: Some("\"0x8DC0FFEE\"".into()),
        };
        state.set_mark(&mark);
        assert_eq!(reopen(&state).mark(), Some(mark));
        let later = crate::blob::Mark {
            epoch: Some(7),
            etag: None,
        };
        state.set_mark(&later);
        assert_eq!(reopen(&state).mark(), Some(later));
        // A torn record (the writer died between its two generation
        // stores) reads as none.
        let gen = state.field(F_MARK_GEN);
        gen.store(gen.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        assert_eq!(reopen(&state).mark(), None);
    }

    #[test]
    fn a_state_of_another_version_is_refused_with_one_line() {
        let state = Handover::create().unwrap();
        state.memory().u64_at(F_VERSION).store(7, Ordering::Release);
        let fd = state.memory().fd().try_clone_to_owned().unwrap();
        let err = Handover::open(SharedMemory::open(fd).unwrap())
            .err()
            .unwrap();
        assert!(err.to_string().contains("format version 7"), "{err}");
        assert_eq!(err.to_string().lines().count(), 1);
    }
}
