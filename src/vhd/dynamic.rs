//! Reading a dynamic VHD as the disk it describes, without expanding it:
//! which byte ranges of the disk hold data, and their bytes.
//!
//! The format (Microsoft's VHD specification 1.0; details and sources in
//! `docs/vhd.md`), all integers big-endian, a sector 512 bytes:
//! - offset 0: a copy of the footer (`conectix`, disk type 3 dynamic or 4
//!   differencing); the same footer is the file's last 512 bytes;
//! - at the footer's data offset (512 in practice): the 1024-byte dynamic
//!   header: `cxsparse`, table offset (u64 at 16), header version 1.0 (u32 at
//!   24), max table entries (u32 at 28), block size (u32 at 32, 2 MiB by
//!   default), checksum (u32 at 36: one's complement of the byte sum of the
//!   header with this field as zero), then the parent's id, time, name and
//!   locators (differencing disks only);
//! - at the table offset: the block allocation table (BAT), one u32 per block
//!   of the disk: the sector where the block starts in the file, or
//!   `0xFFFFFFFF` when the block was never written (it reads as zeros);
//! - an allocated block is a sector bitmap (one bit per sector of the block,
//!   most significant bit first, padded to whole sectors) followed by the
//!   block's data. A clear bit means the sector was never written: in a
//!   dynamic disk it reads as zeros.
//!
//! Invariants: [`DynamicVhd::open`] checks the whole structure before it
//! returns (both footers, the header and its checksum, and that every
//! allocated block lies inside the file, before the footer, and overlaps
//! neither the metadata nor another block), so reads never go past what the
//! file holds; a differencing disk is refused, since its data is only
//! complete with its parent.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use super::{DiskType, Footer};
use crate::units::{ByteRange, MAX_DRIVE_BYTES, PAGE_SIZE, VHD_FOOTER_BYTES};

/// The cookie of the dynamic disk header.
pub const HEADER_COOKIE: [u8; 8] = *b"cxsparse";
/// Size of the dynamic disk header.
pub const HEADER_BYTES: u64 = 1024;
/// BAT value of a block that was never written.
pub const UNALLOCATED: u32 = u32::MAX;
/// Most BAT entries read (64 MiB of table): far beyond the 2040 GiB a VHD
/// holds in the default 2 MiB blocks, and a bound on what a corrupt header
/// can make us allocate.
pub const MAX_BLOCKS: u64 = 1 << 24;

/// Byte offsets of the dynamic header's fields.
mod off {
    pub const COOKIE: usize = 0;
    pub const TABLE_OFFSET: usize = 16;
    pub const VERSION: usize = 24;
    pub const MAX_TABLE_ENTRIES: usize = 28;
    pub const BLOCK_SIZE: usize = 32;
    pub const CHECKSUM: usize = 36;
}

/// Why a file cannot be read as a dynamic VHD. Each reads as the end of one
/// line after the file's name.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading the file failed.
    #[error("cannot read it: {0}")]
    Io(#[from] io::Error),
    /// A differencing disk: its data is only complete with its parent.
    // Not `qemu-img convert`: qemu reads a differencing VHD as a standalone
    // dynamic one, without its parent's data, so its "merged" copy would
    // silently lack everything the parent holds.
    #[error(
        "is a differencing VHD (it holds only the changes over its parent{parent}); merge it \
         with its parent into one image first, e.g. on Hyper-V 'Convert-VHD DIFF.vhd \
         MERGED.vhd -VHDType Dynamic', then upload MERGED.vhd (qemu-img cannot: it ignores \
         the parent of a VHD)"
    )]
    Differencing {
        /// `: NAME` when the header names the parent, else empty.
        parent: String,
    },
    /// A footer (the copy at the start or the one at the end) is damaged.
    #[error("corrupt dynamic VHD: {which} footer: {cause}")]
    BadFooter {
        /// `the first` or `the last`.
        which: &'static str,
        /// What is wrong with it.
        cause: super::Error,
    },
    /// Anything else in the structure that does not hold.
    #[error("corrupt dynamic VHD: {0}")]
    Corrupt(String),
}

fn corrupt(message: impl Into<String>) -> Error {
    Error::Corrupt(message.into())
}

/// A part of the file, named in an overlap's error.
#[derive(Debug, Clone, Copy)]
enum Region {
    FooterCopy,
    Header,
    Table,
    Block(usize),
}

impl std::fmt::Display for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Region::FooterCopy => f.write_str("the footer copy"),
            Region::Header => f.write_str("the dynamic header"),
            Region::Table => f.write_str("the block table"),
            Region::Block(i) => write!(f, "block {i}"),
        }
    }
}

/// An open dynamic VHD, checked; see the module documentation.
#[derive(Debug)]
pub struct DynamicVhd {
    file: File,
    footer: Footer,
    block_bytes: u64,
    bitmap_bytes: u64,
    /// Per block: byte offset of its sector bitmap in the file, if allocated.
    blocks: Vec<Option<u64>>,
}

impl DynamicVhd {
    /// Check `file` (of `file_len` bytes) as a dynamic VHD and keep its
    /// block table. Reads the two footers, the header and the table only.
    pub fn open(file: File) -> Result<DynamicVhd, Error> {
        let file_len = file.metadata()?.len();
        if file_len < 2 * VHD_FOOTER_BYTES + HEADER_BYTES {
            return Err(corrupt(format!(
                "the file is {file_len} bytes, too small for two footers and a dynamic header"
            )));
        }
        let first = read_footer(&file, 0, "the first")?;
        if first.disk_type == DiskType::Differencing {
            return Err(differencing(&file, &first));
        }
        if first.disk_type != DiskType::Dynamic {
            return Err(corrupt(format!(
                "the footer at the start says it is a {} disk",
                first.disk_type
            )));
        }
        let last = read_footer(&file, file_len - VHD_FOOTER_BYTES, "the last")?;
        if (last.disk_type, last.current_size_bytes, last.unique_id)
            != (first.disk_type, first.current_size_bytes, first.unique_id)
        {
            return Err(corrupt(
                "the footer at the end does not match the copy at the start (the file is truncated or damaged)",
            ));
        }
        let size = first.current_size_bytes;
        if size == 0 || size % PAGE_SIZE != 0 || size > MAX_DRIVE_BYTES {
            return Err(corrupt(format!(
                "its size of {size} bytes is not a whole number of sectors up to 8 TiB"
            )));
        }

        let header_at = first.data_offset;
        if header_at < VHD_FOOTER_BYTES
            || header_at
                .checked_add(HEADER_BYTES)
                .is_none_or(|end| end > file_len - VHD_FOOTER_BYTES)
        {
            return Err(corrupt(format!(
                "the dynamic header offset {header_at} is outside the file"
            )));
        }
        let mut header = [0u8; HEADER_BYTES as usize];
        file.read_exact_at(&mut header, header_at)?;
        if header[off::COOKIE..off::COOKIE + 8] != HEADER_COOKIE {
            return Err(corrupt(format!(
                "no dynamic header (\"cxsparse\") at offset {header_at}"
            )));
        }
        let found = be32(&header, off::CHECKSUM);
        let expected = header_checksum(&header);
        if found != expected {
            return Err(corrupt(format!(
                "the dynamic header's checksum is {found:#010x}, its bytes give {expected:#010x}"
            )));
        }
        let version = be32(&header, off::VERSION);
        if version >> 16 != 1 {
            return Err(corrupt(format!(
                "unknown dynamic header version {version:#010x}"
            )));
        }
        let block_bytes = u64::from(be32(&header, off::BLOCK_SIZE));
        if !block_bytes.is_power_of_two() || block_bytes < PAGE_SIZE {
            return Err(corrupt(format!(
                "block size {block_bytes} is not a power of two of at least 512 bytes"
            )));
        }
        let needed = size.div_ceil(block_bytes);
        let entries = u64::from(be32(&header, off::MAX_TABLE_ENTRIES));
        if entries < needed {
            return Err(corrupt(format!(
                "its block table has {entries} entries, the disk needs {needed}"
            )));
        }
        if needed > MAX_BLOCKS {
            return Err(corrupt(format!(
                "{needed} blocks of {block_bytes} bytes is more than blobdrive reads ({MAX_BLOCKS})"
            )));
        }
        let table_at = be64(&header, off::TABLE_OFFSET);
        let table_end = table_at
            .checked_add(needed * 4)
            .filter(|end| *end <= file_len - VHD_FOOTER_BYTES && table_at >= VHD_FOOTER_BYTES)
            .ok_or_else(|| {
                corrupt(format!(
                    "the block table at offset {table_at} lies outside the file"
                ))
            })?;
        let mut table = vec![0u8; (needed * 4) as usize];
        file.read_exact_at(&mut table, table_at)?;

        // One bit per sector, padded to whole sectors.
        let bitmap_bytes = (block_bytes / PAGE_SIZE).div_ceil(8).div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let data_end = file_len - VHD_FOOTER_BYTES;
        let mut blocks = Vec::with_capacity(needed as usize);
        // (start, end, what) of every region of the file, to find overlaps.
        let mut regions: Vec<(u64, u64, Region)> = vec![
            (0, VHD_FOOTER_BYTES, Region::FooterCopy),
            (header_at, header_at + HEADER_BYTES, Region::Header),
            (table_at, table_end, Region::Table),
        ];
        // Regions that do not overlap add up to at most the file: a table
        // whose allocated blocks add up to more is refused as it is read,
        // before millions of them are listed (every entry pointing at one
        // block would otherwise cost a region each).
        let mut claimed = regions.iter().map(|r| r.1 - r.0).sum::<u64>();
        for (i, raw) in table.chunks_exact(4).enumerate() {
            let sector = u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]);
            if sector == UNALLOCATED {
                blocks.push(None);
                continue;
            }
            let start = u64::from(sector) * PAGE_SIZE;
            // The last block of a disk that is not a whole number of blocks
            // needs only the part that the disk covers.
            let used = block_bytes.min(size - i as u64 * block_bytes);
            let end = start + bitmap_bytes + used;
            if end > data_end {
                return Err(corrupt(format!(
                    "block {i} at offset {start} lies past the end of the file's data ({data_end} bytes)"
                )));
            }
            claimed += end - start;
            if claimed > file_len {
                return Err(corrupt(format!(
                    "its block table allocates more than the file holds (with block {i}, at \
                     offset {start}, its blocks add up to more than its {file_len} bytes): \
                     blocks overlap"
                )));
            }
            regions.push((start, end, Region::Block(i)));
            blocks.push(Some(start));
        }
        regions.sort_by_key(|r| r.0);
        for pair in regions.windows(2) {
            if pair[1].0 < pair[0].1 {
                return Err(corrupt(format!(
                    "{} at offset {} overlaps {}",
                    pair[1].2, pair[1].0, pair[0].2
                )));
            }
        }
        Ok(DynamicVhd {
            file,
            footer: first,
            block_bytes,
            bitmap_bytes,
            blocks,
        })
    }

    /// The footer (the copy at the start, identical in what matters to the
    /// last one): size, unique id, creator.
    pub fn footer(&self) -> &Footer {
        &self.footer
    }

    /// Bytes of the disk.
    pub fn size_bytes(&self) -> u64 {
        self.footer.current_size_bytes
    }

    /// Bytes per block.
    pub fn block_bytes(&self) -> u64 {
        self.block_bytes
    }

    /// Bytes of the disk in allocated blocks (an upper bound of its data).
    pub fn allocated_bytes(&self) -> u64 {
        (0..self.blocks.len() as u64)
            .filter(|b| self.blocks[*b as usize].is_some())
            .map(|b| self.block_range(b).len())
            .sum()
    }

    fn block_range(&self, block: u64) -> ByteRange {
        let start = block * self.block_bytes;
        ByteRange::new(start, (start + self.block_bytes).min(self.size_bytes()))
    }

    fn bitmap(&self, bitmap_at: u64) -> io::Result<Vec<u8>> {
        let mut b = vec![0u8; self.bitmap_bytes as usize];
        self.file.read_exact_at(&mut b, bitmap_at)?;
        Ok(b)
    }

    /// The first run of written sectors at or after `from` and before
    /// `limit` (both clipped to the disk), as a range of the disk: an
    /// allocated block's sectors whose bitmap bits are set. `None` when
    /// there is no more data before `limit`.
    pub fn next_data(&self, from: u64, limit: u64) -> io::Result<Option<ByteRange>> {
        let limit = limit.min(self.size_bytes());
        let mut at = from;
        while at < limit {
            let block = at / self.block_bytes;
            let range = self.block_range(block);
            let Some(bitmap_at) = self.blocks[block as usize] else {
                at = range.end;
                continue;
            };
            let bitmap = self.bitmap(bitmap_at)?;
            let is_set = |sector: u64| bitmap[(sector / 8) as usize] & (0x80 >> (sector % 8)) != 0;
            let end = range.end.min(limit);
            let mut sector = (at - range.start) / PAGE_SIZE;
            let last = (end - range.start).div_ceil(PAGE_SIZE);
            while sector < last && !is_set(sector) {
                sector += 1;
            }
            if sector == last {
                at = range.end;
                continue;
            }
            let run_start = sector;
            while sector < last && is_set(sector) {
                sector += 1;
            }
            let start = (range.start + run_start * PAGE_SIZE).max(from);
            let stop = (range.start + sector * PAGE_SIZE).min(end);
            return Ok(Some(ByteRange::new(start, stop)));
        }
        Ok(None)
    }

    /// Fill `buf` with the disk's bytes at `offset` (sector-aligned, whole
    /// sectors): unallocated blocks, unwritten sectors and bytes past the
    /// disk's end read as zeros.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        debug_assert!(offset % PAGE_SIZE == 0 && buf.len() as u64 % PAGE_SIZE == 0);
        buf.fill(0);
        let end = offset
            .saturating_add(buf.len() as u64)
            .min(self.size_bytes());
        let mut at = offset;
        while at < end {
            let block = at / self.block_bytes;
            let range = self.block_range(block);
            let stop = range.end.min(end);
            if let Some(bitmap_at) = self.blocks[block as usize] {
                let dst = &mut buf[(at - offset) as usize..(stop - offset) as usize];
                let in_block = at - range.start;
                self.file
                    .read_exact_at(dst, bitmap_at + self.bitmap_bytes + in_block)?;
                let bitmap = self.bitmap(bitmap_at)?;
                for (i, sector) in dst.chunks_mut(PAGE_SIZE as usize).enumerate() {
                    let s = in_block / PAGE_SIZE + i as u64;
                    if bitmap[(s / 8) as usize] & (0x80 >> (s % 8)) == 0 {
                        sector.fill(0);
                    }
                }
            }
            at = stop;
        }
        Ok(())
    }
}

fn read_footer(file: &File, at: u64, which: &'static str) -> Result<Footer, Error> {
    let mut b = [0u8; VHD_FOOTER_BYTES as usize];
    file.read_exact_at(&mut b, at)?;
    Footer::parse_any(&b).map_err(|cause| Error::BadFooter { which, cause })
}

/// The refusal of a differencing disk, naming its parent when the header
/// (read best-effort) holds its name.
fn differencing(file: &File, footer: &Footer) -> Error {
    let mut header = [0u8; HEADER_BYTES as usize];
    let name = file
        .read_exact_at(&mut header, footer.data_offset)
        .ok()
        .filter(|()| header[..8] == HEADER_COOKIE)
        .map(|()| parent_name(&header))
        .unwrap_or_default();
    Error::Differencing {
        parent: if name.is_empty() {
            String::new()
        } else {
            format!(" {name}")
        },
    }
}

/// The parent's name from a dynamic header: UTF-16 big-endian at 64, 512
/// bytes, NUL-padded.
fn parent_name(header: &[u8; HEADER_BYTES as usize]) -> String {
    let units: Vec<u16> = header[64..576]
        .chunks_exact(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]))
        .take_while(|u| *u != 0)
        .collect();
    String::from_utf16_lossy(&units)
        .chars()
        .filter(|c| !c.is_control())
        .collect()
}

/// One's complement of the byte sum of the header, its checksum field excluded.
pub fn header_checksum(header: &[u8; HEADER_BYTES as usize]) -> u32 {
    let sum = header
        .iter()
        .enumerate()
        .filter(|(i, _)| !(off::CHECKSUM..off::CHECKSUM + 4).contains(i))
        .fold(0u32, |acc, (_, b)| acc.wrapping_add(u32::from(*b)));
    !sum
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const BLOCK: u64 = 4096;

    /// A dynamic VHD of `size` bytes in 4 KiB blocks (a 512-byte bitmap
    /// each), built by hand: `blocks` maps a block index to its bitmap's
    /// first byte and its data byte (every sector filled with it).
    fn build(size: u64, blocks: &[(u32, u8, u8)]) -> (tempfile::NamedTempFile, u64) {
        let mut footer = Footer::new_fixed(size);
        footer.disk_type = DiskType::Dynamic;
        footer.data_offset = 512;
        let entries = size.div_ceil(BLOCK) as u32;
        let table_at = 512 + HEADER_BYTES;
        let table_bytes = (u64::from(entries) * 4).div_ceil(512) * 512;
        let mut header = [0u8; HEADER_BYTES as usize];
        header[..8].copy_from_slice(&HEADER_COOKIE);
        header[8..16].copy_from_slice(&[0xff; 8]);
        header[16..24].copy_from_slice(&table_at.to_be_bytes());
        header[24..28].copy_from_slice(&0x0001_0000u32.to_be_bytes());
        header[28..32].copy_from_slice(&entries.to_be_bytes());
        header[32..36].copy_from_slice(&(BLOCK as u32).to_be_bytes());
        let sum = header_checksum(&header);
        header[36..40].copy_from_slice(&sum.to_be_bytes());
        let mut table = vec![0xffu8; table_bytes as usize];
        let mut body = Vec::new();
        let first_block = table_at + table_bytes;
        for (n, (index, bitmap0, fill)) in blocks.iter().enumerate() {
            let at = first_block + n as u64 * (512 + BLOCK);
            let i = *index as usize * 4;
            table[i..i + 4].copy_from_slice(&((at / 512) as u32).to_be_bytes());
            let mut bitmap = vec![0u8; 512];
            bitmap[0] = *bitmap0;
            body.extend_from_slice(&bitmap);
            body.extend(std::iter::repeat_n(*fill, BLOCK as usize));
        }
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        let footer = footer.to_bytes();
        for part in [&footer[..], &header[..], &table[..], &body[..], &footer[..]] {
            f.write_all(part).expect("write");
        }
        f.flush().expect("flush");
        (f, table_at)
    }

    fn open(f: &tempfile::NamedTempFile) -> Result<DynamicVhd, Error> {
        DynamicVhd::open(File::open(f.path()).expect("open"))
    }

    #[test]
    fn only_written_sectors_of_allocated_blocks_are_data() {
        // Block 1: sectors 0 and 2-3 written (bits 7, 5, 4); block 3 full.
        let (f, _) = build(5 * BLOCK, &[(1, 0b1011_0000, 0xaa), (3, 0xff, 0xbb)]);
        let vhd = open(&f).expect("valid");
        assert_eq!(vhd.size_bytes(), 5 * BLOCK);
        assert_eq!(vhd.allocated_bytes(), 2 * BLOCK);
        let mut runs = Vec::new();
        let mut at = 0;
        while let Some(r) = vhd.next_data(at, 5 * BLOCK).expect("next") {
            runs.push((r.start, r.end));
            at = r.end;
        }
        assert_eq!(
            runs,
            vec![
                (BLOCK, BLOCK + 512),
                (BLOCK + 1024, BLOCK + 2048),
                (3 * BLOCK, 4 * BLOCK)
            ]
        );
        let mut buf = vec![1u8; 3 * BLOCK as usize];
        vhd.read_at(&mut buf, BLOCK).expect("read");
        assert!(buf[..512].iter().all(|b| *b == 0xaa));
        assert!(buf[512..1024].iter().all(|b| *b == 0), "unwritten sector");
        assert!(buf[1024..2048].iter().all(|b| *b == 0xaa));
        assert!(buf[2048..2 * BLOCK as usize].iter().all(|b| *b == 0));
        assert!(buf[2 * BLOCK as usize..].iter().all(|b| *b == 0xbb));
        // Past the disk's end reads as zeros (the padding of --pad).
        let mut tail = vec![1u8; 1024];
        vhd.read_at(&mut tail, 5 * BLOCK - 512).expect("read");
        assert!(tail.iter().all(|b| *b == 0));
    }

    #[test]
    fn corrupt_structures_are_refused_with_what_is_wrong() {
        let (f, table_at) = build(4 * BLOCK, &[(0, 0xff, 1), (2, 0xff, 2)]);
        let reopen = |patch: &dyn Fn(&File)| {
            let copy = tempfile::NamedTempFile::new().expect("temp");
            std::fs::copy(f.path(), copy.path()).expect("copy");
            patch(&File::options().write(true).open(copy.path()).expect("open"));
            open(&copy).expect_err("corrupt").to_string()
        };
        let past_end = reopen(&|w| {
            w.write_all_at(&0x00ff_0000u32.to_be_bytes(), table_at)
                .unwrap()
        });
        assert!(past_end.contains("block 0 at offset"), "{past_end}");
        // Block 2 pointed at block 0's place.
        let mut first = [0u8; 4];
        File::open(f.path())
            .unwrap()
            .read_exact_at(&mut first, table_at)
            .unwrap();
        let overlap = reopen(&|w| w.write_all_at(&first, table_at + 8).unwrap());
        assert!(overlap.contains("overlaps block"), "{overlap}");
        // Every entry at block 0's place: refused at the first entry that
        // claims more than the file holds, not after listing them all.
        let all = reopen(&|w| w.write_all_at(&first.repeat(4), table_at).unwrap());
        assert!(all.contains("allocates more than the file holds"), "{all}");
        let header = reopen(&|w| w.write_all_at(b"\x07", 512 + 600).unwrap());
        assert!(header.contains("dynamic header's checksum"), "{header}");
        let table = reopen(&|w| w.write_all_at(&[0, 0, 0, 1], 512 + 28).unwrap());
        assert!(table.contains("header's checksum"), "{table}");
        let footer = reopen(&|w| w.write_all_at(b"x", 30).unwrap());
        assert!(footer.contains("the first footer"), "{footer}");
        let len = std::fs::metadata(f.path()).unwrap().len();
        let last = reopen(&|w| w.set_len(len - 100).unwrap());
        assert!(last.contains("the last footer"), "{last}");
    }
}
