//! `blobdrive snapshot C/B [--keep N] [--json]`: take a snapshot and print
//! its time, one line, nothing else (scriptable: `T=$(blobdrive snapshot
//! c/d)`); with `--keep N`, then delete all but the newest N snapshots.
//! `blobdrive snapshot delete C/B T` deletes one snapshot.
//!
//! Only drives are snapshotted (the footer is checked first), so the time
//! printed always names something `mount --snapshot` can open.

use clap::{Args, Subcommand};

use super::drives::{self, blob_err};
use super::{output, CmdResult, Context};
use crate::lifecycle::copy::{delete_snapshot, prune_snapshots};

/// Arguments of `snapshot`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct SnapshotArgs {
    /// Other snapshot actions.
    #[command(subcommand)]
    pub action: Option<SnapshotAction>,
    /// The drive, CONTAINER/PATH or a full URL.
    #[arg(value_name = "C/B", required = true)]
    pub blob: Option<String>,
    /// After taking the snapshot, delete all but the newest N snapshots.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub keep: Option<u32>,
    /// Print the result as JSON (`{"snapshot": .., "deleted": [..]}`).
    #[arg(long)]
    pub json: bool,
}

/// `snapshot` actions other than taking one.
#[derive(Debug, Subcommand)]
pub enum SnapshotAction {
    /// Delete one snapshot of a drive.
    Delete {
        /// The drive, CONTAINER/PATH.
        #[arg(value_name = "C/B")]
        blob: String,
        /// The snapshot time.
        #[arg(value_name = "TIME")]
        time: String,
    },
}

/// Run `snapshot`.
pub fn run(ctx: &Context, args: &SnapshotArgs) -> CmdResult {
    if let Some(SnapshotAction::Delete { blob, time }) = &args.action {
        let path = drives::parse_blob(blob, None)?;
        drives::require_base(&path, "give the drive and the snapshot time apart")?;
        let client = drives::connect_for(ctx, blob)?;
        return drives::block_on(async move {
            delete_snapshot(&client, &path, time).await?;
            output::print_text(&format!("deleted snapshot {time} of {path}\n"));
            Ok(())
        });
    }
    let blob = args.blob.as_deref().unwrap_or_default();
    let path = drives::parse_blob(blob, None)?;
    drives::require_base(&path, "snapshot the drive itself")?;
    let client = drives::connect_for(ctx, blob)?;
    drives::block_on(async move {
        let props = drives::properties(&client, &path).await?;
        let check = drives::check_disk(&client, &path, props.blob_type, props.content_length)
            .await
            .map_err(blob_err)?;
        if let Some(p) = check.problem(&path) {
            return Err(anyhow::anyhow!(
                "{path} is not a drive, not snapshotting it: {p}"
            ));
        }
        // When this host has the drive attached read-write: freeze its
        // filesystem, flush the daemon, snapshot, thaw (a consistent
        // filesystem). Otherwise a plain snapshot (crash-consistent when
        // another host has it mounted).
        let taken = crate::daemon::freeze::snapshot_drive(&client, &path).await?;
        let time = taken.time;
        match &taken.frozen {
            Some(dir) => {
                tracing::info!(drive = %path, snapshot = %time, dir = %dir.display(), "consistent snapshot taken (filesystem frozen)")
            }
            None => tracing::info!(drive = %path, snapshot = %time, "snapshot taken"),
        }
        let deleted = match args.keep {
            Some(n) => prune_snapshots(&client, &path, n as usize).await?,
            None => Vec::new(),
        };
        if args.json {
            output::print_json(&serde_json::json!({
                "drive": path.to_string(),
                "snapshot": time,
                "deleted": deleted,
            }));
        } else {
            output::print_text(&format!("{time}\n"));
            for t in &deleted {
                tracing::info!(drive = %path, snapshot = %t, "older snapshot deleted (--keep)");
            }
            if !deleted.is_empty() {
                eprintln!(
                    "deleted {} older snapshot(s) of {path} (--keep)",
                    deleted.len()
                );
            }
        }
        Ok(())
    })
}
