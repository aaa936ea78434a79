//! `blobdrive copy SRC DST [--snapshot T] [--new-uuid] [--json]`: a server-side copy
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
//!
//! `--new-uuid` then gives the copy's filesystems fresh UUIDs offline
//! (`daemon::new_uuid`), so it attaches beside its source.

use std::future::Future;
use std::io::IsTerminal;

use clap::Args;
use tokio::signal::unix::SignalKind;

use super::drives;
use super::{output, CmdResult, CodedError, Context};
use crate::lifecycle::copy::{self, Consistency, CopyReport, CopySource};
use crate::units::{format_size, VHD_FOOTER_BYTES};

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
    /// Give the copy's filesystems (ext2/3/4, XFS; each partition) fresh
    /// UUIDs, so it attaches beside its source as another machine's disk.
    #[arg(long)]
    pub new_uuid: bool,
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
    let account = client.account().clone();
    let new_dest = dest.clone();
    let report = drives::block_on_value(async move {
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
        if args.new_uuid {
            let metadata = client
                .get_properties(&dest)
                .await
                .map_err(drives::blob_err)?
                .metadata;
            if crate::crypt::KeySlots::is_encrypted(&metadata) {
                return Err(anyhow::anyhow!(
                    "{dest} was copied, but --new-uuid cannot change the filesystems of an encrypted drive; attach it with its key and change them there (tune2fs -U random, xfs_admin -U generate)"
                ));
            }
        }
        Ok(report)
    })?;
    let renewed = if args.new_uuid {
        let size_bytes = report.blob_size_bytes.saturating_sub(VHD_FOOTER_BYTES);
        let renewed = crate::daemon::new_uuid::renew_uuids(account, &new_dest, size_bytes)
            .map_err(|e| {
                e.context(format!(
                    "{new_dest} was copied, but its filesystems keep their source's UUIDs"
                ))
            })?;
        Some(renewed)
    } else {
        None
    };
    if json {
        let mut value = serde_json::to_value(&report)?;
        if let (Some(renewed), Some(map)) = (&renewed, value.as_object_mut()) {
            map.insert("new_uuids".into(), serde_json::to_value(renewed)?);
        }
        output::print_json(&value);
    } else {
        let mut text = summary(&report);
        for r in renewed.iter().flatten() {
            text.push_str(&match (&r.fs_type, &r.uuid) {
                (Some(fs), Some(uuid)) => format!("  {}: {fs}, new UUID {uuid}\n", r.area),
                (Some(fs), None) => format!(
                    "  {}: {fs}, left alone (blobdrive changes ext2/3/4 and XFS)\n",
                    r.area
                ),
                (None, _) => format!("  {}: no filesystem\n", r.area),
            });
        }
        output::print_text(&text);
    }
    Ok(())
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
