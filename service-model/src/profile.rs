//! What a model of the service is made of ([`Profile`]) and the named
//! profiles: `standard`, `p10` and `p30`, after the per-blob targets the
//! service publishes for a standard page blob and for premium P10 and P30
//! page blobs.
//!
//! Everything the service does not publish is a choice of this model, the
//! same in every profile and stated here once: a cap lets a burst of 100 ms
//! of its rate through at once ([`BURST`]); a request that would wait longer
//! than one second for its turn ([`QUEUE_BOUND`]) is answered 503 ServerBusy
//! instead; every connection is its own link at the profile's bandwidth
//! (links do not share it; what they share is the blob's and the account's
//! caps); at most 128 connections are open at once ([`MAX_CONNECTIONS`]).

use std::time::Duration;

/// One MiB in bytes.
pub const MIB: f64 = 1_048_576.0;
/// One MB (10^6 bytes), the unit of the premium targets.
pub const MB: f64 = 1_000_000.0;

/// How much of a cap's rate an idle cap lets through at once.
pub const BURST: Duration = Duration::from_millis(100);
/// The longest a request waits for its turn under a cap before it is
/// answered 503 ServerBusy instead.
pub const QUEUE_BOUND: Duration = Duration::from_secs(1);
/// Connections open at once; one more is closed as soon as it is accepted.
pub const MAX_CONNECTIONS: usize = 128;

/// The names [`Profile::named`] knows.
pub const NAMES: [&str; 3] = ["standard", "p10", "p30"];

/// Caps on one blob or on the whole account. `None`: no cap.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Caps {
    /// Body bytes per second, request and response bodies together.
    pub bytes_per_s: Option<f64>,
    /// Requests per second.
    pub requests_per_s: Option<f64>,
}

impl Caps {
    /// No cap at all.
    pub const NONE: Caps = Caps {
        bytes_per_s: None,
        requests_per_s: None,
    };
}

/// A model of the service: the latency of each request, the caps and the
/// connection limit.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// The profile's name (`standard`, `p10`, `p30`, or `custom`).
    pub name: String,
    /// Round-trip time added to every request, half on the way in and half
    /// on the way out.
    pub rtt: Duration,
    /// Each request's round trip is `rtt` plus a uniform draw in
    /// `[-jitter, +jitter]` (so its mean is `rtt`).
    pub jitter: Duration,
    /// Each connection's own bandwidth: a body of N bytes adds N / this to
    /// its request's time. `None`: bodies cost no time.
    pub link_bytes_per_s: Option<f64>,
    /// Caps on each blob (requests whose path names a blob).
    pub blob: Caps,
    /// Caps on all requests together.
    pub account: Caps,
    /// How much of each cap's rate passes at once after an idle spell.
    pub burst: Duration,
    /// The longest wait for a cap before a 503 ServerBusy.
    pub queue_bound: Duration,
    /// Connections open at once (`None`: no limit).
    pub max_connections: Option<usize>,
}

impl Profile {
    /// The named profile, or `None` for an unknown name.
    ///
    /// - `standard`: 5 ms ± 1 ms, 60 MiB/s and 500 requests/s per blob,
    ///   20,000 requests/s per account;
    /// - `p10`: 2 ms ± 0.5 ms, 100 MB/s and 500 requests/s per blob;
    /// - `p30`: 2 ms ± 0.5 ms, 200 MB/s and 5,000 requests/s per blob.
    ///
    /// Each connection's link runs at the blob's byte cap: one request never
    /// moves faster than its blob may.
    pub fn named(name: &str) -> Option<Profile> {
        let (rtt_us, jitter_us, bytes_per_s, requests_per_s, account_requests) = match name {
            "standard" => (5_000, 1_000, 60.0 * MIB, 500.0, Some(20_000.0)),
            "p10" => (2_000, 500, 100.0 * MB, 500.0, None),
            "p30" => (2_000, 500, 200.0 * MB, 5_000.0, None),
            _ => return None,
        };
        Some(Profile {
            name: name.to_string(),
            rtt: Duration::from_micros(rtt_us),
            jitter: Duration::from_micros(jitter_us),
            link_bytes_per_s: Some(bytes_per_s),
            blob: Caps {
                bytes_per_s: Some(bytes_per_s),
                requests_per_s: Some(requests_per_s),
            },
            account: Caps {
                bytes_per_s: None,
                requests_per_s: account_requests,
            },
            burst: BURST,
            queue_bound: QUEUE_BOUND,
            max_connections: Some(MAX_CONNECTIONS),
        })
    }

    /// No latency, no caps, no limit: a plain proxy (tests start from it).
    pub fn transparent() -> Profile {
        Profile {
            name: "custom".to_string(),
            rtt: Duration::ZERO,
            jitter: Duration::ZERO,
            link_bytes_per_s: None,
            blob: Caps::NONE,
            account: Caps::NONE,
            burst: BURST,
            queue_bound: QUEUE_BOUND,
            max_connections: None,
        }
    }

    /// The profile as JSON (durations in milliseconds, rates per second).
    pub fn to_json(&self) -> serde_json::Value {
        let caps = |c: &Caps| {
            serde_json::json!({
                "bytes_per_s": c.bytes_per_s,
                "requests_per_s": c.requests_per_s,
            })
        };
        serde_json::json!({
            "name": self.name,
            "rtt_ms": self.rtt.as_secs_f64() * 1e3,
            "jitter_ms": self.jitter.as_secs_f64() * 1e3,
            "link_bytes_per_s": self.link_bytes_per_s,
            "blob": caps(&self.blob),
            "account": caps(&self.account),
            "burst_ms": self.burst.as_secs_f64() * 1e3,
            "queue_bound_ms": self.queue_bound.as_secs_f64() * 1e3,
            "max_connections": self.max_connections,
            "links_share_bandwidth": false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_profiles_hold_the_published_targets() {
        let s = Profile::named("standard").expect("standard exists");
        assert_eq!(s.rtt, Duration::from_millis(5));
        assert_eq!(s.blob.bytes_per_s, Some(60.0 * MIB));
        assert_eq!(s.blob.requests_per_s, Some(500.0));
        let p10 = Profile::named("p10").expect("p10 exists");
        assert_eq!(p10.blob.bytes_per_s, Some(100e6));
        assert_eq!(p10.blob.requests_per_s, Some(500.0));
        let p30 = Profile::named("p30").expect("p30 exists");
        assert_eq!(p30.rtt, Duration::from_millis(2));
        assert_eq!(p30.blob.bytes_per_s, Some(200e6));
        assert_eq!(p30.blob.requests_per_s, Some(5_000.0));
        assert!(Profile::named("p99").is_none());
        for name in NAMES {
            assert!(Profile::named(name).is_some(), "{name}");
        }
    }
}
