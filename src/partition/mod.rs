//! What a drive holds before any filesystem is mounted: its partition table
//! (MBR with extended/logical partitions, or GPT), the filesystem or volume
//! found at the start of each partition (or of the whole disk), and the choice
//! of what `blobdrive mount` attaches.
//!
//! Everything here parses bytes read through [`DiskReader`]; it knows nothing
//! of blobs, FUSE or loop devices, so the same code reads a blob (for `info`
//! and `mount`) and an in-memory image (in tests). The on-disk facts it relies
//! on, with their sources, are in `docs/partitions.md`.
//!
//! Invariants: no input makes a parser panic or read outside the disk (every
//! offset is checked against the disk size before it is read, and every slice
//! is taken with bounds checks); a table that does not add up (checksums,
//! partitions past the disk end, overlaps, loops in the logical chain) is an
//! [`Error::Corrupt`] with one line saying what is wrong, never a guess.

pub mod choose;
pub mod gpt;
pub mod layout;
pub mod mbr;
pub mod probe;
mod types;

#[cfg(test)]
mod tests;

pub use choose::{Choice, Selector};
pub use layout::{Layout, PartitionInfo, Reach};
pub use probe::{Filesystem, FsKind};
pub use types::LINUX_FILESYSTEM_GUID;

/// The sector size partition tables count in. Drives are VHDs, whose sector is
/// always 512 bytes; 4K-sector tables are not read.
pub const SECTOR_BYTES: u64 = 512;

/// Where the GPT header of a disk with 4096-byte sectors lies (its sector 1):
/// found there, the table is refused rather than read with the wrong sector.
const NATIVE_4K_GPT_AT: u64 = 4096;

/// Random access to a disk's bytes.
pub trait DiskReader {
    /// The disk's size in bytes.
    fn size_bytes(&self) -> u64;
    /// Reads exactly `len` bytes at `offset_bytes`; callers never ask past the end.
    fn read_at(&mut self, offset_bytes: u64, len: usize) -> std::io::Result<Vec<u8>>;
}

/// A disk image held in memory (tests, and small images).
impl DiskReader for &[u8] {
    fn size_bytes(&self) -> u64 {
        self.len() as u64
    }

    fn read_at(&mut self, offset_bytes: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let start = usize::try_from(offset_bytes).map_err(std::io::Error::other)?;
        start
            .checked_add(len)
            .and_then(|end| self.get(start..end))
            .map(<[u8]>::to_vec)
            .ok_or_else(|| std::io::Error::other("read past the end of the image"))
    }
}

/// A local file (a drive file under a FUSE mount, or an image).
pub struct FileDisk {
    file: std::fs::File,
    size_bytes: u64,
}

impl FileDisk {
    /// Opens `path` read-only; its size is the file's length.
    pub fn open(path: &std::path::Path) -> std::io::Result<FileDisk> {
        let file = std::fs::File::open(path)?;
        let size_bytes = file.metadata()?.len();
        Ok(FileDisk { file, size_bytes })
    }
}

impl DiskReader for FileDisk {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_at(&mut self, offset_bytes: u64, len: usize) -> std::io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0u8; len];
        self.file.read_exact_at(&mut buf, offset_bytes)?;
        Ok(buf)
    }
}

/// Why a disk's layout could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The table is there but does not add up; the text says what is wrong.
    #[error("{0}")]
    Corrupt(String),
    /// Reading the disk failed.
    #[error("cannot read the disk: {0}")]
    Io(#[from] std::io::Error),
}

/// The kind of partition table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TableKind {
    /// The classic DOS/MBR table (4 primary entries, logical ones in a chain).
    Mbr,
    /// The GUID partition table (behind a protective MBR).
    Gpt,
}

impl TableKind {
    /// `MBR` or `GPT`.
    pub fn name(self) -> &'static str {
        match self {
            TableKind::Mbr => "MBR",
            TableKind::Gpt => "GPT",
        }
    }
}

/// A partition's type as the table stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionType {
    /// An MBR type byte (0x83 Linux, 0x05 extended, ...).
    Mbr(u8),
    /// A GPT type GUID.
    Gpt(uuid::Uuid),
}

impl PartitionType {
    /// The id as tools print it: `0x83`, or the GUID in upper case.
    pub fn id(&self) -> String {
        match self {
            PartitionType::Mbr(b) => format!("0x{b:02x}"),
            PartitionType::Gpt(g) => g.hyphenated().to_string().to_uppercase(),
        }
    }

    /// A person's name for the type (`Linux filesystem`, `EFI System`, ...).
    pub fn name(&self) -> &'static str {
        types::name(self)
    }

    /// True for types that hold a Linux data or root filesystem.
    pub fn is_linux_data(&self) -> bool {
        types::is_linux_data(self)
    }

    /// True for GPT "Microsoft basic data", the type some tools give Linux
    /// data partitions too (what it holds tells).
    pub fn is_basic_data(&self) -> bool {
        *self == PartitionType::Gpt(types::BASIC_DATA_GUID)
    }

    /// True for an MBR extended partition (a container of logical ones).
    pub fn is_extended(&self) -> bool {
        matches!(self, PartitionType::Mbr(0x05 | 0x0f | 0x85))
    }
}

/// One entry of a partition table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// The number Linux gives it (`sda1` is 1; MBR logical ones start at 5).
    pub number: u32,
    /// First byte on the disk.
    pub start_bytes: u64,
    /// Length in bytes.
    pub size_bytes: u64,
    /// Its type.
    pub kind: PartitionType,
    /// The GPT partition name (None on MBR, or when empty).
    pub label: Option<String>,
    /// The GPT unique partition GUID (None on MBR).
    pub uuid: Option<String>,
}

impl Partition {
    /// One past its last byte.
    pub fn end_bytes(&self) -> u64 {
        self.start_bytes + self.size_bytes
    }
}

/// A partition table: its kind, the disk id, the partitions (by number).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// MBR or GPT.
    pub kind: TableKind,
    /// The GPT disk GUID, or the MBR disk signature as `0x1234abcd`.
    pub disk_id: String,
    /// The partitions, sorted by number.
    pub partitions: Vec<Partition>,
    /// Things that are off but do not stop the table being used (a missing
    /// backup GPT header after a resize, for example).
    pub warnings: Vec<String>,
    /// One past the last byte the table's own structures claim: for a GPT,
    /// its backup header (where the header in use says it is) and the end of
    /// its usable area; for an MBR, sector 0 (its logical partitions' boot
    /// records lie inside the extended partition). A shrink must not cut it.
    pub metadata_end_bytes: u64,
}

/// Reads the table of `disk`: `Ok(None)` when the disk has none (its first
/// sector is not an MBR, or holds a filesystem's boot sector instead).
pub fn read_table(disk: &mut dyn DiskReader) -> Result<Option<Table>, Error> {
    if disk.size_bytes() < 2 * SECTOR_BYTES {
        return Ok(None);
    }
    let sector0 = disk.read_at(0, SECTOR_BYTES as usize)?;
    let sector1 = disk.read_at(SECTOR_BYTES, SECTOR_BYTES as usize)?;
    if gpt::has_signature(&sector1) || mbr::is_protective(&sector0) {
        if !gpt::has_signature(&sector1) && disk.size_bytes() >= NATIVE_4K_GPT_AT + SECTOR_BYTES {
            let sector8 = disk.read_at(NATIVE_4K_GPT_AT, SECTOR_BYTES as usize)?;
            if gpt::has_signature(&sector8) {
                return Err(Error::Corrupt(
                    "the GPT is laid out for 4096-byte sectors (its header is at byte 4096, not \
                     512); blobdrive drives have 512-byte sectors, so it is not read: copy the \
                     data to a drive whose table was made for 512-byte sectors"
                        .into(),
                ));
            }
        }
        return gpt::read(disk).map(Some);
    }
    if !mbr::has_boot_signature(&sector0) || probe::is_boot_sector_of_filesystem(&sector0) {
        return Ok(None);
    }
    mbr::read(disk, &sector0)
}

/// Reads a little-endian integer of `N` bytes at `at` (None when out of bounds).
pub(crate) fn le(buf: &[u8], at: usize, n: usize) -> Option<u64> {
    let bytes = buf.get(at..at.checked_add(n)?)?;
    Some(
        bytes
            .iter()
            .rev()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)),
    )
}
