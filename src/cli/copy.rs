//! `blobdrive copy SRC DST [--snapshot T] [--json]`: a server-side copy
//! (Copy Blob) into a new, independent drive. SRC is a drive of the
//! account (`--snapshot T` picks one of its snapshots) or a URL with a SAS
//! (another account). Never replaces DST; Ctrl-C (SIGINT) or SIGTERM
//! aborts the copy and deletes the half-made DST. A drive in use is copied
//! from a snapshot taken for the copy (frozen when attached read-write
//! here; otherwise a one-line warning says the copy is crash-consistent
//! only), named in the output. The work is in `crate::lifecycle::copy`.
//!
//! [`stop_signals`] is the Ctrl-C and SIGTERM watch that `restore` and
//! `resize` share with it.

use std::future::Future;
use std::io::IsTerminal;

use clap::Args;
use tokio::signal::unix::SignalKind;

use super::drives;
use super::{output, CmdResult, CodedError, Context};
use crate::lifecycle::copy::{self, Consistency, CopyReport, CopySource};
use crate::units::format_size;

/// Arguments of `copy`.
#[derive(Debug, Args)]
#[command(
    after_help = "A drive in use is copied from a snapshot taken for the copy, named in the output and \
                  deleted once the copy is complete: attached read-write on this host, its filesystem is \
                  frozen and flushed first (a consistent copy); leased elsewhere, a warning says the copy \
                  is crash-consistent only. Ctrl-C or SIGTERM aborts the copy and deletes DST."
)]
pub struct CopyArgs {
    /// The source: a drive C/B of this account, or a blob URL with a SAS.
    #[arg(value_name = "SRC")]
    pub source: String,
    /// The new drive, CONTAINER/PATH (must not exist).
    #[arg(value_name = "DST")]
    pub dest: String,
    /// Copy this snapshot of SRC.
    #[arg(long, value_name = "TIME")]
    pub snapshot: Option<String>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Reads the SRC operand: an `http(s)://` URL with a SAS signature is used
/// as given (the service reads it); anything else names a blob of this account.
pub fn copy_source(operand: &str, snapshot: Option<&str>) -> anyhow::Result<CopySource> {
    let is_url = operand.starts_with("https://") || operand.starts_with("http://");
    if is_url && operand.contains("sig=") {
        if snapshot.is_some() {
            return Err(CodedError::usage(
                "--snapshot goes with a C/B source; put snapshot= in the URL instead",
            )
            .into());
        }
        return Ok(CopySource::Url(operand.to_string()));
    }
    Ok(CopySource::Blob(drives::parse_blob(operand, snapshot)?))
}

/// Run `copy`.
pub fn run(ctx: &Context, args: &CopyArgs) -> CmdResult {
    let source = copy_source(&args.source, args.snapshot.as_deref())?;
    let dest = drives::parse_blob(&args.dest, None)?;
    drives::require_base(&dest, "a copy makes a new drive, not a snapshot")?;
    let client = drives::connect(ctx)?;
    // A URL without a SAS names a blob of the account in use, or is refused.
    if let CopySource::Blob(_) = &source {
        client.account().check_blob_url(&args.source)?;
    }
    client.account().check_blob_url(&args.dest)?;
    let show = std::io::stderr().is_terminal() && !args.json;
    let json = args.json;
    drives::block_on(async move {
        // Caught from here on, not only once the copy waits: one arriving
        // while the copy starts would otherwise kill the process with the
        // service's copy left running.
        let cancel = stop_signals("copy")?;
        match client.create_container(&dest.container).await {
            Ok(_) => {}
            // A SAS scoped to one container may not create containers; the
            // copy itself then says whether the container exists.
            Err(e) if e.is_auth_failure() => {}
            Err(e) => return Err(drives::blob_err(e)),
        }
        let mut progress = |done: u64, total: u64| {
            if show {
                eprint!(
                    "\rcopying: {} of {}   ",
                    format_size(done),
                    format_size(total)
                );
            }
            tracing::debug!(done, total, "copy progress");
        };
        let report = copy::copy(&client, &source, &dest, &mut progress, cancel).await;
        if show {
            eprintln!();
        }
        let report = report?;
        if report.consistency == Consistency::CrashConsistent {
            eprintln!(
                "blobdrive: warning: {} is in use elsewhere (leased by another host or a namespace mount): \
                 the copy is crash-consistent only (what a crash at snapshot {} would leave); for a consistent \
                 copy run 'blobdrive copy' where it is attached, or unmount it first",
                report.source,
                report.source_snapshot.as_deref().unwrap_or("-")
            );
        }
        if json {
            output::print_json(&report);
        } else {
            output::print_text(&summary(&report));
        }
        Ok(())
    })
}

/// The lines printed after a copy.
pub fn summary(r: &CopyReport) -> String {
    let mut out = format!(
        "copied {} to {} ({})\n",
        r.source,
        r.destination,
        format_size(r.blob_size_bytes)
    );
    if let Some(t) = &r.source_snapshot {
        let how = match r.consistency {
            Consistency::Frozen => "with its filesystem frozen and flushed on this host",
            _ => "as it was (crash-consistent)",
        };
        let after = if r.source_snapshot_deleted {
            "deleted after the copy"
        } else {
            "left in place: it could not be deleted"
        };
        out.push_str(&format!(
            "  from snapshot {t} of {}, taken {how} ({after})\n",
            r.source
        ));
    }
    out
}

/// Watches for Ctrl-C (SIGINT) and SIGTERM (kill, systemd, a container
/// stopping) from now on; the future resolves at the first of them, so the
/// command `what` can stop cleanly (abort a copy, release a lease) instead
/// of dying half way. Call it inside the runtime, before the work starts: a
/// signal that arrives before anyone waits is kept.
pub fn stop_signals(what: &'static str) -> anyhow::Result<impl Future<Output = ()>> {
    let watch = |kind: SignalKind, name: &str| {
        tokio::signal::unix::signal(kind)
            .map_err(|e| anyhow::anyhow!("cannot watch for {name}: {e}"))
    };
    let mut interrupt = watch(SignalKind::interrupt(), "Ctrl-C")?;
    let mut terminate = watch(SignalKind::terminate(), "SIGTERM")?;
    Ok(async move {
        // A stream that ended (never, for these) must not cancel.
        tokio::select! {
            Some(()) = interrupt.recv() => {}
            Some(()) = terminate.recv() => {}
            else => std::future::pending::<()>().await,
        }
        tracing::debug!("{what} stopped by a signal");
    })
}
