//! `resize`: offline, under a lease of its own for the few requests it takes;
//! online, by asking the daemon that holds the drive's lease on this host to
//! grow it, then making the loop device and the filesystem take the new size.
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
//! the drive holds ends before the new end (a filesystem measured by its
//! superblock; a partition table is refused outright, since its partitions
//! are not checked yet); the blob keeps a valid footer at every step
//! (`drive::resize::move_footer`); every change sfdisk makes to a table is
//! read back with the project's own parser (`crate::partition`) and must
//! leave the other partitions as they were and the one extended at its
//! start; a change that does not check out is put back, sector for sector,
//! from sfdisk's own backup (`attach::table::TableUndo`). An offline grow
//! writes no table: a GPT's primary header still names the old backup, which
//! is still there, so the table reads (with a warning) until a tool moves it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use serde::Serialize;

use super::checks::{blob_err, is_leased};
use super::layout::{self, Layout};
use crate::attach::table::{self, NewSize, TableUndo};
use crate::attach::{filesystem, FsType, LoopDevice};
use crate::blob::{BlobClient, BlobPath, BlobType};
use crate::daemon::registry::AttachedDrive;
use crate::drive::resize::{locate_footer, move_footer};
use crate::drive::{BlobPageStore, PageStore};
use crate::partition::{self, FileDisk, Partition, Table, TableKind, SECTOR_BYTES};
use crate::units::{format_size, ByteRange};

/// How long the FUSE file may take to show its new size to the kernel
/// (attributes are cached for a few seconds).
const FILE_SIZE_WAIT: Duration = Duration::from_secs(15);

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

/// Resizes a drive nobody has leased: grows it, or with `allow_shrink`
/// shrinks it after checking that nothing it holds reaches past the new end.
pub async fn resize_offline(
    client: &BlobClient,
    path: &BlobPath,
    new_size_bytes: u64,
    allow_shrink: bool,
) -> anyhow::Result<ResizeReport> {
    let props = client.get_properties(path).await.map_err(blob_err)?;
    if props.blob_type != Some(BlobType::PageBlob) {
        bail!("{path} is not a page blob, so not a drive");
    }
    if is_leased(props.lease_state) {
        bail!("{}", leased_elsewhere(path));
    }
    let lease_id = uuid::Uuid::new_v4().to_string();
    client
        .acquire_lease(path, &lease_id, None)
        .await
        .map_err(|e| {
            if e.is_lease_conflict() {
                anyhow!(leased_elsewhere(path))
            } else {
                blob_err(e)
            }
        })?;
    let result = resize_leased(client, path, new_size_bytes, allow_shrink, &lease_id).await;
    if let Err(e) = client.release_lease(path, &lease_id).await {
        tracing::warn!(drive = %path, error = %e, "could not release the resize lease");
    }
    result
}

async fn resize_leased(
    client: &BlobClient,
    path: &BlobPath,
    new_size_bytes: u64,
    allow_shrink: bool,
    lease_id: &str,
) -> anyhow::Result<ResizeReport> {
    let store = BlobPageStore::new(client.clone(), path.clone());
    let blob_bytes = store.size_bytes().await.map_err(blob_err)?;
    let located = locate_footer(&store, blob_bytes)
        .await
        .map_err(|e| anyhow!("{path} is not a drive: {e}"))?;
    let old = located.offset_bytes;
    let head_len = layout::HEAD_BYTES.min(old);
    let head = client
        .get_blob_range(path, ByteRange::new(0, head_len))
        .await
        .map_err(blob_err)?;
    let found = layout::detect(&head);
    if new_size_bytes < old {
        if !allow_shrink {
            return Err(ShrinkNotAllowed(format!(
                "{path} is {} and {} is smaller: shrinking cuts data off the end; add --allow-shrink to shrink it",
                format_size(old),
                format_size(new_size_bytes)
            ))
            .into());
        }
        check_shrink(&store, path, &found, old, new_size_bytes).await?;
    }
    let unchanged = new_size_bytes == old && !located.interrupted_grow;
    if !unchanged {
        move_footer(&store, &located.footer, old, new_size_bytes, Some(lease_id))
            .await
            .map_err(blob_err)?;
    }
    tracing::info!(drive = %path, old, new_size_bytes, "resized offline");
    let (filesystem, todo) = match found {
        Layout::Filesystem { kind, size_bytes } if size_bytes < new_size_bytes => (
            Some(kind.to_string()),
            Some(format!(
                "the {kind} filesystem is still {}: mount the drive and run 'blobdrive resize {path} --size {}' again to grow it in place",
                format_size(size_bytes),
                crate::units::exact_size(new_size_bytes)
            )),
        ),
        Layout::Filesystem { kind, .. } => (Some(kind.to_string()), None),
        Layout::PartitionTable(t) if new_size_bytes > old => (
            None,
            Some(format!(
                "the disk grew but its {t} partitions did not: mount the drive (its last partition) and run \
                 'blobdrive resize {path} --size {}' again to extend that partition and its filesystem in place, \
                 or extend the last partition yourself (sfdisk, growpart), then its filesystem",
                crate::units::exact_size(new_size_bytes)
            )),
        ),
        _ => (None, None),
    };
    Ok(ResizeReport {
        drive: path.to_string(),
        old_size_bytes: old,
        new_size_bytes,
        online: false,
        filesystem,
        filesystem_grown: false,
        finished_interrupted: located.interrupted_grow,
        partition: None,
        partition_grown: false,
        todo,
    })
}

async fn check_shrink(
    store: &BlobPageStore,
    path: &BlobPath,
    found: &Layout,
    old: u64,
    new_size_bytes: u64,
) -> anyhow::Result<()> {
    match *found {
        Layout::Filesystem { kind, size_bytes } if size_bytes > new_size_bytes => bail!(
            "the {kind} filesystem on {path} is {}: shrinking the drive to {} would cut it off; shrink the filesystem first",
            format_size(size_bytes),
            format_size(new_size_bytes)
        ),
        Layout::Filesystem { .. } => Ok(()),
        Layout::PartitionTable(t) => bail!(
            "{path} has a {t} partition table; blobdrive does not check partitions yet, so it does not shrink a partitioned drive"
        ),
        Layout::Unknown => {
            let beyond = store
                .page_ranges(ByteRange::new(new_size_bytes, old))
                .await
                .map_err(blob_err)?;
            if beyond.is_empty() {
                Ok(())
            } else {
                bail!(
                    "{path} holds data past {} and no filesystem blobdrive can measure; not shrinking it",
                    format_size(new_size_bytes)
                )
            }
        }
    }
}

/// The drive file the daemon of `entry` serves (the FUSE root is the
/// drive's container).
fn drive_file(entry: &AttachedDrive) -> PathBuf {
    let name = entry
        .drive
        .split_once('/')
        .map_or(entry.drive.as_str(), |(_, b)| b);
    entry.fuse_dir.join(name)
}

fn file_size(file: &Path) -> anyhow::Result<u64> {
    Ok(std::fs::metadata(file)
        .with_context(|| format!("cannot stat the drive file {}", file.display()))?
        .len())
}

/// Grows a drive attached read-write on this host, in place: the daemon
/// grows the blob under its lease, then the FUSE file, the partition (when
/// one is attached and it is the last on the disk), the loop device and the
/// filesystem take the new size, with no remount. Blocking: run it off the
/// async runtime.
pub fn resize_online(entry: &AttachedDrive, new_size_bytes: u64) -> anyhow::Result<ResizeReport> {
    let file = drive_file(entry);
    let old = file_size(&file)?;
    if new_size_bytes < old {
        bail!(
            "drive {} is attached at {}: a drive is never shrunk while attached; unmount it first (and shrink it with --allow-shrink)",
            entry.drive,
            entry.dir.display()
        );
    }
    crate::daemon::control::request_grow(&entry.dir, new_size_bytes)?;
    // The kernel caches the file's attributes; a stat after they expire
    // brings the new size in (a write racing with it can delay that).
    let started = Instant::now();
    while file_size(&file)? != new_size_bytes {
        if started.elapsed() > FILE_SIZE_WAIT {
            bail!(
                "the blob of {} grew to {}, but its FUSE file still shows {}; run 'blobdrive resize' again",
                entry.drive,
                format_size(new_size_bytes),
                format_size(file_size(&file)?)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let device = LoopDevice {
        device: entry.loop_device.clone(),
    };
    let (area, todo) = match entry.partition {
        None => grow_whole_disk(entry, &file, &device, new_size_bytes)?,
        Some(number) => grow_partition(entry, &file, number, new_size_bytes)?,
    };
    let mut report = ResizeReport {
        drive: entry.drive.clone(),
        old_size_bytes: old,
        new_size_bytes,
        online: true,
        filesystem: Some(entry.fs_type.clone()),
        filesystem_grown: false,
        finished_interrupted: false,
        partition: entry.partition,
        partition_grown: matches!(area, Area::Partition { grown: true, .. }),
        todo,
    };
    let size_limit_bytes = match area {
        // The filesystem has no room to grow into: the todo says why.
        Area::Unchanged => return Ok(report),
        Area::WholeDisk => None,
        Area::Partition { size_bytes, .. } => Some(size_bytes),
    };
    if let Some(size_bytes) = size_limit_bytes {
        let seen = device.set_size_limit(size_bytes).map_err(|e| {
            anyhow!(
                "the drive and partition {} grew, but its loop device did not: {e}; \
                 unmount and mount the drive to attach the whole partition",
                entry.partition.unwrap_or_default()
            )
        })?;
        if seen != size_bytes {
            bail!(
                "partition {} grew to {}, but {} shows {}",
                entry.partition.unwrap_or_default(),
                format_size(size_bytes),
                entry.loop_device.display(),
                format_size(seen)
            );
        }
    }
    let fs = FsType::from_name(&entry.fs_type);
    let grown = filesystem::grow(&fs, &entry.loop_device, &entry.dir).map_err(|e| {
        let also = report
            .todo
            .as_deref()
            .map(|t| format!("; also: {t}"))
            .unwrap_or_default();
        anyhow!("the drive and its loop device grew, but the filesystem did not: {e}{also}")
    })?;
    report.filesystem_grown = grown;
    if !grown {
        let left = format!(
            "blobdrive cannot grow a {} filesystem: grow it on {} yourself",
            entry.fs_type,
            entry.loop_device.display()
        );
        report.todo = Some(match report.todo.take() {
            Some(earlier) => format!("{earlier}; {left}"),
            None => left,
        });
    }
    Ok(report)
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

/// The loop device over the whole drive file takes the file's new size. A
/// whole disk that holds a partition table (which `mount` would not attach
/// whole) keeps its filesystem as it is: growing it could overwrite the
/// table, and which of the two is real is the user's call.
fn grow_whole_disk(
    entry: &AttachedDrive,
    file: &Path,
    device: &LoopDevice,
    new_size_bytes: u64,
) -> anyhow::Result<(Area, Option<String>)> {
    let seen = device
        .refresh_capacity()
        .map_err(|e| anyhow!("the drive grew, but its loop device did not: {e}"))?;
    if seen != new_size_bytes {
        bail!(
            "the drive grew to {}, but {} shows {}",
            format_size(new_size_bytes),
            entry.loop_device.display(),
            format_size(seen)
        );
    }
    let Ok(table) = read_table(file) else {
        return Ok((Area::WholeDisk, None));
    };
    let todo = format!(
        "{} is attached whole, yet holds {} {} partition table: the {} filesystem was not grown, since it could \
         overwrite the table; grow it on {} yourself if it really fills the disk, else {}",
        entry.drive,
        if table.kind == TableKind::Mbr { "an" } else { "a" },
        table.kind.name(),
        entry.fs_type,
        entry.loop_device.display(),
        extend_last_commands(entry, file, &table).unwrap_or_else(|| "none is listed".into())
    );
    Ok((Area::Unchanged, Some(todo)))
}

/// The largest disk an MBR describes: its sector numbers and counts are 32
/// bits, and tools keep every partition below sector 2^32 - 1 (2 TiB less
/// one sector).
const MBR_LIMIT_BYTES: u64 = u32::MAX as u64 * SECTOR_BYTES;

/// Extends partition `number`, attached from the drive file `file`, to the
/// end of the grown disk when it is the last partition: for a GPT, the
/// backup moves to the new end first; for an MBR, up to 2 TiB (a logical
/// partition's extended partition first). Each sfdisk run is read back and
/// checked; a change that does not check out is put back and is an error.
/// Returns the area the loop device should cover and what is left to do.
fn grow_partition(
    entry: &AttachedDrive,
    file: &Path,
    number: u32,
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
fn read_table(file: &Path) -> Result<Table, String> {
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
/// earlier. Returns the table read.
fn check_table(
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
fn put_back(
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
fn extend_last_commands(entry: &AttachedDrive, file: &Path, table: &Table) -> Option<String> {
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

#[cfg(test)]
mod tests {
    //! The partition policy on plain image files laid out by sfdisk (no
    //! FUSE, no loop device): `tests/partitions.rs` runs it on attached drives.

    use super::*;
    use crate::daemon::registry::AttachMode;

    const LINUX: &str = crate::partition::LINUX_FILESYSTEM_GUID;

    fn sfdisk_missing() -> bool {
        if crate::attach::tool_exists("sfdisk") {
            return false;
        }
        assert!(
            std::env::var("BLOBDRIVE_REQUIRE_FUSE").as_deref() != Ok("1"),
            "sfdisk is not installed"
        );
        true
    }

    /// An image of `size_bytes` laid out by the sfdisk `script`, then grown
    /// to `grown_bytes` (as the blob and its FUSE file grow).
    fn image(dir: &Path, size_bytes: u64, script: &str, grown_bytes: u64) -> PathBuf {
        use std::io::Write as _;
        let file = dir.join("disk.img");
        std::fs::File::create(&file)
            .unwrap()
            .set_len(size_bytes)
            .unwrap();
        let mut child = std::process::Command::new("sfdisk")
            .args(["--quiet", "--no-reread", "--no-tell-kernel"])
            .arg(&file)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(script.as_bytes())
            .unwrap();
        assert!(child.wait().unwrap().success(), "sfdisk {script}");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&file)
            .unwrap()
            .set_len(grown_bytes)
            .unwrap();
        file
    }

    fn entry(file: &Path) -> AttachedDrive {
        AttachedDrive {
            account: "acct".into(),
            drive: "c/disk.vhd".into(),
            snapshot: None,
            dir: "/mnt/disk".into(),
            loop_device: "/dev/loop9".into(),
            fs_type: "xfs".into(),
            partition: Some(1),
            mode: AttachMode::ReadWrite,
            pid: 1,
            fuse_dir: file.parent().unwrap().to_path_buf(),
            since_unix_secs: 0,
            alive: true,
        }
    }

    #[test]
    fn the_last_gpt_partition_reaches_the_new_end_and_the_backup_moves() {
        if sfdisk_missing() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let script = format!("label: gpt\nstart=2048, type={LINUX}\n");
        let file = image(dir.path(), 64 << 20, &script, 128 << 20);
        let (area, todo) = grow_partition(&entry(&file), &file, 1, 128 << 20).unwrap();
        let size_bytes = (128 << 20) - (1 << 20) - 33 * 512;
        assert_eq!(
            area,
            Area::Partition {
                size_bytes,
                grown: true
            }
        );
        assert_eq!(todo, None);
        let table = read_table(&file).unwrap();
        assert!(table.warnings.is_empty(), "{:?}", table.warnings);
        assert_eq!(table.partitions[0].size_bytes, size_bytes);
        // Again: nothing left to do, and the answer is the same.
        let (again, _) = grow_partition(&entry(&file), &file, 1, 128 << 20).unwrap();
        assert_eq!(
            again,
            Area::Partition {
                size_bytes,
                grown: false
            }
        );
    }

    #[test]
    fn a_partition_followed_by_another_is_left_and_the_todo_names_the_last() {
        if sfdisk_missing() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let script = format!(
            "label: gpt\nstart=2048, size=40960, type={LINUX}\nstart=43008, size=40960, type={LINUX}\n"
        );
        let file = image(dir.path(), 64 << 20, &script, 128 << 20);
        let before = std::fs::read(&file).unwrap();
        let (area, todo) = grow_partition(&entry(&file), &file, 1, 128 << 20).unwrap();
        assert_eq!(area, Area::Unchanged);
        let todo = todo.unwrap();
        assert!(
            todo.contains("partition 2 follows it")
                && todo.contains("sfdisk --relocate gpt-bak-std")
                && todo.contains("-N 2")
                && todo.contains("--size 128M"),
            "{todo}"
        );
        assert!(std::fs::read(&file).unwrap() == before, "the image changed");
    }

    #[test]
    fn an_mbr_partition_stops_at_two_tib_and_says_so() {
        if sfdisk_missing() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let disk_bytes = 3u64 << 40; // sparse
        let file = image(
            dir.path(),
            64 << 20,
            "label: dos\nstart=2048, type=83\n",
            disk_bytes,
        );
        let (area, todo) = grow_partition(&entry(&file), &file, 1, disk_bytes).unwrap();
        assert_eq!(
            area,
            Area::Partition {
                size_bytes: MBR_LIMIT_BYTES - (1 << 20),
                grown: true
            }
        );
        let todo = todo.unwrap();
        assert!(
            todo.contains("MBR") && todo.contains("stops there") && todo.contains("GPT"),
            "{todo}"
        );
    }

    #[test]
    fn a_change_that_does_not_check_out_is_put_back() {
        if sfdisk_missing() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let script = format!(
            "label: gpt\nstart=2048, size=40960, type={LINUX}\nstart=43008, type={LINUX}\n"
        );
        let file = image(dir.path(), 64 << 20, &script, 128 << 20);
        let before_bytes = std::fs::read(&file).unwrap();
        let before = read_table(&file).unwrap();
        let mut undo = TableUndo::new().unwrap();
        table::set_partition_size(&file, 2, NewSize::AsFarAsPossible, &mut undo).unwrap();
        // Partition 2 grew: fine when asked, a fault when not, or for another.
        check_table(&file, &before, Some((2, None))).unwrap();
        let unasked = check_table(&file, &before, None).unwrap_err();
        assert!(unasked.to_string().contains("partition 2 changed unasked"));
        let wrong_end = check_table(&file, &before, Some((2, Some(64 << 20)))).unwrap_err();
        assert!(
            wrong_end.to_string().contains("reads back as"),
            "{wrong_end}"
        );
        let err = put_back(&entry(&file), &file, &mut undo, &before, wrong_end).unwrap_err();
        assert!(
            err.to_string()
                .contains("the partition table was put back as it was"),
            "{err}"
        );
        assert!(
            std::fs::read(&file).unwrap() == before_bytes,
            "not put back"
        );
    }
}
