//! VHD images: the fixed footer (build, parse, validate) here, and the
//! reader of dynamic VHDs in [`dynamic`]. The format facts, with their
//! sources, are in `docs/vhd.md`.
//!
//! A drive is a page blob whose last 512 bytes are a fixed VHD footer; the bytes
//! before it are the disk. This file owns those 512 bytes and nothing else: it
//! does no I/O and knows no blob client.
//!
//! Invariants: [`Footer::parse`] accepts a footer only when its cookie, checksum,
//! disk type (fixed) and current size all agree with the blob it was read from, so
//! a caller that gets `Ok` may expose exactly `current_size_bytes` bytes as the
//! disk. [`Footer::to_bytes`] always writes a correct checksum.
//!
//! Footers written by other tools are accepted (qemu `qem2`/`qemu`, Azure
//! `wa\0\0`, Hyper-V `win `, ...); the disk size always comes from the
//! current-size field, never from the CHS geometry, which qemu with `force_size`
//! sets to its maximum and which cannot express most MiB-aligned sizes anyway.
//!
//! Footers built here carry the creator application [`CREATOR_APP`] (`win `);
//! why that one is explained there.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::units::{PAGE_SIZE, VHD_FOOTER_BYTES};

/// The cookie every VHD footer starts with.
pub const COOKIE: [u8; 8] = *b"conectix";
/// Creator application written into footers built by blobdrive: `win `,
/// Hyper-V's.
///
/// Readers disagree on where a VHD's size comes from. Hyper-V, Azure and
/// VirtualBox take the current-size field. qemu before 10 takes the size
/// from the CHS geometry (which cannot express most sizes: a 64 MiB disk
/// reads as 67,055,616 bytes) unless the creator is one it knows to be
/// size-exact: `win `, `qem2`, `d2v `, `CTXS`, `tap\0`; qemu 10 uses CHS only
/// for `vpc ` and `qemu`. An own tag such as `bdrv` is therefore read short
/// by qemu 7.2 (Debian 12), and Azure's own `wa\0\0` too. `win ` is read at
/// its exact size by every qemu from 2.6 on and by the others, and it is
/// what Azure's documented upload path (a VHD made by Hyper-V) carries.
/// `tests/vhd.rs` checks it with the distribution's qemu-img and the newest.
pub const CREATOR_APP: [u8; 4] = *b"win ";
/// Creator host OS written into our footers: `Wi2k`, what Azure expects.
pub const CREATOR_HOST_OS: [u8; 4] = *b"Wi2k";
/// Format version 1.0, the only one defined.
pub const FORMAT_VERSION: u32 = 0x0001_0000;
/// Feature bits of a normal disk: bit 1 is reserved and always set.
pub const FEATURES_RESERVED: u32 = 0x0000_0002;
/// Data offset of a fixed disk (there is no dynamic header).
pub const FIXED_DATA_OFFSET: u64 = u64::MAX;
/// Unix time of the VHD epoch, 2000-01-01 00:00:00 UTC.
pub const VHD_EPOCH_UNIX_SECS: u64 = 946_684_800;

pub mod dynamic;

/// Size of the footer as an array length.
const FOOTER_LEN: usize = VHD_FOOTER_BYTES as usize;

/// Byte offsets of the footer fields.
mod off {
    pub const COOKIE: usize = 0;
    pub const FEATURES: usize = 8;
    pub const FORMAT_VERSION: usize = 12;
    pub const DATA_OFFSET: usize = 16;
    pub const TIMESTAMP: usize = 24;
    pub const CREATOR_APP: usize = 28;
    pub const CREATOR_VERSION: usize = 32;
    pub const CREATOR_HOST_OS: usize = 36;
    pub const ORIGINAL_SIZE: usize = 40;
    pub const CURRENT_SIZE: usize = 48;
    pub const GEOMETRY: usize = 56;
    pub const DISK_TYPE: usize = 60;
    pub const CHECKSUM: usize = 64;
    pub const UNIQUE_ID: usize = 68;
    pub const SAVED_STATE: usize = 84;
}

/// The disk type field of a footer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DiskType {
    /// 2: the data area precedes the footer, byte for byte. The only kind we mount.
    Fixed,
    /// 3: blocks allocated on demand through a block table.
    Dynamic,
    /// 4: a dynamic disk holding changes over a parent image.
    Differencing,
    /// Any other value (0 none, 1/5/6 reserved, or garbage).
    Other(u32),
}

impl DiskType {
    /// The value stored in the footer.
    pub fn to_u32(self) -> u32 {
        match self {
            DiskType::Fixed => 2,
            DiskType::Dynamic => 3,
            DiskType::Differencing => 4,
            DiskType::Other(v) => v,
        }
    }

    /// The type for a stored value.
    pub fn from_u32(v: u32) -> DiskType {
        match v {
            2 => DiskType::Fixed,
            3 => DiskType::Dynamic,
            4 => DiskType::Differencing,
            other => DiskType::Other(other),
        }
    }
}

impl fmt::Display for DiskType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DiskType::Fixed => f.write_str("fixed"),
            DiskType::Dynamic => f.write_str("dynamic"),
            DiskType::Differencing => f.write_str("differencing"),
            DiskType::Other(v) => write!(f, "unknown type {v}"),
        }
    }
}

/// Cylinder/head/sector geometry, as the VHD specification derives it from a size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Geometry {
    /// Cylinders.
    pub cylinders: u16,
    /// Heads per cylinder.
    pub heads: u8,
    /// Sectors per track.
    pub sectors_per_track: u8,
}

impl Geometry {
    /// Bytes addressed by this geometry (never more than the disk size it came from).
    pub fn size_bytes(&self) -> u64 {
        u64::from(self.cylinders)
            * u64::from(self.heads)
            * u64::from(self.sectors_per_track)
            * PAGE_SIZE
    }
}

/// CHS geometry for a disk of `size_bytes`, by the algorithm in the VHD
/// specification's appendix. Sizes beyond 65535×16×255 sectors (about 127 GiB)
/// get the maximum geometry.
pub fn chs_geometry(size_bytes: u64) -> Geometry {
    let total_sectors = (size_bytes / PAGE_SIZE).min(65535 * 16 * 255);
    let (sectors_per_track, heads, cylinder_times_heads);
    if total_sectors >= 65535 * 16 * 63 {
        sectors_per_track = 255;
        heads = 16;
        cylinder_times_heads = total_sectors / sectors_per_track;
    } else {
        let mut spt = 17;
        let mut cth = total_sectors / spt;
        let mut h = cth.div_ceil(1024).max(4);
        if cth >= h * 1024 || h > 16 {
            spt = 31;
            h = 16;
            cth = total_sectors / spt;
        }
        if cth >= h * 1024 {
            spt = 63;
            h = 16;
            cth = total_sectors / spt;
        }
        sectors_per_track = spt;
        heads = h;
        cylinder_times_heads = cth;
    }
    // The bounds above keep every value in range: heads <= 16, spt <= 255, and
    // cylinders <= 65535 (ts <= 65535*16*255 with spt 255 and 16 heads, and in the
    // other branches cth < 65535*16*63 / spt with 16 heads, or < heads*1024).
    Geometry {
        cylinders: u16::try_from(cylinder_times_heads / heads).unwrap_or(u16::MAX),
        heads: heads as u8,
        sectors_per_track: sectors_per_track as u8,
    }
}

/// What is wrong with the last 512 bytes of a blob that should be a fixed VHD.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The blob cannot even hold a footer.
    #[error("blob is {blob} bytes, too small to hold a 512-byte VHD footer")]
    TooSmall {
        /// Blob size in bytes.
        blob: u64,
    },
    /// No `conectix` cookie: not a VHD (or a dynamic VHD's footer is not at the end).
    #[error("no VHD footer: the last 512 bytes start with {} instead of \"conectix\"", show_bytes(.found))]
    BadCookie {
        /// The first 8 bytes found.
        found: [u8; 8],
    },
    /// The checksum does not match the footer's bytes: the footer is corrupted.
    #[error(
        "corrupted VHD footer: checksum is {found:#010x}, the footer's bytes give {expected:#010x}"
    )]
    BadChecksum {
        /// Checksum computed from the footer.
        expected: u32,
        /// Checksum stored in the footer.
        found: u32,
    },
    /// A format version other than 1.x.
    #[error("unsupported VHD format version {0:#010x} (only 1.x exists)")]
    UnsupportedVersion(u32),
    /// A dynamic, differencing or unknown disk: only fixed disks are drives.
    #[error("VHD is a {0} disk; only fixed VHDs can be drives (convert it with 'qemu-img convert -O vpc -o subformat=fixed,force_size=on')")]
    NotFixed(DiskType),
    /// The current size is not a whole number of 512-byte sectors.
    #[error("VHD current size {0} bytes is not a multiple of 512")]
    SizeNotAligned(u64),
    /// The footer's size and the blob's size disagree.
    #[error("VHD footer says the disk is {footer} bytes, but the blob holds {} bytes before the footer (blob size {blob})", .blob.saturating_sub(VHD_FOOTER_BYTES))]
    SizeMismatch {
        /// Current size from the footer.
        footer: u64,
        /// Size of the whole blob, footer included.
        blob: u64,
    },
}

/// Printable form of raw bytes: a quoted string when they are ASCII, hex otherwise.
fn show_bytes(bytes: &[u8]) -> String {
    if bytes.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
        format!("\"{}\"", String::from_utf8_lossy(bytes))
    } else {
        let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
        format!("0x{}", hex.join(""))
    }
}

/// A parsed or newly built fixed VHD footer. Reserved bytes (85..512) are not
/// kept: they are written as zeros and ignored when read (the checksum still
/// covers them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footer {
    /// Feature bits (0x2 reserved, always set; 0x1 temporary disk).
    pub features: u32,
    /// Format version, 0x00010000.
    pub format_version: u32,
    /// Offset of the dynamic header; all ones for a fixed disk.
    pub data_offset: u64,
    /// Creation time, seconds since 2000-01-01 00:00:00 UTC.
    pub timestamp: u32,
    /// Tool that wrote the footer (`win `, `qem2`, `wa\0\0`, `bdrv`, ...).
    pub creator_app: [u8; 4],
    /// Version of that tool.
    pub creator_version: u32,
    /// Host OS of that tool (`Wi2k`, `Mac `).
    pub creator_host_os: [u8; 4],
    /// Size of the disk when it was created, in bytes.
    pub original_size_bytes: u64,
    /// Size of the disk now, in bytes: the data area, blob size − 512.
    pub current_size_bytes: u64,
    /// CHS geometry (informational: sizes come from `current_size_bytes`).
    pub geometry: Geometry,
    /// Disk type; always [`DiskType::Fixed`] after a successful parse.
    pub disk_type: DiskType,
    /// Random identifier of the disk.
    pub unique_id: [u8; 16],
    /// Saved-state flag (1 while a VM is saved); 0 for our footers.
    pub saved_state: u8,
}

impl Footer {
    /// A footer for a new fixed disk of `size_bytes` (a multiple of 512; the
    /// drive size rules live in [`crate::units::check_drive_size`]), stamped now,
    /// with a random unique id.
    pub fn new_fixed(size_bytes: u64) -> Footer {
        debug_assert!(
            size_bytes % PAGE_SIZE == 0,
            "disk size {size_bytes} not sector-aligned"
        );
        Footer {
            features: FEATURES_RESERVED,
            format_version: FORMAT_VERSION,
            data_offset: FIXED_DATA_OFFSET,
            timestamp: vhd_timestamp(SystemTime::now()),
            creator_app: CREATOR_APP,
            creator_version: creator_version(),
            creator_host_os: CREATOR_HOST_OS,
            original_size_bytes: size_bytes,
            current_size_bytes: size_bytes,
            geometry: chs_geometry(size_bytes),
            disk_type: DiskType::Fixed,
            unique_id: *uuid::Uuid::new_v4().as_bytes(),
            saved_state: 0,
        }
    }

    /// Size of the blob that holds this disk: the data area plus the footer.
    pub fn blob_size_bytes(&self) -> u64 {
        self.current_size_bytes + VHD_FOOTER_BYTES
    }

    /// The creator application as text (`bdrv`, `qem2`, `wa`, `win`), trailing
    /// spaces and NULs removed, other bytes escaped.
    pub fn creator_app_name(&self) -> String {
        let trimmed: Vec<u8> = {
            let end = self
                .creator_app
                .iter()
                .rposition(|b| *b != 0 && *b != b' ')
                .map_or(0, |i| i + 1);
            self.creator_app[..end].to_vec()
        };
        trimmed.escape_ascii().to_string()
    }

    /// The footer's 512 bytes, with its checksum.
    pub fn to_bytes(&self) -> [u8; 512] {
        let mut b = [0u8; FOOTER_LEN];
        b[off::COOKIE..off::COOKIE + 8].copy_from_slice(&COOKIE);
        put_u32(&mut b, off::FEATURES, self.features);
        put_u32(&mut b, off::FORMAT_VERSION, self.format_version);
        put_u64(&mut b, off::DATA_OFFSET, self.data_offset);
        put_u32(&mut b, off::TIMESTAMP, self.timestamp);
        b[off::CREATOR_APP..off::CREATOR_APP + 4].copy_from_slice(&self.creator_app);
        put_u32(&mut b, off::CREATOR_VERSION, self.creator_version);
        b[off::CREATOR_HOST_OS..off::CREATOR_HOST_OS + 4].copy_from_slice(&self.creator_host_os);
        put_u64(&mut b, off::ORIGINAL_SIZE, self.original_size_bytes);
        put_u64(&mut b, off::CURRENT_SIZE, self.current_size_bytes);
        b[off::GEOMETRY..off::GEOMETRY + 2].copy_from_slice(&self.geometry.cylinders.to_be_bytes());
        b[off::GEOMETRY + 2] = self.geometry.heads;
        b[off::GEOMETRY + 3] = self.geometry.sectors_per_track;
        put_u32(&mut b, off::DISK_TYPE, self.disk_type.to_u32());
        b[off::UNIQUE_ID..off::UNIQUE_ID + 16].copy_from_slice(&self.unique_id);
        b[off::SAVED_STATE] = self.saved_state;
        let sum = checksum(&b);
        put_u32(&mut b, off::CHECKSUM, sum);
        b
    }

    /// Parse and validate the last 512 bytes of a blob of `blob_size_bytes`.
    ///
    /// Checks, in order: the blob can hold a footer, the cookie, the checksum,
    /// the format version, the disk type (fixed only), the current size is
    /// sector-aligned and equals the blob size minus the footer.
    pub fn parse(bytes: &[u8; 512], blob_size_bytes: u64) -> Result<Footer, Error> {
        if blob_size_bytes < VHD_FOOTER_BYTES {
            return Err(Error::TooSmall {
                blob: blob_size_bytes,
            });
        }
        let footer = Footer::parse_any(bytes)?;
        if footer.disk_type != DiskType::Fixed {
            return Err(Error::NotFixed(footer.disk_type));
        }
        let current_size_bytes = footer.current_size_bytes;
        if current_size_bytes % PAGE_SIZE != 0 {
            return Err(Error::SizeNotAligned(current_size_bytes));
        }
        if current_size_bytes.checked_add(VHD_FOOTER_BYTES) != Some(blob_size_bytes) {
            return Err(Error::SizeMismatch {
                footer: current_size_bytes,
                blob: blob_size_bytes,
            });
        }
        Ok(footer)
    }

    /// Parse a footer of any disk type (fixed, dynamic, differencing),
    /// checking only its cookie, checksum and format version: what the
    /// dynamic VHD reader needs before it looks at the rest of the file.
    pub fn parse_any(bytes: &[u8; 512]) -> Result<Footer, Error> {
        let mut cookie = [0u8; 8];
        cookie.copy_from_slice(&bytes[off::COOKIE..off::COOKIE + 8]);
        if cookie != COOKIE {
            return Err(Error::BadCookie { found: cookie });
        }
        let found = get_u32(bytes, off::CHECKSUM);
        let expected = checksum(bytes);
        if found != expected {
            return Err(Error::BadChecksum { expected, found });
        }
        let format_version = get_u32(bytes, off::FORMAT_VERSION);
        if format_version >> 16 != FORMAT_VERSION >> 16 {
            return Err(Error::UnsupportedVersion(format_version));
        }
        let disk_type = DiskType::from_u32(get_u32(bytes, off::DISK_TYPE));
        let current_size_bytes = get_u64(bytes, off::CURRENT_SIZE);
        let mut creator_app = [0u8; 4];
        creator_app.copy_from_slice(&bytes[off::CREATOR_APP..off::CREATOR_APP + 4]);
        let mut creator_host_os = [0u8; 4];
        creator_host_os.copy_from_slice(&bytes[off::CREATOR_HOST_OS..off::CREATOR_HOST_OS + 4]);
        let mut unique_id = [0u8; 16];
        unique_id.copy_from_slice(&bytes[off::UNIQUE_ID..off::UNIQUE_ID + 16]);
        Ok(Footer {
            features: get_u32(bytes, off::FEATURES),
            format_version,
            data_offset: get_u64(bytes, off::DATA_OFFSET),
            timestamp: get_u32(bytes, off::TIMESTAMP),
            creator_app,
            creator_version: get_u32(bytes, off::CREATOR_VERSION),
            creator_host_os,
            original_size_bytes: get_u64(bytes, off::ORIGINAL_SIZE),
            current_size_bytes,
            geometry: Geometry {
                cylinders: u16::from_be_bytes([bytes[off::GEOMETRY], bytes[off::GEOMETRY + 1]]),
                heads: bytes[off::GEOMETRY + 2],
                sectors_per_track: bytes[off::GEOMETRY + 3],
            },
            disk_type,
            unique_id,
            saved_state: bytes[off::SAVED_STATE],
        })
    }
}

/// One's complement of the byte sum of the footer, its checksum field excluded.
pub fn checksum(bytes: &[u8; 512]) -> u32 {
    let sum = bytes
        .iter()
        .enumerate()
        .filter(|(i, _)| !(off::CHECKSUM..off::CHECKSUM + 4).contains(i))
        .fold(0u32, |acc, (_, b)| acc.wrapping_add(u32::from(*b)));
    !sum
}

/// Seconds since the VHD epoch for `t`; 0 before 2000, saturating after 2136.
pub fn vhd_timestamp(t: SystemTime) -> u32 {
    let unix_secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    u32::try_from(unix_secs.saturating_sub(VHD_EPOCH_UNIX_SECS)).unwrap_or(u32::MAX)
}

/// Our creator version: crate major in the high half, minor in the low half.
fn creator_version() -> u32 {
    let major: u32 = env!("CARGO_PKG_VERSION_MAJOR").parse().unwrap_or(0);
    let minor: u32 = env!("CARGO_PKG_VERSION_MINOR").parse().unwrap_or(0);
    (major << 16) | (minor & 0xffff)
}

fn put_u32(b: &mut [u8; FOOTER_LEN], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

fn put_u64(b: &mut [u8; FOOTER_LEN], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

fn get_u32(b: &[u8; FOOTER_LEN], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn get_u64(b: &[u8; FOOTER_LEN], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1024 * 1024;

    fn reseal(b: &mut [u8; 512]) {
        let c = checksum(b);
        b[off::CHECKSUM..off::CHECKSUM + 4].copy_from_slice(&c.to_be_bytes());
    }

    #[test]
    fn new_footer_has_the_fixed_disk_constants() {
        let f = Footer::new_fixed(16 * MIB);
        let b = f.to_bytes();
        assert_eq!(&b[0..8], b"conectix");
        assert_eq!(&b[8..12], &[0, 0, 0, 2]);
        assert_eq!(&b[12..16], &[0, 1, 0, 0]);
        assert_eq!(&b[16..24], &[0xff; 8]);
        assert_eq!(&b[28..32], b"win ");
        assert_eq!(&b[36..40], b"Wi2k");
        assert_eq!(&b[40..48], &(16 * MIB).to_be_bytes());
        assert_eq!(&b[48..56], &(16 * MIB).to_be_bytes());
        assert_eq!(&b[60..64], &[0, 0, 0, 2]);
        assert!(
            b[84..].iter().all(|x| *x == 0),
            "saved state and reserved are zero"
        );
        assert_eq!(f.blob_size_bytes(), 16 * MIB + 512);
    }

    #[test]
    fn timestamp_counts_from_2000() {
        let t = UNIX_EPOCH + std::time::Duration::from_secs(VHD_EPOCH_UNIX_SECS + 42);
        assert_eq!(vhd_timestamp(t), 42);
        assert_eq!(vhd_timestamp(UNIX_EPOCH), 0);
        let now = Footer::new_fixed(16 * MIB).timestamp;
        assert!(
            now > 24 * 365 * 86400,
            "a footer made today is stamped after 2024"
        );
    }

    #[test]
    fn checksum_matches_a_qemu_footer() {
        // Header fields of a footer written by qemu-img 10 (force_size, 17 MiB),
        // reserved bytes zero; its stored checksum was 0xffffe63a.
        let mut b = [0u8; 512];
        let head: [u8; 84] = [
            0x63, 0x6f, 0x6e, 0x65, 0x63, 0x74, 0x69, 0x78, 0, 0, 0, 2, 0, 1, 0, 0, 0xff, 0xff,
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x32, 0x95, 0x8d, 0x6e, b'q', b'e', b'm', b'2', 0,
            5, 0, 3, b'W', b'i', b'2', b'k', 0, 0, 0, 0, 0x01, 0x10, 0, 0, 0, 0, 0, 0, 0x01, 0x10,
            0, 0, 0xff, 0xff, 0x10, 0xff, 0, 0, 0, 2, 0xff, 0xff, 0xe6, 0x3a, 0x1a, 0x0c, 0x41,
            0x36, 0x04, 0x1f, 0x4c, 0xf0, 0x98, 0xf3, 0x7e, 0x29, 0x85, 0xd0, 0xd3, 0x4a,
        ];
        b[..84].copy_from_slice(&head);
        assert_eq!(checksum(&b), 0xffff_e63a);
        let f = Footer::parse(&b, 17 * MIB + 512).expect("qemu footer parses");
        assert_eq!(f.current_size_bytes, 17 * MIB);
        assert_eq!(f.creator_app_name(), "qem2");
        assert_eq!(
            f.geometry,
            Geometry {
                cylinders: 65535,
                heads: 16,
                sectors_per_track: 255
            }
        );
    }

    #[test]
    fn geometry_follows_the_spec_table() {
        // 16 MiB = 32768 sectors: spt 17, cth 1927, heads 4, cylinders 481.
        assert_eq!(
            chs_geometry(16 * MIB),
            Geometry {
                cylinders: 481,
                heads: 4,
                sectors_per_track: 17
            }
        );
        // 100 MiB: qemu-img computes 1003/12/17 for the same size.
        assert_eq!(
            chs_geometry(100 * MIB),
            Geometry {
                cylinders: 1003,
                heads: 12,
                sectors_per_track: 17
            }
        );
        // 1 GiB = 2097152 sectors: 17 and 31 overflow, spt 63.
        assert_eq!(
            chs_geometry(1024 * MIB),
            Geometry {
                cylinders: 2080,
                heads: 16,
                sectors_per_track: 63
            }
        );
        let max = Geometry {
            cylinders: 65535,
            heads: 16,
            sectors_per_track: 255,
        };
        assert_eq!(chs_geometry(8 * 1024 * 1024 * MIB - 512), max);
        assert_eq!(chs_geometry(65535 * 16 * 255 * 512), max);
    }

    #[test]
    fn azure_and_hyperv_creators_are_accepted() {
        for app in [*b"wa\0\0", *b"win ", *b"qemu", *b"qem2"] {
            let mut f = Footer::new_fixed(32 * MIB);
            f.creator_app = app;
            let parsed = Footer::parse(&f.to_bytes(), 32 * MIB + 512).expect("foreign creator");
            assert_eq!(parsed.current_size_bytes, 32 * MIB);
        }
        let mut f = Footer::new_fixed(32 * MIB);
        f.creator_app = *b"wa\0\0";
        assert_eq!(f.creator_app_name(), "wa");
        f.creator_app = *b"win ";
        assert_eq!(f.creator_app_name(), "win");
    }

    #[test]
    fn size_comes_from_current_size_not_geometry() {
        let mut f = Footer::new_fixed(100 * MIB);
        f.original_size_bytes = 50 * MIB;
        f.geometry = chs_geometry(3 * MIB);
        let parsed = Footer::parse(&f.to_bytes(), 100 * MIB + 512).expect("parses");
        assert_eq!(parsed.current_size_bytes, 100 * MIB);
    }

    #[test]
    fn blob_without_room_for_a_footer_is_too_small() {
        let f = Footer::new_fixed(0);
        assert_eq!(
            Footer::parse(&f.to_bytes(), 511),
            Err(Error::TooSmall { blob: 511 })
        );
    }

    #[test]
    fn zeros_are_not_a_footer() {
        let err = Footer::parse(&[0u8; 512], 1024).unwrap_err();
        assert_eq!(err, Error::BadCookie { found: [0; 8] });
        assert_eq!(
            err.to_string(),
            "no VHD footer: the last 512 bytes start with 0x0000000000000000 instead of \"conectix\""
        );
    }

    #[test]
    fn corrupted_byte_reports_bad_checksum() {
        let f = Footer::new_fixed(16 * MIB);
        let mut b = f.to_bytes();
        let stored = get_u32(&b, off::CHECKSUM);
        b[50] ^= 0x01;
        match Footer::parse(&b, 16 * MIB + 512) {
            Err(Error::BadChecksum { expected, found }) => {
                assert_eq!(found, stored);
                assert_ne!(expected, stored);
            }
            other => panic!("expected BadChecksum, got {other:?}"),
        }
    }

    #[test]
    fn dynamic_and_differencing_disks_are_refused() {
        for (v, t) in [
            (3, DiskType::Dynamic),
            (4, DiskType::Differencing),
            (0, DiskType::Other(0)),
        ] {
            let mut b = Footer::new_fixed(16 * MIB).to_bytes();
            b[off::DISK_TYPE..off::DISK_TYPE + 4].copy_from_slice(&u32::to_be_bytes(v));
            reseal(&mut b);
            let err = Footer::parse(&b, 16 * MIB + 512).unwrap_err();
            assert_eq!(err, Error::NotFixed(t));
        }
        assert!(Error::NotFixed(DiskType::Dynamic)
            .to_string()
            .starts_with("VHD is a dynamic disk; only fixed VHDs"));
    }

    #[test]
    fn other_format_version_is_refused() {
        let mut f = Footer::new_fixed(16 * MIB);
        f.format_version = 0x0002_0000;
        assert_eq!(
            Footer::parse(&f.to_bytes(), 16 * MIB + 512),
            Err(Error::UnsupportedVersion(0x0002_0000))
        );
    }

    #[test]
    fn unaligned_current_size_is_refused() {
        let mut f = Footer::new_fixed(16 * MIB);
        f.current_size_bytes = 16 * MIB + 100;
        assert_eq!(
            Footer::parse(&f.to_bytes(), 16 * MIB + 612),
            Err(Error::SizeNotAligned(16 * MIB + 100))
        );
    }

    #[test]
    fn size_that_disagrees_with_the_blob_is_refused() {
        let f = Footer::new_fixed(16 * MIB);
        let err = Footer::parse(&f.to_bytes(), 32 * MIB + 512).unwrap_err();
        assert_eq!(
            err,
            Error::SizeMismatch {
                footer: 16 * MIB,
                blob: 32 * MIB + 512
            }
        );
        assert_eq!(
            err.to_string(),
            "VHD footer says the disk is 16777216 bytes, but the blob holds 33554432 bytes \
             before the footer (blob size 33554944)"
        );
        // A current size near u64::MAX must not overflow.
        let mut huge = Footer::new_fixed(16 * MIB);
        huge.current_size_bytes = u64::MAX - 511;
        assert!(matches!(
            Footer::parse(&huge.to_bytes(), 1024),
            Err(Error::SizeMismatch { .. })
        ));
    }

    fn any_footer() -> impl Strategy<Value = Footer> {
        (
            (0u64..=(16 * 1024 * 1024 * 1024 * 2)), // pages, up to 16 TiB
            any::<u32>(),
            any::<[u8; 4]>(),
            any::<[u8; 16]>(),
            any::<u32>(),
            any::<u8>(),
            any::<u64>(),
            any::<(u16, u8, u8)>(),
        )
            .prop_map(
                |(pages, ts, app, id, features, saved, orig, (c, h, s))| Footer {
                    features,
                    format_version: FORMAT_VERSION,
                    data_offset: FIXED_DATA_OFFSET,
                    timestamp: ts,
                    creator_app: app,
                    creator_version: 0x0001_0002,
                    creator_host_os: CREATOR_HOST_OS,
                    original_size_bytes: orig,
                    current_size_bytes: pages * PAGE_SIZE,
                    geometry: Geometry {
                        cylinders: c,
                        heads: h,
                        sectors_per_track: s,
                    },
                    disk_type: DiskType::Fixed,
                    unique_id: id,
                    saved_state: saved,
                },
            )
    }

    proptest! {
        #[test]
        fn build_then_parse_is_identity(f in any_footer()) {
            let parsed = Footer::parse(&f.to_bytes(), f.blob_size_bytes());
            prop_assert_eq!(parsed, Ok(f));
        }

        #[test]
        fn new_fixed_round_trips(mib in 16u64..=8 * 1024 * 1024 - 1) {
            let f = Footer::new_fixed(mib * MIB);
            prop_assert_eq!(Footer::parse(&f.to_bytes(), mib * MIB + 512), Ok(f));
        }

        #[test]
        fn any_single_byte_corruption_is_detected(
            f in any_footer(), at in 0usize..512, flip in 1u8..=255,
        ) {
            // Every byte outside the checksum field is covered by it, and changing
            // the checksum field itself breaks the match too.
            let mut b = f.to_bytes();
            b[at] ^= flip;
            let err = Footer::parse(&b, f.blob_size_bytes()).unwrap_err();
            if at < 8 {
                prop_assert!(matches!(err, Error::BadCookie { .. }), "{:?}", err);
            } else {
                prop_assert!(matches!(err, Error::BadChecksum { .. }), "{:?}", err);
            }
        }

        #[test]
        fn geometry_never_exceeds_the_disk(size in 0u64..=(1u64 << 43)) {
            let g = chs_geometry(size);
            prop_assert!(g.size_bytes() <= size);
            prop_assert!(g.heads <= 16);
        }
    }
}
