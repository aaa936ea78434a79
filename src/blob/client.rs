//! `BlobClient`: one HTTP client for one account, and the single place that
//! builds URLs, signs, sends, retries and turns answers into errors.
//!
//! The typed operations live beside it (`containers.rs`, `blobs.rs`,
//! `lease.rs`) and describe each request as a [`Request`]. Invariants: every
//! request carries the same `x-ms-version`; every attempt is re-signed with a
//! fresh `x-ms-date` (or carries the current bearer token); a body shorter
//! or longer than the caller expects is never returned as success; no body
//! is read or allocated past its bound (the length asked for, else
//! [`MAX_BODY_BYTES`]), whatever its `Content-Length` says; nothing logged or
//! put in an error holds the key, the `Authorization` header, a token or a
//! SAS signature; plain HTTP is used only for development storage or when
//! the account allows it; a server certificate is always checked.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::Method;
use tracing::debug;

use super::account::{Account, Credential};
use super::auth::{self, Signable};
use super::error::{Error, ErrorKind, Result};
use super::fence::{ChangeEnd, FenceStep, InFlight, WriteFence};
use super::limiter::{Limiter, Signal};
use super::path::{encode_component, BlobPath};
use super::retry::RetryPolicy;
use super::token::{Secret, TokenCache};
use super::xml;

/// The REST API version sent with every request.
pub const API_VERSION: &str = "2021-12-02";

/// What a request is aimed at.
pub(crate) enum Resource<'a> {
    /// The account itself (list containers).
    Account,
    /// A container.
    Container(&'a str),
    /// A blob; its snapshot, if any, is added to the query.
    Blob(&'a BlobPath),
}

/// One REST request, before signing.
pub(crate) struct Request<'a> {
    /// Operation name for errors and logs (`"put page"`).
    pub op: &'static str,
    pub method: Method,
    pub resource: Resource<'a>,
    /// Query parameters, decoded (encoded when the URL is built).
    pub query: Vec<(&'static str, String)>,
    /// Extra headers (names lower case).
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    /// When set, a response body of any other length is a (retried) failure.
    pub expect_body_len: Option<u64>,
    /// A page write fenced with the blob's sequence number (`fence.rs`).
    pub fence: Option<&'a WriteFence>,
    /// Where a successful answer's body goes as it arrives, instead of into
    /// [`Response::body`] (left empty): see [`BodySink`].
    pub sink: Option<BodySink<'a>>,
    /// The adaptive limit this request's attempts take a slot of
    /// (`limiter.rs`): page writes and ranged reads; `None` for the rest
    /// (leases, properties), which never wait behind data.
    pub limit: Option<Limit>,
}

/// Which of the client's adaptive limits a request counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    /// Put Page, Clear Pages.
    Writes,
    /// Ranged Get Blob.
    Reads,
}

/// Takes a body part by part as it comes off the connection: `(at, bytes)`,
/// `at` the offset of `bytes` in the body. Parts come in order; a retried
/// request sends the body again from 0. Bytes past the expected length may
/// come (the answer is then a failure and retried): the sink ignores them.
pub type BodySink<'a> = &'a (dyn Fn(u64, &[u8]) + Send + Sync);

impl<'a> Request<'a> {
    pub(crate) fn new(op: &'static str, method: Method, resource: Resource<'a>) -> Self {
        Request {
            op,
            method,
            resource,
            query: Vec::new(),
            headers: Vec::new(),
            body: Bytes::new(),
            expect_body_len: None,
            fence: None,
            sink: None,
            limit: None,
        }
    }

    /// Count this request's attempts against the client's limit `limit`.
    pub(crate) fn limited(mut self, limit: Limit) -> Self {
        self.limit = Some(limit);
        self
    }

    /// Fence this write: it carries `x-ms-if-sequence-number-le`, and an
    /// unknown outcome raises the blob's number before the next write.
    pub(crate) fn fenced(mut self, fence: Option<&'a WriteFence>) -> Self {
        self.fence = fence;
        self
    }

    fn lease_id(&self) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == "x-ms-lease-id")
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn query(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.query.push((name, value.into()));
        self
    }

    pub(crate) fn header(mut self, name: &str, value: impl Into<String>) -> Self {
        self.headers.push((name.to_ascii_lowercase(), value.into()));
        self
    }

    pub(crate) fn lease(self, lease_id: Option<&str>) -> Self {
        match lease_id {
            Some(id) => self.header("x-ms-lease-id", id),
            None => self,
        }
    }

    pub(crate) fn body(mut self, body: Bytes) -> Self {
        self.body = body;
        self
    }
}

/// A successful answer, body read in full.
pub(crate) struct Response {
    pub headers: HeaderMap,
    pub body: Bytes,
    /// How long the attempt that answered took from when it could go (its
    /// slot of the limiter taken, its token ready) to its last body byte:
    /// no wait for a slot, no retry's back-off. What a link's round trip
    /// and rate are measured from.
    pub took: Duration,
}

impl Response {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

struct Inner {
    account: Account,
    http: reqwest::Client,
    retries: AtomicU64,
    /// The token cache, for an account signed in with Microsoft Entra ID.
    tokens: Option<TokenCache>,
    /// Page writes (Put Page, Clear Pages) in flight, adaptive.
    writes: Limiter,
    /// Ranged reads (Get Blob) in flight, adaptive.
    reads: Limiter,
}

/// An Azure Blob REST client for one account. Cheap to clone: clones share
/// one connection pool and one retry counter.
#[derive(Clone)]
pub struct BlobClient {
    inner: Arc<Inner>,
    policy: RetryPolicy,
}

impl std::fmt::Debug for BlobClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobClient")
            .field("account", &self.inner.account)
            .field("policy", &self.policy)
            .finish()
    }
}

impl BlobClient {
    /// A client for `account` with the default retry policy.
    ///
    /// Refuses a plain-HTTP endpoint unless it is development storage or the
    /// account allows it (`--allow-http`); trusts the system's root
    /// certificates plus the account's `--ca-file`.
    pub fn new(account: Account) -> Result<Self> {
        let config =
            |msg: String| Error::other(ErrorKind::Config, "create client", &account.name, msg);
        if account.endpoint.scheme() == "http"
            && !account.is_development()
            && !account.options.allow_http
        {
            return Err(config(format!(
                "refusing plain HTTP to {}: requests, data and credentials would travel unencrypted; use an https:// endpoint, or pass --allow-http for a trusted test endpoint",
                account.endpoint.host_str().unwrap_or_default()
            )));
        }
        let builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(50))
            .tcp_nodelay(true);
        let http = trust_ca_file(builder, &account)
            .map_err(config)?
            .build()
            .map_err(|e| config(format!("cannot build the HTTP client: {}", e.without_url())))?;
        let tokens = match &account.credential {
            Credential::Token(p) => Some(TokenCache::new(
                p.clone(),
                account.options.token_refresh_margin,
            )),
            _ => None,
        };
        Ok(BlobClient {
            inner: Arc::new(Inner {
                account,
                http,
                retries: AtomicU64::new(0),
                tokens,
                writes: Limiter::default(),
                reads: Limiter::default(),
            }),
            policy: RetryPolicy::from_env(),
        })
    }

    /// Access tokens fetched so far (0 unless signed in with Microsoft Entra ID).
    pub fn token_fetches(&self) -> u64 {
        self.inner.tokens.as_ref().map_or(0, TokenCache::fetches)
    }

    /// The current bearer token, fetching one when needed; `None` for the
    /// other credentials.
    async fn bearer(&self, op: &'static str, target: &str) -> Result<Option<Secret>> {
        let Some(cache) = &self.inner.tokens else {
            return Ok(None);
        };
        match cache.token(&self.inner.http).await {
            Ok(t) => Ok(Some(t)),
            Err(e) => Err(Error::other(
                ErrorKind::Credential,
                op,
                target,
                format!(
                    "cannot sign in to account '{}' with Microsoft Entra ID: {e}",
                    self.inner.account.name
                ),
            )),
        }
    }

    /// The same client (same connections and counter) with another retry policy.
    pub fn with_retry(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The retry policy in force.
    pub fn retry_policy(&self) -> RetryPolicy {
        self.policy
    }

    /// The account name.
    pub fn account_name(&self) -> &str {
        &self.inner.account.name
    }

    /// The account (name, endpoint, credential).
    pub fn account(&self) -> &Account {
        &self.inner.account
    }

    fn limiter(&self, limit: Limit) -> &Limiter {
        match limit {
            Limit::Writes => &self.inner.writes,
            Limit::Reads => &self.inner.reads,
        }
    }

    /// The limit of page writes and of ranged reads this client keeps in
    /// flight now (see `limiter.rs`).
    pub fn concurrency_limits(&self) -> (usize, usize) {
        (self.inner.writes.limit(), self.inner.reads.limit())
    }

    /// Retries made so far by this client and its clones.
    pub fn retries(&self) -> u64 {
        self.inner.retries.load(Ordering::Relaxed)
    }

    fn target(&self, r: &Resource<'_>) -> String {
        match r {
            Resource::Account => self.inner.account.name.clone(),
            Resource::Container(c) => c.to_string(),
            Resource::Blob(p) => p.to_string(),
        }
    }

    /// The URL path as sent (encoded) and the full URL with the query.
    fn url(&self, req: &Request<'_>, server_timeout: u64) -> (String, String) {
        let ep = &self.inner.account.endpoint;
        let base_path = ep.path().trim_end_matches('/');
        let path = match &req.resource {
            Resource::Account => format!("{base_path}/"),
            Resource::Container(c) => format!("{base_path}/{}", encode_component(c)),
            Resource::Blob(p) => format!("{base_path}/{}", p.url_path()),
        };
        let mut url = format!(
            "{}://{}{}",
            ep.scheme(),
            &ep[url::Position::BeforeHost..url::Position::AfterPort],
            path
        );
        let mut sep = '?';
        for (k, v) in self.full_query(req, server_timeout) {
            url.push(sep);
            url.push_str(k);
            url.push('=');
            url.push_str(&encode_component(&v));
            sep = '&';
        }
        if let Credential::Sas(token) = &self.inner.account.credential {
            if !token.is_empty() {
                url.push(sep);
                url.push_str(token);
            }
        }
        (path, url)
    }

    fn full_query(&self, req: &Request<'_>, server_timeout: u64) -> Vec<(&'static str, String)> {
        let mut q = req.query.clone();
        q.push(("timeout", server_timeout.to_string()));
        if let Resource::Blob(BlobPath {
            snapshot: Some(s), ..
        }) = &req.resource
        {
            q.push(("snapshot", s.clone()));
        }
        q
    }

    /// Send `req`, retrying transient failures. Returns the outcome and the
    /// number of attempts made (callers use it to recognise the answer to a
    /// retried request whose first attempt may have succeeded).
    ///
    /// Every attempt carries a server-side `timeout` below its client-side
    /// limit, so the service abandons work the client no longer waits for.
    /// A fenced write (`Request::fenced`) also carries the blob's sequence
    /// number as a condition; see `fence.rs` for the protocol.
    pub(crate) async fn execute(&self, req: Request<'_>) -> (Result<Response>, u32) {
        let started = Instant::now();
        let target = self.target(&req.resource);
        let mut attempt = 0u32;
        let mut token_renewed = false;
        let mut fence_refusals = 0u32;
        loop {
            attempt += 1;
            // Page writes and ranged reads take a slot of the client's
            // limit for their kind, retries too: after a 503 every drive
            // of the client sends less (`limiter.rs`). The slot comes
            // first, as its wait can be long: the fence number, the
            // armed guard and the attempt's time are taken only once the
            // request can go, so a wait never sends a number another
            // attempt's raise has passed, never leaves a queued write
            // armed, and is counted against `max_total`.
            let slot = match req.limit {
                Some(l) => Some(self.limiter(l).acquire().await),
                None => None,
            };
            let remaining = self.policy.max_total.saturating_sub(started.elapsed());
            let timeout = self
                .policy
                .attempt_timeout
                .min(remaining.max(Duration::from_secs(1)));
            let bearer = match self.bearer(req.op, &target).await {
                Ok(b) => b,
                Err(e) => return (Err(e), attempt),
            };
            let sent_seq = match req.fence {
                Some(fence) => match self.fence_ready(fence, &req).await {
                    Ok(seq) => Some(seq),
                    Err(e) => return (Err(e), attempt),
                },
                None => None,
            };
            let in_flight = req
                .fence
                .zip(sent_seq)
                .map(|(fence, seq)| InFlight::arm(fence, seq));
            let sent = Instant::now();
            let outcome = self
                .attempt(&req, &target, timeout, bearer.as_ref(), sent_seq)
                .await
                .map(|mut r| {
                    r.took = sent.elapsed();
                    r
                });
            if let Some(slot) = slot {
                slot.finish(match &outcome {
                    Ok(_) => Signal::Answered,
                    Err(f) if f.error.is_overload() => Signal::Overloaded,
                    Err(f) if f.error.kind == ErrorKind::Service => Signal::Answered,
                    Err(_) => Signal::Unanswered,
                });
            }
            if let Some(guard) = in_flight {
                // Left armed (outcome unknown) only when the request may
                // have reached the service without an answer coming back.
                match &outcome {
                    Ok(resp) => guard.disarm(Some(resp.header("etag").map(str::to_string))),
                    Err(f) if !f.may_have_landed => guard.disarm(None),
                    Err(_) => {}
                }
            }
            // A token the service calls expired or invalid (clock skew, a
            // revoked token): drop it and try once more with a fresh one.
            if let (Err(f), Some(used), Some(cache)) = (&outcome, &bearer, &self.inner.tokens) {
                if !token_renewed && f.error.is_stale_token() {
                    debug!(operation = req.op, target = %target, code = ?f.error.code(), "access token refused; fetching a new one");
                    cache.invalidate(used);
                    token_renewed = true;
                    attempt -= 1;
                    continue;
                }
            }
            // Refused by the fence: it did not land. After a raise of ours
            // it goes again at once with the new number.
            if let (Err(f), Some(fence), Some(seq)) = (&outcome, req.fence, sent_seq) {
                if f.error.code() == Some("SequenceNumberConditionNotMet") && fence_refusals < 3 {
                    fence_refusals += 1;
                    let raised = fence.refused(seq);
                    debug!(operation = req.op, target = %target, seq, raised, "write refused by the sequence-number fence; sending again");
                    attempt -= 1;
                    continue;
                }
            }
            let retryable = match &outcome {
                Ok(_) => false,
                Err(f) => f.short_body || f.error.is_transient(),
            };
            if !retryable {
                return (outcome.map_err(|f| f.error), attempt);
            }
            let mut err = outcome
                .err()
                .expect("a retryable outcome is an error")
                .error;
            let delay = self.policy.delay(attempt);
            let out_of_time = started.elapsed() + delay > self.policy.max_total;
            if attempt >= self.policy.max_attempts || out_of_time {
                if attempt > 1 {
                    err.message = format!(
                        "{} (gave up after {attempt} attempts in {:.1} s)",
                        err.message,
                        started.elapsed().as_secs_f64()
                    );
                }
                return (Err(err), attempt);
            }
            debug!(operation = req.op, target = %target, attempt, delay_ms = delay.as_millis() as u64, error = %err, "retrying");
            self.inner.retries.fetch_add(1, Ordering::Relaxed);
            crate::metrics::count_retry(&target, err.status, err.code.as_deref());
            tokio::time::sleep(delay).await;
        }
    }

    /// The sequence number a fenced write carries now: learns it first when
    /// unknown, and raises the blob's number first when a write's outcome
    /// is unknown.
    async fn fence_ready(&self, fence: &WriteFence, req: &Request<'_>) -> Result<u64> {
        let Resource::Blob(path) = &req.resource else {
            return Err(self.invalid(
                req.op,
                &self.target(&req.resource),
                "only blob writes can be fenced".into(),
            ));
        };
        self.fence_now(path, fence, req.lease_id()).await
    }

    /// Makes `fence` ready for a write to `path` now: learns the blob's
    /// sequence number when unknown, and raises it first when the fence
    /// asks (a new fence always does once, see `fence.rs`). Returns the
    /// number writes carry.
    pub async fn fence_now(
        &self,
        path: &BlobPath,
        fence: &WriteFence,
        lease_id: Option<&str>,
    ) -> Result<u64> {
        loop {
            match fence.step() {
                FenceStep::Send(seq) => return Ok(seq),
                FenceStep::Learn => {
                    let props = Box::pin(self.get_properties(path)).await?;
                    fence.observed(props.sequence_number.unwrap_or(0));
                }
                FenceStep::Raise(_) => {
                    let failed_before = fence.raise_failures();
                    let _one_at_a_time = fence.raising().await;
                    // A raise that failed while this writer waited (storage
                    // silent for a whole retry budget) is this writer's
                    // answer too: sent again one after the other, the
                    // writers of one pass would each wait a budget.
                    if fence.raise_failures() != failed_before {
                        return Err(Error::other(
                            ErrorKind::Transport,
                            "raise sequence number",
                            path.to_string(),
                            "storage did not answer the raise of the sequence number",
                        ));
                    }
                    // Another writer may have raised it while we waited.
                    if let FenceStep::Raise(floor) = fence.step() {
                        // A change of the blob like a page write: the
                        // lineage's ETag follows it (`fence.rs`).
                        let change = fence.change();
                        let raised =
                            Box::pin(self.raise_sequence_number_etag(path, floor, lease_id)).await;
                        change.ended(match &raised {
                            Ok((_, etag)) => ChangeEnd::Landed(etag.clone()),
                            Err(_) => ChangeEnd::Unknown,
                        });
                        if raised.is_err() {
                            fence.raise_failed();
                        }
                        let seq = raised?.0;
                        debug!(target = %path, seq, "sequence number raised: writes of unknown outcome are fenced");
                        fence.observed(seq.max(floor));
                    }
                }
            }
        }
    }

    /// One attempt, with `timeout` on the client side and a shorter one
    /// for the service; a fenced write carries `seq` as its condition.
    async fn attempt(
        &self,
        req: &Request<'_>,
        target: &str,
        timeout: Duration,
        bearer: Option<&Secret>,
        seq: Option<u64>,
    ) -> std::result::Result<Response, Failed> {
        let account = &self.inner.account;
        let server_timeout = server_timeout_secs(timeout);
        let (path, url) = self.url(req, server_timeout);
        let mut headers = req.headers.clone();
        if let Some(seq) = seq {
            headers.push(("x-ms-if-sequence-number-le".into(), seq.to_string()));
        }
        headers.push(("x-ms-version".into(), API_VERSION.into()));
        headers.push((
            "x-ms-date".into(),
            httpdate::fmt_http_date(SystemTime::now()),
        ));
        if let Credential::SharedKey { key } = &account.credential {
            let query: Vec<(String, String)> = self
                .full_query(req, server_timeout)
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
            let authz = auth::authorization(
                &account.name,
                key,
                &Signable {
                    method: req.method.as_str(),
                    headers: &headers,
                    content_length: req.body.len() as u64,
                    account: &account.name,
                    url_path: &path,
                    query: &query,
                },
            );
            headers.push(("authorization".into(), authz));
        }
        let mut map = HeaderMap::with_capacity(headers.len());
        for (k, v) in &headers {
            let name = HeaderName::from_bytes(k.as_bytes()).map_err(|_| {
                Failed::unsent(self.invalid(req.op, target, format!("bad header name {k:?}")))
            })?;
            let value = HeaderValue::from_str(v).map_err(|_| {
                Failed::unsent(self.invalid(
                    req.op,
                    target,
                    format!("header {k} has a value HTTP cannot carry"),
                ))
            })?;
            map.insert(name, value);
        }
        if let Some(token) = bearer {
            let mut value =
                HeaderValue::from_str(&format!("Bearer {}", token.expose())).map_err(|_| {
                    Failed::unsent(Error::other(
                        ErrorKind::Credential,
                        req.op,
                        target,
                        "the access token has characters HTTP cannot carry",
                    ))
                })?;
            value.set_sensitive(true);
            map.insert(reqwest::header::AUTHORIZATION, value);
        }
        if req.body.is_empty() && req.method == Method::PUT {
            // hyper omits a zero Content-Length; the service requires it on
            // Put Blob (411) and Azurite answers 400 without it.
            map.insert(
                reqwest::header::CONTENT_LENGTH,
                HeaderValue::from_static("0"),
            );
        }
        let started = Instant::now();
        let sent = self
            .inner
            .http
            .request(req.method.clone(), url)
            .headers(map)
            .body(req.body.clone())
            .timeout(timeout)
            .send()
            .await;
        let resp = match sent {
            Ok(r) => r,
            Err(e) => {
                // A request that never connected cannot land; any other
                // failure may have reached the service.
                let may_have_landed = !e.is_connect();
                let error = self.transport(req.op, target, e);
                debug!(method = %req.method, operation = req.op, target, error = %error.message, "request failed");
                return Err(Failed {
                    error,
                    short_body: false,
                    may_have_landed,
                });
            }
        };
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let success = (200..300).contains(&status);
        let sink = req.sink.filter(|_| success);
        // A successful answer to a request that knows its length may not be
        // longer; any other body (a listing, an error) is bounded too.
        let limit = match req.expect_body_len {
            Some(want) if success => want,
            _ => MAX_BODY_BYTES,
        };
        let (body, body_len) = match read_body(resp, sink, limit).await {
            Ok(b) => b,
            Err(BodyError::Transport(e)) => {
                let err = self.transport(req.op, target, e);
                debug!(method = %req.method, operation = req.op, target, status, error = %err.message, "body read failed");
                // The status came: the service decided the request.
                return Err(Failed::answered(err));
            }
            Err(BodyError::TooLong) => {
                let err = Error::other(
                    ErrorKind::Protocol,
                    req.op,
                    target,
                    format!("the answer's body runs past the {limit} bytes it may hold"),
                );
                debug!(method = %req.method, operation = req.op, target, status, error = %err.message, "body too long");
                return Err(Failed {
                    error: err,
                    // A ranged read answered with the wrong length is
                    // retried, as a short one is.
                    short_body: success && req.expect_body_len.is_some(),
                    may_have_landed: false,
                });
            }
        };
        // The service's id of the request (`x-ms-request-id`), which Azure
        // support asks for; absent from answers that did not come from it.
        let request_id = headers.get("x-ms-request-id").and_then(|v| v.to_str().ok());
        debug!(
            method = %req.method,
            operation = req.op,
            target,
            status,
            request_id,
            bytes_out = req.body.len(),
            bytes_in = body_len,
            ms = started.elapsed().as_millis() as u64,
            "request"
        );
        if (200..300).contains(&status) {
            if let Some(want) = req.expect_body_len {
                if body_len != want {
                    let e = Error::other(
                        ErrorKind::Protocol,
                        req.op,
                        target,
                        format!("short body: got {body_len} of {want} bytes"),
                    );
                    return Err(Failed {
                        error: e,
                        short_body: true,
                        may_have_landed: false,
                    });
                }
            }
            return Ok(Response {
                headers,
                body,
                took: Duration::ZERO,
            });
        }
        // 503 and 429 are refusals before any work; other 5xx and 408
        // (an operation that timed out in the service) may have been done.
        let may_have_landed = (status >= 500 && status != 503) || status == 408;
        Err(Failed {
            error: self.service_error(req.op, target, status, &headers, &body),
            short_body: false,
            may_have_landed,
        })
    }

    fn invalid(&self, op: &'static str, target: &str, msg: String) -> Error {
        Error::other(ErrorKind::InvalidInput, op, target, msg)
    }

    fn transport(&self, op: &'static str, target: &str, e: reqwest::Error) -> Error {
        let what = if e.is_timeout() {
            "timed out"
        } else if e.is_connect() {
            "could not connect"
        } else {
            "connection failed"
        };
        // Without its URL: the URL may hold a SAS signature.
        let e = e.without_url();
        let mut msg = format!("{what}: {e}");
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            msg.push_str(": ");
            msg.push_str(&s.to_string());
            src = s.source();
        }
        let host = self.inner.account.endpoint.host_str().unwrap_or_default();
        if super::error::is_certificate_problem(&msg) {
            // Not transient: retrying cannot make the certificate trusted.
            let hint = match &self.inner.account.options.ca_file {
                Some(ca) => format!("it is not signed by the system's roots nor by {}", ca.path.display()),
                None => "if the endpoint uses a private CA, pass its root certificate with --ca-file PEM".to_string(),
            };
            return Error::other(
                ErrorKind::Tls,
                op,
                target,
                format!("the TLS certificate of {host} is not trusted ({msg}); {hint}"),
            );
        }
        Error::other(
            ErrorKind::Transport,
            op,
            target,
            format!("{msg} (endpoint {host})"),
        )
    }

    fn service_error(
        &self,
        op: &'static str,
        target: &str,
        status: u16,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Error {
        let parsed = xml::parse_error(body);
        let code = headers
            .get("x-ms-error-code")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .or_else(|| parsed.as_ref().and_then(|(c, _)| c.clone()));
        let service_msg = parsed
            .map(|(_, m)| m.lines().next().unwrap_or_default().trim().to_string())
            .unwrap_or_default();
        let detail = xml::parse_error_detail(body);
        let message = match status {
            401 | 403 => self.auth_failure(code.as_deref(), detail.as_deref()),
            _ if !service_msg.is_empty() => service_msg,
            _ => reqwest::StatusCode::from_u16(status)
                .ok()
                .and_then(|s| s.canonical_reason())
                .unwrap_or("")
                .to_string(),
        };
        let mut e = Error::service(op, target, status, code, message);
        e.detail = detail;
        e
    }

    /// What to say when the service refuses the credentials (401/403).
    fn auth_failure(&self, code: Option<&str>, detail: Option<&str>) -> String {
        let name = &self.inner.account.name;
        let detail = detail
            .map(|d| format!(" ({})", d.lines().next().unwrap_or_default().trim()))
            .unwrap_or_default();
        match (&self.inner.tokens, code) {
            (Some(cache), Some("AuthorizationPermissionMismatch" | "AuthorizationFailure")) => format!(
                "the identity signed in with {} may not do this on account '{name}': give it a data role on the account or container, such as 'Storage Blob Data Contributor' (read-write; 'Storage Blob Data Reader' for read-only use); new role assignments take a few minutes to apply",
                cache.source_name()
            ),
            (Some(cache), _) => format!(
                "the service refused the access token from {} for account '{name}'{detail}: check that the identity is in the account's tenant and that the account allows Microsoft Entra sign-in",
                cache.source_name()
            ),
            (None, Some(c @ ("AuthorizationPermissionMismatch" | "AuthorizationResourceTypeMismatch" | "AuthorizationServiceMismatch")))
                if matches!(self.inner.account.credential, Credential::Sas(_)) =>
            {
                format!(
                    "the SAS token for account '{name}' does not allow this operation ({c}): blobdrive needs read permission for info, download and read-only mounts of a drive (list too for a container or its snapshots), and write, create and delete too to create drives and mount them read-write (with a read-only SAS, mount with --read-only)"
                )
            }
            (None, _) => format!(
                "the service refused the credentials for account '{name}'{detail}: check the account key or SAS token (and that it allows this operation)"
            ),
        }
    }
}

/// Does a transport error's text say the server's certificate was refused?
/// How one attempt failed.
struct Failed {
    error: Error,
    /// A success status with a body shorter or longer than asked for:
    /// retried although its kind is `Protocol`.
    short_body: bool,
    /// The request may have been carried out without its answer reaching
    /// us (a fenced write must then be fenced).
    may_have_landed: bool,
}

impl Failed {
    /// Failed before anything was sent.
    fn unsent(error: Error) -> Self {
        Failed {
            error,
            short_body: false,
            may_have_landed: false,
        }
    }

    /// Failed with the service's answer in hand.
    fn answered(error: Error) -> Self {
        Failed::unsent(error)
    }
}

/// The service-side `timeout` (whole seconds) for an attempt the client
/// waits `client` for: three quarters of it, so the service gives up first,
/// and at most 30 s, the most the service honours for most operations
/// (longer values are cut to 30 s anyway; writes get 10 minutes per MiB).
fn server_timeout_secs(client: Duration) -> u64 {
    (client.as_secs() * 3 / 4).clamp(1, 30)
}

/// Most bytes read of a body whose length the request does not know in
/// advance (listings, page lists, error bodies): a listing page of 5,000
/// blobs with their metadata is a few MiB.
pub const MAX_BODY_BYTES: u64 = 64 * 1024 * 1024;

/// Why a body could not be read.
enum BodyError {
    /// The connection failed.
    Transport(reqwest::Error),
    /// More bytes came than the limit allows.
    TooLong,
}

/// The body of `resp` and its length, at most `limit` bytes (more is
/// [`BodyError::TooLong`], and reading stops there). The `Content-Length`
/// the answer announces only sizes the buffer, and never beyond `limit`: a
/// broken or hostile server announcing a petabyte must not make us
/// allocate it. With a `sink` every part goes there as it arrives and the
/// returned body is empty: a Get fills the cache's blocks straight from the
/// connection's buffers, with no body in between. Otherwise a large body is
/// gathered into a pooled buffer (`crate::buffers`), so a stream of 4 MiB
/// Gets reuses warm memory instead of faulting in fresh pages for each body.
async fn read_body(
    mut resp: reqwest::Response,
    sink: Option<BodySink<'_>>,
    limit: u64,
) -> std::result::Result<(Bytes, u64), BodyError> {
    if let Some(sink) = sink {
        let mut at = 0u64;
        while let Some(chunk) = resp.chunk().await.map_err(BodyError::Transport)? {
            sink(at, &chunk);
            at += chunk.len() as u64;
            if at > limit {
                return Err(BodyError::TooLong);
            }
        }
        return Ok((Bytes::new(), at));
    }
    let announced = resp.content_length().unwrap_or(0).min(limit);
    let mut buf = crate::buffers::take(usize::try_from(announced).unwrap_or(usize::MAX));
    while let Some(chunk) = resp.chunk().await.map_err(BodyError::Transport)? {
        if (buf.len() + chunk.len()) as u64 > limit {
            return Err(BodyError::TooLong);
        }
        buf.extend_from_slice(&chunk);
    }
    let n = buf.len() as u64;
    Ok((crate::buffers::freeze(buf), n))
}

/// `builder` also trusting the account's CA file (`--ca-file`), when it
/// names one; the error is the line to show.
pub(crate) fn trust_ca_file(
    builder: reqwest::ClientBuilder,
    account: &Account,
) -> std::result::Result<reqwest::ClientBuilder, String> {
    let Some(ca) = &account.options.ca_file else {
        return Ok(builder);
    };
    let certs = reqwest::Certificate::from_pem_bundle(&ca.pem).map_err(|e| {
        format!(
            "the CA file {} is unusable: {}",
            ca.path.display(),
            e.without_url()
        )
    })?;
    Ok(builder.tls_certs_merge(certs))
}
