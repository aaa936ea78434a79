//! `blobdrive unmount DIR`: flush everything, release the lease, detach the loop
//! device, unmount FUSE; fails and says why if any data could not be flushed.

use std::path::PathBuf;

use clap::Args;

use super::{CmdResult, Context};
use crate::daemon::control::{self, NoDaemon};

/// Arguments of `unmount`.
#[derive(Debug, Args)]
pub struct UnmountArgs {
    /// The mount point given to `mount`.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

/// Run `unmount`: ask the mount's daemon to flush, release and unmount, and
/// wait for its answer. When the daemon died (crash, kill -9), remove the dead
/// mount it left, and still fail: what it had not flushed is lost, and the
/// drives it had open for writing stay leased.
pub fn run(_ctx: &Context, args: &UnmountArgs) -> CmdResult {
    let err = match crate::daemon::request_unmount(&args.dir) {
        Ok(()) => return Ok(()),
        Err(err) => err,
    };
    let Some(gone @ NoDaemon::Gone { .. }) = err.downcast_ref::<NoDaemon>() else {
        return Err(err);
    };
    let detached = control::remove_dead_mount(gone)?;
    let what = if detached {
        "removed the dead mount it left"
    } else {
        "removed its stale control socket"
    };
    anyhow::bail!(
        "the daemon of {} had died; {what}. Writes it had not flushed are lost, and \
         drives it had open for writing stay leased: 'blobdrive break-lease C/B' frees them",
        args.dir.display()
    )
}
