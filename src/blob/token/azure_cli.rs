//! The Azure CLI's login: `az account get-access-token --resource
//! https://storage.azure.com/ -o json`, run without a shell; and
//! [`run_login_tool`], which the Azure Developer CLI's source shares.
//!
//! Invariants: the token is read from the tool's standard output only and
//! never logged; its standard error gives the reason when it fails (e.g.
//! "Please run 'az login'"), without lines that look like secrets. The
//! program is found on `PATH` once, when the source is built (before a
//! mount's daemon starts), never by the daemon; it runs in a process group
//! of its own, without the daemon's credentials in its environment, with
//! its output and time bounded.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt as _};

use super::{AccessToken, Secret, TokenError, TokenErrorKind, TokenProvider, STORAGE_RESOURCE};

/// Tokens from the Azure CLI's signed-in account.
#[derive(Clone, Debug)]
pub struct AzureCli {
    /// The `az` program: an absolute path, or the bare name when it was
    /// not found on `PATH` (then it is not run).
    pub program: PathBuf,
}

impl AzureCli {
    /// `az` as found now on `path` (the `PATH` value; see [`find_program`]).
    pub fn on_path(path: Option<&str>) -> Self {
        AzureCli {
            program: find_program("az", path),
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
            login_hints: &["az login"],
            timeout: TOOL_TIMEOUT,
        };
        parse_cli_token(&run_login_tool(&tool).await?)
    }
}

/// How long a login tool may take. `az` starts Python and may refresh its
/// own token over the network: a few seconds. The tool runs while the
/// token cache holds its refresh lock, and once the old token is spent
/// every blob request waits on that lock, so a hung tool must fail long
/// before a mount's requests give up on their own.
pub(super) const TOOL_TIMEOUT: Duration = Duration::from_secs(20);

/// The most of a tool's standard output read (a token answer is ~2 KB).
const MAX_STDOUT: u64 = 1024 * 1024;
/// The most of a tool's standard error read.
const MAX_STDERR: u64 = 64 * 1024;

/// The daemon's own credentials, which a login tool needs none of to print
/// its account's token: removed from the tool's environment.
const WITHHELD_VARIABLES: [&str; 7] = [
    "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_CLIENT_SECRET",
    "AZURE_CLIENT_CERTIFICATE_PASSWORD",
    "IDENTITY_HEADER",
    "MSI_SECRET",
];

/// `name` in the first absolute directory of `path` (a `PATH` value) that
/// holds an executable file of that name; empty and relative entries are
/// skipped (they would name the daemon's working directory). The bare
/// name when none does: [`run_login_tool`] then says it is not installed.
pub(super) fn find_program(name: &str, path: Option<&str>) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    path.unwrap_or_default()
        .split(':')
        .map(Path::new)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(name))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .unwrap_or_else(|| PathBuf::from(name))
}

/// Why a process with effective user `euid` must not run `program`: when
/// it is root, a program (links followed) that another user owns or could
/// change would run with root's rights. `None` when it may run (or cannot
/// be looked at: running it then says why).
fn untrusted(program: &Path, euid: u32) -> Option<String> {
    if euid != 0 {
        return None;
    }
    let meta = std::fs::metadata(program).ok()?;
    if meta.uid() != 0 {
        return Some(format!(
            "refusing to run {} as root: it is owned by uid {}, not root",
            program.display(),
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Some(format!(
            "refusing to run {} as root: group or others may write to it (mode {:o})",
            program.display(),
            meta.mode() & 0o7777
        ));
    }
    None
}

/// A command-line tool that prints a token for its signed-in account.
pub(super) struct LoginTool<'a> {
    /// The source's name for messages.
    pub name: &'a str,
    /// The program: an absolute path ([`find_program`]), else not run.
    pub program: &'a Path,
    /// Its arguments (no secrets: they are visible to other local users).
    pub args: &'a [&'a str],
    /// What its standard error says when nobody is signed in.
    pub login_hints: &'a [&'a str],
    /// How long it may take ([`TOOL_TIMEOUT`]).
    pub timeout: Duration,
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
    let unavailable = |m: String| TokenError::new(TokenErrorKind::Unavailable, tool.name, m);
    let failed = |m: String| TokenError::new(TokenErrorKind::Failed, tool.name, m);
    if !tool.program.is_absolute() {
        return Err(unavailable(format!(
            "'{}' is not installed (not found on PATH)",
            tool.program.display()
        )));
    }
    // SAFETY: geteuid has no preconditions.
    if let Some(why) = untrusted(tool.program, unsafe { libc::geteuid() }) {
        return Err(failed(why));
    }
    let mut cmd = tokio::process::Command::new(tool.program);
    crate::open_files::give_tool_the_original(&mut cmd);
    cmd.args(tool.args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        // Its own group, so a time-out ends what it started too (the
        // packaged `az` is a shell script that runs Python).
        .process_group(0);
    for name in WITHHELD_VARIABLES {
        cmd.env_remove(name);
    }
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(unavailable(format!(
                "'{}' is not installed (not found)",
                tool.program.display()
            )))
        }
        Err(e) => {
            return Err(unavailable(format!(
                "cannot run '{}': {e}",
                tool.program.display()
            )))
        }
    };
    let group = child.id();
    let stdout = child.stdout.take().expect("standard output is piped");
    let stderr = child.stderr.take().expect("standard error is piped");
    let run = async {
        let (out, err) = tokio::try_join!(
            read_capped(stdout, MAX_STDOUT, "standard output"),
            read_capped(stderr, MAX_STDERR, "standard error")
        )?;
        let status = child.wait().await.map_err(|e| format!("failed: {e}"))?;
        Ok::<_, String>((status, out, err))
    };
    let (status, stdout, stderr) = match tokio::time::timeout(tool.timeout, run).await {
        Ok(Ok(done)) => done,
        other => {
            if let Some(pid) = group {
                // SAFETY: kill takes no pointers; the group is the child's
                // (not yet reaped, so its id is not reused).
                unsafe { libc::kill(-(pid as libc::pid_t), libc::SIGKILL) };
            }
            let why = match other {
                Err(_) => format!("did not finish within {} s", tool.timeout.as_secs()),
                Ok(Err(why)) => why,
                Ok(Ok(_)) => unreachable!("matched above"),
            };
            return Err(failed(format!("{command} {why}")));
        }
    };
    if !status.success() {
        let stderr = String::from_utf8_lossy(&stderr);
        let kind = if signed_out(&stderr, tool.login_hints) {
            TokenErrorKind::Unavailable
        } else {
            TokenErrorKind::Refused
        };
        let reason = reason(&stderr);
        let reason = if reason.is_empty() {
            String::new()
        } else {
            format!(": {reason}")
        };
        return Err(TokenError::new(
            kind,
            tool.name,
            format!("{command} failed ({status}){reason}"),
        ));
    }
    Ok(stdout)
}

/// All of `reader`, or an error when it holds more than `cap` bytes.
async fn read_capped(
    reader: impl AsyncRead + Unpin,
    cap: u64,
    what: &str,
) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    reader
        .take(cap + 1)
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| format!("failed: cannot read its {what}: {e}"))?;
    if bytes.len() as u64 > cap {
        return Err(format!("wrote more than {} KiB to its {what}", cap / 1024));
    }
    Ok(bytes)
}

/// Does a tool's standard error say nobody is signed in (one of `hints`)?
/// Not when Entra ID refused (an `AADSTS` code): an expired or revoked
/// sign-in also says "run az login", but it is a refusal to report, not a
/// source to skip.
fn signed_out(stderr: &str, hints: &[&str]) -> bool {
    hints.iter().any(|h| stderr.contains(h)) && !stderr.contains("AADSTS")
}

/// The first three lines of a tool's standard error, on one line, without
/// those that look like they hold a secret.
fn reason(stderr: &str) -> String {
    let lines: Vec<String> = stderr
        .lines()
        .map(console_message)
        .filter(|l| !l.is_empty() && !looks_secret(l))
        .take(3)
        .collect();
    lines.join(" ")
}

/// Does `line` look like it holds a secret: a JWT (`eyJ`, base64 of `{"`),
/// a key or signature assignment, or a long run of token characters mixing
/// upper case, lower case and digits (paths, host names and GUIDs do not)?
fn looks_secret(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    if line.contains("eyJ")
        || ["accountkey=", "sig=", "sharedaccesssignature=", "secret="]
            .iter()
            .any(|k| lower.contains(k))
    {
        return true;
    }
    let token_char = |c: char| c.is_ascii_alphanumeric() || "+/=_-.~%".contains(c);
    line.split(|c: char| !token_char(c)).any(|run| {
        run.len() >= 32
            && run.chars().any(|c| c.is_ascii_uppercase())
            && run.chars().any(|c| c.is_ascii_lowercase())
            && run.chars().any(|c| c.is_ascii_digit())
    })
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
        // Checked: a huge number would overflow `SystemTime` and panic the
        // task that asked for the token.
        Some(e) => UNIX_EPOCH
            .checked_add(Duration::from_secs(e))
            .ok_or_else(|| bad("expires_on is out of range"))?,
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

    #[test]
    fn an_expiry_past_the_end_of_time_is_refused_not_a_panic() {
        for epoch in [
            format!("{}", u64::MAX),
            format!(r#""{}""#, i64::MAX as u64 + 1),
        ] {
            let out = format!(r#"{{"accessToken":"s3cr3t-tok","expires_on":{epoch}}}"#);
            let e = parse_cli_token(out.as_bytes()).unwrap_err();
            assert_eq!(e.kind, TokenErrorKind::Failed, "{e}");
            assert!(e.message.contains("out of range"), "{e}");
            assert!(!e.to_string().contains("s3cr3t"), "{e}");
        }
    }

    #[tokio::test]
    async fn missing_az_is_unavailable() {
        let e = AzureCli::on_path(Some("/nonexistent"))
            .fetch(&reqwest::Client::new())
            .await
            .unwrap_err();
        assert_eq!(e.kind, TokenErrorKind::Unavailable, "{e}");
        assert!(e.message.contains("'az' is not installed"), "{e}");
        let cli = AzureCli {
            program: PathBuf::from("/nonexistent/az-for-blobdrive-tests"),
        };
        let e = cli.fetch(&reqwest::Client::new()).await.unwrap_err();
        assert_eq!(e.kind, TokenErrorKind::Unavailable, "{e}");
    }

    /// An executable `name` in `dir` running `script` (a shell script body).
    fn tool(dir: &Path, name: &str, script: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt as _;
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn run(program: &Path, timeout: Duration) -> Result<Vec<u8>, TokenError> {
        let tool = LoginTool {
            name: NAME,
            program,
            args: &["account", "get-access-token"],
            login_hints: &["az login"],
            timeout,
        };
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(run_login_tool(&tool))
    }

    #[test]
    fn the_program_is_found_once_in_absolute_path_entries_only() {
        let dir = tempfile::tempdir().unwrap();
        let abs = dir.path().join("bin");
        std::fs::create_dir(&abs).unwrap();
        let found = tool(&abs, "az", "exit 0");
        // Not executable: passed over.
        std::fs::write(dir.path().join("az"), "").unwrap();
        let path = format!(":.:relative/bin:{}:{}", dir.path().display(), abs.display());
        assert_eq!(find_program("az", Some(&path)), found);
        // Only a relative entry could hold it: not found.
        assert_eq!(find_program("az", Some("bin:")), PathBuf::from("az"));
        assert_eq!(find_program("az", None), PathBuf::from("az"));
    }

    #[test]
    fn as_root_a_program_others_own_or_may_change_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let az = tool(dir.path(), "az", "exit 0");
        let mode = |m| std::fs::set_permissions(&az, std::fs::Permissions::from_mode(m)).unwrap();
        let owner = std::fs::metadata(&az).unwrap().uid();
        assert_eq!(untrusted(&az, 1000), None, "only root is careful");
        if owner == 0 {
            assert_eq!(untrusted(&az, 0), None);
            mode(0o777);
            let why = untrusted(&az, 0).unwrap();
            assert!(
                why.contains(&az.display().to_string()) && why.contains("may write"),
                "{why}"
            );
            mode(0o755);
            std::os::unix::fs::chown(&az, Some(65534), None).unwrap();
        }
        let why = untrusted(&az, 0).unwrap();
        assert!(why.contains("owned by uid"), "{why}");
    }

    #[test]
    fn output_beyond_its_bound_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let az = tool(dir.path(), "az", "head -c 2000000 /dev/zero");
        let e = run(&az, Duration::from_secs(20)).unwrap_err();
        assert!(e.message.contains("more than 1024 KiB"), "{e}");
    }

    #[test]
    fn a_time_out_ends_the_tool_and_what_it_started() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        // A wrapper whose real work runs in a child, as the packaged az's.
        let az = tool(
            dir.path(),
            "az",
            &format!("sleep 300 &\necho $! > {}\nwait", pid_file.display()),
        );
        let e = run(&az, Duration::from_secs(1)).unwrap_err();
        assert_eq!(e.kind, TokenErrorKind::Failed, "{e}");
        assert!(e.message.contains("did not finish within 1 s"), "{e}");
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // The grandchild got SIGKILL; once its parent is gone init reaps it.
        let gone = (0..100).any(|_| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat.rsplit(") ").next().unwrap_or("").chars().next();
            if stat.is_empty() || state == Some('Z') {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
            false
        });
        assert!(gone, "the tool's child {pid} still runs");
    }

    #[test]
    fn a_signed_out_answer_is_skipped_and_a_refusal_is_not() {
        assert!(signed_out(
            "ERROR: Please run 'az login' to setup account.",
            &["az login"]
        ));
        assert!(!signed_out(
            "ERROR: AADSTS700082: The refresh token has expired due to inactivity. Please run 'az login'",
            &["az login"]
        ));
        let hints = &["azd auth login", "azd login"];
        assert!(signed_out(
            "ERROR: not logged in, run `azd auth login` to login",
            hints
        ));
        assert!(signed_out(
            "ERROR: not logged in, run `azd login` to login",
            hints
        ));
    }

    #[test]
    fn stderr_lines_that_look_like_secrets_are_left_out() {
        let stderr = "ERROR: the token eyJ0eXAiOiJKV1QiLCJhbGciOi.abc.def was refused\n\
            DefaultEndpointsProtocol=https;AccountName=a;AccountKey=abc\n\
            using secret Q8x~AbCdEfGhIjKlMnOpQrStUvWxYz0123456789ab\n\
            ERROR: AADSTS50076: multi-factor authentication needed. Trace ID: 0f1e2d3c-1111-2222-3333-444455556666\n\
            File \"/usr/lib/python3/dist-packages/azure/cli/core/commands/__init__.py\", line 1\n";
        assert_eq!(
            reason(stderr),
            "ERROR: AADSTS50076: multi-factor authentication needed. Trace ID: 0f1e2d3c-1111-2222-3333-444455556666 File \"/usr/lib/python3/dist-packages/azure/cli/core/commands/__init__.py\", line 1"
        );
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
