//! Loop devices over a drive file, with direct I/O so the kernel's page cache
//! is not stacked on top of blobdrive's and requests reach the daemon in
//! parallel (2-6x faster than buffered loop I/O over FUSE; docs/kernel.md).
//!
//! A partition is attached as its own loop device with an offset and a size
//! limit over the whole drive file (`losetup -o --sizelimit`): this works where
//! the kernel makes no partition device nodes (`losetup -P` creates none in
//! containers and on machines without udev), and the filesystem can never
//! reach a byte outside its partition. When the partition grows, the limit
//! changes in place ([`LoopDevice::set_size_limit`]), the filesystem mounted:
//! only on kernels where that is safe ([`size_limit_change_allowed`],
//! Linux 5.19 and later; docs/kernel.md says why).

use std::path::{Path, PathBuf};

use super::tool::{run, ToolError};

/// The first Linux release (major, minor) whose loop driver changes a
/// device's size limit (LOOP_SET_STATUS64) under a mounted filesystem both
/// safely and reliably. Before 4.11 the change raced with I/O in flight;
/// from 5.0 to 5.7 it truncated the device's page cache under the
/// filesystem (buffer heads unmapped: a kernel BUG); until 5.18 it failed
/// with EAGAIN whenever the filesystem held pages of that cache, as a
/// mounted ext4 always does. docs/kernel.md has the commits.
pub const SIZE_LIMIT_CHANGE_SINCE: (u32, u32) = (5, 19);

/// The major and minor numbers of a kernel release as `uname -r` prints
/// it (`6.18.44`, `5.15.0-91-generic`, `4.18.0-513.el8.x86_64`); `None`
/// when it does not start with them.
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().splitn(3, '.');
    let major = parts.next()?.parse().ok()?;
    let minor_text = parts.next()?;
    let digits = minor_text
        .find(|c: char| !c.is_ascii_digit())
        .map_or(minor_text, |end| &minor_text[..end]);
    Some((major, digits.parse().ok()?))
}

/// Whether the kernel `release` may change a loop device's size limit while
/// a filesystem on it is mounted: `Err` is the reason, as the end of one
/// line. A release that cannot be read is refused too: the change is only
/// made where it is known to be safe.
pub fn size_limit_change_allowed(release: &str) -> Result<(), String> {
    let (major, minor) = SIZE_LIMIT_CHANGE_SINCE;
    match kernel_version(release) {
        Some(v) if v >= SIZE_LIMIT_CHANGE_SINCE => Ok(()),
        _ => Err(format!(
            "changing a loop device's size limit under a mounted filesystem is safe from Linux \
             {major}.{minor} on, and this kernel is {}",
            release.trim()
        )),
    }
}

/// [`size_limit_change_allowed`] for the running kernel.
pub fn size_limit_change_allowed_here() -> Result<(), String> {
    let release =
        std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_else(|_| "unknown".into());
    size_limit_change_allowed(&release)
}

/// The part of its backing file a loop device shows, as the kernel holds it
/// (LOOP_GET_STATUS64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopArea {
    /// Where the device starts in the file, in bytes (a partition's start).
    pub offset_bytes: u64,
    /// How far past the offset it reaches at most, in bytes; 0 means up to
    /// the file's end (a device over a whole drive).
    pub size_limit_bytes: u64,
}

/// How the kernel reads through a loop device (its block queue), in KiB as
/// the kernel takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadQueue {
    /// The largest request it sends (`queue/max_sectors_kb`).
    pub max_request_kib: u32,
    /// The read-ahead of the files on it (`queue/read_ahead_kb`).
    pub read_ahead_kib: u32,
}

/// A number of KiB from the queue directory `dir`.
fn read_kib(dir: &Path, name: &str) -> std::io::Result<u32> {
    std::fs::read_to_string(dir.join(name))?
        .trim()
        .parse()
        .map_err(|_| std::io::Error::other(format!("{name} is not a number")))
}

/// A loop device attached to a file. Detach it explicitly with [`LoopDevice::detach`];
/// dropping it does not detach (teardown order matters and belongs to the caller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopDevice {
    /// The device node, e.g. `/dev/loop3`.
    pub device: PathBuf,
}

impl LoopDevice {
    /// Attach `file` to the first free loop device, with direct I/O, read-only when asked.
    pub fn attach(file: &Path, read_only: bool) -> Result<LoopDevice, ToolError> {
        Self::attach_area(file, read_only, None)
    }

    /// Attach the area `(offset_bytes, size_bytes)` of `file` (a partition),
    /// or all of it for `None`, to the first free loop device, with direct I/O.
    pub fn attach_area(
        file: &Path,
        read_only: bool,
        area: Option<(u64, u64)>,
    ) -> Result<LoopDevice, ToolError> {
        let mut args: Vec<std::ffi::OsString> =
            vec!["--find".into(), "--show".into(), "--direct-io=on".into()];
        if read_only {
            args.push("--read-only".into());
        }
        if let Some((offset_bytes, size_bytes)) = area {
            args.extend([
                "--offset".into(),
                offset_bytes.to_string().into(),
                "--sizelimit".into(),
                size_bytes.to_string().into(),
            ]);
        }
        args.push(file.into());
        let device = run("losetup", args)?;
        if device.is_empty() {
            return Err(ToolError {
                tool: "losetup".into(),
                detail: "printed no device name".into(),
                code: None,
            });
        }
        Ok(LoopDevice {
            device: PathBuf::from(device),
        })
    }

    /// Makes the device take its file's new size (`losetup -c`,
    /// LOOP_SET_CAPACITY) after the file grew, without a detach; returns the
    /// device's size now, in bytes. A device with a size limit (a partition)
    /// keeps its limit: see [`LoopDevice::set_size_limit`].
    pub fn refresh_capacity(&self) -> Result<u64, ToolError> {
        run(
            "losetup",
            [std::ffi::OsStr::new("-c"), self.device.as_os_str()],
        )?;
        self.size_bytes()
    }

    /// The device's size as the kernel sees it, in bytes (`blockdev --getsize64`).
    pub fn size_bytes(&self) -> Result<u64, ToolError> {
        let out = run(
            "blockdev",
            [std::ffi::OsStr::new("--getsize64"), self.device.as_os_str()],
        )?;
        out.trim().parse().map_err(|_| ToolError {
            tool: "blockdev".into(),
            detail: format!("printed {out:?}, not a size"),
            code: None,
        })
    }

    /// The offset and size limit the kernel holds for the device. Opened
    /// read-only: reading the status needs no write access.
    pub fn area(&self) -> Result<LoopArea, ToolError> {
        let failed = |what: &str, e: std::io::Error| ToolError {
            tool: "LOOP_GET_STATUS64".into(),
            detail: format!("{what} {}: {e}", self.device.display()),
            code: None,
        };
        let file = std::fs::File::open(&self.device).map_err(|e| failed("cannot open", e))?;
        let info = status::get(&file).map_err(|e| failed("cannot read the status of", e))?;
        Ok(LoopArea {
            offset_bytes: info.lo_offset,
            size_limit_bytes: info.lo_sizelimit,
        })
    }

    /// Gives an attached device a new size limit (`--sizelimit`), its offset
    /// and flags unchanged, while the filesystem on it stays mounted; returns
    /// the device's size now, in bytes. `losetup` has no option for this on
    /// an attached device, so it is the LOOP_GET_STATUS64 / LOOP_SET_STATUS64
    /// pair: the kernel drains the device's I/O and sets its new size.
    /// Refused, with nothing changed, on a kernel where that is not safe
    /// ([`size_limit_change_allowed`]).
    pub fn set_size_limit(&self, size_limit_bytes: u64) -> Result<u64, ToolError> {
        let failed = |what: &str, e: std::io::Error| ToolError {
            tool: "LOOP_SET_STATUS64".into(),
            detail: format!("{what} {}: {e}", self.device.display()),
            code: None,
        };
        size_limit_change_allowed_here().map_err(|why| ToolError {
            tool: "LOOP_SET_STATUS64".into(),
            detail: format!("not used on {}: {why}", self.device.display()),
            code: None,
        })?;
        // Opened for writing: the kernel lets a writer change the status
        // without CAP_SYS_ADMIN.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.device)
            .map_err(|e| failed("cannot open", e))?;
        let mut info = status::get(&file).map_err(|e| failed("cannot read the status of", e))?;
        if info.lo_sizelimit != size_limit_bytes {
            tracing::debug!(
                device = %self.device.display(),
                from_bytes = info.lo_sizelimit,
                to_bytes = size_limit_bytes,
                "changing the loop device's size limit"
            );
            info.lo_sizelimit = size_limit_bytes;
            status::set(&file, &info).map_err(|e| failed("cannot set the size limit of", e))?;
        }
        self.size_bytes()
    }

    /// The loop devices currently backed by `file`.
    pub fn find_by_file(file: &Path) -> Result<Vec<LoopDevice>, ToolError> {
        let out = run(
            "losetup",
            [std::ffi::OsStr::new("--associated"), file.as_os_str()],
        )?;
        // Each line reads "/dev/loopN: [dev]:inode (file)".
        Ok(out
            .lines()
            .map(|l| l.split(':').next().unwrap_or("").trim())
            .filter(|l| !l.is_empty())
            .map(|l| LoopDevice {
                device: PathBuf::from(l),
            })
            .collect())
    }

    /// Bounds the dirty page cache of the filesystem on this device to
    /// `bytes`, strictly (`/sys/class/bdi/MAJ:MIN/max_bytes` and
    /// `strict_limit`, Linux 6.2 and later), as the kernel bounds FUSE's own
    /// files. Without it a write of a few GiB sits in the page cache until
    /// fsync (the kernel's background threshold is a tenth of memory), and
    /// the drive sends nothing meanwhile: 2-2.5 s of a 1 GiB `dd
    /// conv=fsync` went by before the first byte reached the daemon. Bounded,
    /// the writeback starts at once and the daemon's write-behind keeps
    /// whole 4 MiB Put Pages going while the file is written. Undone by
    /// [`LoopDevice::detach`], since loop devices are shared with the rest
    /// of the machine.
    pub fn limit_dirty_cache(&self, bytes: u64) -> std::io::Result<()> {
        let bdi = self.bdi_dir()?;
        std::fs::write(bdi.join("max_bytes"), bytes.to_string())?;
        std::fs::write(bdi.join("strict_limit"), "1").inspect_err(|_| {
            // Not half set: without the strict flag the bound is undone here,
            // since detach looks only at that flag.
            let _ = std::fs::write(bdi.join("max_ratio"), "100");
        })
    }

    /// Sets how the kernel reads through the device: its largest request
    /// (`queue/max_sectors_kb`, at most what the device takes) and the
    /// read-ahead of the files of a filesystem mounted on it
    /// (`queue/read_ahead_kb`, which the filesystem's files copy when they
    /// are opened: set it before the mount). The largest request goes
    /// first, since a change of it may recompute the read-ahead. Returns
    /// the settings it replaced, for [`LoopDevice::restore_read_queue`]:
    /// the kernel keeps both across a detach and the next attach of the
    /// device to a FUSE file.
    pub fn set_read_queue(&self, queue: ReadQueue) -> std::io::Result<ReadQueue> {
        let before = self.read_queue()?;
        let dir = self.sys_dir()?.join("queue");
        let hw_kib = read_kib(&dir, "max_hw_sectors_kb")?;
        let largest = queue.max_request_kib.min(hw_kib);
        std::fs::write(dir.join("max_sectors_kb"), largest.to_string())?;
        std::fs::write(dir.join("read_ahead_kb"), queue.read_ahead_kib.to_string())?;
        Ok(before)
    }

    /// Puts back the settings [`LoopDevice::set_read_queue`] replaced
    /// (best effort, before the detach: the device is shared with the rest
    /// of the machine).
    pub fn restore_read_queue(&self, before: ReadQueue) {
        if let Err(err) = self.set_read_queue(before) {
            tracing::debug!(device = %self.device.display(), %err, "cannot restore the loop device's queue settings");
        }
    }

    /// The device's largest request and read-ahead, as the kernel has them.
    pub fn read_queue(&self) -> std::io::Result<ReadQueue> {
        let dir = self.sys_dir()?.join("queue");
        Ok(ReadQueue {
            max_request_kib: read_kib(&dir, "max_sectors_kb")?,
            read_ahead_kib: read_kib(&dir, "read_ahead_kb")?,
        })
    }

    /// The device's directory in sysfs (`/sys/dev/block/MAJ:MIN`).
    fn sys_dir(&self) -> std::io::Result<PathBuf> {
        let (major, minor) = self.numbers()?;
        Ok(PathBuf::from(format!("/sys/dev/block/{major}:{minor}")))
    }

    fn numbers(&self) -> std::io::Result<(u32, u32)> {
        use std::os::unix::fs::MetadataExt as _;
        let rdev = std::fs::metadata(&self.device)?.rdev();
        Ok((libc::major(rdev), libc::minor(rdev)))
    }

    /// The kernel's writeback settings of this device (`/sys/class/bdi/MAJ:MIN`).
    fn bdi_dir(&self) -> std::io::Result<PathBuf> {
        let (major, minor) = self.numbers()?;
        Ok(PathBuf::from(format!("/sys/class/bdi/{major}:{minor}")))
    }

    /// Detach the device. The kernel defers the detach while the device is
    /// still open (autoclear), so unmount the filesystem on it first. A
    /// dirty-cache bound set by [`LoopDevice::limit_dirty_cache`] goes back
    /// to the kernel's default first (best effort), so the next user of the
    /// device does not inherit it. (Queue settings are the caller's to put
    /// back: [`LoopDevice::restore_read_queue`].)
    pub fn detach(&self) -> Result<(), ToolError> {
        if let Ok(bdi) = self.bdi_dir() {
            if std::fs::read_to_string(bdi.join("strict_limit")).is_ok_and(|v| v.trim() == "1") {
                let _ = std::fs::write(bdi.join("strict_limit"), "0");
                let _ = std::fs::write(bdi.join("max_ratio"), "100");
            }
        }
        run(
            "losetup",
            [std::ffi::OsStr::new("--detach"), self.device.as_os_str()],
        )
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_releases_are_read_by_major_and_minor() {
        assert_eq!(kernel_version("6.18.44\n"), Some((6, 18)));
        assert_eq!(kernel_version("5.15.0-91-generic"), Some((5, 15)));
        assert_eq!(kernel_version("4.18.0-513.el8.x86_64"), Some((4, 18)));
        assert_eq!(kernel_version("6.1-rc3"), Some((6, 1)));
        assert_eq!(kernel_version("5.19"), Some((5, 19)));
        assert_eq!(kernel_version("unknown"), None);
        assert_eq!(kernel_version("6"), None);
        assert_eq!(kernel_version(""), None);
    }

    #[test]
    fn a_size_limit_changes_under_a_mounted_filesystem_only_from_linux_5_19() {
        for allowed in [
            "5.19.0",
            "5.19.17-arch1",
            "6.1.0-28-amd64",
            "6.18.44",
            "10.0",
        ] {
            assert_eq!(size_limit_change_allowed(allowed), Ok(()), "{allowed}");
        }
        // Ubuntu 22.04's 5.15 (EAGAIN under ext4), RHEL 8's 4.18, a 5.4
        // whose stable series may predate the page-cache fix, and a
        // release that cannot be read.
        for refused in [
            "5.18.19",
            "5.15.0-91-generic",
            "4.18.0-513.el8.x86_64",
            "5.4.0",
            "unknown",
        ] {
            let why = size_limit_change_allowed(refused).unwrap_err();
            assert!(why.contains("from Linux 5.19 on"), "{why}");
            assert!(why.ends_with(&format!("this kernel is {refused}")), "{why}");
        }
    }
}

/// The loop device status ioctls, which the libc crate does not carry
/// (`<linux/loop.h>`).
mod status {
    use std::os::fd::AsRawFd as _;

    const LOOP_SET_STATUS64: libc::c_ulong = 0x4C04;
    const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;
    const LO_NAME_SIZE: usize = 64;
    const LO_KEY_SIZE: usize = 32;

    /// `struct loop_info64` (232 bytes, no padding).
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub(super) struct LoopInfo64 {
        pub lo_device: u64,
        pub lo_inode: u64,
        pub lo_rdevice: u64,
        pub lo_offset: u64,
        pub lo_sizelimit: u64,
        pub lo_number: u32,
        pub lo_encrypt_type: u32,
        pub lo_encrypt_key_size: u32,
        pub lo_flags: u32,
        pub lo_file_name: [u8; LO_NAME_SIZE],
        pub lo_crypt_name: [u8; LO_NAME_SIZE],
        pub lo_encrypt_key: [u8; LO_KEY_SIZE],
        pub lo_init: [u64; 2],
    }

    const _: () = assert!(std::mem::size_of::<LoopInfo64>() == 232);

    /// The device's status (offset, size limit, flags, backing file name).
    pub(super) fn get(device: &std::fs::File) -> std::io::Result<LoopInfo64> {
        // SAFETY: all-zero bytes are a valid `LoopInfo64` (integers and byte arrays).
        let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
        // SAFETY: the fd is open for the call; the kernel writes at most
        // `sizeof(struct loop_info64)` bytes into `info`, which has that layout.
        let rc = unsafe {
            libc::ioctl(
                device.as_raw_fd(),
                LOOP_GET_STATUS64 as _,
                &mut info as *mut LoopInfo64,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(info)
    }

    /// Sets the status read by [`get`], changed where the caller changed it.
    pub(super) fn set(device: &std::fs::File, info: &LoopInfo64) -> std::io::Result<()> {
        // SAFETY: the fd is open for the call; the kernel only reads
        // `sizeof(struct loop_info64)` bytes from `info`, which has that layout.
        let rc = unsafe {
            libc::ioctl(
                device.as_raw_fd(),
                LOOP_SET_STATUS64 as _,
                info as *const LoopInfo64,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}
