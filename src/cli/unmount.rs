//! `blobdrive unmount DIR`: flush everything, release the lease, detach the loop
//! device, unmount FUSE; fails and says why if any data could not be flushed.
//! `blobdrive unmount SOCKET|ENDPOINT|C/B` stops a `blobdrive serve` the same
//! way: it returns once the server has flushed and closed its drives, and
//! fails with the reason (a recovery file named) when it could not.

use std::path::PathBuf;

use clap::Args;

use super::{CmdResult, Context};
use crate::daemon::control::{self, NoDaemon};
use crate::daemon::{attach, registry, served};

/// Arguments of `unmount`.
#[derive(Debug, Args)]
pub struct UnmountArgs {
    /// The mount point given to `mount`; or, for a drive `serve` exports,
    /// its NBD socket path, its `tcp:IP:PORT` endpoint or its name `C/B`
    /// (the server is stopped under its clients: active connections are
    /// disconnected).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

/// Run `unmount`: ask the mount's daemon to flush, release and unmount, and
/// wait for its answer. When the daemon died (crash, kill -9), remove what it
/// left (for an attach: the filesystem, the loop device, the FUSE mount and
/// the registry entry, even when DIR itself is gone), and still fail: what
/// it had not flushed is lost, and the drives it had open for writing stay
/// leased.
pub fn run(_ctx: &Context, args: &UnmountArgs) -> CmdResult {
    let err = match crate::daemon::request_unmount(&args.dir) {
        Ok(()) => return Ok(()),
        Err(err) => err,
    };
    let gone = match err.downcast_ref::<NoDaemon>() {
        Some(gone @ NoDaemon::Gone { .. }) => Some(gone),
        _ => None,
    };
    // A server whose process lives is never taken for dead (the control
    // request said so in its error): breaking its lease would lose what it
    // has not flushed.
    if served::find(&args.dir)
        .ok()
        .flatten()
        .is_some_and(|e| e.alive)
    {
        return Err(err);
    }
    if let Some(server) = served::find(&args.dir).ok().flatten().filter(|e| !e.alive) {
        served::remove(&server.key);
        if let Some(gone) = gone {
            control::remove_dead_mount(gone)?;
        }
        anyhow::bail!(
            "the NBD server of {} (pid {}) had died; forgot its record. Writes it had not \
             flushed are lost, and drives it exported read-write stay leased: \
             'blobdrive break-lease C/B' frees them",
            server.endpoint,
            server.pid
        )
    }
    let dead_attach = registry::find_by_dir(&args.dir).filter(|e| !e.alive);
    let what = match (&dead_attach, gone) {
        (Some(entry), _) => {
            let removed = attach::remove_dead(entry)?;
            if let Some(gone) = gone {
                control::remove_dead_mount(gone)?;
            }
            if removed.is_empty() {
                "forgot its attach record".to_string()
            } else {
                format!("removed {}", removed.join(", "))
            }
        }
        (None, Some(gone)) => {
            if control::remove_dead_mount(gone)? {
                "removed the dead mount it left".to_string()
            } else {
                "removed its stale control socket".to_string()
            }
        }
        (None, None) => return Err(err),
    };
    anyhow::bail!(
        "the daemon of {} had died; {what}. Writes it had not flushed are lost, and \
         drives it had open for writing stay leased: 'blobdrive break-lease C/B' frees them",
        args.dir.display()
    )
}
