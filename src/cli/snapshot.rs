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
    let client = drives::connect(ctx.connection_string.as_deref())?;
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
        // Hook for the attach work: when this host has the drive mounted
        // read-write, freeze the filesystem (fsfreeze), flush the daemon's
        // dirty pages, snapshot, then thaw. Today only unmounted drives or
        // another host's mounts reach here, so the snapshot is crash-consistent.
        let time = client.snapshot(&path).await.map_err(blob_err)?;
        tracing::info!(drive = %path, snapshot = %time, "snapshot taken");
        output::print_text(&format!("{time}\n"));
        Ok(())
    })
}
