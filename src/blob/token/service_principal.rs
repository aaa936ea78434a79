//! Service principal (app registration) sign-in with the OAuth 2.0
//! client-credentials grant at Microsoft Entra ID's v2.0 token endpoint
//! (`{authority}/{tenant}/oauth2/v2.0/token`), proving itself with a client
//! secret, a certificate (a signed client assertion), or a federated token
//! (workload identity: a token the platform writes to a file, such as the
//! service account token an AKS pod gets, sent as the client assertion).
//!
//! Reads the variables the Azure SDKs use: `AZURE_TENANT_ID`,
//! `AZURE_CLIENT_ID`, `AZURE_CLIENT_SECRET` or `AZURE_CLIENT_CERTIFICATE_PATH`
//! or `AZURE_FEDERATED_TOKEN_FILE`, and `AZURE_AUTHORITY_HOST` (sovereign
//! clouds; tests). Invariants: the secret, the key and the federated token
//! are sent only in the POST body to the authority and are scrubbed from
//! every message; the federated token file is read again for every token
//! (the kubelet rotates it).

use std::path::{Path, PathBuf};
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
    /// A file holding a federated token (workload identity), read afresh
    /// for each token request.
    FederatedToken(PathBuf),
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
        // Tenant and client id without a secret or certificate, but with a
        // federated token file, are workload identity's, not ours.
        let federated = lookup("AZURE_FEDERATED_TOKEN_FILE").is_some();
        if secret.is_none() && cert.is_none() && (tenant.is_none() || federated) {
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
        check_tenant(tenant.as_deref().expect("checked above"))?;
        let authority = authority_from_lookup(lookup)?;
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

    /// Workload identity from the environment: `AZURE_FEDERATED_TOKEN_FILE`
    /// with `AZURE_TENANT_ID` and `AZURE_CLIENT_ID` (what AKS injects into a
    /// pod whose service account is federated with an app). `Ok(None)` when
    /// the token file is not named; an error names what is missing.
    pub fn workload_identity_from_lookup(
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, String> {
        let Some(file) = lookup("AZURE_FEDERATED_TOKEN_FILE") else {
            return Ok(None);
        };
        let tenant = lookup("AZURE_TENANT_ID");
        let client = lookup("AZURE_CLIENT_ID");
        let missing: Vec<&str> = [("AZURE_TENANT_ID", &tenant), ("AZURE_CLIENT_ID", &client)]
            .iter()
            .filter(|(_, v)| v.is_none())
            .map(|(n, _)| *n)
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "workload identity's variables are incomplete: AZURE_FEDERATED_TOKEN_FILE is set but {} not",
                missing.join(" and ")
            ));
        }
        check_tenant(tenant.as_deref().expect("checked above"))?;
        // Absolute now: a mount's daemon reads it later from `/`.
        let file = std::path::absolute(&file)
            .map_err(|e| format!("AZURE_FEDERATED_TOKEN_FILE cannot be used: {e}"))?;
        Ok(Some(ServicePrincipal {
            authority: authority_from_lookup(lookup)?,
            tenant: tenant.expect("checked above"),
            client_id: client.expect("checked above"),
            credential: SpSecret::FederatedToken(file),
        }))
    }

    /// The client-credentials form (and the secret in it, to scrub). A
    /// certificate's assertion is signed now; a federated token is read now.
    async fn form(&self, token_url: &str) -> Result<(Secret, Secret), String> {
        let assertion = match &self.credential {
            SpSecret::Secret(_) => None,
            SpSecret::Certificate(c) => Some(Secret::new(
                c.signing.assertion(&self.client_id, token_url)?,
            )),
            SpSecret::FederatedToken(path) => Some(read_federated_token(path).await?),
        };
        let mut form = url::form_urlencoded::Serializer::new(String::new());
        form.append_pair("grant_type", "client_credentials")
            .append_pair("client_id", &self.client_id)
            .append_pair("scope", STORAGE_SCOPE);
        let proof = match (&self.credential, assertion) {
            (_, Some(assertion)) => {
                form.append_pair(
                    "client_assertion_type",
                    "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
                )
                .append_pair("client_assertion", assertion.expose());
                assertion
            }
            (SpSecret::Secret(s), None) => {
                form.append_pair("client_secret", s.expose());
                s.clone()
            }
            (_, None) => unreachable!("only a secret comes without an assertion"),
        };
        Ok((Secret::new(form.finish()), proof))
    }

    /// The tenant's v2.0 token endpoint.
    pub fn token_url(&self) -> Result<Url, String> {
        let base = self.authority.as_str().trim_end_matches('/');
        let tenant: String = url::form_urlencoded::byte_serialize(self.tenant.as_bytes()).collect();
        Url::parse(&format!("{base}/{tenant}/oauth2/v2.0/token"))
            .map_err(|e| format!("cannot build the token URL: {e}"))
    }
}

/// Is `tenant` a tenant id or domain (a GUID, `contoso.onmicrosoft.com`)?
/// It becomes a segment of the token URL's path, so anything else (a `/`,
/// `..`, `?`) could send the request elsewhere on the authority.
fn check_tenant(tenant: &str) -> Result<(), String> {
    let fits = !tenant.is_empty()
        && tenant != "."
        && tenant != ".."
        && tenant
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-');
    if fits {
        Ok(())
    } else {
        Err(
            "AZURE_TENANT_ID is not a tenant id or domain name (letters, digits, '.' and '-' only)"
                .into(),
        )
    }
}

/// `AZURE_AUTHORITY_HOST`, or the public cloud's: https, or plain HTTP on
/// loopback only (a local stand-in in tests).
fn authority_from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Url, String> {
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
    Ok(authority)
}

/// The most a federated token file may hold (a service account token is
/// about 1 KB).
const MAX_FEDERATED_TOKEN: u64 = 64 * 1024;
/// How long one read of the file may take. The read runs while the token
/// cache holds its refresh lock, so every blob request waits on it: a
/// stalled network filesystem must not hold them for ever.
const FEDERATED_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The pause before reading an empty or unreadable file once more.
const FEDERATED_REREAD_DELAY: Duration = Duration::from_millis(200);

/// The federated token in `path`, read now: the platform replaces the file
/// before the token in it expires, so an old copy must not be kept. An
/// empty or unreadable file is read once more after a short pause (a
/// platform that rewrites the file in place shows it empty for a moment).
async fn read_federated_token(path: &Path) -> Result<Secret, String> {
    match read_federated_token_once(path).await {
        Err(ReadFailure::Retry(_)) => {
            tokio::time::sleep(FEDERATED_REREAD_DELAY).await;
            read_federated_token_once(path)
                .await
                .map_err(ReadFailure::message)
        }
        other => other.map_err(ReadFailure::message),
    }
}

/// Why one read of the federated token file failed.
enum ReadFailure {
    /// Empty or unreadable: worth one more read.
    Retry(String),
    /// Not a regular file, too large, not text, too slow.
    Final(String),
}

impl ReadFailure {
    fn message(self) -> String {
        match self {
            ReadFailure::Retry(m) | ReadFailure::Final(m) => m,
        }
    }
}

/// The message for the federated token file at `path` and `what` is wrong.
fn token_file_problem(path: &Path, what: &str) -> String {
    format!(
        "the federated token file {} (AZURE_FEDERATED_TOKEN_FILE) {what}",
        path.display()
    )
}

async fn read_federated_token_once(path: &Path) -> Result<Secret, ReadFailure> {
    let owned = path.to_path_buf();
    // Blocking file calls, off the runtime's threads: a read that never
    // returns (a stalled network filesystem) then holds one blocking
    // thread, and the time limit still answers.
    let read = tokio::task::spawn_blocking(move || read_bounded(&owned));
    let text = match tokio::time::timeout(FEDERATED_READ_TIMEOUT, read).await {
        Err(_) => {
            return Err(ReadFailure::Final(token_file_problem(
                path,
                &format!(
                    "could not be read within {} s",
                    FEDERATED_READ_TIMEOUT.as_secs()
                ),
            )))
        }
        Ok(Err(e)) => {
            return Err(ReadFailure::Final(token_file_problem(
                path,
                &format!("could not be read: {e}"),
            )))
        }
        Ok(Ok(result)) => result?,
    };
    let token = text.trim();
    if token.is_empty() {
        return Err(ReadFailure::Retry(token_file_problem(path, "is empty")));
    }
    Ok(Secret::new(token))
}

/// Read the regular file at `path` (symbolic links followed, as the
/// kubelet's are), at most [`MAX_FEDERATED_TOKEN`] bytes. A FIFO or a
/// device is refused before it is read, so it cannot block or stream.
fn read_bounded(path: &Path) -> Result<String, ReadFailure> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let unreadable = |e: std::io::Error| {
        ReadFailure::Retry(format!(
            "cannot read the federated token file {} (AZURE_FEDERATED_TOKEN_FILE): {e}",
            path.display()
        ))
    };
    let not_regular = || ReadFailure::Final(token_file_problem(path, "is not a regular file"));
    if !std::fs::metadata(path).map_err(unreadable)?.is_file() {
        return Err(not_regular());
    }
    // O_NONBLOCK: should a FIFO take the file's place after the check, the
    // open does not wait for a writer (and the check below refuses it).
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(unreadable)?;
    if !file.metadata().map_err(unreadable)?.is_file() {
        return Err(not_regular());
    }
    let mut bytes = Vec::new();
    file.take(MAX_FEDERATED_TOKEN + 1)
        .read_to_end(&mut bytes)
        .map_err(unreadable)?;
    if bytes.len() as u64 > MAX_FEDERATED_TOKEN {
        return Err(ReadFailure::Final(token_file_problem(
            path,
            &format!(
                "is larger than {} KiB: not a token",
                MAX_FEDERATED_TOKEN / 1024
            ),
        )));
    }
    String::from_utf8(bytes)
        .map_err(|_| ReadFailure::Final(token_file_problem(path, "is not text")))
}

#[async_trait::async_trait]
impl TokenProvider for ServicePrincipal {
    fn name(&self) -> String {
        let how = match &self.credential {
            SpSecret::Secret(_) => "secret",
            SpSecret::Certificate(_) => "certificate",
            SpSecret::FederatedToken(_) => {
                return format!("workload identity {}", self.client_id);
            }
        };
        format!("service principal {} ({how})", self.client_id)
    }

    async fn fetch(&self, http: &reqwest::Client) -> Result<AccessToken, TokenError> {
        let name = self.name();
        let fail = |m: String| TokenError::new(TokenErrorKind::Failed, &name, m);
        let url = self.token_url().map_err(fail)?;
        let (form, proof) = self.form(url.as_str()).await.map_err(fail)?;
        let req = TokenRequest {
            source: &name,
            method: reqwest::Method::POST,
            url,
            headers: Vec::new(),
            form: Some(form),
            timeout: Duration::from_secs(30),
            attempts: 4,
            secrets: vec![proof],
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
    fn a_tenant_that_is_not_an_id_or_domain_is_refused() {
        for bad in ["..", ".", "a/b", "t?x=1", "t#", "t%2F..", "", "t t"] {
            let sp: &'static [(&str, &str)] = Box::leak(Box::new([
                ("AZURE_TENANT_ID", bad),
                ("AZURE_CLIENT_ID", "c"),
                ("AZURE_CLIENT_SECRET", "s3cret-value"),
            ]));
            let e = ServicePrincipal::from_lookup(&env(sp)).unwrap_err();
            assert!(
                e.contains("AZURE_TENANT_ID is not a tenant id"),
                "{bad:?}: {e}"
            );
            let wi: &'static [(&str, &str)] = Box::leak(Box::new([
                ("AZURE_TENANT_ID", bad),
                ("AZURE_CLIENT_ID", "c"),
                ("AZURE_FEDERATED_TOKEN_FILE", "/t"),
            ]));
            let e = ServicePrincipal::workload_identity_from_lookup(&env(wi)).unwrap_err();
            assert!(
                e.contains("AZURE_TENANT_ID is not a tenant id"),
                "{bad:?}: {e}"
            );
        }
        for good in [
            "72f988bf-86f1-41af-91ab-2d7cd011db47",
            "contoso.onmicrosoft.com",
        ] {
            assert_eq!(check_tenant(good), Ok(()));
        }
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

    #[test]
    fn workload_identity_variables_are_not_taken_for_a_service_principal() {
        let vars = &[
            ("AZURE_TENANT_ID", "t"),
            ("AZURE_CLIENT_ID", "c"),
            ("AZURE_FEDERATED_TOKEN_FILE", "/var/run/secrets/token"),
        ];
        assert!(ServicePrincipal::from_lookup(&env(vars)).unwrap().is_none());
        let wi = ServicePrincipal::workload_identity_from_lookup(&env(vars))
            .unwrap()
            .unwrap();
        assert_eq!(wi.name(), "workload identity c");
        let relative = &[
            ("AZURE_TENANT_ID", "t"),
            ("AZURE_CLIENT_ID", "c"),
            ("AZURE_FEDERATED_TOKEN_FILE", "token"),
        ];
        let wi_rel = ServicePrincipal::workload_identity_from_lookup(&env(relative))
            .unwrap()
            .unwrap();
        match wi_rel.credential {
            SpSecret::FederatedToken(p) => {
                assert_eq!(p, std::env::current_dir().unwrap().join("token"))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(wi.authority.as_str(), "https://login.microsoftonline.com/");
        let e = ServicePrincipal::workload_identity_from_lookup(&env(&[(
            "AZURE_FEDERATED_TOKEN_FILE",
            "/t",
        )]))
        .unwrap_err();
        assert!(e.contains("AZURE_TENANT_ID and AZURE_CLIENT_ID"), "{e}");
        assert!(ServicePrincipal::workload_identity_from_lookup(&env(&[]))
            .unwrap()
            .is_none());
    }

    #[tokio::test]
    async fn an_unreadable_or_empty_token_file_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        let e = read_federated_token(&path).await.unwrap_err();
        assert!(e.contains("cannot read") && e.contains("token"), "{e}");
        std::fs::write(&path, "\n").unwrap();
        let e = read_federated_token(&path).await.unwrap_err();
        assert!(e.contains("is empty"), "{e}");
        std::fs::write(&path, "fed.token.value\n").unwrap();
        let t = read_federated_token(&path).await.unwrap();
        assert_eq!(t.expose(), "fed.token.value");
    }

    #[tokio::test]
    async fn a_token_file_that_is_not_a_small_regular_file_is_refused_without_reading_it() {
        let dir = tempfile::tempdir().unwrap();
        // A FIFO with no writer: reading it would wait for ever.
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read_federated_token(&fifo).await.unwrap_err();
        assert!(e.contains("is not a regular file"), "{e}");
        // An endless device.
        let e = read_federated_token(Path::new("/dev/zero"))
            .await
            .unwrap_err();
        assert!(e.contains("is not a regular file"), "{e}");
        // Too large to be a token.
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'a'; 64 * 1024 + 1]).unwrap();
        let e = read_federated_token(&big).await.unwrap_err();
        assert!(e.contains("larger than 64 KiB"), "{e}");
        // A symbolic link to a token (the kubelet's layout) is followed.
        let real = dir.path().join("real");
        std::fs::write(&real, "linked.token").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(
            read_federated_token(&link).await.unwrap().expose(),
            "linked.token"
        );
    }

    #[tokio::test]
    async fn a_token_file_seen_empty_while_it_is_rewritten_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "").unwrap();
        let writer = {
            let path = path.clone();
            std::thread::spawn(move || {
                // Well within the pause before the second read.
                std::thread::sleep(Duration::from_millis(50));
                std::fs::write(&path, "rewritten.token").unwrap();
            })
        };
        let token = read_federated_token(&path).await;
        writer.join().unwrap();
        assert_eq!(token.unwrap().expose(), "rewritten.token");
    }
}
