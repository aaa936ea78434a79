//! The filesystem inside a drive: detect its type, make one, mount it at the
//! user's directory, freeze it for a consistent snapshot, grow it in place,
//! unmount it.
//!
//! A read-only mount of a snapshot taken while the filesystem was live must not
//! replay the journal (the device is read-only): ext4 gets `noload` and xfs
//! `norecovery`, so any number of machines can mount the same snapshot. XFS
//! also refuses a second mount of the same filesystem UUID, which a snapshot
//! attached beside its live drive (or beside another attach of itself) is:
//! read-only xfs mounts get `nouuid`, and so does a read-write one whose
//! UUID a mounted XFS filesystem has (a copy attached beside its source),
//! with a warning that says so.

use std::fmt;
use std::path::{Path, PathBuf};

use super::tool::{run, ToolError};

/// Grows the mounted filesystem on `device` (mounted at `dir`) to fill the
/// device, in place: `resize2fs` for ext2/3/4, `xfs_growfs` for xfs.
/// Returns `false` for a type it cannot grow.
pub fn grow(fs: &FsType, device: &Path, dir: &Path) -> Result<bool, ToolError> {
    match fs.name() {
        "ext4" | "ext3" | "ext2" => match run("resize2fs", [device.as_os_str()]) {
            Ok(_) => Ok(true),
            // The kernel's online ext4 resize needs CAP_SYS_RESOURCE, which
            // some containers drop even for root.
            Err(mut e) if !has_cap_sys_resource() => {
                e.detail = format!(
                    "{}: growing a mounted ext4 filesystem needs CAP_SYS_RESOURCE, which this process lacks (a container?); \
                     run 'resize2fs {}' where it is held",
                    e.detail,
                    device.display()
                );
                Err(e)
            }
            Err(e) => Err(e),
        },
        "xfs" => run("xfs_growfs", [dir.as_os_str()]).map(|_| true),
        _ => Ok(false),
    }
}

/// Whether this process holds CAP_SYS_RESOURCE (bit 24 of `CapEff` in
/// `/proc/self/status`).
pub fn has_cap_sys_resource() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return true;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_none_or(|caps| caps & (1 << 24) != 0)
}

/// A filesystem type blobdrive knows how to make and mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FsType {
    /// ext4 (also ext2/ext3, mounted as found).
    Ext4,
    /// XFS.
    Xfs,
    /// Any other type `blkid` reports, mounted with generic options.
    Other(String),
}

impl FsType {
    /// Parse a name given by a user or by `blkid`.
    pub fn from_name(name: &str) -> FsType {
        match name {
            "ext4" => FsType::Ext4,
            "xfs" => FsType::Xfs,
            other => FsType::Other(other.to_string()),
        }
    }

    /// The name `mount -t` and `mkfs.` use.
    pub fn name(&self) -> &str {
        match self {
            FsType::Ext4 => "ext4",
            FsType::Xfs => "xfs",
            FsType::Other(n) => n,
        }
    }

    /// Options that let a read-only device mount without replaying a journal.
    fn read_only_options(&self) -> &'static [&'static str] {
        match self {
            FsType::Ext4 => &["ro", "noload"],
            FsType::Xfs => &["ro", "norecovery", "nouuid"],
            FsType::Other(_) => &["ro"],
        }
    }
}

impl fmt::Display for FsType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The filesystem type on `device`, or `None` when it holds no filesystem.
pub fn detect(device: &Path) -> Result<Option<FsType>, ToolError> {
    // blkid exits 2 when it finds nothing: that is an answer, not a failure.
    match run(
        "blkid",
        [
            "-p".as_ref(),
            "-o".as_ref(),
            "value".as_ref(),
            "-s".as_ref(),
            "TYPE".as_ref(),
            device.as_os_str(),
        ],
    ) {
        Ok(t) if t.is_empty() => Ok(None),
        Ok(t) => Ok(Some(FsType::from_name(&t))),
        Err(e) if e.code == Some(2) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Make a filesystem of `fs` on `device` (a loop device or a drive file).
/// Discards are skipped: a new drive is already all zeros and stores nothing.
pub fn make(device: &Path, fs: &FsType) -> Result<(), ToolError> {
    let program = format!("mkfs.{}", fs.name());
    let mut args: Vec<&std::ffi::OsStr> = Vec::new();
    match fs {
        FsType::Ext4 => args.extend(["-q", "-F", "-E", "nodiscard"].map(std::ffi::OsStr::new)),
        FsType::Xfs => args.extend(["-q", "-f", "-K"].map(std::ffi::OsStr::new)),
        FsType::Other(_) => {}
    }
    args.push(device.as_os_str());
    run(&program, args).map(|_| ())
}

/// The filesystem UUID on `device` (`blkid`), if it has one.
pub fn uuid(device: &Path) -> Option<String> {
    let args = [
        "-p".as_ref(),
        "-o".as_ref(),
        "value".as_ref(),
        "-s".as_ref(),
        "UUID".as_ref(),
        device.as_os_str(),
    ];
    run("blkid", args).ok().filter(|u| !u.is_empty())
}

/// The UUID of the XFS filesystem on `device` and where another XFS
/// filesystem with that UUID is mounted (XFS refuses a second mount of one
/// UUID, "Filesystem has duplicate UUID", which mount(8) reports only as a
/// wrong type), as /proc/self/mountinfo writes it (octal escapes kept: it is
/// for a log line); `None` when no mounted one shares it.
pub fn xfs_uuid_in_use(device: &Path) -> Option<(String, PathBuf)> {
    let wanted = uuid(device)?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    for line in mountinfo.lines() {
        // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS... - FSTYPE SOURCE SUPER
        let Some((head, tail)) = line.split_once(" - ") else {
            continue;
        };
        let mut tail = tail.split(' ');
        if tail.next() != Some("xfs") {
            continue;
        }
        let Some(source) = tail.next() else { continue };
        if Path::new(source) == device {
            continue;
        }
        let Some(dir) = head.split(' ').nth(4) else {
            continue;
        };
        if uuid(Path::new(source)).as_deref() == Some(wanted.as_str()) {
            return Some((wanted, PathBuf::from(dir)));
        }
    }
    None
}

/// Gives the filesystem on `device` (not mounted anywhere) a fresh random
/// UUID, so a copy is another machine's disk; returns the new UUID, or
/// `None` for a type it leaves alone. ext2/3/4: `e2fsck -f -p` first (it
/// replays the journal of a copy taken live, and `tune2fs -U` wants a
/// freshly checked filesystem unless `metadata_csum_seed` is set), then
/// `tune2fs -U random`. XFS: `xfs_admin -U generate` refuses a dirty log,
/// so the filesystem is mounted at `scratch` (with `nouuid`) and unmounted
/// first, which replays it (never `xfs_repair -L`, which would throw the
/// log away).
pub fn renew_uuid(device: &Path, fs: &FsType, scratch: &Path) -> Result<Option<String>, ToolError> {
    let dev = device.as_os_str();
    if fs.name().starts_with("ext") {
        // e2fsck exits 1 when it fixed something (the journal replayed).
        match run("e2fsck", ["-f".as_ref(), "-p".as_ref(), dev]) {
            Ok(_) => {}
            Err(e) if e.code == Some(1) => {}
            Err(e) => return Err(e),
        }
        run("tune2fs", ["-U".as_ref(), "random".as_ref(), dev])?;
    } else if *fs == FsType::Xfs {
        let mounted =
            MountedFs::mount(device, scratch, FsType::Xfs, false, &["nouuid".to_string()])?;
        mounted.unmount()?;
        run("xfs_admin", ["-U".as_ref(), "generate".as_ref(), dev])?;
    } else {
        return Ok(None);
    }
    Ok(uuid(device))
}

/// A filesystem mounted at a directory. Unmount it explicitly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountedFs {
    /// Where it is mounted.
    pub dir: PathBuf,
    /// Its type.
    pub fs: FsType,
    /// What the user should hear about how it was mounted (an XFS
    /// filesystem mounted with `nouuid` beside one of the same UUID).
    pub warning: Option<String>,
}

impl MountedFs {
    /// Mount the filesystem on `device` at `dir`. `extra` are user options
    /// passed through (`-o`); read-only mounts add the no-journal-replay option.
    pub fn mount(
        device: &Path,
        dir: &Path,
        fs: FsType,
        read_only: bool,
        extra: &[String],
    ) -> Result<MountedFs, ToolError> {
        let mut opts: Vec<String> = Vec::new();
        let mut warning = None;
        if read_only {
            opts.extend(fs.read_only_options().iter().map(|s| s.to_string()));
        } else if fs == FsType::Xfs && !extra.iter().any(|o| o == "nouuid") {
            if let Some((uuid, other)) = xfs_uuid_in_use(device) {
                let line = format!(
                    "its XFS filesystem has the UUID {uuid} of the one mounted at {} (a copy or a snapshot of the same drive): mounted with nouuid; 'blobdrive copy --new-uuid' makes copies with a UUID of their own",
                    other.display()
                );
                tracing::warn!(device = %device.display(), "{line}");
                warning = Some(line);
                opts.push("nouuid".to_string());
            }
        }
        opts.extend(extra.iter().filter(|o| !o.is_empty()).cloned());
        let mut args: Vec<std::ffi::OsString> = vec!["-t".into(), fs.name().into()];
        if !opts.is_empty() {
            args.push("-o".into());
            args.push(opts.join(",").into());
        }
        args.push(device.into());
        args.push(dir.into());
        run("mount", args)?;
        Ok(MountedFs {
            dir: dir.to_path_buf(),
            fs,
            warning,
        })
    }

    /// Unmount; fails (and keeps the mount) while files on it are open.
    pub fn unmount(&self) -> Result<(), ToolError> {
        run("umount", [self.dir.as_os_str()]).map(|_| ())
    }
}

/// Freeze the filesystem mounted at `dir`: writes block and everything is on
/// the device, so a snapshot taken now is consistent. Always [`thaw`] after.
pub fn freeze(dir: &Path) -> Result<(), ToolError> {
    run("fsfreeze", ["--freeze".as_ref(), dir.as_os_str()]).map(|_| ())
}

/// Thaw a filesystem frozen by [`freeze`].
pub fn thaw(dir: &Path) -> Result<(), ToolError> {
    run("fsfreeze", ["--unfreeze".as_ref(), dir.as_os_str()]).map(|_| ())
}
