//! The partition step of an online grow, for a drive attached by partition:
//! extends the attached partition to the new end of the disk when it is the
//! last one, by running sfdisk on the drive file (so through the daemon,
//! into the blob), and otherwise says what is left to do.
//!
//! Invariants: nothing changes unless the table's partition of the attached
//! number starts where the loop device does and holds its whole size limit
//! (a table renumbered or remade since the mount names another partition);
//! the table is changed only through sfdisk (`attach::table`),
//! one run at a time, each saved by `--backup` into one `TableUndo`; after
//! every run the table is read back with the project's own parser
//! (`crate::partition`) and must parse, keep its kind and partitions, and
//! change only the partition asked for, at the same start and ending no
//! earlier (an MBR one exactly where asked), gaining no warning (a GPT read
//! only through its backup). Anything else puts every saved
//! sector back, checks that the table reads as before, and fails the resize;
//! a put-back that fails keeps sfdisk's files and names them. A GPT's backup
//! moves to the new end before any partition grows; an MBR partition ends at
//! 2 TiB at most; a logical partition's extended partition grows first.
//! Sizes are bytes throughout, turned into sectors only for sfdisk's script.

use std::path::Path;

use anyhow::{anyhow, bail, Context as _};

use super::{file_size, Area};
use crate::attach::loopdev::LoopArea;
use crate::attach::table::{self, NewSize, TableUndo};
use crate::daemon::registry::AttachedDrive;
use crate::partition::{self, FileDisk, Partition, Table, TableKind, SECTOR_BYTES};
use crate::units::format_size;

/// The largest disk an MBR describes: its sector numbers and counts are 32
/// bits, and tools keep every partition below sector 2^32 - 1 (2 TiB less
/// one sector).
pub(super) const MBR_LIMIT_BYTES: u64 = u32::MAX as u64 * SECTOR_BYTES;

/// Extends partition `number`, attached from the drive file `file`, to the
/// end of the grown disk when it is the last partition: for a GPT, the
/// backup moves to the new end first; for an MBR, up to 2 TiB (a logical
/// partition's extended partition first). Each sfdisk run is read back and
/// checked; a change that does not check out is put back and is an error.
/// Nothing changes unless the table's partition `number` is the one the
/// loop device shows (`attached`: same start, a size limit within it).
/// Returns the area the loop device should cover and what is left to do.
pub(super) fn grow_partition(
    entry: &AttachedDrive,
    file: &Path,
    number: u32,
    attached: LoopArea,
    disk_bytes: u64,
) -> anyhow::Result<(Area, Option<String>)> {
    let unreadable = |e: String| {
        anyhow!(
            "the drive {} grew to {}, but its partition table cannot be read now ({e}); nothing else was changed",
            entry.drive,
            format_size(disk_bytes)
        )
    };
    let table = read_table(file).map_err(unreadable)?;
    let Some(part) = table
        .partitions
        .iter()
        .find(|p| p.number == number)
        .cloned()
    else {
        return Err(unreadable(format!("it has no partition {number} any more")));
    };
    // The registry names the attached partition by number, the kernel
    // holds its bytes. A table changed since the mount (renumbered by a
    // sort, a partition deleted and made again) makes them disagree, and
    // extending the partition by number, then giving the loop device that
    // size from its own offset, would reach into a neighbour, and the
    // filesystem would grow over it.
    if attached.offset_bytes != part.start_bytes
        || attached.size_limit_bytes == 0
        || attached.size_limit_bytes > part.size_bytes
    {
        bail!(
            "the drive {} grew to {}, but its partition {number} is now bytes {}..{} of the disk, while {} shows              {} bytes from byte {}: the partition table changed since the mount, so neither was changed;              unmount the drive, check its table ('blobdrive info {}'), mount the partition again and resize again",
            entry.drive,
            format_size(disk_bytes),
            part.start_bytes,
            part.end_bytes(),
            entry.loop_device.display(),
            attached.size_limit_bytes,
            attached.offset_bytes,
            entry.drive,
        );
    }
    let container = extended_of(&table, &part).cloned();
    let is_container = |p: &Partition| container.as_ref().is_some_and(|c| c.number == p.number);
    if let Some(after) = table
        .partitions
        .iter()
        .filter(|p| p.number != number && !is_container(p) && p.end_bytes() > part.end_bytes())
        .max_by_key(|p| p.end_bytes())
    {
        let todo = not_last_todo(entry, file, &table, &part, after);
        return Ok((Area::Unchanged, Some(todo)));
    }
    let mut undo = TableUndo::new()?;
    let mut todo = None;
    let target_end_bytes = match table.kind {
        TableKind::Gpt => {
            if !gpt_backup_at_end(file, disk_bytes)? {
                table::relocate_gpt_backup(file, &mut undo)
                    .map_err(anyhow::Error::from)
                    .and_then(|()| check_table(file, &table, None))
                    .or_else(|e| put_back(entry, file, &mut undo, &table, e))?;
            }
            None
        }
        TableKind::Mbr => {
            if disk_bytes > MBR_LIMIT_BYTES {
                todo = Some(format!(
                    "an MBR partition table cannot describe more than {}: partition {number} stops there, \
                     and the last {} of the disk stay unused (convert the table to GPT, e.g. with gdisk, to use them)",
                    format_size(MBR_LIMIT_BYTES),
                    format_size(disk_bytes - MBR_LIMIT_BYTES)
                ));
            }
            Some(disk_bytes.min(MBR_LIMIT_BYTES) / SECTOR_BYTES * SECTOR_BYTES)
        }
    };
    // Outermost first: a logical partition cannot reach past its extended one.
    let mut current = table.clone();
    for grows in container.iter().chain(std::iter::once(&part)) {
        let size = match target_end_bytes {
            Some(end) if end <= grows.end_bytes() => continue,
            Some(end) => NewSize::Sectors((end - grows.start_bytes) / SECTOR_BYTES),
            None => NewSize::AsFarAsPossible,
        };
        current = table::set_partition_size(file, grows.number, size, &mut undo)
            .map_err(anyhow::Error::from)
            .and_then(|()| check_table(file, &current, Some((grows.number, target_end_bytes))))
            .or_else(|e| put_back(entry, file, &mut undo, &table, e))?;
    }
    let now = current
        .partitions
        .iter()
        .find(|p| p.number == number)
        .cloned()
        .unwrap_or(part.clone());
    let grown = now.size_bytes > part.size_bytes;
    if grown {
        tracing::info!(
            drive = %entry.drive,
            partition = number,
            from_bytes = part.size_bytes,
            to_bytes = now.size_bytes,
            "partition extended"
        );
    }
    Ok((
        Area::Partition {
            size_bytes: now.size_bytes,
            grown,
        },
        todo,
    ))
}

/// The table of the drive file, read through the project's own parser.
pub(super) fn read_table(file: &Path) -> Result<Table, String> {
    let mut disk = FileDisk::open(file).map_err(|e| e.to_string())?;
    match partition::read_table(&mut disk) {
        Ok(Some(table)) => Ok(table),
        Ok(None) => Err("it holds no partition table".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// True when the disk's last sector holds a GPT header (the backup is where
/// it belongs; a disk just grown has zeros there).
fn gpt_backup_at_end(file: &Path, disk_bytes: u64) -> anyhow::Result<bool> {
    use partition::DiskReader as _;
    let mut disk = FileDisk::open(file)
        .with_context(|| format!("cannot open the drive file {}", file.display()))?;
    let last = disk
        .read_at(disk_bytes - SECTOR_BYTES, SECTOR_BYTES as usize)
        .with_context(|| format!("cannot read the last sector of {}", file.display()))?;
    Ok(partition::gpt::has_signature(&last))
}

/// Reads the table back after an sfdisk run and checks it against `before`:
/// it parses, has the same kind and partitions, and only `changed` (number,
/// and the end it must reach, if exact) differs: same start, an end no
/// earlier; and no warning appears that `before` did not have (a warning
/// may go: a backup moved to the end). Returns the table read.
pub(super) fn check_table(
    file: &Path,
    before: &Table,
    changed: Option<(u32, Option<u64>)>,
) -> anyhow::Result<Table> {
    let after = read_table(file).map_err(|e| anyhow!("the table does not read back: {e}"))?;
    if after.kind != before.kind || after.partitions.len() != before.partitions.len() {
        bail!(
            "the table reads back as {} with {} partitions",
            after.kind.name(),
            after.partitions.len()
        );
    }
    // A table that reads only through its backup copy (a primary GPT sfdisk
    // left unusable) still parses with the same partitions: only a warning
    // the table did not have before tells.
    if let Some(w) = after.warnings.iter().find(|w| !before.warnings.contains(w)) {
        bail!("the table reads back with a new fault: {w}");
    }
    for (old, new) in before.partitions.iter().zip(&after.partitions) {
        let (asked, end) = match changed {
            Some((number, end)) if number == old.number => (true, end),
            _ => (false, None),
        };
        // Only the size of the partition asked for may change.
        let same_but_size = Partition {
            size_bytes: old.size_bytes,
            ..new.clone()
        } == *old;
        if !asked && old != new {
            bail!("partition {} changed unasked", old.number);
        }
        if asked
            && (!same_but_size
                || new.end_bytes() < old.end_bytes()
                || end.is_some_and(|end| new.end_bytes() != end))
        {
            bail!(
                "partition {} reads back as bytes {}..{} (it was {}..{})",
                old.number,
                new.start_bytes,
                new.end_bytes(),
                old.start_bytes,
                old.end_bytes()
            );
        }
    }
    Ok(after)
}

/// After a failed or wrong sfdisk run: puts every sector sfdisk changed
/// back, checks the table reads as before, and turns `why` into the error.
pub(super) fn put_back(
    entry: &AttachedDrive,
    file: &Path,
    undo: &mut TableUndo,
    before: &Table,
    why: anyhow::Error,
) -> anyhow::Result<Table> {
    let restored = undo
        .restore(file)
        .map_err(anyhow::Error::from)
        .and_then(|_| check_table(file, before, None).map(|_| ()));
    match restored {
        Ok(()) => bail!(
            "the drive {} grew to {}, but extending its partition failed ({why:#}); the partition table was put back as it was",
            entry.drive,
            format_size(file_size(file).unwrap_or_default())
        ),
        Err(e) => {
            undo.keep();
            bail!(
                "the drive {} grew, but extending its partition failed ({why:#}), and putting the table back failed too ({e:#}); \
                 the sectors sfdisk overwrote are saved in {} (sfdisk names each file by its offset)",
                entry.drive,
                undo.dir().display()
            )
        }
    }
}

/// What is left when partition `attached` is not the last on the disk
/// (`after` ends beyond it): the disk grew, the space is free at the end.
fn not_last_todo(
    entry: &AttachedDrive,
    file: &Path,
    table: &Table,
    attached: &Partition,
    after: &Partition,
) -> String {
    format!(
        "partition {a} (attached at {dir}) cannot grow in place, since partition {b} follows it; {what}",
        a = attached.number,
        dir = entry.dir.display(),
        b = after.number,
        what = extend_last_commands(entry, file, table).unwrap_or_default(),
    )
}

/// What gives the free space at the end of the disk to its last partition:
/// the sfdisk commands (its extended partition first, for a logical one)
/// and the filesystem's grow, or a resize again with that partition
/// attached, which does both. None for a table without partitions.
pub(super) fn extend_last_commands(
    entry: &AttachedDrive,
    file: &Path,
    table: &Table,
) -> Option<String> {
    let last = table
        .partitions
        .iter()
        .filter(|p| !p.kind.is_extended())
        .max_by_key(|p| p.end_bytes())?;
    let disk_bytes = file_size(file).unwrap_or_default();
    let f = file.display();
    let mut cmds = Vec::new();
    if table.kind == TableKind::Gpt {
        cmds.push(format!("sfdisk --relocate gpt-bak-std {f}"));
    }
    for n in extended_of(table, last)
        .map(|c| c.number)
        .into_iter()
        .chain([last.number])
    {
        cmds.push(format!(
            "echo ,+ | sfdisk --no-reread --no-tell-kernel -N {n} {f}"
        ));
    }
    Some(format!(
        "the {free} at the end of the disk are unallocated: to give them to partition {l}, the last one, \
         run '{cmds}' while the drive is attached, then grow the filesystem in partition {l} \
         (or attach partition {l} and run 'blobdrive resize {drive} --size {size}' again, which does both)",
        free = format_size(disk_bytes.saturating_sub(last.end_bytes())),
        cmds = cmds.join("; "),
        l = last.number,
        drive = entry.drive,
        size = crate::units::exact_size(disk_bytes),
    ))
}

/// The MBR extended partition holding `part`, when it is a logical one.
fn extended_of<'t>(table: &'t Table, part: &Partition) -> Option<&'t Partition> {
    table.partitions.iter().find(|p| {
        p.kind.is_extended()
            && p.number != part.number
            && p.start_bytes <= part.start_bytes
            && part.end_bytes() <= p.end_bytes()
    })
}
