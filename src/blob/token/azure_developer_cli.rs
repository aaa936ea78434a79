//! The Azure Developer CLI's login: `azd auth token --output json
//! --no-prompt --scope https://storage.azure.com/.default`, run without a
//! shell (through [`run_login_tool`], as the Azure CLI's source does).
//!
//! Invariant: the token is read from `azd`'s standard output only and never
//! logged.

use std::path::PathBuf;
use std::time::SystemTime;

use serde_json::Value;

use super::azure_cli::{find_program, run_login_tool, LoginTool, TOOL_TIMEOUT};
use super::{AccessToken, Secret, TokenError, TokenErrorKind, TokenProvider, STORAGE_SCOPE};

/// Tokens from the Azure Developer CLI's signed-in account (`azd auth login`).
#[derive(Clone, Debug)]
pub struct AzureDeveloperCli {
    /// The `azd` program: an absolute path, or the bare name when it was
    /// not found on `PATH` (then it is not run).
    pub program: PathBuf,
}

impl AzureDeveloperCli {
    /// `azd` as found now on `path` (the `PATH` value).
    pub fn on_path(path: Option<&str>) -> Self {
        AzureDeveloperCli {
            program: find_program("azd", path),
        }
    }
}

const NAME: &str = "Azure Developer CLI";

#[async_trait::async_trait]
impl TokenProvider for AzureDeveloperCli {
    fn name(&self) -> String {
        NAME.to_string()
    }

    async fn fetch(&self, _http: &reqwest::Client) -> Result<AccessToken, TokenError> {
        let tool = LoginTool {
            name: NAME,
            program: &self.program,
            args: &[
                "auth",
                "token",
                "--output",
                "json",
                "--no-prompt",
                "--scope",
                STORAGE_SCOPE,
            ],
            // Older releases said `azd login`.
            login_hints: &["azd auth login", "azd login"],
            timeout: TOOL_TIMEOUT,
        };
        parse_azd_token(&run_login_tool(&tool).await?)
    }
}

/// `azd`'s JSON: `token` and `expiresOn` (RFC 3339).
fn parse_azd_token(stdout: &[u8]) -> Result<AccessToken, TokenError> {
    let bad = |what: &str| {
        TokenError::new(
            TokenErrorKind::Failed,
            NAME,
            format!("cannot read azd's answer: {what}"),
        )
    };
    let v: Value = serde_json::from_slice(stdout).map_err(|_| bad("not JSON"))?;
    let token = v
        .get("token")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| bad("no token"))?;
    let expires = v
        .get("expiresOn")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("no expiresOn"))?;
    let expires =
        time::OffsetDateTime::parse(expires, &time::format_description::well_known::Rfc3339)
            .map_err(|_| bad("expiresOn is not an RFC 3339 time"))?;
    Ok(AccessToken {
        token: Secret::new(token),
        expires_at: SystemTime::from(expires),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn azd_answer_gives_token_and_expiry() {
        let t = parse_azd_token(br#"{"token":"tok","expiresOn":"2030-01-01T00:00:00Z"}"#).unwrap();
        assert_eq!(
            t.expires_at,
            UNIX_EPOCH + Duration::from_secs(1_893_456_000)
        );
        assert!(parse_azd_token(br#"{"token":"tok"}"#).is_err());
        assert!(parse_azd_token(b"not json").is_err());
    }

    #[tokio::test]
    async fn missing_azd_is_unavailable() {
        let azd = AzureDeveloperCli {
            program: PathBuf::from("/nonexistent/azd-for-blobdrive-tests"),
        };
        let e = azd.fetch(&reqwest::Client::new()).await.unwrap_err();
        assert_eq!(e.kind, TokenErrorKind::Unavailable, "{e}");
    }
}
