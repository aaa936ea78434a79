//! The mount daemon's life: start (background by default, returning only when the
//! mount is ready), serve, and stop cleanly on SIGTERM/SIGINT, on
//! `blobdrive unmount DIR` or when someone unmounts DIR.
//!
//! The fork happens before any tokio runtime or thread exists, which is why
//! [`run_mount`] takes a closure that builds the [`Catalog`] inside the daemon.
//!
//! Shutdown order (why, in docs/kernel.md): flush every writable device, unmount FUSE,
//! wait for the session thread to end and for the last in-flight request, then
//! close every device (flush + release the lease). A device whose flush still
//! fails (lease lost, storage unreachable past the retry budget) has its dirty
//! pages saved in a recovery file, named in the unmount's error; the daemon
//! then exits non-zero. On a signal, a mount still held
//! by a loop device or an open file is detached lazily and the daemon waits for
//! its last user; an `unmount` request answers "busy" instead.
//!
//! Key material unlocked before the fork (an encrypted drive's data key, a
//! namespace mount's user key) is locked in memory again in the daemon:
//! `mlock` does not survive a fork.
//!
//! Attach mode (`MountOptions::attach`, see `attach.rs`): the FUSE mount is a
//! private one under the run directory, served by our own protocol layer
//! (`fs::session`; a namespace mount is served by fuser, see
//! `start_session`), the drive file in it backs a loop
//! device whose filesystem is mounted at the user's directory, and readiness
//! is signalled only once that directory is mounted. The control socket is
//! keyed by the user's directory. Teardown first unmounts that directory and
//! detaches the loop device, then follows the order above.

pub mod attach;
pub mod closing;
pub mod control;
pub mod exporter;
pub mod fd_store;
pub mod format;
pub mod freeze;
pub mod handover;
pub mod holder;
pub mod mountpoint;
pub mod new_uuid;
pub mod readiness;
pub mod registry;
pub mod salvage;
pub mod served;

use std::ffi::CString;
use std::future::Future;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use fuser::{MountOption, SessionACL};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, oneshot};

use attach::Attachment;
pub use attach::{AttachOptions, PartitionArea};
use closing::join_errors;
pub use control::{request_flush, request_metrics, request_stats, request_unmount};
pub use exporter::MetricsOptions;
use readiness::{ParentView, Readiness};

use crate::fs::session::{MountConfig, Session};
use crate::fs::{BlobFs, Catalog, FsConfig, FsCore};

/// `prctl` option that marks the process as serving I/O for the block layer.
const PR_SET_IO_FLUSHER: libc::c_int = 57;

/// How a namespace mount runs.
#[derive(Debug, Clone, Default)]
pub struct MountOptions {
    /// Refuse writes and writable opens with `EROFS`.
    pub read_only: bool,
    /// Stay attached to the terminal (for systemd `Type=notify`).
    pub foreground: bool,
    /// Let other users than the mounting one use the mount.
    pub allow_other: bool,
    /// Mount one container instead of the whole account.
    pub container: Option<String>,
    /// Where a background daemon's stderr (its logs) goes; `/dev/null` if unset.
    pub log_file: Option<PathBuf>,
    /// Source shown in `/proc/mounts` (default `blobdrive`).
    pub source: Option<String>,
    /// Attach one drive: the mountpoint is where its filesystem goes, and the
    /// FUSE mount is private (the catalog should show just that drive).
    pub attach: Option<AttachOptions>,
    /// Metrics exporters (`--metrics-listen`, `--metrics-textfile`).
    pub metrics: MetricsOptions,
}

/// Mounts the namespace of the catalog that `make_catalog` builds at `mountpoint`
/// and serves it until unmounted. `make_catalog(takeover)` runs in each
/// serving process: `takeover` is true in one that takes over from a process
/// that died (an attach's holder starts those; see `holder.rs`).
///
/// An attach runs under a holder: the daemon process holds the FUSE
/// connection and forks the serving process, again after a crash.
///
/// In the background (the default) the process forks first; the parent returns
/// `Ok(())` once the mount is ready, or the daemon's error line; the daemon
/// process never returns from this function (it exits 0 after a clean unmount, 1
/// otherwise). With `foreground` it returns when the mount ends. Call it before
/// starting any thread or runtime: forking a threaded process is unsound.
pub fn run_mount<F, Fut>(
    mountpoint: &Path,
    opts: &MountOptions,
    make_catalog: F,
) -> anyhow::Result<()>
where
    F: Fn(bool) -> Fut,
    Fut: Future<Output = anyhow::Result<Arc<dyn Catalog>>>,
{
    // An attach systemd kept for a holder that died (`fd_store.rs`): its
    // mount point is a live FUSE mount that nobody serves until the
    // takeover, so it is not looked at (a stat would wait for that
    // takeover).
    let stored = if opts.foreground && opts.attach.is_some() {
        fd_store::take()
    } else {
        None
    };
    let mountpoint = match stored {
        Some(_) => kept_mountpoint(mountpoint)?,
        None => check_mountpoint(mountpoint)?,
    };
    if let Some(handover) = holder::handed_over() {
        // A new binary started by the attach's holder for an upgrade: it
        // takes the attach over in this process, which the holder watches.
        crate::crypt::forbid_core_dumps();
        let code = match handover {
            Ok(generation) if opts.attach.is_some() => {
                match serve(
                    &mountpoint,
                    opts,
                    || make_catalog(true),
                    Readiness::foreground(),
                    Some(generation),
                ) {
                    Ok(()) => 0,
                    Err(err) => {
                        tracing::error!("{err:#}");
                        exit_status_of_takeover(&err)
                    }
                }
            }
            Ok(_) => {
                tracing::error!("handed an attach's connection, but the command is no attach");
                holder::TAKEOVER_FAILED
            }
            Err(err) => {
                tracing::error!("cannot take the attach over: {err}");
                holder::TAKEOVER_FAILED
            }
        };
        std::process::exit(code);
    }
    if opts.foreground {
        if opts.attach.is_some() {
            return match hold_attach(
                &mountpoint,
                opts,
                &make_catalog,
                Readiness::foreground(),
                stored,
            ) {
                0 => Ok(()),
                code => bail!(
                    "the attach of {} ended with status {code} (the lines above say why)",
                    mountpoint.display()
                ),
            };
        }
        return serve(
            &mountpoint,
            opts,
            || make_catalog(false),
            Readiness::foreground(),
            None,
        );
    }
    let (read_end, write_end) = readiness::pipe().context("cannot create the readiness pipe")?;
    // SAFETY: no runtime or helper thread exists yet (documented precondition), so
    // the child may run arbitrary code after fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error()).context("cannot fork the daemon");
    }
    if pid > 0 {
        drop(write_end);
        return match readiness::wait_in_parent(read_end) {
            ParentView::Ready(warnings) => {
                // The user's terminal: this is the process `mount` started.
                for warning in warnings {
                    eprintln!("blobdrive: warning: {warning}");
                }
                Ok(())
            }
            ParentView::Failed(reason) => {
                reap(pid);
                Err(anyhow!(reason))
            }
            ParentView::Vanished => {
                let status = reap(pid);
                bail!("the mount daemon exited before the mount was ready ({status})")
            }
        };
    }
    drop(read_end);
    // The data key or passphrase unlocked before the fork is in this
    // process's memory too, but memory locks are not inherited: lock it
    // again before it can be swapped out.
    let relocked = crate::crypt::secret::relock_after_fork();
    // The daemon holds the account's key or SAS (and maybe a data key) for
    // the life of the mount: no core dump may carry them.
    crate::crypt::forbid_core_dumps();
    let mut ready = Readiness::pipe(write_end);
    if let Err(err) = detach_from_terminal(opts.log_file.as_deref()) {
        ready.failed(&format!("cannot start the daemon: {err:#}"));
        std::process::exit(1);
    }
    if !relocked {
        tracing::warn!("could not lock the key material in memory: it may be written to swap");
    }
    let code = if opts.attach.is_some() {
        hold_attach(&mountpoint, opts, &make_catalog, ready, None)
    } else {
        match serve(&mountpoint, opts, || make_catalog(false), ready, None) {
            Ok(()) => 0,
            Err(err) => {
                tracing::error!("{err:#}");
                1
            }
        }
    };
    std::process::exit(code);
}

/// Runs an attach under its holder (`holder.rs`): each serving process runs
/// [`serve`] with its [`holder::Generation`]. Returns the exit status.
fn hold_attach<F, Fut>(
    mountpoint: &Path,
    opts: &MountOptions,
    make_catalog: &F,
    ready: Readiness,
    stored: Option<fd_store::Stored>,
) -> i32
where
    F: Fn(bool) -> Fut,
    Fut: Future<Output = anyhow::Result<Arc<dyn Catalog>>>,
{
    let spec = opts.attach.as_ref().expect("an attach");
    let writable = !opts.read_only && spec.drive.snapshot.is_none();
    let log_bytes = (writable && holder::write_log_wanted()).then_some(spec.write_log_bytes);
    holder::hold(
        |generation, ready| {
            let takeover = generation.role != holder::Role::Fresh;
            match serve(
                mountpoint,
                opts,
                || make_catalog(takeover),
                ready,
                Some(generation),
            ) {
                Ok(()) => 0,
                Err(err) => {
                    tracing::error!("{err:#}");
                    // A takeover that could not finish counts as a crash
                    // (the holder tries again, up to its crash limit); the
                    // first start's failure ends the attach.
                    if takeover {
                        exit_status_of_takeover(&err)
                    } else {
                        1
                    }
                }
            }
        },
        ready,
        log_bytes,
        stored,
    )
}

/// The canonical path of a mount point that is a live mount nobody serves
/// yet: its parent resolved, the mount point itself not looked at.
fn kept_mountpoint(mountpoint: &Path) -> anyhow::Result<PathBuf> {
    let (Some(parent), Some(name)) = (mountpoint.parent(), mountpoint.file_name()) else {
        bail!("mountpoint {} is not a directory", mountpoint.display());
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let parent = parent
        .canonicalize()
        .with_context(|| format!("mountpoint {} does not exist", mountpoint.display()))?;
    Ok(parent.join(name))
}

/// The canonical mount point, or why it cannot be used; a dead mount left by a
/// daemon that died is named as such (stat fails with `ENOTCONN`), not as
/// "not a directory".
pub fn check_mountpoint(mountpoint: &Path) -> anyhow::Result<PathBuf> {
    let dead = |err: &std::io::Error| err.raw_os_error() == Some(libc::ENOTCONN);
    let stale = || {
        anyhow!(
            "{} is a dead mount left by a daemon that died; run 'blobdrive unmount {}' first",
            mountpoint.display(),
            mountpoint.display()
        )
    };
    let canonical = match mountpoint.canonicalize() {
        Ok(canonical) => canonical,
        Err(err) if dead(&err) => return Err(stale()),
        Err(err) => {
            return Err(err)
                .with_context(|| format!("mountpoint {} does not exist", mountpoint.display()))
        }
    };
    match std::fs::metadata(&canonical) {
        Ok(meta) if meta.is_dir() => Ok(canonical),
        Ok(_) => bail!("mountpoint {} is not a directory", mountpoint.display()),
        Err(err) if dead(&err) => Err(stale()),
        Err(err) => {
            Err(err).with_context(|| format!("cannot use mountpoint {}", mountpoint.display()))
        }
    }
}

fn reap(pid: libc::pid_t) -> String {
    let mut status = 0;
    // SAFETY: `pid` is our child and `status` a valid out-pointer.
    if unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
        return "status unknown".into();
    }
    if libc::WIFEXITED(status) {
        format!("exit status {}", libc::WEXITSTATUS(status))
    } else {
        format!("killed by signal {}", libc::WTERMSIG(status))
    }
}

/// New session, `/` as working directory, stdin/stdout on `/dev/null`, stderr on
/// the log file (or `/dev/null`).
fn detach_from_terminal(log_file: Option<&Path>) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain syscalls on this process; the descriptors come from files we opened.
    unsafe {
        libc::setsid();
    }
    std::env::set_current_dir("/")?;
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    let log = match log_file {
        // Private (drive names, errors), and never through a symlink
        // another user placed where the log goes.
        Some(path) => std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .with_context(|| format!("cannot open log file {}", path.display()))?,
        None => null.try_clone()?,
    };
    for (from, to) in [
        (null.as_raw_fd(), 0),
        (null.as_raw_fd(), 1),
        (log.as_raw_fd(), 2),
    ] {
        // SAFETY: `from` is open; dup2 onto the standard descriptors is what daemons do.
        if unsafe { libc::dup2(from, to) } < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
    }
    Ok(())
}

/// Where a process that [`fork_background`] forked finds itself.
pub enum Background {
    /// The parent, once the daemon said it is ready (with the lines it
    /// sent for the parent to print) or failed (its line, one for the
    /// user).
    Parent(anyhow::Result<String>),
    /// The daemon: detached from the terminal (stdin and stdout on
    /// /dev/null, stderr on the log file or /dev/null), to tell its parent
    /// through `Readiness` when it serves or why it cannot.
    Child(Readiness),
}

/// Forks a background daemon for a command that is not a mount (`serve`):
/// the same fork, detach and readiness pipe as `run_mount`, and the same
/// precondition: no runtime or helper thread may exist yet (a
/// current-thread runtime used and dropped before is fine). The daemon may
/// hold keys: they are locked in memory again and core dumps are off.
pub fn fork_background(log_file: Option<&Path>) -> anyhow::Result<Background> {
    let (read_end, write_end) = readiness::pipe().context("cannot create the readiness pipe")?;
    // SAFETY: no runtime or helper thread exists yet (documented
    // precondition), so the child may run arbitrary code after fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error()).context("cannot fork the daemon");
    }
    if pid > 0 {
        drop(write_end);
        let (view, lines) = readiness::wait_in_parent_for_lines(read_end);
        return Ok(Background::Parent(match view {
            ParentView::Ready(warnings) => {
                for warning in warnings {
                    eprintln!("blobdrive: warning: {warning}");
                }
                Ok(lines)
            }
            ParentView::Failed(reason) => {
                reap(pid);
                Err(anyhow!(reason))
            }
            ParentView::Vanished => {
                let status = reap(pid);
                Err(anyhow!("the daemon exited before it was ready ({status})"))
            }
        }));
    }
    drop(read_end);
    // Keys unlocked before the fork are in this process too, but memory
    // locks are not inherited: lock them again.
    let relocked = crate::crypt::secret::relock_after_fork();
    crate::crypt::forbid_core_dumps();
    let mut ready = Readiness::pipe(write_end);
    if let Err(err) = detach_from_terminal(log_file) {
        ready.failed(&format!("cannot start the daemon: {err:#}"));
        std::process::exit(1);
    }
    if !relocked {
        tracing::warn!("could not lock the key material in memory: it may be written to swap");
    }
    Ok(Background::Child(ready))
}

/// Marks this process as an I/O flusher, so memory reclaim does not recurse into
/// the loop device it serves. Needs CAP_SYS_RESOURCE and Linux 5.6.
fn set_io_flusher() {
    // SAFETY: prctl with integer arguments has no memory effects.
    let rc = unsafe { libc::prctl(PR_SET_IO_FLUSHER, 1, 0, 0, 0) };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        tracing::debug!(%err, "PR_SET_IO_FLUSHER not set");
    }
}

fn fuse_config(opts: &MountOptions) -> fuser::Config {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName(opts.source.clone().unwrap_or_else(|| "blobdrive".into())),
        MountOption::Subtype("blobdrive".into()),
        MountOption::DefaultPermissions,
        MountOption::NoSuid,
        MountOption::NoDev,
        MountOption::NoAtime,
        if opts.read_only {
            MountOption::RO
        } else {
            MountOption::RW
        },
    ];
    config.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config
}

/// The thread serving a FUSE mount, whichever front end runs it.
enum SessionThread {
    /// A namespace mount, served by fuser.
    Fuser(fuser::BackgroundSession),
    /// An attach's private mount, served by our own layer (`fs/session.rs`).
    Own(std::thread::JoinHandle<std::io::Result<()>>),
}

impl SessionThread {
    /// Waits for the session to end (the filesystem was unmounted).
    fn join(self) -> std::io::Result<()> {
        match self {
            SessionThread::Fuser(background) => background.join(),
            SessionThread::Own(thread) => thread
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("the FUSE session thread panicked"))),
        }
    }
}

/// Mounts FUSE at `fuse_mountpoint` and starts serving `core` with fuser:
/// a namespace mount (an attach is served by [`own_session`]).
fn start_session(
    opts: &MountOptions,
    fuse_mountpoint: &Path,
    core: &Arc<FsCore>,
    runtime: &tokio::runtime::Handle,
) -> anyhow::Result<SessionThread> {
    let cannot_mount = || format!("cannot mount FUSE at {}", fuse_mountpoint.display());
    let fs = BlobFs::new(core.clone(), runtime.clone());
    let session =
        fuser::Session::new(fs, fuse_mountpoint, &fuse_config(opts)).with_context(cannot_mount)?;
    let background = session
        .spawn()
        .context("cannot start the FUSE session thread")?;
    Ok(SessionThread::Fuser(background))
}

/// Mounts, reports readiness, serves until the end; the daemon's whole life.
fn serve<F, Fut>(
    mountpoint: &Path,
    opts: &MountOptions,
    make_catalog: F,
    mut ready: Readiness,
    generation: Option<holder::Generation>,
) -> anyhow::Result<()>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = anyhow::Result<Arc<dyn Catalog>>>,
{
    let result = serve_inner(mountpoint, opts, make_catalog, &mut ready, generation);
    if let Err(err) = &result {
        if ready.pending() {
            ready.failed(&format!("{err:#}"));
        }
    }
    result
}

/// Allocations of at least this size get their own mapping, returned to the
/// system when freed.
const MMAP_THRESHOLD_BYTES: i32 = 2 * 1024 * 1024;
/// Free memory at the top of the heap kept for reuse. Fixing the mmap
/// threshold also fixes this one at glibc's 128 KiB, which gave every freed
/// 256 KiB buffer back to the system only to fault it in again: page
/// faults and page clearing were 15% of the daemon's CPU reading from the
/// disk tier.
const TRIM_THRESHOLD_BYTES: i32 = 16 * 1024 * 1024;

/// Keeps the daemon's memory close to what it holds. glibc raises its mmap
/// threshold after the first large free, after which the 4 MiB Put Page and
/// Get bodies come from the heap, whose freed holes it keeps: the daemon's
/// peak RSS writing 2 GiB through a 256 MiB cache went from 326 MiB to
/// 286 MiB with the threshold fixed here (chunk buffers, 256 KiB, are pooled
/// by the cache and stay below it).
fn tune_allocator() {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt only changes allocator parameters.
        let ok = unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
        };
        if !ok {
            tracing::debug!("mallopt refused an allocator setting");
        }
    }
}

fn serve_inner<F, Fut>(
    mountpoint: &Path,
    opts: &MountOptions,
    make_catalog: F,
    ready: &mut Readiness,
    generation: Option<holder::Generation>,
) -> anyhow::Result<()>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = anyhow::Result<Arc<dyn Catalog>>>,
{
    set_io_flusher();
    tune_allocator();
    // A descriptor per client, slab file and connection: the soft limit
    // goes up to the hard one; the tools run get the original back.
    if let Err(err) = crate::open_files::raise_soft_limit() {
        tracing::warn!(%err, "cannot raise the open-file limit");
    }
    let oom_score_adj = generation
        .as_ref()
        .and_then(|_| holder::set_oom_score_adj(holder::SERVER_OOM_SCORE_ADJ));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("blobdrive-io")
        .build()
        .context("cannot start the async runtime")?;
    // Watched from the start: a SIGTERM during setup, or right after
    // readiness (systemd stopping a unit at once), then ends in a clean
    // unmount instead of the default action, which would kill the daemon
    // with the lease held and its mounts left behind.
    let signals = {
        let _entered = runtime.enter();
        StopSignals::watch()?
    };
    // A stop signal the holder passed on before the watch began.
    holder::raise_pending_signal();
    let role = generation.as_ref().map(|g| g.role);
    let takeover = matches!(role, Some(holder::Role::Takeover | holder::Role::Salvage));
    if let Some(gen) = &generation {
        // Beating from the start: a takeover's lease and replay take time,
        // and the holder's watchdog must not mistake them for a hang.
        gen.state.set_server(std::process::id(), holder::unix_now());
        holder::publish(gen.state.clone(), gen.log.clone(), oom_score_adj);
        runtime.spawn(holder::beat(gen.state.clone()));
    }
    if role == Some(holder::Role::Salvage) {
        // From the write log alone: no storage, no lease, no catalog.
        let gen = generation.as_ref().expect("a salvage has its generation");
        let spec = opts.attach.as_ref().expect("only attaches are salvaged");
        let ended = salvage_log(spec, &gen.state, gen.log.as_deref(), &gen.why)?;
        return Err(anyhow::Error::new(AttachEnded(ended)));
    }
    let catalog = runtime.block_on(make_catalog())?;
    let socket_path = control::socket_path_of_canonical(mountpoint);
    let (listener, metrics_listener) = {
        let _entered = runtime.enter();
        let listener = control::bind(&socket_path)?;
        match exporter::bind(&opts.metrics) {
            Ok(metrics) => (listener, metrics),
            Err(err) => {
                let _ = std::fs::remove_file(&socket_path);
                return Err(err);
            }
        }
    };
    let fuse_mountpoint = match &opts.attach {
        None => mountpoint.to_path_buf(),
        // The FUSE mount of the attach taken over stays as it is.
        Some(_) if takeover => registry::fuse_dir_of(mountpoint),
        Some(_) => match private_fuse_dir(mountpoint) {
            Ok(dir) => dir,
            Err(err) => {
                let _ = std::fs::remove_file(&socket_path);
                return Err(err);
            }
        },
    };
    let mut attachment = opts.attach.clone().map(|spec| {
        let mut att = Attachment::new(mountpoint, &fuse_mountpoint, spec, opts.read_only);
        if let Some(gen) = &generation {
            att.set_holder(gen.state.holder_pid());
        }
        att
    });
    let config = FsConfig {
        read_only: opts.read_only,
        container: opts.container.clone(),
        // SAFETY: getuid/getgid cannot fail.
        uid: unsafe { libc::getuid() },
        gid: unsafe { libc::getgid() },
    };
    let core = Arc::new(FsCore::new(catalog, config));
    let cleanup = |attachment: &mut Option<Attachment>| {
        let _ = std::fs::remove_file(&socket_path);
        if !takeover {
            if let Some(att) = attachment.as_mut() {
                att.finish();
            }
        }
    };
    let (dev, state, log, crashes) = match generation {
        Some(g) => (Some(g.dev), Some(g.state), g.log, g.crashes),
        None => (None, None, None, 0),
    };
    if takeover {
        let (att, state) = (
            attachment.as_mut().expect("only attaches are taken over"),
            state.as_ref().expect("a takeover has its state"),
        );
        if let Err(err) = runtime.block_on(take_over(&core, att, state, log.as_deref())) {
            cleanup(&mut attachment);
            if let Some(fenced) = err.downcast_ref::<FencedTakeover>() {
                // Saved here, at once: the log must never be replayed over
                // the other writer's data, whichever holder runs this.
                let spec = opts.attach.as_ref().expect("only attaches are taken over");
                return match salvage_log(spec, state, log.as_deref(), &fenced.to_string()) {
                    Ok(ended) => Err(anyhow::Error::new(AttachEnded(ended))),
                    Err(failed) => Err(err.context(format!("{failed:#}"))),
                };
            }
            return Err(err.context(format!(
                "cannot take over the attach of {}",
                mountpoint.display()
            )));
        }
        let resend = state.init().is_some_and(|i| i.has_resend());
        let unlogged = !opts.read_only && log.is_none();
        if role == Some(holder::Role::Salvage) || !resend || unlogged {
            let _ = std::fs::remove_file(&socket_path);
            let why = if !resend {
                SalvageReason::NoResend
            } else if unlogged {
                SalvageReason::NoLog
            } else {
                SalvageReason::CrashLoop(crashes)
            };
            return runtime.block_on(salvage(&core, why, log.as_deref()));
        }
    }
    let session = match (dev, &state) {
        (Some(dev), Some(state)) => own_session(
            opts,
            &fuse_mountpoint,
            dev,
            &core,
            runtime.handle(),
            state,
            &log,
        ),
        _ => start_session(opts, &fuse_mountpoint, &core, runtime.handle()),
    };
    let background = match session {
        Ok(background) => background,
        Err(err) => {
            cleanup(&mut attachment);
            return Err(err);
        }
    };
    // From the first request on: the attach's own setup (a journal replayed
    // at mount, a filesystem check) can write more than the log holds.
    if let Some(log) = &log {
        runtime.spawn(keep_log(core.clone(), log.clone()));
    }
    let (ended_tx, mut ended_rx) = oneshot::channel();
    let joiner = std::thread::Builder::new()
        .name("fuse-join".into())
        .spawn(move || {
            let result = background.join();
            let _ = ended_tx.send(result);
        })
        .context("cannot start the session watcher thread")?;
    if takeover {
        tracing::info!(mountpoint = %fuse_mountpoint.display(), "FUSE connection taken over");
        if let Some(att) = attachment.as_mut() {
            // The registry names the process that serves now.
            if let Err(err) = att.register() {
                tracing::warn!("{err:#}");
            }
        }
    } else {
        tracing::info!(mountpoint = %fuse_mountpoint.display(), "FUSE mounted");
    }

    if let (Some(att), false) = (attachment.as_mut(), takeover) {
        let setup = runtime.block_on(att.setup(&core));
        let setup = setup.and_then(|(ino, fh, writable)| match &state {
            // Kept for a takeover: the kernel never sees this handle, the
            // next process must hold it too (it keeps the drive open).
            Some(state) if !state.keep_handle(handover::KeptHandle { fh, ino, writable }) => Err(
                anyhow!("internal error: no slot for the attach's own handle"),
            ),
            _ => Ok(()),
        });
        if let Err(err) = setup {
            tracing::error!("{err:#}; undoing the attach");
            let undo = runtime.block_on(async {
                att.detach(OnBusy::DetachLazily).await?;
                let lazy = OnBusy::DetachLazily;
                shut_down(&core, &fuse_mountpoint, &mut ended_rx, lazy).await
            });
            if let Err(undo_err) = undo {
                tracing::error!("undoing the attach: {undo_err}");
            }
            att.finish();
            let _ = std::fs::remove_file(&socket_path);
            let _ = joiner.join();
            runtime.shutdown_timeout(Duration::from_secs(5));
            return Err(err);
        }
    }

    tracing::info!(mountpoint = %mountpoint.display(), "mounted");
    let render: crate::metrics::export::Render = {
        let core = core.clone();
        Arc::new(move || control::metrics_text(&core))
    };
    let exporters = exporter::Exporters::start(
        runtime.handle(),
        metrics_listener,
        &opts.metrics,
        render,
        &mountpoint::mount_key(mountpoint),
    );
    if let Some(state) = &state {
        state.set_serving();
    }
    for warning in attachment.iter().flat_map(|att| att.warnings.iter()) {
        ready.warn(warning);
    }
    ready.ready();
    let result = runtime.block_on(run_until_shutdown(
        core,
        signals,
        mountpoint.to_path_buf(),
        fuse_mountpoint,
        ControlSocket {
            listener,
            path: &socket_path,
        },
        ended_rx,
        &mut attachment,
    ));
    if let (Ok(()), Some(log)) = (&result, &log) {
        // Unmounted, flushed and closed: every logged write is in the blob.
        log.trim_before(log.flush_mark());
    }
    finish_serving(
        runtime,
        exporters,
        attachment,
        &socket_path,
        joiner,
        mountpoint,
        result,
    )
}

/// The end of a serving process's life after its loop: systemd told,
/// exporters stopped, the attach forgotten, the control socket removed.
fn finish_serving(
    runtime: tokio::runtime::Runtime,
    exporters: exporter::Exporters,
    mut attachment: Option<Attachment>,
    socket_path: &Path,
    joiner: std::thread::JoinHandle<()>,
    mountpoint: &Path,
    result: anyhow::Result<()>,
) -> anyhow::Result<()> {
    readiness::notify_systemd("STOPPING=1");
    exporters.stop();
    if let Some(att) = attachment.as_mut() {
        att.finish();
    }
    let _ = std::fs::remove_file(socket_path);
    let _ = joiner.join();
    runtime.shutdown_timeout(Duration::from_secs(5));
    match &result {
        Ok(()) => tracing::info!(mountpoint = %mountpoint.display(), "unmounted cleanly"),
        Err(err) => tracing::error!(mountpoint = %mountpoint.display(), "unmount: {err:#}"),
    }
    result
}

/// Takes over an attach whose serving process died: the attach as the
/// registry records it, the drive file's node ids, the handles the kernel
/// holds (the first writable one takes the lease again, with the same id),
/// then the writes the dead process had acknowledged, from the write log.
/// The blob's sequence number is raised before this process's first write
/// (see `blob/fence.rs`), so a Put Page the dead process had in flight
/// cannot land over them.
async fn take_over(
    core: &FsCore,
    att: &mut Attachment,
    state: &handover::Handover,
    log: Option<&crate::fs::write_log::WriteLog>,
) -> anyhow::Result<()> {
    if state.init().is_none() {
        bail!("the connection was never initialised");
    }
    let count = state.count_takeover();
    tracing::warn!(
        takeover = count,
        "taking over the attach from a serving process that died"
    );
    let entry = registry::find_by_dir(att.dir())
        .ok_or_else(|| anyhow!("the attach has no registry entry"))?;
    att.adopt(&entry)?;
    let ino = att.resolve(core).await?;
    let mut writable_fh = None;
    for kept in state.handles() {
        if kept.ino != ino {
            bail!(
                "the kernel holds handle {} on node {}, which is not the drive",
                kept.fh,
                kept.ino
            );
        }
        core.open_as(kept.ino, kept.writable, Some(kept.fh))
            .await
            .map_err(|e| match e.fenced {
                true => anyhow::Error::new(FencedTakeover(e.message)),
                false => anyhow!("cannot open the drive again: {e}"),
            })?;
        if kept.writable {
            writable_fh.get_or_insert(kept.fh);
        }
    }
    if let Some(log) = log {
        let started = std::time::Instant::now();
        let Some(fh) = writable_fh else {
            bail!("the attach's state holds no writable handle to replay its write log through");
        };
        let applied = crate::fs::session::replay(core, log, fh).await?;
        tracing::info!(
            bytes_applied = applied,
            log_bytes = log.used_bytes(),
            ms = started.elapsed().as_millis() as u64,
            "write log replayed"
        );
    }
    Ok(())
}

/// A takeover the drive refused: another writer changed it after the
/// attach lost its lease (`blob/lineage.rs`). No retry can change that.
#[derive(Debug, thiserror::Error)]
#[error("{0}; the write log's writes are not replayed over it")]
struct FencedTakeover(String);

/// The attach ended on purpose (its log saved after a refused takeover):
/// whatever holder runs it, the attach must not be taken over again.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct AttachEnded(String);

/// The exit status of a serving process whose takeover failed with `err`:
/// 1 when the attach ended on purpose (every release's holder then ends
/// it; a holder of an older release would take a refused attach over again
/// without asking the drive's lineage), [`holder::FENCED`] when the
/// refusal's log could not be saved here (a holder of this release
/// salvages at once), else a crash, tried again.
fn exit_status_of_takeover(err: &anyhow::Error) -> i32 {
    if err.downcast_ref::<AttachEnded>().is_some() {
        1
    } else if err.downcast_ref::<FencedTakeover>().is_some() {
        holder::FENCED
    } else {
        holder::TAKEOVER_FAILED
    }
}

/// Saves what the write log holds in a recovery file (`salvage.rs`), for
/// an attach that ends: returns the line that says so and names the file.
/// A failure to write the file keeps the log (the holder tries again).
fn salvage_log(
    spec: &AttachOptions,
    state: &handover::Handover,
    log: Option<&crate::fs::write_log::WriteLog>,
    why: &str,
) -> anyhow::Result<String> {
    let why = if why.is_empty() {
        "the attach's serving processes could not go on"
    } else {
        why
    };
    let Some(log) = log else {
        return Ok(format!(
            "{why}; the attach ends (its write log was off: writes acknowledged and not \
             flushed are lost)"
        ));
    };
    let saved = salvage::save_log(spec, state, log, why)
        .with_context(|| format!("{why}; saving what the write log holds failed"))?;
    // In the recovery file now (fsynced): the log's records are no longer
    // the only copy, and an empty log lets the holder end.
    log.trim_before(log.flush_mark());
    Ok(match saved {
        Some(path) => format!(
            "{why}; the attach ends. Acknowledged writes not yet in the blob are saved in {}: \
             'blobdrive recover {} --break-lease' applies them once this attach has ended, if \
             no one else wrote to the drive since",
            path.display(),
            path.display()
        ),
        None => format!("{why}; the attach ends. No acknowledged write was waiting"),
    })
}

/// Why a successor ends the attach instead of serving.
enum SalvageReason {
    CrashLoop(u64),
    NoResend,
    NoLog,
}

/// After a crash loop, or on a kernel that cannot resend requests: saves
/// what the log held (now in the cache) in a recovery file and ends the
/// attach without serving. The holder then exits, which ends the FUSE
/// connection (the filesystem above sees I/O errors, as when a disk goes).
async fn salvage(
    core: &FsCore,
    why: SalvageReason,
    log: Option<&crate::fs::write_log::WriteLog>,
) -> anyhow::Result<()> {
    let reason = match why {
        SalvageReason::CrashLoop(crashes) => format!(
            "{crashes} serving processes in a row died within {} s of serving",
            holder::EARLY_CRASH.as_secs()
        ),
        SalvageReason::NoResend => {
            "the daemon died and this kernel cannot resend the requests it had \
             read (FUSE_NOTIFY_RESEND needs Linux 6.9)"
                .to_string()
        }
        SalvageReason::NoLog => {
            "the daemon died with its write log off (BLOBDRIVE_WRITE_LOG=off): \
             writes it had acknowledged and not flushed are lost"
                .to_string()
        }
    };
    let saved = core.save_unflushed_all(&reason).await;
    if saved.failed {
        // The log keeps them: the holder tries again (it never ends the
        // attach while the log holds writes saved nowhere else).
        bail!("{reason}; saving the acknowledged writes not yet in the blob failed (the lines above say why)");
    }
    if let Some(log) = log {
        // In the recovery file now (fsynced): the log's records are no
        // longer the only copy, and an empty log lets the holder end.
        log.trim_before(log.flush_mark());
    }
    let files: Vec<String> = saved
        .files
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    bail!(
        "{reason}; the attach ends. Acknowledged writes not yet in the blob: {}",
        if files.is_empty() {
            "none".to_string()
        } else {
            format!(
                "saved in {} ('blobdrive recover' applies them)",
                files.join(", ")
            )
        }
    )
}

/// Gives the write log's space back as the blob takes its records: when
/// the log is half full (or a reader waits for room), flushes the whole
/// drive and trims what that flush made durable.
async fn keep_log(core: Arc<FsCore>, log: Arc<crate::fs::write_log::WriteLog>) {
    loop {
        log.pressed().await;
        let mark = log.flush_mark();
        let errors = core.flush_all().await;
        if errors.is_empty() {
            log.trim_before(mark);
        } else {
            tracing::warn!(errors = %join_errors(&errors), "flush for the write log failed; its records stay");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// Serves an attach's connection `dev` with our own FUSE layer: mounted
/// here first when INIT has not happened yet (the first process), taken
/// over otherwise (the kernel is asked to resend what the dead process had
/// read, before the reader starts).
fn own_session(
    opts: &MountOptions,
    fuse_mountpoint: &Path,
    dev: std::os::fd::OwnedFd,
    core: &Arc<FsCore>,
    runtime: &tokio::runtime::Handle,
    state: &Arc<handover::Handover>,
    log: &Option<Arc<crate::fs::write_log::WriteLog>>,
) -> anyhow::Result<SessionThread> {
    let init = state.init();
    let dev = match init {
        Some(_) => dev,
        None => {
            let config = MountConfig {
                fsname: opts.source.clone().unwrap_or_else(|| "blobdrive".into()),
                read_only: opts.read_only,
                allow_other: opts.allow_other,
            };
            crate::fs::session::mount_with(dev, fuse_mountpoint, &config)
                .with_context(|| format!("cannot mount FUSE at {}", fuse_mountpoint.display()))?
        }
    };
    let mut session = Session::new(dev, core.clone(), runtime.clone(), init)
        .with_record(state.clone() as Arc<dyn crate::fs::session::ConnectionRecord>);
    if let Some(log) = log {
        session = session.with_log(log.clone());
    }
    if init.is_some() {
        session
            .notify_resend()
            .context("cannot ask the kernel to resend the requests in flight")?;
    }
    let thread = session
        .spawn()
        .context("cannot start the FUSE session thread")?;
    Ok(SessionThread::Own(thread))
}

/// The private FUSE mountpoint of an attach at `dir`, created empty; a dead
/// FUSE mount left there by a crashed daemon is detached first.
fn private_fuse_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    let fuse_dir = registry::fuse_dir_of(dir);
    if mountpoint::is_mount_point(&fuse_dir).unwrap_or(false) {
        tracing::warn!(dir = %fuse_dir.display(), "detaching a stale FUSE mount");
        // Creating the directory below says what is wrong if this failed.
        let _ = mountpoint::lazy_unmount(&fuse_dir);
    }
    std::fs::create_dir_all(&fuse_dir)
        .with_context(|| format!("cannot create {}", fuse_dir.display()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(
            registry::attach_dir(),
            std::fs::Permissions::from_mode(0o700),
        );
    }
    Ok(fuse_dir)
}

type SessionEnd = oneshot::Receiver<std::io::Result<()>>;

/// The control socket of a mount, bound, and its path (removed at the end).
struct ControlSocket<'a> {
    listener: tokio::net::UnixListener,
    path: &'a Path,
}

/// The signals that stop a mount: SIGTERM and SIGINT.
struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    /// The holder passes SIGHUP on as a stop too (its terminal or its
    /// unit went away).
    hup: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Starts watching (inside the runtime); a signal that arrives before
    /// anyone waits is kept for the first wait.
    fn watch() -> anyhow::Result<Self> {
        Ok(StopSignals {
            term: signal(SignalKind::terminate()).context("cannot watch SIGTERM")?,
            int: signal(SignalKind::interrupt()).context("cannot watch SIGINT")?,
            hup: signal(SignalKind::hangup()).context("cannot watch SIGHUP")?,
        })
    }
}

async fn run_until_shutdown(
    core: Arc<FsCore>,
    signals: StopSignals,
    mountpoint: PathBuf,
    fuse_mountpoint: PathBuf,
    socket: ControlSocket<'_>,
    mut ended: SessionEnd,
    attachment: &mut Option<Attachment>,
) -> anyhow::Result<()> {
    let StopSignals {
        term: mut sigterm,
        int: mut sigint,
        hup: mut sighup,
    } = signals;
    let (unmount_tx, mut unmount_rx) = mpsc::channel(4);
    let answers = Arc::new(control::MountControl {
        core: core.clone(),
        mountpoint: mountpoint.clone(),
    });
    let control = tokio::spawn(control::serve(socket.listener, answers, unmount_tx));
    // An attached filesystem unmounted from outside (`umount DIR`, systemd
    // stopping an fstab mount) ends the attach like a signal does.
    let watched = attachment.as_ref().map(|a| a.dir().to_path_buf());
    let watching = watched.is_some();
    let outside = attach::wait_until_unmounted_outside(watched.unwrap_or_default());
    tokio::pin!(outside);
    let mut watching = watching;
    let result = loop {
        tokio::select! {
            _ = sigterm.recv() => {
                tracing::info!("SIGTERM: unmounting");
                readiness::notify_systemd("STOPPING=1");
                break shut_down_all(&core, &fuse_mountpoint, &mut ended, attachment, OnBusy::DetachLazily).await;
            }
            _ = sigint.recv() => {
                tracing::info!("SIGINT: unmounting");
                readiness::notify_systemd("STOPPING=1");
                break shut_down_all(&core, &fuse_mountpoint, &mut ended, attachment, OnBusy::DetachLazily).await;
            }
            _ = sighup.recv() => {
                tracing::info!("SIGHUP: unmounting");
                readiness::notify_systemd("STOPPING=1");
                break shut_down_all(&core, &fuse_mountpoint, &mut ended, attachment, OnBusy::DetachLazily).await;
            }
            _ = &mut outside, if watching => {
                watching = false;
                if attachment.as_ref().is_some_and(Attachment::is_mounted) {
                    tracing::info!(dir = %mountpoint.display(), "filesystem unmounted from outside; detaching the drive");
                    readiness::notify_systemd("STOPPING=1");
                    break shut_down_all(&core, &fuse_mountpoint, &mut ended, attachment, OnBusy::DetachLazily).await;
                }
            }
            Some(request) = unmount_rx.recv() => {
                tracing::info!("unmount requested over the control socket");
                match shut_down_all(&core, &fuse_mountpoint, &mut ended, attachment, OnBusy::Refuse).await {
                    Err(ShutdownError::Refused(reason)) => {
                        tracing::warn!(%reason, "unmount refused; still serving");
                        request.answer(Err(reason)).await;
                    }
                    result => {
                        // Gone from the registry and the run directory before
                        // the requester hears back, so what it sees next is final.
                        if let Some(att) = attachment.as_mut() {
                            att.finish();
                        }
                        let _ = std::fs::remove_file(socket.path);
                        request.answer(result.as_ref().map_err(|e| e.to_string()).copied()).await;
                        break result;
                    }
                }
            }
            end = &mut ended => {
                if let Ok(Err(err)) = end {
                    tracing::warn!(%err, "FUSE session ended with an error");
                }
                tracing::info!("FUSE unmounted from outside; closing devices");
                if let Some(att) = attachment.as_mut() {
                    if let Err(err) = att.detach(OnBusy::DetachLazily).await {
                        tracing::error!("detaching the drive: {err}");
                    }
                }
                break close_everything(&core).await;
            }
        }
    };
    control.abort();
    result.map_err(|e| anyhow!(e.to_string()))
}

/// The attach's own teardown (DIR, loop device), then [`shut_down`]; the
/// private FUSE mount of an attach is always detached lazily.
async fn shut_down_all(
    core: &FsCore,
    fuse_mountpoint: &Path,
    ended: &mut SessionEnd,
    attachment: &mut Option<Attachment>,
    on_busy: OnBusy,
) -> Result<(), ShutdownError> {
    let Some(att) = attachment.as_mut() else {
        return shut_down(core, fuse_mountpoint, ended, on_busy).await;
    };
    att.detach(on_busy).await?;
    match shut_down(core, fuse_mountpoint, ended, OnBusy::DetachLazily).await {
        Err(ShutdownError::Refused(reason)) => Err(ShutdownError::Refused(format!(
            "{reason}; {dir} is unmounted, and the daemon keeps the unflushed data and \
             the lease: run 'blobdrive unmount {dir}' again to retry",
            dir = att.dir().display()
        ))),
        other => other,
    }
}

/// What to do when the kernel says the mount is busy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnBusy {
    /// Detach lazily and wait for the last user (signals).
    DetachLazily,
    /// Answer why and keep serving (unmount request).
    Refuse,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ShutdownError {
    /// Nothing changed; the mount keeps serving.
    #[error("{0}")]
    Refused(String),
    /// The mount is gone, but some data may not be durable.
    #[error("{0}")]
    Failed(String),
}

/// Flushes (a failure does not stop the unmount: `closing` saves the dirty
/// pages in a recovery file and the result names it), unmounts FUSE at
/// `mountpoint` (busy: `on_busy`), waits for the session to end and closes
/// every device.
async fn shut_down(
    core: &FsCore,
    mountpoint: &Path,
    ended: &mut SessionEnd,
    on_busy: OnBusy,
) -> Result<(), ShutdownError> {
    closing::flush_before_close(core).await;
    match umount(mountpoint, 0).await {
        Ok(()) => {}
        Err(err) if err.raw_os_error() == Some(libc::EBUSY) => match on_busy {
            OnBusy::Refuse => {
                return Err(ShutdownError::Refused(format!(
                    "{} is busy (an open file, a loop device or a mount inside it); \
                     detach those first",
                    mountpoint.display()
                )))
            }
            OnBusy::DetachLazily => {
                tracing::warn!("mount busy; detaching lazily and waiting for its last user");
                umount(mountpoint, libc::MNT_DETACH)
                    .await
                    .map_err(|e| ShutdownError::Failed(format!("lazy unmount failed: {e}")))?;
            }
        },
        Err(err) if err.raw_os_error() == Some(libc::EINVAL) => {
            tracing::debug!("already unmounted");
        }
        Err(err) => {
            return Err(ShutdownError::Refused(format!(
                "unmount of {} failed: {err}",
                mountpoint.display()
            )));
        }
    }
    if let Ok(Err(err)) = ended.await {
        tracing::warn!(%err, "FUSE session ended with an error");
    }
    close_everything(core).await
}

async fn close_everything(core: &FsCore) -> Result<(), ShutdownError> {
    closing::close_drives(core).await.map_err(|line| {
        ShutdownError::Failed(match line.strip_prefix("every write") {
            Some(rest) => format!("unmounted; every write{rest}"),
            None => line,
        })
    })
}

async fn umount(mountpoint: &Path, flags: libc::c_int) -> std::io::Result<()> {
    let path = CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    tokio::task::spawn_blocking(move || {
        // SAFETY: `path` is a valid NUL-terminated string for the call's duration.
        if unsafe { libc::umount2(path.as_ptr(), flags) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    })
    .await
    .map_err(std::io::Error::other)?
}
