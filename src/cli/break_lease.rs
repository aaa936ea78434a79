//! `blobdrive break-lease C/B`: break a stale mount lock left by a host that
//! crashed, so the drive can be mounted read-write again.

use clap::Args;

use super::{CmdResult, CodedError, Context};

/// Arguments of `break-lease`.
#[derive(Debug, Args)]
pub struct BreakLeaseArgs {
    /// The drive, CONTAINER/PATH or a full URL.
    #[arg(value_name = "C/B")]
    pub blob: String,
}

/// Run `break-lease`.
pub fn run(_ctx: &Context, _args: &BreakLeaseArgs) -> CmdResult {
    Err(CodedError::not_available("break-lease").into())
}
