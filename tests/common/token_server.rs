//! A small Microsoft Entra ID stand-in on loopback (plain HTTP, or HTTPS
//! with a test CA's certificate; its own thread and runtime, so blocking
//! tests can use it too). It speaks:
//! - the managed-identity protocol of IMDS: `GET /metadata/identity/oauth2/token
//!   ?api-version=2018-02-01&resource=...` with `Metadata: true`;
//! - the App Service / Arc variant: `GET /msi/token?api-version=2019-08-01
//!   &resource=...` with `X-IDENTITY-HEADER`;
//! - the client-credentials grant: `POST /{tenant}/oauth2/v2.0/token` with a
//!   client secret, a signed client assertion (a certificate's: its JWT
//!   header names the certificate) or another assertion (a federated token,
//!   as workload identity sends; refused, it quotes that assertion back);
//! - and, under `/denied/`, a blob endpoint that refuses every request with
//!   403 `AuthorizationPermissionMismatch` (a missing role assignment).
//!
//! It mints unsigned JWTs that Azurite's `--oauth basic` accepts (audience
//! `https://storage.azure.com`, issuer `https://sts.windows.net/{tenant}/`),
//! counts requests, and remembers every token and assertion it issued.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::https_azurite::TestPki;

/// The tenant the server pretends to be.
pub const TENANT: &str = "72f988bf-86f1-41af-91ab-2d7cd011db47";
/// The service principal's client id.
pub const CLIENT_ID: &str = "0b7e1a53-5d2c-4c1e-9f57-3c1f2b9e4d10";
/// The only client secret the server accepts.
pub const CLIENT_SECRET: &str = "Qx8~sEcReT-client-value-never-print-me.42";
/// The App Service identity header the server expects.
pub const IDENTITY_HEADER: &str = "idh-5f1c9a3e-never-print-me";

/// What the server saw and how it behaves.
#[derive(Default)]
pub struct State {
    /// Lifetime of the tokens it issues, seconds.
    pub lifetime_s: AtomicI64,
    /// Issue tokens whose JWT `exp` is already past (while `expires_in`
    /// still claims `lifetime_s`): the service will call them expired.
    pub lie_about_expiry: AtomicBool,
    /// Refuse every token request with an AADSTS error.
    pub refuse: AtomicBool,
    /// Token requests, by kind (`imds`, `app-service`, `secret`,
    /// `certificate`, `federated`).
    pub requests: Mutex<HashMap<&'static str, u64>>,
    /// Every token issued.
    pub tokens: Mutex<Vec<String>>,
    /// Every client assertion received.
    pub assertions: Mutex<Vec<String>>,
    /// Requests the `/denied/` blob endpoint answered.
    pub denied: AtomicU64,
}

impl State {
    /// Token requests of `kind` so far.
    pub fn count(&self, kind: &str) -> u64 {
        *self.requests.lock().unwrap().get(kind).unwrap_or(&0)
    }

    fn bump(&self, kind: &'static str) {
        *self.requests.lock().unwrap().entry(kind).or_default() += 1;
    }
}

/// The running server; stops when dropped.
pub struct TokenServer {
    /// `http://127.0.0.1:PORT` (`https://` from [`TokenServer::start_https`]).
    pub url: String,
    /// Shared state.
    pub state: Arc<State>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TokenServer {
    /// Start on a free loopback port, issuing tokens that live `lifetime_s`.
    pub fn start(lifetime_s: i64) -> TokenServer {
        Self::start_with("127.0.0.1:0", lifetime_s, None)
    }

    /// As [`TokenServer::start`], on `addr` (such as IMDS's own
    /// `169.254.169.254:80`, inside a test's network namespace).
    pub fn start_at(addr: &str, lifetime_s: i64) -> TokenServer {
        Self::start_with(addr, lifetime_s, None)
    }

    /// As [`TokenServer::start`], over HTTPS with `pki`'s server
    /// certificate (valid for 127.0.0.1), as a real authority is.
    pub fn start_https(lifetime_s: i64, pki: &TestPki) -> TokenServer {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        use tokio_rustls::rustls;
        let certs = CertificateDer::pem_file_iter(&pki.cert_path)
            .expect("server certificate")
            .collect::<Result<Vec<_>, _>>()
            .expect("server certificate");
        let key = PrivateKeyDer::from_pem_file(&pki.key_path).expect("server key");
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("TLS configuration");
        Self::start_with(
            "127.0.0.1:0",
            lifetime_s,
            Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))),
        )
    }

    fn start_with(
        addr: &str,
        lifetime_s: i64,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> TokenServer {
        let state = Arc::new(State::default());
        state.lifetime_s.store(lifetime_s, Ordering::SeqCst);
        let listener = std::net::TcpListener::bind(addr).expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{}", listener.local_addr().unwrap());
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let st = state.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                loop {
                    tokio::select! {
                        _ = &mut stopped => break,
                        accepted = listener.accept() => {
                            if let Ok((sock, _)) = accepted {
                                let st = st.clone();
                                match tls.clone() {
                                    None => drop(tokio::spawn(serve(sock, st))),
                                    Some(acceptor) => drop(tokio::spawn(async move {
                                        if let Ok(sock) = acceptor.accept(sock).await {
                                            serve(sock, st).await;
                                        }
                                    })),
                                }
                            }
                        }
                    }
                }
            });
        });
        TokenServer {
            url,
            state,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The IMDS token endpoint (for `BLOBDRIVE_IMDS_ENDPOINT`).
    pub fn imds_endpoint(&self) -> String {
        format!("{}/metadata/identity/oauth2/token", self.url)
    }

    /// The App Service endpoint (for `IDENTITY_ENDPOINT`).
    pub fn identity_endpoint(&self) -> String {
        format!("{}/msi/token", self.url)
    }

    /// Every token issued so far.
    pub fn tokens(&self) -> Vec<String> {
        self.state.tokens.lock().unwrap().clone()
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct HttpRequest {
    method: String,
    path: String,
    query: HashMap<String, String>,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

async fn read_request<S: AsyncRead + Unpin>(sock: &mut S) -> Option<HttpRequest> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_string();
    let target = first.next()?.to_string();
    let mut headers = HashMap::new();
    for l in lines {
        if let Some((k, v)) = l.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let len: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    let url = url::Url::parse(&format!("http://x{target}")).ok()?;
    Some(HttpRequest {
        method,
        path: url.path().to_string(),
        query: url.query_pairs().into_owned().collect(),
        headers,
        body,
    })
}

async fn respond<S: AsyncWrite + Unpin>(
    sock: &mut S,
    status: u16,
    extra: &str,
    content_type: &str,
    body: &str,
) {
    let text = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = sock.write_all(text.as_bytes()).await;
    let _ = sock.shutdown().await;
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn mint(state: &State) -> String {
    let life = state.lifetime_s.load(Ordering::SeqCst);
    let exp = if state.lie_about_expiry.swap(false, Ordering::SeqCst) {
        now() - 30
    } else {
        now() + life
    };
    let header = serde_json::json!({"typ": "JWT", "alg": "RS256", "kid": "test"});
    let claims = serde_json::json!({
        "aud": "https://storage.azure.com",
        "iss": format!("https://sts.windows.net/{TENANT}/"),
        "iat": now() - 60,
        "nbf": now() - 60,
        "exp": exp,
        "tid": TENANT,
        "oid": uuid::Uuid::new_v4().to_string(),
        "uti": uuid::Uuid::new_v4().simple().to_string(),
    });
    let token = format!(
        "{}.{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string()),
        URL_SAFE_NO_PAD.encode(b"not-a-real-signature")
    );
    state.tokens.lock().unwrap().push(token.clone());
    token
}

const JSON: &str = "application/json";

fn refusal() -> (u16, String) {
    (
        400,
        serde_json::json!({
            "error": "unauthorized_client",
            "error_description": format!("AADSTS700016: Application with identifier '{CLIENT_ID}' was not found in the directory '{TENANT}'.\r\nTrace ID: 0f1e2d3c\r\nCorrelation ID: 4b5a6978\r\nTimestamp: 2026-01-01 00:00:00Z"),
            "error_codes": [700016],
        })
        .to_string(),
    )
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin>(mut sock: S, state: Arc<State>) {
    let Some(req) = read_request(&mut sock).await else {
        return;
    };
    let resource_ok =
        req.query.get("resource").map(String::as_str) == Some("https://storage.azure.com/");
    let (status, body, ctype, extra) = if req.path.starts_with("/denied/") {
        state.denied.fetch_add(1, Ordering::SeqCst);
        (
            403,
            "<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>AuthorizationPermissionMismatch</Code><Message>This request is not authorized to perform this operation using this permission.</Message></Error>".to_string(),
            "application/xml",
            "x-ms-error-code: AuthorizationPermissionMismatch\r\n",
        )
    } else if req.method == "GET" && req.path == "/metadata/identity/oauth2/token" {
        state.bump("imds");
        if req.headers.get("metadata").map(String::as_str) != Some("true")
            || req.query.get("api-version").map(String::as_str) != Some("2018-02-01")
            || !resource_ok
        {
            (400, r#"{"error":"invalid_request","error_description":"Required metadata header not specified"}"#.to_string(), JSON, "")
        } else if state.refuse.load(Ordering::SeqCst) {
            (
                400,
                r#"{"error":"invalid_request","error_description":"Identity not found"}"#
                    .to_string(),
                JSON,
                "",
            )
        } else {
            let life = state.lifetime_s.load(Ordering::SeqCst);
            let body = serde_json::json!({
                "access_token": mint(&state),
                "expires_in": life.to_string(),
                "expires_on": (now() + life).to_string(),
                "resource": "https://storage.azure.com/",
                "token_type": "Bearer",
            });
            (200, body.to_string(), JSON, "")
        }
    } else if req.method == "GET" && req.path == "/msi/token" {
        state.bump("app-service");
        if req.headers.get("x-identity-header").map(String::as_str) != Some(IDENTITY_HEADER)
            || req.query.get("api-version").map(String::as_str) != Some("2019-08-01")
            || !resource_ok
        {
            (401, r#"{"statusCode":401,"message":"Unauthorized: the identity header is missing or wrong"}"#.to_string(), JSON, "")
        } else {
            let life = state.lifetime_s.load(Ordering::SeqCst);
            let body = serde_json::json!({
                "access_token": mint(&state),
                "expires_on": (now() + life).to_string(),
                "resource": "https://storage.azure.com/",
                "token_type": "Bearer",
                "client_id": CLIENT_ID,
            });
            (200, body.to_string(), JSON, "")
        }
    } else if req.method == "POST" && req.path == format!("/{TENANT}/oauth2/v2.0/token") {
        let form: HashMap<String, String> = url::form_urlencoded::parse(&req.body)
            .into_owned()
            .collect();
        let get = |k: &str| form.get(k).map(String::as_str);
        let kind = match get("client_assertion") {
            Some(a) if names_a_certificate(a) => "certificate",
            Some(_) => "federated",
            None => "secret",
        };
        state.bump(kind);
        if state.refuse.load(Ordering::SeqCst) && kind == "federated" {
            // As an authority may: quote the assertion it could not match,
            // decoded and as sent (URL-encoded).
            let body = String::from_utf8_lossy(&req.body);
            let sent = body
                .split('&')
                .find_map(|kv| kv.strip_prefix("client_assertion="))
                .unwrap_or_default();
            let description = format!(
                "AADSTS700211: No matching federated identity record found for presented assertion issuer. Assertion: '{}'. As sent: '{sent}'.\r\nTrace ID: 0f1e2d3c",
                get("client_assertion").unwrap_or_default()
            );
            (
                400,
                serde_json::json!({
                    "error": "invalid_client",
                    "error_description": description,
                    "error_codes": [700211],
                })
                .to_string(),
                JSON,
                "",
            )
        } else if state.refuse.load(Ordering::SeqCst)
            || get("grant_type") != Some("client_credentials")
            || get("scope") != Some("https://storage.azure.com/.default")
            || get("client_id") != Some(CLIENT_ID)
        {
            let (s, b) = refusal();
            (s, b, JSON, "")
        } else if kind == "secret" && get("client_secret") != Some(CLIENT_SECRET) {
            (401, serde_json::json!({
                "error": "invalid_client",
                "error_description": format!("AADSTS7000215: Invalid client secret provided. Ensure the secret being sent in the request is the client secret value, not the client secret ID, for a secret added to app '{CLIENT_ID}'.\r\nTrace ID: 9a8b7c6d"),
                "error_codes": [7000215],
            }).to_string(), JSON, "")
        } else if kind != "secret"
            && get("client_assertion_type")
                != Some("urn:ietf:params:oauth:client-assertion-type:jwt-bearer")
        {
            let (s, b) = refusal();
            (s, b, JSON, "")
        } else {
            if let Some(a) = get("client_assertion") {
                state.assertions.lock().unwrap().push(a.to_string());
            }
            let life = state.lifetime_s.load(Ordering::SeqCst);
            let body = serde_json::json!({
                "token_type": "Bearer",
                "expires_in": life,
                "ext_expires_in": life,
                "access_token": mint(&state),
            });
            (200, body.to_string(), JSON, "")
        }
    } else {
        (404, r#"{"error":"not_found"}"#.to_string(), JSON, "")
    };
    respond(&mut sock, status, extra, ctype, &body).await;
}

/// Is `assertion` a JWT whose header names a certificate (`x5t`), as a
/// certificate's signed assertion is? A federated token is not.
fn names_a_certificate(assertion: &str) -> bool {
    let Some(header) = assertion.split('.').next() else {
        return false;
    };
    URL_SAFE_NO_PAD
        .decode(header)
        .ok()
        .and_then(|h| serde_json::from_slice::<serde_json::Value>(&h).ok())
        .is_some_and(|h| h.get("x5t").is_some())
}
