//! `blobdrive upgrade DIR`: hand an attached drive over to a daemon of the
//! binary now installed, without unmounting (the filesystem above sees a
//! pause). The running daemon flushes, the attach's holder starts the new
//! binary, which takes over the connection, the lease, the handles and the
//! write log; a new binary that cannot (another state format, a key it
//! cannot read) leaves the old version serving.
//!
//! `blobdrive upgrade --all` does it for every drive this user has attached
//! on this host (the registry, `list --mounted`), one line each, and fails
//! when any drive was left on its old binary: what a package's postinst runs
//! after the binary was replaced. A drive whose daemon already runs a file
//! identical to the new binary (a reinstall of the same build) is left as it
//! is. Blobdrive FUSE mounts outside the registry (namespace mounts, another
//! user's attaches: FUSE mounts whose daemon answers blobdrive's control
//! socket) and NBD servers (`blobdrive serve`) cannot be handed over: each
//! is named as left on its old binary, which is not a failure of the upgrade.

use std::path::{Path, PathBuf};
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
    #[arg(
        value_name = "DIR",
        required_unless_present = "all",
        conflicts_with = "all"
    )]
    pub dir: Option<PathBuf>,
    /// Every drive this user has attached on this host (`list --mounted`)
    /// instead of one; a drive whose daemon already runs this very binary is
    /// left as it is, and one that cannot be handed over stays attached on
    /// its old binary and is reported, as is every other blobdrive mount
    /// (a namespace mount: only an unmount and a mount move it).
    #[arg(long)]
    pub all: bool,
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
    match &args.dir {
        Some(dir) => {
            let done = upgrade_one(dir, &binary)?;
            print_handover(&done, args.json);
            Ok(())
        }
        None => upgrade_all(&binary, args.json),
    }
}

/// `--all`: hand each live attach over in turn; a failure is reported and
/// the others are still tried. JSON: an array of the single upgrade's
/// objects, with `error` (and no `pid`) for a drive left as it was,
/// `unchanged: true` for one already on this build, and `left` for a
/// blobdrive mount outside the registry.
fn upgrade_all(binary: &Path, json: bool) -> CmdResult {
    let registry = crate::daemon::registry::list_mounted();
    let attached: Vec<_> = registry.iter().filter(|e| e.alive).collect();
    let mut failed = 0;
    let mut results = Vec::new();
    for entry in &attached {
        if runs_same_build(entry.pid, binary) {
            if !json {
                output::print_text(&format!(
                    "{}: its daemon (pid {}) already runs this build: left as it is\n",
                    entry.dir.display(),
                    entry.pid
                ));
            }
            results
                .push(serde_json::json!({ "dir": entry.dir, "pid": entry.pid, "unchanged": true }));
            continue;
        }
        match upgrade_one(&entry.dir, binary) {
            Ok(done) => {
                if !json {
                    print_handover(&done, false);
                }
                results.push(done);
            }
            Err(err) => {
                failed += 1;
                let message = format!("{err:#}");
                if !json {
                    super::print_error_line(&format!(
                        "{} stays attached on the binary it runs: {message}",
                        entry.dir.display()
                    ));
                }
                results.push(serde_json::json!({ "dir": entry.dir, "error": message }));
            }
        }
    }
    // Blobdrive FUSE mounts no registry entry serves (namespace mounts, other
    // users' attaches), which only an unmount and a mount move: the FUSE
    // mounts whose daemon answers blobdrive's control socket.
    let others: Vec<_> = crate::daemon::mountpoint::fuse_mounts()
        .into_iter()
        .filter(|dir| !registry.iter().any(|e| &e.fuse_dir == dir))
        .filter(|dir| crate::daemon::request_stats(dir).is_ok())
        .collect();
    for dir in &others {
        if !json {
            output::print_text(&format!(
                "{}: left on the old binary (not an attached drive this can hand over): \
                 unmount and mount again\n",
                dir.display()
            ));
        }
        results.push(serde_json::json!({ "dir": dir, "left": "not in the attach registry" }));
    }
    // NBD servers have no holder to hand their connections over: like the
    // namespace mounts, they run the old binary until they are restarted.
    let served: Vec<_> = crate::daemon::served::list_served()
        .into_iter()
        .filter(|e| e.alive)
        .collect();
    for entry in &served {
        if !json {
            output::print_text(&format!(
                "{} (pid {}): left on the old binary (an NBD server cannot be handed over): \
                 stop it with 'blobdrive unmount {}' and serve again\n",
                entry.endpoint,
                entry.pid,
                entry.key.display()
            ));
        }
        results.push(serde_json::json!({
            "endpoint": entry.endpoint,
            "pid": entry.pid,
            "left": "an NBD server",
        }));
    }
    if json {
        output::print_json(&results);
    } else if attached.is_empty() && others.is_empty() && served.is_empty() {
        output::print_text("no drive is attached on this host: nothing to upgrade\n");
    }
    if failed > 0 {
        bail!(
            "{failed} of {} attached drives were not upgraded (they keep running the version \
             they ran)",
            attached.len()
        );
    }
    Ok(())
}

/// True when the process `pid` runs a file with the very bytes of `binary`
/// (after a reinstall its file is replaced, so paths and inodes differ even
/// for the same build; `/proc/PID/exe` still reads the file it runs).
fn runs_same_build(pid: u32, binary: &Path) -> bool {
    let running = PathBuf::from(format!("/proc/{pid}/exe"));
    let same_size = match (std::fs::metadata(&running), std::fs::metadata(binary)) {
        (Ok(a), Ok(b)) => a.len() == b.len(),
        _ => false,
    };
    same_size
        && matches!(
            (std::fs::read(&running), std::fs::read(binary)),
            (Ok(a), Ok(b)) if a == b
        )
}

/// One handover's result, as `upgrade --json` prints it.
fn print_handover(done: &serde_json::Value, json: bool) {
    if json {
        output::print_json(done);
    } else {
        output::print_text(&format!(
            "upgraded {}: version {} (pid {}) -> {} (pid {}) in {:.2} s\n",
            done["dir"].as_str().unwrap_or("?"),
            done["old_version"].as_str().unwrap_or("?"),
            done["old_pid"],
            done["version"].as_str().unwrap_or("?"),
            done["pid"],
            done["seconds"].as_f64().unwrap_or(0.0)
        ));
    }
}

/// Hand the drive attached at `dir` over to `binary`; the result as the
/// JSON object `upgrade --json` prints.
fn upgrade_one(dir: &Path, binary: &Path) -> anyhow::Result<serde_json::Value> {
    let stats = crate::daemon::request_stats(dir)?;
    if stats["daemon"]["holder_pid"].is_null() {
        bail!(
            "{} is not an attached drive kept by a holder (a namespace mount, or a daemon \
             older than upgrades); unmount it and mount it again to run this version",
            dir.display()
        );
    }
    let (old_pid, old_version, format, takeovers) = daemon_of(&stats);
    // The version and state format the new binary carries (the new daemon
    // checks the format again before it takes anything over).
    let (new_tag, ours) = crate::version::of_binary(binary)
        .with_context(|| format!("cannot read {}", binary.display()))?
        .ok_or_else(|| anyhow!("{} is not a blobdrive binary", binary.display()))?;
    if ours != format {
        bail!(
            "cannot upgrade {} in place: its daemon (version {old_version}) keeps its state in \
             format {format}, and {} (version {new_tag}) reads format {ours}; nothing was \
             changed (unmount and mount again to switch)",
            dir.display(),
            binary.display()
        );
    }
    let started = Instant::now();
    crate::daemon::control::request_upgrade(dir, binary)?;
    // The new daemon answers once it has taken over.
    let deadline = started + HANDOVER_WAIT;
    let after = loop {
        if Instant::now() > deadline {
            bail!(
                "the daemon of {} handed over, but no new daemon answered within {} s; \
                 its log says why",
                dir.display(),
                HANDOVER_WAIT.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
        match crate::daemon::request_stats(dir) {
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
            dir.display()
        );
    }
    Ok(serde_json::json!({
        "dir": dir,
        "old_version": old_version,
        "old_pid": old_pid,
        "version": new_version,
        "pid": new_pid,
        "seconds": took.as_secs_f64(),
    }))
}
