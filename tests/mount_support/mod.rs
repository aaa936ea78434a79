//! Harness of the tests that mount through the real `blobdrive` binary against
//! the real emulator: skip rules, a per-test sandbox (its own control-socket
//! directory and temp dirs), and guards that undo everything a test set up even
//! when it panics — filesystems on loop devices are unmounted, loop devices
//! detached, FUSE mounts unmounted (politely, then lazily) and leftover daemons
//! terminated, in that order (locals drop in reverse order of declaration).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub use crate::system::*;

/// Exited daemons are reparented to init, which may reap them late: a
/// zombie counts as gone.
pub fn process_alive(pid: i32) -> bool {
    u32::try_from(pid).is_ok_and(blobdrive::daemon::registry::process_alive)
}

/// Sends `signal` to `pid`.
pub fn send_signal(pid: i32, signal: i32) {
    // SAFETY: plain syscall; a stale pid only yields ESRCH.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// Terminates `pid` (SIGTERM, then SIGKILL after 10 s) if it still runs.
fn terminate(pid: i32) {
    if !process_alive(pid) {
        return;
    }
    send_signal(pid, libc::SIGTERM);
    let start = Instant::now();
    while process_alive(pid) && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    if process_alive(pid) {
        send_signal(pid, libc::SIGKILL);
    }
}

/// One test's private world: a temp dir holding the control-socket directory
/// (`BLOBDRIVE_RUN_DIR`), mount points and logs; and how to run the binary in it.
pub struct Sandbox {
    /// The temp dir (removed on drop, after the guards inside it are gone).
    pub root: tempfile::TempDir,
    connection_string: String,
    /// Extra environment of every command (see [`Sandbox::with_env`]).
    env: Vec<(String, String)>,
}

impl Sandbox {
    /// A fresh sandbox for the account of `connection_string`.
    pub fn new(connection_string: String) -> Sandbox {
        let root = tempfile::Builder::new()
            .prefix("blobdrive-e2e-")
            .tempdir()
            .expect("cannot create a temp dir");
        std::fs::create_dir(root.path().join("run")).expect("cannot create the run dir");
        Sandbox {
            root,
            connection_string,
            env: Vec::new(),
        }
    }

    /// The same sandbox, with `name=value` in the environment of its commands.
    pub fn with_env(mut self, name: &str, value: &str) -> Sandbox {
        self.env.push((name.to_string(), value.to_string()));
        self
    }

    /// Where the sandbox's commands write recovery files.
    pub fn recovery_dir(&self) -> PathBuf {
        self.root.path().join("recovery")
    }

    /// A new empty directory in the sandbox.
    pub fn dir(&self, name: &str) -> PathBuf {
        let dir = self.root.path().join(name);
        std::fs::create_dir_all(&dir).expect("cannot create a directory");
        dir
    }

    /// `blobdrive ARGS` with the sandbox's environment, not yet run.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_blobdrive"));
        cmd.args(args)
            .env("AZURE_STORAGE_CONNECTION_STRING", &self.connection_string)
            .env("BLOBDRIVE_RUN_DIR", self.root.path().join("run"))
            .env("BLOBDRIVE_RECOVERY_DIR", self.recovery_dir())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        cmd
    }

    /// Runs `blobdrive ARGS` to its end.
    pub fn blobdrive(&self, args: &[&str]) -> Output {
        self.command(args)
            .output()
            .expect("cannot run the blobdrive binary")
    }

    /// Runs `blobdrive ARGS` and returns its stdout; panics with stderr on failure.
    pub fn blobdrive_ok(&self, args: &[&str]) -> String {
        let out = self.blobdrive(args);
        assert!(
            out.status.success(),
            "blobdrive {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `blobdrive stats DIR --json`.
    pub fn stats(&self, dir: &Path) -> serde_json::Value {
        let out = self.blobdrive_ok(&["stats", &dir.to_string_lossy(), "--json"]);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("stats is not JSON ({e}): {out}"))
    }

    /// Mounts (`blobdrive mount [source] DIR extra...`) in the background at a new
    /// directory `name`; returns once the binary says the mount is ready.
    pub fn mount(&self, name: &str, source: Option<&str>, extra: &[&str]) -> DaemonMount {
        self.mount_telling(name, source, extra).0
    }

    /// [`Sandbox::mount`], with what the command printed on stderr (its
    /// warnings).
    pub fn mount_telling(
        &self,
        name: &str,
        source: Option<&str>,
        extra: &[&str],
    ) -> (DaemonMount, String) {
        let dir = self.dir(name);
        let log = self.root.path().join(format!("{name}.log"));
        let dir_s = dir.to_string_lossy().to_string();
        let log_s = log.to_string_lossy().to_string();
        let mut args = vec!["mount"];
        args.extend(source);
        args.extend([dir_s.as_str(), "--log-file", log_s.as_str(), "-v"]);
        args.extend(extra);
        let out = self.blobdrive(&args);
        assert!(
            out.status.success(),
            "blobdrive {args:?} failed ({}): {}\nlog: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        assert!(
            is_mounted(&dir),
            "mount returned but {dir_s} is not mounted"
        );
        let pid = self.stats(&dir)["pid"]
            .as_i64()
            .expect("stats names the daemon's pid") as i32;
        let mount = DaemonMount {
            dir,
            log,
            pid,
            unmounted: false,
            connection_string: self.connection_string.clone(),
            run_dir: self.root.path().join("run"),
        };
        (mount, String::from_utf8_lossy(&out.stderr).into_owned())
    }

    /// Starts `blobdrive mount [source] DIR --foreground extra...` as a child and
    /// waits until DIR is mounted.
    pub fn mount_foreground(
        &self,
        name: &str,
        source: Option<&str>,
        extra: &[&str],
    ) -> ForegroundMount {
        let dir = self.dir(name);
        let dir_s = dir.to_string_lossy().to_string();
        let mut args = vec!["mount"];
        args.extend(source);
        args.extend([dir_s.as_str(), "--foreground", "-v"]);
        args.extend(extra);
        let log = self.root.path().join(format!("{name}.log"));
        let log_file = std::fs::File::create(&log).expect("cannot create the log");
        let child = self
            .command(&args)
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("cannot start the daemon");
        let mut mount = ForegroundMount {
            dir,
            log,
            child: Some(child),
        };
        let start = Instant::now();
        while !is_mounted(&mount.dir) {
            if let Some(status) = mount.try_status() {
                panic!(
                    "the daemon exited ({status}) before mounting: {}",
                    mount.log_text()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "mount not ready after 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        mount
    }
}

/// A background daemon's mount; on drop: `blobdrive unmount`, then a lazy
/// unmount, then SIGTERM/SIGKILL of the daemon if it still runs.
pub struct DaemonMount {
    /// The mount point.
    pub dir: PathBuf,
    /// The daemon's log file.
    pub log: PathBuf,
    /// The daemon's pid.
    pub pid: i32,
    unmounted: bool,
    connection_string: String,
    run_dir: PathBuf,
}

impl DaemonMount {
    /// A path inside the mount.
    pub fn path(&self, relative: &str) -> PathBuf {
        self.dir.join(relative)
    }

    /// The daemon's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn unmount_command(&self) -> Output {
        Command::new(env!("CARGO_BIN_EXE_blobdrive"))
            .args(["unmount", &self.dir.to_string_lossy()])
            .env("AZURE_STORAGE_CONNECTION_STRING", &self.connection_string)
            .env("BLOBDRIVE_RUN_DIR", &self.run_dir)
            .stdin(Stdio::null())
            .output()
            .expect("cannot run blobdrive unmount")
    }

    /// `blobdrive unmount DIR`, checked: success, DIR unmounted, daemon gone.
    pub fn unmount(mut self) {
        let out = self.unmount_command();
        assert!(
            out.status.success(),
            "blobdrive unmount failed: {}\nlog: {}",
            String::from_utf8_lossy(&out.stderr),
            self.log_text()
        );
        self.unmounted = true;
        assert!(!is_mounted(&self.dir), "unmount returned, still mounted");
        wait_for("the daemon to exit", Duration::from_secs(10), || {
            !process_alive(self.pid)
        });
    }

    /// `blobdrive unmount DIR`, unchecked (the mount stays guarded).
    pub fn try_unmount(&self) -> Output {
        self.unmount_command()
    }
}

impl Drop for DaemonMount {
    fn drop(&mut self) {
        if self.unmounted {
            return;
        }
        if is_mounted(&self.dir) && !self.unmount_command().status.success() {
            let dir = self.dir.to_string_lossy().to_string();
            let _ = run_quietly("umount", &["-l", &dir]);
        }
        terminate(self.pid);
    }
}

/// A `--foreground` daemon run by the test; killed and lazily unmounted on drop.
pub struct ForegroundMount {
    /// The mount point.
    pub dir: PathBuf,
    /// The daemon's stderr.
    pub log: PathBuf,
    child: Option<Child>,
}

impl ForegroundMount {
    /// The daemon's pid.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    /// The daemon's stderr so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn try_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// Waits (at most `timeout`) for the daemon to exit; its exit status.
    pub fn wait(mut self, timeout: Duration) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.try_status() {
                self.child = None;
                return status;
            }
            assert!(
                start.elapsed() < timeout,
                "daemon still running after {timeout:?}: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for ForegroundMount {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if child.try_wait().ok().flatten().is_none() {
            terminate(child.id() as i32);
            let _ = child.wait();
        }
        if is_mounted(&self.dir) {
            let _ = run_quietly("umount", &["-l", &self.dir.to_string_lossy()]);
        }
    }
}

/// `promtool check metrics` accepts `text` (names, types, help, no lint).
pub fn promtool_check(text: &str) {
    use std::io::Write;
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
