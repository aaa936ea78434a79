//! A model of Azure Blob Storage's network shape in front of Azurite, for
//! blobdrive's benchmark and tests: an HTTP proxy that gives every request
//! the service's latency (a round trip with jitter, and its bodies' time on
//! a link of the profile's bandwidth), holds each blob and the account to
//! caps on requests and bytes per second, and limits connections. Over a
//! cap a request first waits its turn, up to a bounded time; past that
//! bound it is answered `503 ServerBusy` with the service's error body,
//! before its body is read. It is not a model of the service's behaviour
//! otherwise: every request that passes goes to the upstream as it came and
//! its answer comes back as it went.
//!
//! The profiles and the model's choices (burst, queue bound, links) are in
//! [`profile`]; how the caps decide, in [`pacing`]. [`ServiceModel::start`]
//! runs one in a tokio runtime (tests); the `service-model` binary runs one
//! for `scripts/bench.sh --model`.

pub mod answers;
pub mod delay;
pub mod http;
pub mod pacing;
pub mod profile;
pub mod proxy;
pub mod stats;
pub mod trace;

use std::net::SocketAddr;
use std::sync::Arc;

pub use profile::Profile;

/// A running model. Dropping it stops accepting connections (those open
/// are served until their client closes them).
#[derive(Debug)]
pub struct ServiceModel {
    addr: SocketAddr,
    shared: Arc<proxy::Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl ServiceModel {
    /// Listens on `listen` (port 0: any free port) and serves `profile` in
    /// front of `upstream` (`host:port`).
    pub async fn start(
        listen: SocketAddr,
        upstream: &str,
        profile: Profile,
    ) -> std::io::Result<ServiceModel> {
        Self::start_traced(listen, upstream, profile, trace::Trace::off()).await
    }

    /// As [`Self::start`], recording every request in `trace`.
    pub async fn start_traced(
        listen: SocketAddr,
        upstream: &str,
        profile: Profile,
        trace: trace::Trace,
    ) -> std::io::Result<ServiceModel> {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(proxy::Shared {
            pacer: pacing::Pacer::new(&profile),
            profile,
            counters: stats::Counters::default(),
            upstream: upstream.to_string(),
            trace,
            delays: delay::DelayLine::new(),
        });
        let task = tokio::spawn(proxy::accept_loop(listener, shared.clone()));
        Ok(ServiceModel { addr, shared, task })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The profile it serves.
    pub fn profile(&self) -> &Profile {
        &self.shared.profile
    }

    /// What it did so far, as `GET /.model/stats` shows it.
    pub fn stats(&self) -> serde_json::Value {
        self.shared.counters.to_json()
    }
}

impl Drop for ServiceModel {
    fn drop(&mut self) {
        self.task.abort();
    }
}
