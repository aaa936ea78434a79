//! `blobdrive unmount DIR`: flush everything, release the lease, detach the loop
//! device, unmount FUSE; fails and says why if any data could not be flushed.

use std::path::PathBuf;

use clap::Args;

use super::{CmdResult, Context};

/// Arguments of `unmount`.
#[derive(Debug, Args)]
pub struct UnmountArgs {
    /// The mount point given to `mount`.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

/// Run `unmount`: ask the mount's daemon to flush, release and unmount, and
/// wait for its answer.
pub fn run(_ctx: &Context, args: &UnmountArgs) -> CmdResult {
    crate::daemon::request_unmount(&args.dir)
}
