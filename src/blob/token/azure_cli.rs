//! The Azure CLI's login: `az account get-access-token --resource
//! https://storage.azure.com/ -o json`, run without a shell.
//!
//! Invariant: the token is read from `az`'s standard output only and never
//! logged; `az`'s standard error (which holds no token) gives the reason
//! when it fails, e.g. "Please run 'az login'".

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use super::{AccessToken, Secret, TokenError, TokenErrorKind, TokenProvider, STORAGE_RESOURCE};

/// Tokens from the Azure CLI's signed-in account.
#[derive(Clone, Debug)]
pub struct AzureCli {
    /// The `az` program (looked up on `PATH` when it is a bare name).
    pub program: PathBuf,
}

impl Default for AzureCli {
    fn default() -> Self {
        AzureCli {
            program: PathBuf::from("az"),
        }
    }
}

const NAME: &str = "Azure CLI";

#[async_trait::async_trait]
impl TokenProvider for AzureCli {
    fn name(&self) -> String {
        NAME.to_string()
    }

    async fn fetch(&self, _http: &reqwest::Client) -> Result<AccessToken, TokenError> {
        let run = tokio::process::Command::new(&self.program)
            .args([
                "account",
                "get-access-token",
                "--resource",
                STORAGE_RESOURCE,
                "-o",
                "json",
            ])
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = match tokio::time::timeout(Duration::from_secs(60), run).await {
            Err(_) => {
                return Err(TokenError::new(
                    TokenErrorKind::Failed,
                    NAME,
                    "'az account get-access-token' did not finish within 60 s",
                ))
            }
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(TokenError::new(
                    TokenErrorKind::Unavailable,
                    NAME,
                    format!(
                        "'{}' is not installed (not found on PATH)",
                        self.program.display()
                    ),
                ))
            }
            Ok(Err(e)) => {
                return Err(TokenError::new(
                    TokenErrorKind::Unavailable,
                    NAME,
                    format!("cannot run '{}': {e}", self.program.display()),
                ))
            }
            Ok(Ok(out)) => out,
        };
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let reason: Vec<&str> = stderr
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .take(3)
                .collect();
            let not_logged_in = stderr.contains("az login");
            return Err(TokenError::new(
                if not_logged_in {
                    TokenErrorKind::Unavailable
                } else {
                    TokenErrorKind::Refused
                },
                NAME,
                format!(
                    "'az account get-access-token' failed ({}): {}",
                    out.status,
                    reason.join(" ")
                ),
            ));
        }
        parse_cli_token(&out.stdout)
    }
}

/// `az`'s JSON: `accessToken` and `expires_on` (Unix seconds, CLI 2.54+),
/// else `expiresOn` (local time `YYYY-MM-DD HH:MM:SS.ffffff`).
fn parse_cli_token(stdout: &[u8]) -> Result<AccessToken, TokenError> {
    let bad = |what: &str| {
        TokenError::new(
            TokenErrorKind::Failed,
            NAME,
            format!("cannot read az's answer: {what}"),
        )
    };
    let v: Value = serde_json::from_slice(stdout).map_err(|_| bad("not JSON"))?;
    let token = v
        .get("accessToken")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| bad("no accessToken"))?;
    let epoch = match v.get("expires_on") {
        Some(Value::Number(n)) => n.as_u64(),
        Some(Value::String(s)) => s.trim().parse().ok(),
        _ => None,
    };
    let expires_at = match epoch {
        Some(e) => UNIX_EPOCH + Duration::from_secs(e),
        None => {
            // Older CLIs give local time only; assume a short life so the
            // cache asks again soon rather than use an expired token.
            SystemTime::now() + Duration::from_secs(10 * 60)
        }
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
    fn cli_answer_with_expires_on() {
        let t = parse_cli_token(br#"{"accessToken":"tok","expiresOn":"2030-01-01 00:00:00.000000","expires_on":1893456000,"tokenType":"Bearer"}"#).unwrap();
        assert_eq!(
            t.expires_at,
            UNIX_EPOCH + Duration::from_secs(1_893_456_000)
        );
        assert!(parse_cli_token(b"{}").is_err());
    }

    #[tokio::test]
    async fn missing_az_is_unavailable() {
        let cli = AzureCli {
            program: PathBuf::from("/nonexistent/az-for-blobdrive-tests"),
        };
        let e = cli.fetch(&reqwest::Client::new()).await.unwrap_err();
        assert_eq!(e.kind, TokenErrorKind::Unavailable, "{e}");
    }
}
