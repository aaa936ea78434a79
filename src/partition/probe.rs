//! Recognising what starts a partition (or a whole disk) from its superblock
//! magic: ext2/3/4, XFS, Btrfs, FAT (vfat), NTFS, Linux swap, an LVM2 physical
//! volume or a LUKS container; with the label and UUID the superblock holds.
//!
//! It reads at most [`PROBE_BYTES`] from the start of the area and never more
//! than the area holds. It only names what it finds; whether the kernel can
//! mount it is asked separately ([`FsKind::is_mountable`]). Offsets are listed
//! in `docs/partitions.md`.

use uuid::Uuid;

use super::{le, DiskReader};

/// Bytes read from the start of an area: enough for the Btrfs superblock at
/// 64 KiB and a swap signature on 64 KiB pages.
pub const PROBE_BYTES: u64 = 68 * 1024;

/// What was recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsKind {
    /// ext2.
    Ext2,
    /// ext3.
    Ext3,
    /// ext4.
    Ext4,
    /// XFS.
    Xfs,
    /// Btrfs.
    Btrfs,
    /// FAT12/16/32.
    Vfat,
    /// NTFS.
    Ntfs,
    /// Linux swap.
    Swap,
    /// An LVM2 physical volume.
    Lvm2Pv,
    /// A LUKS encrypted container.
    Luks,
}

impl FsKind {
    /// The name blkid and mount use (`ext4`, `LVM2_member`, `crypto_LUKS`, ...).
    pub fn name(self) -> &'static str {
        match self {
            FsKind::Ext2 => "ext2",
            FsKind::Ext3 => "ext3",
            FsKind::Ext4 => "ext4",
            FsKind::Xfs => "xfs",
            FsKind::Btrfs => "btrfs",
            FsKind::Vfat => "vfat",
            FsKind::Ntfs => "ntfs",
            FsKind::Swap => "swap",
            FsKind::Lvm2Pv => "LVM2_member",
            FsKind::Luks => "crypto_LUKS",
        }
    }

    /// True for a filesystem (as opposed to swap or a volume/container that
    /// needs device-mapper, which this tool cannot set up).
    pub fn is_filesystem(self) -> bool {
        !matches!(self, FsKind::Swap | FsKind::Lvm2Pv | FsKind::Luks)
    }

    /// True when the running kernel can mount it (`/proc/filesystems`); ext2/3
    /// are mounted by the ext4 driver.
    pub fn is_mountable(self) -> bool {
        let wanted: &[&str] = match self {
            FsKind::Ext2 | FsKind::Ext3 | FsKind::Ext4 => &["ext4", "ext3", "ext2"],
            FsKind::Xfs => &["xfs"],
            FsKind::Btrfs => &["btrfs"],
            FsKind::Vfat => &["vfat"],
            FsKind::Ntfs => &["ntfs3", "ntfs"],
            FsKind::Swap | FsKind::Lvm2Pv | FsKind::Luks => return false,
        };
        let Ok(known) = std::fs::read_to_string("/proc/filesystems") else {
            return true;
        };
        if known.split_whitespace().any(|fs| wanted.contains(&fs)) {
            return true;
        }
        // A driver built as a module that is not loaded yet is not listed;
        // mount loads it, if the kernel has modules at all.
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        std::path::Path::new("/lib/modules")
            .join(release.trim())
            .is_dir()
    }
}

/// A filesystem or volume found at the start of an area.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filesystem {
    /// What it is.
    pub kind: FsKind,
    /// Its label, when it has one.
    pub label: Option<String>,
    /// Its UUID (or serial number, for FAT and NTFS), as blkid prints it.
    pub uuid: Option<String>,
    /// How far it reaches from the start of its area, in bytes, from its
    /// superblock: known for ext2/3/4 and XFS (what a shrink checks), None
    /// for the others.
    pub size_bytes: Option<u64>,
}

/// Probes the area `[offset_bytes, offset_bytes + len_bytes)` of `disk`.
pub fn probe(
    disk: &mut dyn DiskReader,
    offset_bytes: u64,
    len_bytes: u64,
) -> std::io::Result<Option<Filesystem>> {
    let avail = len_bytes.min(disk.size_bytes().saturating_sub(offset_bytes));
    let n = avail.min(PROBE_BYTES) as usize;
    if n == 0 {
        return Ok(None);
    }
    let head = disk.read_at(offset_bytes, n)?;
    Ok(probe_bytes(&head))
}

/// Recognises the area whose first bytes are `head` (fewer than
/// [`PROBE_BYTES`] when the area is smaller).
pub fn probe_bytes(head: &[u8]) -> Option<Filesystem> {
    luks(head)
        .or_else(|| lvm(head))
        .or_else(|| xfs(head))
        .or_else(|| btrfs(head))
        .or_else(|| ext(head))
        .or_else(|| swap(head))
        .or_else(|| ntfs(head))
        .or_else(|| vfat(head))
}

/// True when sector 0 is the boot sector of a filesystem on the whole disk
/// (FAT and NTFS carry the MBR's 0x55AA signature too).
pub fn is_boot_sector_of_filesystem(sector0: &[u8]) -> bool {
    ntfs(sector0).is_some() || vfat(sector0).is_some()
}

fn at(buf: &[u8], offset: usize, len: usize) -> Option<&[u8]> {
    buf.get(offset..offset.checked_add(len)?)
}

/// Text up to the first NUL, trimmed; None when empty.
fn text(bytes: &[u8]) -> Option<String> {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let s = String::from_utf8_lossy(&bytes[..end]).trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn uuid_be(bytes: &[u8]) -> Option<String> {
    let b: [u8; 16] = bytes.try_into().ok()?;
    let u = Uuid::from_bytes(b);
    (!u.is_nil()).then(|| u.hyphenated().to_string())
}

fn found(kind: FsKind, label: Option<String>, uuid: Option<String>) -> Option<Filesystem> {
    Some(Filesystem {
        kind,
        label,
        uuid,
        size_bytes: None,
    })
}

/// `fs` with its size from the superblock.
fn sized(fs: Option<Filesystem>, size_bytes: u64) -> Option<Filesystem> {
    fs.map(|f| Filesystem {
        size_bytes: Some(size_bytes),
        ..f
    })
}

fn ext(head: &[u8]) -> Option<Filesystem> {
    let sb = at(head, 1024, 1024)?;
    if le(sb, 0x38, 2)? != 0xEF53 {
        return None;
    }
    let compat = le(sb, 0x5C, 4)?;
    let incompat = le(sb, 0x60, 4)?;
    // extents, 64bit, flex_bg or a journal device/metadata csum mark ext4.
    let kind = if incompat & (0x40 | 0x80 | 0x200) != 0 {
        FsKind::Ext4
    } else if compat & 0x4 != 0 {
        FsKind::Ext3
    } else {
        FsKind::Ext2
    };
    // Blocks count (its high half with the 64bit feature), block size
    // 1024 << s_log_block_size.
    let mut blocks = le(sb, 0x04, 4)?;
    if incompat & 0x80 != 0 {
        blocks |= le(sb, 0x150, 4)? << 32;
    }
    let block = 1024u64 << le(sb, 0x18, 4)?.min(16);
    sized(
        found(kind, text(at(sb, 0x78, 16)?), uuid_be(at(sb, 0x68, 16)?)),
        blocks.saturating_mul(block),
    )
}

fn xfs(head: &[u8]) -> Option<Filesystem> {
    if at(head, 0, 4)? != b"XFSB" {
        return None;
    }
    // Big-endian: block size (u32 at 4), data blocks (u64 at 8).
    let block = u64::from(u32::from_be_bytes(at(head, 4, 4)?.try_into().ok()?));
    let blocks = u64::from_be_bytes(at(head, 8, 8)?.try_into().ok()?);
    sized(
        found(
            FsKind::Xfs,
            text(at(head, 108, 12)?),
            uuid_be(at(head, 32, 16)?),
        ),
        blocks.saturating_mul(block),
    )
}

fn btrfs(head: &[u8]) -> Option<Filesystem> {
    let sb = at(head, 0x10000, 0x1000)?;
    if at(sb, 0x40, 8)? != b"_BHRfS_M" {
        return None;
    }
    found(
        FsKind::Btrfs,
        text(at(sb, 0x12B, 256)?),
        uuid_be(at(sb, 0x20, 16)?),
    )
}

fn swap(head: &[u8]) -> Option<Filesystem> {
    // The signature ends the first page, whatever the page size was.
    [4096usize, 8192, 16384, 65536].into_iter().find(|&p| {
        at(head, p - 10, 10).is_some_and(|m| m == b"SWAPSPACE2" || m == b"SWAP-SPACE")
    })?;
    found(
        FsKind::Swap,
        text(at(head, 0x41C, 16)?),
        uuid_be(at(head, 0x40C, 16)?),
    )
}

fn lvm(head: &[u8]) -> Option<Filesystem> {
    // The label sits in one of the first four sectors.
    (0..4).find_map(|s| {
        let label = at(head, s * 512, 512)?;
        if at(label, 0, 8)? != b"LABELONE" || at(label, 24, 8)? != b"LVM2 001" {
            return None;
        }
        let pv_at = le(label, 20, 4)? as usize;
        let raw = at(label, pv_at, 32)?;
        let id = String::from_utf8_lossy(raw).to_string();
        // LVM prints its 32-character ids in groups of 6-4-4-4-4-4-6.
        let mut uuid = String::new();
        let mut rest = id.as_str();
        for (i, n) in [6, 4, 4, 4, 4, 4, 6].into_iter().enumerate() {
            let (part, tail) = rest.split_at(n.min(rest.len()));
            if i > 0 {
                uuid.push('-');
            }
            uuid.push_str(part);
            rest = tail;
        }
        found(FsKind::Lvm2Pv, None, Some(uuid))
    })
}

fn luks(head: &[u8]) -> Option<Filesystem> {
    if at(head, 0, 6)? != b"LUKS\xba\xbe" {
        return None;
    }
    let version = u16::from_be_bytes(at(head, 6, 2)?.try_into().ok()?);
    let label = if version == 2 {
        text(at(head, 24, 48)?)
    } else {
        None
    };
    found(FsKind::Luks, label, text(at(head, 168, 40)?))
}

fn ntfs(head: &[u8]) -> Option<Filesystem> {
    if at(head, 3, 8)? != b"NTFS    " {
        return None;
    }
    let serial = le(head, 0x48, 8)?;
    found(FsKind::Ntfs, None, Some(format!("{serial:016X}")))
}

fn vfat(head: &[u8]) -> Option<Filesystem> {
    if at(head, 510, 2)? != [0x55, 0xAA] {
        return None;
    }
    let sector_bytes = le(head, 11, 2)?;
    let cluster_sectors = le(head, 13, 1)?;
    if !(512..=4096).contains(&sector_bytes)
        || !sector_bytes.is_power_of_two()
        || cluster_sectors == 0
        || !cluster_sectors.is_power_of_two()
        || le(head, 16, 1)? == 0
    {
        return None;
    }
    // FAT32 keeps its extended boot record at 64, FAT12/16 at 36.
    let (sig_at, serial_at, label_at) = if at(head, 82, 5)? == b"FAT32" {
        (66, 67, 71)
    } else if at(head, 54, 3)? == b"FAT" {
        (38, 39, 43)
    } else {
        return None;
    };
    let has_ids = matches!(le(head, sig_at, 1)?, 0x28 | 0x29);
    let serial = le(head, serial_at, 4)?;
    let label = text(at(head, label_at, 11)?).filter(|l| l != "NO NAME");
    let uuid = has_ids.then(|| format!("{:04X}-{:04X}", serial >> 16, serial & 0xFFFF));
    found(FsKind::Vfat, if has_ids { label } else { None }, uuid)
}
