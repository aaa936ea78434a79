//! Microsoft Entra ID access tokens for the blob client: where tokens come
//! from (service principal, workload identity, managed identity, Azure CLI,
//! Azure Developer CLI, or a chain of them) and the cache that keeps one
//! valid token for all requests of a client.
//!
//! Layering: only `blob/client.rs` asks for tokens (through [`TokenCache`]);
//! nothing above `blob/` sees one. Invariants: a token, client secret,
//! identity header, federated token or certificate key lives in a
//! [`Secret`], whose `Debug` prints `<redacted>` and which has no `Display`;
//! token errors carry the identity service's own error code and
//! description, never a request body.
//!
//! The sources are written here rather than taken from `azure_identity`
//! (the Azure SDK for Rust): ARCHITECTURE.md's sign-in section has the
//! measurements and the reasons.

mod azure_cli;
mod azure_developer_cli;
mod cache;
mod chain;
mod env;
mod http;
mod jwt;
mod managed_identity;
mod service_principal;

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

pub use azure_cli::AzureCli;
pub use azure_developer_cli::AzureDeveloperCli;
pub use cache::{TokenCache, DEFAULT_REFRESH_MARGIN};
pub use chain::Chain;
pub use env::{provider_from_lookup, TokenMode};
pub use managed_identity::{ManagedIdentity, MsiEndpoint, IMDS_ENDPOINT};
pub use service_principal::{
    is_loopback, ClientCertificate, ServicePrincipal, SpSecret, DEFAULT_AUTHORITY,
};

/// The resource (v1 endpoints) whose tokens Azure Storage accepts.
pub const STORAGE_RESOURCE: &str = "https://storage.azure.com/";
/// The scope (v2 endpoints) for Azure Storage.
pub const STORAGE_SCOPE: &str = "https://storage.azure.com/.default";

/// A string that must never be printed: a token, a client secret, an
/// identity header, a key. `Debug` shows `<redacted>`; read it with
/// [`Secret::expose`] only where it is sent.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<str>);

impl Secret {
    /// Wrap a secret value.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(Arc::from(value.into()))
    }

    /// The value, for putting on the wire.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `text` with every occurrence of this secret, as it is and as it
    /// travels in a form or query (URL-encoded), replaced by `<redacted>`
    /// (defence in depth for messages built from a service's answer, which
    /// may quote the request).
    pub fn scrub(&self, text: &str) -> String {
        if self.0.len() < 4 {
            return text.to_string();
        }
        let text = text.replace(&*self.0, "<redacted>");
        let form: String = url::form_urlencoded::byte_serialize(self.0.as_bytes()).collect();
        let mut text = text.replace(&form, "<redacted>");
        // Percent-encoding also comes with lower-case hex digits.
        let lower_hex = lower_percent_hex(&form);
        if lower_hex != form {
            text = text.replace(&lower_hex, "<redacted>");
        }
        text
    }
}

/// `encoded` with the hex digits of its `%XX` escapes in lower case.
fn lower_percent_hex(encoded: &str) -> String {
    let mut out = String::with_capacity(encoded.len());
    let mut hex_left = 0;
    for c in encoded.chars() {
        if hex_left > 0 {
            out.push(c.to_ascii_lowercase());
            hex_left -= 1;
        } else {
            if c == '%' {
                hex_left = 2;
            }
            out.push(c);
        }
    }
    out
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A bearer token and when it stops working.
#[derive(Clone, Debug)]
pub struct AccessToken {
    /// The token (a JWT), sent as `Authorization: Bearer`.
    pub token: Secret,
    /// When the service stops accepting it.
    pub expires_at: SystemTime,
}

/// Why no token could be had, coarsely: it decides whether a chain tries
/// the next source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenErrorKind {
    /// This source is not set up here (variables missing, no metadata
    /// endpoint, `az` not installed or not logged in): try the next one.
    Unavailable,
    /// The identity service answered and refused (bad secret, unknown
    /// client, no identity assigned): stop and say so.
    Refused,
    /// Anything else (malformed answer, transport failure after retries).
    Failed,
}

/// A failure to get a token. The message holds the identity service's own
/// error and description, never a secret.
#[derive(Debug, Clone)]
pub struct TokenError {
    /// Coarse classification.
    pub kind: TokenErrorKind,
    /// Which source failed, e.g. `managed identity`.
    pub source_name: String,
    /// What happened.
    pub message: String,
}

impl TokenError {
    pub(crate) fn new(kind: TokenErrorKind, source: &str, message: impl Into<String>) -> Self {
        TokenError {
            kind,
            source_name: source.to_string(),
            message: message.into(),
        }
    }
}

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.source_name, self.message)
    }
}

impl std::error::Error for TokenError {}

/// A source of access tokens for Azure Storage. Implementations hold only
/// configuration (no connection, no runtime), so an account can be built
/// before the daemon forks and used after; the HTTP client is passed in.
#[async_trait::async_trait]
pub trait TokenProvider: Send + Sync + fmt::Debug {
    /// A short name for messages: `managed identity`, `Azure CLI`, ...
    fn name(&self) -> String;

    /// Ask the source for a new token for [`STORAGE_RESOURCE`].
    async fn fetch(&self, http: &reqwest::Client) -> Result<AccessToken, TokenError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrub_redacts_a_secret_plain_and_url_encoded() {
        let s = Secret::new("a~b/c+d=e f");
        let text = "plain a~b/c+d=e f, form a%7Eb%2Fc%2Bd%3De+f, lower a%7eb%2fc%2bd%3de+f";
        assert_eq!(
            s.scrub(text),
            "plain <redacted>, form <redacted>, lower <redacted>"
        );
    }
}
