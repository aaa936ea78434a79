//! Parser tests on images built here byte by byte (the layouts sfdisk writes),
//! and a property test: no corruption of a valid table makes a parser panic.

use proptest::prelude::*;

use super::choose::{choose, DriveNames};
use super::*;

const S: usize = SECTOR_BYTES as usize;
const LINUX: &str = "0FC63DAF-8483-4772-8E79-3D69D8477DE4";
const EFI: &str = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B";
const LVM: &str = "E6D6D379-F507-44C2-A23C-238F2A3DF928";

fn put_le(buf: &mut [u8], at: usize, n: usize, v: u64) {
    for i in 0..n {
        buf[at + i] = (v >> (8 * i)) as u8;
    }
}

fn guid_bytes(s: &str) -> [u8; 16] {
    uuid::Uuid::parse_str(s).unwrap().to_bytes_le()
}

/// A GPT disk of `sectors` sectors with `parts` = (number, first, last, type).
fn gpt_image(sectors: usize, parts: &[(u32, u64, u64, &str)]) -> Vec<u8> {
    let mut img = vec![0u8; sectors * S];
    // Protective MBR.
    img[446 + 4] = 0xEE;
    put_le(&mut img, 446 + 8, 4, 1);
    put_le(&mut img, 446 + 12, 4, (sectors - 1) as u64);
    img[510] = 0x55;
    img[511] = 0xAA;
    let mut array = vec![0u8; 128 * 128];
    for &(n, first, last, kind) in parts {
        let e = &mut array[(n as usize - 1) * 128..n as usize * 128];
        e[0..16].copy_from_slice(&guid_bytes(kind));
        e[16..32].copy_from_slice(&uuid::Uuid::new_v4().to_bytes_le());
        put_le(e, 32, 8, first);
        put_le(e, 40, 8, last);
        for (i, u) in format!("part{n}").encode_utf16().enumerate() {
            put_le(e, 56 + 2 * i, 2, u64::from(u));
        }
    }
    let last = (sectors - 1) as u64;
    let array_crc = crc32fast::hash(&array);
    for (my, alt, entries) in [(1, last, 2), (last, 1, last - 32)] {
        let mut h = vec![0u8; S];
        h[..8].copy_from_slice(b"EFI PART");
        put_le(&mut h, 8, 4, 0x0001_0000);
        put_le(&mut h, 12, 4, 92);
        put_le(&mut h, 24, 8, my);
        put_le(&mut h, 32, 8, alt);
        put_le(&mut h, 40, 8, 34);
        put_le(&mut h, 48, 8, last - 33);
        h[56..72].copy_from_slice(&guid_bytes("11111111-2222-3333-4444-555555555555"));
        put_le(&mut h, 72, 8, entries);
        put_le(&mut h, 80, 4, 128);
        put_le(&mut h, 84, 4, 128);
        put_le(&mut h, 88, 4, u64::from(array_crc));
        let crc = crc32fast::hash(&h[..92]);
        put_le(&mut h, 16, 4, u64::from(crc));
        img[my as usize * S..(my as usize + 1) * S].copy_from_slice(&h);
        img[entries as usize * S..entries as usize * S + array.len()].copy_from_slice(&array);
    }
    img
}

/// An MBR disk: primary entries (slot, type, start, len), and logical ones
/// (type, start relative to their EBR, len) chained inside the extended one.
fn mbr_image(
    sectors: usize,
    primary: &[(usize, u8, u64, u64)],
    logical: &[(u64, u8, u64, u64)],
) -> Vec<u8> {
    let mut img = vec![0u8; sectors * S];
    put_le(&mut img, 440, 4, 0x1234_abcd);
    for &(slot, kind, start, len) in primary {
        let e = 446 + 16 * slot;
        img[e + 4] = kind;
        put_le(&mut img, e + 8, 4, start);
        put_le(&mut img, e + 12, 4, len);
    }
    img[510] = 0x55;
    img[511] = 0xAA;
    let ext_start = primary
        .iter()
        .find(|p| p.1 == 0x05)
        .map(|p| p.2)
        .unwrap_or(0);
    for (i, &(ebr, kind, rel, len)) in logical.iter().enumerate() {
        let at = ebr as usize * S;
        img[at + 446 + 4] = kind;
        put_le(&mut img, at + 446 + 8, 4, rel);
        put_le(&mut img, at + 446 + 12, 4, len);
        if let Some(next) = logical.get(i + 1) {
            img[at + 462 + 4] = 0x05;
            put_le(&mut img, at + 462 + 8, 4, next.0 - ext_start);
            put_le(&mut img, at + 462 + 12, 4, next.2 + next.3);
        }
        img[at + 510] = 0x55;
        img[at + 511] = 0xAA;
    }
    img
}

/// Puts an ext4 superblock (magic, extents flag, label, UUID) at `sector`.
fn put_ext4(img: &mut [u8], sector: u64, label: &str) {
    let sb = sector as usize * S + 1024;
    put_le(img, sb + 0x38, 2, 0xEF53);
    put_le(img, sb + 0x60, 4, 0x40);
    img[sb + 0x68..sb + 0x78].copy_from_slice(&[7u8; 16]);
    img[sb + 0x78..sb + 0x78 + label.len()].copy_from_slice(label.as_bytes());
}

fn read(img: &[u8]) -> Result<Layout, Error> {
    Layout::read(&mut &img[..])
}

const NAMES: DriveNames<'static> = DriveNames {
    drive: "c/d.vhd",
    container: "c",
    blob: "d.vhd",
};

#[test]
fn gpt_in_any_order_is_read_by_number() {
    // Ubuntu's cloud image: 14 BIOS boot, 15 EFI, 1 root last on the disk.
    let mut img = gpt_image(
        4096,
        &[
            (14, 2048, 2303, "21686148-6449-6E6F-744E-656564454649"),
            (15, 2304, 2559, EFI),
            (1, 2560, 4062, LINUX),
        ],
    );
    put_ext4(&mut img, 2560, "cloudimg-rootfs");
    let layout = read(&img).unwrap();
    let table = layout.table.as_ref().unwrap();
    assert_eq!(table.kind, TableKind::Gpt);
    assert_eq!(
        table.disk_id,
        "11111111-2222-3333-4444-555555555555".to_uppercase()
    );
    assert!(table.warnings.is_empty(), "{:?}", table.warnings);
    let numbers: Vec<u32> = layout.parts.iter().map(|p| p.partition.number).collect();
    assert_eq!(numbers, [1, 14, 15]);
    let root = layout.part(1).unwrap();
    assert_eq!(root.partition.start_bytes, 2560 * 512);
    assert_eq!(root.partition.size_bytes, (4062 - 2560 + 1) * 512);
    assert_eq!(root.partition.label.as_deref(), Some("part1"));
    assert_eq!(root.partition.kind.name(), "Linux filesystem");
    let fs = root.filesystem.as_ref().unwrap();
    assert_eq!(
        (fs.kind, fs.label.as_deref()),
        (FsKind::Ext4, Some("cloudimg-rootfs"))
    );
    let c = choose(&layout, Selector::Auto, &NAMES).unwrap();
    assert_eq!((c.number, c.offset_bytes), (Some(1), 2560 * 512));
    assert!(c.reason.is_some());
}

#[test]
fn a_corrupt_primary_gpt_falls_back_to_the_backup_and_both_corrupt_is_refused() {
    let mut img = gpt_image(4096, &[(1, 2048, 4062, LINUX)]);
    img[S + 40] ^= 1;
    let layout = read(&img).unwrap();
    let table = layout.table.unwrap();
    assert_eq!(table.partitions.len(), 1);
    assert!(
        table.warnings[0].contains("primary GPT is unusable"),
        "{:?}",
        table.warnings
    );
    let last = 4095 * S;
    img[last + 40] ^= 1;
    let err = read(&img).unwrap_err().to_string();
    assert!(
        err.starts_with("corrupt GPT: the header checksum at sector 1"),
        "{err}"
    );
    assert!(!err.contains('\n'));
}

#[test]
fn a_gpt_partition_past_the_disk_end_is_refused() {
    // Entries say the disk has 8192 sectors; the disk has 4096 (truncated image).
    let img = gpt_image(8192, &[(1, 2048, 8000, LINUX)]);
    let err = read(&img[..4096 * S]).unwrap_err().to_string();
    assert!(err.contains("corrupt GPT"), "{err}");
}

#[test]
fn mbr_logical_partitions_are_numbered_from_five() {
    let mut img = mbr_image(
        8192,
        &[(0, 0x83, 2048, 2048), (1, 0x05, 4096, 4096)],
        &[(4096, 0x83, 2048, 1024), (7168, 0x8e, 1, 1000)],
    );
    put_ext4(&mut img, 4096 + 2048, "logical");
    let layout = read(&img).unwrap();
    let table = layout.table.as_ref().unwrap();
    assert_eq!(table.kind, TableKind::Mbr);
    assert_eq!(table.disk_id, "0x1234abcd");
    let numbers: Vec<u32> = layout.parts.iter().map(|p| p.partition.number).collect();
    assert_eq!(numbers, [1, 2, 5, 6]);
    assert_eq!(layout.part(5).unwrap().partition.start_bytes, 6144 * 512);
    assert_eq!(layout.part(6).unwrap().partition.kind.name(), "Linux LVM");
    let c = choose(&layout, Selector::Auto, &NAMES).unwrap();
    assert_eq!(c.number, Some(5));
    let err = choose(&layout, Selector::Number(2), &NAMES).unwrap_err();
    assert!(err.contains("extended partition"), "{err}");
    let err = choose(&layout, Selector::Number(9), &NAMES).unwrap_err();
    assert!(err.contains("has no partition 9"), "{err}");
}

#[test]
fn mbr_partition_past_the_disk_end_is_refused_in_one_line() {
    let img = mbr_image(4096, &[(0, 0x83, 2048, 4096)], &[]);
    let err = read(&img).unwrap_err().to_string();
    assert!(
        err.contains("partition 1") && err.contains("ends past the end of the disk"),
        "{err}"
    );
}

#[test]
fn a_looping_logical_chain_is_corrupt() {
    let mut img = mbr_image(8192, &[(1, 0x05, 4096, 4096)], &[(4096, 0x83, 1, 100)]);
    // The first EBR links back to itself.
    let at = 4096 * S;
    img[at + 462 + 4] = 0x05;
    put_le(&mut img, at + 462 + 8, 4, 0);
    put_le(&mut img, at + 462 + 12, 4, 100);
    let err = read(&img).unwrap_err().to_string();
    assert!(err.contains("loops"), "{err}");
}

#[test]
fn lvm_and_luks_partitions_are_refused_with_a_way_forward() {
    let mut img = gpt_image(4096, &[(1, 2048, 3071, LVM), (2, 3072, 4062, LINUX)]);
    let pv = 2048 * S + 512;
    img[pv..pv + 8].copy_from_slice(b"LABELONE");
    put_le(&mut img, pv + 20, 4, 32);
    img[pv + 24..pv + 32].copy_from_slice(b"LVM2 001");
    img[pv + 32..pv + 64].copy_from_slice(b"abcdefghijklmnopqrstuvwxyz012345");
    let luks = 3072 * S;
    img[luks..luks + 6].copy_from_slice(b"LUKS\xba\xbe");
    img[luks + 7] = 2;
    let layout = read(&img).unwrap();
    let pv_fs = layout.part(1).unwrap().filesystem.clone().unwrap();
    assert_eq!(pv_fs.kind, FsKind::Lvm2Pv);
    assert_eq!(
        pv_fs.uuid.as_deref(),
        Some("abcdef-ghij-klmn-opqr-stuv-wxyz-012345")
    );
    let err = choose(&layout, Selector::Number(1), &NAMES).unwrap_err();
    assert!(
        err.contains("LVM2 physical volume") && err.contains("vgchange"),
        "{err}"
    );
    let err = choose(&layout, Selector::Number(2), &NAMES).unwrap_err();
    assert!(
        err.contains("LUKS") && err.contains("cryptsetup open"),
        "{err}"
    );
    let err = choose(&layout, Selector::Auto, &NAMES).unwrap_err();
    assert!(!err.contains("mkfs"), "{err}");
}

#[test]
fn only_an_empty_disk_gets_mkfs_advice() {
    let empty = vec![0u8; 4 << 20];
    let layout = read(&empty).unwrap();
    assert!(layout.empty && layout.table.is_none());
    let err = choose(&layout, Selector::Auto, &NAMES).unwrap_err();
    assert!(err.contains("mkfs"), "{err}");

    let mut junk = empty.clone();
    junk[300_000] = 1;
    let layout = read(&junk).unwrap();
    assert!(!layout.empty);
    // Unknown bytes: left to the kernel's blkid, never formatted.
    let c = choose(&layout, Selector::Auto, &NAMES).unwrap();
    assert_eq!((c.number, c.filesystem), (None, None));

    let mut tail = empty;
    let n = tail.len();
    tail[n - 10] = 1;
    assert!(!read(&tail).unwrap().empty);
}

#[test]
fn a_whole_disk_filesystem_is_not_taken_for_a_table() {
    // A FAT boot sector carries 0x55AA like an MBR.
    let mut img = vec![0u8; 1 << 20];
    put_le(&mut img, 11, 2, 512);
    img[13] = 4;
    img[16] = 2;
    img[38] = 0x29;
    put_le(&mut img, 39, 4, 0x1234_5678);
    img[43..54].copy_from_slice(b"MYDISK     ");
    img[54..59].copy_from_slice(b"FAT16");
    img[510] = 0x55;
    img[511] = 0xAA;
    let layout = read(&img).unwrap();
    assert!(layout.table.is_none());
    let fs = layout.whole.unwrap();
    assert_eq!(
        (fs.kind, fs.label.as_deref(), fs.uuid.as_deref()),
        (FsKind::Vfat, Some("MYDISK"), Some("1234-5678"))
    );
}

#[test]
fn auto_refuses_when_it_cannot_choose_and_lists_the_choices() {
    let mut img = gpt_image(8192, &[(1, 2048, 4095, LINUX), (2, 4096, 6143, LINUX)]);
    put_ext4(&mut img, 2048, "a");
    put_ext4(&mut img, 4096, "b");
    let layout = read(&img).unwrap();
    let err = choose(&layout, Selector::Auto, &NAMES).unwrap_err();
    assert!(
        err.contains("none is clearly the one") && err.contains("ext4 'b'"),
        "{err}"
    );
    assert_eq!(
        choose(&layout, Selector::Number(2), &NAMES)
            .unwrap()
            .offset_bytes,
        4096 * 512
    );

    let empty_table = mbr_image(8192, &[], &[]);
    let layout = read(&empty_table).unwrap();
    let err = choose(&layout, Selector::Auto, &NAMES).unwrap_err();
    assert!(err.contains("has an MBR with no partitions"), "{err}");
    assert!(!err.contains("mkfs"), "{err}");
}

#[test]
fn selector_parses_numbers_and_auto_only() {
    assert_eq!("auto".parse::<Selector>(), Ok(Selector::Auto));
    assert_eq!("14".parse::<Selector>(), Ok(Selector::Number(14)));
    assert!("0".parse::<Selector>().is_err());
    assert!("x".parse::<Selector>().is_err());
}

#[test]
fn auto_attaches_a_lone_partition_only_when_it_is_linux_data() {
    const XBOOTLDR: &str = "BC13C2FF-59E6-4262-A352-B275FD6F7172";
    const BASIC_DATA: &str = "EBD0A0A2-B9E5-4433-87C0-68B6B72699C7";
    // A boot partition (EFI system, or Linux extended boot) beside an LVM
    // PV: the only filesystem is not data, so auto names the choices.
    for boot in [EFI, XBOOTLDR] {
        let mut img = gpt_image(8192, &[(1, 2048, 4095, boot), (2, 4096, 8000, LVM)]);
        put_ext4(&mut img, 2048, "boot");
        let pv = 4096 * S + 512;
        img[pv..pv + 8].copy_from_slice(b"LABELONE");
        put_le(&mut img, pv + 20, 4, 32);
        img[pv + 24..pv + 32].copy_from_slice(b"LVM2 001");
        let layout = read(&img).unwrap();
        let err = choose(&layout, Selector::Auto, &NAMES).unwrap_err();
        assert!(
            err.contains("not a Linux data or root partition")
                && err.contains("1 (")
                && err.contains("2 (Linux LVM")
                && err.contains("--partition N")
                && !err.contains('\n'),
            "{err}"
        );
        // Named, it is attached.
        assert_eq!(
            choose(&layout, Selector::Number(1), &NAMES).unwrap().number,
            Some(1)
        );
    }
    // Basic data holding ext4 (as some tools make Linux data disks) is picked.
    let mut img = gpt_image(8192, &[(1, 2048, 8000, BASIC_DATA)]);
    put_ext4(&mut img, 2048, "data");
    let c = choose(&read(&img).unwrap(), Selector::Auto, &NAMES).unwrap();
    assert_eq!(c.number, Some(1));
}

#[test]
fn tables_made_for_4096_byte_sectors_are_refused_not_read_8x_short() {
    // fdisk -b 4096: partition 1 at 4 KiB sector 256 (1 MiB), ext4 there;
    // read with 512-byte sectors it would start at 128 KiB.
    let mut img = mbr_image(16384, &[(0, 0x83, 256, 1792)], &[]);
    put_ext4(&mut img, 2048, "data");
    let err = read(&img).unwrap_err().to_string();
    assert!(
        err.contains("4096-byte sectors") && err.contains("partition 1") && !err.contains('\n'),
        "{err}"
    );
    // The same table made for 512-byte sectors reads as it is.
    let mut img = mbr_image(16384, &[(0, 0x83, 2048, 14336)], &[]);
    put_ext4(&mut img, 2048, "data");
    assert_eq!(
        read(&img).unwrap().part(1).unwrap().partition.start_bytes,
        1 << 20
    );
    // A GPT whose header is in the second 4 KiB sector.
    let mut img = mbr_image(16384, &[(0, 0xEE, 1, 2047)], &[]);
    img[4096..4104].copy_from_slice(b"EFI PART");
    let err = read(&img).unwrap_err().to_string();
    assert!(err.contains("4096-byte sectors"), "{err}");
}

#[test]
fn the_table_not_a_stale_superblock_says_how_far_a_drive_reaches() {
    // An MBR partition from sector 2048 to the end, and in the gap before
    // it the superblock of a 64 MiB ext4 that once filled the whole disk.
    let sectors = 16384;
    let mut img = mbr_image(sectors, &[(0, 0x83, 2048, sectors as u64 - 2048)], &[]);
    put_ext4(&mut img, 0, "old");
    put_le(&mut img, 1024 + 4, 4, 16384); // blocks
    put_le(&mut img, 1024 + 24, 4, 2); // 4 KiB blocks
    put_ext4(&mut img, 2048, "new");
    let layout = read(&img).unwrap();
    let reach = layout.reach().unwrap();
    assert_eq!(reach.end_bytes, (sectors * S) as u64);
    assert!(
        reach.what.starts_with("partition 1 (Linux"),
        "{}",
        reach.what
    );
    // Without the table, the same superblock measures the disk.
    img[510] = 0;
    let reach = read(&img).unwrap().reach().unwrap();
    assert_eq!(
        (reach.end_bytes, reach.what.as_str()),
        (64 << 20, "the ext4 filesystem")
    );
    // A GPT reaches its backup header, at the last sector.
    let img = gpt_image(8192, &[(1, 2048, 4095, LINUX)]);
    assert_eq!(read(&img).unwrap().reach().unwrap().end_bytes, 8192 * 512);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("BLOBDRIVE_PARTITION_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
    ))]

    /// Any bytes changed anywhere in the tables, and any truncation: an
    /// answer or an error, never a panic.
    #[test]
    fn corrupted_tables_never_panic(
        gpt in any::<bool>(),
        edits in proptest::collection::vec((0usize..40 * 512, any::<u8>()), 1..16),
        cut in 0usize..8192 * 512,
    ) {
        let mut img = if gpt {
            gpt_image(8192, &[(1, 2048, 4095, EFI), (2, 4096, 8000, LINUX)])
        } else {
            mbr_image(8192, &[(0, 0x83, 2048, 2048), (1, 0x05, 4096, 4096)],
                      &[(4096, 0x83, 2048, 1024), (7168, 0x83, 1, 1000)])
        };
        for (at, v) in edits {
            // Half the edits hit the header sectors and the first EBR.
            let at = if at % 2 == 0 { at } else { 4096 * 512 + at % 512 };
            img[at] = v;
        }
        img.truncate(cut.max(512));
        if let Ok(layout) = read(&img) {
            for sel in [Selector::Auto, Selector::Number(1), Selector::Number(5)] {
                let _ = choose(&layout, sel, &NAMES);
            }
            for p in &layout.parts {
                prop_assert!(p.partition.end_bytes() <= img.len() as u64);
            }
        }
    }
}
