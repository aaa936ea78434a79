//! Harness of the FUSE tests: skip rules, mounts of the in-memory backend (in
//! this process or in a child process), and guards that undo every mount and
//! loop device even when a test fails.
//!
//! Child processes re-run this test binary on the ignored test
//! `daemon_child_entry`, configured by `CHILD_*` environment variables: that is
//! how a test gets a real daemon process to fork, signal and wait for.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use blobdrive::daemon::{request_unmount, run_mount, MountOptions};
use blobdrive::fs::memory::MemoryCatalog;
use blobdrive::fs::Catalog;

/// Set by CI: a test that cannot run fails instead of skipping.
pub const REQUIRE_ENV: &str = "BLOBDRIVE_REQUIRE_FUSE";

/// Whether the test can run; prints `SKIPPED: why` (or panics under
/// `BLOBDRIVE_REQUIRE_FUSE=1`) when it cannot.
pub fn can_run(test: &str, needs_loop: bool) -> bool {
    set_run_dir();
    let missing = missing_requirement(needs_loop);
    match missing {
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
        for tool in ["losetup", "mkfs.ext4", "fstrim", "mount", "umount"] {
            if !tool_exists(tool) {
                return Some(format!("{tool} not installed"));
            }
        }
        if !Path::new("/dev/loop-control").exists() {
            return Some("no /dev/loop-control".into());
        }
    }
    None
}

fn tool_exists(tool: &str) -> bool {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .any(|dir| Path::new(dir).join(tool).exists())
}

/// Points control sockets at a private directory for this test process.
pub fn set_run_dir() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let dir = std::env::temp_dir().join(format!("blobdrive-test-run-{}", std::process::id()));
        std::env::set_var("BLOBDRIVE_RUN_DIR", dir);
    });
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

fn run_quietly(program: &str, args: &[&str]) -> Option<Output> {
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
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A unique temporary directory removed on drop (after everything in it is unmounted).
pub fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("blobdrive-fuse-")
        .tempdir()
        .expect("cannot create a temp dir")
}

/// A namespace mount served by a thread of this process (the real daemon code in
/// foreground mode); unmounted (and the thread joined) on drop.
pub struct FuseMount {
    /// The mountpoint.
    pub dir: PathBuf,
    thread: Option<JoinHandle<anyhow::Result<()>>>,
}

impl FuseMount {
    /// Mounts `catalog` at a new directory under `parent`.
    pub fn start(parent: &Path, catalog: Arc<MemoryCatalog>, opts: MountOptions) -> FuseMount {
        let dir = parent.join(format!("mnt{}", rand_suffix()));
        std::fs::create_dir(&dir).expect("cannot create mountpoint");
        let opts = MountOptions {
            foreground: true,
            ..opts
        };
        let thread_dir = dir.clone();
        let thread = std::thread::spawn(move || {
            run_mount(&thread_dir, &opts, move || async move {
                Ok(catalog as Arc<dyn Catalog>)
            })
        });
        let mut mount = FuseMount {
            dir,
            thread: Some(thread),
        };
        let start = Instant::now();
        while !is_mounted(&mount.dir) {
            if mount.thread.as_ref().is_some_and(|t| t.is_finished()) {
                let result = mount.thread.take().expect("checked above").join();
                panic!("mount daemon ended before the mount was ready: {result:?}");
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "mount not ready after 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        mount
    }

    /// A path inside the mount.
    pub fn path(&self, relative: &str) -> PathBuf {
        self.dir.join(relative)
    }

    /// Unmounts through the control socket and returns the daemon's result.
    pub fn unmount(mut self) -> anyhow::Result<()> {
        request_unmount(&self.dir)?;
        let thread = self
            .thread
            .take()
            .expect("mount thread present until unmount");
        thread.join().expect("mount thread panicked")
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        if request_unmount(&self.dir).is_err() {
            let dir = self.dir.to_string_lossy().to_string();
            let _ = run_quietly("fusermount3", &["-u", "-z", &dir]);
        }
        let start = Instant::now();
        while !thread.is_finished() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if thread.is_finished() {
            let _ = thread.join();
        }
    }
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A loop device on a file; detached on drop.
pub struct LoopDevice {
    /// `/dev/loopN`.
    pub device: String,
}

impl LoopDevice {
    /// `losetup --direct-io=on --find --show FILE`.
    pub fn attach_direct_io(file: &Path) -> LoopDevice {
        let file = file.to_string_lossy();
        let device = run("losetup", &["--direct-io=on", "--find", "--show", &file]);
        LoopDevice { device }
    }

    /// Detaches now (and checks it worked).
    pub fn detach(mut self) {
        let device = std::mem::take(&mut self.device);
        run("losetup", &["-d", &device]);
        // The kernel drops the backing file asynchronously after LOOP_CLR_FD.
        wait_for(
            "loop device to let go of its file",
            Duration::from_secs(10),
            || {
                let name = device.trim_start_matches("/dev/");
                !Path::new(&format!("/sys/block/{name}/loop/backing_file")).exists()
            },
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
    /// The mountpoint.
    pub dir: PathBuf,
    mounted: bool,
}

impl BlockMount {
    /// `mount DEVICE DIR`.
    pub fn mount(device: &str, dir: &Path) -> BlockMount {
        std::fs::create_dir_all(dir).expect("cannot create ext4 mountpoint");
        run("mount", &[device, &dir.to_string_lossy()]);
        BlockMount {
            dir: dir.to_path_buf(),
            mounted: true,
        }
    }

    /// Unmounts now (and checks it worked).
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

/// Environment variables of a child daemon (see `daemon_child_entry`).
pub const CHILD_MODE: &str = "BLOBDRIVE_TEST_CHILD_MODE";
/// The child's mountpoint.
pub const CHILD_MOUNTPOINT: &str = "BLOBDRIVE_TEST_CHILD_MOUNTPOINT";
/// The file that mirrors the child's durable drive image.
pub const CHILD_IMAGE: &str = "BLOBDRIVE_TEST_CHILD_IMAGE";
/// The log file of a background child.
pub const CHILD_LOG: &str = "BLOBDRIVE_TEST_CHILD_LOG";
/// Size of the drive `disks/disk.vhd` a child daemon serves.
pub const CHILD_DRIVE_BYTES: u64 = 4 * 1024 * 1024;

/// Starts this test binary as a daemon child in `mode` (`foreground`,
/// `background`, `background-failing`).
pub fn spawn_child(mode: &str, mountpoint: &Path, image: &Path, log: &Path) -> std::process::Child {
    set_run_dir();
    let exe = std::env::current_exe().expect("test binary path");
    Command::new(exe)
        .args([
            "--exact",
            "daemon_child_entry",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_MODE, mode)
        .env(CHILD_MOUNTPOINT, mountpoint)
        .env(CHILD_IMAGE, image)
        .env(CHILD_LOG, log)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("cannot start the child daemon")
}

/// Guard for a mountpoint served by another process: lazily unmounted on drop.
pub struct ForeignMount(pub PathBuf);

impl Drop for ForeignMount {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            let dir = self.0.to_string_lossy().to_string();
            let _ = run_quietly("fusermount3", &["-u", "-z", &dir]);
        }
    }
}
