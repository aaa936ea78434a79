//! The write log of an attach: every write and discard acknowledged to the
//! kernel stays here, in a memory file the holder process keeps open, until
//! the blob has it. A serving process that dies (a crash, `kill -9`, the OOM
//! killer) loses nothing the kernel believes written: the next one replays
//! the log into its cache before it serves again.
//!
//! No copy is added for it: the session reads each request from `/dev/fuse`
//! straight into the log ([`WriteLog::reserve`]); a request that changes the
//! drive is kept there ([`WriteLog::keep`]) and its data goes into the cache
//! from the log, as it would from any read buffer. Other requests reuse the
//! same space for the next read.
//!
//! Rules (they make the replay exact):
//! - a record is kept (state READ) before its data is applied, and marked
//!   COMMITTED after the cache has it and before the reply goes out; one
//!   that failed is marked VOID. A READ record found by the next process
//!   was never answered: the kernel sends that request again, so the replay
//!   skips it.
//! - records lie in the ring in the order they were read, which is their
//!   sequence order; the replay applies the COMMITTED ones in that order.
//!   Writes the kernel had in flight together to the same bytes have no
//!   defined order on any disk, so the order read is as good as any.
//! - space is given back only up to a *flush mark*: the sequence number of
//!   the oldest record still READ (or the next number) taken before a flush
//!   of the whole drive; once that flush succeeds every record below the
//!   mark is in the blob ([`WriteLog::trim_before`]).
//! - when less than one more request fits, the reader waits for space (the
//!   kernel waits with it) and the keeper is asked to flush.
//!
//! Layout of the memory file: a 4 KiB header (fields below, little-endian
//! atomics), then the ring. A record is a 64-byte header (magic, state,
//! sequence, request length) and the request exactly as the kernel sent it,
//! rounded up to 64 bytes; a record never wraps: one that would not fit
//! before the end of the ring starts the next lap at its beginning.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::shared_memory::SharedMemory;

const MAGIC: u64 = u64::from_le_bytes(*b"BDWLOG01");
/// The layout version; a process refuses a log of another version.
pub const FORMAT_VERSION: u64 = 1;
const HEADER_BYTES: usize = 4096;
const RECORD_HEADER_BYTES: usize = 64;
const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"BDRC");
/// Marks the end of a lap: the next record did not fit before the ring's end.
const SKIP_MAGIC: u32 = u32::from_le_bytes(*b"BDSK");

// Header fields (byte offsets).
const H_MAGIC: usize = 0;
const H_VERSION: usize = 8;
const H_CAPACITY: usize = 16;
/// Logical position of the oldest record kept.
const H_TAIL: usize = 24;
/// Logical position after the newest record.
const H_HEAD: usize = 32;
/// Sequence number of the next record.
const H_NEXT_SEQ: usize = 40;

// Record header fields (byte offsets from the record's start).
const R_MAGIC: usize = 0;
const R_STATE: usize = 4;
const R_SEQ: usize = 8;
const R_LEN: usize = 16;

const READ: u32 = 1;
const COMMITTED: u32 = 2;
const VOID: u32 = 3;

/// One request the log holds, for the replay: its sequence number and the
/// request's bytes as the kernel sent them.
pub struct Replayed<'a> {
    /// Sequence number.
    pub seq: u64,
    /// The request (header, arguments, data).
    pub request: &'a [u8],
}

#[derive(Debug, Clone, Copy)]
struct Ring {
    tail: u64,
    head: u64,
    next_seq: u64,
}

/// The log in its memory file.
pub struct WriteLog {
    mem: SharedMemory,
    capacity: u64,
    /// Largest request a reservation must hold.
    max_request: usize,
    ring: Mutex<Ring>,
    /// Signalled when space is given back.
    space: Condvar,
    /// Wakes the keeper when the log is half full or a reader waits.
    pressure: tokio::sync::Notify,
}

/// Space at the head of the log for one request read from the kernel.
pub struct Slot {
    pos: u64,
    ptr: *mut u8,
    len: usize,
}

impl Slot {
    /// Where the request is read to.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }

    /// How many bytes fit.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true; for clippy's sake.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first `n` bytes (what a read put there).
    pub fn bytes(&self, n: usize) -> &[u8] {
        assert!(n <= self.len);
        // SAFETY: inside the reserved space, which no one else writes
        // until it is kept or given up (the reader is the only reserver).
        unsafe { std::slice::from_raw_parts(self.ptr, n) }
    }
}

/// A kept request: READ until [`Record::commit`] or [`Record::void`];
/// dropped undecided (a panic), it is void.
pub struct Record {
    log: Arc<WriteLog>,
    start: usize,
    len: usize,
    seq: u64,
    decided: bool,
}

impl Record {
    /// The request's bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the record's bytes stay untouched until the record is
        // trimmed, which needs it decided first (a READ record holds the
        // flush mark at or below its sequence number).
        unsafe {
            std::slice::from_raw_parts(
                self.log.mem.as_ptr().add(self.start + RECORD_HEADER_BYTES),
                self.len,
            )
        }
    }

    /// Its sequence number.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The cache has it: a replay applies it. Call before the reply.
    pub fn commit(mut self) {
        self.decide(COMMITTED);
    }

    /// It failed: a replay skips it.
    pub fn void(mut self) {
        self.decide(VOID);
    }

    /// [`Record::commit`] when `applied`, else [`Record::void`].
    pub fn settle(self, applied: bool) {
        if applied {
            self.commit();
        } else {
            self.void();
        }
    }

    fn decide(&mut self, state: u32) {
        self.decided = true;
        self.log
            .mem
            .u32_at(self.start + R_STATE)
            .store(state, Ordering::Release);
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        if !self.decided {
            self.decide(VOID);
        }
    }
}

impl WriteLog {
    /// Bytes of memory file a log holding `capacity` bytes of records needs.
    pub fn file_bytes(capacity: u64) -> u64 {
        HEADER_BYTES as u64 + capacity
    }

    /// A new, empty log of `capacity` bytes of records (at least four of the
    /// largest requests, `max_request` bytes each).
    pub fn create(capacity: u64, max_request: usize) -> io::Result<Self> {
        let capacity = capacity
            .max(4 * record_bytes(max_request) as u64)
            .next_multiple_of(4096);
        let mem = SharedMemory::create("blobdrive-write-log", Self::file_bytes(capacity) as usize)?;
        mem.u64_at(H_VERSION)
            .store(FORMAT_VERSION, Ordering::Relaxed);
        mem.u64_at(H_CAPACITY).store(capacity, Ordering::Relaxed);
        mem.u64_at(H_MAGIC).store(MAGIC, Ordering::Release);
        Ok(Self::with(
            mem,
            capacity,
            max_request,
            Ring {
                tail: 0,
                head: 0,
                next_seq: 1,
            },
        ))
    }

    /// The log in `mem`, left by a process that died: checks it, marks the
    /// records it never answered VOID (the kernel sends those requests
    /// again) and goes on from where it stopped.
    pub fn adopt(mem: SharedMemory, max_request: usize) -> io::Result<Self> {
        let bad =
            |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("write log: {what}"));
        if mem.len() < HEADER_BYTES || mem.u64_at(H_MAGIC).load(Ordering::Acquire) != MAGIC {
            return Err(bad("not a write log"));
        }
        let version = mem.u64_at(H_VERSION).load(Ordering::Acquire);
        if version != FORMAT_VERSION {
            return Err(bad(&format!(
                "format version {version}; this blobdrive reads version {FORMAT_VERSION}"
            )));
        }
        let capacity = mem.u64_at(H_CAPACITY).load(Ordering::Acquire);
        if Self::file_bytes(capacity) != mem.len() as u64 {
            return Err(bad("its size does not match its header"));
        }
        let ring = Ring {
            tail: mem.u64_at(H_TAIL).load(Ordering::Acquire),
            head: mem.u64_at(H_HEAD).load(Ordering::Acquire),
            next_seq: mem.u64_at(H_NEXT_SEQ).load(Ordering::Acquire).max(1),
        };
        // Records start on header-size boundaries, and the capacity is a
        // whole number of pages: anything else is a corrupted header, to
        // refuse here rather than trip over in the parser.
        let aligned = |x: u64| x % RECORD_HEADER_BYTES as u64 == 0;
        if capacity == 0
            || capacity % 4096 != 0
            || !aligned(ring.tail)
            || !aligned(ring.head)
            || ring.tail > ring.head
            || ring.head - ring.tail > capacity
        {
            return Err(bad("its positions are inconsistent"));
        }
        let log = Self::with(mem, capacity, max_request, ring);
        for (_, start, _, _) in log.records(ring)? {
            let state = log.mem.u32_at(start + R_STATE);
            if state.load(Ordering::Acquire) == READ {
                state.store(VOID, Ordering::Release);
            }
        }
        Ok(log)
    }

    fn with(mem: SharedMemory, capacity: u64, max_request: usize, ring: Ring) -> Self {
        WriteLog {
            mem,
            capacity,
            max_request,
            ring: Mutex::new(ring),
            space: Condvar::new(),
            pressure: tokio::sync::Notify::new(),
        }
    }

    /// The memory file (for the holder, and for the next process).
    pub fn memory(&self) -> &SharedMemory {
        &self.mem
    }

    fn lock(&self) -> MutexGuard<'_, Ring> {
        self.ring.lock().expect("write log mutex poisoned")
    }

    /// Byte offset in the memory file of logical position `pos`.
    fn offset(&self, pos: u64) -> usize {
        HEADER_BYTES + (pos % self.capacity) as usize
    }

    /// Where the next request goes: blocks while the log has no room for
    /// the largest one (asking the keeper to flush).
    pub fn reserve(&self) -> Slot {
        let need = record_bytes(self.max_request) as u64;
        let mut ring = self.lock();
        loop {
            let (pos, fits) = self.next_start(&ring, need);
            if fits {
                let start = self.offset(pos);
                // SAFETY: `start` + the record fits in the ring (checked by
                // `next_start`), past every record kept.
                let ptr = unsafe { self.mem.as_ptr().add(start + RECORD_HEADER_BYTES) };
                return Slot {
                    pos,
                    ptr,
                    len: self.max_request,
                };
            }
            self.pressure.notify_one();
            ring = self
                .space
                .wait_timeout(ring, std::time::Duration::from_millis(200))
                .expect("write log mutex poisoned")
                .0;
        }
    }

    /// Where a record of `need` bytes would start, and whether it fits.
    fn next_start(&self, ring: &Ring, need: u64) -> (u64, bool) {
        let in_lap = ring.head % self.capacity;
        let pos = if in_lap + need > self.capacity {
            ring.head + (self.capacity - in_lap)
        } else {
            ring.head
        };
        (pos, pos + need - ring.tail <= self.capacity)
    }

    /// Keeps the `len`-byte request read into `slot` as a READ record.
    pub fn keep(self: &Arc<Self>, slot: Slot, len: usize) -> Record {
        assert!(len <= slot.len);
        let mut ring = self.lock();
        if slot.pos != ring.head {
            // The rest of this lap is skipped; say so where a record would
            // start (an old lap's record may still lie there).
            self.mem
                .u32_at(self.offset(ring.head) + R_MAGIC)
                .store(SKIP_MAGIC, Ordering::Release);
        }
        let start = self.offset(slot.pos);
        let seq = ring.next_seq;
        self.mem.u64_at(start + R_SEQ).store(seq, Ordering::Relaxed);
        self.mem
            .u64_at(start + R_LEN)
            .store(len as u64, Ordering::Relaxed);
        self.mem
            .u32_at(start + R_STATE)
            .store(READ, Ordering::Relaxed);
        self.mem
            .u32_at(start + R_MAGIC)
            .store(RECORD_MAGIC, Ordering::Release);
        ring.next_seq += 1;
        ring.head = slot.pos + record_bytes(len) as u64;
        // The record is whole before the header points past it.
        self.mem
            .u64_at(H_NEXT_SEQ)
            .store(ring.next_seq, Ordering::Release);
        self.mem.u64_at(H_HEAD).store(ring.head, Ordering::Release);
        if self.used(&ring) * 2 >= self.capacity {
            self.pressure.notify_one();
        }
        Record {
            log: self.clone(),
            start,
            len,
            seq,
            decided: false,
        }
    }

    fn used(&self, ring: &Ring) -> u64 {
        ring.head - ring.tail
    }

    /// Bytes of records the log holds.
    pub fn used_bytes(&self) -> u64 {
        self.used(&self.lock())
    }

    /// Bytes of records it can hold.
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity
    }

    /// Records kept, oldest first: (logical position, byte offset,
    /// sequence, length).
    fn records(&self, ring: Ring) -> io::Result<Vec<(u64, usize, u64, usize)>> {
        let corrupt =
            |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("write log: {what}"));
        let mut out = Vec::new();
        let mut pos = ring.tail;
        while pos < ring.head {
            let in_lap = pos % self.capacity;
            let start = self.offset(pos);
            match self.mem.u32_at(start + R_MAGIC).load(Ordering::Acquire) {
                SKIP_MAGIC => {
                    pos += self.capacity - in_lap;
                    continue;
                }
                RECORD_MAGIC => {}
                _ => return Err(corrupt("a record has no header")),
            }
            let seq = self.mem.u64_at(start + R_SEQ).load(Ordering::Acquire);
            let len = self.mem.u64_at(start + R_LEN).load(Ordering::Acquire) as usize;
            if len > self.max_request {
                return Err(corrupt("a record is longer than any request"));
            }
            let size = record_bytes(len) as u64;
            if in_lap + size > self.capacity || pos + size > ring.head {
                return Err(corrupt("a record runs past the end of the log"));
            }
            out.push((pos, start, seq, len));
            pos += size;
        }
        Ok(out)
    }

    /// The COMMITTED records, oldest first, for the replay.
    pub fn committed(&self) -> io::Result<Vec<Replayed<'_>>> {
        let ring = *self.lock();
        Ok(self
            .records(ring)?
            .into_iter()
            .filter(|(_, start, _, _)| {
                self.mem.u32_at(start + R_STATE).load(Ordering::Acquire) == COMMITTED
            })
            .map(|(_, start, seq, len)| Replayed {
                seq,
                // SAFETY: inside the record, which stays until trimmed; the
                // replay runs before the keeper can trim.
                request: unsafe {
                    std::slice::from_raw_parts(
                        self.mem.as_ptr().add(start + RECORD_HEADER_BYTES),
                        len,
                    )
                },
            })
            .collect())
    }

    /// The flush mark: the sequence number of the oldest record not yet
    /// decided, or the next number. Take it *before* a flush of the whole
    /// drive; after that flush succeeds, pass it to [`WriteLog::trim_before`].
    pub fn flush_mark(&self) -> u64 {
        let ring = *self.lock();
        // An unreadable log gives nothing back.
        let Ok(records) = self.records(ring) else {
            return 0;
        };
        records
            .into_iter()
            .find(|(_, start, _, _)| {
                self.mem.u32_at(start + R_STATE).load(Ordering::Acquire) == READ
            })
            .map_or(ring.next_seq, |(_, _, seq, _)| seq)
    }

    /// Gives back the space of every record below `mark`: a flush that began
    /// after the mark was taken made them durable.
    pub fn trim_before(&self, mark: u64) {
        let mut ring = self.lock();
        let Ok(records) = self.records(*ring) else {
            // Unreadable records are never given back: the space stays
            // taken rather than risk a record not yet durable.
            tracing::error!("write log unreadable; not trimming");
            return;
        };
        let tail = records
            .iter()
            .find(|(_, _, seq, _)| *seq >= mark)
            .map_or(ring.head, |(pos, _, _, _)| *pos);
        if tail > ring.tail {
            ring.tail = tail;
            self.mem.u64_at(H_TAIL).store(tail, Ordering::Release);
            self.space.notify_all();
        }
    }

    /// Waits until the log is half full or a reader waits for space.
    pub async fn pressed(&self) {
        self.pressure.notified().await;
    }
}

/// Bytes a record of a `len`-byte request takes.
fn record_bytes(len: usize) -> usize {
    (RECORD_HEADER_BYTES + len).next_multiple_of(RECORD_HEADER_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(log: &Arc<WriteLog>, fill: u8, len: usize) -> Record {
        let mut slot = log.reserve();
        // SAFETY: the slot holds at least `len` bytes (len <= max_request).
        unsafe { std::ptr::write_bytes(slot.as_mut_ptr(), fill, len) };
        log.keep(slot, len)
    }

    fn adopt_copy(log: &WriteLog) -> WriteLog {
        let fd = log.memory().fd().try_clone_to_owned().unwrap();
        WriteLog::adopt(SharedMemory::open(fd).unwrap(), 1000).unwrap()
    }

    #[test]
    fn the_next_process_replays_what_was_committed_and_skips_the_rest() {
        let log = Arc::new(WriteLog::create(16 * 1024, 1000).unwrap());
        put(&log, 1, 100).commit();
        let unanswered = put(&log, 2, 200);
        put(&log, 3, 300).void();
        put(&log, 4, 400).commit();
        std::mem::forget(unanswered); // the process died before deciding it
        let next = adopt_copy(&log);
        let replay = next.committed().unwrap();
        let seen: Vec<(u64, usize, u8)> = replay
            .iter()
            .map(|r| (r.seq, r.request.len(), r.request[0]))
            .collect();
        assert_eq!(seen, vec![(1, 100, 1), (4, 400, 4)]);
        // The unanswered one is void for the next process: the kernel resends it.
        assert_eq!(next.flush_mark(), 5);
    }

    #[test]
    fn trimming_stops_at_the_oldest_undecided_record_and_space_comes_back() {
        let log = Arc::new(WriteLog::create(8 * 1024, 1000).unwrap());
        let cap = log.capacity_bytes();
        put(&log, 1, 1000).commit();
        let pending = put(&log, 2, 1000);
        put(&log, 3, 1000).commit();
        let mark = log.flush_mark();
        assert_eq!(mark, 2, "the undecided record holds the mark");
        log.trim_before(mark);
        assert_eq!(log.used_bytes(), 2 * record_bytes(1000) as u64);
        pending.commit();
        log.trim_before(log.flush_mark());
        assert_eq!(log.used_bytes(), 0);
        // Many laps around the ring: positions stay consistent.
        for round in 0..50u8 {
            let r = put(&log, round, 900 + round as usize);
            r.commit();
            log.trim_before(log.flush_mark());
        }
        assert_eq!(log.used_bytes(), 0);
        assert!(cap >= 4 * record_bytes(1000) as u64);
    }

    #[test]
    fn records_across_laps_replay_in_order() {
        let log = Arc::new(WriteLog::create(8 * 1024, 1000).unwrap());
        for round in 0..7u8 {
            put(&log, round, 700).commit();
            if round == 3 {
                log.trim_before(log.flush_mark());
            }
        }
        let next = adopt_copy(&log);
        let fills: Vec<u8> = next
            .committed()
            .unwrap()
            .iter()
            .map(|r| r.request[0])
            .collect();
        assert_eq!(fills, vec![4, 5, 6]);
    }

    #[test]
    fn a_log_of_another_version_is_refused() {
        let log = WriteLog::create(8 * 1024, 1000).unwrap();
        log.memory().u64_at(H_VERSION).store(99, Ordering::Release);
        let fd = log.memory().fd().try_clone_to_owned().unwrap();
        let err = WriteLog::adopt(SharedMemory::open(fd).unwrap(), 1000)
            .err()
            .expect("refused");
        assert!(err.to_string().contains("version 99"), "{err}");
    }
}
