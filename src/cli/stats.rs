//! `blobdrive stats DIR [--json]`: live counters of a mount (requests by kind,
//! bytes, cache hits, pages elided, retries, dirty bytes).

use std::path::PathBuf;

use clap::Args;

use super::{CmdResult, CodedError, Context};

/// Arguments of `stats`.
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// The mount point given to `mount`.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// Print JSON for scripts instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Run `stats`.
pub fn run(_ctx: &Context, _args: &StatsArgs) -> CmdResult {
    Err(CodedError::not_available("stats").into())
}
