//! One token request over HTTP, shared by the managed-identity and
//! service-principal sources: send with a time limit, retry what is
//! transient (connection faults, 429, 5xx, IMDS's 410 while it restarts),
//! parse the token answer, and turn a refusal into the service's own
//! `error` / `error_description`. Invariant: the request (which may hold a
//! client secret or an identity header) is never logged or put in an error,
//! and every message is scrubbed of the secrets the caller names.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;
use tracing::debug;

use super::{AccessToken, Secret, TokenError, TokenErrorKind};
use crate::blob::error::is_certificate_problem;
use crate::blob::retry::RetryPolicy;

/// A prepared token request.
pub(crate) struct TokenRequest<'a> {
    /// The source's name for messages.
    pub source: &'a str,
    /// GET (managed identity) or POST (client credentials).
    pub method: reqwest::Method,
    /// The endpoint with its query.
    pub url: url::Url,
    /// Headers; values are secrets where they must be (identity header).
    pub headers: Vec<(&'static str, Secret)>,
    /// `application/x-www-form-urlencoded` body, if any (holds secrets).
    pub form: Option<Secret>,
    /// Time limit of one attempt.
    pub timeout: Duration,
    /// Attempts in all (1 = no retry).
    pub attempts: u32,
    /// Secrets to scrub from any message.
    pub secrets: Vec<Secret>,
}

/// Where the token endpoint lives, for messages (scheme, host and path; no query).
fn where_(url: &url::Url) -> String {
    format!(
        "{}://{}{}",
        url.scheme(),
        &url[url::Position::BeforeHost..url::Position::AfterPort],
        url.path()
    )
}

/// Send `req` and parse the token it returns.
pub(crate) async fn request_token(
    http: &reqwest::Client,
    req: &TokenRequest<'_>,
) -> Result<AccessToken, TokenError> {
    let scrub = |s: String| req.secrets.iter().fold(s, |acc, sec| sec.scrub(&acc));
    let policy = RetryPolicy {
        base_delay: Duration::from_millis(500),
        ..RetryPolicy::default()
    };
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut headers = HeaderMap::new();
        for (k, v) in &req.headers {
            let mut value = HeaderValue::from_str(v.expose()).map_err(|_| {
                TokenError::new(
                    TokenErrorKind::Failed,
                    req.source,
                    format!("header {k} has a value HTTP cannot carry"),
                )
            })?;
            value.set_sensitive(true);
            headers.insert(HeaderName::from_static(k), value);
        }
        let mut builder = http
            .request(req.method.clone(), req.url.clone())
            .headers(headers)
            .timeout(req.timeout);
        if let Some(form) = &req.form {
            builder = builder
                .header(
                    reqwest::header::CONTENT_TYPE,
                    "application/x-www-form-urlencoded",
                )
                .body(form.expose().to_string());
        }
        let outcome = match builder.send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                match resp.bytes().await {
                    Ok(body) => Ok((status, body)),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        };
        let (status, body) = match outcome {
            Ok(x) => x,
            Err(e) => {
                let connect = e.is_connect() || e.is_timeout();
                let msg = scrub(transport_message(e));
                debug!(source = req.source, attempt, error = %msg, "token request failed");
                if is_certificate_problem(&msg) {
                    return Err(TokenError::new(
                        TokenErrorKind::Failed,
                        req.source,
                        format!(
                            "the TLS certificate of {} is not trusted ({msg}); if it uses a private CA, pass its root certificate with --ca-file PEM",
                            where_(&req.url)
                        ),
                    ));
                }
                if attempt < req.attempts {
                    tokio::time::sleep(policy.delay(attempt)).await;
                    continue;
                }
                let kind = if connect {
                    TokenErrorKind::Unavailable
                } else {
                    TokenErrorKind::Failed
                };
                return Err(TokenError::new(
                    kind,
                    req.source,
                    format!("no answer from {}: {msg}", where_(&req.url)),
                ));
            }
        };
        debug!(source = req.source, attempt, status, "token request");
        if (200..300).contains(&status) {
            return parse_token(req.source, &body).map_err(|mut e| {
                e.message = scrub(e.message);
                e
            });
        }
        let transient = status >= 500 || status == 429 || status == 410 || status == 408;
        if transient && attempt < req.attempts {
            tokio::time::sleep(policy.delay(attempt)).await;
            continue;
        }
        let detail = refusal_detail(&body, &scrub);
        let kind = if transient {
            TokenErrorKind::Failed
        } else {
            TokenErrorKind::Refused
        };
        return Err(TokenError::new(
            kind,
            req.source,
            format!(
                "{} refused the token request (HTTP {status}){}",
                where_(&req.url),
                if detail.is_empty() {
                    String::new()
                } else {
                    format!(": {detail}")
                }
            ),
        ));
    }
}

/// A transport error's chain of causes on one line, without the URL.
pub(crate) fn transport_message(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

/// The longest service description put in a message (bytes).
const MAX_DETAIL: usize = 600;

/// `line` cut to at most `max` bytes (on a character boundary), with `...`
/// when something was cut.
fn cut(line: &str, max: usize) -> String {
    if line.len() <= max {
        return line.to_string();
    }
    let mut end = max;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &line[..end])
}

/// The service's words from an error answer `body`, scrubbed by `scrub`
/// and then cut to [`MAX_DETAIL`]. Scrubbing comes first: a cut made before
/// could split a secret the service echoed (an authority may quote the
/// client assertion) and leave its first part, which no longer matches.
fn refusal_detail(body: &[u8], scrub: &dyn Fn(String) -> String) -> String {
    cut(&scrub(service_error(body)), MAX_DETAIL)
}

/// The service's own words from an error answer: OAuth's `error` and
/// `error_description` (Entra ID, IMDS), App Service's `message`, else the
/// first line of the body. Multi-line descriptions are folded into one
/// line, whole: the caller scrubs secrets from it, then cuts it.
fn service_error(body: &[u8]) -> String {
    let fold = |s: &str| {
        let one: Vec<&str> = s.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        one.join(" ")
    };
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        let code = v.get("error").and_then(|e| match e {
            Value::String(s) => Some(s.clone()),
            Value::Object(o) => o.get("code").and_then(Value::as_str).map(str::to_string),
            _ => None,
        });
        let desc = v
            .get("error_description")
            .and_then(Value::as_str)
            .or_else(|| v.get("message").and_then(Value::as_str))
            .or_else(|| {
                v.get("error")
                    .and_then(|e| e.get("message"))
                    .and_then(Value::as_str)
            });
        return match (code, desc) {
            (Some(c), Some(d)) => format!("{c}: {}", fold(d)),
            (Some(c), None) => c,
            (None, Some(d)) => fold(d),
            (None, None) => String::new(),
        };
    }
    fold(String::from_utf8_lossy(body).lines().next().unwrap_or(""))
}

/// A number that token services send either as JSON number or as a string.
fn number(v: Option<&Value>) -> Option<u64> {
    match v? {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// Parse an OAuth token answer: `access_token` and `expires_in` (seconds
/// from now) or `expires_on` (Unix seconds), as numbers or strings.
pub(crate) fn parse_token(source: &str, body: &[u8]) -> Result<AccessToken, TokenError> {
    let bad = |what: &str| {
        TokenError::new(
            TokenErrorKind::Failed,
            source,
            format!("the token answer is not usable: {what}"),
        )
    };
    let v: Value = serde_json::from_slice(body).map_err(|_| bad("not JSON"))?;
    let token = v
        .get("access_token")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| bad("no access_token"))?;
    let now = SystemTime::now();
    // Checked: a huge number (by mistake or from a hostile endpoint) would
    // overflow `SystemTime` and panic the task that asked for the token.
    let expires_at = if let Some(secs) = number(v.get("expires_in")) {
        now.checked_add(Duration::from_secs(secs))
            .ok_or_else(|| bad("expires_in is out of range"))?
    } else if let Some(epoch) = number(v.get("expires_on")) {
        UNIX_EPOCH
            .checked_add(Duration::from_secs(epoch))
            .ok_or_else(|| bad("expires_on is out of range"))?
    } else {
        return Err(bad("no expires_in or expires_on"));
    };
    Ok(AccessToken {
        token: Secret::new(token),
        expires_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_answers_with_numbers_or_strings() {
        let t = parse_token("x", br#"{"access_token":"abc","expires_in":"3599"}"#).unwrap();
        let left = t.expires_at.duration_since(SystemTime::now()).unwrap();
        assert!(left > Duration::from_secs(3500), "{left:?}");
        let t = parse_token("x", br#"{"access_token":"abc","expires_on":2000000000}"#).unwrap();
        assert_eq!(
            t.expires_at,
            UNIX_EPOCH + Duration::from_secs(2_000_000_000)
        );
        let e = parse_token("x", br#"{"access_token":"abc"}"#).unwrap_err();
        assert!(e.message.contains("expires"), "{e}");
        assert!(!format!("{t:?}").contains("abc"));
    }

    #[test]
    fn an_expiry_past_the_end_of_time_is_refused_not_a_panic() {
        for body in [
            format!(
                r#"{{"access_token":"s3cr3t-abc","expires_in":{}}}"#,
                u64::MAX
            ),
            format!(
                r#"{{"access_token":"s3cr3t-abc","expires_in":"{}"}}"#,
                u64::MAX - 1
            ),
            format!(
                r#"{{"access_token":"s3cr3t-abc","expires_on":{}}}"#,
                u64::MAX
            ),
            // One second past the largest time `SystemTime` holds on Linux.
            format!(
                r#"{{"access_token":"s3cr3t-abc","expires_on":"{}"}}"#,
                i64::MAX as u64 + 1
            ),
        ] {
            let e = parse_token("x", body.as_bytes()).unwrap_err();
            assert_eq!(e.kind, TokenErrorKind::Failed, "{e}");
            assert!(e.message.contains("out of range"), "{e}");
            assert!(!e.to_string().contains("s3cr3t"), "{e}");
        }
    }

    #[test]
    fn an_echoed_long_secret_is_redacted_before_the_description_is_cut() {
        let assertion = format!("eyJhbGciOiJSUzI1NiJ9.{}.sig", "x".repeat(1000));
        let secret = Secret::new(assertion.clone());
        let form: String = url::form_urlencoded::byte_serialize(b"a+b/c~").collect();
        let body = serde_json::json!({
            "error": "invalid_client",
            "error_description": format!("AADSTS700211: no issuer for assertion {assertion} nor {form}"),
        })
        .to_string();
        let plus = Secret::new("a+b/c~");
        let scrub = |s: String| plus.scrub(&secret.scrub(&s));
        let detail = refusal_detail(body.as_bytes(), &scrub);
        assert_eq!(
            detail,
            "invalid_client: AADSTS700211: no issuer for assertion <redacted> nor <redacted>"
        );
        assert!(!detail.contains("eyJ"), "{detail}");
        let long = refusal_detail(
            serde_json::json!({"error_description": "y".repeat(700)})
                .to_string()
                .as_bytes(),
            &|s| s,
        );
        assert_eq!(long.len(), MAX_DETAIL + 3, "{long}");
    }

    #[test]
    fn service_errors_keep_the_description_on_one_line() {
        let s = service_error(
            br#"{"error":"invalid_client","error_description":"AADSTS7000215: Invalid client secret provided.\r\nTrace ID: 1\r\nCorrelation ID: 2"}"#,
        );
        assert_eq!(
            s,
            "invalid_client: AADSTS7000215: Invalid client secret provided. Trace ID: 1 Correlation ID: 2"
        );
        assert_eq!(
            service_error(br#"{"statusCode":400,"message":"No identity"}"#),
            "No identity"
        );
    }
}
