//! `blobdrive doctor [C/B] [--json]`: can a mount work on this host, and what
//! to fix. Each check prints one line, `OK`, `WARN` or `FAIL`, what it found
//! and, when not OK, what to do. The exit code is 0 only when no check
//! failed, i.e. when a mount would work.
//!
//! Nothing is changed: the storage checks use the non-mutating probes of
//! `blob::probe` (the write and lease permissions are inferred from how the
//! service refuses a harmless request), and the local checks only look.
//! Every request has a short time limit, so an unreachable endpoint fails
//! in seconds, not after the two-minute retry budget.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde::Serialize;

use super::{output, CmdResult, Context};
use crate::blob::{probe, BlobClient, BlobPath, Credential, ListBlobsOptions, RetryPolicy};

/// Shared Key requests fail when the clocks differ by more than this.
const MAX_CLOCK_SKEW_SECS: i64 = 15 * 60;
/// Time limit of one probe request.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Arguments of `doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The drive to check access to (without it, only the account is checked).
    #[arg(value_name = "C/B")]
    pub drive: Option<String>,
    /// Print JSON for scripts instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    /// Fine.
    Ok,
    /// Not needed for every mount, or worth a look.
    Warn,
    /// A mount would not work.
    Fail,
}

/// One check's line.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Short name (`fuse device`, `credentials: write`).
    pub name: String,
    /// OK, WARN or FAIL.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to do (when not OK).
    pub fix: Option<String>,
    /// True when the result is inferred rather than tried (write, lease).
    pub inferred: bool,
}

#[derive(Default)]
struct Report(Vec<Check>);

impl Report {
    fn add(&mut self, name: &str, status: Status, detail: impl Into<String>, fix: Option<String>) {
        self.0.push(Check {
            name: name.to_string(),
            status,
            detail: detail.into(),
            fix,
            inferred: false,
        });
    }
    fn ok(&mut self, name: &str, detail: impl Into<String>) {
        self.add(name, Status::Ok, detail, None);
    }
    fn warn(&mut self, name: &str, detail: impl Into<String>, fix: impl Into<String>) {
        self.add(name, Status::Warn, detail, Some(fix.into()));
    }
    fn fail(&mut self, name: &str, detail: impl Into<String>, fix: impl Into<String>) {
        self.add(name, Status::Fail, detail, Some(fix.into()));
    }
}

/// Run every check, print the report, fail when any check failed.
pub fn run(ctx: &Context, args: &DoctorArgs) -> CmdResult {
    let drive = match &args.drive {
        Some(d) => Some(BlobPath::parse(d)?),
        None => None,
    };
    let mut report = Report::default();
    local_checks(&mut report);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(storage_checks(ctx, drive.as_ref(), &mut report));
    let failed = report.0.iter().filter(|c| c.status == Status::Fail).count();
    if args.json {
        output::print_json(&serde_json::json!({ "ok": failed == 0, "checks": report.0 }));
    } else {
        output::print_text(&render(&report.0));
    }
    if failed > 0 {
        anyhow::bail!(
            "{failed} check{} failed; a mount would not work here (see the FAIL lines)",
            if failed == 1 { "" } else { "s" }
        );
    }
    Ok(())
}

fn render(checks: &[Check]) -> String {
    let width = checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
    let mut out = String::new();
    for c in checks {
        let status = match c.status {
            Status::Ok => "OK  ",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        };
        let inferred = if c.inferred { " (inferred)" } else { "" };
        out.push_str(&format!(
            "{status} {:width$}  {}{inferred}",
            c.name, c.detail
        ));
        if let Some(fix) = &c.fix {
            out.push_str(&format!(": {fix}"));
        }
        out.push('\n');
    }
    out
}

fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Open the character device at `path` for reading and writing (what
/// mounting does with it); anything else there is an error.
fn open_rw(path: &str) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::FileTypeExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    if !file.metadata()?.file_type().is_char_device() {
        return Err(std::io::Error::other("not a character device"));
    }
    Ok(file)
}

/// This host: FUSE, loop devices, privileges, tools, directories.
fn local_checks(r: &mut Report) {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let fuse_fs = std::fs::read_to_string("/proc/filesystems")
        .is_ok_and(|s| s.lines().any(|l| l.trim_end().ends_with("\tfuse")));
    match open_rw("/dev/fuse") {
        Ok(_) => r.ok("fuse device", format!("/dev/fuse opens; kernel {kernel}, FUSE {}", if fuse_fs { "registered" } else { "not listed in /proc/filesystems" })),
        Err(e) => r.fail("fuse device", format!("cannot open /dev/fuse: {e}"),
            "load the module (modprobe fuse), or in a container pass the device (--device /dev/fuse)"),
    }
    match open_rw("/dev/loop-control") {
        Ok(_) => r.ok("loop devices", "/dev/loop-control opens"),
        Err(e) => r.fail("loop devices", format!("cannot open /dev/loop-control: {e}"),
            "load the loop module (modprobe loop) or run with the loop devices available; a namespace mount ('blobdrive mount C DIR') needs none"),
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        r.ok("mount privileges", "running as root");
    } else {
        r.fail(
            "mount privileges",
            "not root: attaching a drive sets up a loop device and mounts a filesystem",
            "run it with sudo; a namespace mount works without root",
        );
    }
    match find_tool("fusermount3") {
        Some(p) => r.ok("fusermount3", p.display().to_string()),
        None => r.warn(
            "fusermount3",
            "not found",
            "install fuse3 (needed to mount FUSE without root)",
        ),
    }
    for tool in ["losetup", "blkid", "mount"] {
        match find_tool(tool) {
            Some(p) => r.ok(tool, p.display().to_string()),
            None => r.fail(tool, "not found", "install util-linux"),
        }
    }
    for (fs, tools, package) in [
        ("ext4 tools", ["mkfs.ext4", "fsck.ext4"], "e2fsprogs"),
        ("xfs tools", ["mkfs.xfs", "xfs_repair"], "xfsprogs"),
    ] {
        let missing: Vec<&str> = tools
            .into_iter()
            .filter(|t| find_tool(t).is_none())
            .collect();
        if missing.is_empty() {
            r.ok(fs, tools.join(", "));
        } else {
            r.warn(
                fs,
                format!("{} not found", missing.join(", ")),
                format!("install {package} to create or check drives with this filesystem"),
            );
        }
    }
    check_dir(r, "run directory", &crate::daemon::mountpoint::run_dir());
    check_dir(r, "recovery directory", &crate::recovery::dir());
    let unapplied: Vec<PathBuf> = std::fs::read_dir(crate::recovery::dir())
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "bdrec"))
        .collect();
    match unapplied.first() {
        None => r.ok("recovery files", "none waiting"),
        Some(first) => r.warn(
            "recovery files",
            format!("{} unapplied (e.g. {})", unapplied.len(), first.display()),
            format!(
                "apply each before mounting its drive read-write: blobdrive recover {}",
                first.display()
            ),
        ),
    }
    let stale: Vec<_> = crate::daemon::registry::list_mounted()
        .into_iter()
        .filter(|e| !e.alive)
        .collect();
    match stale.first() {
        None => r.ok("registry", "no stale entries"),
        Some(e) => r.warn(
            "registry",
            format!(
                "{} entr{} of dead daemons (e.g. {} at {})",
                stale.len(),
                if stale.len() == 1 { "y" } else { "ies" },
                e.drive,
                e.dir.display()
            ),
            format!(
                "run 'blobdrive unmount {}', then 'blobdrive break-lease {}' if it was read-write",
                e.dir.display(),
                e.drive
            ),
        ),
    }
}

/// A directory blobdrive writes into: writable if it exists, else its
/// nearest existing parent must be (it is created on first use).
fn check_dir(r: &mut Report, name: &str, dir: &Path) {
    let mut probe = dir;
    while !probe.exists() {
        match probe.parent() {
            Some(p) => probe = p,
            None => break,
        }
    }
    let c = std::ffi::CString::new(probe.as_os_str().as_encoded_bytes()).unwrap_or_default();
    // SAFETY: `c` is a valid NUL-terminated path for the call's duration.
    let writable = unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } == 0;
    let what = if probe == dir {
        "writable".to_string()
    } else {
        format!(
            "missing; {} is writable, so it will be created",
            probe.display()
        )
    };
    if writable {
        r.ok(name, format!("{} {what}", dir.display()));
    } else {
        r.fail(name, format!("{} is not writable here", probe.display()),
            "run as root (sudo), or point BLOBDRIVE_RUN_DIR / BLOBDRIVE_RECOVERY_DIR at a directory you own");
    }
}

/// The account and, when given, the drive: reachability, TLS, clock, and
/// what the credentials allow.
async fn storage_checks(ctx: &Context, drive: Option<&BlobPath>, r: &mut Report) {
    let account = match ctx.account() {
        Ok(a) => a,
        Err(e) => {
            return r.fail(
                "account",
                e.to_string(),
                "fix the connection string or AZURE_STORAGE_* variables",
            )
        }
    };
    let cred = match &account.credential {
        Credential::SharedKey { .. } => "shared key",
        Credential::Sas(_) => "SAS token",
        Credential::Token(_) => "Microsoft Entra ID",
        Credential::Anonymous => "anonymous",
    };
    r.ok(
        "account",
        format!("{} at {} ({cred})", account.name, account.endpoint),
    );
    let client = match BlobClient::new(account) {
        Ok(c) => c,
        Err(e) => {
            return r.fail(
                "client",
                e.to_string(),
                "use an https:// endpoint, or --allow-http for a trusted test endpoint",
            )
        }
    };
    let client = client.with_retry(RetryPolicy {
        max_attempts: 2,
        max_total: PROBE_TIMEOUT * 2,
        attempt_timeout: PROBE_TIMEOUT,
        ..RetryPolicy::default()
    });
    match probe::endpoint(&client, PROBE_TIMEOUT).await {
        Err(e) => {
            return r.fail("endpoint", format!("unreachable: {}", e.message),
                "check the network, DNS, a proxy or firewall, and the endpoint in the connection string");
        }
        Ok(answer) => {
            let tls = if answer.tls {
                "TLS certificate verified"
            } else {
                "plain HTTP"
            };
            r.ok(
                "endpoint",
                format!("answers in {} ms ({tls})", answer.round_trip.as_millis()),
            );
            match answer.clock_skew_secs {
                None => r.warn("clock", "the service sent no Date header", "check the endpoint is Azure Blob Storage"),
                Some(s) if s.abs() > MAX_CLOCK_SKEW_SECS => r.fail("clock",
                    format!("this host's clock is {} s {} the service's", s.abs(), if s > 0 { "behind" } else { "ahead of" }),
                    "Shared Key and SAS requests fail beyond 15 minutes: synchronise the clock (timedatectl set-ntp true, chrony)"),
                Some(s) if s.abs() > 60 => r.warn("clock", format!("{} s off the service's", s.abs()), "synchronise the clock (NTP)"),
                Some(s) => r.ok("clock", format!("within {} s of the service's", s.abs().max(1))),
            }
        }
    }
    let Some(path) = drive else {
        match client.list_containers().await {
            Ok(c) => r.ok(
                "credentials: list",
                format!("{} containers visible", c.len()),
            ),
            Err(e) => credential_failure(r, "credentials: list", &e),
        }
        return;
    };
    let list = ListBlobsOptions {
        prefix: Some(path.name.clone()),
        max_results: Some(1),
        ..Default::default()
    };
    match client.list_blobs(&path.container, &list).await {
        Ok(_) => r.ok(
            "credentials: list",
            format!("may list container {}", path.container),
        ),
        Err(e) if e.is_not_found() => {
            return r.fail(
                "drive",
                format!("container {} does not exist", path.container),
                format!("create a drive with 'blobdrive create {path} --size SIZE'"),
            )
        }
        Err(e) => credential_failure(r, "credentials: list", &e),
    }
    let props = match client.get_properties(path).await {
        Ok(p) => p,
        Err(e) if e.is_not_found() => {
            return r.fail(
                "drive",
                format!("{path} does not exist"),
                format!("'blobdrive list {}' shows the drives there", path.container),
            )
        }
        Err(e) => return credential_failure(r, "credentials: read", &e),
    };
    let size = props.content_length;
    let footer_at = size.saturating_sub(crate::units::VHD_FOOTER_BYTES);
    match client
        .get_blob_range(path, crate::units::ByteRange::new(footer_at, size))
        .await
    {
        Ok(bytes) => {
            r.ok(
                "credentials: read",
                "may read the blob (properties and its last 512 bytes)",
            );
            let footer: Option<&[u8; 512]> = bytes.as_ref().try_into().ok();
            let parsed = match footer {
                Some(f) => crate::vhd::Footer::parse(f, size).map_err(|e| e.to_string()),
                None => Err(format!("the blob is only {size} bytes")),
            };
            match parsed {
                Ok(_) => r.ok(
                    "drive",
                    format!(
                        "{path} is a fixed VHD drive, lease {}",
                        props
                            .lease_state
                            .map_or("unknown".to_string(), |l| format!("{l:?}").to_lowercase())
                    ),
                ),
                Err(e) => r.fail(
                    "drive",
                    format!("{path} is not a drive: {e}"),
                    "use a page blob holding a fixed VHD",
                ),
            }
        }
        Err(e) => credential_failure(r, "credentials: read", &e),
    }
    if path.snapshot.is_some() {
        return;
    }
    let leased = props
        .lease_state
        .is_some_and(|l| format!("{l:?}").eq_ignore_ascii_case("leased"));
    for (name, outcome, why) in [
        (
            "credentials: write",
            probe::may_write(&client, path, size).await,
            "a read-write mount writes pages",
        ),
        (
            "credentials: lease",
            probe::may_lease(&client, path).await,
            "a read-write mount holds the lease",
        ),
    ] {
        let check = match outcome {
            Ok(true) => Check { name: name.into(), status: Status::Ok, detail: "allowed (asked without changing the drive)".into(), fix: None, inferred: true },
            Ok(false) => Check { name: name.into(), status: Status::Warn,
                detail: format!("refused (403): {why}"),
                fix: Some("mount read-only (--read-only), or use credentials that allow writing (SAS with r,w,l permissions; Storage Blob Data Contributor)".into()), inferred: true },
            Err(e) => Check { name: name.into(), status: Status::Warn, detail: format!("could not tell: {e}"), fix: Some("try the mount".into()), inferred: true },
        };
        r.0.push(check);
    }
    if leased {
        r.warn("lease", format!("{path} is leased (mounted elsewhere, or a crashed mount)"),
            format!("a read-write mount will be refused; if that host is gone: blobdrive break-lease {path}"));
    }
}

/// A refused request, named for what the user must fix.
fn credential_failure(r: &mut Report, name: &str, e: &crate::blob::Error) {
    // Azurite says AuthorizationFailure where the service says AuthenticationFailed.
    let refused = matches!(
        e.code(),
        Some("AuthenticationFailed" | "AuthorizationFailure")
    );
    if refused || e.status == Some(401) {
        r.fail(
            name,
            format!(
                "the service refused the credentials ({})",
                e.code().unwrap_or("HTTP 401")
            ),
            "check the account key or SAS token (and that it has not expired)",
        );
    } else if e.status == Some(403) {
        r.fail(name, format!("refused ({})", e.code().unwrap_or("HTTP 403")),
            "the SAS token or identity does not allow this: reading needs r and l permissions (Storage Blob Data Reader)");
    } else {
        r.fail(name, e.to_string(), "see the error");
    }
}
