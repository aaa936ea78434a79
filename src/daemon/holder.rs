//! The holder of an attach: a small process that owns the FUSE connection
//! (`/dev/fuse`), the attach's state and its write log, and runs the process
//! that serves them. When that process dies (a crash, `kill -9`, the OOM
//! killer) or stops answering (the watchdog), the holder starts another,
//! which takes the connection over: the filesystem above sees a pause, not
//! an I/O error.
//!
//! The holder is the daemon's main process (the one `blobdrive mount`
//! forks, or the foreground one under systemd); it forks each serving
//! process from itself, before it has any thread, so the child has the
//! mount's options, credentials and unlocked keys in memory exactly as the
//! first one had them (a typed passphrase exists once). It allocates
//! nothing per request and serves no I/O: it waits for its child, forwards
//! the stop signals to it, and reads the child's heartbeat from the shared
//! state.
//!
//! What ends the attach: the serving process exits by itself (0 after a
//! clean unmount, non-zero after a failed one or a failed start): the
//! holder exits with its status. What restarts it: death by a signal or a
//! panic after it was ready. A crash loop is broken: when
//! [`CRASH_LIMIT`] serving processes in a row die within [`EARLY_CRASH`] of
//! starting to serve (a request that kills every process is sent again to
//! the next one at once), one last process saves the logged writes in a
//! recovery file without serving, and the holder exits, which ends the
//! connection. A crash after a process served longer restarts the count:
//! deliberate kills, or a rare bug, cost a pause each, never the drive.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::handover::Handover;
use super::readiness::Readiness;
use crate::fs::write_log::WriteLog;

/// Early crashes in a row that end the attach instead of another restart.
pub const CRASH_LIMIT: usize = 3;
/// A serving process that dies within this time of starting to serve (or
/// before) counts as an early crash.
pub const EARLY_CRASH: Duration = Duration::from_secs(2);
/// How often the serving process beats.
pub const BEAT_INTERVAL: Duration = Duration::from_millis(500);
/// Environment variable overriding [`DEFAULT_WATCHDOG`] (seconds; 0 turns
/// the watchdog off).
pub const WATCHDOG_ENV: &str = "BLOBDRIVE_WATCHDOG_SECS";
/// A ready serving process that has not beaten for this long is replaced.
/// The beat comes from a timer task, which storage never blocks: an outage
/// is not a hang.
pub const DEFAULT_WATCHDOG: Duration = Duration::from_secs(10);
/// Environment variable that turns an attach's write log off (`off`): for
/// measuring what it costs. Without it a serving process that dies takes
/// the attach with it (its acknowledged, unflushed writes are lost, and
/// said so), as before the log existed.
pub const WRITE_LOG_ENV: &str = "BLOBDRIVE_WRITE_LOG";

/// False when [`WRITE_LOG_ENV`] says `off`.
pub fn write_log_wanted() -> bool {
    std::env::var(WRITE_LOG_ENV).map_or(true, |v| v != "off")
}

/// Exit status of a panic (Rust's default): a crash like a signal.
const PANIC_STATUS: i32 = 101;
/// Exit status of a serving process whose takeover could not finish (the
/// lease or the replay failed): a crash, tried again up to the limit.
pub const TAKEOVER_FAILED: i32 = 75;
/// How often the holder looks at its child.
const POLL: Duration = Duration::from_millis(50);
/// `oom_score_adj` the holder asks for (far below ordinary processes: its
/// death ends the connection).
const HOLDER_OOM_SCORE_ADJ: i32 = -1000;
/// `oom_score_adj` the serving process asks for.
pub const SERVER_OOM_SCORE_ADJ: i32 = -900;

/// Why a serving process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The first: mounts, initialises the connection, attaches.
    Fresh,
    /// After a crash: takes the connection over and goes on serving.
    Takeover,
    /// After a crash loop: saves the logged writes and exits.
    Salvage,
}

/// What a serving process is given.
pub struct Generation {
    /// Why it runs.
    pub role: Role,
    /// The connection's file (a duplicate of the holder's).
    pub dev: OwnedFd,
    /// The attach's shared state.
    pub state: Arc<Handover>,
    /// The write log (read-write attaches).
    pub log: Option<Arc<WriteLog>>,
    /// Crashes so far (for messages).
    pub crashes: u64,
}

/// The last stop signal received, for the holder loop.
static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn remember_signal(sig: libc::c_int) {
    PENDING_SIGNAL.store(sig, Ordering::SeqCst);
}

fn set_handler(sig: libc::c_int, handler: libc::sighandler_t) {
    // SAFETY: installing a handler that only stores to an atomic (or the
    // default action) is async-signal-safe.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(sig, &action, std::ptr::null_mut());
    }
}

const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

/// Asks for `value` as this process's `oom_score_adj`; returns the value in
/// effect (lowering it needs CAP_SYS_RESOURCE, which a host may not give).
pub fn set_oom_score_adj(value: i32) -> Option<i32> {
    if let Err(err) = std::fs::write("/proc/self/oom_score_adj", value.to_string()) {
        tracing::debug!(%err, value, "oom_score_adj not lowered");
    }
    std::fs::read_to_string("/proc/self/oom_score_adj")
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn watchdog_timeout() -> Option<Duration> {
    match std::env::var(WATCHDOG_ENV)
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        Some(0) => None,
        Some(secs) => Some(Duration::from_secs(secs)),
        None => Some(DEFAULT_WATCHDOG),
    }
}

/// Holds the attach and runs `serve` in a child process per generation,
/// until one ends the attach; returns the exit status for the daemon.
/// `log_bytes` sizes the write log (None: no log, a read-only attach).
/// Call with no thread running (it forks).
pub fn hold<S>(mut serve: S, mut ready: Readiness, log_bytes: Option<u64>) -> i32
where
    S: FnMut(Generation, Readiness) -> i32,
{
    let fail = |ready: &mut Readiness, what: &str, err: std::io::Error| {
        tracing::error!(%err, "{what}");
        ready.failed(&format!("{what}: {err}"));
        1
    };
    let state = match Handover::create() {
        Ok(state) => Arc::new(state),
        Err(err) => return fail(&mut ready, "cannot create the attach's state", err),
    };
    state.set_holder(std::process::id(), unix_now());
    let log = match log_bytes {
        None => None,
        Some(bytes) => match WriteLog::create(bytes, crate::fs::session::READ_BUFFER_BYTES) {
            Ok(log) => Some(Arc::new(log)),
            Err(err) => return fail(&mut ready, "cannot create the write log", err),
        },
    };
    let dev: OwnedFd = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        Ok(file) => file.into(),
        Err(err) => return fail(&mut ready, "cannot open /dev/fuse", err),
    };
    let oom = set_oom_score_adj(HOLDER_OOM_SCORE_ADJ);
    tracing::debug!(?oom, "holder oom_score_adj");
    for sig in STOP_SIGNALS {
        set_handler(
            sig,
            remember_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
    }

    let mut role = Role::Fresh;
    // Early crashes in a row.
    let mut crashes = 0u64;
    let mut ready = Some(ready);
    loop {
        let child_dev = match dev.try_clone() {
            Ok(fd) => fd,
            Err(err) => {
                tracing::error!(%err, "cannot duplicate the FUSE connection");
                return 1;
            }
        };
        let readiness = ready.take().unwrap_or_else(Readiness::foreground);
        // SAFETY: the holder runs no thread (documented precondition), so
        // the child may run arbitrary code after fork.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            tracing::error!(err = %std::io::Error::last_os_error(), "cannot fork a serving process");
            return 1;
        }
        if pid == 0 {
            for sig in STOP_SIGNALS {
                set_handler(sig, libc::SIG_DFL);
            }
            // The holder's own view of the log is the empty one it made;
            // a successor reads where the dead process left it.
            let log = match (&log, role) {
                (Some(log), Role::Takeover | Role::Salvage) => match adopt_log(log) {
                    Ok(log) => Some(Arc::new(log)),
                    Err(err) => {
                        tracing::error!(%err, "cannot read the write log");
                        std::process::exit(TAKEOVER_FAILED);
                    }
                },
                (log, _) => log.clone(),
            };
            let generation = Generation {
                role,
                dev: child_dev,
                state: state.clone(),
                log,
                crashes,
            };
            std::process::exit(serve(generation, readiness));
        }
        drop(child_dev);
        drop(readiness);
        tracing::info!(pid, ?role, "serving process started");
        let forked_ms = unix_now_ms();
        let status = watch(pid, &state);
        let was_ready = state.was_ready();
        let crashed = match status {
            Ended::Exited(code) if code != PANIC_STATUS && code != TAKEOVER_FAILED => {
                tracing::info!(pid, code, "serving process ended the attach");
                return code;
            }
            Ended::Exited(TAKEOVER_FAILED) => "could not take over".to_string(),
            Ended::Exited(code) => format!("panicked (status {code})"),
            Ended::Signalled(sig) => format!("killed by signal {sig}"),
        };
        if role == Role::Salvage || !was_ready {
            tracing::error!(pid, "serving process {crashed}; the attach ends");
            return 1;
        }
        let since = state.serving_since_ms();
        let served_ms = if since >= forked_ms {
            unix_now_ms().saturating_sub(since)
        } else {
            0
        };
        if served_ms < EARLY_CRASH.as_millis() as u64 {
            crashes += 1;
        } else {
            crashes = 1;
        }
        if crashes >= CRASH_LIMIT as u64 {
            tracing::error!(
                pid,
                crashes,
                "serving process {crashed}: {crashes} processes in a row died within {} s of \
                 serving; saving the logged writes to a recovery file and ending the attach",
                EARLY_CRASH.as_secs()
            );
            role = Role::Salvage;
        } else {
            tracing::warn!(
                pid,
                "serving process {crashed}; starting another to take over"
            );
            role = Role::Takeover;
        }
    }
}

/// The log as the last serving process left it, in a mapping of its own.
fn adopt_log(log: &WriteLog) -> std::io::Result<WriteLog> {
    let fd = log.memory().fd().try_clone_to_owned()?;
    WriteLog::adopt(
        crate::shared_memory::SharedMemory::open(fd)?,
        crate::fs::session::READ_BUFFER_BYTES,
    )
}

enum Ended {
    Exited(i32),
    Signalled(i32),
}

/// Waits for child `pid` to end: forwards stop signals to it, and kills it
/// (SIGKILL: no core dump, which would hold keys) when a ready child stops
/// beating for the watchdog's time.
fn watch(pid: libc::pid_t, state: &Handover) -> Ended {
    let watchdog = watchdog_timeout();
    let mut last_beats = state.beats();
    let mut last_change = Instant::now();
    loop {
        let sig = PENDING_SIGNAL.swap(0, Ordering::SeqCst);
        if sig != 0 {
            tracing::info!(sig, pid, "passing the stop signal to the serving process");
            // SAFETY: plain syscall on our own child.
            unsafe { libc::kill(pid, sig) };
        }
        let mut status = 0;
        // SAFETY: `pid` is our child; `status` a valid out-pointer.
        let rc = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if rc == pid {
            if libc::WIFEXITED(status) {
                return Ended::Exited(libc::WEXITSTATUS(status));
            }
            if libc::WIFSIGNALED(status) {
                return Ended::Signalled(libc::WTERMSIG(status));
            }
        } else if rc < 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EINTR) {
                tracing::error!(%err, pid, "cannot wait for the serving process");
                return Ended::Signalled(0);
            }
        }
        let beats = state.beats();
        if beats != last_beats {
            last_beats = beats;
            last_change = Instant::now();
        } else if let Some(limit) = watchdog {
            if state.was_ready() && last_change.elapsed() > limit {
                tracing::error!(
                    pid,
                    seconds = limit.as_secs(),
                    "serving process stopped answering (no heartbeat); replacing it"
                );
                // SAFETY: plain syscall on our own child.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                last_change = Instant::now();
            }
        }
        std::thread::sleep(POLL);
    }
}

/// What `stats` shows about this serving process and its holder.
struct Published {
    state: Arc<Handover>,
    log: Option<Arc<WriteLog>>,
    oom_score_adj: Option<i32>,
}

static PUBLISHED: std::sync::OnceLock<Published> = std::sync::OnceLock::new();

/// Makes the attach's state and this process's `oom_score_adj` known to
/// [`daemon_info`].
pub fn publish(state: Arc<Handover>, log: Option<Arc<WriteLog>>, oom_score_adj: Option<i32>) {
    let _ = PUBLISHED.set(Published {
        state,
        log,
        oom_score_adj,
    });
}

/// The daemon's version, processes, start times and takeovers, for `stats`
/// (`{"version": ..}` alone outside an attach).
pub fn daemon_info() -> serde_json::Value {
    let mut info = serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "state_format": super::handover::FORMAT_VERSION,
        "pid": std::process::id(),
    });
    if let Some(p) = PUBLISHED.get() {
        let extra = serde_json::json!({
            "holder_pid": p.state.holder_pid(),
            "holder_started_unix_secs": p.state.holder_started(),
            "started_unix_secs": p.state.server_started(),
            "takeovers": p.state.takeovers(),
            "oom_score_adj": p.oom_score_adj,
            "write_log": p.log.as_ref().map(|log| serde_json::json!({
                "used_bytes": log.used_bytes(),
                "capacity_bytes": log.capacity_bytes(),
            })),
        });
        if let (Some(map), serde_json::Value::Object(more)) = (info.as_object_mut(), extra) {
            map.extend(more);
        }
    }
    info
}

/// Beats every [`BEAT_INTERVAL`] for the holder's watchdog; a timer task,
/// which storage never blocks.
pub async fn beat(state: Arc<Handover>) {
    loop {
        state.beat();
        tokio::time::sleep(BEAT_INTERVAL).await;
    }
}
