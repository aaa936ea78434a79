//! What the first sectors of a drive say about how far its contents reach:
//! an ext2/3/4 or xfs filesystem directly on the disk (its size from the
//! superblock), or a partition table (MBR or GPT), or nothing known.
//!
//! Used to refuse a shrink that would cut a filesystem. Offsets and fields:
//! ext superblock at byte 1024 (magic 0xEF53 at +56, blocks count at +4 and,
//! with the 64bit feature 0x80 of the incompat flags at +96, its high half at
//! +0x150; block size 1024 << (u32 at +24)), all little-endian; xfs
//! superblock at byte 0 (`XFSB`, block size u32 at +4, data blocks u64 at +8),
//! big-endian; MBR signature 0x55 0xAA at byte 510; GPT header `EFI PART` at
//! byte 512.

/// Bytes of the drive's start that [`detect`] needs.
pub const HEAD_BYTES: u64 = 4096;

/// What the start of a drive holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// A filesystem on the whole disk, `size_bytes` long.
    Filesystem {
        /// `ext4` (for any ext2/3/4) or `xfs`.
        kind: &'static str,
        /// How far the filesystem reaches, in bytes from the disk's start.
        size_bytes: u64,
    },
    /// A partition table: `MBR` or `GPT`.
    PartitionTable(&'static str),
    /// Nothing blobdrive recognises (empty, or another format).
    Unknown,
}

fn le32(b: &[u8], at: usize) -> u64 {
    u64::from(u32::from_le_bytes(
        b[at..at + 4].try_into().expect("4 bytes"),
    ))
}

/// Reads the layout from the first [`HEAD_BYTES`] of a drive (shorter input
/// is treated as zeros).
pub fn detect(head: &[u8]) -> Layout {
    let mut b = vec![0u8; HEAD_BYTES as usize];
    let n = head.len().min(b.len());
    b[..n].copy_from_slice(&head[..n]);
    if &b[0..4] == b"XFSB" {
        let block = u64::from(u32::from_be_bytes(b[4..8].try_into().expect("4 bytes")));
        let blocks = u64::from_be_bytes(b[8..16].try_into().expect("8 bytes"));
        return Layout::Filesystem {
            kind: "xfs",
            size_bytes: block.saturating_mul(blocks),
        };
    }
    let sb = 1024;
    if b[sb + 56] == 0x53 && b[sb + 57] == 0xEF {
        let log = le32(&b, sb + 24).min(16);
        let block = 1024u64 << log;
        let mut blocks = le32(&b, sb + 4);
        if le32(&b, sb + 96) & 0x80 != 0 {
            blocks |= le32(&b, sb + 0x150) << 32;
        }
        return Layout::Filesystem {
            kind: "ext4",
            size_bytes: block.saturating_mul(blocks),
        };
    }
    if &b[512..520] == b"EFI PART" {
        return Layout::PartitionTable("GPT");
    }
    if b[510] == 0x55 && b[511] == 0xAA {
        return Layout::PartitionTable("MBR");
    }
    Layout::Unknown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ext4_size_comes_from_the_superblock() {
        let mut b = vec![0u8; 4096];
        b[1024 + 56] = 0x53;
        b[1024 + 57] = 0xEF;
        b[1024 + 4..1024 + 8].copy_from_slice(&16384u32.to_le_bytes());
        b[1024 + 24..1024 + 28].copy_from_slice(&2u32.to_le_bytes()); // 4 KiB blocks
        assert_eq!(
            detect(&b),
            Layout::Filesystem {
                kind: "ext4",
                size_bytes: 64 << 20
            }
        );
    }

    #[test]
    fn xfs_and_partition_tables_are_recognised() {
        let mut x = vec![0u8; 512];
        x[0..4].copy_from_slice(b"XFSB");
        x[4..8].copy_from_slice(&4096u32.to_be_bytes());
        x[8..16].copy_from_slice(&1000u64.to_be_bytes());
        assert_eq!(
            detect(&x),
            Layout::Filesystem {
                kind: "xfs",
                size_bytes: 4096 * 1000
            }
        );
        let mut m = vec![0u8; 4096];
        m[510] = 0x55;
        m[511] = 0xAA;
        assert_eq!(detect(&m), Layout::PartitionTable("MBR"));
        m[512..520].copy_from_slice(b"EFI PART");
        assert_eq!(detect(&m), Layout::PartitionTable("GPT"));
        assert_eq!(detect(&[]), Layout::Unknown);
    }
}
