//! `blobdrive delete C/B [--include-snapshots] [--force]`: delete a drive.
//!
//! Refused, each with one line saying what to do: while the drive is leased
//! (mounted somewhere); while it has snapshots and `--include-snapshots` is
//! not given (the count is named); and when the blob is not a drive unless
//! `--force` is given, so a typo cannot delete an unrelated blob. A leased
//! blob is never deleted, `--force` or not: the lease is the mount lock.
//! A URL with `?snapshot=T` deletes just that snapshot.

use clap::Args;

use super::drives::{self, blob_err};
use super::{output, CmdResult, Context};

/// Arguments of `delete`.
#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// The drive, CONTAINER/PATH or a full URL.
    #[arg(value_name = "C/B")]
    pub blob: String,
    /// Delete the drive's snapshots too (without it, a drive with snapshots is kept).
    #[arg(long)]
    pub include_snapshots: bool,
    /// Delete the blob even if it is not a drive (never while it is leased).
    #[arg(long)]
    pub force: bool,
}

/// Run `delete`.
pub fn run(ctx: &Context, args: &DeleteArgs) -> CmdResult {
    let path = drives::parse_blob(&args.blob, None)?;
    let client = drives::connect_for(ctx, &args.blob)?;
    drives::block_on(async move {
        let props = drives::properties(&client, &path).await?;
        if path.snapshot.is_none() && drives::is_leased(props.lease_state) {
            return Err(anyhow::anyhow!(drives::mounted_elsewhere(
                &path.to_string()
            )));
        }
        if !args.force {
            let check = drives::check_disk(&client, &path, props.blob_type, props.content_length)
                .await
                .map_err(blob_err)?;
            if let Some(p) = check.problem(&path) {
                return Err(anyhow::anyhow!(
                    "{path} is not a drive, so it was kept ({p}); add --force to delete it anyway"
                ));
            }
        }
        let snapshots = if path.snapshot.is_none() {
            drives::snapshots_of(&client, &path)
                .await
                .map_err(blob_err)?
        } else {
            Vec::new()
        };
        if !snapshots.is_empty() && !args.include_snapshots {
            let n = snapshots.len();
            return Err(anyhow::anyhow!(
                "{path} has {n} snapshot{}; add --include-snapshots to delete {} too",
                if n == 1 { "" } else { "s" },
                if n == 1 { "it" } else { "them" }
            ));
        }
        client
            .delete_blob(&path, args.include_snapshots, None)
            .await
            .map_err(blob_err)?;
        tracing::info!(drive = %path, snapshots = snapshots.len(), "deleted");
        let with = match snapshots.len() {
            0 => String::new(),
            1 => " and its snapshot".to_string(),
            n => format!(" and its {n} snapshots"),
        };
        output::print_text(&format!("deleted {path}{with}\n"));
        Ok(())
    })
}
