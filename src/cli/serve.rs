//! `blobdrive serve C/B... --nbd unix:PATH|tcp:HOST:PORT`: export drives
//! over NBD until SIGTERM or SIGINT, as a background daemon (like a mount:
//! the command returns once the exports are served, or fails with the
//! daemon's line) or with `--foreground` in this process.
//!
//! Each drive is opened through `fs::azure::AzureCatalog`, as an attach
//! opens it: a read-write export holds the lease (and is refused while the
//! drive is attached elsewhere), its lease is watched and its unflushed pages
//! go to a recovery file when they cannot reach the blob; a read-only or
//! snapshot export holds none. At the end the listener goes first, then the
//! requests in flight are answered, then every drive is closed (flushed,
//! lease released); a close that fails makes the exit non-zero.
//!
//! Output: a line per export once it is served (its NBD URI), and with
//! `--json` one JSON object per line instead: `{"event":"serving",...}` when
//! ready, `{"event":"stopped",...}` with each export's counters at the end.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::anyhow;
use clap::Args;
use serde::Serialize;

use super::{values, CmdResult, CodedError, Context};
use crate::blob::{BlobClient, BlobPath};
use crate::daemon::Background;
use crate::drive::disk_cache::DEFAULT_CACHE_DIR;
use crate::drive::{DiskCacheOptions, DriveOptions};
use crate::fs::azure::AzureCatalog;
use crate::fs::{Catalog, Device, EntryPath};
use crate::nbd::{Endpoint, Export, Exports, Limits, Listener};

/// Disk tier size when only --cache-dir is given.
const DEFAULT_DISK_CACHE_BYTES: u64 = 10 << 30;

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
    /// Memory for each drive's data: the page cache plus the copies that
    /// requests in flight hold.
    #[arg(long, value_name = "SIZE", default_value = "512M", value_parser = values::size)]
    pub cache_size: u64,
    /// Memory written data may hold before writers wait for the flush
    /// (default: a quarter of --cache-size).
    #[arg(long, value_name = "SIZE", value_parser = values::size)]
    pub max_dirty: Option<u64>,
    /// How far ahead sequential reads fetch from the blob.
    #[arg(long, value_name = "SIZE", default_value = "32M", value_parser = values::size)]
    pub read_ahead: u64,
    /// How long written data may stay only in memory before the background
    /// flush sends it (NBD_CMD_FLUSH and FUA writes always send it at once).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = values::duration)]
    pub flush_delay: std::time::Duration,
    /// Keep clean pages on local disk in DIR too (turns the disk tier on).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Disk space for one drive's disk tier (turns it on; default 10G).
    #[arg(long, value_name = "SIZE", value_parser = values::size)]
    pub disk_cache_size: Option<u64>,
    /// Connections served at once; more are closed at accept.
    #[arg(long, value_name = "N", default_value_t = crate::nbd::listen::DEFAULT_MAX_CONNECTIONS as u32,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub max_connections: u32,
    /// One JSON object per line: when serving, and (in the foreground) at
    /// the end with the counters of each export.
    #[arg(long)]
    pub json: bool,
    /// Stay in the foreground instead of detaching (stops on SIGTERM or
    /// Ctrl-C).
    #[arg(long, short = 'f')]
    pub foreground: bool,
    /// Where a background server writes its log (default: nowhere; -v sets
    /// the level).
    #[arg(long, value_name = "PATH")]
    pub log_file: Option<PathBuf>,
    /// Serve Prometheus metrics of the exported drives at
    /// http://ADDR:PORT/metrics (a bare PORT means 127.0.0.1; default: off).
    #[arg(long, value_name = "[ADDR:]PORT")]
    pub metrics_listen: Option<String>,
    /// Let --metrics-listen bind an address other than loopback.
    #[arg(long, requires = "metrics_listen")]
    pub metrics_allow_remote: bool,
    /// The key of encrypted drives.
    #[command(flatten)]
    pub key: super::key::KeyFlags,
}

impl ServeArgs {
    /// The drive engine's settings these flags ask for.
    fn drive_options(&self) -> DriveOptions {
        let disk_tier = self.cache_dir.is_some() || self.disk_cache_size.is_some();
        DriveOptions {
            cache_bytes: self.cache_size,
            max_dirty_bytes: self.max_dirty,
            read_ahead_bytes: self.read_ahead,
            flush_delay: self.flush_delay,
            disk_cache: disk_tier.then(|| DiskCacheOptions {
                dir: self
                    .cache_dir
                    .clone()
                    .unwrap_or_else(|| DEFAULT_CACHE_DIR.into()),
                max_bytes: self.disk_cache_size.unwrap_or(DEFAULT_DISK_CACHE_BYTES),
            }),
            ..DriveOptions::default()
        }
    }
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
    owned.cache_dir = args.cache_dir.as_deref().map(absolute).transpose()?;
    let args = &owned;
    let metrics = args
        .metrics_listen
        .as_deref()
        .map(|v| crate::metrics::export::parse_listen(v, args.metrics_allow_remote))
        .transpose()
        .map_err(|e| CodedError::usage(format!("{e:#}")))?;
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
        return serve_here(args, metrics, endpoint, drives, &mut |lines| {
            print!("{lines}")
        });
    }
    // Like a mount: the daemon opens the drives and listens, and this
    // process returns once it serves (printing what it printed) or fails
    // (with its line).
    match crate::daemon::fork_background(args.log_file.as_deref())? {
        Background::Parent(Ok(lines)) => {
            print!("{lines}");
            Ok(())
        }
        Background::Parent(Err(err)) => Err(err),
        Background::Child(mut readiness) => {
            let result = serve_here(args, metrics, endpoint, drives, &mut |lines| {
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

/// Serves in this process until a stop signal; `announce` gets the lines
/// to show once the exports are served.
fn serve_here(
    args: &ServeArgs,
    metrics: Option<std::net::SocketAddr>,
    endpoint: Endpoint,
    drives: Vec<Checked>,
    announce: &mut dyn FnMut(&str),
) -> CmdResult {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| anyhow!("cannot start the async runtime: {e}"))?;
    runtime.block_on(serve(args, metrics, endpoint, drives, announce))
}

async fn serve(
    args: &ServeArgs,
    metrics: Option<std::net::SocketAddr>,
    endpoint: Endpoint,
    drives: Vec<Checked>,
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
                close_all(&exports).await;
                return Err(err);
            }
        }
    }
    let listener = match Listener::bind(&endpoint) {
        Ok(l) => l,
        Err(err) => {
            close_all(&exports).await;
            return Err(err);
        }
    };
    // Bound before the server reports ready: a port in use is one line.
    let metrics_listener = match metrics.map(crate::metrics::export::bind).transpose() {
        Ok(l) => l,
        Err(err) => {
            close_all(&exports).await;
            return Err(err);
        }
    };
    let metrics_addr = metrics_listener
        .as_ref()
        .and_then(|l| l.local_addr().ok())
        .map(|a| a.to_string());
    let metrics_task = metrics_listener.map(|l| {
        let shown = exports.clone();
        let render: crate::metrics::export::Render = Arc::new(move || {
            let devices: serde_json::Map<String, serde_json::Value> = shown
                .iter()
                .map(|e| (e.name.clone(), e.device.stats()))
                .collect();
            crate::metrics::text::render(&devices, &crate::metrics::registry().snapshot())
        });
        tokio::spawn(crate::metrics::export::serve(l, render))
    });
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
        ..Limits::default()
    };
    let shutdown = async {
        tokio::select! {
            _ = sigterm.recv() => tracing::info!("SIGTERM: stopping the NBD server"),
            _ = sigint.recv() => tracing::info!("SIGINT: stopping the NBD server"),
            _ = sighup.recv() => tracing::info!("SIGHUP: stopping the NBD server"),
        }
    };
    let shared = Arc::new(Exports::new(exports.clone()));
    crate::nbd::serve(&listener, shared, limits, shutdown).await;
    let stopped = lines("stopped", true);
    drop(listener);
    if let Some(task) = metrics_task {
        task.abort();
    }
    let failures = close_all(&exports).await;
    if args.json {
        println!("{}", serde_json::to_string(&stopped)?);
        flush_stdout();
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(anyhow!(failures.join("; ")))
    }
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
        ..args.drive_options()
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

/// Closes every export's drive (flush, lease released); returns the errors.
async fn close_all(exports: &[Arc<Export>]) -> Vec<String> {
    let mut failures = Vec::new();
    for export in exports {
        if let Err(e) = export.device.close().await {
            failures.push(format!("closing {}: {}", export.name, e.message));
        }
    }
    failures
}

/// `path` made absolute against the current directory.
fn absolute(path: &std::path::Path) -> anyhow::Result<PathBuf> {
    Ok(std::path::absolute(path)?)
}

fn flush_stdout() {
    use std::io::Write;
    let _ = std::io::stdout().flush();
}
