//! Which storage account to talk to and how to prove it: the account name,
//! its blob endpoint, a credential (Shared Key, SAS token, Microsoft Entra
//! token source, or none) and how to connect (extra CA roots, plain HTTP).
//!
//! Owns connection-string parsing and the account-selection order of the
//! design (argument, `AZURE_STORAGE_CONNECTION_STRING`, `AZURE_STORAGE_ACCOUNT`
//! with `AZURE_STORAGE_KEY` or `AZURE_STORAGE_SAS_TOKEN`, else Azurite), and
//! its extension by `--auth` / `AZURE_STORAGE_AUTH_MODE` and `--account`
//! ([`Account::from_env_with`]). Invariant: no error message and no `Debug`
//! output contains a key, a SAS signature, a client secret or a token.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use url::Url;

use super::error::{Error, ErrorKind, Result};
use super::token::{self, TokenProvider};

/// Azurite's well-known development account name.
pub const DEV_ACCOUNT_NAME: &str = "devstoreaccount1";
/// Azurite's well-known development account key (public, documented by Microsoft).
pub const DEV_ACCOUNT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
/// Azurite's blob endpoint on loopback.
pub const DEV_BLOB_ENDPOINT: &str = "http://127.0.0.1:10000/devstoreaccount1";

const OP: &str = "configure account";

/// A storage account: its name, blob endpoint and credential.
#[derive(Clone)]
pub struct Account {
    /// Account name, e.g. `devstoreaccount1`.
    pub name: String,
    /// Blob endpoint, e.g. `http://127.0.0.1:10000/devstoreaccount1` (path
    /// style, Azurite) or `https://NAME.blob.core.windows.net`.
    pub endpoint: Url,
    /// How requests are authorized.
    pub credential: Credential,
    /// How the client connects (CA roots, plain HTTP, token refresh).
    pub options: ClientOptions,
}

/// How a client connects, besides which account.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Extra trusted root certificates (`--ca-file`), added to the system's.
    pub ca_file: Option<CaFile>,
    /// Allow plain HTTP to an account other than local development storage
    /// (`--allow-http`).
    pub allow_http: bool,
    /// Refresh an access token this long before it expires (or at half its
    /// life, when that is sooner).
    pub token_refresh_margin: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            ca_file: None,
            allow_http: false,
            token_refresh_margin: token::DEFAULT_REFRESH_MARGIN,
        }
    }
}

/// A PEM file of root certificates, read and checked when the account is built.
#[derive(Clone)]
pub struct CaFile {
    /// Where it came from (for messages).
    pub path: PathBuf,
    /// Its contents.
    pub pem: Arc<Vec<u8>>,
}

impl fmt::Debug for CaFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CaFile({})", self.path.display())
    }
}

impl CaFile {
    /// Read `path` and check that it holds at least one PEM certificate.
    pub fn load(path: &std::path::Path) -> Result<CaFile> {
        let target = path.display().to_string();
        let pem = std::fs::read(path)
            .map_err(|e| config_error(&target, format!("cannot read the CA file: {e}")))?;
        match reqwest::Certificate::from_pem_bundle(&pem) {
            Ok(certs) if !certs.is_empty() => Ok(CaFile {
                path: path.to_path_buf(),
                pem: Arc::new(pem),
            }),
            _ => Err(config_error(
                &target,
                "the CA file holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            )),
        }
    }
}

/// How to sign in (`--auth`, or `AZURE_STORAGE_AUTH_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// Shared Key: `AZURE_STORAGE_KEY` or a connection string's `AccountKey`.
    Key,
    /// SAS token: `AZURE_STORAGE_SAS_TOKEN` or a connection string's signature.
    Sas,
    /// Microsoft Entra ID, first available of: service principal from the
    /// environment, workload identity, managed identity, Azure CLI, Azure
    /// Developer CLI.
    Login,
    /// Microsoft Entra ID through the managed identity (IMDS or `IDENTITY_ENDPOINT`).
    Msi,
    /// Microsoft Entra ID as a service principal (secret or certificate).
    Sp,
    /// Microsoft Entra ID through workload identity federation (a federated
    /// token file, `AZURE_FEDERATED_TOKEN_FILE`, as on AKS).
    Workload,
    /// Microsoft Entra ID through the Azure CLI's login (`az login`).
    Cli,
    /// Microsoft Entra ID through the Azure Developer CLI's login (`azd auth login`).
    Azd,
}

impl AuthMode {
    /// Every mode's name, as `--auth` takes it.
    pub const NAMES: [&'static str; 8] =
        ["key", "sas", "login", "msi", "sp", "workload", "cli", "azd"];

    fn token_mode(self) -> Option<token::TokenMode> {
        match self {
            AuthMode::Key | AuthMode::Sas => None,
            AuthMode::Login => Some(token::TokenMode::Login),
            AuthMode::Msi => Some(token::TokenMode::ManagedIdentity),
            AuthMode::Sp => Some(token::TokenMode::ServicePrincipal),
            AuthMode::Workload => Some(token::TokenMode::WorkloadIdentity),
            AuthMode::Cli => Some(token::TokenMode::AzureCli),
            AuthMode::Azd => Some(token::TokenMode::AzureDeveloperCli),
        }
    }
}

impl std::str::FromStr for AuthMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "key" => AuthMode::Key,
            "sas" => AuthMode::Sas,
            "login" => AuthMode::Login,
            "msi" | "managed-identity" => AuthMode::Msi,
            "sp" | "service-principal" => AuthMode::Sp,
            "workload" | "workload-identity" => AuthMode::Workload,
            "cli" | "azure-cli" => AuthMode::Cli,
            "azd" | "azure-developer-cli" => AuthMode::Azd,
            other => {
                return Err(format!(
                    "unknown sign-in mode '{other}' (one of {})",
                    AuthMode::NAMES.join(", ")
                ))
            }
        })
    }
}

/// Account selection beyond the connection string: the global flags
/// `--auth`, `--account`, `--ca-file` and `--allow-http`.
#[derive(Debug, Clone, Default)]
pub struct AccountOptions {
    /// `--auth`; `None` reads `AZURE_STORAGE_AUTH_MODE`, else the classic order.
    pub auth: Option<AuthMode>,
    /// `--account`: an account name or a blob endpoint URL.
    pub account: Option<String>,
    /// `--ca-file`.
    pub ca_file: Option<PathBuf>,
    /// `--allow-http`.
    pub allow_http: bool,
}

/// How requests are authorized.
#[derive(Clone)]
pub enum Credential {
    /// Shared Key: the decoded account key.
    SharedKey {
        /// The account key, base64-decoded.
        key: Vec<u8>,
    },
    /// A SAS token: the query string, without a leading `?`.
    Sas(String),
    /// Microsoft Entra ID bearer tokens from this source.
    Token(Arc<dyn TokenProvider>),
    /// No credential (public containers only).
    Anonymous,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credential::SharedKey { .. } => f.write_str("SharedKey { key: <redacted> }"),
            Credential::Sas(token) => write!(f, "Sas({:?})", redact_sas(token)),
            Credential::Token(p) => write!(f, "Token({})", p.name()),
            Credential::Anonymous => f.write_str("Anonymous"),
        }
    }
}

impl fmt::Debug for Account {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Account")
            .field("name", &self.name)
            .field("endpoint", &self.endpoint.as_str())
            .field("credential", &self.credential)
            .field("options", &self.options)
            .finish()
    }
}

/// A SAS query string with the signature replaced by `<redacted>`, for logs.
pub fn redact_sas(token: &str) -> String {
    token
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if k.eq_ignore_ascii_case("sig") => format!("{k}=<redacted>"),
            _ => kv.to_string(),
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// The blob endpoint of a blob URL: its scheme, host and port, plus the
/// account segment of a path-style URL (an IP address or `localhost`, as
/// Azurite's are); no path below it, no query.
fn endpoint_of_blob_url(url: &Url) -> Url {
    let mut endpoint = url.clone();
    endpoint.set_query(None);
    endpoint.set_fragment(None);
    let host = url.host_str().unwrap_or_default();
    let path_style =
        host == "localhost" || host.parse::<std::net::IpAddr>().is_ok() || host.starts_with('[');
    let account_segment = if path_style {
        url.path_segments()
            .and_then(|mut p| p.find(|s| !s.is_empty()))
            .map(|a| format!("/{a}"))
            .unwrap_or_default()
    } else {
        String::new()
    };
    endpoint.set_path(&account_segment);
    endpoint
}

fn config_error(target: &str, message: impl Into<String>) -> Error {
    Error::other(ErrorKind::Config, OP, target, message)
}

fn decode_key(account: &str, key: &str) -> Result<Vec<u8>> {
    base64::engine::general_purpose::STANDARD
        .decode(key.trim())
        .map_err(|_| config_error(account, "the account key is not valid base64"))
}

fn parse_endpoint(account: &str, s: &str) -> Result<Url> {
    let url = Url::parse(s.trim())
        .map_err(|e| config_error(account, format!("blob endpoint is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(config_error(
            account,
            "blob endpoint must be an http(s) URL with a host",
        ));
    }
    if url.query().is_some() {
        return Err(config_error(
            account,
            "blob endpoint must not carry a query string (pass a SAS token separately)",
        ));
    }
    Ok(url)
}

/// The account name an endpoint implies: the first path segment for a
/// path-style endpoint on an IP address or `localhost` (Azurite), otherwise
/// the first label of the host name.
fn account_from_endpoint(url: &Url) -> Option<String> {
    let host = url.host_str()?;
    let path_style =
        host == "localhost" || host.parse::<std::net::IpAddr>().is_ok() || host.starts_with('[');
    if path_style {
        url.path_segments()?
            .find(|s| !s.is_empty())
            .map(str::to_string)
    } else {
        host.split('.').next().map(str::to_string)
    }
}

impl Account {
    /// The Azurite development account on loopback, with its well-known key.
    pub fn development() -> Account {
        Account {
            name: DEV_ACCOUNT_NAME.to_string(),
            endpoint: Url::parse(DEV_BLOB_ENDPOINT)
                .expect("the development endpoint is a valid URL"),
            credential: Credential::SharedKey {
                key: base64::engine::general_purpose::STANDARD
                    .decode(DEV_ACCOUNT_KEY)
                    .expect("the development key is valid base64"),
            },
            options: ClientOptions::default(),
        }
    }

    /// An account with a Shared Key on the public cloud endpoint
    /// `https://NAME.blob.core.windows.net`.
    pub fn with_shared_key(name: &str, key_base64: &str) -> Result<Account> {
        let key = decode_key(name, key_base64)?;
        Ok(Account {
            name: name.to_string(),
            endpoint: cloud_endpoint(name, "https", "core.windows.net")?,
            credential: Credential::SharedKey { key },
            options: ClientOptions::default(),
        })
    }

    /// An account with a SAS token on the public cloud endpoint.
    pub fn with_sas(name: &str, sas: &str) -> Result<Account> {
        Ok(Account {
            name: name.to_string(),
            endpoint: cloud_endpoint(name, "https", "core.windows.net")?,
            credential: Credential::Sas(sas.trim().trim_start_matches('?').to_string()),
            options: ClientOptions::default(),
        })
    }

    /// Parse an Azure Storage connection string: `AccountName`, `AccountKey`,
    /// `BlobEndpoint`, `DefaultEndpointsProtocol`, `EndpointSuffix`,
    /// `SharedAccessSignature`, or `UseDevelopmentStorage=true`. Keys are
    /// matched case-insensitively; other keys (`QueueEndpoint`, ...) are ignored.
    pub fn from_connection_string(s: &str) -> Result<Account> {
        let target = "connection string";
        let mut name = None;
        let mut key = None;
        let mut sas = None;
        let mut blob_endpoint = None;
        let mut protocol = None;
        let mut suffix = None;
        let mut dev = false;
        let mut any = false;
        for (i, part) in s.split(';').enumerate() {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let Some((k, v)) = part.split_once('=') else {
                return Err(config_error(
                    target,
                    format!(
                        "malformed connection string: part {} is not KEY=VALUE",
                        i + 1
                    ),
                ));
            };
            any = true;
            let v = v.trim().to_string();
            match k.trim().to_ascii_lowercase().as_str() {
                "accountname" => name = Some(v),
                "accountkey" => key = Some(v),
                "sharedaccesssignature" => sas = Some(v),
                "blobendpoint" => blob_endpoint = Some(v),
                "defaultendpointsprotocol" => protocol = Some(v),
                "endpointsuffix" => suffix = Some(v),
                "usedevelopmentstorage" => {
                    if !v.eq_ignore_ascii_case("true") {
                        return Err(config_error(
                            target,
                            "malformed connection string: UseDevelopmentStorage must be true",
                        ));
                    }
                    dev = true;
                }
                _ => {}
            }
        }
        if !any {
            return Err(config_error(target, "the connection string is empty"));
        }
        if dev {
            return Ok(Account::development());
        }
        let endpoint = match (&blob_endpoint, &name) {
            (Some(e), _) => parse_endpoint(name.as_deref().unwrap_or(target), e)?,
            (None, Some(n)) => {
                let proto = protocol.as_deref().unwrap_or("https").to_ascii_lowercase();
                if proto != "http" && proto != "https" {
                    return Err(config_error(
                        n,
                        "malformed connection string: DefaultEndpointsProtocol must be http or https",
                    ));
                }
                cloud_endpoint(n, &proto, suffix.as_deref().unwrap_or("core.windows.net"))?
            }
            (None, None) => {
                return Err(config_error(
                    target,
                    "malformed connection string: it needs AccountName (or BlobEndpoint), or UseDevelopmentStorage=true",
                ))
            }
        };
        let name = match name {
            Some(n) if !n.is_empty() => n,
            _ => account_from_endpoint(&endpoint).ok_or_else(|| {
                config_error(
                    target,
                    "malformed connection string: AccountName is missing",
                )
            })?,
        };
        let credential = match (key, sas) {
            (Some(k), _) => Credential::SharedKey {
                key: decode_key(&name, &k)?,
            },
            (None, Some(t)) => Credential::Sas(t.trim_start_matches('?').to_string()),
            (None, None) => Credential::Anonymous,
        };
        Ok(Account {
            name,
            endpoint,
            credential,
            options: ClientOptions::default(),
        })
    }

    /// Choose the account as the design says: `connection_string` (the
    /// command-line argument) first, then `AZURE_STORAGE_CONNECTION_STRING`,
    /// then `AZURE_STORAGE_ACCOUNT` with `AZURE_STORAGE_KEY` or
    /// `AZURE_STORAGE_SAS_TOKEN`, else the development account (Azurite).
    pub fn from_env(connection_string: Option<&str>) -> Result<Account> {
        Self::from_lookup(connection_string, |k| std::env::var(k).ok())
    }

    /// [`Account::from_env`] with an explicit variable lookup (for tests).
    pub fn from_lookup(
        connection_string: Option<&str>,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Account> {
        let get = |k: &str| lookup(k).filter(|v| !v.trim().is_empty());
        if let Some(cs) = connection_string {
            return Account::from_connection_string(cs);
        }
        if let Some(cs) = get("AZURE_STORAGE_CONNECTION_STRING") {
            return Account::from_connection_string(&cs);
        }
        if let Some(name) = get("AZURE_STORAGE_ACCOUNT") {
            if let Some(key) = get("AZURE_STORAGE_KEY") {
                return Account::with_shared_key(&name, &key);
            }
            if let Some(sas) = get("AZURE_STORAGE_SAS_TOKEN") {
                return Account::with_sas(&name, &sas);
            }
            return Err(config_error(
                &name,
                "AZURE_STORAGE_ACCOUNT is set but neither AZURE_STORAGE_KEY nor AZURE_STORAGE_SAS_TOKEN is",
            ));
        }
        Ok(Account::development())
    }

    /// A connection string for this account (used to hand the same account
    /// to other tools, e.g. the Python SDK in tests). Contains the key.
    pub fn connection_string(&self) -> String {
        let mut s = format!(
            "AccountName={};BlobEndpoint={}",
            self.name,
            self.endpoint.as_str().trim_end_matches('/')
        );
        match &self.credential {
            Credential::SharedKey { key } => {
                s.push_str(";AccountKey=");
                s.push_str(&base64::engine::general_purpose::STANDARD.encode(key));
            }
            Credential::Sas(t) => {
                s.push_str(";SharedAccessSignature=");
                s.push_str(t);
            }
            Credential::Token(_) | Credential::Anonymous => {}
        }
        s
    }

    /// An account named by `--account`: a bare name (public cloud endpoint
    /// `https://NAME.blob.core.windows.net`) or a blob endpoint URL (the name
    /// is its first host label, or its first path segment for Azurite's
    /// path-style URLs on an IP address or `localhost`). No credential yet.
    pub fn from_name_or_url(s: &str) -> Result<Account> {
        let s = s.trim();
        let endpoint = if s.contains("://") {
            parse_endpoint(s, s)?
        } else {
            cloud_endpoint(s, "https", "core.windows.net")?
        };
        let name = account_from_endpoint(&endpoint)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| config_error(s, "cannot tell the account name from this URL"))?;
        Ok(Account {
            name,
            endpoint,
            credential: Credential::Anonymous,
            options: ClientOptions::default(),
        })
    }

    /// Refuses a blob URL (`http(s)://...`) that names another account than
    /// this one: without its own SAS it would be sent to this account, where
    /// a blob of the same name is another drive. `C/B` operands pass.
    pub fn check_blob_url(&self, operand: &str) -> Result<()> {
        if !(operand.starts_with("https://") || operand.starts_with("http://")) {
            return Ok(());
        }
        let Ok(url) = Url::parse(operand) else {
            // BlobPath::parse gives the one line for a malformed URL.
            return Ok(());
        };
        let named = endpoint_of_blob_url(&url);
        let same = named.host_str().map(str::to_ascii_lowercase)
            == self.endpoint.host_str().map(str::to_ascii_lowercase)
            && named.port_or_known_default() == self.endpoint.port_or_known_default()
            && named.path().trim_end_matches('/') == self.endpoint.path().trim_end_matches('/');
        if same {
            return Ok(());
        }
        // The endpoint holds no query, so no SAS.
        let shown = named.as_str().trim_end_matches('/').to_string();
        Err(config_error(
            &shown,
            format!(
                "the URL names the account at {shown}, but the account in use is {} at {}: \
                 give CONTAINER/BLOB with that account chosen (--account, --connection-string \
                 or AZURE_STORAGE_*), or a URL with its SAS",
                self.name, self.endpoint
            ),
        ))
    }

    /// The account a blob URL carrying its own SAS names (`https://HOST/C/B?sv=..&sig=..`,
    /// what `az disk grant-access` hands out for a managed disk), signed in
    /// with that SAS; `None` when `s` is not such a URL (no `sig=`).
    /// `--ca-file` and `--allow-http` from `opts` apply. The `snapshot`
    /// parameter is not part of the SAS: it stays with the blob path.
    pub fn from_sas_url(s: &str, opts: &AccountOptions) -> Result<Option<Account>> {
        if !(s.starts_with("https://") || s.starts_with("http://")) {
            return Ok(None);
        }
        let Ok(url) = Url::parse(s) else {
            return Ok(None);
        };
        let Some(query) = url.query() else {
            return Ok(None);
        };
        let sas: Vec<&str> = query
            .split('&')
            .filter(|kv| !kv.is_empty() && !kv.starts_with("snapshot="))
            .collect();
        if !sas.iter().any(|kv| kv.starts_with("sig=")) {
            return Ok(None);
        }
        let host = url.host_str().unwrap_or_default();
        let endpoint = endpoint_of_blob_url(&url);
        let name = account_from_endpoint(&endpoint)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| config_error(host, "cannot tell the account name from this URL"))?;
        let mut account = Account {
            name,
            endpoint,
            credential: Credential::Sas(sas.join("&")),
            options: ClientOptions::default(),
        };
        account.options.allow_http = opts.allow_http;
        if let Some(path) = &opts.ca_file {
            account.options.ca_file = Some(CaFile::load(path)?);
        }
        Ok(Some(account))
    }

    /// True for local development storage: an endpoint on loopback, or the
    /// development account's name (Azurite in a container).
    pub fn is_development(&self) -> bool {
        self.name == DEV_ACCOUNT_NAME || super::token::is_loopback(&self.endpoint)
    }

    /// [`Account::from_env`] with the global flags: `--auth` (else
    /// `AZURE_STORAGE_AUTH_MODE`), `--account`, `--ca-file`, `--allow-http`.
    /// This is the one function commands call to pick their account.
    pub fn from_env_with(
        connection_string: Option<&str>,
        opts: &AccountOptions,
    ) -> Result<Account> {
        Self::from_lookup_with(connection_string, opts, |k| std::env::var(k).ok())
    }

    /// [`Account::from_env_with`] with an explicit variable lookup (for tests).
    ///
    /// Without a sign-in mode, the classic order of [`Account::from_lookup`]
    /// applies (with `--account` taking the place of `AZURE_STORAGE_ACCOUNT`).
    /// `key` and `sas` insist on that credential; `login`, `msi`, `sp` and
    /// `cli` take the account's name and endpoint from `--account`, the
    /// connection string or `AZURE_STORAGE_ACCOUNT`, and sign in with tokens.
    pub fn from_lookup_with(
        connection_string: Option<&str>,
        opts: &AccountOptions,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Account> {
        let get = |k: &str| lookup(k).filter(|v| !v.trim().is_empty());
        let mode = match opts.auth {
            Some(m) => Some(m),
            None => match get("AZURE_STORAGE_AUTH_MODE") {
                Some(v) => Some(
                    v.parse::<AuthMode>()
                        .map_err(|e| config_error("AZURE_STORAGE_AUTH_MODE", e))?,
                ),
                None => None,
            },
        };
        if opts.account.is_some() && connection_string.is_some() {
            return Err(config_error(
                "account",
                "give --account or --connection-string, not both",
            ));
        }
        // Where the account is, with whatever credential its source carries.
        let mut account = match &opts.account {
            Some(a) => {
                let mut acct = Account::from_name_or_url(a)?;
                acct.credential = credential_from_env(&acct.name, &get)?;
                Some(acct)
            }
            None => match (connection_string, get("AZURE_STORAGE_CONNECTION_STRING")) {
                (Some(cs), _) => Some(Account::from_connection_string(cs)?),
                (None, Some(cs)) => Some(Account::from_connection_string(&cs)?),
                (None, None) => match get("AZURE_STORAGE_ACCOUNT") {
                    Some(name) => {
                        let mut acct = Account::from_name_or_url(&name)?;
                        acct.credential = credential_from_env(&acct.name, &get)?;
                        Some(acct)
                    }
                    None => None,
                },
            },
        };
        let token_mode = mode.and_then(AuthMode::token_mode);
        if let Some(tm) = token_mode {
            let Some(acct) = account.as_mut() else {
                return Err(config_error(
                    "account",
                    "signing in with Microsoft Entra ID needs an account: --account NAME (or URL), or AZURE_STORAGE_ACCOUNT",
                ));
            };
            let provider = token::provider_from_lookup(tm, &|k: &str| get(k))
                .map_err(|e| config_error(&acct.name, e))?;
            acct.credential = Credential::Token(provider);
        }
        let mut account = account.unwrap_or_else(Account::development);
        match (mode, &account.credential) {
            (Some(AuthMode::Key), Credential::SharedKey { .. }) => {}
            (Some(AuthMode::Key), _) => {
                return Err(config_error(
                    &account.name,
                    "--auth key needs the account key: AZURE_STORAGE_KEY, or a connection string with AccountKey",
                ))
            }
            (Some(AuthMode::Sas), Credential::Sas(_)) => {}
            (Some(AuthMode::Sas), _) => {
                return Err(config_error(
                    &account.name,
                    "--auth sas needs a SAS token: AZURE_STORAGE_SAS_TOKEN, or a connection string with SharedAccessSignature",
                ))
            }
            (None, Credential::Anonymous)
                if opts.account.is_some()
                    || (connection_string.is_none()
                        && get("AZURE_STORAGE_CONNECTION_STRING").is_none()) => {
                return Err(config_error(
                    &account.name,
                    "no credential for this account: set AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN, or sign in with Microsoft Entra ID (--auth login)",
                ))
            }
            _ => {}
        }
        account.options.allow_http = opts.allow_http;
        if let Some(path) = &opts.ca_file {
            account.options.ca_file = Some(CaFile::load(path)?);
        }
        Ok(account)
    }
}

/// The credential `AZURE_STORAGE_KEY` or `AZURE_STORAGE_SAS_TOKEN` gives, if any.
fn credential_from_env(account: &str, get: &dyn Fn(&str) -> Option<String>) -> Result<Credential> {
    if let Some(key) = get("AZURE_STORAGE_KEY") {
        return Ok(Credential::SharedKey {
            key: decode_key(account, &key)?,
        });
    }
    if let Some(sas) = get("AZURE_STORAGE_SAS_TOKEN") {
        return Ok(Credential::Sas(
            sas.trim().trim_start_matches('?').to_string(),
        ));
    }
    Ok(Credential::Anonymous)
}

fn cloud_endpoint(name: &str, proto: &str, suffix: &str) -> Result<Url> {
    let valid = (3..=24).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !valid {
        return Err(config_error(
            name,
            "account name must be 3-24 lowercase letters or digits",
        ));
    }
    parse_endpoint(name, &format!("{proto}://{name}.blob.{suffix}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "a2V5LWZvci10ZXN0cy1vbmx5LTEyMzQ1Njc4OTA=";

    #[test]
    fn blob_url_with_a_sas_is_its_own_account() {
        let opts = AccountOptions::default();
        let a = Account::from_sas_url(
            "https://md-abc123.z7.blob.storage.azure.net/xyz/abcd?sv=2018-03-28&sr=b&si=x&sig=S%2Bg%3D",
            &opts,
        )
        .unwrap()
        .expect("a SAS URL");
        assert_eq!(a.name, "md-abc123");
        assert_eq!(
            a.endpoint.as_str(),
            "https://md-abc123.z7.blob.storage.azure.net/"
        );
        assert!(
            matches!(&a.credential, Credential::Sas(t) if t == "sv=2018-03-28&sr=b&si=x&sig=S%2Bg%3D")
        );
        let local = Account::from_sas_url(
            "http://127.0.0.1:10000/devstoreaccount1/c1/d.vhd?snapshot=T&sp=r&sig=abc",
            &opts,
        )
        .unwrap()
        .expect("a SAS URL");
        assert_eq!(local.name, "devstoreaccount1");
        assert_eq!(
            local.endpoint.as_str(),
            "http://127.0.0.1:10000/devstoreaccount1"
        );
        assert!(matches!(&local.credential, Credential::Sas(t) if t == "sp=r&sig=abc"));
        for not_sas in [
            "c1/d.vhd",
            "https://a.blob.core.windows.net/c/d",
            "https://a.blob.core.windows.net/c/d?snapshot=T",
        ] {
            assert!(
                Account::from_sas_url(not_sas, &opts).unwrap().is_none(),
                "{not_sas}"
            );
        }
    }

    #[test]
    fn development_storage_is_azurite() {
        let a = Account::from_connection_string("UseDevelopmentStorage=true").unwrap();
        assert_eq!(a.name, "devstoreaccount1");
        assert_eq!(
            a.endpoint.as_str(),
            "http://127.0.0.1:10000/devstoreaccount1"
        );
    }

    #[test]
    fn cloud_connection_string_builds_endpoint() {
        let a = Account::from_connection_string(&format!(
            "DefaultEndpointsProtocol=https;AccountName=myacct;AccountKey={KEY};EndpointSuffix=core.chinacloudapi.cn"
        ))
        .unwrap();
        assert_eq!(
            a.endpoint.as_str(),
            "https://myacct.blob.core.chinacloudapi.cn/"
        );
        assert!(matches!(a.credential, Credential::SharedKey { .. }));
    }

    #[test]
    fn explicit_blob_endpoint_and_sas() {
        let a = Account::from_connection_string(
            "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;SharedAccessSignature=sv=2021-08-06&sig=SECRETSIG",
        )
        .unwrap();
        assert_eq!(a.name, "devstoreaccount1");
        let dbg = format!("{a:?}");
        assert!(!dbg.contains("SECRETSIG"), "{dbg}");
        assert!(dbg.contains("sig=<redacted>"), "{dbg}");
    }

    #[test]
    fn malformed_connection_strings_are_refused_without_echoing_key() {
        for bad in [
            "",
            "garbage",
            "AccountKey=abc",
            "AccountName=x;AccountKey=!!notbase64!!",
            "UseDevelopmentStorage=false",
            "AccountName=myacct;DefaultEndpointsProtocol=ftp",
        ] {
            let e = Account::from_connection_string(bad).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Config, "{bad}: {e}");
            assert!(!e.to_string().contains("notbase64"), "{e}");
        }
    }

    #[test]
    fn debug_never_prints_the_key() {
        let a = Account::development();
        let dbg = format!("{a:?}");
        assert!(!dbg.contains(DEV_ACCOUNT_KEY));
        assert!(dbg.contains("redacted"));
    }

    #[test]
    fn selection_order_follows_the_design() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        // Nothing set: development storage.
        let a = Account::from_lookup(None, env(&[])).unwrap();
        assert_eq!(a.name, DEV_ACCOUNT_NAME);
        // The argument wins over the environment.
        let a = Account::from_lookup(
            Some("AccountName=argacct;AccountKey=a2V5"),
            env(&[(
                "AZURE_STORAGE_CONNECTION_STRING",
                "AccountName=envacct;AccountKey=a2V5",
            )]),
        )
        .unwrap();
        assert_eq!(a.name, "argacct");
        // The connection string wins over account + key.
        let a = Account::from_lookup(
            None,
            env(&[
                (
                    "AZURE_STORAGE_CONNECTION_STRING",
                    "AccountName=envacct;AccountKey=a2V5",
                ),
                ("AZURE_STORAGE_ACCOUNT", "other"),
                ("AZURE_STORAGE_KEY", "a2V5"),
            ]),
        )
        .unwrap();
        assert_eq!(a.name, "envacct");
        let a = Account::from_lookup(
            None,
            env(&[
                ("AZURE_STORAGE_ACCOUNT", "acct1"),
                ("AZURE_STORAGE_SAS_TOKEN", "?sv=1&sig=x"),
            ]),
        )
        .unwrap();
        assert!(matches!(&a.credential, Credential::Sas(t) if t == "sv=1&sig=x"));
        assert!(Account::from_lookup(None, env(&[("AZURE_STORAGE_ACCOUNT", "acct1")])).is_err());
    }

    #[test]
    fn sign_in_modes_pick_credentials_and_say_what_is_missing() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let opts = |auth, account: Option<&str>| AccountOptions {
            auth,
            account: account.map(str::to_string),
            ..Default::default()
        };
        // Entra sign-in needs to know which account.
        let e = Account::from_lookup_with(None, &opts(Some(AuthMode::Msi), None), env(&[]))
            .unwrap_err();
        assert!(e.to_string().contains("--account"), "{e}");
        // --account NAME gives the public endpoint and a token credential.
        let a =
            Account::from_lookup_with(None, &opts(Some(AuthMode::Msi), Some("myacct")), env(&[]))
                .unwrap();
        assert_eq!(a.endpoint.as_str(), "https://myacct.blob.core.windows.net/");
        assert!(matches!(a.credential, Credential::Token(_)));
        // AZURE_STORAGE_AUTH_MODE=login with AZURE_STORAGE_ACCOUNT.
        let a = Account::from_lookup_with(
            None,
            &opts(None, None),
            env(&[
                ("AZURE_STORAGE_AUTH_MODE", "login"),
                ("AZURE_STORAGE_ACCOUNT", "envacct"),
                ("AZURE_STORAGE_KEY", "a2V5"),
            ]),
        )
        .unwrap();
        assert_eq!(a.name, "envacct");
        assert!(format!("{a:?}").contains("Token("), "{a:?}");
        // --auth key insists on a key; --auth sp on its variables.
        let e = Account::from_lookup_with(
            None,
            &opts(Some(AuthMode::Key), Some("myacct")),
            env(&[("AZURE_STORAGE_SAS_TOKEN", "sv=1&sig=x")]),
        )
        .unwrap_err();
        assert!(e.to_string().contains("AZURE_STORAGE_KEY"), "{e}");
        let e =
            Account::from_lookup_with(None, &opts(Some(AuthMode::Sp), Some("myacct")), env(&[]))
                .unwrap_err();
        assert!(e.to_string().contains("AZURE_CLIENT_SECRET"), "{e}");
        // A bad mode name, and --account with --connection-string.
        assert!(Account::from_lookup_with(
            None,
            &opts(None, None),
            env(&[("AZURE_STORAGE_AUTH_MODE", "password")])
        )
        .is_err());
        assert!(Account::from_lookup_with(
            Some("UseDevelopmentStorage=true"),
            &opts(None, Some("myacct")),
            env(&[])
        )
        .is_err());
        // An account without any credential says how to sign in.
        let e = Account::from_lookup_with(None, &opts(None, Some("myacct")), env(&[])).unwrap_err();
        assert!(e.to_string().contains("--auth login"), "{e}");
        // A URL names a path-style (Azurite) account.
        let a = Account::from_name_or_url("https://127.0.0.1:10443/devstoreaccount1").unwrap();
        assert_eq!(a.name, "devstoreaccount1");
    }
}
