//! The MBR (DOS) partition table: four primary entries in sector 0 and, behind
//! an extended partition, a chain of extended boot records (EBRs) each holding
//! one logical partition and a link to the next.
//!
//! Numbering follows Linux: primary entries are 1-4 by slot (empty slots leave
//! gaps), logical partitions are 5, 6, ... in chain order. A chain that loops,
//! leaves its extended partition, or runs longer than [`MAX_LOGICAL`] is
//! corrupt.

use super::{le, DiskReader, Error, Partition, PartitionType, Table, TableKind, SECTOR_BYTES};

/// Byte offset of the first of the four partition entries.
const ENTRIES_AT: usize = 446;
/// Size of one partition entry.
const ENTRY_BYTES: usize = 16;
/// Logical partitions followed before the chain is called corrupt (Linux
/// stops at 256 partitions in all).
pub const MAX_LOGICAL: usize = 252;

/// True when the sector ends in the 0x55 0xAA boot signature.
pub fn has_boot_signature(sector: &[u8]) -> bool {
    sector.get(510..512) == Some(&[0x55, 0xAA])
}

/// True for a protective MBR: the signature and an entry of type 0xEE (GPT).
pub fn is_protective(sector: &[u8]) -> bool {
    has_boot_signature(sector) && (0..4).any(|i| entry(sector, i).is_some_and(|e| e.kind == 0xEE))
}

/// One raw entry: status, type, first sector and length in sectors.
#[derive(Debug, Clone, Copy)]
struct Entry {
    status: u8,
    kind: u8,
    start_sectors: u64,
    len_sectors: u64,
}

impl Entry {
    fn is_empty(&self) -> bool {
        self.kind == 0 || self.len_sectors == 0
    }
}

fn entry(sector: &[u8], index: usize) -> Option<Entry> {
    let at = ENTRIES_AT + index * ENTRY_BYTES;
    let raw = sector.get(at..at + ENTRY_BYTES)?;
    Some(Entry {
        status: raw[0],
        kind: raw[4],
        start_sectors: le(raw, 8, 4)?,
        len_sectors: le(raw, 12, 4)?,
    })
}

/// Reads the MBR in `sector0` (which has the boot signature) and the logical
/// partitions behind its extended partition. `Ok(None)` when sector 0 is boot
/// code with a signature but no valid table (status bytes other than 0/0x80).
pub fn read(disk: &mut dyn DiskReader, sector0: &[u8]) -> Result<Option<Table>, Error> {
    let disk_sectors = disk.size_bytes() / SECTOR_BYTES;
    let entries: Vec<Entry> = (0..4).filter_map(|i| entry(sector0, i)).collect();
    if entries.iter().any(|e| e.status != 0 && e.status != 0x80) {
        return Ok(None);
    }
    let mut partitions = Vec::new();
    let mut extended = None;
    for (slot, e) in entries.iter().enumerate() {
        if e.is_empty() {
            continue;
        }
        let number = slot as u32 + 1;
        let p = partition(number, e.start_sectors, e.len_sectors, e.kind, disk_sectors)?;
        if p.kind.is_extended() {
            if extended.is_some() {
                return Err(corrupt("it has two extended partitions"));
            }
            extended = Some((e.start_sectors, e.len_sectors));
        }
        partitions.push(p);
    }
    check_overlaps(&partitions)?;
    if let Some((start, len)) = extended {
        let logical = read_logical(disk, start, len, disk_sectors)?;
        check_overlaps(&logical)?;
        partitions.extend(logical);
    }
    Ok(Some(Table {
        kind: TableKind::Mbr,
        disk_id: format!("0x{:08x}", le(sector0, 440, 4).unwrap_or(0)),
        partitions,
        warnings: Vec::new(),
        metadata_end_bytes: SECTOR_BYTES,
    }))
}

/// Follows the EBR chain of the extended partition at `ext_start` (sectors).
fn read_logical(
    disk: &mut dyn DiskReader,
    ext_start: u64,
    ext_len: u64,
    disk_sectors: u64,
) -> Result<Vec<Partition>, Error> {
    let ext_end = ext_start + ext_len;
    let mut out = Vec::new();
    let mut ebr = ext_start;
    let mut seen = std::collections::HashSet::new();
    loop {
        if !seen.insert(ebr) || out.len() >= MAX_LOGICAL {
            return Err(corrupt("its chain of logical partitions loops"));
        }
        if ebr >= ext_end {
            return Err(corrupt(&format!(
                "a logical partition's boot record (sector {ebr}) lies outside the extended partition"
            )));
        }
        let sector = disk.read_at(ebr * SECTOR_BYTES, SECTOR_BYTES as usize)?;
        if !has_boot_signature(&sector) {
            // An extended partition with no logical ones is all zeros here.
            if out.is_empty() && sector.iter().all(|&b| b == 0) {
                return Ok(out);
            }
            return Err(corrupt(&format!(
                "the boot record of logical partition {} (sector {ebr}) has no signature",
                out.len() + 5
            )));
        }
        let (Some(this), Some(next)) = (entry(&sector, 0), entry(&sector, 1)) else {
            return Err(corrupt("a logical partition's boot record is cut short"));
        };
        if !this.is_empty() {
            let number = out.len() as u32 + 5;
            let start = ebr + this.start_sectors;
            let p = partition(number, start, this.len_sectors, this.kind, disk_sectors)?;
            if start + this.len_sectors > ext_end {
                return Err(corrupt(&format!(
                    "logical partition {number} ends past the end of its extended partition"
                )));
            }
            out.push(p);
        }
        if next.is_empty() {
            return Ok(out);
        }
        ebr = ext_start + next.start_sectors;
    }
}

/// A checked partition: inside the disk, not empty.
fn partition(
    number: u32,
    start_sectors: u64,
    len_sectors: u64,
    kind: u8,
    disk_sectors: u64,
) -> Result<Partition, Error> {
    let end = start_sectors + len_sectors;
    if start_sectors == 0 {
        return Err(Error::Corrupt(format!(
            "corrupt MBR partition table: partition {number} starts at sector 0, over the partition table itself"
        )));
    }
    if end > disk_sectors {
        return Err(Error::Corrupt(format!(
            "corrupt MBR partition table: partition {number} (sectors {start_sectors}-{}) ends past the end of the disk \
             ({disk_sectors} sectors)",
            end.saturating_sub(1)
        )));
    }
    Ok(Partition {
        number,
        start_bytes: start_sectors * SECTOR_BYTES,
        size_bytes: len_sectors * SECTOR_BYTES,
        kind: PartitionType::Mbr(kind),
        label: None,
        uuid: None,
    })
}

/// Two partitions that share a sector make the table unusable.
pub(super) fn check_overlaps(parts: &[Partition]) -> Result<(), Error> {
    let mut sorted: Vec<&Partition> = parts.iter().collect();
    sorted.sort_by_key(|p| p.start_bytes);
    for pair in sorted.windows(2) {
        if pair[1].start_bytes < pair[0].end_bytes() {
            return Err(Error::Corrupt(format!(
                "partitions {} and {} overlap",
                pair[0].number, pair[1].number
            )));
        }
    }
    Ok(())
}

fn corrupt(what: &str) -> Error {
    Error::Corrupt(format!("corrupt MBR partition table: {what}"))
}
