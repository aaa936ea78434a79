//! Which part of a drive `blobdrive mount` attaches: `--partition N`, or
//! `auto` (the default): the whole disk when it has no table, else the one
//! partition holding a filesystem when it is a Linux data/root one (or basic
//! data holding a Linux filesystem), else the largest such partition holding
//! one. An EFI or Windows partition is never picked by `auto`. When the choice is not clear, or what was asked for is an LVM
//! volume, a LUKS container or swap, the answer is a refusal that says what
//! was found and how to go on; it never suggests a mkfs over data.

use std::str::FromStr;

pub use super::layout::{describe, describe_fs};
use super::probe::FsKind;
use super::{Filesystem, Layout, PartitionInfo};

/// What the user asked to mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Selector {
    /// Let blobdrive choose.
    #[default]
    Auto,
    /// Partition N (as Linux numbers it).
    Number(u32),
}

impl FromStr for Selector {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "auto" => Ok(Selector::Auto),
            n => match n.parse::<u32>() {
                Ok(n) if n >= 1 => Ok(Selector::Number(n)),
                _ => Err(format!(
                    "'{s}' is not a partition: give its number (1, 2, ...) or 'auto'"
                )),
            },
        }
    }
}

impl std::fmt::Display for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Selector::Auto => f.write_str("auto"),
            Selector::Number(n) => write!(f, "{n}"),
        }
    }
}

/// The area to attach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// The partition number; None for the whole disk.
    pub number: Option<u32>,
    /// First byte of the area.
    pub offset_bytes: u64,
    /// Its length.
    pub size_bytes: u64,
    /// What the probe found there (None: let the kernel's blkid look).
    pub filesystem: Option<Filesystem>,
    /// Why `auto` chose this partition (None for the whole disk or an explicit number).
    pub reason: Option<String>,
}

/// Names a refusal needs to say how to go on.
#[derive(Debug, Clone)]
pub struct DriveNames<'a> {
    /// `container/blob`.
    pub drive: &'a str,
    /// The container.
    pub container: &'a str,
    /// The blob name.
    pub blob: &'a str,
}

/// Picks the area of `layout` that `selector` names; `Err` is one line for the user.
pub fn choose(layout: &Layout, selector: Selector, names: &DriveNames) -> Result<Choice, String> {
    let drive = names.drive;
    let Some(table) = &layout.table else {
        if let Selector::Number(n) = selector {
            return Err(format!(
                "drive {drive} has no partition table, so it has no partition {n}; leave out \
                 --partition to attach {}",
                match &layout.whole {
                    Some(fs) => format!("its {} filesystem", fs.kind.name()),
                    None => "the whole disk".to_string(),
                }
            ));
        }
        if let Some(fs) = &layout.whole {
            unusable(fs, &format!("drive {drive}"), 0, layout.disk_bytes, names)?;
        } else if layout.empty {
            return Err(format!(
                "drive {drive} holds no filesystem and is empty (no partition table, only zeros \
                 in its first and last MiB); make a filesystem on its file in a namespace mount \
                 ('blobdrive mount {} DIR', then 'mkfs.ext4 DIR/{}'), or create drives with \
                 'blobdrive create C/B --size SIZE --mkfs ext4'",
                names.container, names.blob
            ));
        }
        return Ok(Choice {
            number: None,
            offset_bytes: 0,
            size_bytes: layout.disk_bytes,
            filesystem: layout.whole.clone(),
            reason: None,
        });
    };
    let kind = table.kind.name();
    if let Selector::Number(n) = selector {
        let Some(p) = layout.part(n) else {
            return Err(format!(
                "drive {drive} has no partition {n}; its {kind} holds {}",
                list(&layout.parts)
            ));
        };
        return pick(p, names, None);
    }
    let with_fs: Vec<&PartitionInfo> = layout
        .parts
        .iter()
        .filter(|p| {
            p.filesystem
                .as_ref()
                .is_some_and(|f| f.kind.is_filesystem() && f.kind.is_mountable())
        })
        .collect();
    match with_fs.as_slice() {
        [] if layout.parts.is_empty() => {
            Err(format!(
            "drive {drive} has {} {kind} with no partitions, so there is nothing to mount; add \
             one with sfdisk on its file in a namespace mount ('blobdrive mount {} DIR')",
            if table.kind == super::TableKind::Mbr { "an" } else { "a" },
            names.container
        ))
        }
        [] => {
            let mut line = format!(
                "drive {drive} has no partition holding a filesystem this kernel can mount; its \
                 {kind} holds {}",
                list(&layout.parts)
            );
            if let Some(p) = layout.parts.iter().find(|p| {
                p.filesystem
                    .as_ref()
                    .is_some_and(|f| matches!(f.kind, FsKind::Lvm2Pv | FsKind::Luks))
            }) {
                if let Err(advice) = pick(p, names, None) {
                    line = advice;
                }
            } else {
                line.push_str("; name one with --partition N to let the kernel look at it");
            }
            Err(line)
        }
        [only] if is_linux_candidate(only) => pick(
            only,
            names,
            Some("the only partition holding a filesystem this kernel mounts".into()),
        ),
        [only] => Err(format!(
            "drive {drive} has one partition holding a filesystem, {}, and it is not a Linux \
             data or root partition, so auto does not attach it (an EFI or Windows partition \
             mounted read-write gets written); its {kind} holds {}; name the one to attach with \
             --partition N",
            describe(only),
            list(&layout.parts)
        )),
        several => {
            let linux: Vec<&&PartitionInfo> =
                several.iter().filter(|p| is_linux_candidate(p)).collect();
            let largest = linux.iter().map(|p| p.partition.size_bytes).max();
            let top: Vec<&&&PartitionInfo> = linux
                .iter()
                .filter(|p| Some(p.partition.size_bytes) == largest)
                .collect();
            match top.as_slice() {
                [one] => pick(
                    one,
                    names,
                    Some(format!(
                        "the largest Linux partition of {} holding filesystems this kernel mounts",
                        several.len()
                    )),
                ),
                _ => Err(format!(
                    "drive {drive} has {} partitions holding filesystems and none is clearly the \
                     one to mount: {}; pick one with --partition N",
                    several.len(),
                    list(&several.iter().map(|p| (*p).clone()).collect::<Vec<_>>())
                )),
            }
        }
    }
}

/// True for a partition `auto` may attach: a Linux data or root type, or
/// a GPT basic-data one holding a Linux filesystem (ext2/3/4, XFS, Btrfs),
/// as some tools lay out Linux data disks. An EFI system partition, a
/// Windows one or an unknown type is attached only when named.
fn is_linux_candidate(p: &PartitionInfo) -> bool {
    let kind = &p.partition.kind;
    kind.is_linux_data()
        || (kind.is_basic_data()
            && p.filesystem.as_ref().is_some_and(|f| {
                matches!(
                    f.kind,
                    FsKind::Ext2 | FsKind::Ext3 | FsKind::Ext4 | FsKind::Xfs | FsKind::Btrfs
                )
            }))
}

/// The choice of partition `p`, or why it cannot be attached.
fn pick(p: &PartitionInfo, names: &DriveNames, reason: Option<String>) -> Result<Choice, String> {
    let part = &p.partition;
    let what = format!("partition {} of drive {}", part.number, names.drive);
    if part.kind.is_extended() {
        return Err(format!(
            "{what} is an extended partition, a container of the logical partitions (5 and up); \
             pick one of those with --partition N"
        ));
    }
    if let Some(fs) = &p.filesystem {
        unusable(fs, &what, part.start_bytes, part.size_bytes, names)?;
    }
    Ok(Choice {
        number: Some(part.number),
        offset_bytes: part.start_bytes,
        size_bytes: part.size_bytes,
        filesystem: p.filesystem.clone(),
        reason,
    })
}

/// Refuses swap, LVM and LUKS, saying how to reach what they hold.
fn unusable(
    fs: &Filesystem,
    what: &str,
    offset: u64,
    size: u64,
    names: &DriveNames,
) -> Result<(), String> {
    let uuid = fs
        .uuid
        .as_ref()
        .map(|u| format!(" (UUID {u})"))
        .unwrap_or_default();
    let by_hand = format!(
        "on a host with device-mapper, get the drive as a file with a namespace mount \
         ('blobdrive mount {} DIR'), then 'losetup -f --show -o {offset} --sizelimit {size} DIR/{}'",
        names.container, names.blob
    );
    match fs.kind {
        FsKind::Lvm2Pv => Err(format!(
            "{what} is an LVM2 physical volume{uuid}; blobdrive mounts filesystems, and LVM needs \
             device-mapper: {by_hand} and 'vgchange -ay'"
        )),
        FsKind::Luks => Err(format!(
            "{what} is a LUKS encrypted container{uuid}; blobdrive mounts filesystems, and LUKS \
             needs device-mapper: {by_hand} and 'cryptsetup open' that loop device"
        )),
        FsKind::Swap => Err(format!(
            "{what} is Linux swap{uuid}: it holds no files to mount"
        )),
        _ => Ok(()),
    }
}

/// `1 (Linux filesystem, 24.0 MiB, ext4 'data'), 2 (...)`.
fn list(parts: &[PartitionInfo]) -> String {
    if parts.is_empty() {
        return "no partitions".into();
    }
    parts.iter().map(describe).collect::<Vec<_>>().join(", ")
}
