//! The GUID partition table: a header in sector 1 (checked by its CRC32), an
//! array of partition entries (checked by the header's CRC32 of it), and a
//! backup header with its own copy of the array in the last sectors of the disk.
//!
//! The primary copy is used when it is sound; when it is not, the backup is,
//! with a warning (as the kernel and fdisk do). When both are unsound the table
//! is corrupt. A missing or unsound backup beside a sound primary is only a
//! warning: a drive grown with `resize` has its backup in the middle of the
//! disk until a tool moves it. Entries may come in any order (Ubuntu's cloud
//! images put partition 1 last on the disk, after 14 and 15).

use uuid::Uuid;

use super::{le, mbr, DiskReader, Error, Partition, PartitionType, Table, TableKind, SECTOR_BYTES};

/// "EFI PART", the header's first eight bytes.
const SIGNATURE: &[u8; 8] = b"EFI PART";
/// Smallest header (the UEFI spec's 92 bytes).
const MIN_HEADER_BYTES: u64 = 92;
/// Entries read at most (the usual array holds 128); more is corrupt.
const MAX_ENTRIES: u64 = 4096;
/// Largest entry size accepted (128 is the norm; a power of two ≥ 128).
const MAX_ENTRY_BYTES: u64 = 4096;
/// Largest entry array read: 4096 entries of the usual 128 bytes. A header
/// asking for more (4096 entries of 4096 bytes would be 16 MiB, fetched from
/// the blob) is corrupt, not a reason to read that much.
const MAX_ARRAY_BYTES: u64 = MAX_ENTRIES * 128;

/// True when the sector starts with the GPT header signature.
pub fn has_signature(sector: &[u8]) -> bool {
    sector.get(..8) == Some(SIGNATURE.as_slice())
}

/// The fields of one header that the rest needs.
#[derive(Debug, Clone)]
struct Header {
    my_lba: u64,
    alternate_lba: u64,
    first_usable: u64,
    last_usable: u64,
    disk_guid: Uuid,
    entries_lba: u64,
    entry_count: u64,
    entry_bytes: u64,
    entries_crc: u32,
}

/// Reads the table (primary, else backup) of a disk whose sector 1 carries
/// the GPT signature or whose MBR is protective.
pub fn read(disk: &mut dyn DiskReader) -> Result<Table, Error> {
    let disk_sectors = disk.size_bytes() / SECTOR_BYTES;
    // No room for a header in sector 1 and a backup after it: no GPT.
    if disk_sectors < 3 {
        return Err(Error::Corrupt(format!(
            "corrupt GPT: a disk of {disk_sectors} sectors cannot hold one"
        )));
    }
    let last_lba = disk_sectors - 1;
    let primary = read_copy(disk, 1);
    let (header, parts, mut warnings) = match primary {
        Ok((h, parts)) => {
            let mut warnings = Vec::new();
            match read_copy(disk, h.alternate_lba) {
                Ok(_) if h.alternate_lba == last_lba => {}
                Ok(_) => warnings.push(format!(
                    "the backup GPT header is at sector {} instead of the last one ({last_lba}), \
                     as after growing the disk; 'sfdisk --relocate gpt-bak-std' moves it",
                    h.alternate_lba
                )),
                Err(why) => warnings.push(format!("the backup GPT is unusable ({why})")),
            }
            (h, parts, warnings)
        }
        Err(primary_why) => match read_copy(disk, last_lba) {
            Ok((h, parts)) => (
                h,
                parts,
                vec![format!(
                    "the primary GPT is unusable ({primary_why}); the backup at the end of the \
                     disk was used"
                )],
            ),
            Err(backup_why) => {
                return Err(Error::Corrupt(format!(
                    "corrupt GPT: {primary_why}, and the backup: {backup_why}"
                )))
            }
        },
    };
    if let Some(w) = protective_mbr_warning(disk)? {
        warnings.push(w);
    }
    Ok(Table {
        kind: TableKind::Gpt,
        disk_id: header.disk_guid.hyphenated().to_string().to_uppercase(),
        partitions: parts,
        warnings,
        metadata_end_bytes: (header
            .my_lba
            .max(header.alternate_lba)
            .max(header.last_usable))
        .saturating_add(1)
        .saturating_mul(SECTOR_BYTES),
    })
}

/// A hybrid or missing protective MBR is noted, not refused.
fn protective_mbr_warning(disk: &mut dyn DiskReader) -> Result<Option<String>, Error> {
    let sector0 = disk.read_at(0, SECTOR_BYTES as usize)?;
    Ok((!mbr::is_protective(&sector0)).then(|| {
        "sector 0 holds no protective MBR (tools that only know MBR may overwrite the GPT)"
            .to_string()
    }))
}

/// Reads and checks the header at `lba` and its entry array.
fn read_copy(disk: &mut dyn DiskReader, lba: u64) -> Result<(Header, Vec<Partition>), String> {
    let disk_sectors = disk.size_bytes() / SECTOR_BYTES;
    if lba == 0 || lba >= disk_sectors {
        return Err(format!(
            "its header would be at sector {lba}, outside the disk"
        ));
    }
    let sector = disk
        .read_at(lba * SECTOR_BYTES, SECTOR_BYTES as usize)
        .map_err(|e| e.to_string())?;
    let header = parse_header(&sector, lba, disk_sectors)?;
    // Bounded by parse_header (at most MAX_ARRAY_BYTES).
    let array_bytes = header.entry_count * header.entry_bytes;
    // The array starts after the protective MBR and lies wholly inside the
    // disk; an LBA whose byte offset overflows is as far outside as any.
    let array_at = header
        .entries_lba
        .checked_mul(SECTOR_BYTES)
        .filter(|_| header.entries_lba != 0)
        .filter(|at| {
            at.checked_add(array_bytes)
                .is_some_and(|end| end <= disk_sectors * SECTOR_BYTES)
        })
        .ok_or_else(|| {
            format!(
                "its partition entries (at sector {}) run past the end of the disk",
                header.entries_lba
            )
        })?;
    let array = disk
        .read_at(array_at, array_bytes as usize)
        .map_err(|e| e.to_string())?;
    if crc32fast::hash(&array) != header.entries_crc {
        return Err("the checksum of its partition entries does not match".into());
    }
    let parts = parse_entries(&array, &header, disk_sectors)?;
    Ok((header, parts))
}

fn parse_header(sector: &[u8], lba: u64, disk_sectors: u64) -> Result<Header, String> {
    if !has_signature(sector) {
        return Err(format!("no GPT header signature at sector {lba}"));
    }
    let field = |at: usize, n: usize| le(sector, at, n).unwrap_or(0);
    let header_bytes = field(12, 4);
    if !(MIN_HEADER_BYTES..=SECTOR_BYTES).contains(&header_bytes) {
        return Err(format!(
            "its header size ({header_bytes} bytes) is impossible"
        ));
    }
    let mut copy = sector[..header_bytes as usize].to_vec();
    copy[16..20].fill(0);
    if crc32fast::hash(&copy) != field(16, 4) as u32 {
        return Err(format!(
            "the header checksum at sector {lba} does not match"
        ));
    }
    let h = Header {
        my_lba: field(24, 8),
        alternate_lba: field(32, 8),
        first_usable: field(40, 8),
        last_usable: field(48, 8),
        disk_guid: guid(&sector[56..72]),
        entries_lba: field(72, 8),
        entry_count: field(80, 4),
        entry_bytes: field(84, 4),
        entries_crc: field(88, 4) as u32,
    };
    if h.my_lba != lba {
        return Err(format!(
            "the header at sector {lba} says it is at sector {}",
            h.my_lba
        ));
    }
    if h.first_usable > h.last_usable || h.last_usable >= disk_sectors {
        return Err(format!(
            "its usable area (sectors {}-{}) does not fit the disk ({disk_sectors} sectors)",
            h.first_usable, h.last_usable
        ));
    }
    if h.entry_count > MAX_ENTRIES
        || h.entry_bytes < 128
        || h.entry_bytes > MAX_ENTRY_BYTES
        || !h.entry_bytes.is_power_of_two()
        || h.entry_count * h.entry_bytes > MAX_ARRAY_BYTES
    {
        return Err(format!(
            "its entry array ({} entries of {} bytes) is impossible",
            h.entry_count, h.entry_bytes
        ));
    }
    Ok(h)
}

fn parse_entries(
    array: &[u8],
    header: &Header,
    disk_sectors: u64,
) -> Result<Vec<Partition>, String> {
    let mut parts = Vec::new();
    for (index, raw) in array.chunks_exact(header.entry_bytes as usize).enumerate() {
        let kind = guid(&raw[0..16]);
        if kind.is_nil() {
            continue;
        }
        let number = index as u32 + 1;
        let first = le(raw, 32, 8).unwrap_or(0);
        let last = le(raw, 40, 8).unwrap_or(0);
        if last >= disk_sectors {
            return Err(format!(
                "partition {number} (sectors {first}-{last}) ends past the end of the disk \
                 ({disk_sectors} sectors)"
            ));
        }
        if first > last || first < header.first_usable || last > header.last_usable {
            return Err(format!(
                "partition {number} (sectors {first}-{last}) lies outside the usable area \
                 (sectors {}-{})",
                header.first_usable, header.last_usable
            ));
        }
        let name: Vec<u16> = raw[56..128]
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .take_while(|&u| u != 0)
            .collect();
        let label = String::from_utf16_lossy(&name);
        parts.push(Partition {
            number,
            start_bytes: first * SECTOR_BYTES,
            size_bytes: (last - first + 1) * SECTOR_BYTES,
            kind: PartitionType::Gpt(kind),
            label: (!label.is_empty()).then_some(label),
            uuid: Some(guid(&raw[16..32]).hyphenated().to_string()),
        });
    }
    super::mbr::check_overlaps(&parts).map_err(|e| e.to_string())?;
    Ok(parts)
}

/// A GUID as GPT stores it: the first three fields little-endian.
fn guid(bytes: &[u8]) -> Uuid {
    let mut b = [0u8; 16];
    b.copy_from_slice(&bytes[..16]);
    Uuid::from_bytes_le(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A disk of `sectors` whose primary header (sector 1) is sound but for
    /// the fields `patch` sets (its checksum made to match), with no backup.
    fn disk_with_primary(sectors: u64, patch: impl Fn(&mut [u8])) -> Vec<u8> {
        let mut img = vec![0u8; (sectors * SECTOR_BYTES) as usize];
        let h = &mut img[512..1024];
        h[..8].copy_from_slice(SIGNATURE);
        h[8..12].copy_from_slice(&0x0001_0000u32.to_le_bytes());
        h[12..16].copy_from_slice(&92u32.to_le_bytes());
        h[24..32].copy_from_slice(&1u64.to_le_bytes());
        h[32..40].copy_from_slice(&(sectors - 1).to_le_bytes());
        h[40..48].copy_from_slice(&34u64.to_le_bytes());
        h[48..56].copy_from_slice(&(sectors - 34).to_le_bytes());
        h[72..80].copy_from_slice(&2u64.to_le_bytes());
        h[80..84].copy_from_slice(&128u32.to_le_bytes());
        h[84..88].copy_from_slice(&128u32.to_le_bytes());
        h[88..92].copy_from_slice(&crc32fast::hash(&[0u8; 128 * 128]).to_le_bytes());
        patch(h);
        let crc = crc32fast::hash(&h[..92]);
        h[16..20].copy_from_slice(&crc.to_le_bytes());
        img
    }

    fn corrupt_reason(img: &[u8]) -> String {
        match read(&mut &img[..]) {
            Err(Error::Corrupt(why)) => why,
            other => panic!("expected a corrupt table, got {other:?}"),
        }
    }

    #[test]
    fn the_unchanged_header_reads_as_an_empty_table() {
        let img = disk_with_primary(2048, |_| {});
        let table = read(&mut &img[..]).expect("sound primary");
        assert!(table.partitions.is_empty());
    }

    #[test]
    fn an_entry_array_whose_offset_overflows_is_refused() {
        // 2^55 sectors is 2^64 bytes: the offset wrapped to 0 (or panicked
        // in a debug build), and the array was read from sector 0.
        let img = disk_with_primary(2048, |h| {
            h[72..80].copy_from_slice(&(1u64 << 55).to_le_bytes());
        });
        let why = corrupt_reason(&img);
        assert!(why.contains("run past the end of the disk"), "{why}");
        for lba in [u64::MAX, (1u64 << 55) - 1, 2047] {
            let img = disk_with_primary(2048, |h| h[72..80].copy_from_slice(&lba.to_le_bytes()));
            let why = corrupt_reason(&img);
            assert!(why.contains("run past the end of the disk"), "{lba}: {why}");
        }
    }

    #[test]
    fn an_entry_array_larger_than_any_table_is_refused_before_it_is_read() {
        // 4096 entries of 4096 bytes: 16 MiB the header asks to read.
        let img = disk_with_primary(2048, |h| {
            h[80..84].copy_from_slice(&4096u32.to_le_bytes());
            h[84..88].copy_from_slice(&4096u32.to_le_bytes());
        });
        let why = corrupt_reason(&img);
        assert!(why.contains("4096 entries of 4096 bytes"), "{why}");
    }

    #[test]
    fn a_disk_too_small_for_a_table_is_corrupt_not_a_panic() {
        for sectors in [0usize, 1, 2] {
            let img = vec![0u8; sectors * 512];
            assert!(matches!(read(&mut &img[..]), Err(Error::Corrupt(_))));
        }
    }
}
