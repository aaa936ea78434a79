//! `blobdrive info C/B [--snapshot T] [--json]`: one drive's sizes, disk type,
//! lease, bytes actually stored and snapshots.

use clap::Args;

use super::{CmdResult, CodedError, Context};

/// Arguments of `info`.
#[derive(Debug, Args)]
pub struct InfoArgs {
    /// The drive, CONTAINER/PATH or a full URL.
    #[arg(value_name = "C/B")]
    pub blob: String,
    /// Show this snapshot of the drive instead of the drive itself.
    #[arg(long, value_name = "TIME")]
    pub snapshot: Option<String>,
    /// Print JSON for scripts instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Run `info`.
pub fn run(_ctx: &Context, _args: &InfoArgs) -> CmdResult {
    Err(CodedError::not_available("info").into())
}
