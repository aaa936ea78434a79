//! `blobdrive upgrade DIR`: hand an attached drive over to a daemon of the
//! binary now installed, without unmounting (the filesystem above sees a
//! pause). The running daemon flushes, the attach's holder starts the new
//! binary, which takes over the connection, the lease, the handles and the
//! write log; a new binary that cannot (another state format, a key it
//! cannot read) leaves the old version serving.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use clap::Args;

use super::{output, CmdResult, Context};

/// How long the new daemon may take to answer after the handover (it takes
/// the lease again and replays what the old one left in the write log).
const HANDOVER_WAIT: Duration = Duration::from_secs(120);

/// Arguments of `upgrade`.
#[derive(Debug, Args)]
pub struct UpgradeArgs {
    /// The directory of an attached drive (`mount C/B DIR`).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// The binary the new daemon runs (default: this one).
    #[arg(long, value_name = "PATH")]
    pub binary: Option<PathBuf>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The daemon fields of `stats` an upgrade compares.
fn daemon_of(stats: &serde_json::Value) -> (u64, String, u64, u64) {
    let d = &stats["daemon"];
    (
        stats["pid"].as_u64().unwrap_or(0),
        d["version"].as_str().unwrap_or("unknown").to_string(),
        d["state_format"].as_u64().unwrap_or(0),
        d["takeovers"].as_u64().unwrap_or(0),
    )
}

/// Run `upgrade`.
pub fn run(_ctx: &Context, args: &UpgradeArgs) -> CmdResult {
    let binary = match &args.binary {
        Some(path) => {
            std::fs::canonicalize(path).with_context(|| format!("cannot use {}", path.display()))?
        }
        None => std::env::current_exe().context("cannot tell which binary this is")?,
    };
    let stats = crate::daemon::request_stats(&args.dir)?;
    if stats["daemon"]["holder_pid"].is_null() {
        bail!(
            "{} is not an attached drive kept by a holder (a namespace mount, or a daemon \
             older than upgrades); unmount it and mount it again to run this version",
            args.dir.display()
        );
    }
    let (old_pid, old_version, format, takeovers) = daemon_of(&stats);
    // The version and state format the new binary carries (the new daemon
    // checks the format again before it takes anything over).
    let (new_tag, ours) = crate::version::of_binary(&binary)
        .with_context(|| format!("cannot read {}", binary.display()))?
        .ok_or_else(|| anyhow!("{} is not a blobdrive binary", binary.display()))?;
    if ours != format {
        bail!(
            "cannot upgrade {} in place: its daemon (version {old_version}) keeps its state in \
             format {format}, and {} (version {new_tag}) reads format {ours}; nothing was \
             changed (unmount and mount again to switch)",
            args.dir.display(),
            binary.display()
        );
    }
    let started = Instant::now();
    crate::daemon::control::request_upgrade(&args.dir, &binary)?;
    // The new daemon answers once it has taken over.
    let deadline = started + HANDOVER_WAIT;
    let after = loop {
        if Instant::now() > deadline {
            bail!(
                "the daemon of {} handed over, but no new daemon answered within {} s; \
                 its log says why",
                args.dir.display(),
                HANDOVER_WAIT.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
        match crate::daemon::request_stats(&args.dir) {
            Ok(s) if daemon_of(&s).0 != old_pid && daemon_of(&s).3 > takeovers => break s,
            _ => {}
        }
    };
    let (new_pid, new_version, _, _) = daemon_of(&after);
    let took = started.elapsed();
    if new_version != new_tag {
        bail!(
            "the new binary did not take over {} (the log says why); version {new_version} \
             (pid {new_pid}) serves it",
            args.dir.display()
        );
    }
    if args.json {
        output::print_json(&serde_json::json!({
            "dir": args.dir,
            "old_version": old_version,
            "old_pid": old_pid,
            "version": new_version,
            "pid": new_pid,
            "seconds": took.as_secs_f64(),
        }));
    } else {
        output::print_text(&format!(
            "upgraded {}: version {old_version} (pid {old_pid}) -> {new_version} (pid {new_pid}) in {:.2} s",
            args.dir.display(),
            took.as_secs_f64()
        ));
    }
    Ok(())
}
