//! The Prometheus text exposition format (version 0.0.4), written by hand: a
//! few dozen lines, where a client library would bring its own registry and
//! types that the drive's plain counters would have to be copied into.
//!
//! Input: the counters of a mount's devices as the control socket reports
//! them (`{"container/blob": {"get": 3, ...}}`) and the process registry's
//! histograms and event counts. Output: one `# HELP` and `# TYPE` per family,
//! every series labelled with `drive`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::histogram::{HistogramSnapshot, BUCKET_BOUNDS_SECS};
use super::registry::DriveSnapshot;

/// The media type of this format, for the HTTP answer.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A counter taken from a device's stats: (stats key, metric name, help, extra label).
type StatsCounter = (
    &'static str,
    &'static str,
    &'static str,
    Option<(&'static str, &'static str)>,
);

/// The drive counters `blobdrive stats` reports, as Prometheus counters.
const STATS_COUNTERS: &[StatsCounter] = &[
    (
        "get",
        "blobdrive_requests_total",
        "Requests sent to the blob service, by kind.",
        Some(("kind", "get")),
    ),
    (
        "put_page",
        "blobdrive_requests_total",
        "",
        Some(("kind", "put_page")),
    ),
    (
        "clear_page",
        "blobdrive_requests_total",
        "",
        Some(("kind", "clear_pages")),
    ),
    (
        "page_ranges",
        "blobdrive_requests_total",
        "",
        Some(("kind", "get_page_ranges")),
    ),
    (
        "lease",
        "blobdrive_requests_total",
        "",
        Some(("kind", "lease")),
    ),
    (
        "bytes_down",
        "blobdrive_read_bytes_total",
        "Bytes read from the blob.",
        None,
    ),
    (
        "bytes_up",
        "blobdrive_written_bytes_total",
        "Bytes written to the blob (Put Page bodies).",
        None,
    ),
    (
        "fuse_read_requests",
        "blobdrive_fuse_read_requests_total",
        "FUSE read requests served (for an attach, the loop device's reads as FUSE cut them).",
        None,
    ),
    (
        "fuse_read_bytes",
        "blobdrive_fuse_read_bytes_total",
        "Bytes returned by FUSE read requests.",
        None,
    ),
    (
        "cache_hits",
        "blobdrive_cache_hit_pages_total",
        "512-byte pages read that were in the memory cache.",
        None,
    ),
    (
        "cache_misses",
        "blobdrive_cache_miss_pages_total",
        "512-byte pages read that were not in the memory cache.",
        None,
    ),
    (
        "pages_elided",
        "blobdrive_elided_pages_total",
        "Zero pages neither read from nor written to the blob.",
        None,
    ),
    (
        "disk_hits",
        "blobdrive_disk_cache_hit_pages_total",
        "512-byte pages filled from the local disk tier.",
        None,
    ),
    (
        "disk_misses",
        "blobdrive_disk_cache_miss_pages_total",
        "512-byte pages read from the blob while the disk tier was on.",
        None,
    ),
    (
        "disk_bad_chunks",
        "blobdrive_disk_cache_bad_chunks_total",
        "Disk tier files found torn or corrupted (dropped and read again).",
        None,
    ),
];

/// The drive gauges `blobdrive stats` reports: (stats key, metric name, help).
const STATS_GAUGES: &[(&str, &str, &str)] = &[
    (
        "dirty_bytes",
        "blobdrive_dirty_bytes",
        "Bytes written to the drive and not yet durable in the blob.",
    ),
    (
        "cache_bytes",
        "blobdrive_cache_bytes",
        "Memory held by the page cache.",
    ),
    (
        "disk_bytes",
        "blobdrive_disk_cache_bytes",
        "Disk space held by the local disk tier.",
    ),
];

/// One family: its help, type and sample lines, in order of appearance.
#[derive(Default)]
struct Families {
    order: Vec<&'static str>,
    meta: BTreeMap<&'static str, (String, &'static str)>,
    samples: BTreeMap<&'static str, Vec<String>>,
}

impl Families {
    fn family(&mut self, name: &'static str, kind: &'static str, help: &str) {
        if !self.meta.contains_key(name) {
            self.order.push(name);
            self.meta.insert(name, (help.to_string(), kind));
        } else if !help.is_empty() {
            self.meta.get_mut(name).expect("present").0 = help.to_string();
        }
    }

    fn sample(&mut self, family: &'static str, line: String) {
        self.samples.entry(family).or_default().push(line);
    }

    fn render(self) -> String {
        let mut out = String::new();
        for name in self.order {
            let Some(lines) = self.samples.get(name) else {
                continue;
            };
            let (help, kind) = &self.meta[name];
            let _ = writeln!(out, "# HELP {name} {}", escape_help(help));
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for line in lines {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }
}

/// The text for one mount: its devices' counters (as the control socket
/// reports them, keyed by path, each with a `target` naming the drive) and
/// the registry's per-drive histograms and event counts.
pub fn render(
    devices: &serde_json::Map<String, serde_json::Value>,
    registry: &BTreeMap<String, DriveSnapshot>,
) -> String {
    let mut f = Families::default();
    for (key, stats) in devices {
        let drive = stats.get("target").and_then(|t| t.as_str()).unwrap_or(key);
        let labels = format!("drive=\"{}\"", escape_label(drive));
        let num = |k: &str| stats.get(k).and_then(serde_json::Value::as_u64);
        for (key, name, help, extra) in STATS_COUNTERS {
            let Some(v) = num(key) else { continue };
            f.family(name, "counter", help);
            let labels = match extra {
                Some((k, val)) => format!("{labels},{k}=\"{val}\""),
                None => labels.clone(),
            };
            f.sample(name, format!("{name}{{{labels}}} {v}"));
        }
        for (key, name, help) in STATS_GAUGES {
            let Some(v) = num(key) else { continue };
            f.family(name, "gauge", help);
            f.sample(name, format!("{name}{{{labels}}} {v}"));
        }
        if let Some(open) = stats.get("open").and_then(serde_json::Value::as_bool) {
            let name = "blobdrive_device_open";
            f.family(
                name,
                "gauge",
                "1 while the drive is open, 0 after it was closed.",
            );
            f.sample(name, format!("{name}{{{labels}}} {}", u8::from(open)));
        }
    }
    for (drive, m) in registry {
        let labels = format!("drive=\"{}\"", escape_label(drive));
        histogram(
            &mut f,
            "blobdrive_put_page_duration_seconds",
            "Time of one Put Page request, retries included.",
            &labels,
            &m.put_page,
        );
        histogram(
            &mut f,
            "blobdrive_get_duration_seconds",
            "Time of one Get Blob request, retries included.",
            &labels,
            &m.get,
        );
        histogram(
            &mut f,
            "blobdrive_fsync_duration_seconds",
            "Time for an fsync (a drive flush) to make every earlier write durable in the blob.",
            &labels,
            &m.fsync,
        );
        let name = "blobdrive_request_retries_total";
        f.family(name, "counter",
            "Requests retried, by reason: throttled (503, 500 ServerBusy, 429), server_error, transport.");
        for (reason, n) in &m.retries {
            f.sample(
                name,
                format!("{name}{{{labels},reason=\"{}\"}} {n}", reason.label()),
            );
        }
        let name = "blobdrive_leases_lost_total";
        f.family(
            name,
            "counter",
            "Times the drive's lease was found broken or taken over.",
        );
        f.sample(name, format!("{name}{{{labels}}} {}", m.leases_lost));
        let name = "blobdrive_recovery_files_total";
        f.family(
            name,
            "counter",
            "Recovery files written for data that could not be flushed.",
        );
        f.sample(name, format!("{name}{{{labels}}} {}", m.recovery_files));
    }
    f.render()
}

fn histogram(
    f: &mut Families,
    name: &'static str,
    help: &str,
    labels: &str,
    h: &HistogramSnapshot,
) {
    if h.count == 0 {
        return;
    }
    f.family(name, "histogram", help);
    for (bound, n) in BUCKET_BOUNDS_SECS.iter().zip(&h.cumulative) {
        f.sample(
            name,
            format!("{name}_bucket{{{labels},le=\"{bound}\"}} {n}"),
        );
    }
    f.sample(
        name,
        format!("{name}_bucket{{{labels},le=\"+Inf\"}} {}", h.count),
    );
    f.sample(name, format!("{name}_sum{{{labels}}} {}", h.sum_secs));
    f.sample(name, format!("{name}_count{{{labels}}} {}", h.count));
}

/// A label value: backslash, double quote and newline escaped.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A help text: backslash and newline escaped.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::registry::Registry;

    #[test]
    fn counters_become_totals_with_a_drive_label() {
        let devices = serde_json::json!({
            "d/a.vhd": {"target": "d/a.vhd", "get": 3, "put_page": 2, "bytes_up": 1024,
                        "dirty_bytes": 512, "open": true, "writable": true}
        });
        let r = Registry::default();
        r.drive("d/a.vhd")
            .put_page
            .observe(std::time::Duration::from_millis(7));
        let text = render(devices.as_object().unwrap(), &r.snapshot());
        assert!(
            text.contains("blobdrive_requests_total{drive=\"d/a.vhd\",kind=\"get\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("blobdrive_written_bytes_total{drive=\"d/a.vhd\"} 1024\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE blobdrive_dirty_bytes gauge\nblobdrive_dirty_bytes{drive=\"d/a.vhd\"} 512\n"), "{text}");
        assert!(
            text.contains(
                "blobdrive_put_page_duration_seconds_bucket{drive=\"d/a.vhd\",le=\"0.01\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("blobdrive_put_page_duration_seconds_count{drive=\"d/a.vhd\"} 1\n"),
            "{text}"
        );
        assert_eq!(
            text.matches("# TYPE blobdrive_requests_total counter")
                .count(),
            1,
            "{text}"
        );
        assert!(
            !text.contains("fsync_duration"),
            "no fsync yet: no empty histogram\n{text}"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
