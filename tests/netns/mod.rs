//! Many hosts on one machine: each [`Host`] is its own network namespace and
//! mount namespace, with its own blobdrive run directory, recovery directory
//! and daemons; the [`Storage`] namespace runs a dedicated in-memory Azurite
//! that the hosts reach over veth pairs joined by a bridge. Nothing here uses
//! an address outside these namespaces (10.231.0.0/24 exists only inside
//! them), so concurrent runs cannot collide: namespace names carry the
//! process id and a random tag.
//!
//! A host's mount namespace is held by a `sleep` process started with
//! `ip netns exec` (which gives it a fresh mount namespace whose mounts do not
//! propagate back); commands run in it through `nsenter`, and the test reads
//! and writes the host's mounted filesystems through `/proc/PID/root`.
//!
//! Clean-up happens in `Drop`, even when a test fails: every daemon of a host
//! is resumed (a test may have stopped it) and asked to unmount, then killed;
//! filesystems, loop devices and FUSE mounts left under the host's run
//! directory are removed; the holder and Azurite (processes this harness
//! started, by pid) are killed; the namespaces are deleted.
#![allow(dead_code)]

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::system::{run_quietly, wait_for};

/// The blobdrive binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_blobdrive");
/// The storage side of the bridge, where Azurite listens.
const STORAGE_ADDR: &str = "10.231.0.1";
const AZURITE_PORT: u16 = 10000;
/// Azurite's development account key (public, documented by Microsoft).
const DEV_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// Whether the many-hosts tests can run here: the mount tests' needs plus
/// `ip`, `nsenter` and an Azurite to start (see [`azurite_bin`]).
pub fn can_run(test: &str) -> bool {
    let missing = if !blobdrive::attach::tool_exists("ip") {
        Some("ip (iproute2) not installed".to_string())
    } else if !blobdrive::attach::tool_exists("nsenter") {
        Some("nsenter not installed".to_string())
    } else if azurite_bin().is_none() {
        Some(
            "no Azurite to start (run scripts/azurite.sh install, or set BLOBDRIVE_AZURITE_BIN)"
                .into(),
        )
    } else {
        None
    };
    match missing {
        None => crate::system::can_run(test, true),
        Some(why) if std::env::var(crate::system::REQUIRE_ENV).as_deref() == Ok("1") => {
            panic!(
                "{test}: cannot run ({why}) and {}=1",
                crate::system::REQUIRE_ENV
            )
        }
        Some(why) => {
            println!("SKIPPED: {test}: {why}");
            false
        }
    }
}

/// `$BLOBDRIVE_AZURITE_BIN`, else the pinned Azurite that
/// `scripts/azurite.sh install` puts in the repository's `.azurite/`.
pub fn azurite_bin() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os("BLOBDRIVE_AZURITE_BIN").filter(|b| !b.is_empty()) {
        return Some(PathBuf::from(bin));
    }
    let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join(".azurite/node_modules/.bin/azurite-blob");
    bin.exists().then_some(bin)
}

/// A short tag unique to this process and call, for namespace names.
fn tag() -> String {
    let rand = uuid::Uuid::new_v4().simple().to_string();
    format!("{}-{}", std::process::id(), &rand[..6])
}

/// Runs a command to its end, killing it after `timeout`; `None` if it
/// could not start or timed out.
pub fn run_with_timeout(cmd: &mut Command, timeout: Duration) -> Option<Output> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    // Drain the pipes on threads so a chatty command cannot block on them.
    let mut out = child.stdout.take()?;
    let mut err = child.stderr.take()?;
    let out_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let start = Instant::now();
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break Some(status);
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = out_t.join().unwrap_or_default();
    let stderr = err_t.join().unwrap_or_default();
    status.map(|status| Output {
        status,
        stdout,
        stderr,
    })
}

fn ip(args: &[&str]) {
    crate::system::run("ip", args);
}

/// A network namespace made by `ip netns add`; deleted on drop.
struct NetNs {
    name: String,
}

impl NetNs {
    fn new(name: String) -> NetNs {
        ip(&["netns", "add", &name]);
        let ns = NetNs { name };
        ip(&["-n", &ns.name, "link", "set", "lo", "up"]);
        ns
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = run_quietly("ip", &["netns", "del", &self.name]);
    }
}

/// A child process this harness started; killed (SIGKILL) and reaped on drop.
struct Owned(Child);

impl Drop for Owned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The storage namespace: a bridge at 10.231.0.1/24 and an in-memory Azurite
/// listening there.
pub struct Storage {
    // Drop order: Azurite first, then the namespace.
    azurite: Owned,
    ns: NetNs,
    tag: String,
    hosts: u32,
    log: PathBuf,
    _logdir: tempfile::TempDir,
}

impl Storage {
    /// Makes the namespace and starts an in-memory Azurite; returns once it
    /// answers.
    pub fn start() -> Storage {
        Storage::start_with(false)
    }

    /// Like [`Storage::start`], with Azurite keeping its data on disk (in a
    /// temporary directory): long runs that write gigabytes would fill an
    /// in-memory one.
    pub fn start_on_disk() -> Storage {
        Storage::start_with(true)
    }

    fn start_with(on_disk: bool) -> Storage {
        let tag = tag();
        let ns = NetNs::new(format!("bd-st-{tag}"));
        ip(&["-n", &ns.name, "link", "add", "br0", "type", "bridge"]);
        ip(&[
            "-n",
            &ns.name,
            "addr",
            "add",
            &format!("{STORAGE_ADDR}/24"),
            "dev",
            "br0",
        ]);
        ip(&["-n", &ns.name, "link", "set", "br0", "up"]);
        let logdir = tempfile::Builder::new()
            .prefix("blobdrive-storage-")
            .tempdir()
            .expect("temp dir");
        let log = logdir.path().join("azurite.log");
        let bin = azurite_bin().expect("checked by can_run");
        let data = logdir.path().join("data");
        let persistence: Vec<String> = if on_disk {
            vec!["--location".into(), data.to_string_lossy().into_owned()]
        } else {
            vec!["--inMemoryPersistence".into()]
        };
        let child = Command::new("ip")
            .args(["netns", "exec", &ns.name])
            .arg(&bin)
            .args([
                "--blobHost",
                STORAGE_ADDR,
                "--blobPort",
                &AZURITE_PORT.to_string(),
                "--skipApiVersionCheck",
                "--loose",
                "--silent",
            ])
            .args(&persistence)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("azurite log"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let storage = Storage {
            azurite: Owned(child),
            ns,
            tag,
            hosts: 0,
            log,
            _logdir: logdir,
        };
        let probe = format!("exec 3<>/dev/tcp/{STORAGE_ADDR}/{AZURITE_PORT}");
        wait_for(
            "Azurite in the storage namespace",
            Duration::from_secs(30),
            || {
                Command::new("ip")
                    .args(["netns", "exec", &storage.ns.name, "bash", "-c", &probe])
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            },
        );
        storage
    }

    /// The connection string of the development account at this Azurite.
    pub fn connection_string(&self) -> String {
        format!(
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={DEV_KEY};\
             BlobEndpoint=http://{STORAGE_ADDR}:{AZURITE_PORT}/devstoreaccount1;"
        )
    }

    /// Azurite's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A new host: its own network namespace (10.231.0.(10+N)/24 on a veth
    /// whose other end is on the storage bridge) and mount namespace.
    pub fn host(&mut self, name: &str) -> Host {
        self.hosts += 1;
        let n = self.hosts;
        assert!(n < 200, "too many hosts");
        let ns = NetNs::new(format!("bd-h{n}-{}", self.tag));
        let peer = format!("h{n}");
        ip(&[
            "-n",
            &ns.name,
            "link",
            "add",
            "eth0",
            "type",
            "veth",
            "peer",
            "name",
            &peer,
            "netns",
            &self.ns.name,
        ]);
        ip(&[
            "-n",
            &self.ns.name,
            "link",
            "set",
            &peer,
            "master",
            "br0",
            "up",
        ]);
        let addr = format!("10.231.0.{}/24", 10 + n);
        ip(&["-n", &ns.name, "addr", "add", &addr, "dev", "eth0"]);
        ip(&["-n", &ns.name, "link", "set", "eth0", "up"]);
        let holder = Command::new("ip")
            .args(["netns", "exec", &ns.name, "sleep", "infinity"])
            .stdin(Stdio::null())
            .spawn()
            .expect("cannot start the host's namespace holder");
        let holder_pid = holder.id() as i32;
        // `ip netns exec` execs the command once the namespaces are set up.
        wait_for("the host's namespaces", Duration::from_secs(10), || {
            std::fs::read_link(format!("/proc/{holder_pid}/ns/net")).ok()
                != std::fs::read_link("/proc/self/ns/net").ok()
                && std::fs::read_link(format!("/proc/{holder_pid}/ns/mnt")).ok()
                    != std::fs::read_link("/proc/self/ns/mnt").ok()
        });
        let root = tempfile::Builder::new()
            .prefix(&format!("blobdrive-host-{name}-"))
            .tempdir()
            .expect("temp dir");
        std::fs::create_dir(root.path().join("run")).expect("run dir");
        Host {
            name: name.to_string(),
            holder: Owned(holder),
            holder_pid,
            _ns: ns,
            connection_string: self.connection_string(),
            root,
            mounts: std::sync::Mutex::new(Vec::new()),
            holders: std::sync::Mutex::new(Vec::new()),
        }
    }
}

/// One host: network and mount namespaces, a run directory, a recovery
/// directory and logs under its own temp dir.
pub struct Host {
    /// A name for messages and logs.
    pub name: String,
    // Drop order matters: `Drop for Host` cleans up first, then the holder is
    // killed (ending the mount namespace), then the network namespace goes.
    holder: Owned,
    holder_pid: i32,
    _ns: NetNs,
    connection_string: String,
    /// The host's temp dir (run dir, recovery dir, mount points, logs).
    pub root: tempfile::TempDir,
    /// Every mount made with [`Host::mount`]: directory and daemon pid.
    mounts: std::sync::Mutex<Vec<(PathBuf, i32)>>,
    /// The holder process of each attach made with [`Host::mount`].
    holders: std::sync::Mutex<Vec<(PathBuf, i32)>>,
}

impl Host {
    /// The run directory (`BLOBDRIVE_RUN_DIR`) of this host's daemons.
    pub fn run_dir(&self) -> PathBuf {
        self.root.path().join("run")
    }

    /// Where this host's daemons save recovery files.
    pub fn recovery_dir(&self) -> PathBuf {
        self.root.path().join("recovery")
    }

    /// A new directory in the host's temp dir (a mount point).
    pub fn dir(&self, name: &str) -> PathBuf {
        let dir = self.root.path().join(name);
        std::fs::create_dir_all(&dir).expect("mkdir");
        dir
    }

    /// `path` (as the host sees it) from the test's own namespaces, through
    /// the holder's root: reads and writes go to the host's mounts.
    pub fn view(&self, path: &Path) -> PathBuf {
        let relative = path.strip_prefix("/").unwrap_or(path);
        PathBuf::from(format!("/proc/{}/root", self.holder_pid)).join(relative)
    }

    /// `program args...` inside the host's namespaces, with the host's
    /// account and directories in its environment; not yet run.
    pub fn command(&self, program: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.args([
            "--target",
            &self.holder_pid.to_string(),
            "--net",
            "--mount",
            "--",
        ])
        .arg(program)
        .args(args)
        .env("AZURE_STORAGE_CONNECTION_STRING", &self.connection_string)
        .env("BLOBDRIVE_RUN_DIR", self.run_dir())
        .env("BLOBDRIVE_RECOVERY_DIR", self.recovery_dir())
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null());
        cmd
    }

    /// `blobdrive ARGS` on this host (killed after two minutes).
    pub fn blobdrive(&self, args: &[&str]) -> Output {
        let mut cmd = self.command(BIN, args);
        run_with_timeout(&mut cmd, Duration::from_secs(120)).unwrap_or_else(|| {
            panic!(
                "{}: blobdrive {args:?} did not finish in 2 minutes",
                self.name
            )
        })
    }

    /// `blobdrive ARGS` on this host; its stdout, or a panic with its stderr.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.blobdrive(args);
        assert!(
            out.status.success(),
            "{}: blobdrive {args:?} failed: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Mounts `source` (a drive `C/B`, or a container for a namespace mount)
    /// at the new directory `name` with `extra` options and a log file;
    /// returns the mount point (as the host sees it).
    pub fn mount(&self, source: &str, name: &str, extra: &[&str]) -> PathBuf {
        self.try_mount(source, name, extra)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Host::mount`] for tests where a mount may fail (the host's link is
    /// down, another host holds the lease): the failure with the daemon's
    /// log instead of a panic. A mount that succeeds is cleaned up on drop.
    pub fn try_mount(&self, source: &str, name: &str, extra: &[&str]) -> Result<PathBuf, String> {
        let dir = self.dir(name);
        let dir_s = dir.to_string_lossy().to_string();
        let log = self.log_path(name);
        let log_s = log.to_string_lossy().to_string();
        let mut args = vec!["mount", source, dir_s.as_str(), "--log-file", &log_s, "-v"];
        args.extend(extra);
        let out = self.blobdrive(&args);
        if !out.status.success() {
            return Err(format!(
                "{}: blobdrive {args:?} failed: {}\nlog: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr),
                std::fs::read_to_string(&log).unwrap_or_default()
            ));
        }
        let out = self.blobdrive(&["stats", &dir_s, "--json"]);
        if !out.status.success() {
            // Mounted, but not known to the cleanup yet: its registry entry
            // is, and the cleanup unmounts everything under the host's root.
            return Err(format!(
                "{}: stats of the new mount failed: {}\nlog: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr),
                std::fs::read_to_string(&log).unwrap_or_default()
            ));
        }
        let stats: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stats is JSON");
        let pid = stats["pid"].as_i64().expect("stats names the daemon's pid") as i32;
        self.mounts.lock().unwrap().push((dir.clone(), pid));
        if let Some(holder) = stats["daemon"]["holder_pid"].as_i64() {
            self.holders
                .lock()
                .unwrap()
                .push((dir.clone(), holder as i32));
        }
        Ok(dir)
    }

    /// `blobdrive serve DRIVE --nbd unix:SOCKET` in the background with
    /// `extra` options and the log `name.log`, the socket `name.sock` in the
    /// host's temp dir (reachable by path from the test's namespaces): the
    /// socket and the server's pid, or the failure. A server that started is
    /// stopped on drop (`blobdrive unmount SOCKET`, then SIGKILL).
    pub fn try_serve(
        &self,
        drive: &str,
        name: &str,
        extra: &[&str],
    ) -> Result<(PathBuf, i32), String> {
        let socket = self.root.path().join(format!("{name}.sock"));
        let _ = std::fs::remove_file(&socket);
        let endpoint = format!("unix:{}", socket.display());
        let log = self.log_path(name);
        let log_s = log.to_string_lossy().to_string();
        let mut args = vec![
            "serve",
            drive,
            "--nbd",
            &endpoint,
            "--log-file",
            &log_s,
            "-v",
        ];
        args.extend(extra);
        let out = self.blobdrive(&args);
        if !out.status.success() {
            return Err(format!(
                "{}: blobdrive {args:?} failed: {}\nlog: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr),
                std::fs::read_to_string(&log).unwrap_or_default()
            ));
        }
        let list = self.ok(&["list", "--mounted", "--json"]);
        let rows: serde_json::Value = serde_json::from_str(&list).expect("list --mounted is JSON");
        let pid = rows
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| {
                r["kind"] == "nbd"
                    && r["nbd"]
                        .as_str()
                        .is_some_and(|e| e.contains(&*socket.to_string_lossy()))
            })
            .and_then(|r| r["pid"].as_i64())
            .ok_or_else(|| {
                format!(
                    "{}: list --mounted does not name the server of {endpoint}: {list}",
                    self.name
                )
            })? as i32;
        // The cleanup stops a server as it unmounts an attach: `unmount`
        // takes the socket path too.
        self.mounts.lock().unwrap().push((socket.clone(), pid));
        Ok((socket, pid))
    }

    /// Takes the host's link to storage down or up (`ip link set eth0`): a
    /// network partition of this host alone.
    pub fn set_link(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        let status = self
            .command("ip", &["link", "set", "eth0", state])
            .status()
            .expect("run ip");
        assert!(status.success(), "{}: ip link set eth0 {state}", self.name);
    }

    /// The holder process of the attach at `dir` (see `daemon/holder.rs`).
    pub fn holder_pid(&self, dir: &Path) -> i32 {
        self.holders
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|(d, _)| d == dir)
            .map(|(_, pid)| *pid)
            .unwrap_or_else(|| {
                panic!(
                    "{}: no attach with a holder at {}",
                    self.name,
                    dir.display()
                )
            })
    }

    /// Kills the attach at `dir` as a host crash would its daemon: the
    /// holder first (so no process takes over), then the serving process.
    pub fn kill_daemon(&self, dir: &Path) {
        for pid in [self.holder_pid(dir), self.daemon_pid(dir)] {
            // SAFETY: plain syscall on a process this host started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }

    /// `blobdrive stats DIR --json` on this host.
    pub fn stats(&self, dir: &Path) -> serde_json::Value {
        let out = self.ok(&["stats", &dir.to_string_lossy(), "--json"]);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("stats is not JSON ({e}): {out}"))
    }

    /// The pid of the daemon of the mount at `dir` made by [`Host::mount`].
    pub fn daemon_pid(&self, dir: &Path) -> i32 {
        self.mounts
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|(d, _)| d == dir)
            .map(|(_, pid)| *pid)
            .unwrap_or_else(|| panic!("{}: nothing mounted at {}", self.name, dir.display()))
    }

    /// The log file of the mount at directory `name`.
    pub fn log_path(&self, name: &str) -> PathBuf {
        self.root.path().join(format!("{name}.log"))
    }

    /// `blobdrive unmount DIR` on this host, checked.
    pub fn unmount(&self, dir: &Path) {
        self.ok(&["unmount", &dir.to_string_lossy()]);
    }

    /// The registry entries of this host's attaches.
    pub fn attached(&self) -> Vec<serde_json::Value> {
        let Ok(entries) = std::fs::read_dir(self.run_dir().join("attach")) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .filter_map(|p| std::fs::read_to_string(p).ok())
            .filter_map(|t| serde_json::from_str(&t).ok())
            .collect()
    }

    /// True when `dir` is a mount point in the host's mount namespace.
    pub fn is_mounted(&self, dir: &Path) -> bool {
        let dir = dir.to_string_lossy();
        std::fs::read_to_string(format!("/proc/{}/mountinfo", self.holder_pid))
            .map(|info| info.lines().any(|l| l.split(' ').nth(4) == Some(&*dir)))
            .unwrap_or(false)
    }

    /// Recovery files this host's daemons saved.
    pub fn recovery_files(&self) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(self.recovery_dir()) else {
            return Vec::new();
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "bdrec"))
            .collect();
        files.sort();
        files
    }

    /// Removes what this host's daemons left: resumes and unmounts every
    /// attach, kills daemons that remain, then removes filesystems, loop
    /// devices and FUSE mounts under the host's directories.
    fn clean_up(&self) {
        let mounts = std::mem::take(&mut *self.mounts.lock().unwrap_or_else(|e| e.into_inner()));
        let holders = std::mem::take(&mut *self.holders.lock().unwrap_or_else(|e| e.into_inner()));
        let alive = |pid: i32| blobdrive::daemon::registry::process_alive(pid as u32);
        let current: Vec<i32> = self
            .attached()
            .iter()
            .filter_map(|e| e["pid"].as_i64())
            .map(|pid| pid as i32)
            .collect();
        for pid in mounts.iter().map(|(_, pid)| *pid).chain(current) {
            if alive(pid) {
                // A test may have stopped it; a stopped daemon cannot unmount.
                // SAFETY: plain syscall on a daemon this host started.
                unsafe { libc::kill(pid, libc::SIGCONT) };
            }
        }
        for (dir, pid) in &mounts {
            if alive(*pid) || self.is_mounted(dir) {
                let mut cmd = self.command(BIN, &["unmount", &dir.to_string_lossy()]);
                let _ = run_with_timeout(&mut cmd, Duration::from_secs(60));
            }
        }
        // Holders first: a holder whose serving process is killed would
        // start another. The registry names the serving process of now
        // (a takeover changes it).
        let registered: Vec<(PathBuf, i32)> = self
            .attached()
            .iter()
            .flat_map(|e| [e["holder_pid"].as_i64(), e["pid"].as_i64()])
            .flatten()
            .map(|pid| (PathBuf::new(), pid as i32))
            .collect();
        for (_, pid) in holders.iter().chain(&registered).chain(&mounts) {
            if alive(*pid) {
                // SAFETY: plain syscall on a daemon this host started.
                unsafe { libc::kill(*pid, libc::SIGKILL) };
            }
        }
        // Innermost first: filesystems on loop devices, the loop devices,
        // then the private FUSE mounts (all under the host's temp dir).
        let root = self.root.path().to_string_lossy().to_string();
        let script = format!(
            r#"root="{root}"
awk -v r="$root" 'index($5, r) == 1 {{ print $5 }}' /proc/self/mountinfo | sort -r |
while read -r m; do
  case "$m" in */run/attach/*) ;; *) umount -l "$m" 2>/dev/null ;; esac
done
losetup -a | while IFS=: read -r dev rest; do
  case "$rest" in *"$root"*) losetup -d "$dev" 2>/dev/null ;; esac
done
awk -v r="$root" 'index($5, r) == 1 {{ print $5 }}' /proc/self/mountinfo | sort -r |
while read -r m; do umount -l "$m" 2>/dev/null; done
true"#
        );
        let mut cmd = self.command("bash", &["-c", &script]);
        let _ = run_with_timeout(&mut cmd, Duration::from_secs(60));
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if std::env::var_os("BLOBDRIVE_TEST_KEEP").is_some() {
            eprintln!("{}: logs kept in {}", self.name, self.root.path().display());
        }
        self.clean_up();
    }
}
