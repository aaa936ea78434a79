//! Attach mode of the daemon (`blobdrive mount C/B DIR`): the drive file served
//! from a private FUSE mount, a loop device with direct I/O over it, and the
//! filesystem inside mounted at the user's DIR.
//!
//! The private mount is served by our own FUSE layer (`fs/session.rs`), whose
//! node ids are fixed by the drive's path (`one_drive::node_id_at_depth`).
//!
//! Setup, in order: open the drive through the FUSE core and keep that handle
//! for the daemon's life (a read-write open takes the lease here, so a held
//! lease fails with its own clear line before any kernel object exists), attach
//! the loop device (read-only for read-only and snapshot attaches; for a
//! partition, with its offset and size limit over the drive file), detect the
//! filesystem, mount it at DIR, record the attach in the registry. Each step
//! that succeeded is recorded in [`Attachment`], and [`Attachment::detach`]
//! undoes exactly those, in reverse: a failure half way leaves nothing behind.
//!
//! Teardown: unmount DIR (busy: refuse an unmount request, detach lazily on a
//! signal), detach the loop device and wait for it to let go of the drive file;
//! then the daemon's common shutdown flushes, unmounts the private FUSE mount
//! and closes the drive (flush, release the lease).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};

use super::mountpoint::{is_mount_point, lazy_unmount};
use super::registry::{self, AttachMode, AttachedDrive};
use super::{umount, OnBusy, ShutdownError};
use crate::attach::{filesystem, FsType, LoopDevice, MountedFs, ReadQueue};
use crate::fs::fuse::MAX_WRITE_BYTES;
use crate::fs::inodes::ROOT_INO;
use crate::fs::one_drive::{node_id_at_depth, relative_file_name};
use crate::fs::{EntryPath, FsCore};

/// How long a detached loop device may take to let go of the drive file.
const LOOP_RELEASE_TIMEOUT: Duration = Duration::from_secs(20);
/// How often the daemon checks that DIR is still mounted.
const WATCH_INTERVAL: Duration = Duration::from_millis(500);

/// Dirty page cache the kernel may hold for a writable attached drive's
/// filesystem (see [`LoopDevice::limit_dirty_cache`]): sixteen Put Pages,
/// enough to keep the daemon's flush busy; what the writeback hands the
/// daemon, its own dirty budget absorbs.
const KERNEL_DIRTY_LIMIT_BYTES: u64 = 64 * 1024 * 1024;

/// The loop device's largest request: the largest the FUSE connection
/// takes (INIT's `max_pages` covers [`MAX_WRITE_BYTES`]), so each request
/// the loop device sends reaches the daemon whole. The kernel's default
/// (1280 KiB) arrived cut in two, 1 MiB and 256 KiB: 1.6 FUSE requests per
/// MiB instead of one.
const LOOP_MAX_REQUEST_KIB: u32 = MAX_WRITE_BYTES / 1024;

/// The read-ahead of the files in an attached drive's filesystem: 512 KiB,
/// which a program that asks for sequential read-ahead (`cat`, `cp`:
/// `POSIX_FADV_SEQUENTIAL`, twice the device's) or reads 1 MiB at a time
/// (`dd bs=1M`; a read larger than the read-ahead reaches up to one
/// largest request) turns into one 1 MiB request at a time. The drive's own
/// read-ahead fetches far ahead of the kernel's, so a request or two in
/// flight keep a sequential read at the cache's pace. The kernel's default
/// (2560 KiB, twice the largest request; 5 MiB for `cat`) made ext4 cache
/// the file in 2 MiB folios, which on this project's test VM cost the
/// daemon 2.5-3 times as much CPU per byte to fill as 1 MiB ones (the
/// FUSE reply's copy is the first write to memory the host had taken back:
/// virtio-balloon free page reporting): a cold `cat` of 1 GiB cost the
/// daemon 1.28 times what `dd bs=1M` did; at this setting 1.02
/// (docs/kernel.md).
const LOOP_READ_AHEAD_KIB: u32 = 512;

/// What `blobdrive mount C/B DIR` asks for beyond a FUSE mount.
#[derive(Debug, Clone)]
pub struct AttachOptions {
    /// The drive (with its snapshot time for a snapshot attach).
    pub drive: EntryPath,
    /// Storage account name, for the registry.
    pub account: String,
    /// Options passed to the inner filesystem's mount (`-o`).
    pub fs_options: Vec<String>,
    /// The partition to attach; None attaches the whole disk.
    pub partition: Option<PartitionArea>,
    /// Bytes of the write log of a read-write attach (see
    /// `fs/write_log.rs`): what the dirty limit lets the cache hold, plus
    /// room for the writes in flight.
    pub write_log_bytes: u64,
    /// The data key of an encrypted drive: a salvage seals what it saves
    /// from the write log with it, as the blob would hold it.
    pub data_key: Option<std::sync::Arc<crate::crypt::DataKey>>,
}

/// A partition of the drive, as the loop device sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionArea {
    /// Its number in the partition table.
    pub number: u32,
    /// First byte on the disk.
    pub offset_bytes: u64,
    /// Length in bytes.
    pub size_bytes: u64,
}

impl AttachOptions {
    /// How the drive is attached, given the mount's read-only flag.
    pub fn mode(&self, read_only: bool) -> AttachMode {
        if self.drive.snapshot.is_some() {
            AttachMode::Snapshot
        } else if read_only {
            AttachMode::ReadOnly
        } else {
            AttachMode::ReadWrite
        }
    }

    /// `container/blob`, or `container/blob (snapshot T)`, for messages.
    pub fn display_name(&self) -> String {
        let base = format!("{}/{}", self.drive.container, self.drive.blob);
        match &self.drive.snapshot {
            Some(t) => format!("{base} (snapshot {t})"),
            None => base,
        }
    }
}

/// The kernel objects of one attach, each present only while it exists.
pub(crate) struct Attachment {
    dir: PathBuf,
    fuse_dir: PathBuf,
    spec: AttachOptions,
    mode: AttachMode,
    loop_device: Option<LoopDevice>,
    /// The loop device's queue settings before this attach set its own, put
    /// back before the detach (a takeover does not know them: the device
    /// then keeps this attach's, a smaller read-ahead, until it is set again).
    loop_queue_before: Option<ReadQueue>,
    /// The filesystem type while it is mounted at `dir`.
    mounted: Option<FsType>,
    /// DIR was detached lazily: the loop device lets go only after its last user.
    lazily_unmounted: bool,
    registered: bool,
    /// The holder process, recorded in the registry.
    holder_pid: Option<u32>,
    /// When the drive was attached (kept across takeovers).
    since_unix_secs: u64,
    /// What the user who attached it should hear (see `MountedFs::warning`).
    pub warnings: Vec<String>,
}

impl Attachment {
    /// An attach of `spec` at `dir` (canonical), served from `fuse_dir`.
    pub fn new(dir: &Path, fuse_dir: &Path, spec: AttachOptions, read_only: bool) -> Self {
        Attachment {
            dir: dir.to_path_buf(),
            fuse_dir: fuse_dir.to_path_buf(),
            mode: spec.mode(read_only),
            spec,
            loop_device: None,
            loop_queue_before: None,
            mounted: None,
            lazily_unmounted: false,
            registered: false,
            holder_pid: None,
            since_unix_secs: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            warnings: Vec::new(),
        }
    }

    /// Records `pid` as the attach's holder (in the registry entry).
    pub fn set_holder(&mut self, pid: u32) {
        self.holder_pid = Some(pid);
    }

    /// The attach a process that died had set up, as its registry entry
    /// says: the loop device and the filesystem at DIR exist and stay; this
    /// process takes over their teardown.
    /// Refused when the entry is another attach (a unit whose configuration
    /// names another drive since the attach began: taking it over would
    /// serve one drive's filesystem from another's blob).
    pub fn adopt(&mut self, entry: &AttachedDrive) -> anyhow::Result<()> {
        let drive = format!("{}/{}", self.spec.drive.container, self.spec.drive.blob);
        let partition = self.spec.partition.map(|p| p.number);
        let snapshot = &self.spec.drive.snapshot;
        let account = &self.spec.account;
        if (account, &drive, snapshot, partition, self.mode)
            != (
                &entry.account,
                &entry.drive,
                &entry.snapshot,
                entry.partition,
                entry.mode,
            )
        {
            anyhow::bail!(
                "the attach at {} is of {} (account {}, snapshot {:?}, partition {:?}, {:?}), \
                 but this command names {} (account {}, snapshot {:?}, partition {:?}, {:?}); \
                 run it with the attach's own drive and options to take it over",
                self.dir.display(),
                entry.drive,
                entry.account,
                entry.snapshot,
                entry.partition,
                entry.mode,
                drive,
                account,
                snapshot,
                partition,
                self.mode
            );
        }
        // Only what is still this attach's: a loop device reading the drive
        // file under this attach's FUSE mount (its number may have gone to
        // another attach since), a filesystem still mounted at DIR.
        self.loop_device = loop_backing_file(&entry.loop_device)
            .filter(|file| file.starts_with(&self.fuse_dir))
            .map(|_| LoopDevice {
                device: entry.loop_device.clone(),
            });
        self.mounted = is_mount_point(&self.dir)
            .unwrap_or(false)
            .then(|| FsType::from_name(&entry.fs_type));
        self.registered = true;
        self.since_unix_secs = entry.since_unix_secs;
        Ok(())
    }

    /// Walks to the drive file (fixing the node ids the kernel uses, the same
    /// in every process) and returns its node id.
    pub async fn resolve(&self, core: &FsCore) -> anyhow::Result<u64> {
        let name = self.spec.display_name();
        let file_name = relative_file_name(&self.spec.drive);
        let mut ino = ROOT_INO;
        for (depth, part) in file_name.split('/').enumerate() {
            ino = core
                .lookup(ino, part)
                .await
                .map_err(|e| anyhow!("cannot find drive {name}: {e}"))?
                .ino
                .0;
            // The kernel's node ids must be those any process derives from
            // the spec (a takeover resolves them by this same walk).
            if ino != node_id_at_depth(depth) {
                return Err(anyhow!(
                    "internal error: {part} of drive {name} got node id {ino}, not {}",
                    node_id_at_depth(depth)
                ));
            }
        }
        Ok(ino)
    }

    /// The user's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// True while the filesystem is mounted at DIR.
    pub fn is_mounted(&self) -> bool {
        self.mounted.is_some()
    }

    /// Opens the drive, attaches the loop device, mounts the filesystem at DIR
    /// and records the attach. Returns the handle it keeps open (node id,
    /// handle, writable). On error, call [`Attachment::detach`].
    pub async fn setup(&mut self, core: &FsCore) -> anyhow::Result<(u64, u64, bool)> {
        let name = self.spec.display_name();
        let file_name = relative_file_name(&self.spec.drive);
        let writable = self.mode == AttachMode::ReadWrite;
        let ino = self.resolve(core).await?;
        // The handle stays open until the daemon closes every device at the end.
        let (fh, _) = core.open(ino, writable).await.map_err(|e| {
            if e.errno == libc::EBUSY {
                anyhow!("{}", e.message)
            } else {
                anyhow!("cannot open drive {name}: {e}")
            }
        })?;

        let file = self.fuse_dir.join(&file_name);
        let read_only = !writable;
        let area = self.spec.partition.map(|p| (p.offset_bytes, p.size_bytes));
        let device = blocking(move || LoopDevice::attach_area(&file, read_only, area))
            .await
            .with_context(|| format!("cannot attach a loop device to drive {name}"))?;
        tracing::info!(device = %device.device.display(), "loop device attached");
        self.loop_device = Some(device.clone());
        let queued = device.clone();
        let queue = ReadQueue {
            max_request_kib: LOOP_MAX_REQUEST_KIB,
            read_ahead_kib: LOOP_READ_AHEAD_KIB,
        };
        match blocking(move || queued.set_read_queue(queue)).await {
            Ok(before) => self.loop_queue_before = Some(before),
            // Reads still work, with the kernel's defaults.
            Err(err) => {
                tracing::warn!(%err, "cannot set the loop device's request size and read-ahead")
            }
        }
        if writable {
            let bounded = device.clone();
            let limit = blocking(move || bounded.limit_dirty_cache(KERNEL_DIRTY_LIMIT_BYTES));
            if let Err(err) = limit.await {
                // Older kernels lack the setting: writes then start
                // reaching the drive at the kernel's own thresholds.
                tracing::debug!(%err, "cannot bound the loop device's dirty page cache");
            }
        }

        let probe = device.device.clone();
        let fs = blocking(move || filesystem::detect(&probe))
            .await
            .with_context(|| format!("cannot read the filesystem type of drive {name}"))?
            .ok_or_else(|| self.no_filesystem_line())?;

        let (dev, dir, options) = (
            device.device.clone(),
            self.dir.clone(),
            self.spec.fs_options.clone(),
        );
        let fs_for_mount = fs.clone();
        let mounted =
            blocking(move || MountedFs::mount(&dev, &dir, fs_for_mount, read_only, &options))
                .await
                .with_context(|| {
                    format!(
                        "cannot mount the {fs} filesystem of drive {name} at {}",
                        self.dir.display()
                    )
                })?;
        self.warnings
            .extend(mounted.warning.map(|w| format!("drive {name}: {w}")));
        self.mounted = Some(fs.clone());
        tracing::info!(dir = %self.dir.display(), %fs, "filesystem mounted");

        self.register()?;
        Ok((ino, fh, writable))
    }

    /// Writes the registry entry, naming this process as the one serving.
    pub fn register(&mut self) -> anyhow::Result<()> {
        let (Some(device), Some(fs)) = (&self.loop_device, &self.mounted) else {
            return Err(anyhow!("internal error: registering an attach not set up"));
        };
        let entry = AttachedDrive {
            account: self.spec.account.clone(),
            drive: format!("{}/{}", self.spec.drive.container, self.spec.drive.blob),
            snapshot: self.spec.drive.snapshot.clone(),
            dir: self.dir.clone(),
            loop_device: device.device.clone(),
            fs_type: fs.name().to_string(),
            partition: self.spec.partition.map(|p| p.number),
            mode: self.mode,
            pid: std::process::id(),
            holder_pid: self.holder_pid,
            fuse_dir: self.fuse_dir.clone(),
            since_unix_secs: self.since_unix_secs,
            alive: true,
        };
        registry::write(&entry)?;
        self.registered = true;
        Ok(())
    }

    /// The refusal when blkid finds no filesystem where one was expected. The
    /// command checked before attaching that the drive is not empty (an
    /// empty drive is refused there, with the advice to make a filesystem),
    /// so this never suggests mkfs: whatever is there may be someone's data.
    fn no_filesystem_line(&self) -> anyhow::Error {
        let name = self.spec.display_name();
        let base = format!("{}/{}", self.spec.drive.container, self.spec.drive.blob);
        let what = match self.spec.partition {
            Some(p) => format!("partition {} of drive {name}", p.number),
            None => format!("drive {name}"),
        };
        anyhow!(
            "{what} holds no filesystem the kernel recognises; nothing was changed (blobdrive \
             suggests mkfs only for an empty drive). 'blobdrive info {base}' shows what the drive holds; its bytes can be read \
             through a namespace mount ('blobdrive mount {} DIR')",
            self.spec.drive.container
        )
    }

    /// Unmounts DIR and detaches the loop device (whatever of them exists).
    /// With [`OnBusy::Refuse`] a busy DIR is left mounted and the reason returned.
    pub async fn detach(&mut self, on_busy: OnBusy) -> Result<(), ShutdownError> {
        if self.mounted.is_some() {
            match umount(&self.dir, 0).await {
                Ok(()) => {}
                Err(err) if err.raw_os_error() == Some(libc::EBUSY) => match on_busy {
                    OnBusy::Refuse => {
                        return Err(ShutdownError::Refused(format!(
                            "{} is busy (a process has a file open or its working directory \
                             there; see 'fuser -vm {}'); nothing was changed",
                            self.dir.display(),
                            self.dir.display()
                        )))
                    }
                    OnBusy::DetachLazily => {
                        tracing::warn!(
                            dir = %self.dir.display(),
                            "filesystem busy; detaching it lazily, the drive stays \
                             attached until its last user is gone"
                        );
                        umount(&self.dir, libc::MNT_DETACH).await.map_err(|e| {
                            ShutdownError::Failed(format!(
                                "lazy unmount of {} failed: {e}",
                                self.dir.display()
                            ))
                        })?;
                        self.lazily_unmounted = true;
                    }
                },
                Err(err) if err.raw_os_error() == Some(libc::EINVAL) => {
                    tracing::debug!("filesystem already unmounted");
                }
                Err(err) => {
                    return Err(ShutdownError::Refused(format!(
                        "unmount of {} failed: {err}",
                        self.dir.display()
                    )))
                }
            }
            self.mounted = None;
            tracing::info!(dir = %self.dir.display(), "filesystem unmounted");
        }
        if let Some(device) = self.loop_device.take() {
            let node = device.device.clone();
            let before = self.loop_queue_before.take();
            let detach = move || {
                if let Some(before) = before {
                    device.restore_read_queue(before);
                }
                device.detach()
            };
            if let Err(err) = blocking(detach).await {
                // Gone already (someone ran losetup -d) is fine; anything else
                // leaves the device and is reported.
                if loop_backing_file(&node).is_some() {
                    return Err(ShutdownError::Failed(format!(
                        "cannot detach loop device {}: {err}",
                        node.display()
                    )));
                }
            }
            if !self.lazily_unmounted {
                wait_for_loop_release(&node).await;
            }
            tracing::info!(device = %node.display(), "loop device detached");
        }
        Ok(())
    }

    /// Forgets the attach: registry entry and private mountpoint directory.
    pub fn finish(&mut self) {
        if self.registered {
            registry::remove(&self.dir);
            self.registered = false;
        }
        let _ = std::fs::remove_dir(&self.fuse_dir);
    }
}

/// Removes what the dead daemon of `entry` left: the filesystem at its
/// directory (detached lazily), its loop device (only if it still reads a
/// file under the attach's private FUSE mount), that dead FUSE mount, and
/// the registry entry. Returns what it removed, for the user.
pub fn remove_dead(entry: &AttachedDrive) -> anyhow::Result<Vec<String>> {
    let mut removed = Vec::new();
    if is_mount_point(&entry.dir).unwrap_or(false) {
        lazy_unmount(&entry.dir)?;
        removed.push(format!("the filesystem at {}", entry.dir.display()));
    }
    let node = &entry.loop_device;
    if loop_backing_file(node).is_some_and(|f| f.starts_with(&entry.fuse_dir)) {
        LoopDevice {
            device: node.clone(),
        }
        .detach()
        .with_context(|| format!("cannot detach {}", node.display()))?;
        removed.push(node.display().to_string());
    }
    if is_mount_point(&entry.fuse_dir).unwrap_or(false) {
        lazy_unmount(&entry.fuse_dir)?;
        removed.push("its FUSE mount".into());
    }
    let _ = std::fs::remove_dir(&entry.fuse_dir);
    registry::remove(&entry.dir);
    Ok(removed)
}

/// The file behind loop device `node`, if it has one.
pub(crate) fn loop_backing_file(node: &Path) -> Option<PathBuf> {
    let name = node.file_name()?.to_string_lossy().into_owned();
    let text = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()?;
    Some(PathBuf::from(text.trim_end()))
}

/// Runs a blocking tool call off the async threads.
async fn blocking<T, E>(f: impl FnOnce() -> Result<T, E> + Send + 'static) -> anyhow::Result<T>
where
    T: Send + 'static,
    E: std::error::Error + Send + Sync + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .context("a tool call panicked")?
        .map_err(anyhow::Error::new)
}

/// The kernel lets go of a detached loop device's file asynchronously; the
/// FUSE unmount that follows is clean only once it has.
async fn wait_for_loop_release(node: &Path) {
    let start = Instant::now();
    while loop_backing_file(node).is_some() {
        if start.elapsed() > LOOP_RELEASE_TIMEOUT {
            tracing::warn!(device = %node.display(), "loop device still holds the drive file");
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Returns once nothing is mounted at `dir` any more (someone ran `umount
/// DIR`, or systemd stopped the mount unit of an fstab line).
pub(crate) async fn wait_until_unmounted_outside(dir: PathBuf) {
    loop {
        tokio::time::sleep(WATCH_INTERVAL).await;
        match is_mount_point(&dir) {
            Ok(false) => return,
            Ok(true) => {}
            Err(err) => tracing::debug!(%err, "cannot read /proc/self/mountinfo"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_follows_snapshot_then_read_only() {
        let mut spec = AttachOptions {
            drive: EntryPath {
                container: "c".into(),
                blob: "d.vhd".into(),
                snapshot: None,
            },
            account: "a".into(),
            fs_options: Vec::new(),
            partition: None,
            write_log_bytes: 0,
            data_key: None,
        };
        assert_eq!(spec.mode(false), AttachMode::ReadWrite);
        assert_eq!(spec.mode(true), AttachMode::ReadOnly);
        spec.drive.snapshot = Some("T".into());
        assert_eq!(spec.mode(false), AttachMode::Snapshot);
        assert_eq!(spec.display_name(), "c/d.vhd (snapshot T)");
    }
}
