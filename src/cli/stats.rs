//! `blobdrive stats DIR [--json|--prometheus]`: live counters of a mount
//! (or of a `blobdrive serve`, named by its socket, endpoint or an export,
//! with each export's NBD counters as `nbd_*`)
//! (requests by kind, bytes, cache hits, pages elided, retries, dirty bytes);
//! with `--prometheus` also the latency histograms, in the Prometheus text
//! format.

use std::path::PathBuf;

use clap::Args;

use super::output::{self, Align, Table};
use super::{CmdResult, Context};
use crate::units::format_size;

/// Arguments of `stats`.
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// The mount point given to `mount`; or, for a drive `serve` exports,
    /// its NBD socket path, its `tcp:IP:PORT` endpoint or its name `C/B`.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// Print JSON for scripts instead of text.
    #[arg(long, conflicts_with = "prometheus")]
    pub json: bool,
    /// Print the counters and latency histograms in the Prometheus text
    /// format (what --metrics-listen serves).
    #[arg(long)]
    pub prometheus: bool,
}

/// Run `stats`: ask the mount's daemon for its counters and print them.
pub fn run(_ctx: &Context, args: &StatsArgs) -> CmdResult {
    if args.prometheus {
        output::print_text(&crate::daemon::request_metrics(&args.dir)?);
        return Ok(());
    }
    let stats = crate::daemon::request_stats(&args.dir)?;
    if args.json {
        output::print_json(&stats);
    } else {
        output::print_text(&render(&stats));
    }
    Ok(())
}

/// One block per open device: counter names and values, byte counts with units.
fn render(stats: &serde_json::Value) -> String {
    let mut text = String::new();
    if let Some(mountpoint) = stats.get("mountpoint").and_then(|m| m.as_str()) {
        text.push_str(&format!("mount {mountpoint}\n"));
    }
    if let Some(endpoint) = stats.get("endpoint").and_then(|m| m.as_str()) {
        // "stopping": its final flush is under way.
        match stats.get("state").and_then(|s| s.as_str()) {
            Some("stopping") => {
                text.push_str(&format!("NBD server {endpoint} (stopping: final flush)\n"))
            }
            _ => text.push_str(&format!("NBD server {endpoint}\n")),
        }
    }
    let devices = stats.get("devices").and_then(|d| d.as_object());
    match devices {
        Some(devices) if !devices.is_empty() => {
            for (name, counters) in devices {
                text.push_str(&format!("\n{name}\n"));
                let mut table = Table::new(&[("COUNTER", Align::Left), ("VALUE", Align::Right)]);
                for (key, value) in counters.as_object().into_iter().flatten() {
                    let shown = match value.as_u64() {
                        Some(n) if key.contains("bytes") => format!("{} ({n})", format_size(n)),
                        Some(n) => n.to_string(),
                        None => value.to_string().trim_matches('"').to_string(),
                    };
                    table.row([key.clone(), shown]);
                }
                text.push_str(&table.render());
            }
        }
        _ => text.push_str("no drive has been opened yet\n"),
    }
    text
}
