//! The control socket of a mount: how `blobdrive stats DIR` and
//! `blobdrive unmount DIR` reach the daemon serving DIR. An NBD server
//! (`blobdrive serve`) has one too, named as a mount at its endpoint would
//! be (`served.rs`): `stats` and `unmount` take its socket path, endpoint
//! or an export name, and the daemon's answers come from [`Controlled`].
//!
//! One Unix stream socket per mount, `<run dir>/<hash>.sock`, where `<hash>`
//! is the first 16 hex digits of the SHA-256 of the canonical mountpoint path
//! and the run dir is this user's (`mountpoint::run_dir`: `$BLOBDRIVE_RUN_DIR`
//! itself when nobody else may write to it, else `blobdrive-UID` in it, 0700);
//! the socket is 0600. Protocol: the client sends one line, `stats`, `metrics`, `flush`,
//! `grow <bytes>` or `unmount`; the daemon answers one line: the stats JSON,
//! or `ok` / `error <reason>` once the flush, the grow of the drive under the
//! daemon's lease, or the unmount has finished.
//!
//! Who may ask: root and the user the daemon runs as (who mounted it), for
//! every command, the read-only `stats` and `metrics` too (they name the
//! account and drives). The directory keeps others away; the daemon also
//! checks each peer's uid (`SO_PEERCRED`) and answers anyone else
//! `error permission denied: ...` without reading the request, so a socket
//! reachable by mistake (a directory opened up by hand) still obeys only them.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};

use super::mountpoint::{
    is_mount_point, lazy_unmount, mount_key, owners_run_dir, run_dir, RUN_DIR_ENV,
};
use crate::private_dir;

/// How long `stats` waits for an answer.
const STATS_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a command waits for the next serving process of an attach
/// whose process died (its holder starts one at once; the takeover takes
/// the lease and replays the write log).
const TAKEOVER_WAIT: Duration = Duration::from_secs(60);

/// The control socket of the mount at `mountpoint` (which must exist).
pub fn socket_path(mountpoint: &Path) -> anyhow::Result<PathBuf> {
    Ok(socket_path_of_canonical(&canonical_mountpoint(mountpoint)?))
}

/// The canonical path of a mount point; a dead FUSE mount (its daemon killed)
/// cannot be resolved (`ENOTCONN`), so its absolute path stands in for it.
fn canonical_mountpoint(mountpoint: &Path) -> anyhow::Result<PathBuf> {
    match mountpoint.canonicalize() {
        Ok(canonical) => Ok(canonical),
        Err(err) if err.raw_os_error() == Some(libc::ENOTCONN) => {
            let parent = mountpoint
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            let name = mountpoint
                .file_name()
                .with_context(|| format!("cannot resolve {}", mountpoint.display()))?;
            let parent = parent
                .canonicalize()
                .with_context(|| format!("cannot resolve {}", mountpoint.display()))?;
            Ok(parent.join(name))
        }
        Err(err) => Err(err).with_context(|| format!("cannot resolve {}", mountpoint.display())),
    }
}

/// No daemon answers for a mount point.
#[derive(Debug, thiserror::Error)]
pub enum NoDaemon {
    /// There is no control socket: nothing blobdrive serves is mounted there.
    #[error("{} is not a blobdrive mount (no daemon serves it)", .dir.display())]
    NotAMount {
        /// The directory asked about.
        dir: PathBuf,
    },
    /// The control socket is left over from a daemon that died (crash, kill -9).
    #[error(
        "the daemon of {} is gone (it crashed or was killed); \
         'blobdrive unmount {}' removes what it left behind",
        .dir.display(), .dir.display()
    )]
    Gone {
        /// The canonical mount point.
        dir: PathBuf,
        /// Its stale control socket.
        socket: PathBuf,
    },
}

/// Cleans up after a daemon that died: lazily detaches its dead FUSE mount (if
/// still mounted) and removes its stale control socket. Returns whether a
/// mount was detached.
pub fn remove_dead_mount(gone: &NoDaemon) -> anyhow::Result<bool> {
    let NoDaemon::Gone { dir, socket } = gone else {
        return Ok(false);
    };
    let detached = is_mount_point(dir).unwrap_or(false);
    if detached {
        lazy_unmount(dir)?;
    }
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(err).with_context(|| format!("cannot remove {}", socket.display())),
    }
    Ok(detached)
}

pub(crate) fn socket_path_of_canonical(canonical: &Path) -> PathBuf {
    run_dir().join(format!("{}.sock", mount_key(canonical)))
}

/// A command sent over the control socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Counters of all open devices, as JSON.
    Stats,
    /// The same counters and the latency histograms in the Prometheus text
    /// format, as one JSON string.
    Metrics,
    /// Make every write accepted so far durable (`blobdrive snapshot`).
    Flush,
    /// Grow the drive opened read-write to this many bytes (`blobdrive resize`).
    Grow(u64),
    /// Flush, close and unmount.
    Unmount,
    /// Flush and hand the attach over to a serving process of this binary
    /// (`blobdrive upgrade`).
    Upgrade(PathBuf),
}

impl Command {
    /// Parses one request line.
    pub fn parse(line: &str) -> Option<Self> {
        match line.trim() {
            "stats" => Some(Command::Stats),
            "metrics" => Some(Command::Metrics),
            "flush" => Some(Command::Flush),
            "unmount" => Some(Command::Unmount),
            other => match other.strip_prefix("upgrade ") {
                Some(path) if path.starts_with('/') => Some(Command::Upgrade(PathBuf::from(path))),
                Some(_) => None,
                None => other
                    .strip_prefix("grow ")
                    .and_then(|n| n.trim().parse().ok())
                    .map(Command::Grow),
            },
        }
    }
}

/// May the user `uid` control a mount whose daemon runs as `owner`?
fn may_control(uid: u32, owner: u32) -> bool {
    uid == 0 || uid == owner
}

/// The control socket of the mount at `canonical`: in this user's run
/// directory, or for root, who may control every mount, in the run
/// directory of the user who owns that mount (the kernel's mount table says
/// who), when root has none there. A socket anywhere else under the mount's
/// name, which another user could have left there, is never asked.
fn find_socket(canonical: &Path) -> PathBuf {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let own = socket_path_of_canonical(canonical);
    if private_dir::euid() != 0 || own.exists() {
        return own;
    }
    let Some(dir) = owners_run_dir(canonical) else {
        return own;
    };
    let Some(name) = own.file_name() else {
        return own;
    };
    let owner = std::fs::symlink_metadata(&dir).map(|m| m.uid()).ok();
    let theirs = dir.join(name);
    match std::fs::symlink_metadata(&theirs) {
        Ok(m) if m.file_type().is_socket() && Some(m.uid()) == owner => theirs,
        _ => own,
    }
}

/// Connects to the control socket at `path`; while the attach at `dir` is
/// between two serving processes (its holder lives, the socket does not
/// answer yet), waits up to [`TAKEOVER_WAIT`] for the next one.
fn connect(dir: &Path, path: &Path) -> std::io::Result<UnixStream> {
    let started = std::time::Instant::now();
    loop {
        match UnixStream::connect(path) {
            Err(err)
                if matches!(
                    err.kind(),
                    std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
                ) && started.elapsed() < TAKEOVER_WAIT
                    && super::registry::find_by_dir(dir).is_some_and(|e| e.alive) =>
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// Sends `command` and returns the answer line. When the serving process of
/// an attach dies before it answers (its holder lives on and starts
/// another), the command is sent again to the next one: every command is
/// safe to repeat (`unmount` and `flush` of a drive already flushed or
/// unmounted are no-ops, the others only read).
fn request(mountpoint: &Path, command: &str, timeout: Option<Duration>) -> anyhow::Result<String> {
    let started = std::time::Instant::now();
    loop {
        match request_once(mountpoint, command, timeout) {
            Err(err) if is_cut_short(&err) && started.elapsed() < TAKEOVER_WAIT => {
                let alive = canonical_mountpoint(mountpoint)
                    .ok()
                    .and_then(|dir| super::registry::find_by_dir(&dir))
                    .is_some_and(|e| e.alive && e.holder_pid.is_some());
                if !alive {
                    return Err(err);
                }
                tracing::debug!("the daemon died before answering; asking its successor");
                std::thread::sleep(Duration::from_millis(200));
            }
            other => return other,
        }
    }
}

/// The connection ended before an answer (the process serving it died).
fn is_cut_short(err: &anyhow::Error) -> bool {
    if err.downcast_ref::<CutShort>().is_some() {
        return true;
    }
    err.chain().any(|cause| {
        cause.downcast_ref::<std::io::Error>().is_some_and(|e| {
            matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            )
        })
    })
}

/// The daemon closed the control socket without an answer.
#[derive(Debug, thiserror::Error)]
#[error("the daemon of {} closed the control socket without an answer", .0.display())]
struct CutShort(PathBuf);

fn request_once(
    mountpoint: &Path,
    command: &str,
    timeout: Option<Duration>,
) -> anyhow::Result<String> {
    // An NBD server answers under the name of its endpoint (see `served`).
    let server = super::served::find(mountpoint)?;
    let (dir, path) = match &server {
        Some(served) => (served.key.clone(), socket_path_of_canonical(&served.key)),
        None => {
            let dir = canonical_mountpoint(mountpoint)?;
            let socket = find_socket(&dir);
            (dir, socket)
        }
    };
    let mut stream = match connect(&dir, &path) {
        Ok(stream) => stream,
        Err(err)
            if err.kind() == std::io::ErrorKind::NotFound
                && is_mount_point(&dir).unwrap_or(false)
                && private_dir::euid() != 0 =>
        {
            bail!(
                "no daemon of this user (uid {}) serves {}: a mount made by another user is \
                 controlled by that user or root",
                private_dir::euid(),
                mountpoint.display()
            )
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Err(NoDaemon::NotAMount {
                dir: mountpoint.to_path_buf(),
            }
            .into())
        }
        // A server whose process lives is never said to be gone: its
        // lease must not be broken under it.
        Err(err) if err.kind() == std::io::ErrorKind::ConnectionRefused => match server {
            Some(s) if s.alive => bail!(
                "the NBD server of {} (pid {}) is running but its control socket does not \
                 answer; wait for it to exit, or stop it with 'kill -TERM {}'",
                s.endpoint,
                s.pid,
                s.pid
            ),
            _ => return Err(NoDaemon::Gone { dir, socket: path }.into()),
        },
        Err(err) if err.kind() == std::io::ErrorKind::PermissionDenied => {
            bail!(
                "cannot reach the daemon of {}: {}",
                mountpoint.display(),
                run_dir_denied(&path)
            )
        }
        Err(err) => {
            return Err(err).with_context(|| {
                format!(
                    "no blobdrive daemon answers for {} (socket {})",
                    mountpoint.display(),
                    path.display()
                )
            })
        }
    };
    stream.set_read_timeout(timeout)?;
    match stream.write_all(format!("{command}\n").as_bytes()) {
        // A daemon that refuses this user answers and closes at once: its
        // answer is still there to read.
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => {}
        r => r?,
    }
    let mut line = String::new();
    BufReader::new(stream)
        .read_line(&mut line)
        .with_context(|| format!("no answer from the daemon of {}", mountpoint.display()))?;
    if line.is_empty() {
        return Err(CutShort(mountpoint.to_path_buf()).into());
    }
    Ok(line.trim_end().to_string())
}

/// Live counters of the mount at `mountpoint`:
/// `{"mountpoint": .., "pid": .., "devices": {"container/blob": counters}}`.
pub fn request_stats(mountpoint: &Path) -> anyhow::Result<serde_json::Value> {
    let line = request(mountpoint, "stats", Some(STATS_TIMEOUT))?;
    if let Some(reason) = line.strip_prefix("error ") {
        bail!(
            "cannot read the stats of {}: {reason}",
            mountpoint.display()
        );
    }
    serde_json::from_str(&line).with_context(|| format!("bad stats answer: {line}"))
}

/// The metrics of the mount at `mountpoint` in the Prometheus text format.
pub fn request_metrics(mountpoint: &Path) -> anyhow::Result<String> {
    let line = request(mountpoint, "metrics", Some(STATS_TIMEOUT))?;
    if let Some(reason) = line.strip_prefix("error ") {
        bail!(
            "cannot read the metrics of {}: {reason}",
            mountpoint.display()
        );
    }
    serde_json::from_str(&line).with_context(|| format!("bad metrics answer: {line}"))
}

/// Asks the daemon of `mountpoint` to make every write accepted so far durable
/// in the blob (the filesystem is usually frozen first); returns its reason
/// when it could not.
pub fn request_flush(mountpoint: &Path) -> anyhow::Result<()> {
    let line = request(mountpoint, "flush", None)?;
    match line.strip_prefix("error ") {
        None if line == "ok" => Ok(()),
        None => bail!("unexpected answer from the daemon: {line}"),
        Some(reason) => bail!("cannot flush {}: {reason}", mountpoint.display()),
    }
}

/// Asks the daemon of `mountpoint` to grow its read-write drive to
/// `new_size_bytes` under its lease (blob, footer, the FUSE file's size);
/// returns its reason when it could not.
pub fn request_grow(mountpoint: &Path, new_size_bytes: u64) -> anyhow::Result<()> {
    let line = request(mountpoint, &format!("grow {new_size_bytes}"), None)?;
    match line.strip_prefix("error ") {
        None if line == "ok" => Ok(()),
        None => bail!("unexpected answer from the daemon: {line}"),
        Some(reason) => bail!(
            "cannot grow the drive of {}: {reason}",
            mountpoint.display()
        ),
    }
}

/// Asks the daemon of the attach at `mountpoint` to flush and hand the
/// attach over to a serving process running `binary` (an absolute path);
/// returns once it has agreed (the handover then takes a moment), or with
/// its reason why not.
pub fn request_upgrade(mountpoint: &Path, binary: &Path) -> anyhow::Result<()> {
    let line = request_once(mountpoint, &format!("upgrade {}", binary.display()), None)?;
    match line.strip_prefix("error ") {
        None if line == "ok" => Ok(()),
        None => bail!("unexpected answer from the daemon: {line}"),
        Some(reason) => bail!(
            "cannot upgrade the daemon of {}: {reason}",
            mountpoint.display()
        ),
    }
}

/// Asks the daemon of `mountpoint` to flush everything, close its drives
/// (releasing leases) and unmount; returns once it has, or with its reason why not.
pub fn request_unmount(mountpoint: &Path) -> anyhow::Result<()> {
    let line = request(mountpoint, "unmount", None)?;
    match line.strip_prefix("error ") {
        None if line == "ok" => Ok(()),
        None => bail!("unexpected answer from the daemon: {line}"),
        Some(reason) => bail!("cannot unmount {}: {reason}", mountpoint.display()),
    }
}

/// An unmount request waiting for its answer; the daemon answers on the
/// requester's connection itself, so the answer is written before it exits.
pub(crate) struct UnmountRequest {
    stream: tokio::net::unix::OwnedWriteHalf,
}

impl UnmountRequest {
    /// Sends `ok` or `error <reason>` to the requester.
    pub async fn answer(mut self, result: Result<(), String>) {
        use tokio::io::AsyncWriteExt;
        let line = match result {
            Ok(()) => "ok\n".to_string(),
            Err(reason) => format!("error {}\n", reason.replace('\n', " ")),
        };
        if let Err(err) = self.stream.write_all(line.as_bytes()).await {
            tracing::debug!(%err, "the unmount requester went away before the answer");
        }
        let _ = self.stream.shutdown().await;
    }
}

/// Binds the control socket at `path` (in this user's run directory, made
/// or checked here) with mode 0600, replacing a stale one; fails if a live
/// daemon already answers there.
pub(crate) fn bind(path: &Path) -> anyhow::Result<tokio::net::UnixListener> {
    let denied = |e: &std::io::Error| e.kind() == std::io::ErrorKind::PermissionDenied;
    let dir = match super::mountpoint::ensure_run_dir() {
        // The kernel's own "permission denied": not ours to create in.
        Err(e) if denied(&e) && e.raw_os_error().is_some() => bail!("{}", run_dir_denied(path)),
        // A directory `private_dir` refused says why itself.
        Err(e) if e.raw_os_error().is_none() => bail!("cannot use the run directory: {e}"),
        r => r.with_context(|| format!("cannot create {}", run_dir().display()))?,
    };
    if path.parent() != Some(dir.as_path()) {
        bail!(
            "the control socket {} is not in the run directory {}",
            path.display(),
            dir.display()
        );
    }
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            bail!(
                "another blobdrive daemon already serves this mountpoint ({})",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("cannot remove stale {}", path.display()))?;
    }
    let listener = match tokio::net::UnixListener::bind(path) {
        Err(e) if denied(&e) => bail!("{}", run_dir_denied(path)),
        r => r.with_context(|| format!("cannot bind {}", path.display()))?,
    };
    // Connecting takes write permission on the socket: only its owner (and
    // root). The directory may be one others can enter (0755, our own).
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("cannot restrict {}", path.display()))?;
    }
    Ok(listener)
}

/// What to say when the run directory holding `socket` is not ours to use.
fn run_dir_denied(socket: &Path) -> String {
    let dir = socket.parent().unwrap_or(socket);
    format!(
        "permission denied in the run directory {}: mounts are made as root (sudo), or set {RUN_DIR_ENV} to a directory you own",
        dir.display()
    )
}

/// The mount's metrics in the Prometheus text format: its devices' counters
/// and this process's histograms.
pub(crate) fn metrics_text(core: &crate::fs::FsCore) -> String {
    let stats = core.stats();
    let empty = serde_json::Map::new();
    let devices = stats.as_object().unwrap_or(&empty);
    crate::metrics::text::render(devices, &crate::metrics::registry().snapshot())
}

/// What a daemon answers on its control socket: a mount (its `FsCore`) or
/// an NBD server (its exports). The socket, the peer check and the line
/// protocol are the same for both; `unmount` goes to the daemon's
/// shutdown through the channel given to [`serve`].
#[async_trait::async_trait]
pub(crate) trait Controlled: Send + Sync + 'static {
    /// The `stats` answer: `{"mountpoint" or "endpoint": .., "pid": .., "devices": {..}}`.
    fn stats(&self) -> serde_json::Value;
    /// The `metrics` answer in the Prometheus text format.
    fn metrics(&self) -> String;
    /// `flush`: makes every write accepted so far durable; the reasons it could not.
    async fn flush(&self) -> Result<(), String>;
    /// `grow BYTES` of the drive opened read-write.
    async fn grow(&self, _bytes: u64) -> Result<(), String> {
        Err("this daemon grows no drive online (an NBD export keeps its size)".into())
    }
    /// `upgrade BINARY`: agrees (the caller answers `ok` and then calls
    /// [`Controlled::exit_for_upgrade`]) or says why not.
    async fn prepare_upgrade(&self, _binary: &Path) -> Result<(), String> {
        Err("only an attached drive is handed to a new binary".into())
    }
    /// Leaves this process for the upgrade agreed to.
    fn exit_for_upgrade(&self) {}
}

/// A mount's answers: its core's devices under its mount point.
pub(crate) struct MountControl {
    /// The mount's devices.
    pub core: std::sync::Arc<crate::fs::FsCore>,
    /// The canonical mount point.
    pub mountpoint: PathBuf,
}

#[async_trait::async_trait]
impl Controlled for MountControl {
    fn stats(&self) -> serde_json::Value {
        serde_json::json!({
            "mountpoint": self.mountpoint,
            "pid": std::process::id(),
            "daemon": super::holder::daemon_info(),
            "devices": self.core.stats(),
        })
    }

    fn metrics(&self) -> String {
        metrics_text(&self.core)
    }

    async fn flush(&self) -> Result<(), String> {
        let errors = self.core.flush_all().await;
        if errors.is_empty() {
            return Ok(());
        }
        let reasons: Vec<String> = errors.iter().map(ToString::to_string).collect();
        Err(reasons.join("; "))
    }

    async fn grow(&self, bytes: u64) -> Result<(), String> {
        self.core.grow_drive(bytes).await.map_err(|e| e.to_string())
    }

    async fn prepare_upgrade(&self, binary: &Path) -> Result<(), String> {
        super::holder::prepare_upgrade(binary, &self.core)
            .await
            .map_err(|e| format!("{e:#}"))
    }

    fn exit_for_upgrade(&self) {
        super::holder::exit_for_upgrade();
    }
}

/// Answers control connections until the task is aborted.
pub(crate) async fn serve(
    listener: tokio::net::UnixListener,
    daemon: std::sync::Arc<dyn Controlled>,
    unmounts: tokio::sync::mpsc::Sender<UnmountRequest>,
) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let owner = private_dir::euid();
    loop {
        let mut stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(err) => {
                tracing::warn!(%err, "control socket accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let daemon = daemon.clone();
        let unmounts = unmounts.clone();
        tokio::spawn(async move {
            let uid = match stream.peer_cred() {
                Ok(cred) => cred.uid(),
                Err(err) => {
                    tracing::warn!(%err, "control socket: cannot tell who connected; refused");
                    return;
                }
            };
            if !may_control(uid, owner) {
                tracing::warn!(uid, "control socket: a request from another user refused");
                let line = format!(
                    "error permission denied: only root or uid {owner}, who started it, may control this daemon\n"
                );
                let _ = stream.write_all(line.as_bytes()).await;
                return;
            }
            let (read, mut write) = stream.into_split();
            let mut line = String::new();
            if tokio::io::BufReader::new(read)
                .read_line(&mut line)
                .await
                .is_err()
            {
                return;
            }
            let outcome = |r: Result<(), String>| match r {
                Ok(()) => "ok".to_string(),
                Err(reason) => format!("error {}", reason.replace('\n', " ")),
            };
            let answer = match Command::parse(&line) {
                Some(Command::Stats) => daemon.stats().to_string(),
                Some(Command::Metrics) => serde_json::Value::String(daemon.metrics()).to_string(),
                Some(Command::Unmount) => {
                    let request = UnmountRequest { stream: write };
                    if let Err(refused) = unmounts.send(request).await {
                        let reason = "the daemon is already shutting down".to_string();
                        refused.0.answer(Err(reason)).await;
                    }
                    return;
                }
                Some(Command::Flush) => outcome(daemon.flush().await),
                Some(Command::Upgrade(binary)) => match daemon.prepare_upgrade(&binary).await {
                    Ok(()) => {
                        // Answered before this process goes: the
                        // requester then waits for the new one.
                        let _ = write.write_all(b"ok\n").await;
                        let _ = write.shutdown().await;
                        daemon.exit_for_upgrade();
                        return;
                    }
                    Err(reason) => outcome(Err(reason)),
                },
                Some(Command::Grow(bytes)) => outcome(daemon.grow(bytes).await),
                None => format!("error unknown command {:?}", line.trim()),
            };
            let _ = write.write_all(format!("{answer}\n").as_bytes()).await;
        });
    }
}
