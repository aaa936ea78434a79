//! Operability, end to end through the built binary: the manual pages render
//! without warnings, shell completions complete commands and options in real
//! bash and zsh, `doctor` passes on this machine and names what is broken
//! (a wrong key, an unreachable endpoint, a read-only SAS), and a live
//! mount's metrics pass `promtool check metrics` and grow with a workload.
//!
//! Needs `man` (man-db), `bash`, `zsh`, `promtool` and the Python SDK
//! (installed by scripts/setup.sh); the mount test needs root, /dev/fuse and
//! loop devices (SKIPPED otherwise, a failure under BLOBDRIVE_REQUIRE_FUSE=1).

mod common;
mod mount_support;
mod system;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::ContainerGuard;
use mount_support::{promtool_check, Sandbox};

const BIN: &str = env!("CARGO_BIN_EXE_blobdrive");

fn blobdrive(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env(
            "AZURE_STORAGE_CONNECTION_STRING",
            common::connection_string(),
        )
        .env("BLOBDRIVE_RECOVERY_DIR", common::recovery_dir())
        .stdin(Stdio::null())
        .output()
        .expect("run blobdrive")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A tool the test needs; its absence is a failure that says how to fix it.
fn need(tool: &str, package: &str) {
    assert!(
        blobdrive::attach::tool_exists(tool),
        "{tool} is not installed: run scripts/setup.sh (it installs {package})"
    );
}

#[test]
fn every_man_page_renders_without_warnings() {
    need("man", "man-db");
    let dir = tempfile::tempdir().unwrap();
    let out = blobdrive(&["man", &dir.path().to_string_lossy()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut pages: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    pages.sort();
    let names: Vec<String> = pages
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for want in [
        "blobdrive.1",
        "blobdrive-mount.1",
        "blobdrive-doctor.1",
        "mount.blobdrive.8",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} not written: {names:?}"
        );
    }
    for page in &pages {
        let out = Command::new("man")
            .args(["--warnings", "-l"])
            .arg(page)
            .env("MANWIDTH", "80")
            .stdin(Stdio::null())
            .output()
            .expect("run man");
        assert!(
            out.status.success(),
            "man -l {}: {}",
            page.display(),
            text(&out.stderr)
        );
        assert_eq!(
            text(&out.stderr),
            "",
            "warnings rendering {}",
            page.display()
        );
        // Bold and underline come as overstrikes (`X\bX`): keep the last char.
        let mut shown = String::new();
        for c in text(&out.stdout).chars() {
            if c == '\u{8}' {
                shown.pop();
            } else {
                shown.push(c);
            }
        }
        assert!(
            shown.contains("EXIT STATUS"),
            "{}: no EXIT STATUS",
            page.display()
        );
        if page.ends_with("blobdrive.1") {
            for section in [
                "FILES",
                "ENVIRONMENT",
                "EXAMPLES",
                "SUBCOMMANDS",
                "BLOBDRIVE_RUN_DIR",
            ] {
                assert!(
                    shown.contains(section),
                    "blobdrive(1) lacks {section}:\n{shown}"
                );
            }
        }
        if page.ends_with("mount.blobdrive.8") {
            assert!(
                shown.contains("credentials=PATH") && shown.contains("_netdev"),
                "{shown}"
            );
        }
    }
}

#[test]
fn bash_completion_completes_commands_and_options() {
    need("bash", "bash");
    let script = text(&blobdrive(&["completions", "bash"]).stdout);
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), script).unwrap();
    // What bash's programmable completion does on TAB: set COMP_* and call
    // the function `complete -p blobdrive` names.
    let probe = r#"
source "$1"
spec=$(complete -p blobdrive) || exit 3
fn=$(sed -E 's/.*-F ([^ ]+).*/\1/' <<<"$spec")
ask() { COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
  COMPREPLY=(); "$fn" blobdrive "${COMP_WORDS[-1]}" "${COMP_WORDS[-2]}"; echo "${COMPREPLY[*]}"; }
ask blobdrive mou
ask blobdrive mount --metrics
ask blobdrive stats --prom
ask blobdrive completions z
"#;
    let out = Command::new("bash")
        .args(["-c", probe, "probe", &file.path().to_string_lossy()])
        .output()
        .unwrap();
    let shown = text(&out.stdout);
    let lines: Vec<&str> = shown.lines().collect();
    assert!(
        out.status.success() && lines.len() == 4,
        "{shown}{}",
        text(&out.stderr)
    );
    assert_eq!(lines[0], "mount");
    for option in [
        "--metrics-listen",
        "--metrics-textfile",
        "--metrics-allow-remote",
    ] {
        assert!(
            lines[1].split(' ').any(|w| w == option),
            "{option}: {}",
            lines[1]
        );
    }
    assert_eq!(lines[2], "--prometheus");
    assert_eq!(lines[3], "zsh");
}

#[test]
fn zsh_completion_completes_commands_and_options() {
    need("zsh", "zsh");
    let script = text(&blobdrive(&["completions", "zsh"]).stdout);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("_blobdrive"), script).unwrap();
    // An interactive zsh on a pseudo-terminal (zsh/zpty): type a partial
    // word, press TAB, then turn the line into `echo ZZ <line>` and run it:
    // the echoed line is what completion made of it. Each step waits for its
    // answer (no fixed sleeps); `timeout` bounds the whole run.
    let driver = r#"
zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z "unset zle_bracketed_paste; PS1='%% '; fpath=($1 \$fpath); autoload -U compinit; compinit -u -D; print RE''ADY"
zpty -r z out '*READY*'
zpty -w -n z $'blobdrive mou\t\C-aecho ZZ \n'
zpty -r z out $'*ZZ blobdrive mount\r*' && print "completed: blobdrive mount"
zpty -w -n z $'blobdrive mount --metrics-te\t\C-aecho ZZ \n'
zpty -r z out '*ZZ blobdrive mount --metrics-textfile*' && print "completed: --metrics-textfile"
zpty -w -n z $'blobdrive doctor --js\t\C-aecho ZZ \n'
zpty -r z out '*ZZ blobdrive doctor --json*' && print "completed: --json"
zpty -d z
"#;
    let out = Command::new("timeout")
        .args([
            "60",
            "zsh",
            "-f",
            "-c",
            driver,
            "driver",
            &dir.path().to_string_lossy(),
        ])
        .env(
            "PATH",
            format!(
                "{}:{}",
                Path::new(BIN).parent().unwrap().display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .output()
        .unwrap();
    let shown = text(&out.stdout);
    for completed in [
        "completed: blobdrive mount",
        "completed: --metrics-textfile",
        "completed: --json",
    ] {
        assert!(
            shown.contains(completed),
            "zsh did not complete ({completed}; exit {}):\n{shown}{}",
            out.status,
            text(&out.stderr)
        );
    }
}

/// `doctor` against Azurite: every check passes on this machine with a real
/// drive, and the drive is unchanged by it (same ETag).
#[test]
fn doctor_passes_here_and_changes_nothing() {
    if !system::can_run("doctor_passes_here_and_changes_nothing", true) {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let g = rt.block_on(ContainerGuard::new("doctor"));
    let drive = format!("{}/d.vhd", g.name);
    let out = blobdrive(&["create", &drive, "--size", "16M"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let etag = |g: &ContainerGuard| {
        rt.block_on(g.client.get_properties(&g.path("d.vhd")))
            .unwrap()
            .etag
    };
    let before = etag(&g);
    let out = blobdrive(&["doctor", &drive, "--json"]);
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("doctor --json prints JSON");
    assert!(
        out.status.success(),
        "doctor failed here: {report:#}\n{}",
        text(&out.stderr)
    );
    assert_eq!(report["ok"], true);
    let checks = report["checks"].as_array().unwrap();
    let find = |name: &str| {
        checks
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no check {name}: {report:#}"))
    };
    for name in [
        "fuse device",
        "loop devices",
        "endpoint",
        "clock",
        "credentials: read",
        "drive",
    ] {
        assert_eq!(find(name)["status"], "OK", "{name}: {report:#}");
    }
    for name in ["credentials: write", "credentials: lease"] {
        assert_eq!(find(name)["status"], "OK", "{name}: {report:#}");
        assert_eq!(find(name)["inferred"], true);
    }
    assert_eq!(etag(&g), before, "doctor changed the drive");
    let props = rt
        .block_on(g.client.get_properties(&g.path("d.vhd")))
        .unwrap();
    assert_ne!(
        props.lease_state.map(|l| format!("{l:?}")).as_deref(),
        Some("Leased"),
        "doctor left a lease"
    );
}

#[test]
fn doctor_names_a_wrong_key_and_an_unreachable_endpoint() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let g = rt.block_on(ContainerGuard::new("doctor-bad"));
    let drive = format!("{}/d.vhd", g.name);
    assert!(blobdrive(&["create", &drive, "--size", "16M"])
        .status
        .success());
    let endpoint = common::azurite_url();
    let wrong_key =
        "d3Jvbmcga2V5IHdyb25nIGtleSB3cm9uZyBrZXkgd3Jvbmcga2V5IHdyb25nIGtleSB3cm9uZyBrZXk=";
    let cs = format!("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={wrong_key};BlobEndpoint={endpoint};");
    let out = blobdrive(&["--connection-string", &cs, "doctor", &drive]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let shown = text(&out.stdout);
    let line = shown
        .lines()
        .find(|l| l.starts_with("FAIL credentials"))
        .unwrap_or_else(|| panic!("no credentials failure:\n{shown}"));
    assert!(
        line.contains("refused the credentials") && line.contains("check the account key"),
        "{line}"
    );
    assert!(
        text(&out.stderr).starts_with("blobdrive: 1 check failed")
            || text(&out.stderr).contains("checks failed"),
        "{}",
        text(&out.stderr)
    );

    // Nothing listens on port 9 of loopback: refused at once, and doctor stops there.
    let dead = format!("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={wrong_key};BlobEndpoint=http://127.0.0.1:9/devstoreaccount1;");
    let started = Instant::now();
    let out = blobdrive(&["--connection-string", &dead, "doctor", &drive]);
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "doctor took {:?}",
        started.elapsed()
    );
    assert_eq!(out.status.code(), Some(1));
    let shown = text(&out.stdout);
    let line = shown
        .lines()
        .find(|l| l.starts_with("FAIL endpoint"))
        .unwrap_or_else(|| panic!("no endpoint failure:\n{shown}"));
    assert!(
        line.contains("unreachable") && line.contains("Connection refused"),
        "{line}"
    );
    assert!(
        !shown.contains("FAIL credentials"),
        "no credential check after an unreachable endpoint:\n{shown}"
    );
}

const PY_READ_SAS: &str = r#"
import os, sys, datetime
from azure.storage.blob import generate_container_sas, ContainerSasPermissions
cs = dict(kv.split("=", 1) for kv in os.environ["CS"].split(";") if kv)
print(generate_container_sas(cs["AccountName"], sys.argv[1], account_key=cs["AccountKey"],
    permission=ContainerSasPermissions(read=True, list=True),
    expiry=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)))
"#;

/// A read-only SAS: a read-only mount works (exit 0), writing and leasing are
/// reported refused, as inferred.
#[test]
fn doctor_says_a_read_only_sas_cannot_write() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let g = rt.block_on(ContainerGuard::new("doctor-sas"));
    let drive = format!("{}/d.vhd", g.name);
    assert!(blobdrive(&["create", &drive, "--size", "16M"])
        .status
        .success());
    let sas = common::python(PY_READ_SAS, &[&g.name]);
    let cs = format!(
        "BlobEndpoint={};SharedAccessSignature={sas}",
        common::azurite_url()
    );
    let out = blobdrive(&["--connection-string", &cs, "doctor", &drive, "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let checks = report["checks"].as_array().unwrap();
    let find = |name: &str| {
        checks
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no {name}: {report:#}"))
    };
    assert_eq!(find("credentials: read")["status"], "OK", "{report:#}");
    for name in ["credentials: write", "credentials: lease"] {
        assert_eq!(find(name)["status"], "WARN", "{report:#}");
        assert!(
            find(name)["detail"].as_str().unwrap().contains("refused"),
            "{report:#}"
        );
        assert!(
            find(name)["fix"].as_str().unwrap().contains("--read-only"),
            "{report:#}"
        );
    }
}

/// A free loopback port (bound and released; the daemon binds it next).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn scrape(port: u16, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the metrics listener");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    (head.to_string(), body.to_string())
}

fn text_of(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The value of the sample `name{labels}` in `text`.
fn sample(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .unwrap_or_else(|| panic!("no {series} in:\n{text}")) as u64
}

#[test]
fn metrics_of_a_live_mount_pass_promtool_and_grow_with_a_workload() {
    if !system::can_run("metrics_of_a_live_mount", true) {
        return;
    }
    need("promtool", "promtool (from Debian's prometheus package)");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let g = rt.block_on(ContainerGuard::new("metrics"));
    let drive = format!("{}/m.vhd", g.name);
    let sb = Sandbox::new(common::connection_string());
    sb.blobdrive_ok(&["create", &drive, "--size", "64M", "--mkfs", "ext4"]);
    let port = free_port();
    let textfiles = sb.dir("textfiles");
    let port_s = port.to_string();
    let textfiles_s = textfiles.to_string_lossy().to_string();
    let m = sb.mount(
        "m",
        Some(&drive),
        &[
            "--metrics-listen",
            &port_s,
            "--metrics-textfile",
            &textfiles_s,
        ],
    );

    let (head, before) = scrape(port, "/metrics");
    assert!(
        head.starts_with("HTTP/1.1 200") && head.contains("text/plain; version=0.0.4"),
        "{head}"
    );
    promtool_check(&before);
    let series = |name: &str| format!("{name}{{drive=\"{drive}\"}}");
    let puts = |t: &str| {
        sample(
            t,
            &format!("blobdrive_requests_total{{drive=\"{drive}\",kind=\"put_page\"}}"),
        )
    };
    let put_before = puts(&before);

    // A workload: 8 MiB written and fsynced inside the filesystem.
    let out = Command::new("dd")
        .args([
            "if=/dev/urandom",
            &format!("of={}", m.path("f").display()),
            "bs=1M",
            "count=8",
            "conv=fsync",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text_of(&out.stderr));

    let (_, after) = scrape(port, "/metrics");
    promtool_check(&after);
    assert!(
        puts(&after) > put_before,
        "Put Page count did not grow:\n{after}"
    );
    assert!(
        sample(&after, &series("blobdrive_written_bytes_total")) >= 8 << 20,
        "{after}"
    );
    assert!(
        sample(&after, &series("blobdrive_fsync_duration_seconds_count")) >= 1,
        "{after}"
    );
    assert!(
        sample(&after, &series("blobdrive_put_page_duration_seconds_count")) >= 1,
        "{after}"
    );
    assert!(
        after.contains(&format!(
            "blobdrive_request_retries_total{{drive=\"{drive}\",reason=\"throttled\"}} 0"
        )),
        "{after}"
    );
    assert_eq!(
        scrape(port, "/other").0.lines().next().unwrap(),
        "HTTP/1.1 404 Not Found"
    );

    // The same text from the CLI, and in the textfile.
    let cli = sb.blobdrive_ok(&["stats", &m.dir.to_string_lossy(), "--prometheus"]);
    promtool_check(&cli);
    assert!(puts(&cli) >= puts(&after));
    let files: Vec<_> = std::fs::read_dir(&textfiles)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(
        files[0].extension().is_some_and(|x| x == "prom"),
        "{files:?}"
    );
    promtool_check(&std::fs::read_to_string(&files[0]).unwrap());

    m.unmount();
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "listener still open after unmount"
    );
    assert_eq!(
        std::fs::read_dir(&textfiles).unwrap().count(),
        0,
        "textfile left behind"
    );
}

#[test]
fn metrics_listener_refuses_other_addresses_unless_asked() {
    let out = blobdrive(&[
        "mount",
        "c/d.vhd",
        "/nonexistent",
        "--metrics-listen",
        "0.0.0.0:9100",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.starts_with("blobdrive: metrics address 0.0.0.0:9100 is not loopback")
            && err.contains("--metrics-allow-remote"),
        "{err}"
    );
    let out = blobdrive(&[
        "mount",
        "c/d.vhd",
        "/nonexistent",
        "--metrics-listen",
        "nine",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("invalid metrics address 'nine'"),
        "{}",
        text(&out.stderr)
    );
}

/// Under systemd (`JOURNAL_STREAM` naming stderr) logs go to the journal;
/// without a journal socket they must still reach stderr, never vanish.
#[test]
fn logs_stay_on_stderr_when_the_journal_socket_is_missing() {
    use std::os::unix::fs::MetadataExt as _;
    if Path::new("/run/systemd/journal/socket").exists() {
        println!("SKIPPED: a journal listens here; this test is for hosts without one");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr");
    let file = std::fs::File::create(&log).unwrap();
    let meta = file.metadata().unwrap();
    let status = Command::new(BIN)
        .args(["-vv", "man", &dir.path().join("pages").to_string_lossy()])
        .env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
        .env("INVOCATION_ID", "0123456789abcdef0123456789abcdef")
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(file)
        .status()
        .unwrap();
    assert!(status.success());
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("starting") && logged.contains("command=\"man\""),
        "{logged}"
    );
}

/// 503 ServerBusy answers (from the fault proxy in front of Azurite) are
/// counted as throttled retries of the drive they were aimed at.
#[test]
fn throttled_requests_are_counted_by_reason() {
    use common::fault_proxy::{Fault, FaultProxy};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let g = rt.block_on(ContainerGuard::new("throttle"));
    let path = g.path("t.vhd");
    rt.block_on(g.client.create_page_blob(&path, 1 << 20))
        .unwrap();
    let proxy = rt.block_on(FaultProxy::start(
        &common::account().endpoint,
        Fault::ServerBusy,
        2,
    ));
    let mut account = common::account();
    account.endpoint = proxy.endpoint.clone();
    let client = blobdrive::blob::BlobClient::new(account).unwrap();
    rt.block_on(client.get_properties(&path))
        .expect("succeeds after two 503s");
    let snapshot = blobdrive::metrics::registry().snapshot();
    let drive = &snapshot[&path.to_string()];
    let count = |reason: &str| {
        drive
            .retries
            .iter()
            .find(|(r, _)| r.label() == reason)
            .map(|(_, n)| *n)
            .unwrap()
    };
    assert_eq!(count("throttled"), 2, "{drive:?}");
    assert_eq!(count("server_error") + count("transport"), 0, "{drive:?}");
    let text = blobdrive::metrics::text::render(&serde_json::Map::new(), &snapshot);
    let series =
        format!("blobdrive_request_retries_total{{drive=\"{path}\",reason=\"throttled\"}} 2");
    assert!(text.contains(&series), "{text}");
}

/// A service whose clock is an hour behind ours: doctor fails on the clock
/// and says what to do. (A stand-in endpoint answering 403 with that `Date`,
/// since Azurite's clock is this host's.)
#[test]
fn doctor_fails_on_a_skewed_clock() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let stale = httpdate::fmt_http_date(std::time::SystemTime::now() - Duration::from_secs(3600));
    std::thread::spawn(move || {
        for stream in listener.incoming().take(16) {
            let Ok(mut s) = stream else { continue };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let body = "<?xml version=\"1.0\"?><Error><Code>AuthenticationFailed</Code></Error>";
            let _ = write!(
                s,
                "HTTP/1.1 403 Forbidden\r\nDate: {stale}\r\nx-ms-error-code: AuthenticationFailed\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let key =
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
    let cs = format!("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={key};BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1;");
    let out = blobdrive(&["--connection-string", &cs, "doctor", "skew/d.vhd"]);
    assert_eq!(out.status.code(), Some(1));
    let shown = text(&out.stdout);
    let line = shown
        .lines()
        .find(|l| l.starts_with("FAIL clock"))
        .unwrap_or_else(|| panic!("no clock failure:\n{shown}"));
    assert!(
        line.contains("ahead of the service") && line.contains("synchronise the clock"),
        "{line}"
    );
}

/// Without a usable /dev/fuse (a plain file bound over it, in a private mount
/// namespace so nothing else on the host sees it) doctor fails on it.
#[test]
fn doctor_fails_without_dev_fuse() {
    if !system::can_run("doctor_fails_without_dev_fuse", false)
        || !blobdrive::attach::tool_exists("unshare")
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("not-fuse");
    std::fs::write(&fake, b"").unwrap();
    let script = r#"mount --bind "$1" /dev/fuse && exec "$2" doctor"#;
    let out = Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
        ])
        .arg(&fake)
        .arg(BIN)
        .env(
            "AZURE_STORAGE_CONNECTION_STRING",
            common::connection_string(),
        )
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let shown = text(&out.stdout);
    let line = shown
        .lines()
        .find(|l| l.starts_with("FAIL fuse device"))
        .unwrap_or_else(|| panic!("{shown}"));
    assert!(
        line.contains("not a character device") && line.contains("modprobe fuse"),
        "{line}"
    );
    // Only in that namespace: here /dev/fuse is untouched.
    use std::os::unix::fs::FileTypeExt as _;
    assert!(std::fs::metadata("/dev/fuse")
        .unwrap()
        .file_type()
        .is_char_device());
}
