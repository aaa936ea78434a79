//! `blobdrive list [C] [--json]`: the drives (page blobs ending in a fixed VHD
//! footer) with size, lease state and snapshot count.

use clap::Args;

use super::{CmdResult, CodedError, Context};

/// Arguments of `list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only this container (default: every container of the account).
    #[arg(value_name = "C")]
    pub container: Option<String>,
    /// Print JSON for scripts instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Run `list`.
pub fn run(_ctx: &Context, _args: &ListArgs) -> CmdResult {
    Err(CodedError::not_available("list").into())
}
