//! Command-line interface: parse (clap derive), call the library, print.
//!
//! One file per command, each thin. This module owns what they share: the
//! global flags, logging to stderr (`-v`), and the exit contract: every failure
//! ends in exactly one line `blobdrive: <message>` on stderr, exit code 1 for a
//! failed operation and 2 for a usage error (bad flag, bad size). Nothing here
//! panics on user input.

use std::ffi::OsString;
use std::io::{IsTerminal, Write};

use clap::{Parser, Subcommand};

use crate::blob;

pub mod argv;
pub mod attach_flags;
pub mod break_lease;
pub mod cache;
pub mod completions;
pub mod copy;
pub mod create;
pub mod csi;
pub mod delete;
pub mod diff;
pub mod doctor;
pub mod download;
pub mod drives;
pub mod info;
pub mod journal;
pub mod key;
pub mod list;
pub mod man;
pub mod manpages;
pub mod mount;
pub mod mount_helper;
pub mod output;
pub mod recover;
pub mod resize;
pub mod restore;
pub mod serve;
pub mod serve_control;
pub mod snapshot;
pub mod stats;
pub mod unmount;
pub mod upgrade;
pub mod upload;
pub mod values;

/// Exit code of a successful command.
pub const EXIT_OK: i32 = 0;
/// Exit code of a command that failed (service error, lease held, ...).
pub const EXIT_FAILED: i32 = 1;
/// Exit code of a usage error: bad arguments or flags.
pub const EXIT_USAGE: i32 = 2;

/// Azure page blobs holding fixed VHDs, as Linux disks.
#[derive(Debug, Parser)]
#[command(name = "blobdrive", version, about, long_about = None)]
#[command(
    after_help = "Account: --account or --connection-string, else AZURE_STORAGE_CONNECTION_STRING, \
else AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN, \
else the local Azurite development storage.\n\
Sign-in (--auth, or AZURE_STORAGE_AUTH_MODE=login): key, sas, or Microsoft Entra ID: \
login (service principal from AZURE_TENANT_ID/AZURE_CLIENT_ID/AZURE_CLIENT_SECRET or \
AZURE_CLIENT_CERTIFICATE_PATH, else workload identity, else managed identity, else 'az login', \
else 'azd auth login'), msi (managed identity; \
AZURE_CLIENT_ID picks a user-assigned one; IDENTITY_ENDPOINT/IDENTITY_HEADER on App Service and Arc), \
sp (service principal; AZURE_AUTHORITY_HOST for other clouds), workload (workload identity: \
AZURE_FEDERATED_TOKEN_FILE with AZURE_TENANT_ID and AZURE_CLIENT_ID, as on AKS), cli (Azure CLI), \
azd (Azure Developer CLI). \
Entra sign-in needs a role such as Storage Blob Data Contributor on the account.\n\
Secrets: the environment (or a mount's credentials= file) is the safe channel for a key, \
connection string or SAS. blobdrive hides --connection-string values and SAS URLs from \
its command line (/proc/PID/cmdline) as it starts, but other local users may see them before."
)]
pub struct Cli {
    /// Storage account connection string (default: from the environment, else Azurite).
    /// Safer in AZURE_STORAGE_CONNECTION_STRING: a command line is visible to other
    /// local users until blobdrive hides it.
    #[arg(long, global = true, value_name = "S", hide_env_values = true)]
    pub connection_string: Option<String>,

    /// Storage account name (endpoint https://NAME.blob.core.windows.net) or blob endpoint URL [default: AZURE_STORAGE_ACCOUNT].
    #[arg(long, global = true, value_name = "NAME|URL")]
    pub account: Option<String>,

    /// How to sign in: key, sas, login (Microsoft Entra ID, first available identity), msi, sp, workload, cli, azd [default: AZURE_STORAGE_AUTH_MODE, else key or SAS from the environment].
    #[arg(long, global = true, value_name = "MODE", value_parser = parse_auth_mode)]
    pub auth: Option<blob::AuthMode>,

    /// Also trust the root certificates in this PEM file for HTTPS (private endpoints, private CAs).
    #[arg(long, global = true, value_name = "PEM")]
    pub ca_file: Option<std::path::PathBuf>,

    /// Allow plain, unencrypted HTTP to a storage account that is not local development storage.
    #[arg(long, global = true)]
    pub allow_http: bool,

    /// More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands; the README documents each, with its flags and errors.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a new drive: a page blob with a fixed VHD footer (never overwrites).
    Create(create::CreateArgs),
    /// Show a drive: sizes, disk type, lease, bytes stored, snapshots.
    Info(info::InfoArgs),
    /// List the drives of the account or of one container.
    List(list::ListArgs),
    /// Attach a drive (C/B DIR) or the account/container namespace ([C] DIR).
    Mount(mount::MountArgs),
    /// Flush everything, release the lease and detach a mount.
    Unmount(unmount::UnmountArgs),
    /// Hand an attached drive (or --all of them) over to the blobdrive now
    /// installed, without unmounting it.
    Upgrade(upgrade::UpgradeArgs),
    /// Export drives over NBD (qemu, nbdinfo, nbdcopy, fio, nbd-client).
    Serve(serve::ServeArgs),
    /// Take a snapshot of a drive and print its time.
    Snapshot(snapshot::SnapshotArgs),
    /// Break a stale mount lock (the blob's lease) after a crash.
    BreakLease(break_lease::BreakLeaseArgs),
    /// Delete a drive (refused while it is leased).
    Delete(delete::DeleteArgs),
    /// Upload a raw or VHD image into a page blob.
    Upload(upload::UploadArgs),
    /// Download a page blob into a raw or VHD image.
    Download(download::DownloadArgs),
    /// Live counters of a mount.
    Stats(stats::StatsArgs),
    /// Manage the local disk cache (`cache clear`).
    Cache(cache::CacheArgs),
    /// Apply a recovery file saved when an unmount could not flush.
    Recover(recover::RecoverArgs),
    /// Grow a drive (in place while attached here), or shrink it offline.
    Resize(resize::ResizeArgs),
    /// Server-side copy of a drive or snapshot into a new, independent drive.
    Copy(copy::CopyArgs),
    /// Put a drive back to one of its snapshots (a safety snapshot first).
    Restore(restore::RestoreArgs),
    /// Ranges written and cleared between two states of a drive.
    Diff(diff::DiffArgs),
    /// Check whether a mount can work on this host, and what to fix.
    Doctor(doctor::DoctorArgs),
    /// Print a shell completion script (bash, zsh, fish).
    Completions(completions::CompletionsArgs),
    /// Write the manual pages into a directory.
    Man(man::ManArgs),
    /// Key slots of an encrypted drive: add, change, remove, dump.
    Key(key::KeyArgs),
    /// Serve the Kubernetes CSI plugin on a Unix socket.
    Csi(csi::CsiArgs),
}

impl Command {
    /// The command's name as typed.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Create(_) => "create",
            Command::Info(_) => "info",
            Command::List(_) => "list",
            Command::Mount(_) => "mount",
            Command::Unmount(_) => "unmount",
            Command::Upgrade(_) => "upgrade",
            Command::Serve(_) => "serve",
            Command::Snapshot(_) => "snapshot",
            Command::BreakLease(_) => "break-lease",
            Command::Delete(_) => "delete",
            Command::Upload(_) => "upload",
            Command::Download(_) => "download",
            Command::Stats(_) => "stats",
            Command::Cache(_) => "cache",
            Command::Recover(_) => "recover",
            Command::Resize(_) => "resize",
            Command::Copy(_) => "copy",
            Command::Restore(_) => "restore",
            Command::Diff(_) => "diff",
            Command::Doctor(_) => "doctor",
            Command::Completions(_) => "completions",
            Command::Man(_) => "man",
            Command::Key(_) => "key",
            Command::Csi(_) => "csi",
        }
    }
}

/// `--auth MODE`, with the modes' names in the error.
fn parse_auth_mode(s: &str) -> Result<blob::AuthMode, String> {
    s.parse()
}

/// What every command gets besides its own arguments.
#[derive(Debug, Clone, Default)]
pub struct Context {
    /// `--connection-string`, when given (the account code reads the environment).
    pub connection_string: Option<String>,
    /// `--auth`, `--account`, `--ca-file`, `--allow-http`.
    pub account_options: blob::AccountOptions,
}

impl Context {
    /// The account the global flags and the environment select: the one
    /// way commands pick their account (see [`blob::Account::from_env_with`]).
    pub fn account(&self) -> blob::Result<blob::Account> {
        blob::Account::from_env_with(self.connection_string.as_deref(), &self.account_options)
    }

    /// The account for a command on one blob: a blob URL that carries its
    /// own SAS (a managed-disk export) is its own account, signed in with
    /// that SAS; any other operand uses [`Context::account`].
    pub fn account_for(&self, operand: &str) -> blob::Result<blob::Account> {
        match blob::Account::from_sas_url(operand, &self.account_options)? {
            Some(account) => Ok(account),
            None => {
                let account = self.account()?;
                account.check_blob_url(operand)?;
                Ok(account)
            }
        }
    }
}

/// An error that carries its own exit code (usage errors).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CodedError {
    /// Process exit code.
    pub code: i32,
    /// The one line shown after `blobdrive: `.
    pub message: String,
}

impl CodedError {
    /// A usage error (exit code 2).
    pub fn usage(message: impl Into<String>) -> Self {
        CodedError {
            code: EXIT_USAGE,
            message: message.into(),
        }
    }
}

/// The result of a command.
pub type CmdResult = anyhow::Result<()>;

/// Entry point of the `blobdrive` binary; returns the process exit code.
pub fn main() -> i32 {
    crate::daemon::holder::close_handed_over_at_exec();
    let args: Vec<OsString> = match handed_over_command_line() {
        Some(Ok(args)) => args,
        Some(Err(err)) => {
            let _ = writeln!(
                std::io::stderr(),
                "blobdrive: cannot read the command line handed over by the attach's holder: {err}"
            );
            return crate::daemon::holder::TAKEOVER_FAILED;
        }
        None => std::env::args_os().collect(),
    };
    // First thing, now that the arguments are copied, and before a mount
    // forks its daemon: the credentials among them go from the command line.
    if let Err(err) = argv::hide_credentials() {
        use std::os::unix::ffi::OsStrExt;
        if args.iter().any(|a| argv::redact(a.as_bytes()).is_some()) {
            let _ = writeln!(
                std::io::stderr(),
                "blobdrive: warning: cannot hide the credentials on the command line from \
                 other users ({err}); give them in the environment or a credentials= file"
            );
        }
    }
    if args.first().is_some_and(mount_helper::invoked_as_helper) {
        return mount_helper::main(args);
    }
    run_with_args(args)
}

/// The command line an attach's holder hands to a new binary it starts
/// (an upgrade): the arguments of the original `blobdrive mount`, from the
/// memory file named by the environment (never from argv, where the
/// credentials among them would show). None for an ordinary start.
fn handed_over_command_line() -> Option<std::io::Result<Vec<OsString>>> {
    use std::io::Read;
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStringExt;
    let fd: i32 = std::env::var(crate::daemon::holder::ARGS_ENV)
        .ok()?
        .parse()
        .ok()?;
    std::env::remove_var(crate::daemon::holder::ARGS_ENV);
    // SAFETY: the holder passed this descriptor, open, for us alone.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    let mut text = Vec::new();
    Some(file.read_to_end(&mut text).map(|_| {
        // Each argument ends with a NUL; the memory file may be longer.
        let end = text.iter().rposition(|b| *b == 0).map_or(0, |i| i + 1);
        text[..end]
            .split(|b| *b == 0)
            .take(text[..end].iter().filter(|b| **b == 0).count())
            .map(|a| OsString::from_vec(a.to_vec()))
            .collect()
    }))
}

/// Parse `args` (program name first), run the command, report; returns the exit code.
pub fn run_with_args<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    // Kept for an upgrade of a mount's daemon, which parses them again.
    crate::daemon::holder::remember_command_line(args.clone());
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(err) => return report_clap_error(&err),
    };
    init_logging(cli.verbose, journal::drive_of(&cli.command).as_deref());
    let ctx = Context {
        connection_string: cli.connection_string.clone(),
        account_options: blob::AccountOptions {
            auth: cli.auth,
            account: cli.account.clone(),
            ca_file: cli.ca_file.clone(),
            allow_http: cli.allow_http,
        },
    };
    tracing::debug!(command = cli.command.name(), "starting");
    let result = match &cli.command {
        Command::Create(a) => create::run(&ctx, a),
        Command::Info(a) => info::run(&ctx, a),
        Command::List(a) => list::run(&ctx, a),
        Command::Mount(a) => mount::run(&ctx, a),
        Command::Unmount(a) => unmount::run(&ctx, a),
        Command::Upgrade(a) => upgrade::run(&ctx, a),
        Command::Serve(a) => serve::run(&ctx, a),
        Command::Snapshot(a) => snapshot::run(&ctx, a),
        Command::BreakLease(a) => break_lease::run(&ctx, a),
        Command::Delete(a) => delete::run(&ctx, a),
        Command::Upload(a) => upload::run(&ctx, a),
        Command::Download(a) => download::run(&ctx, a),
        Command::Stats(a) => stats::run(&ctx, a),
        Command::Cache(a) => cache::run(&ctx, a),
        Command::Recover(a) => recover::run(&ctx, a),
        Command::Resize(a) => resize::run(&ctx, a),
        Command::Copy(a) => copy::run(&ctx, a),
        Command::Restore(a) => restore::run(&ctx, a),
        Command::Diff(a) => diff::run(&ctx, a),
        Command::Doctor(a) => doctor::run(&ctx, a),
        Command::Completions(a) => completions::run(&ctx, a),
        Command::Man(a) => man::run(&ctx, a),
        Command::Key(a) => key::run(&ctx, a),
        Command::Csi(a) => csi::run(&ctx, a),
    };
    match result {
        Ok(()) => EXIT_OK,
        Err(err) => report_error(&err),
    }
}

/// Print a command's error as one line and pick its exit code.
pub fn report_error(err: &anyhow::Error) -> i32 {
    let code = err
        .downcast_ref::<CodedError>()
        .map_or(EXIT_FAILED, |e| e.code);
    // `{:#}` joins the context chain with ": " on one line.
    print_error_line(&format!("{err:#}"));
    code
}

/// Help and version go to stdout with exit 0; every other parse error becomes
/// one line on stderr with exit 2.
fn report_clap_error(err: &clap::Error) -> i32 {
    use clap::error::ErrorKind;
    match err.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            // A closed stdout (`| head`) is not an error worth reporting.
            let _ = err.print();
            EXIT_OK
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = write!(std::io::stderr(), "{}", err.render());
            EXIT_USAGE
        }
        _ => {
            print_error_line(&clap_error_line(err));
            EXIT_USAGE
        }
    }
}

/// Clap's message on one line, without its `error: ` prefix and usage block,
/// plus which `--help` to read.
fn clap_error_line(err: &clap::Error) -> String {
    let text = err.render().to_string();
    let mut parts = Vec::new();
    let mut help = "blobdrive --help".to_string();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(usage) = line.strip_prefix("Usage:") {
            // `Usage: blobdrive create [OPTIONS] ...` names the command to ask about.
            let words: Vec<&str> = usage
                .split_whitespace()
                .take_while(|w| !w.starts_with(['[', '<', '-']))
                .collect();
            if !words.is_empty() {
                help = format!("{} --help", words.join(" "));
            }
        } else if !line.starts_with("For more information") {
            parts.push(line.strip_prefix("error: ").unwrap_or(line));
        }
    }
    if parts.is_empty() {
        parts.push("invalid arguments");
    }
    let mut line = String::new();
    for part in parts {
        if !line.is_empty() {
            line.push_str(if line.ends_with(':') { " " } else { "; " });
        }
        line.push_str(part);
    }
    format!("{line} (see '{help}')")
}

/// Write `blobdrive: <message>` on stderr, folding any newline into the one line.
fn print_error_line(message: &str) {
    let one_line = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    let _ = writeln!(std::io::stderr(), "blobdrive: {one_line}");
}

/// Logs go to stderr (or to the journal under systemd, see [`journal`]):
/// warnings by default, more with each `-v`; `RUST_LOG` overrides. Calling
/// it twice (tests) keeps the first setup.
fn init_logging(verbose: u8, drive: Option<&str>) {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::EnvFilter;
    // rustls-platform-verifier logs a refused certificate as an ERROR of its
    // own (the command's error line already says it, and what to do); fuser
    // reports kernel requests it does not implement (ioctl, getxattr) and
    // replies raced by an unmount as warnings: noise unless debugging.
    let level = match verbose {
        0 => "warn,rustls_platform_verifier=off,fuser=off",
        1 => "info,rustls_platform_verifier=off,fuser=error",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    if let Some(journal) = journal::layer(drive) {
        let _ = tracing_subscriber::registry()
            .with(filter)
            .with(journal)
            .try_init();
        return;
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(verbose >= 2)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_contract_command_parses() {
        let lines: [&[&str]; 13] = [
            &["create", "c/b", "--size", "10G", "--mkfs", "ext4"],
            &[
                "info",
                "c/b",
                "--snapshot",
                "2024-01-01T00:00:00.0000000Z",
                "--json",
            ],
            &["list", "--json"],
            &["list", "c"],
            &[
                "mount",
                "c/b",
                "/mnt/x",
                "--read-only",
                "--cache-size",
                "1G",
                "--foreground",
                "--break-lease",
            ],
            &["mount", "/mnt/ns"],
            &["unmount", "/mnt/x"],
            &["snapshot", "c/b"],
            &["break-lease", "c/b"],
            &["delete", "c/b", "--include-snapshots"],
            &["upload", "disk.vhd", "c/b"],
            &["download", "c/b", "disk.vhd"],
            &["stats", "/mnt/x", "--json"],
        ];
        for line in lines {
            let argv = std::iter::once("blobdrive").chain(line.iter().copied());
            if let Err(e) = Cli::try_parse_from(argv) {
                panic!("{line:?}: {e}");
            }
        }
    }

    #[test]
    fn lifecycle_commands_parse() {
        let lines: [&[&str]; 9] = [
            &["resize", "c/b", "--size", "3G", "--json"],
            &["resize", "c/b", "--size", "1G", "--allow-shrink"],
            &["copy", "c/b", "c/clone", "--snapshot", "T", "--json"],
            &["restore", "c/b", "--snapshot", "T", "--no-safety-snapshot"],
            &["snapshot", "c/b", "--keep", "3", "--json"],
            &["snapshot", "delete", "c/b", "T"],
            &["diff", "c/b", "--from", "T1", "--to", "T2", "--json"],
            &[
                "download",
                "c/b",
                "f.vhd",
                "--since",
                "T1",
                "--snapshot",
                "T2",
            ],
            &[
                "download", "c/b", "f.img", "--since", "T1", "--raw", "--json",
            ],
        ];
        for line in lines {
            let argv = std::iter::once("blobdrive").chain(line.iter().copied());
            if let Err(e) = Cli::try_parse_from(argv) {
                panic!("{line:?}: {e}");
            }
        }
        // --keep 0 would delete the snapshot just taken.
        assert!(Cli::try_parse_from(["blobdrive", "snapshot", "c/b", "--keep", "0"]).is_err());
    }

    #[test]
    fn upgrade_takes_one_directory_or_all_but_not_both() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("blobdrive").chain(args.iter().copied()))
        };
        assert!(parse(&["upgrade", "/mnt/x"]).is_ok());
        assert!(parse(&["upgrade", "--all", "--json"]).is_ok());
        // Neither: nothing says which drive to hand over.
        assert!(parse(&["upgrade"]).is_err());
        assert!(parse(&["upgrade", "/mnt/x", "--all"]).is_err());
    }

    #[test]
    fn connection_string_is_global() {
        let cli = Cli::try_parse_from(["blobdrive", "list", "--connection-string", "X=1"])
            .expect("parses");
        assert_eq!(cli.connection_string.as_deref(), Some("X=1"));
    }

    #[test]
    fn sign_in_flags_are_global() {
        let cli = Cli::try_parse_from([
            "blobdrive",
            "list",
            "--auth",
            "login",
            "--account",
            "myacct",
            "--ca-file",
            "/tmp/ca.pem",
            "--allow-http",
        ])
        .expect("parses");
        assert_eq!(cli.auth, Some(blob::AuthMode::Login));
        assert_eq!(cli.account.as_deref(), Some("myacct"));
        assert!(cli.allow_http);
        let e = Cli::try_parse_from(["blobdrive", "list", "--auth", "password"]).unwrap_err();
        assert!(e.to_string().contains("login"), "{e}");
    }

    #[test]
    fn usage_errors_exit_2_and_failures_exit_1() {
        let err = anyhow::Error::new(CodedError::usage("bad flag"));
        assert_eq!(err.to_string(), "bad flag");
        assert_eq!(report_error(&err), EXIT_USAGE);
        assert_eq!(report_error(&anyhow::anyhow!("boom")), EXIT_FAILED);
    }
}
