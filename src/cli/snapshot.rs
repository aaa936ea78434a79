//! `blobdrive snapshot C/B`: take a snapshot and print its time, one line,
//! nothing else (scriptable: `T=$(blobdrive snapshot c/d)`).
//!
//! Only drives are snapshotted (the footer is checked first), so the time
//! printed always names something `mount --snapshot` can open.

use clap::Args;

use super::drives::{self, blob_err};
use super::{output, CmdResult, Context};

/// Arguments of `snapshot`.
#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// The drive, CONTAINER/PATH or a full URL.
    #[arg(value_name = "C/B")]
    pub blob: String,
}

/// Run `snapshot`.
pub fn run(ctx: &Context, args: &SnapshotArgs) -> CmdResult {
    let path = drives::parse_blob(&args.blob, None)?;
    drives::require_base(&path, "snapshot the drive itself")?;
    let client = drives::connect_for(ctx, &args.blob)?;
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
        output::print_text(&format!("{time}\n"));
        Ok(())
    })
}
