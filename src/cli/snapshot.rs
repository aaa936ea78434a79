//! `blobdrive snapshot C/B`: take a snapshot and print its time; when this host
//! has the drive mounted read-write, freeze, flush, snapshot, thaw.

use clap::Args;

use super::{CmdResult, CodedError, Context};

/// Arguments of `snapshot`.
#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// The drive, CONTAINER/PATH or a full URL.
    #[arg(value_name = "C/B")]
    pub blob: String,
}

/// Run `snapshot`.
pub fn run(_ctx: &Context, _args: &SnapshotArgs) -> CmdResult {
    Err(CodedError::not_available("snapshot").into())
}
