//! A drive's layout as `info` shows it and `mount` chooses from: the table
//! (if any), each partition with what its first bytes hold, or what the whole
//! disk holds, and whether the disk is empty where tables and filesystems
//! keep their marks.

use super::probe::{self, Filesystem};
use super::{read_table, DiskReader, Error, Partition, Table};
use crate::units::MIB;

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
}

/// True when `len` bytes at `offset` (clipped to the disk) are all zeros.
fn is_zero(disk: &mut dyn DiskReader, offset: u64, len: u64) -> Result<bool, Error> {
    let len = len.min(disk.size_bytes().saturating_sub(offset));
    let data = disk.read_at(offset, len as usize)?;
    Ok(data.iter().all(|&b| b == 0))
}
