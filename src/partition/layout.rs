//! A drive's layout as `info` shows it, `mount` chooses from and a shrink
//! checks: the table (if any), each partition with what its first bytes
//! hold, or what the whole disk holds, and whether the disk is empty where
//! tables and filesystems keep their marks. This is the project's one
//! layout detector: the partition table is looked at first, so a stale
//! whole-disk superblock left in the gap before the first partition never
//! hides a table.

use super::probe::{self, Filesystem};
use super::{read_table, DiskReader, Error, Partition, Table, TableKind, SECTOR_BYTES};
use crate::units::{format_size, MIB};

/// Bytes per sector of the 4K-native disks whose tables blobdrive refuses.
const NATIVE_4K_BYTES: u64 = 4096;

/// One partition and what was found at its start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionInfo {
    /// The table entry.
    pub partition: Partition,
    /// The filesystem or volume at its start, if recognised.
    pub filesystem: Option<Filesystem>,
}

/// What a drive holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Disk size in bytes.
    pub disk_bytes: u64,
    /// The partition table (its `partitions` are repeated, probed, in `parts`).
    pub table: Option<Table>,
    /// The partitions with what each holds, by number.
    pub parts: Vec<PartitionInfo>,
    /// What the whole disk holds when it has no table.
    pub whole: Option<Filesystem>,
    /// True when the first MiB and the last MiB are all zeros (no table, no
    /// superblock, no backup GPT): the only case in which blobdrive suggests
    /// making a filesystem.
    pub empty: bool,
}

impl Layout {
    /// Reads the table, probes every partition (or the whole disk).
    pub fn read(disk: &mut dyn DiskReader) -> Result<Layout, Error> {
        let disk_bytes = disk.size_bytes();
        let table = read_table(disk)?;
        let mut parts = Vec::new();
        let (mut whole, mut empty) = (None, false);
        match &table {
            Some(t) => {
                for p in &t.partitions {
                    let filesystem = if p.kind.is_extended() {
                        None
                    } else {
                        probe::probe(disk, p.start_bytes, p.size_bytes)?
                    };
                    parts.push(PartitionInfo {
                        partition: p.clone(),
                        filesystem,
                    });
                }
                parts.sort_by_key(|p| p.partition.number);
                if t.kind == TableKind::Mbr {
                    check_not_4k(disk, &parts)?;
                }
            }
            None => {
                whole = probe::probe(disk, 0, disk_bytes)?;
                if whole.is_none() {
                    empty = is_zero(disk, 0, MIB)?
                        && is_zero(disk, disk_bytes.saturating_sub(MIB), MIB)?;
                }
            }
        }
        Ok(Layout {
            disk_bytes,
            table,
            parts,
            whole,
            empty,
        })
    }

    /// The partition numbered `number`.
    pub fn part(&self, number: u32) -> Option<&PartitionInfo> {
        self.parts.iter().find(|p| p.partition.number == number)
    }

    /// How far what the drive holds reaches, for a shrink: with a table,
    /// its partitions and its own structures, whatever a stale superblock in
    /// the first sectors says; without one, the whole disk's ext4 or XFS by
    /// its superblock. None when nothing measurable is there (unknown bytes,
    /// or a filesystem whose size is not read).
    pub fn reach(&self) -> Option<Reach> {
        let Some(table) = &self.table else {
            let fs = self.whole.as_ref()?;
            return Some(Reach {
                end_bytes: fs.size_bytes?,
                what: format!("the {} filesystem", fs.kind.name()),
                before_shrinking: "shrink the filesystem first",
            });
        };
        let mut last = match table.kind {
            TableKind::Gpt => Reach {
                end_bytes: table.metadata_end_bytes,
                what: "the GPT's backup header (or the end of its usable area)".into(),
                before_shrinking: "blobdrive does not move a GPT's backup header inward, so the \
                                   drive cannot shrink past it",
            },
            TableKind::Mbr => Reach {
                end_bytes: table.metadata_end_bytes,
                what: "the MBR".into(),
                before_shrinking: "",
            },
        };
        for p in &self.parts {
            if p.partition.end_bytes() > last.end_bytes {
                last = Reach {
                    end_bytes: p.partition.end_bytes(),
                    what: format!("partition {}", describe(p)),
                    before_shrinking: "shrink what it holds, then the partition, first",
                };
            }
        }
        Some(last)
    }
}

/// What ends last on a drive ([`Layout::reach`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reach {
    /// One past its last byte.
    pub end_bytes: u64,
    /// What it is, for a message: `partition 1 (Linux, 1.0 GiB, ext4)`,
    /// `the ext4 filesystem`, `the GPT's backup header (...)`.
    pub what: String,
    /// What to do before a shrink past it could be allowed.
    pub before_shrinking: &'static str,
}

/// Refuses an MBR written for 4096-byte sectors. Its entries count in
/// 4 KiB sectors, so read with the 512-byte sectors of a VHD every partition
/// would sit at an eighth of its place: nothing is found where the entries
/// point, and something is found eight times further in. Such a table is
/// refused (never attached or measured 8x short); one where any partition
/// holds something at its 512-byte place is read as it is.
fn check_not_4k(disk: &mut dyn DiskReader, parts: &[PartitionInfo]) -> Result<(), Error> {
    let scale = NATIVE_4K_BYTES / SECTOR_BYTES;
    let primary: Vec<&PartitionInfo> = parts
        .iter()
        .filter(|p| !p.partition.kind.is_extended())
        .collect();
    if primary.iter().any(|p| p.filesystem.is_some()) {
        return Ok(());
    }
    for p in primary {
        let (Some(start), Some(size)) = (
            p.partition.start_bytes.checked_mul(scale),
            p.partition.size_bytes.checked_mul(scale),
        ) else {
            continue;
        };
        if start
            .checked_add(size)
            .is_none_or(|end| end > disk.size_bytes())
        {
            continue;
        }
        if let Some(fs) = probe::probe(disk, start, size)? {
            return Err(Error::Corrupt(format!(
                "the MBR partition table counts in 4096-byte sectors (partition {} holds {} at \
                 byte {start} = sector {} × 4096, and nothing at sector {} × 512); blobdrive drives \
                 have 512-byte sectors, so it is not read: copy the data to a drive whose table \
                 was made for 512-byte sectors",
                p.partition.number,
                fs.kind.name(),
                p.partition.start_bytes / SECTOR_BYTES,
                p.partition.start_bytes / SECTOR_BYTES,
            )));
        }
    }
    Ok(())
}

/// True when `len` bytes at `offset` (clipped to the disk) are all zeros.
fn is_zero(disk: &mut dyn DiskReader, offset: u64, len: u64) -> Result<bool, Error> {
    let len = len.min(disk.size_bytes().saturating_sub(offset));
    let data = disk.read_at(offset, len as usize)?;
    Ok(data.iter().all(|&b| b == 0))
}

/// One partition for a message: number, type, size and content.
pub fn describe(p: &PartitionInfo) -> String {
    let part = &p.partition;
    format!(
        "{} ({}, {}, {})",
        part.number,
        part.kind.name(),
        format_size(part.size_bytes),
        describe_fs(p.filesystem.as_ref())
    )
}

/// `ext4 'label'`, or `no filesystem recognised`.
pub fn describe_fs(fs: Option<&Filesystem>) -> String {
    match fs {
        None => "no filesystem recognised".into(),
        Some(f) => match &f.label {
            Some(l) => format!("{} '{l}'", f.kind.name()),
            None => f.kind.name().to_string(),
        },
    }
}
