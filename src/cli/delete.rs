//! `blobdrive delete C/B [--include-snapshots]`: delete a drive; refused while
//! it is leased (mounted somewhere).

use clap::Args;

use super::{CmdResult, CodedError, Context};

/// Arguments of `delete`.
#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// The drive, CONTAINER/PATH or a full URL.
    #[arg(value_name = "C/B")]
    pub blob: String,
    /// Delete the drive's snapshots too (without it, a drive with snapshots is kept).
    #[arg(long)]
    pub include_snapshots: bool,
}

/// Run `delete`.
pub fn run(_ctx: &Context, _args: &DeleteArgs) -> CmdResult {
    Err(CodedError::not_available("delete").into())
}
