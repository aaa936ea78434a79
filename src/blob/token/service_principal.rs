//! Service principal (app registration) sign-in with the OAuth 2.0
//! client-credentials grant at Microsoft Entra ID's v2.0 token endpoint
//! (`{authority}/{tenant}/oauth2/v2.0/token`), proving itself with a client
//! secret or a certificate (a signed client assertion).
//!
//! Reads the variables the Azure SDKs use: `AZURE_TENANT_ID`,
//! `AZURE_CLIENT_ID`, `AZURE_CLIENT_SECRET` or `AZURE_CLIENT_CERTIFICATE_PATH`,
//! and `AZURE_AUTHORITY_HOST` (sovereign clouds; tests). Invariant: the
//! secret and the key are sent only in the POST body to the authority and
//! are scrubbed from every message.

use std::time::Duration;

use url::Url;

use super::http::{request_token, TokenRequest};
use super::jwt::SigningCert;
use super::{AccessToken, Secret, TokenError, TokenErrorKind, TokenProvider, STORAGE_SCOPE};

/// The public cloud's authority.
pub const DEFAULT_AUTHORITY: &str = "https://login.microsoftonline.com";

/// A certificate credential: where it came from and the loaded key.
#[derive(Clone, Debug)]
pub struct ClientCertificate {
    /// The PEM file (for messages).
    pub path: std::path::PathBuf,
    signing: SigningCert,
}

impl ClientCertificate {
    /// Load a PEM file holding the certificate and its RSA private key.
    pub fn load(path: &std::path::Path) -> Result<Self, String> {
        let pem = std::fs::read(path)
            .map_err(|e| format!("cannot read the certificate {}: {e}", path.display()))?;
        let signing = SigningCert::from_pem(&pem)
            .map_err(|e| format!("the certificate {} is unusable: {e}", path.display()))?;
        Ok(ClientCertificate {
            path: path.to_path_buf(),
            signing,
        })
    }
}

/// How the service principal proves itself.
#[derive(Clone, Debug)]
pub enum SpSecret {
    /// A client secret.
    Secret(Secret),
    /// A certificate.
    Certificate(ClientCertificate),
}

/// A service principal.
#[derive(Clone, Debug)]
pub struct ServicePrincipal {
    /// `https://login.microsoftonline.com` or `AZURE_AUTHORITY_HOST`.
    pub authority: Url,
    /// Directory (tenant) id.
    pub tenant: String,
    /// Application (client) id.
    pub client_id: String,
    /// Its proof.
    pub credential: SpSecret,
}

/// Is `url` on this machine (plain HTTP is then acceptable for tests)?
pub fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d == "localhost",
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

impl ServicePrincipal {
    /// From the environment. `Ok(None)` when none of its variables is set;
    /// an error names what is missing or unusable (never a value).
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Option<Self>, String> {
        let tenant = lookup("AZURE_TENANT_ID");
        let client = lookup("AZURE_CLIENT_ID");
        let secret = lookup("AZURE_CLIENT_SECRET");
        let cert = lookup("AZURE_CLIENT_CERTIFICATE_PATH");
        if tenant.is_none() && secret.is_none() && cert.is_none() {
            return Ok(None);
        }
        let mut missing = Vec::new();
        if tenant.is_none() {
            missing.push("AZURE_TENANT_ID");
        }
        if client.is_none() {
            missing.push("AZURE_CLIENT_ID");
        }
        if secret.is_none() && cert.is_none() {
            missing.push("AZURE_CLIENT_SECRET or AZURE_CLIENT_CERTIFICATE_PATH");
        }
        if !missing.is_empty() {
            return Err(format!(
                "the service principal's variables are incomplete: {} not set",
                missing.join(", ")
            ));
        }
        if lookup("AZURE_CLIENT_CERTIFICATE_PASSWORD").is_some() && secret.is_none() {
            return Err("AZURE_CLIENT_CERTIFICATE_PASSWORD is set, but password-protected certificates are not supported: give a PEM with an unencrypted key".into());
        }
        let authority = lookup("AZURE_AUTHORITY_HOST").unwrap_or_else(|| DEFAULT_AUTHORITY.into());
        let authority = Url::parse(authority.trim())
            .map_err(|e| format!("AZURE_AUTHORITY_HOST is not a URL: {e}"))?;
        if authority.scheme() != "https" && !is_loopback(&authority) {
            return Err(format!(
                "AZURE_AUTHORITY_HOST must be an https URL (got {}://{}): the secret would travel unencrypted",
                authority.scheme(),
                authority.host_str().unwrap_or_default()
            ));
        }
        let credential = match (secret, cert) {
            (Some(s), _) => SpSecret::Secret(Secret::new(s)),
            (None, Some(path)) => {
                SpSecret::Certificate(ClientCertificate::load(std::path::Path::new(&path))?)
            }
            (None, None) => unreachable!("checked above"),
        };
        Ok(Some(ServicePrincipal {
            authority,
            tenant: tenant.expect("checked above"),
            client_id: client.expect("checked above"),
            credential,
        }))
    }

    /// The client-credentials form (and the secrets in it, to scrub).
    fn form(&self, token_url: &str) -> Result<(Secret, Vec<Secret>), String> {
        let mut form = url::form_urlencoded::Serializer::new(String::new());
        form.append_pair("grant_type", "client_credentials")
            .append_pair("client_id", &self.client_id)
            .append_pair("scope", STORAGE_SCOPE);
        let proof = match &self.credential {
            SpSecret::Secret(s) => {
                form.append_pair("client_secret", s.expose());
                s.clone()
            }
            SpSecret::Certificate(c) => {
                let assertion = Secret::new(c.signing.assertion(&self.client_id, token_url)?);
                form.append_pair(
                    "client_assertion_type",
                    "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
                )
                .append_pair("client_assertion", assertion.expose());
                assertion
            }
        };
        Ok((Secret::new(form.finish()), vec![proof]))
    }

    /// The tenant's v2.0 token endpoint.
    pub fn token_url(&self) -> Result<Url, String> {
        let base = self.authority.as_str().trim_end_matches('/');
        let tenant: String = url::form_urlencoded::byte_serialize(self.tenant.as_bytes()).collect();
        Url::parse(&format!("{base}/{tenant}/oauth2/v2.0/token"))
            .map_err(|e| format!("cannot build the token URL: {e}"))
    }
}

#[async_trait::async_trait]
impl TokenProvider for ServicePrincipal {
    fn name(&self) -> String {
        let how = match &self.credential {
            SpSecret::Secret(_) => "secret",
            SpSecret::Certificate(_) => "certificate",
        };
        format!("service principal {} ({how})", self.client_id)
    }

    async fn fetch(&self, http: &reqwest::Client) -> Result<AccessToken, TokenError> {
        let name = self.name();
        let fail = |m: String| TokenError::new(TokenErrorKind::Failed, &name, m);
        let url = self.token_url().map_err(fail)?;
        let (form, secrets) = self.form(url.as_str()).map_err(fail)?;
        let req = TokenRequest {
            source: &name,
            method: reqwest::Method::POST,
            url,
            headers: Vec::new(),
            form: Some(form),
            timeout: Duration::from_secs(30),
            attempts: 4,
            secrets,
        };
        request_token(http, &req).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn incomplete_variables_name_what_is_missing_not_values() {
        assert!(ServicePrincipal::from_lookup(&env(&[])).unwrap().is_none());
        let e = ServicePrincipal::from_lookup(&env(&[("AZURE_CLIENT_SECRET", "hunter2-secret")]))
            .unwrap_err();
        assert!(
            e.contains("AZURE_TENANT_ID") && e.contains("AZURE_CLIENT_ID"),
            "{e}"
        );
        assert!(!e.contains("hunter2"), "{e}");
    }

    #[test]
    fn plain_http_authority_is_refused_unless_loopback() {
        let base = [
            ("AZURE_TENANT_ID", "t"),
            ("AZURE_CLIENT_ID", "c"),
            ("AZURE_CLIENT_SECRET", "s3cret-value"),
        ];
        let mut v = base.to_vec();
        v.push(("AZURE_AUTHORITY_HOST", "http://login.example.com"));
        let vars: &'static [(&str, &str)] = Box::leak(v.into_boxed_slice());
        assert!(ServicePrincipal::from_lookup(&env(vars)).is_err());
        let mut v = base.to_vec();
        v.push(("AZURE_AUTHORITY_HOST", "http://127.0.0.1:9999/"));
        let vars: &'static [(&str, &str)] = Box::leak(v.into_boxed_slice());
        let sp = ServicePrincipal::from_lookup(&env(vars)).unwrap().unwrap();
        assert_eq!(
            sp.token_url().unwrap().as_str(),
            "http://127.0.0.1:9999/t/oauth2/v2.0/token"
        );
        assert!(!format!("{sp:?}").contains("s3cret"));
    }
}
