//! `blobdrive list [C] [--json] [--no-stored] [--all]`: the drives (page
//! blobs ending in a fixed VHD footer) with size, bytes stored, lease state
//! and snapshot count.
//!
//! One listing per container (snapshots included, to count them) and one
//! 512-byte read per page blob to check its footer, at most
//! [`CONCURRENT_READS`] at a time, and one Get Page Ranges per drive for the
//! bytes it stores (left out with `--no-stored`).
//! Blobs or containers that vanish while listing (deleted by someone else)
//! are skipped, not reported as errors.
//!
//! JSON (`--json`): an array, one object per row, always with the keys
//! `name`, `container`, `blob`, `is_drive`, `size_bytes` (virtual size, null
//! when not a drive), `blob_size_bytes`, `lease_state`, `lease_duration`,
//! `snapshots` (count), `stored_bytes` (null with `--no-stored`) and `note`
//! (why it is not a drive, null for a drive).

use futures::stream::{self, StreamExt};
use serde::Serialize;

use clap::Args;

use super::drives::{self, blob_err, DiskCheck};
use super::output::{self, Align, Table};
use super::{CmdResult, Context};
use crate::blob::{BlobClient, BlobItem, BlobPath, BlobType, Error as BlobError, ListBlobsOptions};
use crate::units::format_size;

/// Footer reads (and page-range queries) in flight at once.
pub const CONCURRENT_READS: usize = 16;

/// Arguments of `list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only this container (default: every container of the account).
    #[arg(value_name = "C")]
    pub container: Option<String>,
    /// Print JSON for scripts instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Leave out the bytes each drive stores (saves one Get Page Ranges per
    /// drive on containers with many drives).
    #[arg(long)]
    pub no_stored: bool,
    /// Accepted for scripts written when stored bytes were opt-in; they are
    /// shown by default now.
    #[arg(long, hide = true, conflicts_with = "no_stored")]
    pub stored: bool,
    /// Also show blobs that are not drives, with the reason.
    #[arg(long)]
    pub all: bool,
    /// Instead: the drives this host has attached (drive, snapshot, directory,
    /// loop device, mode, daemon pid), like CloudDrive's GetMountedDrives,
    /// then those it serves over NBD (drive, endpoint, mode, pid); with
    /// --json each row's `kind` says which (`attach` or `nbd`).
    #[arg(long, conflicts_with_all = ["container", "stored", "no_stored", "all"])]
    pub mounted: bool,
}

/// One row of `list --json`: field names are part of the interface.
#[derive(Debug, Clone, Serialize)]
pub struct ListEntry {
    /// `container/blob`.
    pub name: String,
    /// Container.
    pub container: String,
    /// Blob name within the container.
    pub blob: String,
    /// True for a page blob with a valid fixed VHD footer.
    pub is_drive: bool,
    /// Disk size in bytes (null when not a drive).
    pub size_bytes: Option<u64>,
    /// Blob size in bytes, footer included.
    pub blob_size_bytes: u64,
    /// `available`, `leased`, `expired`, `breaking`, `broken`.
    pub lease_state: Option<&'static str>,
    /// `infinite` or `fixed` when leased.
    pub lease_duration: Option<&'static str>,
    /// Number of snapshots.
    pub snapshots: usize,
    /// Bytes holding data (null with `--no-stored`).
    pub stored_bytes: Option<u64>,
    /// Why it is not a drive (null for a drive).
    pub note: Option<String>,
}

/// Run `list`.
pub fn run(ctx: &Context, args: &ListArgs) -> CmdResult {
    if args.mounted {
        print_mounted(args.json);
        return Ok(());
    }
    if let Some(c) = &args.container {
        crate::blob::path::validate_container_name(c)
            .map_err(|e| super::CodedError::usage(e.message))?;
    }
    let client = drives::connect(ctx)?;
    drives::block_on(async move {
        let containers = match &args.container {
            Some(c) => vec![c.clone()],
            None => client
                .list_containers()
                .await
                .map_err(blob_err)?
                .into_iter()
                .map(|c| c.name)
                .collect(),
        };
        let mut entries = Vec::new();
        for c in &containers {
            match list_container(&client, c, args).await {
                Ok(mut e) => entries.append(&mut e),
                // Gone since the account listing: someone deleted it.
                Err(e) if args.container.is_none() && e.code() == Some("ContainerNotFound") => {}
                Err(e) => return Err(blob_err(e)),
            }
        }
        if args.json {
            output::print_json(&entries);
        } else if entries.is_empty() {
            let scope = match &args.container {
                Some(c) => format!("container '{c}'"),
                None => format!("account '{}'", client.account_name()),
            };
            eprintln!("no drives in {scope}");
        } else {
            print_table(&entries, args);
        }
        Ok(())
    })
}

fn print_table(entries: &[ListEntry], args: &ListArgs) {
    let mut cols = vec![
        ("name", Align::Left),
        ("size", Align::Right),
        ("lease", Align::Left),
        ("snapshots", Align::Right),
    ];
    if !args.no_stored {
        cols.push(("stored", Align::Right));
    }
    if args.all {
        cols.push(("note", Align::Left));
    }
    let mut t = Table::new(&cols);
    for e in entries {
        let mut row = vec![
            e.name.clone(),
            format_size(e.size_bytes.unwrap_or(e.blob_size_bytes)),
            lease_cell(e),
            e.snapshots.to_string(),
        ];
        if !args.no_stored {
            row.push(e.stored_bytes.map(format_size).unwrap_or_default());
        }
        if args.all {
            row.push(e.note.clone().unwrap_or_default());
        }
        t.row(row);
    }
    t.print();
}

fn lease_cell(e: &ListEntry) -> String {
    let state = e.lease_state.unwrap_or("-");
    match e.lease_duration {
        Some(d) => format!("{state} ({d})"),
        None => state.to_string(),
    }
}

/// The rows of one container, sorted by name.
async fn list_container(
    client: &BlobClient,
    container: &str,
    args: &ListArgs,
) -> Result<Vec<ListEntry>, BlobError> {
    let opts = ListBlobsOptions {
        include_snapshots: true,
        ..ListBlobsOptions::default()
    };
    let listing = client.list_all_blobs(container, &opts).await?;
    let mut snapshot_counts = std::collections::HashMap::<String, usize>::new();
    let mut bases = Vec::new();
    for b in listing.blobs {
        if b.snapshot.is_some() {
            *snapshot_counts.entry(b.name).or_default() += 1;
        } else if args.all || b.blob_type == Some(BlobType::PageBlob) {
            bases.push(b);
        }
    }
    bases.sort_by(|a, b| a.name.cmp(&b.name));
    let rows: Vec<Option<ListEntry>> = stream::iter(bases)
        .map(|b| {
            let n = snapshot_counts.get(&b.name).copied().unwrap_or(0);
            entry(client, container, b, n, !args.no_stored)
        })
        .buffered(CONCURRENT_READS)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    Ok(rows
        .into_iter()
        .flatten()
        .filter(|e| args.all || e.is_drive)
        .collect())
}

/// One row, or `None` when the blob vanished meanwhile.
async fn entry(
    client: &BlobClient,
    container: &str,
    b: BlobItem,
    snapshots: usize,
    want_stored: bool,
) -> Result<Option<ListEntry>, BlobError> {
    let path = match BlobPath::new(container, &b.name) {
        Ok(p) => p,
        Err(e) => {
            // A name the service holds but we cannot address: show, don't fail.
            tracing::warn!(container, blob = %b.name, error = %e, "skipping blob");
            return Ok(None);
        }
    };
    let size = b.content_length;
    let check = match drives::check_disk(client, &path, b.blob_type, size).await {
        Ok(c) => c,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e),
    };
    let stored = match (&check, want_stored) {
        (DiskCheck::Drive(_), true) => match drives::stored_bytes(client, &path, size).await {
            Ok(s) => Some(s),
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        },
        _ => None,
    };
    let note = match &check {
        DiskCheck::WrongType(t) => Some(format!("{}, not a drive", drives::blob_type_noun(*t))),
        _ => check.problem(&path),
    };
    Ok(Some(ListEntry {
        name: path.to_string(),
        container: container.to_string(),
        blob: b.name.clone(),
        is_drive: check.footer().is_some(),
        size_bytes: check.footer().map(|f| f.current_size_bytes),
        blob_size_bytes: size,
        lease_state: b.lease_state.map(drives::lease_state_name),
        lease_duration: b.lease_duration.map(drives::lease_duration_name),
        snapshots,
        stored_bytes: stored,
        note,
    }))
}

/// `list --mounted`: the attach registry of this host, then the drives
/// `blobdrive serve` exports. JSON: one array; every row has `kind`
/// (`attach` or `nbd`); an attach has the keys `account`, `drive`, `snapshot`, `dir`, `loop_device`, `fs_type`,
/// `partition` (only when a partition is attached), `mode` (`read-write`,
/// `read-only`, `snapshot`), `pid`, `fuse_dir`, `since_unix_secs`, `alive`
/// (false: the daemon is gone, the entry is stale); an export has
/// `account`, `drive` (its export name), `mode`, `nbd` (the server's
/// endpoint), `uri`, `pid`, `log_file`, `since_unix_secs` and `alive`.
fn print_mounted(json: bool) {
    let mounted = crate::daemon::registry::list_mounted();
    let served = crate::daemon::served::list_served();
    if json {
        let mut rows: Vec<serde_json::Value> = mounted
            .iter()
            .map(|m| {
                let mut row = serde_json::to_value(m).unwrap_or_default();
                if let Some(map) = row.as_object_mut() {
                    map.insert("kind".into(), "attach".into());
                }
                row
            })
            .collect();
        for server in &served {
            for export in &server.exports {
                rows.push(serde_json::json!({
                    "kind": "nbd",
                    "account": export.account,
                    "drive": export.export,
                    "mode": export.mode,
                    "nbd": server.endpoint,
                    "uri": export.uri,
                    "pid": server.pid,
                    "log_file": server.log_file,
                    "since_unix_secs": server.since_unix_secs,
                    "alive": server.alive,
                }));
            }
        }
        output::print_json(&rows);
        return;
    }
    if mounted.is_empty() && served.is_empty() {
        eprintln!("no drive is attached or served on this host");
        return;
    }
    if !served.is_empty() {
        let mut t = Table::new(&[
            ("drive", Align::Left),
            ("nbd", Align::Left),
            ("mode", Align::Left),
            ("pid", Align::Right),
        ]);
        for server in &served {
            for export in &server.exports {
                t.row([
                    export.export.clone(),
                    server.endpoint.clone(),
                    export.mode.name().to_string(),
                    pid_cell(server.pid, server.alive),
                ]);
            }
        }
        if mounted.is_empty() {
            t.print();
            return;
        }
        print_attached(&mounted);
        println!();
        t.print();
        return;
    }
    print_attached(&mounted);
}

/// A daemon's pid, marked when it is gone.
fn pid_cell(pid: u32, alive: bool) -> String {
    if alive {
        pid.to_string()
    } else {
        format!("{pid} (gone)")
    }
}

/// The attaches as a table.
fn print_attached(mounted: &[crate::daemon::registry::AttachedDrive]) {
    let mut t = Table::new(&[
        ("drive", Align::Left),
        ("snapshot", Align::Left),
        ("dir", Align::Left),
        ("device", Align::Left),
        ("fs", Align::Left),
        ("mode", Align::Left),
        ("pid", Align::Right),
    ]);
    for m in mounted {
        let pid = pid_cell(m.pid, m.alive);
        t.row([
            m.drive.clone(),
            m.snapshot.clone().unwrap_or_else(|| "-".into()),
            m.dir.display().to_string(),
            m.loop_device.display().to_string(),
            match m.partition {
                Some(n) => format!("{} (partition {n})", m.fs_type),
                None => m.fs_type.clone(),
            },
            m.mode.name().to_string(),
            pid,
        ]);
    }
    t.print();
}
