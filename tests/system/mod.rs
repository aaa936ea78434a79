//! What every mounting test needs from the system, whichever harness it uses
//! (`mount_support` for the real binary, `fuse_support` for in-process
//! mounts): skip rules, running tools, waiting, and guards for loop devices
//! and the filesystems on them that undo them even when a test panics.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Set by CI: a test that cannot run fails instead of skipping.
pub const REQUIRE_ENV: &str = "BLOBDRIVE_REQUIRE_FUSE";

/// Whether the test can run; prints `SKIPPED: why` (or panics under
/// `BLOBDRIVE_REQUIRE_FUSE=1`) when it cannot.
pub fn can_run(test: &str, needs_loop: bool) -> bool {
    match missing_requirement(needs_loop) {
        None => true,
        Some(why) if std::env::var(REQUIRE_ENV).as_deref() == Ok("1") => {
            panic!("{test}: cannot run ({why}) and {REQUIRE_ENV}=1")
        }
        Some(why) => {
            println!("SKIPPED: {test}: {why}");
            false
        }
    }
}

fn missing_requirement(needs_loop: bool) -> Option<String> {
    if !Path::new("/dev/fuse").exists() {
        return Some("no /dev/fuse".into());
    }
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (mounting and loop devices need it)".into());
    }
    if needs_loop {
        for tool in [
            "losetup",
            "mkfs.ext4",
            "fstrim",
            "blkid",
            "fsfreeze",
            "mount",
            "umount",
        ] {
            if !blobdrive::attach::tool_exists(tool) {
                return Some(format!("{tool} not installed"));
            }
        }
        if !Path::new("/dev/loop-control").exists() {
            return Some("no /dev/loop-control".into());
        }
    }
    None
}

/// Runs a command and returns its stdout; panics with its stderr on failure.
pub fn run(program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// Runs a command, ignoring how it ends (clean-up on drop).
pub fn run_quietly(program: &str, args: &[&str]) -> Option<Output> {
    Command::new(program).args(args).output().ok()
}

/// True when `dir` is a mount point of this mount namespace.
pub fn is_mounted(dir: &Path) -> bool {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let dir = dir.to_string_lossy();
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|info| info.lines().any(|l| l.split(' ').nth(4) == Some(&*dir)))
        .unwrap_or(false)
}

/// Waits until `check` holds, or panics after `timeout` with `what`.
pub fn wait_for(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A loop device on a file; detached on drop.
pub struct LoopDevice {
    /// `/dev/loopN`.
    pub device: String,
}

impl LoopDevice {
    /// `losetup --direct-io=on --find --show FILE`.
    pub fn attach_direct_io(file: &Path) -> LoopDevice {
        Self::attach(file, &[])
    }

    /// `losetup --direct-io=on --read-only --find --show FILE`.
    pub fn attach_read_only(file: &Path) -> LoopDevice {
        Self::attach(file, &["--read-only"])
    }

    fn attach(file: &Path, extra: &[&str]) -> LoopDevice {
        let file = file.to_string_lossy();
        let mut args = vec!["--direct-io=on", "--find", "--show"];
        args.extend(extra);
        args.push(&file);
        let device = run("losetup", &args);
        let name = device.trim_start_matches("/dev/").to_string();
        let dio =
            std::fs::read_to_string(format!("/sys/block/{name}/loop/dio")).unwrap_or_default();
        assert_eq!(dio.trim(), "1", "{device} is not using direct I/O");
        LoopDevice { device }
    }

    /// Detaches now and waits until the kernel has let go of the file.
    pub fn detach(mut self) {
        let device = std::mem::take(&mut self.device);
        run("losetup", &["-d", &device]);
        let name = device.trim_start_matches("/dev/").to_string();
        // Seconds when the machine is quiet; a CI run once needed more than
        // 20 with the whole suite sharing two cores.
        wait_for(
            "the loop device to let go of its file",
            Duration::from_secs(60),
            || !Path::new(&format!("/sys/block/{name}/loop/backing_file")).exists(),
        );
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        if !self.device.is_empty() {
            let _ = run_quietly("losetup", &["-d", &self.device]);
        }
    }
}

/// A filesystem mounted on a block device; unmounted on drop.
pub struct BlockMount {
    /// The mount point.
    pub dir: PathBuf,
    mounted: bool,
}

impl BlockMount {
    /// `mount DEVICE DIR`.
    pub fn mount(device: &str, dir: &Path) -> BlockMount {
        Self::mount_with(device, dir, "rw")
    }

    /// `mount -o OPTIONS DEVICE DIR`.
    pub fn mount_with(device: &str, dir: &Path, options: &str) -> BlockMount {
        std::fs::create_dir_all(dir).expect("cannot create the mount point");
        run("mount", &["-o", options, device, &dir.to_string_lossy()]);
        BlockMount {
            dir: dir.to_path_buf(),
            mounted: true,
        }
    }

    /// A path inside the filesystem.
    pub fn path(&self, relative: &str) -> PathBuf {
        self.dir.join(relative)
    }

    /// Unmounts now (checked).
    pub fn unmount(mut self) {
        self.mounted = false;
        run("umount", &[&self.dir.to_string_lossy()]);
    }
}

impl Drop for BlockMount {
    fn drop(&mut self) {
        if self.mounted {
            let dir = self.dir.to_string_lossy().to_string();
            if run_quietly("umount", &[&dir]).is_none_or(|o| !o.status.success()) {
                let _ = run_quietly("umount", &["-l", &dir]);
            }
        }
    }
}

/// Runs the filesystem's checker (`e2fsck -fn` for ext4, `xfs_repair -n`
/// otherwise), repairing nothing, on `image` (a drive file read through a
/// read-only namespace mount); panics with its output, after `context`,
/// when it finds problems.
pub fn check_filesystem(image: &Path, fs: &str, context: &str) {
    let image_s = image.to_string_lossy().to_string();
    let (tool, args) = match fs {
        "ext4" => ("e2fsck", vec!["-fn", image_s.as_str()]),
        _ => ("xfs_repair", vec!["-n", "-f", image_s.as_str()]),
    };
    let out = Command::new(tool)
        .args(&args)
        .output()
        .expect("run the checker");
    assert!(
        out.status.success(),
        "{context}: {tool} found problems:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
