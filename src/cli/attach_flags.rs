//! The flags an attach (`mount`) and an NBD export (`serve`) share: the
//! drive engine's memory, flush and disk tier settings, and where the
//! metrics go. One definition, flattened into both commands, so a default,
//! a size rule or a help line is decided once; `mount.blobdrive` maps its
//! `-o` options onto these same flag names.

use std::path::PathBuf;

use clap::Args;

use super::{values, CodedError};
use crate::daemon::MetricsOptions;
use crate::drive::disk_cache::DEFAULT_CACHE_DIR;
use crate::drive::{DiskCacheOptions, DriveOptions};

/// Disk tier size when only --cache-dir is given.
const DEFAULT_DISK_CACHE_BYTES: u64 = 10 << 30;

/// The drive engine's flags (`--cache-size`, `--max-dirty`, `--read-ahead`,
/// `--flush-delay`, `--cache-dir`, `--disk-cache-size`).
#[derive(Debug, Clone, Args)]
pub struct CacheFlags {
    /// Memory for each drive's data: the page cache plus the copies that
    /// requests in flight hold (the daemon's peak RSS stays within about
    /// this plus 64 MiB; see BENCHMARKS.md).
    #[arg(long, value_name = "SIZE", default_value = "512M", value_parser = values::size)]
    pub cache_size: u64,
    /// Memory written data may hold before writers wait for the flush to
    /// make room (default: a quarter of --cache-size). Scattered small
    /// writes are absorbed up to this and leave at the next flush; counted
    /// in 4 KiB blocks, so 512-byte writes count as 4 KiB each.
    #[arg(long, value_name = "SIZE", value_parser = values::size)]
    pub max_dirty: Option<u64>,
    /// The most sequential reads fetch ahead from the blob. Within it the
    /// depth follows the link as the drive measures it (twice what keeps
    /// it busy and a step: 16M on a standard blob) and grows only while the reader
    /// keeps up; 0 turns read-ahead off.
    #[arg(long, value_name = "SIZE", default_value = "32M", value_parser = values::size)]
    pub read_ahead: u64,
    /// How long written data may stay only in memory before the background
    /// flush sends it to the blob (fsync and NBD_CMD_FLUSH always send it at
    /// once, and a sequential write each whole 4 MiB it has written):
    /// seconds (`1`, `0.5`, `30s`), `500ms`, `5m` or `1h`, at most an hour.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = values::duration)]
    pub flush_delay: std::time::Duration,
    /// Keep clean pages on local disk in DIR too, so the drive is warm after a
    /// remount (turns the disk tier on).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Disk space for one drive's disk tier (turns it on, under
    /// /var/cache/blobdrive unless --cache-dir is given; default 10G).
    #[arg(long, value_name = "SIZE", value_parser = values::size)]
    pub disk_cache_size: Option<u64>,
}

impl CacheFlags {
    /// The drive engine's settings these flags ask for.
    pub fn drive_options(&self) -> DriveOptions {
        let disk_tier = self.cache_dir.is_some() || self.disk_cache_size.is_some();
        DriveOptions {
            cache_bytes: self.cache_size,
            max_dirty_bytes: self.max_dirty,
            read_ahead_bytes: self.read_ahead,
            flush_delay: self.flush_delay,
            disk_cache: disk_tier.then(|| DiskCacheOptions {
                dir: self
                    .cache_dir
                    .clone()
                    .unwrap_or_else(|| DEFAULT_CACHE_DIR.into()),
                max_bytes: self.disk_cache_size.unwrap_or(DEFAULT_DISK_CACHE_BYTES),
            }),
            ..DriveOptions::default()
        }
    }
}

/// Where the metrics go (`--metrics-listen`, `--metrics-allow-remote`,
/// `--metrics-textfile`); all off by default.
#[derive(Debug, Clone, Args)]
pub struct MetricsFlags {
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics (a bare PORT
    /// means 127.0.0.1; default: off).
    #[arg(long, value_name = "[ADDR:]PORT")]
    pub metrics_listen: Option<String>,
    /// Let --metrics-listen bind an address other than loopback.
    #[arg(long, requires = "metrics_listen")]
    pub metrics_allow_remote: bool,
    /// Write the metrics every 15 s to DIR/blobdrive_<key>.prom for
    /// node_exporter's textfile collector (removed when the daemon ends).
    #[arg(long, value_name = "DIR")]
    pub metrics_textfile: Option<PathBuf>,
}

impl MetricsFlags {
    /// Where the metrics go; a bad or non-loopback `--metrics-listen`, or a
    /// `--metrics-textfile` that is not a directory, is a usage error.
    pub fn metrics_options(&self) -> anyhow::Result<MetricsOptions> {
        let listen = match &self.metrics_listen {
            Some(v) => Some(
                crate::metrics::export::parse_listen(v, self.metrics_allow_remote)
                    .map_err(|e| CodedError::usage(format!("{e:#}")))?,
            ),
            None => None,
        };
        if let Some(dir) = &self.metrics_textfile {
            if !dir.is_dir() {
                return Err(CodedError::usage(format!(
                    "--metrics-textfile {} is not a directory (node_exporter's \
                     --collector.textfile.directory)",
                    dir.display()
                ))
                .into());
            }
        }
        Ok(MetricsOptions {
            listen,
            textfile_dir: self
                .metrics_textfile
                .as_ref()
                .map(|d| std::fs::canonicalize(d).unwrap_or_else(|_| d.clone())),
        })
    }
}
