//! Scanning a local image: which 512-byte pages hold data, read in 4 MiB
//! blocks, without reading the holes of a sparse file or the unallocated
//! blocks of a dynamic VHD ([`DiskReader`]).
//!
//! Owns the zero/hole detection and the chunk digest; knows nothing of the
//! network. Holes are found with `SEEK_DATA`/`SEEK_HOLE` and never read; the
//! data in between is read in blocks aligned to a 4 MiB grid, and each block
//! is cut into runs of non-zero pages (a run never crosses a grid line, so
//! one run is at most one Put Page). Invariants: every emitted run is
//! 512-aligned and non-zero in each of its pages; the digest of a chunk
//! depends only on its content (offsets and bytes of its non-zero pages),
//! not on how it was read, so the blob side computes the same value from
//! what it reads back.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::crc::Crc32c;
use crate::units::{ByteRange, MAX_PUT_PAGE_BYTES, PAGE_SIZE};
use crate::vhd::dynamic::DynamicVhd;

/// Reads (and runs) are aligned to this grid; it is also the largest run.
pub const BLOCK_BYTES: u64 = MAX_PUT_PAGE_BYTES;

/// True when every byte is zero.
pub fn is_zero(data: &[u8]) -> bool {
    let (head, body, tail) = {
        // SAFETY: any bit pattern is a valid u128; align_to only splits the
        // slice at alignment boundaries.
        unsafe { data.align_to::<u128>() }
    };
    head.iter().all(|b| *b == 0) && body.iter().all(|w| *w == 0) && tail.iter().all(|b| *b == 0)
}

/// The runs of non-zero 512-byte pages of `data`, which starts at byte
/// `offset_bytes` (512-aligned; `data.len()` a multiple of 512), as
/// (offset, bytes) slices sharing `data`'s memory.
pub fn nonzero_runs(offset_bytes: u64, data: &Bytes) -> Vec<(u64, Bytes)> {
    let page = PAGE_SIZE as usize;
    debug_assert!(data.len() % page == 0 && offset_bytes % PAGE_SIZE == 0);
    let mut runs = Vec::new();
    let mut run_start: Option<usize> = None;
    for (i, p) in data.chunks(page).enumerate() {
        let at = i * page;
        match (is_zero(p), run_start) {
            (false, None) => run_start = Some(at),
            (true, Some(s)) => {
                runs.push((offset_bytes + s as u64, data.slice(s..at)));
                run_start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = run_start {
        runs.push((offset_bytes + s as u64, data.slice(s..)));
    }
    runs
}

/// The content checksum of one chunk: CRC32C over, for each non-zero page in
/// order, its byte offset (little-endian u64) and its 512 bytes. Zero pages,
/// written or not, do not count: a page the blob never stored reads as zeros.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChunkDigest {
    crc: Crc32c,
}

impl ChunkDigest {
    /// A digest over nothing yet (an all-zero chunk).
    pub fn new() -> Self {
        ChunkDigest::default()
    }

    /// Feed `data` found at `offset_bytes` (512-aligned, whole pages); its
    /// zero pages are skipped. Calls must come in increasing offset order.
    pub fn add(&mut self, offset_bytes: u64, data: &[u8]) {
        for (i, p) in data.chunks(PAGE_SIZE as usize).enumerate() {
            if !is_zero(p) {
                let at = offset_bytes + i as u64 * PAGE_SIZE;
                self.crc.update(&at.to_le_bytes());
                self.crc.update(p);
            }
        }
    }

    /// The checksum.
    pub fn value(&self) -> u32 {
        self.crc.value()
    }
}

/// The image's data area cut into equal chunks (the last may be shorter):
/// the unit an upload records as done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkGrid {
    /// Bytes of the data area (the disk, without the VHD footer).
    pub data_len: u64,
    /// Bytes per chunk, a multiple of [`BLOCK_BYTES`].
    pub chunk_bytes: u64,
}

impl ChunkGrid {
    /// Number of chunks.
    pub fn count(&self) -> u64 {
        self.data_len.div_ceil(self.chunk_bytes)
    }

    /// Byte range of chunk `index`.
    pub fn range(&self, index: u64) -> ByteRange {
        let start = index * self.chunk_bytes;
        ByteRange::new(start, (start + self.chunk_bytes).min(self.data_len))
    }

    /// The chunk holding byte `offset`.
    pub fn chunk_of(&self, offset: u64) -> u64 {
        offset / self.chunk_bytes
    }
}

/// What to do with one chunk during a scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkAction {
    /// Do not read it.
    Skip,
    /// Read it and report its digest, but emit no runs.
    Digest,
    /// Read it, emit its runs and its digest.
    Send,
}

/// What a scan reports, in file order.
#[derive(Debug, Clone)]
pub enum ScanEvent {
    /// Non-zero pages to send (only for [`ChunkAction::Send`] chunks).
    Run {
        /// Chunk index.
        chunk: u64,
        /// Byte offset in the data area (512-aligned).
        offset_bytes: u64,
        /// The pages (at most [`BLOCK_BYTES`]).
        data: Bytes,
    },
    /// A chunk was read to its end; every run of it came before.
    ChunkEnd {
        /// Chunk index.
        chunk: u64,
        /// Its [`ChunkDigest`].
        digest: u32,
        /// Bytes of it that were holes in the file (not read).
        hole_bytes: u64,
        /// Bytes of it that were read but zero.
        zero_bytes: u64,
    },
}

/// `lseek` with `SEEK_DATA`/`SEEK_HOLE`; `Ok(None)` when there is no more
/// data (ENXIO); `Err` with `Unsupported` when the filesystem cannot say.
fn seek(file: &File, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    let off = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
    // SAFETY: lseek on a file descriptor we own; no memory is touched.
    let r = unsafe { libc::lseek(file.as_raw_fd(), off, whence) };
    if r >= 0 {
        return Ok(Some(r as u64));
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::ENXIO) => Ok(None),
        Some(libc::EINVAL) => Err(io::Error::new(io::ErrorKind::Unsupported, err)),
        _ => Err(err),
    }
}

/// The next data extent of `file` that starts before `limit`, at or after
/// `from`: `[start, end)`, both clipped to `limit`. Holes are never read.
pub fn next_data(file: &File, from: u64, limit: u64) -> io::Result<Option<ByteRange>> {
    if from >= limit {
        return Ok(None);
    }
    let start = match seek(file, from, libc::SEEK_DATA) {
        Ok(Some(s)) => s,
        Ok(None) => return Ok(None),
        // No hole support: everything is data.
        Err(e) if e.kind() == io::ErrorKind::Unsupported => {
            return Ok(Some(ByteRange::new(from, limit)))
        }
        Err(e) => return Err(e),
    };
    if start >= limit {
        return Ok(None);
    }
    let end = match seek(file, start, libc::SEEK_HOLE) {
        Ok(Some(e)) => e,
        Ok(None) => limit,
        Err(e) if e.kind() == io::ErrorKind::Unsupported => limit,
        Err(e) => return Err(e),
    };
    Ok(Some(ByteRange::new(start, end.clamp(start, limit))))
}

/// Where the disk's bytes of a local image are.
#[derive(Debug, Clone)]
pub enum DiskReader {
    /// Byte for byte at the start of a file (raw image, fixed VHD).
    Flat {
        /// The image.
        file: Arc<File>,
        /// Bytes of the file that belong to the data area (the rest of the
        /// data area, if any, is padding and reads as zeros).
        file_data_len: u64,
    },
    /// Through the block table of a dynamic VHD; unallocated blocks and
    /// unwritten sectors are holes.
    Dynamic(Arc<DynamicVhd>),
}

impl DiskReader {
    /// The next data extent at or after `from` and before `limit`; holes
    /// (of the file, or unallocated in a dynamic VHD) are skipped unread.
    pub fn next_data(&self, from: u64, limit: u64) -> io::Result<Option<ByteRange>> {
        match self {
            DiskReader::Flat {
                file,
                file_data_len,
            } => next_data(file, from, limit.min(*file_data_len)),
            DiskReader::Dynamic(vhd) => vhd.next_data(from, limit),
        }
    }

    /// Read `range` of the disk (whole pages); bytes past the image's data
    /// (the padding of `--pad`) read as zeros.
    pub fn read(&self, range: ByteRange) -> io::Result<Bytes> {
        let mut buf = BytesMut::zeroed(range.len() as usize);
        match self {
            DiskReader::Flat {
                file,
                file_data_len,
            } => {
                let readable = file_data_len.saturating_sub(range.start).min(range.len()) as usize;
                file.read_exact_at(&mut buf[..readable], range.start)?;
            }
            DiskReader::Dynamic(vhd) => vhd.read_at(&mut buf, range.start)?,
        }
        Ok(buf.freeze())
    }
}

/// A scan of one image over a chunk grid.
#[derive(Debug)]
pub struct Scan<'a> {
    /// The image's disk.
    pub disk: &'a DiskReader,
    /// The chunks.
    pub grid: ChunkGrid,
    /// Bytes examined so far (read or found to be holes), for progress.
    pub examined: &'a AtomicU64,
}

impl Scan<'_> {
    /// Scan every chunk `action` does not skip, in order, passing events to
    /// `emit`; stops early (returning `Ok(false)`) when `emit` returns false.
    pub fn run(
        &self,
        action: impl Fn(u64) -> ChunkAction,
        mut emit: impl FnMut(ScanEvent) -> bool,
    ) -> io::Result<bool> {
        for chunk in 0..self.grid.count() {
            let act = action(chunk);
            if act == ChunkAction::Skip {
                continue;
            }
            if !self.chunk(chunk, act, &mut emit)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn chunk(
        &self,
        chunk: u64,
        act: ChunkAction,
        emit: &mut impl FnMut(ScanEvent) -> bool,
    ) -> io::Result<bool> {
        let range = self.grid.range(chunk);
        let limit = range.end;
        let mut digest = ChunkDigest::new();
        let (mut hole_bytes, mut zero_bytes) = (0u64, 0u64);
        let mut pos = range.start;
        while pos < range.end {
            let extent = self.disk.next_data(pos, limit)?;
            let Some(extent) = extent else {
                hole_bytes += range.end - pos;
                self.examined.fetch_add(range.end - pos, Ordering::Relaxed);
                break;
            };
            // Extents are filesystem blocks; keep whole pages regardless.
            let data_start = extent.start / PAGE_SIZE * PAGE_SIZE;
            let data_start = data_start.max(pos);
            let data_end = extent.end.div_ceil(PAGE_SIZE) * PAGE_SIZE;
            let data_end = data_end.min(range.end);
            hole_bytes += data_start - pos;
            self.examined.fetch_add(data_start - pos, Ordering::Relaxed);
            let mut at = data_start;
            while at < data_end {
                let grid_end = (at / BLOCK_BYTES + 1) * BLOCK_BYTES;
                let block = ByteRange::new(at, grid_end.min(data_end));
                let data = self.disk.read(block)?;
                digest.add(block.start, &data);
                let runs = nonzero_runs(block.start, &data);
                let nonzero: u64 = runs.iter().map(|(_, d)| d.len() as u64).sum();
                zero_bytes += block.len() - nonzero;
                if act == ChunkAction::Send {
                    for (offset_bytes, data) in runs {
                        if !emit(ScanEvent::Run {
                            chunk,
                            offset_bytes,
                            data,
                        }) {
                            return Ok(false);
                        }
                    }
                }
                self.examined.fetch_add(block.len(), Ordering::Relaxed);
                at = block.end;
            }
            pos = data_end.max(pos + PAGE_SIZE.min(range.end - pos));
        }
        Ok(emit(ScanEvent::ChunkEnd {
            chunk,
            digest: digest.value(),
            hole_bytes,
            zero_bytes,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn bytes(v: Vec<u8>) -> Bytes {
        Bytes::from(v)
    }

    #[test]
    fn runs_skip_zero_pages_and_share_memory() {
        let mut v = vec![0u8; 512 * 6];
        v[512] = 1; // page 1
        v[512 * 2 + 511] = 2; // page 2
        v[512 * 5] = 3; // page 5
        let runs = nonzero_runs(1 << 20, &bytes(v));
        let got: Vec<(u64, usize)> = runs.iter().map(|(o, d)| (*o, d.len())).collect();
        assert_eq!(got, vec![((1 << 20) + 512, 1024), ((1 << 20) + 2560, 512)]);
    }

    #[test]
    fn zero_detection_handles_any_alignment() {
        let v = vec![0u8; 1031];
        for start in 0..17 {
            assert!(is_zero(&v[start..]));
            let mut w = v.clone();
            w[1030] = 9;
            assert!(!is_zero(&w[start..]));
        }
    }

    #[test]
    fn digest_ignores_zero_pages_and_how_data_is_split() {
        let mut v = vec![0u8; 4096];
        v[1000] = 7;
        v[3000] = 8;
        let mut whole = ChunkDigest::new();
        whole.add(0, &v);
        let mut parts = ChunkDigest::new();
        parts.add(0, &v[..1024]);
        parts.add(2048, &v[2048..]);
        assert_eq!(whole.value(), parts.value());
        assert_eq!(ChunkDigest::new().value(), {
            let mut z = ChunkDigest::new();
            z.add(0, &[0u8; 1024]);
            z.value()
        });
        // The same bytes at another offset are another content.
        let mut moved = ChunkDigest::new();
        moved.add(512, &v[..3584]);
        assert_ne!(moved.value(), whole.value());
    }

    #[test]
    fn sparse_file_scan_reads_only_data_and_finds_zeros() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("img");
        let mut f = File::create(&path).expect("create");
        let len = 24u64 << 20;
        f.set_len(len).expect("set_len");
        f.write_all_at(&[5u8; 8192], 9 << 20).expect("write");
        f.write_all_at(&vec![0u8; 1 << 20], 16 << 20)
            .expect("write zeros");
        f.flush().expect("flush");
        let disk = DiskReader::Flat {
            file: Arc::new(File::open(&path).expect("open")),
            file_data_len: len,
        };
        let examined = AtomicU64::new(0);
        let scan = Scan {
            disk: &disk,
            grid: ChunkGrid {
                data_len: len,
                chunk_bytes: 8 << 20,
            },
            examined: &examined,
        };
        let mut runs = Vec::new();
        let mut ends = Vec::new();
        let done = scan
            .run(
                |_| ChunkAction::Send,
                |e| {
                    match e {
                        ScanEvent::Run {
                            chunk,
                            offset_bytes,
                            data,
                        } => runs.push((chunk, offset_bytes, data.len())),
                        ScanEvent::ChunkEnd {
                            chunk,
                            hole_bytes,
                            zero_bytes,
                            ..
                        } => ends.push((chunk, hole_bytes, zero_bytes)),
                    }
                    true
                },
            )
            .expect("scan");
        assert!(done);
        assert_eq!(runs, vec![(1, 9 << 20, 8192)]);
        assert_eq!(ends.len(), 3);
        assert_eq!(examined.load(Ordering::Relaxed), len);
        // The written zeros are found as zeros, not sent (if the filesystem
        // kept them as data) or as holes.
        let (_, h2, z2) = ends[2];
        assert_eq!(h2 + z2, 8 << 20);
    }
}
