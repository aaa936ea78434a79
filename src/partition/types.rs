//! Names of the partition types a drive is likely to hold (the names
//! `sfdisk --list-types` prints), and which of them hold Linux data.

use super::PartitionType;

/// GPT "Linux filesystem", the type of Azure's Linux data disks.
pub const LINUX_FILESYSTEM_GUID: &str = "0FC63DAF-8483-4772-8E79-3D69D8477DE4";

/// GPT "Microsoft basic data".
pub(super) const BASIC_DATA_GUID: uuid::Uuid = uuid::uuid!("EBD0A0A2-B9E5-4433-87C0-68B6B72699C7");

/// GPT type GUIDs, their names, and whether they hold Linux data or a root.
const GPT: &[(&str, &str, bool)] = &[
    ("C12A7328-F81F-11D2-BA4B-00A0C93EC93B", "EFI System", false),
    ("21686148-6449-6E6F-744E-656564454649", "BIOS boot", false),
    (LINUX_FILESYSTEM_GUID, "Linux filesystem", true),
    (
        "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709",
        "Linux root (x86-64)",
        true,
    ),
    (
        "44479540-F297-41B2-9AF7-D131D5F0458A",
        "Linux root (x86)",
        true,
    ),
    (
        "B921B045-1DF0-41C3-AF44-4C6F280D3FAE",
        "Linux root (ARM-64)",
        true,
    ),
    (
        "69DAD710-2CE4-4E3C-B16C-21A1D49ABED3",
        "Linux root (ARM)",
        true,
    ),
    ("933AC7E1-2EB4-4F13-B844-0E14E2AEF915", "Linux home", true),
    (
        "3B8F8425-20E0-4F3B-907F-1A25A76F98E8",
        "Linux server data",
        true,
    ),
    (
        "4D21B016-B534-45C2-A9FB-5C16E091FD2D",
        "Linux variable data",
        true,
    ),
    (
        "8484680C-9521-48C6-9C11-B0720656F69E",
        "Linux /usr (x86-64)",
        true,
    ),
    (
        "B0E01050-EE5F-4390-949A-9101B17104E9",
        "Linux /usr (ARM-64)",
        true,
    ),
    (
        "BC13C2FF-59E6-4262-A352-B275FD6F7172",
        "Linux extended boot",
        false,
    ),
    ("0657FD6D-A4AB-43C4-84E5-0933C84B4F4F", "Linux swap", false),
    ("E6D6D379-F507-44C2-A23C-238F2A3DF928", "Linux LVM", false),
    ("CA7D7CCB-63ED-4C53-861C-1742536059CC", "Linux LUKS", false),
    ("A19D880F-05FC-4D3B-A006-743F0F84911E", "Linux RAID", false),
    (
        "8DA63339-0007-60C0-C436-083AC8230908",
        "Linux reserved",
        false,
    ),
    (
        "EBD0A0A2-B9E5-4433-87C0-68B6B72699C7",
        "Microsoft basic data",
        false,
    ),
    (
        "E3C9E316-0B5C-4DB8-817D-F92DF00215AE",
        "Microsoft reserved",
        false,
    ),
    (
        "DE94BBA4-06D1-4D40-A16A-BFD50179D6AC",
        "Windows recovery environment",
        false,
    ),
    (
        "024DEE41-33E7-11D3-9D69-0008C781F39F",
        "MBR partition scheme",
        false,
    ),
];

/// MBR type bytes, their names, and whether they hold Linux data.
const MBR: &[(u8, &str, bool)] = &[
    (0x01, "FAT12", false),
    (0x04, "FAT16 <32M", false),
    (0x05, "Extended", false),
    (0x06, "FAT16", false),
    (0x07, "HPFS/NTFS/exFAT", false),
    (0x0b, "W95 FAT32", false),
    (0x0c, "W95 FAT32 (LBA)", false),
    (0x0e, "W95 FAT16 (LBA)", false),
    (0x0f, "W95 Ext'd (LBA)", false),
    (0x27, "Hidden NTFS WinRE", false),
    (0x82, "Linux swap / Solaris", false),
    (0x83, "Linux", true),
    (0x85, "Linux extended", false),
    (0x8e, "Linux LVM", false),
    (0xa5, "FreeBSD", false),
    (0xee, "GPT", false),
    (0xef, "EFI (FAT-12/16/32)", false),
    (0xfd, "Linux raid autodetect", false),
];

pub(super) fn name(kind: &PartitionType) -> &'static str {
    lookup(kind).map_or("unknown", |(name, _)| name)
}

pub(super) fn is_linux_data(kind: &PartitionType) -> bool {
    lookup(kind).is_some_and(|(_, linux)| linux)
}

fn lookup(kind: &PartitionType) -> Option<(&'static str, bool)> {
    match kind {
        PartitionType::Mbr(b) => MBR
            .iter()
            .find(|(id, _, _)| id == b)
            .map(|&(_, n, l)| (n, l)),
        PartitionType::Gpt(_) => {
            let id = kind.id();
            GPT.iter()
                .find(|(g, _, _)| *g == id)
                .map(|&(_, n, l)| (n, l))
        }
    }
}
