//! `blobdrive diff C/B --from T1 [--to T2] [--json]`: the ranges written and
//! cleared between snapshot T1 and snapshot T2 (or the live drive). The work
//! is in `crate::lifecycle::diff`.

use clap::Args;

use super::drives;
use super::{output, CmdResult, CodedError, Context};
use crate::blob::{BlobClient, BlobPath};
use crate::lifecycle::diff::{self, BlobStates};
use crate::units::format_size;

/// Arguments of `diff`.
#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The drive, CONTAINER/PATH.
    #[arg(value_name = "C/B")]
    pub blob: String,
    /// The earlier state: a snapshot time.
    #[arg(long, value_name = "T1")]
    pub from: String,
    /// The later state: a snapshot time [default: the drive now].
    #[arg(long, value_name = "T2")]
    pub to: Option<String>,
    /// Print the ranges as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Checks that `from` (and `to`) are snapshots of `path`, `from` the older.
pub async fn check_states(
    client: &BlobClient,
    path: &BlobPath,
    from: &str,
    to: Option<&str>,
) -> anyhow::Result<()> {
    if let Some(to) = to {
        if from >= to {
            return Err(CodedError::usage(format!(
                "--from {from} is not older than --to {to}: give the older snapshot as --from"
            ))
            .into());
        }
    }
    let times = drives::snapshots_of(client, path)
        .await
        .map_err(drives::blob_err)?;
    for t in std::iter::once(from).chain(to) {
        if !times.iter().any(|s| s == t) {
            anyhow::bail!(
                "{t} is not a snapshot of {path} (a snapshot of another drive?); 'blobdrive info {path}' lists its snapshots"
            );
        }
    }
    Ok(())
}

/// Run `diff`.
pub fn run(ctx: &Context, args: &DiffArgs) -> CmdResult {
    let path = drives::parse_blob(&args.blob, None)?;
    drives::require_base(&path, "give the drive, and the snapshots with --from/--to")?;
    let client = drives::connect_for(ctx, &args.blob)?;
    drives::block_on(async move {
        check_states(&client, &path, &args.from, args.to.as_deref()).await?;
        let states = BlobStates::new(client.clone(), &path);
        let d = diff::diff(&states, &args.from, args.to.as_deref())
            .await
            .map_err(drives::blob_err)?;
        if args.json {
            output::print_json(&d);
        } else {
            output::print_text(&format!(
                "{path} from {} to {}: {} written in {} ranges, {} cleared in {} ranges\n",
                d.from,
                d.to.as_deref().unwrap_or("now"),
                format_size(d.written_bytes),
                d.written.len(),
                format_size(d.cleared_bytes),
                d.cleared.len()
            ));
        }
        Ok(())
    })
}
