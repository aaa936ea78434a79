//! Harness of the FUSE tests: skip rules, mounts of the in-memory backend (in
//! this process or in a child process), and guards that undo every mount and
//! loop device even when a test fails.
//!
//! Child processes re-run this test binary on the ignored test
//! `daemon_child_entry`, configured by `CHILD_*` environment variables: that is
//! how a test gets a real daemon process to fork, signal and wait for.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use blobdrive::daemon::{request_unmount, run_mount, MountOptions};
use blobdrive::fs::memory::MemoryCatalog;
use blobdrive::fs::Catalog;

use crate::system::run_quietly;
pub use crate::system::{is_mounted, run, wait_for, BlockMount, LoopDevice};

/// Whether the test can run (see [`crate::system::can_run`]), with control
/// sockets in a private directory of this test process.
pub fn can_run(test: &str, needs_loop: bool) -> bool {
    set_run_dir();
    crate::system::can_run(test, needs_loop)
}

/// Points control sockets and recovery files at private directories of this
/// test process.
pub fn set_run_dir() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let dir = std::env::temp_dir().join(format!("blobdrive-test-run-{}", std::process::id()));
        std::env::set_var("BLOBDRIVE_RUN_DIR", dir);
        // Recovery files too: never into the machine's own directory.
        std::env::set_var("BLOBDRIVE_RECOVERY_DIR", crate::common::recovery_dir());
    });
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
            run_mount(&thread_dir, &opts, move |_takeover| {
                let catalog = catalog.clone();
                async move { Ok(catalog as Arc<dyn Catalog>) }
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
