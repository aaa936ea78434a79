//! `blobdrive delete C/B [--include-snapshots] [--force]`: delete a drive.
//!
//! Refused, each with one line saying what to do: while the drive is leased
//! (mounted somewhere); while it has snapshots and `--include-snapshots` is
//! not given (the count is named); and when the blob is not a drive unless
//! `--force` is given, so a typo cannot delete an unrelated blob. A leased
//! blob is never deleted, `--force` or not: the lease is the mount lock.
//! A URL with `?snapshot=T` deletes just that snapshot. The checks are
//! `provision::delete`'s, which `rm` in a namespace mount shares.

use clap::Args;

use super::drives::{self, blob_err};
use super::{output, CmdResult, Context};
use crate::provision::delete::{delete_drive, DeleteError, DeleteOptions};

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
        let opts = DeleteOptions {
            include_snapshots: args.include_snapshots,
            force: args.force,
        };
        let deleted = delete_drive(&client, &path, opts)
            .await
            .map_err(|e| match e {
                DeleteError::Leased => {
                    anyhow::anyhow!(drives::mounted_elsewhere(&path.to_string()))
                }
                DeleteError::NotADrive(p) => anyhow::anyhow!(
                    "{path} is not a drive, so it was kept ({p}); add --force to delete it anyway"
                ),
                DeleteError::HasSnapshots(n) => anyhow::anyhow!(
                    "{path} has {n} snapshot{}; add --include-snapshots to delete {} too",
                    if n == 1 { "" } else { "s" },
                    if n == 1 { "it" } else { "them" }
                ),
                DeleteError::Blob(e) => blob_err(e),
            })?;
        let with = match deleted.snapshots {
            0 => String::new(),
            1 => " and its snapshot".to_string(),
            n => format!(" and its {n} snapshots"),
        };
        output::print_text(&format!("deleted {path}{with}\n"));
        Ok(())
    })
}
