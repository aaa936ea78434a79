//! `blobdrive serve C/B... --nbd unix:PATH|tcp:HOST:PORT`: export drives
//! over NBD until SIGTERM, SIGINT or `blobdrive unmount SOCKET|C/B`, as a
//! background daemon (like a mount: the command returns once the exports
//! are served, or fails with the daemon's line) or with `--foreground` in
//! this process. The flags it shares with `mount` are `attach_flags`'.
//!
//! Each drive is opened through `fs::azure::AzureCatalog`, as an attach
//! opens it: a read-write export holds the lease (and is refused while the
//! drive is attached elsewhere), its lease is watched and its unflushed pages
//! go to a recovery file when they cannot reach the blob; a read-only or
//! snapshot export holds none. At the end no new client is accepted (the
//! socket stays bound until the process exits), the requests in flight are
//! answered, active clients are disconnected, then the drives are flushed
//! and closed by the mount's own end (`daemon::closing`: a recovery file
//! first when the flush fails); a close that fails makes the exit non-zero.
//! The control socket answers to the end (`stats` says `stopping`), and
//! every `unmount` that asked meanwhile gets the same final line.
//!
//! A served process is visible like an attach: an entry in the run
//! directory (`daemon::served`, shown by `list --mounted`), a control socket
//! answering `stats`, `metrics`, `flush` and `unmount`
//! (`daemon::control`), the metrics exporters of a mount, and without
//! `--log-file` a log in the run directory.
//!
//! Output: a line per export once it is served (its NBD URI), and with
//! `--json` one JSON object per line instead: `{"event":"serving",...}` when
//! ready, `{"event":"stopped",...}` with each export's counters at the end.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::anyhow;
use clap::Args;
use serde::Serialize;

use super::serve_control::{ControlSocket, Served};
use super::{CmdResult, CodedError, Context};
use crate::blob::{BlobClient, BlobPath};
use crate::daemon::closing;
use crate::daemon::control::{self, Controlled};
use crate::daemon::exporter::Exporters;
use crate::daemon::registry::AttachMode;
use crate::daemon::served::{self, ServedDrive, ServedEntry};
use crate::daemon::{exporter, Background, MetricsOptions};
use crate::drive::DriveOptions;
use crate::fs::azure::AzureCatalog;
use crate::fs::{Catalog, Device, EntryPath};
use crate::nbd::{Endpoint, Export, Exports, Limits, Listener};

/// Arguments of `serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// The drives to export (`C/B` or a blob URL); each is an export named
    /// `C/B` (`C/B@TIME` for a snapshot).
    #[arg(value_name = "DRIVE", required = true, num_args = 1..)]
    pub drives: Vec<String>,
    /// Where to listen: `unix:PATH` (a socket of mode 0600; only root and
    /// this user may connect) or `tcp:HOST:PORT` (loopback unless
    /// --allow-remote; every local user can connect to it).
    #[arg(long, value_name = "unix:PATH|tcp:HOST:PORT")]
    pub nbd: String,
    /// Let --nbd tcp: bind an address other than loopback (NBD has no
    /// authentication: anyone who reaches the port reads and writes).
    #[arg(long)]
    pub allow_remote: bool,
    /// Export read-only (no lease; any number of hosts may do this).
    #[arg(long, short = 'r')]
    pub read_only: bool,
    /// Export this snapshot (always read-only); with one drive only.
    #[arg(long, value_name = "TIME")]
    pub snapshot: Option<String>,
    /// The drive engine's memory, flush and disk tier settings (as for
    /// `mount`).
    #[command(flatten)]
    pub cache: super::attach_flags::CacheFlags,
    /// Connections served at once; more are closed at accept. A connection
    /// takes its slot when accepted (before its handshake) and keeps it
    /// until it closes, idle or not: a kernel nbd-client holds one for as
    /// long as its device is connected. Slots come back when a client
    /// disconnects, fails its handshake (30 s) or falls behind in its I/O
    /// (30 s), when a TCP peer stops answering keepalive probes, and with
    /// --idle-timeout.
    #[arg(long, value_name = "N", default_value_t = crate::nbd::listen::DEFAULT_MAX_CONNECTIONS as u32,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub max_connections: u32,
    /// Close a connection that has had no request in flight for DURATION
    /// (seconds, `30s`, `5m`, `2h`, at most a week), freeing its slot.
    /// Default: never, since a kernel nbd-client is legitimately idle for
    /// hours and loses its device when its connection is closed.
    #[arg(long, value_name = "DURATION", value_parser = super::values::idle_timeout)]
    pub idle_timeout: Option<std::time::Duration>,
    /// One JSON object per line: when serving, and (in the foreground) at
    /// the end with the counters of each export.
    #[arg(long)]
    pub json: bool,
    /// Stay in the foreground instead of detaching (stops on SIGTERM,
    /// Ctrl-C or `blobdrive unmount SOCKET`).
    #[arg(long, short = 'f')]
    pub foreground: bool,
    /// Where a background server writes its log (default: a file in the
    /// run directory, which `list --mounted --json` names; -v sets the
    /// level).
    #[arg(long, value_name = "PATH")]
    pub log_file: Option<PathBuf>,
    /// Where the metrics of the exported drives go (as for `mount`).
    #[command(flatten)]
    pub metrics: super::attach_flags::MetricsFlags,
    /// The key of encrypted drives.
    #[command(flatten)]
    pub key: super::key::KeyFlags,
}

/// One export as `--json` shows it.
#[derive(Debug, Serialize)]
struct ExportLine {
    name: String,
    uri: String,
    size_bytes: u64,
    read_only: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    counters: Option<crate::nbd::export::CountersSnapshot>,
}

#[derive(Debug, Serialize)]
struct EventLine<'a> {
    event: &'a str,
    /// The serving process (SIGTERM stops it).
    pid: u32,
    /// Where `--metrics-listen` serves (`ADDR:PORT`).
    #[serde(skip_serializing_if = "Option::is_none")]
    metrics: Option<String>,
    endpoint: String,
    exports: Vec<ExportLine>,
}

/// Run `serve`.
pub fn run(ctx: &Context, args: &ServeArgs) -> CmdResult {
    let mut endpoint = Endpoint::parse(&args.nbd, args.allow_remote).map_err(CodedError::usage)?;
    // A background daemon works in `/`: relative paths are made absolute
    // while the user's directory is known.
    if let Endpoint::Unix(path) = &mut endpoint {
        *path = absolute(path)?;
    }
    let mut owned = args.clone();
    owned.log_file = args.log_file.as_deref().map(absolute).transpose()?;
    owned.cache.cache_dir = args.cache.cache_dir.as_deref().map(absolute).transpose()?;
    let args = &owned;
    let metrics = args.metrics.metrics_options()?;
    if args.snapshot.is_some() && args.drives.len() > 1 {
        return Err(CodedError::usage(
            "--snapshot names one time: give one drive with it (or a URL with ?snapshot= per drive)",
        )
        .into());
    }
    let mut paths = Vec::new();
    for operand in &args.drives {
        let path = super::drives::parse_blob(operand, args.snapshot.as_deref())?;
        if paths.iter().any(|(p, _): &(BlobPath, String)| p == &path) {
            return Err(CodedError::usage(format!("{path} is given twice")).into());
        }
        paths.push((path, operand.clone()));
    }
    // Checked here, in the user's terminal, before anything is forked: a
    // missing drive, a read-only credential or a wrong key is one line, and
    // a passphrase can be typed.
    let drives = super::drives::block_on_value(async {
        let mut checked = Vec::new();
        for (path, operand) in &paths {
            checked.push(check_drive(ctx, args, path, operand).await?);
        }
        Ok(checked)
    })?;
    if args.foreground {
        return serve_here(
            args,
            metrics,
            endpoint,
            drives,
            args.log_file.clone(),
            &mut |lines| print!("{lines}"),
        );
    }
    // Like a mount: the daemon opens the drives and listens, and this
    // process returns once it serves (printing what it printed) or fails
    // (with its line).
    // Without --log-file the log goes to the run directory, so a failed
    // final flush after a SIGTERM is still written somewhere.
    let log_file = match &args.log_file {
        Some(path) => Some(path.clone()),
        None => Some(served::default_log_file(&endpoint.to_string())?),
    };
    match crate::daemon::fork_background(log_file.as_deref())? {
        Background::Parent(Ok(lines)) => {
            print!("{lines}");
            Ok(())
        }
        Background::Parent(Err(err)) => Err(err),
        Background::Child(mut readiness) => {
            let result = serve_here(args, metrics, endpoint, drives, log_file, &mut |lines| {
                readiness.ready_with(lines)
            });
            if let Err(err) = &result {
                // Before it was ready, the parent prints the line.
                readiness.failed(&format!("{err:#}"));
            }
            result
        }
    }
}

/// Serves in this process until a stop signal or `blobdrive unmount`;
/// `announce` gets the lines to show once the exports are served.
fn serve_here(
    args: &ServeArgs,
    metrics: MetricsOptions,
    endpoint: Endpoint,
    drives: Vec<Checked>,
    log_file: Option<PathBuf>,
    announce: &mut dyn FnMut(&str),
) -> CmdResult {
    // A descriptor per client and connection: the soft limit goes up to
    // the hard one; the tools run get the original back.
    if let Err(err) = crate::open_files::raise_soft_limit() {
        tracing::warn!(%err, "cannot raise the open-file limit");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| anyhow!("cannot start the async runtime: {e}"))?;
    runtime.block_on(serve(args, metrics, endpoint, drives, log_file, announce))
}

async fn serve(
    args: &ServeArgs,
    metrics: MetricsOptions,
    endpoint: Endpoint,
    drives: Vec<Checked>,
    log_file: Option<PathBuf>,
    announce: &mut dyn FnMut(&str),
) -> CmdResult {
    use tokio::signal::unix::{signal, SignalKind};
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    // A closed terminal (an ssh session that dropped) stops the server as
    // SIGTERM does, flushing first, instead of killing it with dirty data.
    let mut sighup = signal(SignalKind::hangup())?;
    let mut exports: Vec<Arc<Export>> = Vec::new();
    for drive in &drives {
        match open_export(args, drive).await {
            Ok(export) => exports.push(Arc::new(export)),
            Err(err) => {
                close_unserved(exports).await;
                return Err(err);
            }
        }
    }
    let listener = match Listener::bind(&endpoint) {
        Ok(l) => l,
        Err(err) => {
            close_unserved(exports).await;
            return Err(err);
        }
    };
    // Bound before the server reports ready: a port in use is one line.
    let metrics_listener = match exporter::bind(&metrics) {
        Ok(l) => l,
        Err(err) => {
            close_unserved(exports).await;
            return Err(err);
        }
    };
    let metrics_addr = metrics_listener
        .as_ref()
        .and_then(|l| l.local_addr().ok())
        .map(|a| a.to_string());
    let served = Arc::new(Served::new(
        Arc::new(Exports::new(exports.clone())),
        listener.address(),
    ));
    // The name the control socket, the registry entry and the metrics
    // textfile go by: the socket's canonical path, or the TCP endpoint.
    let key = match &endpoint {
        Endpoint::Unix(path) => path.canonicalize().unwrap_or_else(|_| path.clone()),
        Endpoint::Tcp(_) => PathBuf::from(listener.address()),
    };
    let (control_socket, control_listener) = match ControlSocket::bind(&key) {
        Ok(bound) => bound,
        Err(err) => {
            close_unserved(exports).await;
            return Err(err);
        }
    };
    let (unmount_tx, mut unmount_rx) = tokio::sync::mpsc::channel(4);
    let control_task = {
        let answers: Arc<dyn Controlled> = served.clone();
        tokio::spawn(control::serve(control_listener, answers, unmount_tx))
    };
    let render: crate::metrics::export::Render = {
        let served = served.clone();
        Arc::new(move || served.metrics_text())
    };
    let exporters = Exporters::start(
        &tokio::runtime::Handle::current(),
        metrics_listener,
        &metrics,
        render,
        &crate::daemon::mountpoint::mount_key(&key),
    );
    let lines = |event: &'static str, counters: bool| EventLine {
        event,
        pid: std::process::id(),
        metrics: metrics_addr.clone(),
        endpoint: listener.address(),
        exports: exports
            .iter()
            .map(|e| ExportLine {
                name: e.name.clone(),
                uri: listener.uri(&e.name),
                size_bytes: e.device.size_bytes(),
                read_only: e.read_only,
                counters: counters.then(|| e.counters.snapshot()),
            })
            .collect(),
    };
    let ready = lines("serving", false);
    let entry = ServedEntry {
        endpoint: listener.address(),
        key: key.clone(),
        pid: std::process::id(),
        exports: drives
            .iter()
            .zip(&ready.exports)
            .map(|(d, e)| ServedDrive {
                account: d.account.name.clone(),
                export: e.name.clone(),
                uri: e.uri.clone(),
                mode: match (&d.path.snapshot, d.read_only) {
                    (Some(_), _) => AttachMode::Snapshot,
                    (None, true) => AttachMode::ReadOnly,
                    (None, false) => AttachMode::ReadWrite,
                },
            })
            .collect(),
        log_file,
        since_unix_secs: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        alive: true,
    };
    if let Err(err) = served::write(&entry) {
        tracing::warn!("'blobdrive list --mounted' will not show this server: {err:#}");
    }
    let mut text = String::new();
    if args.json {
        text = serde_json::to_string(&ready)? + "\n";
    } else {
        for e in &ready.exports {
            let mode = if e.read_only {
                "read-only"
            } else {
                "read-write"
            };
            text += &format!(
                "serving {} ({mode}, {}) at {} (pid {})\n",
                e.name,
                crate::units::format_size(e.size_bytes),
                e.uri,
                ready.pid
            );
        }
    }
    announce(&text);
    flush_stdout();
    tracing::info!(endpoint = %listener.address(), exports = exports.len(), "NBD server ready");
    let limits = Limits {
        max_connections: args.max_connections as usize,
        idle_timeout: args.idle_timeout,
        ..Limits::default()
    };
    let mut stop_request = None;
    let shutdown = async {
        tokio::select! {
            _ = sigterm.recv() => tracing::info!("SIGTERM: stopping the NBD server"),
            _ = sigint.recv() => tracing::info!("SIGINT: stopping the NBD server"),
            _ = sighup.recv() => tracing::info!("SIGHUP: stopping the NBD server"),
            Some(request) = unmount_rx.recv() => {
                tracing::info!("stop requested over the control socket");
                stop_request = Some(request);
            }
        }
    };
    crate::nbd::serve(&listener, served.exports.clone(), limits, shutdown).await;
    // No client is served from here on, but the NBD socket stays bound and
    // the control socket keeps answering until the end: `stats` says
    // "stopping", and every further `unmount` waits for the final result,
    // so nothing takes this server for dead while it flushes.
    served
        .stopping
        .store(true, std::sync::atomic::Ordering::Release);
    let stopped = lines("stopped", true);
    exporters.stop();
    // The mount's end: flush, a recovery file when that fails, then close.
    closing::flush_before_close(&*served).await;
    let result = closing::close_drives(&*served).await;
    match &result {
        Ok(()) => tracing::info!("NBD server stopped; every drive flushed and closed"),
        Err(line) => tracing::error!("NBD server stopped: {line}"),
    }
    // Gone from the registry and the run directory before the requesters
    // hear back, so what they see next is final; what another server made
    // at the same names since is left alone.
    served::remove_own(&key);
    control_socket.remove_if_ours();
    drop(listener);
    if let Some(request) = stop_request {
        request.answer(result.clone()).await;
    }
    // Every other `unmount` that came meanwhile gets the same answer,
    // including one whose connection was accepted just before the socket
    // went.
    while let Ok(Some(request)) =
        tokio::time::timeout(std::time::Duration::from_millis(100), unmount_rx.recv()).await
    {
        request.answer(result.clone()).await;
    }
    control_task.abort();
    if args.json {
        println!("{}", serde_json::to_string(&stopped)?);
        flush_stdout();
    }
    result.map_err(|line| anyhow!(line))
}

/// A drive checked before anything is served or forked: it exists, is a
/// drive, may be written when exported read-write, and its key opens it.
struct Checked {
    path: BlobPath,
    account: crate::blob::Account,
    key: Option<Arc<crate::crypt::DataKey>>,
    read_only: bool,
}

/// Checks `path` in the user's terminal (a passphrase is asked for here),
/// as a mount does before it forks.
async fn check_drive(
    ctx: &Context,
    args: &ServeArgs,
    path: &BlobPath,
    operand: &str,
) -> anyhow::Result<Checked> {
    let account = ctx.account_for(operand)?;
    let client = BlobClient::new(account.clone())?;
    let read_only = args.read_only || path.snapshot.is_some();
    // A missing drive, or a blob that is not one, is said in one line first.
    super::mount::drive_size(&client, path).await?;
    if !read_only {
        super::mount::require_write(&client, path).await?;
    }
    let key = super::key::unlock(&client, path, &args.key).await?;
    Ok(Checked {
        path: path.clone(),
        account,
        key,
        read_only,
    })
}

/// Opens a checked drive as an attach would, for an export.
async fn open_export(args: &ServeArgs, checked: &Checked) -> anyhow::Result<Export> {
    let path = &checked.path;
    let client = BlobClient::new(checked.account.clone())?;
    let options = DriveOptions {
        target: path.to_string(),
        ..args.cache.drive_options()
    };
    let catalog = AzureCatalog::new(client, options).with_data_key(checked.key.clone());
    let entry = EntryPath {
        container: path.container.clone(),
        blob: path.name.clone(),
        snapshot: path.snapshot.clone(),
    };
    let device: Arc<dyn Device> = catalog
        .open(&entry, !checked.read_only)
        .await
        .map_err(|e| anyhow!("cannot export {path}: {}", e.message))?;
    let name = match &path.snapshot {
        Some(t) => format!("{}/{}@{t}", path.container, path.name),
        None => format!("{}/{}", path.container, path.name),
    };
    Ok(Export::new(name, device, checked.read_only))
}

/// Closes the drives opened before the server could serve (a failed
/// start); their failures are logged, the start's error is what is said.
async fn close_unserved(exports: Vec<Arc<Export>>) {
    for export in exports {
        if let Err(e) = export.device.close().await {
            tracing::error!("closing {}: {}", export.name, e.message);
        }
    }
}

/// `path` made absolute against the current directory.
fn absolute(path: &std::path::Path) -> anyhow::Result<PathBuf> {
    Ok(std::path::absolute(path)?)
}

fn flush_stdout() {
    use std::io::Write;
    let _ = std::io::stdout().flush();
}

#[cfg(test)]
mod tests {
    use super::super::values::idle_timeout;
    use std::time::Duration;

    #[test]
    fn idle_timeout_takes_seconds_minutes_and_hours_up_to_a_week() {
        assert_eq!(idle_timeout("90"), Ok(Duration::from_secs(90)));
        assert_eq!(idle_timeout("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(idle_timeout("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(idle_timeout("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(idle_timeout("168h"), Ok(Duration::from_secs(168 * 3600)));
        for bad in [
            "0", "0s", "-5m", "169h", "soon", "500ms", "1e-10", "0.5", "",
        ] {
            assert!(idle_timeout(bad).is_err(), "{bad}");
        }
    }
}
