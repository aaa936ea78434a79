//! Loop devices over a drive file, with direct I/O so the kernel's page cache
//! is not stacked on top of blobdrive's and requests reach the daemon in
//! parallel (2-6x faster than buffered loop I/O over FUSE; docs/kernel.md).
//!
//! A partition is attached as its own loop device with an offset and a size
//! limit over the whole drive file (`losetup -o --sizelimit`): this works where
//! the kernel makes no partition device nodes (`losetup -P` creates none in
//! containers and on machines without udev), and the filesystem can never
//! reach a byte outside its partition.

use std::path::{Path, PathBuf};

use super::tool::{run, ToolError};

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

    /// Detach the device. The kernel defers the detach while the device is
    /// still open (autoclear), so unmount the filesystem on it first.
    pub fn detach(&self) -> Result<(), ToolError> {
        run(
            "losetup",
            [std::ffi::OsStr::new("--detach"), self.device.as_os_str()],
        )
        .map(|_| ())
    }
}
