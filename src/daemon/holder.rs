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

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::fd_store;
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

/// How long takeovers that fail (storage unreachable, the lease taken) are
/// tried again before the attach ends.
pub const TAKEOVER_BUDGET: Duration = Duration::from_secs(600);

/// Exit status of a panic (Rust's default): a crash like a signal.
const PANIC_STATUS: i32 = 101;
/// Exit status of a serving process whose takeover could not finish (the
/// lease or the replay failed): a crash, tried again up to the limit.
pub const TAKEOVER_FAILED: i32 = 75;
/// Exit status of a serving process that handed the attach over for an
/// upgrade: the holder starts the binary it named.
pub const UPGRADE: i32 = 76;
/// Exit status of a child whose exec of a new binary failed.
const EXEC_FAILED: i32 = 77;
/// Exit status of a serving process whose takeover was refused because
/// another writer came between (`blob/lineage.rs`): salvaged at once.
pub const FENCED: i32 = 78;
/// Environment variable naming the descriptors a new binary takes over
/// (`dev,state,log`; `-` for no log) and the one holding its command line.
pub const HANDOVER_ENV: &str = "BLOBDRIVE_HANDOVER";
/// Environment variable naming the memory file that holds the command line
/// (arguments separated by NUL) of an exec'd serving process.
pub const ARGS_ENV: &str = "BLOBDRIVE_ARGS_FD";
/// The watchdog's time for a child that has not begun to serve yet.
const STARTUP_GRACE: Duration = Duration::from_secs(120);
/// Failed forks in a row (a second apart) before the attach ends.
const FORK_TRIES: u32 = 120;
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
    /// Why a salvage runs (empty for the other roles).
    pub why: String,
}

/// The last stop signal received, for the holder loop.
static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// A stop signal arrived at some point (never cleared).
static STOP_ASKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// The last stop signal that arrived (never cleared): a serving process
/// forked after it acts on it even when the one it was passed to died
/// first.
static LAST_STOP: AtomicI32 = AtomicI32::new(0);

extern "C" fn remember_signal(sig: libc::c_int) {
    PENDING_SIGNAL.store(sig, Ordering::SeqCst);
    LAST_STOP.store(sig, Ordering::SeqCst);
    STOP_ASKED.store(true, Ordering::SeqCst);
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

/// Sends this process the stop signal that arrived before it watched for
/// stop signals itself (call once it does), so a stop during a takeover
/// is not lost.
pub fn raise_pending_signal() {
    // Blocked across an upgrade's exec: delivered now, to the watch.
    block_stop_signals(false);
    let mut sig = PENDING_SIGNAL.swap(0, Ordering::SeqCst);
    if sig == 0 {
        // Forked from a holder that was asked to stop: the process it
        // passed the signal to may have died before acting on it.
        sig = LAST_STOP.load(Ordering::SeqCst);
    }
    if sig != 0 {
        // SAFETY: plain syscall on this process.
        unsafe { libc::kill(libc::getpid(), sig) };
    }
}

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
/// `stored`: the attach systemd kept for a holder that died (see
/// `fd_store.rs`), taken over instead of a fresh start.
/// Call with no thread running (it forks).
pub fn hold<S>(
    serve: S,
    ready: Readiness,
    log_bytes: Option<u64>,
    stored: Option<fd_store::Stored>,
) -> i32
where
    S: FnMut(Generation, Readiness) -> i32,
{
    let store = fd_store::enabled();
    // Whether what systemd keeps may go: not while the log holds writes
    // saved nowhere else, nor when a kept attach could not be read (a
    // binary that can may be installed again).
    let mut emptiable = true;
    let code = hold_generations(serve, ready, log_bytes, stored, store, &mut emptiable);
    if store && emptiable {
        // The attach ended: a later start of the unit attaches afresh.
        fd_store::forget();
    }
    code
}

/// The attach's state, write log and connection kept by systemd, opened.
fn resume(
    stored: fd_store::Stored,
) -> std::io::Result<(Arc<Handover>, Option<Arc<WriteLog>>, OwnedFd)> {
    use crate::shared_memory::SharedMemory;
    let state = Handover::open(SharedMemory::open(stored.state)?)?;
    let log = match stored.log {
        Some(fd) => Some(Arc::new(WriteLog::adopt(
            SharedMemory::open(fd)?,
            crate::fs::session::READ_BUFFER_BYTES,
        )?)),
        None => None,
    };
    Ok((Arc::new(state), log, stored.dev))
}

fn hold_generations<S>(
    mut serve: S,
    mut ready: Readiness,
    log_bytes: Option<u64>,
    stored: Option<fd_store::Stored>,
    store: bool,
    emptiable: &mut bool,
) -> i32
where
    S: FnMut(Generation, Readiness) -> i32,
{
    let fail = |ready: &mut Readiness, what: &str, err: std::io::Error| {
        tracing::error!(%err, "{what}");
        ready.failed(&format!("{what}: {err}"));
        1
    };
    let resumed = stored.is_some();
    let (state, log, dev) = match stored {
        Some(stored) => match resume(stored) {
            Ok(kept) => kept,
            Err(err) => {
                *emptiable = false;
                return fail(
                    &mut ready,
                    "cannot take over the attach systemd kept for this unit",
                    err,
                );
            }
        },
        None => {
            let state = match Handover::create() {
                Ok(state) => Arc::new(state),
                Err(err) => return fail(&mut ready, "cannot create the attach's state", err),
            };
            let log = match log_bytes {
                None => None,
                Some(bytes) => {
                    match WriteLog::create(bytes, crate::fs::session::READ_BUFFER_BYTES) {
                        Ok(log) => Some(Arc::new(log)),
                        Err(err) => return fail(&mut ready, "cannot create the write log", err),
                    }
                }
            };
            let dev: OwnedFd = match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/fuse")
            {
                Ok(file) => file.into(),
                Err(err) => return fail(&mut ready, "cannot open /dev/fuse", err),
            };
            (state, log, dev)
        }
    };
    let holder_pid = std::process::id();
    state.set_holder(holder_pid, unix_now());
    // Every process of the attach holds keys: no core dump, in the
    // foreground (systemd) as in the background.
    crate::crypt::forbid_core_dumps();
    // An inherited SIGCHLD=SIG_IGN would reap children by itself, and a
    // clean exit would look like a lost child.
    set_handler(libc::SIGCHLD, libc::SIG_DFL);
    let oom = set_oom_score_adj(HOLDER_OOM_SCORE_ADJ);
    tracing::debug!(?oom, "holder oom_score_adj");
    for sig in STOP_SIGNALS {
        set_handler(
            sig,
            remember_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
    }
    // Whether systemd holds the descriptors (from the first serving
    // process's readiness on).
    let mut kept = resumed;
    let mut keep_once_ready = |state: &Handover| {
        if store && !kept && state.was_ready() {
            kept = true;
            match fd_store::keep(
                dev.as_fd(),
                state.memory().fd(),
                log.as_ref().map(|l| l.memory().fd()),
            ) {
                Ok(()) => tracing::debug!("the attach's descriptors are in systemd's store"),
                Err(err) => tracing::warn!(
                    %err,
                    "cannot hand the attach's descriptors to systemd: the holder's own death would end the attach"
                ),
            }
        }
    };

    let mut role = if resumed {
        tracing::warn!(
            "started again by systemd after the holder died: taking over the attach it kept"
        );
        Role::Takeover
    } else {
        Role::Fresh
    };
    // Early crashes in a row.
    let mut crashes = 0u64;
    // The binary an upgrade asked for, for the next serving process only.
    // Every other one (after a crash, a hang, a failed upgrade, and the
    // salvage) is a fork of the holder's own code: a file on disk that was
    // replaced or removed since can never cost the attach.
    let mut pending: Option<std::path::PathBuf> = None;
    // Takeovers failing in a row: since when, and the next pause.
    let mut takeover_failing_since: Option<Instant> = None;
    let mut takeover_pause = Duration::from_millis(500);
    let mut salvage_pause = Duration::from_secs(1);
    // Why the next salvage runs, for its recovery file and its message.
    let mut salvage_why = String::new();
    let mut fork_failures = 0u32;
    let mut ready = Some(ready);
    loop {
        let child_dev = match dev.try_clone() {
            Ok(fd) => fd,
            Err(err) => {
                tracing::error!(%err, "cannot duplicate the FUSE connection");
                return ended(1, log.as_deref(), emptiable);
            }
        };
        let readiness = ready.take().unwrap_or_else(Readiness::foreground);
        // SAFETY: the holder runs no thread (documented precondition), so
        // the child may run arbitrary code after fork.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            // Memory or the process limit, maybe right after the OOM
            // killer struck: the log's writes are still only here, so
            // wait and try again rather than end the attach.
            let err = std::io::Error::last_os_error();
            fork_failures += 1;
            if fork_failures > FORK_TRIES {
                tracing::error!(%err, "cannot fork a serving process; the attach ends");
                return ended(1, log.as_deref(), emptiable);
            }
            tracing::error!(%err, "cannot fork a serving process; trying again in 1 s");
            ready = Some(readiness);
            std::thread::sleep(Duration::from_secs(1));
            continue;
        }
        fork_failures = 0;
        if pid == 0 {
            if store {
                // systemd keeps the attach: when the holder dies, its
                // successor (a new start of the unit) takes over, and this
                // process must not go on serving beside it.
                die_with_holder(holder_pid);
            }
            // The stop signals keep the holder's handler until the serving
            // process watches them itself (`raise_pending_signal`): one
            // that arrives in between is remembered, not lost.
            // Memory locks are not inherited: lock the keys again.
            if !crate::crypt::secret::relock_after_fork() {
                tracing::warn!(
                    "could not lock the key material in memory: it may be written to swap"
                );
            }
            if let Some(path) = pending.as_ref() {
                // Returns only when the exec failed.
                let err = exec_successor(path, &child_dev, &state, log.as_deref());
                tracing::error!(%err, binary = %path.display(), "cannot start the new binary");
                std::process::exit(EXEC_FAILED);
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
                (log, _) => {
                    // Inherited across fork without its page table entries.
                    if let Some(log) = log {
                        log.memory().populate();
                    }
                    log.clone()
                }
            };
            let generation = Generation {
                role,
                dev: child_dev,
                state: state.clone(),
                log,
                crashes,
                why: salvage_why.clone(),
            };
            std::process::exit(serve(generation, readiness));
        }
        drop(child_dev);
        drop(readiness);
        tracing::info!(pid, ?role, "serving process started");
        let forked_ms = super::handover::unix_now_ms();
        let status = watch(pid, &state, &mut keep_once_ready);
        let was_ready = state.was_ready();
        if let Some(tried) = pending.take() {
            if state.serving_since_ms() < forked_ms {
                // The new binary never served (it refused the state's
                // format, could not read its keys, or failed): the binary
                // that served before takes over again.
                tracing::error!(
                    pid,
                    binary = %tried.display(),
                    "the new binary did not take over; the version that ran before goes on serving"
                );
                role = Role::Takeover;
                continue;
            }
        }
        if let Ended::Exited(UPGRADE) = status {
            match state.take_upgrade() {
                Some(path) => {
                    tracing::info!(pid, binary = %path.display(), "serving process handed over for an upgrade");
                    pending = Some(path);
                }
                None => tracing::error!(
                    pid,
                    "upgrade asked for without a binary; taking over as after a crash"
                ),
            }
            role = Role::Takeover;
            continue;
        }
        let served = state.serving_since_ms() >= forked_ms;
        if let (Ended::Exited(FENCED), Role::Takeover) = (&status, role) {
            // Another writer came between: no retry can change that, and
            // the log's writes must not go over its data. Saved as they are.
            tracing::error!(
                pid,
                "the takeover was refused: another writer changed the drive after this attach                  lost it; saving what the write log holds and ending the attach"
            );
            salvage_why = "another writer changed the drive after this attach lost its lease                            (the takeover's refusal says what changed)"
                .to_string();
            role = Role::Salvage;
            continue;
        }
        if let (Ended::Exited(TAKEOVER_FAILED), true) = (&status, served) {
            // It took over and served, then failed at its end (an unmount
            // whose flush failed saved a recovery file): that ends the
            // attach, as for the first serving process.
            tracing::error!(pid, "serving process ended the attach with an error");
            return ended(1, log.as_deref(), emptiable);
        }
        if let (Ended::Exited(TAKEOVER_FAILED), Role::Takeover) = (&status, role) {
            // Storage or the lease may come back: the log keeps the data
            // meanwhile and the kernel keeps the requests waiting, as in
            // an outage. Tried again with a growing pause, up to a budget.
            let failed_for = takeover_failing_since
                .get_or_insert_with(Instant::now)
                .elapsed();
            if failed_for < TAKEOVER_BUDGET {
                let pause = takeover_pause.min(Duration::from_secs(30));
                takeover_pause *= 2;
                tracing::error!(
                    pid,
                    seconds = pause.as_secs_f64(),
                    "the takeover failed; trying again"
                );
                // A stop signal meanwhile stays pending for the next one.
                std::thread::sleep(pause);
                continue;
            }
            tracing::error!(
                pid,
                "takeovers failed for {} s; saving what the write log holds and ending the attach",
                TAKEOVER_BUDGET.as_secs()
            );
            salvage_why = format!(
                "takeovers of the attach failed for {} s",
                TAKEOVER_BUDGET.as_secs()
            );
            role = Role::Salvage;
            continue;
        }
        if state.serving_since_ms() >= forked_ms {
            takeover_failing_since = None;
            takeover_pause = Duration::from_millis(500);
        }
        let crashed = match status {
            Ended::Exited(code) if code != PANIC_STATUS && code != TAKEOVER_FAILED => {
                tracing::info!(pid, code, "serving process ended the attach");
                return ended(code, log.as_deref(), emptiable);
            }
            Ended::Exited(TAKEOVER_FAILED) => "could not take over".to_string(),
            Ended::Exited(code) => format!("panicked (status {code})"),
            Ended::Signalled(sig) => format!("killed by signal {sig}"),
        };
        if role == Role::Salvage && unsaved_writes(log.as_deref()) {
            // The salvage could not save what the log holds (storage or
            // the lease is needed to read the drive back). Ending now would
            // lose acknowledged writes: the filesystem above waits instead,
            // as in an outage, and the salvage is tried again.
            if STOP_ASKED.load(Ordering::SeqCst) {
                tracing::error!(
                    pid,
                    "stopped while the write log still holds acknowledged writes that are \
                     nowhere else: they are lost"
                );
                return ended(1, log.as_deref(), emptiable);
            }
            let pause = salvage_pause.min(Duration::from_secs(60));
            salvage_pause *= 2;
            tracing::error!(
                pid,
                seconds = pause.as_secs_f64(),
                "serving process {crashed}; the write log still holds acknowledged writes that \
                 are nowhere else: saving them is tried again (requests wait meanwhile)"
            );
            std::thread::sleep(pause);
            continue;
        }
        if role == Role::Salvage || !was_ready {
            if unsaved_writes(log.as_deref()) {
                tracing::error!(
                    pid,
                    "serving process {crashed} before it served: acknowledged writes in its \
                     write log are lost"
                );
            }
            tracing::error!(pid, "serving process {crashed}; the attach ends");
            return ended(1, log.as_deref(), emptiable);
        }
        let since = state.serving_since_ms();
        let served_ms = if since >= forked_ms {
            super::handover::unix_now_ms().saturating_sub(since)
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
            salvage_why = format!(
                "{crashes} serving processes in a row died within {} s of serving",
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

/// Marks the descriptors an upgrade's holder handed to this process
/// close-on-exec at once (call first thing): what this process may run
/// before it takes them (`az` for a token) must not inherit the
/// connection, the state or the write log.
pub fn close_handed_over_at_exec() {
    fd_store::close_passed_at_exec();
    let Ok(value) = std::env::var(HANDOVER_ENV) else {
        return;
    };
    for fd in value.split(',').filter_map(|f| f.parse::<i32>().ok()) {
        if fd > 2 {
            // SAFETY: only sets a flag; a number that is not open fails.
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        }
    }
}

/// The attach handed to this process by its holder (an upgrade: this is a
/// new binary it started), from the descriptors named in the environment;
/// None for an ordinary start.
pub fn handed_over() -> Option<std::io::Result<Generation>> {
    let value = std::env::var(HANDOVER_ENV).ok()?;
    std::env::remove_var(HANDOVER_ENV);
    Some(adopt_handover(&value))
}

fn adopt_handover(value: &str) -> std::io::Result<Generation> {
    use std::os::fd::FromRawFd;
    let bad = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("bad {HANDOVER_ENV} {value:?}"),
        )
    };
    let fds: Vec<Option<i32>> = value
        .split(',')
        .map(|f| {
            if f == "-" {
                Ok(None)
            } else {
                f.parse().map(Some)
            }
        })
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    let [Some(dev), Some(state), log] = fds[..] else {
        return Err(bad());
    };
    // SAFETY: the holder passed these descriptors, open, for this process.
    // Closed at exec again: the tools this process runs must not hold them.
    let own = |fd: i32| unsafe {
        libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        OwnedFd::from_raw_fd(fd)
    };
    let (dev, state) = (own(dev), own(state));
    let state = Handover::open(crate::shared_memory::SharedMemory::open(state)?)?;
    let log = match log {
        Some(fd) => Some(Arc::new(WriteLog::adopt(
            crate::shared_memory::SharedMemory::open(own(fd))?,
            crate::fs::session::READ_BUFFER_BYTES,
        )?)),
        None => None,
    };
    Ok(Generation {
        role: Role::Takeover,
        dev,
        state: Arc::new(state),
        log,
        crashes: 0,
        why: String::new(),
    })
}

/// The command line of `blobdrive mount`, as parsed (credentials included:
/// they are gone from `/proc/PID/cmdline`), for a new binary to parse again.
static COMMAND_LINE: std::sync::OnceLock<Vec<std::ffi::OsString>> = std::sync::OnceLock::new();

/// The directory `blobdrive mount` ran in (its relative paths).
static COMMAND_DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// Keeps `args` and the working directory for an upgrade (call before
/// parsing them).
pub fn remember_command_line(args: Vec<std::ffi::OsString>) {
    let _ = COMMAND_LINE.set(args);
    if let Ok(dir) = std::env::current_dir() {
        let _ = COMMAND_DIR.set(dir);
    }
}

/// Blocks (or unblocks) the stop signals for this thread: blocked, they
/// stay pending, across an exec too, until unblocked.
fn block_stop_signals(block: bool) {
    // SAFETY: a signal set built with the libc calls, passed by pointer for
    // the call only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in STOP_SIGNALS {
            libc::sigaddset(&mut set, sig);
        }
        let how = if block {
            libc::SIG_BLOCK
        } else {
            libc::SIG_UNBLOCK
        };
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}

/// Replaces this (forked) process with `binary` serving the attach: the
/// connection, the state and the log stay open across the exec, their
/// numbers and a memory file with the command line go in the environment.
/// Returns only on failure.
fn exec_successor(
    binary: &std::path::Path,
    dev: &OwnedFd,
    state: &Handover,
    log: Option<&WriteLog>,
) -> std::io::Error {
    use std::os::fd::{AsRawFd, IntoRawFd};
    use std::os::unix::ffi::OsStrExt;
    let Some(args) = COMMAND_LINE.get() else {
        return std::io::Error::other("the mount's command line is unknown");
    };
    // Checked again here, and the file opened now is the one run.
    let file = match trusted_binary(binary) {
        Ok(file) => file,
        Err(err) => return std::io::Error::other(format!("{err:#}")),
    };
    let mut text = Vec::new();
    for arg in args {
        text.extend_from_slice(arg.as_bytes());
        text.push(0);
    }
    let args_mem =
        match crate::shared_memory::SharedMemory::create("blobdrive-args", text.len().max(1)) {
            Ok(mem) => mem,
            Err(err) => return err,
        };
    // SAFETY: the mapping holds at least `text.len()` bytes.
    unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), args_mem.as_ptr(), text.len()) };
    let args_fd = match args_mem.fd().try_clone_to_owned() {
        Ok(fd) => fd.into_raw_fd(),
        Err(err) => return err,
    };
    let fds = [
        Some(dev.as_raw_fd()),
        Some(state.memory().fd().as_raw_fd()),
        log.map(|l| l.memory().fd().as_raw_fd()),
        Some(args_fd),
    ];
    for fd in fds.iter().flatten() {
        // SAFETY: clearing FD_CLOEXEC on a descriptor this process owns.
        if unsafe { libc::fcntl(*fd, libc::F_SETFD, 0) } != 0 {
            return std::io::Error::last_os_error();
        }
    }
    let show = |fd: Option<i32>| fd.map_or("-".to_string(), |fd| fd.to_string());
    std::env::set_var(
        HANDOVER_ENV,
        format!("{},{},{}", show(fds[0]), show(fds[1]), show(fds[2])),
    );
    std::env::set_var(ARGS_ENV, args_fd.to_string());
    // A stop signal between the exec and the new process's own watch stays
    // pending (the mask survives exec) instead of killing it.
    block_stop_signals(true);
    use std::os::unix::process::CommandExt;
    // The kernel resolves the path to the open file before it closes the
    // close-on-exec descriptors (an ELF binary needs nothing more).
    let mut cmd = std::process::Command::new(format!("/proc/self/fd/{}", file.as_raw_fd()));
    cmd.arg0(args.first().cloned().unwrap_or_else(|| "blobdrive".into()));
    // Relative paths on the command line mean what they meant to `mount`.
    if let Some(dir) = COMMAND_DIR.get() {
        cmd.current_dir(dir);
    }
    cmd.exec()
}

/// The holder's exit status `code`, noting whether the log still holds
/// writes saved nowhere else (then systemd's store keeps it).
fn ended(code: i32, log: Option<&WriteLog>, emptiable: &mut bool) -> i32 {
    *emptiable = !unsaved_writes(log);
    code
}

/// True when the log (as the last serving process left it) holds
/// acknowledged writes that are neither in the blob nor in a recovery file.
/// An unreadable log counts as empty: no retry could read it either.
fn unsaved_writes(log: Option<&WriteLog>) -> bool {
    let Some(log) = log else {
        return false;
    };
    match adopt_log(log).and_then(|log| log.committed().map(|records| !records.is_empty())) {
        Ok(unsaved) => unsaved,
        Err(err) => {
            tracing::error!(%err, "the write log is unreadable: what it held is lost");
            false
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

/// Asks for SIGKILL when the holder (`holder_pid`, this process's parent)
/// dies, and dies now if it already has.
fn die_with_holder(holder_pid: u32) {
    // SAFETY: plain prctl on this process.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    // SAFETY: plain syscall.
    if unsafe { libc::getppid() } as u32 != holder_pid {
        std::process::exit(TAKEOVER_FAILED);
    }
}

enum Ended {
    Exited(i32),
    Signalled(i32),
}

/// Waits for child `pid` to end: forwards stop signals to it, and kills it
/// (SIGKILL: no core dump, which would hold keys) when a ready child stops
/// beating for the watchdog's time.
/// `when_ready` runs at every look while the child is ready.
fn watch(pid: libc::pid_t, state: &Handover, when_ready: &mut dyn FnMut(&Handover)) -> Ended {
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
        if state.was_ready() {
            when_ready(state);
        }
        let beats = state.beats();
        if beats != last_beats {
            last_beats = beats;
            last_change = Instant::now();
        } else if let Some(limit) = watchdog {
            // A child beats from the start of its serving code on; before
            // it (a new binary of an upgrade reads its keys and asks the
            // service for its account first) it gets a longer grace, so a
            // slow start is not taken for a hang.
            let limit = if state.server_pid() == pid as u32 {
                limit
            } else {
                limit.max(STARTUP_GRACE)
            };
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

/// The lease id the drive of this process's attach is opened with (the
/// same in every serving process of the attach, whatever its binary);
/// None outside an attach under a holder.
pub fn attach_lease_id() -> Option<String> {
    PUBLISHED.get().map(|p| p.state.lease_id())
}

/// How the drive of this process's attach stands to the attach's writer
/// lineage: a fresh attach starts it; a successor (`takeover`) resumes it
/// from the mark its predecessors recorded in the state (none recorded, as
/// in a state of the first release: the lease must still be held). Every
/// change of the mark is recorded there.
pub fn attach_lineage(takeover: bool) -> crate::drive::LineageOptions {
    let Some(p) = PUBLISHED.get() else {
        return Default::default();
    };
    let state = p.state.clone();
    crate::drive::LineageOptions {
        resume: takeover.then(|| p.state.mark().unwrap_or_default()),
        recorder: Some(std::sync::Arc::new(move |m: &crate::blob::Mark| {
            state.set_mark(m)
        })),
    }
}

/// Records the size of the attach's drive in its state (for a salvage).
pub fn record_drive_bytes(bytes: u64) {
    if let Some(p) = PUBLISHED.get() {
        p.state.set_drive_bytes(bytes);
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
        "version": crate::version::version(),
        "state_format": crate::version::state_format(),
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

/// Checks that `binary` may serve this attach (an absolute path to an
/// executable regular file that only its owner, root or this user, can
/// change), flushes every drive, and records it in the state for the
/// holder; the caller then answers and calls [`exit_for_upgrade`].
pub async fn prepare_upgrade(
    binary: &std::path::Path,
    core: &crate::fs::FsCore,
) -> anyhow::Result<()> {
    let Some(published) = PUBLISHED.get() else {
        anyhow::bail!("only an attached drive's daemon can be upgraded in place (a namespace mount is unmounted and mounted again)");
    };
    trusted_binary(binary)?;
    // The file checked, not a link that might later name another.
    let binary = binary
        .canonicalize()
        .map_err(|e| anyhow::anyhow!("cannot use {}: {e}", binary.display()))?;
    let errors = core.flush_all().await;
    if !errors.is_empty() {
        let reasons: Vec<String> = errors.iter().map(ToString::to_string).collect();
        anyhow::bail!(
            "the flush before the handover failed: {}",
            reasons.join("; ")
        );
    }
    published.state.set_upgrade(&binary)?;
    Ok(())
}

/// Opens `binary` for an upgrade's exec, when only root or this process's
/// user can have put it there: an absolute path to an executable regular
/// file owned by one of them and writable by no one else, in directories
/// likewise (or sticky, as /tmp). The holder's child checks it again and
/// runs the file it opened, not the path, so a file swapped after the
/// check is never run.
pub fn trusted_binary(binary: &std::path::Path) -> anyhow::Result<std::fs::File> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let euid = crate::private_dir::euid();
    let ours = |uid: u32| uid == 0 || uid == euid;
    let shown = binary.display();
    if !binary.is_absolute() {
        anyhow::bail!("{shown} is not an absolute path");
    }
    let real = binary
        .canonicalize()
        .map_err(|e| anyhow::anyhow!("cannot use {shown}: {e}"))?;
    for dir in real.ancestors().skip(1) {
        let meta =
            std::fs::metadata(dir).map_err(|e| anyhow::anyhow!("cannot use {shown}: {e}"))?;
        let mode = meta.mode();
        if !ours(meta.uid()) || (mode & 0o022 != 0 && mode & 0o1000 == 0) {
            anyhow::bail!(
                "{shown} is in {}, which another user may change (owner uid {}, mode {:o}); \
                 the daemon runs only a binary that root or its own user alone can change",
                dir.display(),
                meta.uid(),
                mode & 0o7777
            );
        }
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(&real)
        .map_err(|e| anyhow::anyhow!("cannot use {shown}: {e}"))?;
    let meta = file
        .metadata()
        .map_err(|e| anyhow::anyhow!("cannot use {shown}: {e}"))?;
    let mode = meta.mode();
    if !meta.is_file() || mode & 0o111 == 0 {
        anyhow::bail!("{shown} is not an executable file");
    }
    if !ours(meta.uid()) || mode & 0o022 != 0 {
        anyhow::bail!(
            "{shown} may be changed by another user (owner uid {}, mode {:o}); the daemon runs \
             only a binary that root or its own user alone can change",
            meta.uid(),
            mode & 0o7777
        );
    }
    Ok(file)
}

/// Ends this serving process for an upgrade: the holder starts the binary
/// recorded by [`prepare_upgrade`], which takes the attach over (nothing is
/// torn down: the connection, the loop device and the filesystem stay).
pub fn exit_for_upgrade() -> ! {
    tracing::info!("handing the attach over for an upgrade");
    // `_exit`: no exit handlers while the other threads still run.
    // SAFETY: ends the process; nothing is touched after.
    unsafe { libc::_exit(UPGRADE) }
}

/// Beats every [`BEAT_INTERVAL`] for the holder's watchdog; a timer task,
/// which storage never blocks.
pub async fn beat(state: Arc<Handover>) {
    loop {
        state.beat();
        tokio::time::sleep(BEAT_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn an_upgrade_runs_only_a_binary_no_other_user_can_change() {
        let dir = tempfile::tempdir().unwrap();
        let chmod = |path: &std::path::Path, mode: u32| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        chmod(dir.path(), 0o700);
        let bin = dir.path().join("blobdrive");
        std::fs::write(&bin, b"\x7fELF").unwrap();
        chmod(&bin, 0o755);
        assert!(trusted_binary(&bin).is_ok());
        // Through a symlink: the file it names is what is checked and run.
        let link = dir.path().join("current");
        std::os::unix::fs::symlink(&bin, &link).unwrap();
        assert!(trusted_binary(&link).is_ok());

        let err = trusted_binary(std::path::Path::new("blobdrive")).unwrap_err();
        assert!(err.to_string().contains("not an absolute path"), "{err}");
        chmod(&bin, 0o644);
        let err = trusted_binary(&bin).unwrap_err();
        assert!(err.to_string().contains("not an executable"), "{err}");
        chmod(&bin, 0o777);
        let err = trusted_binary(&bin).unwrap_err();
        assert!(
            err.to_string().contains("may be changed by another user"),
            "{err}"
        );
        chmod(&bin, 0o755);
        // A directory others may write to: the file could be swapped.
        chmod(dir.path(), 0o777);
        let err = trusted_binary(&bin).unwrap_err();
        assert!(
            err.to_string().contains("which another user may change"),
            "{err}"
        );
        // Sticky, as /tmp: others cannot replace our file there.
        chmod(dir.path(), 0o1777);
        assert!(trusted_binary(&bin).is_ok());
    }
}
