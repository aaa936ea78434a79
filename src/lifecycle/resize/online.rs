//! The online grow of a drive attached read-write on this host: the daemon
//! that holds the lease grows the blob, the FUSE file shows the new size,
//! then the attached area (the whole disk, or a partition through
//! `partitioned.rs`) and its loop device take the room, and the filesystem
//! grows into it, all with no remount.
//!
//! Invariants: one online grow of a drive at a time (a lock on the attach's
//! FUSE root); a drive is never shrunk while attached; each layer grows only
//! once the one below it shows the size it should (the FUSE file the new
//! disk size, the loop device exactly the area's size), so a filesystem is
//! never asked to grow past what its loop device reaches; a whole disk that
//! holds a partition table gets a bigger loop device but its filesystem is
//! left as it is (growing it could overwrite the table). Every failure after
//! the blob grew says which layers grew and what is left.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};

use super::partitioned::{extend_last_commands, grow_partition, read_table};
use super::{file_size, Area, ResizeReport};
use crate::attach::{filesystem, loopdev, FsType, LoopDevice};
use crate::daemon::registry::AttachedDrive;
use crate::partition::TableKind;
use crate::units::format_size;

/// How long the FUSE file may take to show its new size to the kernel
/// (attributes are cached for a few seconds).
const FILE_SIZE_WAIT: Duration = Duration::from_secs(15);

/// The drive file the daemon of `entry` serves (the FUSE root is the
/// drive's container).
fn drive_file(entry: &AttachedDrive) -> PathBuf {
    let name = entry
        .drive
        .split_once('/')
        .map_or(entry.drive.as_str(), |(_, b)| b);
    entry.fuse_dir.join(name)
}

/// Held for the whole of an online grow: an exclusive `flock` on the FUSE
/// root of the attach (the kernel keeps it; no tool the grow runs locks
/// it). Two grows of one drive at once would interleave their sfdisk runs,
/// and the one that read its table first could set the loop device's size
/// limit back below a filesystem the other had already grown.
struct GrowLock {
    _dir: std::fs::File,
}

impl GrowLock {
    fn take(entry: &AttachedDrive) -> anyhow::Result<GrowLock> {
        use std::os::fd::AsRawFd as _;
        let dir = std::fs::File::open(&entry.fuse_dir).map_err(|e| {
            anyhow!(
                "cannot open the private mount of {} ({}): {e}",
                entry.drive,
                entry.fuse_dir.display()
            )
        })?;
        // SAFETY: flock on a descriptor we own; no memory is passed.
        let rc = unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::WouldBlock {
                bail!(
                    "another 'blobdrive resize' of {} is running; let it finish, then run this one again if it is still needed",
                    entry.drive
                );
            }
            // A mount that cannot lock must not stop a resize: go on
            // unguarded, as before the lock existed.
            tracing::warn!(dir = %entry.fuse_dir.display(), error = %e, "cannot lock the attach for the resize");
        }
        Ok(GrowLock { _dir: dir })
    }
}

/// Grows a drive attached read-write on this host, in place: the daemon
/// grows the blob under its lease, then the FUSE file, the partition (when
/// one is attached and it is the last on the disk), the loop device and the
/// filesystem take the new size, with no remount. Blocking: run it off the
/// async runtime.
pub fn resize_online(entry: &AttachedDrive, new_size_bytes: u64) -> anyhow::Result<ResizeReport> {
    let _lock = GrowLock::take(entry)?;
    let file = drive_file(entry);
    let old = file_size(&file)?;
    if new_size_bytes < old {
        bail!(
            "drive {} is attached at {}: a drive is never shrunk while attached; unmount it first (and shrink it with --allow-shrink)",
            entry.drive,
            entry.dir.display()
        );
    }
    if let Some(number) = entry.partition {
        // A partition's loop device takes its new size by LOOP_SET_STATUS64,
        // which older kernels do not do safely under a mounted filesystem:
        // refuse before the blob grows, not after.
        loopdev::size_limit_change_allowed_here().map_err(|why| {
            anyhow!(
                "drive {} is attached by its partition {number}, which cannot grow while mounted \
                 on this host: {why}; unmount the drive, grow it offline ('blobdrive resize'), \
                 extend the partition on the drive file (sfdisk), mount it again and grow its \
                 filesystem (resize2fs or xfs_growfs)",
                entry.drive
            )
        })?;
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
        Some(number) => {
            let attached = device.area().map_err(|e| {
                anyhow!(
                    "the drive {} grew to {}, but its loop device cannot be read ({e}); its partition was not changed",
                    entry.drive,
                    format_size(new_size_bytes)
                )
            })?;
            grow_partition(entry, &file, number, attached, new_size_bytes)?
        }
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
