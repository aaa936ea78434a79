//! `blobdrive restore C/B --snapshot T [--no-safety-snapshot] [--json]`:
//! put a drive back to one of its snapshots (Copy Blob from the snapshot onto
//! the drive). Refused while the drive is leased (mounted). Prints the safety
//! snapshot taken first, which undoes the restore. The drive is locked by a
//! lease of 60 s, renewed while the restore runs; Ctrl-C (SIGINT) or SIGTERM
//! stops it and releases the lease (after SIGKILL it expires by itself). The
//! work is in `crate::lifecycle::copy`.

use clap::Args;

use super::drives;
use super::{output, CmdResult, Context};
use crate::lifecycle::copy;

/// Arguments of `restore`.
#[derive(Debug, Args)]
#[command(
    after_help = "The drive is locked by a 60-second lease, renewed while the restore runs and released \
                  when it ends. Ctrl-C or SIGTERM stops it (a copy the service is making is aborted) and \
                  releases the lease; after kill -9 the lease expires by itself within 60 s \
                  ('blobdrive break-lease' frees it at once)."
)]
pub struct RestoreArgs {
    /// The drive, CONTAINER/PATH.
    #[arg(value_name = "C/B")]
    pub blob: String,
    /// The snapshot to go back to.
    #[arg(long, value_name = "TIME")]
    pub snapshot: String,
    /// Do not snapshot the current state first (the restore cannot be undone).
    #[arg(long)]
    pub no_safety_snapshot: bool,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Run `restore`.
pub fn run(ctx: &Context, args: &RestoreArgs) -> CmdResult {
    let path = drives::parse_blob(&args.blob, None)?;
    drives::require_base(&path, "give the drive and the snapshot with --snapshot")?;
    let client = drives::connect_for(ctx, &args.blob)?;
    drives::block_on(async move {
        let cancel = super::copy::stop_signals("restore")?;
        let report = copy::restore(
            &client,
            &path,
            &args.snapshot,
            !args.no_safety_snapshot,
            cancel,
        )
        .await?;
        if args.json {
            output::print_json(&report);
        } else {
            let mut text = format!(
                "restored {} to snapshot {}\n",
                report.drive, report.snapshot
            );
            if let Some(t) = &report.safety_snapshot {
                text.push_str(&format!(
                    "safety snapshot {t} holds the state before; undo with 'blobdrive restore {} --snapshot {t}'\n",
                    report.drive
                ));
            }
            output::print_text(&text);
        }
        Ok(())
    })
}
