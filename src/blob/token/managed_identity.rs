//! Managed identity: the Azure instance metadata service (IMDS, on VMs and
//! scale sets) or the `IDENTITY_ENDPOINT` / `IDENTITY_HEADER` endpoint that
//! App Service, Functions and Azure Arc provide. A user-assigned identity is
//! chosen by its client id (`AZURE_CLIENT_ID`).
//!
//! Invariant: the identity header is a [`Secret`]; IMDS is plain HTTP on a
//! link-local address by design (it never leaves the host).

use std::time::Duration;

use url::Url;

use super::http::{request_token, TokenRequest};
use super::{AccessToken, Secret, TokenError, TokenErrorKind, TokenProvider, STORAGE_RESOURCE};

/// The instance metadata service's token endpoint.
pub const IMDS_ENDPOINT: &str = "http://169.254.169.254/metadata/identity/oauth2/token";

/// Which managed-identity endpoint to ask.
#[derive(Clone, Debug)]
pub enum MsiEndpoint {
    /// IMDS (`api-version=2018-02-01`, header `Metadata: true`).
    Imds(Url),
    /// App Service / Functions / Arc (`api-version=2019-08-01`, header
    /// `X-IDENTITY-HEADER`).
    IdentityEndpoint {
        /// `IDENTITY_ENDPOINT`.
        url: Url,
        /// `IDENTITY_HEADER`.
        header: Secret,
    },
}

/// Tokens from the managed identity of this machine or app.
#[derive(Clone, Debug)]
pub struct ManagedIdentity {
    /// Where to ask.
    pub endpoint: MsiEndpoint,
    /// A user-assigned identity's client id; `None` for the system-assigned one.
    pub client_id: Option<String>,
    /// Part of a chain: ask with a short time limit and no retries, so a
    /// machine without IMDS moves on quickly.
    pub probe: bool,
}

impl ManagedIdentity {
    /// From the environment: `IDENTITY_ENDPOINT` + `IDENTITY_HEADER` if both
    /// are set, else IMDS at `BLOBDRIVE_IMDS_ENDPOINT` (a test override) or
    /// its well-known address; `AZURE_CLIENT_ID` picks a user-assigned identity.
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, String> {
        let parse = |name: &str, v: &str| {
            Url::parse(v.trim()).map_err(|e| format!("{name} is not a URL: {e}"))
        };
        let endpoint = match (lookup("IDENTITY_ENDPOINT"), lookup("IDENTITY_HEADER")) {
            (Some(url), Some(header)) => MsiEndpoint::IdentityEndpoint {
                url: parse("IDENTITY_ENDPOINT", &url)?,
                header: Secret::new(header),
            },
            _ => MsiEndpoint::Imds(match lookup("BLOBDRIVE_IMDS_ENDPOINT") {
                Some(url) => parse("BLOBDRIVE_IMDS_ENDPOINT", &url)?,
                None => Url::parse(IMDS_ENDPOINT).expect("the IMDS address is a URL"),
            }),
        };
        Ok(ManagedIdentity {
            endpoint,
            client_id: lookup("AZURE_CLIENT_ID"),
            probe: false,
        })
    }
}

#[async_trait::async_trait]
impl TokenProvider for ManagedIdentity {
    fn name(&self) -> String {
        let kind = match &self.endpoint {
            MsiEndpoint::Imds(_) => "managed identity",
            MsiEndpoint::IdentityEndpoint { .. } => "managed identity (IDENTITY_ENDPOINT)",
        };
        match &self.client_id {
            Some(id) => format!("{kind}, client id {id}"),
            None => kind.to_string(),
        }
    }

    async fn fetch(&self, http: &reqwest::Client) -> Result<AccessToken, TokenError> {
        let name = self.name();
        let (mut url, api_version, headers, secrets) = match &self.endpoint {
            MsiEndpoint::Imds(url) => (
                url.clone(),
                "2018-02-01",
                vec![("metadata", Secret::new("true"))],
                vec![],
            ),
            MsiEndpoint::IdentityEndpoint { url, header } => (
                url.clone(),
                "2019-08-01",
                vec![("x-identity-header", header.clone())],
                vec![header.clone()],
            ),
        };
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("api-version", api_version);
            q.append_pair("resource", STORAGE_RESOURCE);
            if let Some(id) = &self.client_id {
                q.append_pair("client_id", id);
            }
        }
        let req = TokenRequest {
            source: &name,
            method: reqwest::Method::GET,
            url,
            headers,
            form: None,
            timeout: if self.probe {
                Duration::from_secs(3)
            } else {
                Duration::from_secs(30)
            },
            attempts: if self.probe { 1 } else { 4 },
            secrets,
        };
        request_token(http, &req).await.map_err(|mut e| {
            // IMDS answers 400 when the machine has no identity (or not the
            // one asked for): in a chain, that means "not here".
            if self.probe && e.kind == TokenErrorKind::Refused {
                e.kind = TokenErrorKind::Unavailable;
            }
            e
        })
    }
}
