//! What the model did, counted ([`Counters`]) and shown as JSON: requests,
//! how many waited for a cap and how long, 503s by the cap that refused
//! them, connections refused, body bytes each way.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::pacing::Cap;

/// Counters shared by every connection of one model.
#[derive(Debug, Default)]
pub struct Counters {
    requests: AtomicU64,
    forwarded: AtomicU64,
    queued: AtomicU64,
    queue_wait_us: AtomicU64,
    max_queue_wait_us: AtomicU64,
    busy: [AtomicU64; 4],
    connections: AtomicU64,
    refused_connections: AtomicU64,
    open_connections: AtomicU64,
    max_open_connections: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
    upstream_errors: AtomicU64,
}

fn cap_index(cap: Cap) -> usize {
    match cap {
        Cap::BlobRequests => 0,
        Cap::BlobBytes => 1,
        Cap::AccountRequests => 2,
        Cap::AccountBytes => 3,
    }
}

impl Counters {
    /// A request arrived (any, the model's own excepted).
    pub fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// A request was admitted after waiting `wait` for its turn.
    pub fn admitted(&self, wait: Duration) {
        if !wait.is_zero() {
            let us = wait.as_micros() as u64;
            self.queued.fetch_add(1, Ordering::Relaxed);
            self.queue_wait_us.fetch_add(us, Ordering::Relaxed);
            self.max_queue_wait_us.fetch_max(us, Ordering::Relaxed);
        }
    }

    /// A request went upstream and its answer came back: `up` and `down`
    /// payload bytes.
    pub fn forwarded(&self, up: u64, down: u64) {
        self.forwarded.fetch_add(1, Ordering::Relaxed);
        self.bytes_up.fetch_add(up, Ordering::Relaxed);
        self.bytes_down.fetch_add(down, Ordering::Relaxed);
    }

    /// A request was answered 503 ServerBusy under `cap`.
    pub fn busy(&self, cap: Cap) {
        self.busy[cap_index(cap)].fetch_add(1, Ordering::Relaxed);
    }

    /// The upstream failed a request (connection or framing error).
    pub fn upstream_error(&self) {
        self.upstream_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection was accepted and served; returns the number now open.
    pub fn opened(&self) -> u64 {
        self.connections.fetch_add(1, Ordering::Relaxed);
        let open = self.open_connections.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_open_connections.fetch_max(open, Ordering::Relaxed);
        open
    }

    /// A served connection closed.
    pub fn closed(&self) {
        self.open_connections.fetch_sub(1, Ordering::SeqCst);
    }

    /// Connections open now.
    pub fn open(&self) -> u64 {
        self.open_connections.load(Ordering::SeqCst)
    }

    /// A connection over the limit was closed unserved.
    pub fn refused(&self) {
        self.refused_connections.fetch_add(1, Ordering::Relaxed);
    }

    /// Everything, as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let busy: u64 = self.busy.iter().map(get).sum();
        let requests = get(&self.requests);
        serde_json::json!({
            "requests": requests,
            "forwarded": get(&self.forwarded),
            "queued": get(&self.queued),
            "queue_wait_s": get(&self.queue_wait_us) as f64 / 1e6,
            "max_queue_wait_s": get(&self.max_queue_wait_us) as f64 / 1e6,
            "busy": busy,
            "busy_share": if requests > 0 { busy as f64 / requests as f64 } else { 0.0 },
            "busy_by_cap": {
                "blob_requests": get(&self.busy[0]),
                "blob_bytes": get(&self.busy[1]),
                "account_requests": get(&self.busy[2]),
                "account_bytes": get(&self.busy[3]),
            },
            "connections": get(&self.connections),
            "refused_connections": get(&self.refused_connections),
            "open_connections": get(&self.open_connections),
            "max_open_connections": get(&self.max_open_connections),
            "bytes_up": get(&self.bytes_up),
            "bytes_down": get(&self.bytes_down),
            "upstream_errors": get(&self.upstream_errors),
        })
    }
}
