//! `resize`: offline, under a lease of its own for the few requests it takes;
//! online, by asking the daemon that holds the drive's lease on this host to
//! grow it, then making the loop device and the filesystem take the new size.
//!
//! The parts: `offline.rs` resizes a drive nobody has attached (a grow, or
//! a checked shrink; the footer moved under a lease of its own);
//! `online.rs` grows a drive attached read-write here (the daemon's grow,
//! the FUSE file's new size, the loop device, the filesystem);
//! `partitioned.rs` is the part of an online grow that belongs to a drive
//! attached by partition: which partition may grow, the sfdisk runs on the
//! drive file, their read-back and their undo. This file holds what the
//! command and the parts share: the report, the refusals, and the area a
//! grown attach covers.
//!
//! A drive attached by partition (a loop device with an offset and a size
//! limit over the drive file) grows in place when that partition is the last
//! on the disk: sfdisk, run on the drive file (so through the daemon), first
//! moves a GPT's backup to the new end of the disk, then extends the
//! partition to the last usable sector (an MBR one up to 2 TiB, a logical
//! one's extended partition first); the loop device then gets its new size
//! limit (`LoopDevice::set_size_limit`) and the filesystem grows. When it is
//! not the last, the disk grows and the report's todo gives the commands
//! that are left. Every step may run again (one already done changes
//! nothing), so running `resize` again at the same size finishes an
//! interrupted one, or extends the last partition of a drive grown offline.
//!
//! Invariants: a shrink is refused while attached, and offline unless what
//! the drive holds ends before the new end (its partitions and a GPT's
//! backup header, as the one layout detector reads them, table first; or a
//! whole-disk filesystem measured by its superblock); the blob keeps a valid footer at every step
//! (`drive::resize::move_footer`); every change sfdisk makes to a table is
//! read back with the project's own parser (`crate::partition`) and must
//! leave the other partitions as they were and the one extended at its
//! start; a change that does not check out is put back, sector for sector,
//! from sfdisk's own backup (`attach::table::TableUndo`). An offline grow
//! writes no table: a GPT's primary header still names the old backup, which
//! is still there, so the table reads (with a warning) until a tool moves it.

use std::path::Path;

use anyhow::Context as _;
use serde::Serialize;

use crate::blob::BlobPath;

mod offline;
mod online;
mod partitioned;
#[cfg(test)]
mod tests;

pub use offline::resize_offline;
pub use online::resize_online;

/// What a resize did.
#[derive(Debug, Clone, Serialize)]
pub struct ResizeReport {
    /// `container/blob`.
    pub drive: String,
    /// Disk size before, in bytes.
    pub old_size_bytes: u64,
    /// Disk size now, in bytes.
    pub new_size_bytes: u64,
    /// True when it was attached here and grown in place.
    pub online: bool,
    /// The filesystem found on the disk (`ext4`, `xfs`), if any.
    pub filesystem: Option<String>,
    /// True when the filesystem was grown to fill the disk.
    pub filesystem_grown: bool,
    /// True when this finished a resize an interruption had left half done.
    pub finished_interrupted: bool,
    /// The partition attached, when the drive is attached by partition.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<u32>,
    /// True when that partition was extended to the new end of the disk.
    pub partition_grown: bool,
    /// What is left for the user to do, if anything.
    pub todo: Option<String>,
}

/// The refusal of a shrink asked for without `--allow-shrink`: a usage
/// error (the command line must change), which the CLI reports as one.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ShrinkNotAllowed(pub String);

/// The line for a drive leased by someone other than this host's daemon.
pub fn leased_elsewhere(path: &BlobPath) -> String {
    format!(
        "drive {path} is mounted (leased) by another host or by a namespace mount; resize it where it is attached, \
         or unmount it first (run 'blobdrive break-lease {path}' only if that host is gone)"
    )
}

/// The drive file's size as this process sees it (through FUSE: the
/// kernel's cached attributes, see `online.rs`).
fn file_size(file: &Path) -> anyhow::Result<u64> {
    Ok(std::fs::metadata(file)
        .with_context(|| format!("cannot stat the drive file {}", file.display()))?
        .len())
}

/// How far the attached area of a drive reaches after the disk grew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Area {
    /// The whole disk is attached; the loop device took the new size.
    WholeDisk,
    /// A partition is attached; it is `size_bytes` long now (`grown` when
    /// this resize extended it).
    Partition { size_bytes: u64, grown: bool },
    /// Nothing attached can take more room (a partition that is not the
    /// last, a whole disk that holds a partition table).
    Unchanged,
}
