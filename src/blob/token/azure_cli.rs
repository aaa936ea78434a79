//! The Azure CLI's login: `az account get-access-token --resource
//! https://storage.azure.com/ -o json`, run without a shell; and
//! [`run_login_tool`], which the Azure Developer CLI's source shares.
//!
//! Invariant: the token is read from the tool's standard output only and
//! never logged; its standard error (which holds no token) gives the reason
//! when it fails, e.g. "Please run 'az login'".

use std::path::{Path, PathBuf};
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
        let tool = LoginTool {
            name: NAME,
            program: &self.program,
            args: &[
                "account",
                "get-access-token",
                "--resource",
                STORAGE_RESOURCE,
                "-o",
                "json",
            ],
            login_hint: "az login",
        };
        parse_cli_token(&run_login_tool(&tool).await?)
    }
}

/// A command-line tool that prints a token for its signed-in account.
pub(super) struct LoginTool<'a> {
    /// The source's name for messages.
    pub name: &'a str,
    /// The program (looked up on `PATH` when it is a bare name).
    pub program: &'a Path,
    /// Its arguments (no secrets: they are visible to other local users).
    pub args: &'a [&'a str],
    /// What its standard error says when nobody is signed in.
    pub login_hint: &'a str,
}

/// Run `tool` without a shell and return its standard output. A missing
/// program, or a "not signed in" answer, is [`TokenErrorKind::Unavailable`]
/// (a chain moves on); another failure gives the first lines of its
/// standard error.
pub(super) async fn run_login_tool(tool: &LoginTool<'_>) -> Result<Vec<u8>, TokenError> {
    let command = format!(
        "'{} {}'",
        program_name(tool.program),
        tool.args[..2].join(" ")
    );
    let run = tokio::process::Command::new(tool.program)
        .args(tool.args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = match tokio::time::timeout(Duration::from_secs(60), run).await {
        Err(_) => {
            return Err(TokenError::new(
                TokenErrorKind::Failed,
                tool.name,
                format!("{command} did not finish within 60 s"),
            ))
        }
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(TokenError::new(
                TokenErrorKind::Unavailable,
                tool.name,
                format!(
                    "'{}' is not installed (not found on PATH)",
                    tool.program.display()
                ),
            ))
        }
        Ok(Err(e)) => {
            return Err(TokenError::new(
                TokenErrorKind::Unavailable,
                tool.name,
                format!("cannot run '{}': {e}", tool.program.display()),
            ))
        }
        Ok(Ok(out)) => out,
    };
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let reason: Vec<String> = stderr
            .lines()
            .map(console_message)
            .filter(|l| !l.is_empty())
            .take(3)
            .collect();
        let not_logged_in = stderr.contains(tool.login_hint);
        return Err(TokenError::new(
            if not_logged_in {
                TokenErrorKind::Unavailable
            } else {
                TokenErrorKind::Refused
            },
            tool.name,
            format!("{command} failed ({}): {}", out.status, reason.join(" ")),
        ));
    }
    Ok(out.stdout)
}

/// The program's file name, for messages (`az`, `azd`).
fn program_name(program: &Path) -> String {
    program.file_name().map_or_else(
        || program.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// One line of a tool's standard error as a person would read it: `azd`
/// writes JSON lines (`{"type":"consoleMessage","data":{"message":...}}`),
/// `az` plain text.
fn console_message(line: &str) -> String {
    let line = line.trim();
    if let Ok(v) = serde_json::from_str::<Value>(line) {
        if let Some(m) = v.pointer("/data/message").and_then(Value::as_str) {
            let words: Vec<&str> = m.split_whitespace().collect();
            return words.join(" ");
        }
    }
    line.to_string()
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

    #[test]
    fn azd_console_messages_are_read_as_text() {
        let line = r#"{"type":"consoleMessage","timestamp":"2026-01-18T00:00:00Z","data":{"message":"\nERROR: not logged in, run `azd auth login` to login\n"}}"#;
        assert_eq!(
            console_message(line),
            "ERROR: not logged in, run `azd auth login` to login"
        );
        assert_eq!(
            console_message("  ERROR: Please run 'az login'  "),
            "ERROR: Please run 'az login'"
        );
    }
}
