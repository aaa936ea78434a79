//! The command line as a user meets it: run the real binary and check help,
//! exit codes, and that every mistake ends in exactly one line on stderr.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::process::{Command, Output};

const COMMANDS: [&str; 11] = [
    "create",
    "info",
    "list",
    "mount",
    "unmount",
    "snapshot",
    "break-lease",
    "delete",
    "upload",
    "download",
    "stats",
];

fn blobdrive<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: Into<OsString>,
{
    Command::new(env!("CARGO_BIN_EXE_blobdrive"))
        .args(args.into_iter().map(Into::into))
        // No account from the developer's shell leaks into the tests.
        .env_remove("AZURE_STORAGE_CONNECTION_STRING")
        .env_remove("RUST_LOG")
        .output()
        .expect("blobdrive runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts the failure contract: the given exit code and one `blobdrive: ` line.
fn assert_one_line_failure(args: &[&str], code: i32) -> String {
    let out = blobdrive(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: not one line: {err:?}");
    assert!(err.starts_with("blobdrive: "), "{args:?}: {err}");
    assert!(out.stdout.is_empty(), "{args:?}: wrote to stdout");
    err
}

#[test]
fn help_lists_every_command() {
    let out = blobdrive(["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for cmd in COMMANDS {
        assert!(
            help.lines().any(|l| l.trim_start().starts_with(cmd)),
            "--help does not list {cmd}:\n{help}"
        );
    }
    assert!(help.contains("--connection-string"));
    assert!(help.contains("AZURE_STORAGE_CONNECTION_STRING"));
}

#[test]
fn every_command_has_help() {
    for cmd in COMMANDS {
        let out = blobdrive([cmd, "--help"]);
        assert!(out.status.success(), "{cmd} --help failed");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(
            help.contains(&format!("Usage: blobdrive {cmd}")),
            "{cmd}: {help}"
        );
    }
}

#[test]
fn version_prints_the_crate_version() {
    let out = blobdrive(["--version"]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("blobdrive {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn no_command_shows_help_and_exits_2() {
    let out = blobdrive(Vec::<String>::new());
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("Usage: blobdrive"));
}

#[test]
fn bad_sizes_give_one_line_and_exit_2() {
    let cases: [(&[&str], &str); 7] = [
        (&["create", "c/d", "--size", "10X"], "invalid size '10X'"),
        (&["create", "c/d", "--size", ""], "empty size"),
        (
            &["create", "c/d", "--size", "1000000000"],
            "use 953M or 954M",
        ),
        (&["create", "c/d", "--size", "1M"], "smallest drive is 16M"),
        (
            &["create", "c/d", "--size", "8T"],
            "largest drive is 8388607M",
        ),
        (
            &["create", "c/d", "--size", "1.3K"],
            "not a whole number of bytes",
        ),
        (
            &["mount", "c/d", "/mnt/x", "--cache-size", "lots"],
            "invalid size 'lots'",
        ),
    ];
    for (args, expected) in cases {
        let err = assert_one_line_failure(args, 2);
        assert!(err.contains(expected), "{args:?}: {err}");
    }
}

#[test]
fn unmount_and_stats_of_a_directory_that_is_not_a_mount_fail_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    for args in [["unmount", path], ["stats", path]] {
        let err = assert_one_line_failure(&args, 1);
        assert!(err.contains(path), "{err}");
    }
}

#[test]
fn usage_errors_name_the_help_to_read() {
    let err = assert_one_line_failure(&["info"], 2);
    assert!(
        err.contains("<C/B>") && err.contains("'blobdrive info --help'"),
        "{err}"
    );
    let err = assert_one_line_failure(&["lst"], 2);
    assert!(err.contains("'list'"), "{err}");
}

#[test]
fn garbage_arguments_never_panic() {
    let garbage: Vec<Vec<OsString>> = vec![
        vec!["--".into()],
        vec!["-".into()],
        vec!["-vvvvvvvvvvvvvvvvvvvv".into()],
        vec!["create".into(), "--size".into()],
        vec![
            "create".into(),
            "c/d".into(),
            "--size".into(),
            "99999999999999999999999T".into(),
        ],
        vec![
            "create".into(),
            "c/d".into(),
            "--size".into(),
            "1".repeat(10_000).into(),
        ],
        vec!["mount".into(), "a".into(), "b".into(), "c".into()],
        vec!["list".into(), "--json=maybe".into()],
        vec!["--connection-string".into()],
        vec![OsString::from_vec(vec![0xff, 0xfe, b'x'])],
        vec!["info".into(), OsString::from_vec(vec![b'c', b'/', 0x80])],
        vec!["create".into(), "c/d".into(), "--size".into(), "١٠G".into()],
    ];
    for args in garbage {
        let out = blobdrive(&args);
        let err = stderr(&out);
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
        let code = out.status.code();
        assert!(
            matches!(code, Some(1 | 2)),
            "{args:?}: exit {code:?}: {err}"
        );
        // Without a command the help is the answer; anything else is one line.
        let shows_help = code == Some(2) && err.contains("Usage: blobdrive");
        assert!(
            shows_help || err.lines().count() == 1,
            "{args:?}: not one line: {err:?}"
        );
    }
}

#[test]
fn closed_stdout_does_not_panic() {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_blobdrive"))
        .arg("--help")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("blobdrive runs");
    drop(child.stdout.take());
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        e.read_to_string(&mut err).expect("read stderr");
    }
    child.wait().expect("blobdrive exits");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn verbose_logs_go_to_stderr_only() {
    let out = blobdrive(["-vv", "unmount", "/nonexistent/blobdrive-mount"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = stderr(&out);
    assert!(err.contains("DEBUG"), "{err}");
    assert!(err
        .lines()
        .last()
        .unwrap_or_default()
        .starts_with("blobdrive: "));
}

#[test]
fn a_bad_flush_delay_is_a_usage_error_before_anything_is_mounted() {
    for bad in ["soon", "-1", "2h", "61m"] {
        let flag = format!("--flush-delay={bad}");
        let err = assert_one_line_failure(&["mount", "c/d.vhd", "/nonexistent", &flag], 2);
        assert!(err.contains("--flush-delay"), "{err}");
    }
}

#[test]
fn a_bad_nbd_endpoint_is_a_usage_error_before_anything_is_opened() {
    let err = assert_one_line_failure(&["serve", "c/d.vhd", "--nbd", "/tmp/x.sock"], 2);
    assert!(err.contains("give unix:PATH or tcp:HOST:PORT"), "{err}");
    let err = assert_one_line_failure(&["serve", "c/d.vhd", "--nbd", "tcp:192.0.2.1:10809"], 2);
    assert!(err.contains("needs --allow-remote"), "{err}");
    let err = assert_one_line_failure(&["serve", "c/d.vhd", "--nbd", "tcp:nonsense"], 2);
    assert!(err.contains("not a HOST:PORT"), "{err}");
}

#[test]
fn a_csi_endpoint_that_is_not_a_free_unix_socket_is_refused() {
    let err = assert_one_line_failure(
        &["csi", "--node-id", "n", "--endpoint", "tcp://127.0.0.1:1"],
        2,
    );
    assert!(err.contains("give unix:///PATH"), "{err}");
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, b"keep").expect("write");
    let endpoint = format!("unix://{}", file.display());
    let err = assert_one_line_failure(&["csi", "--node-id", "n", "--endpoint", &endpoint], 1);
    assert!(
        err.contains("is not a socket, so it was left alone"),
        "{err}"
    );
    assert_eq!(std::fs::read(&file).expect("kept"), b"keep");
}

#[test]
fn mount_and_serve_share_one_definition_of_the_cache_and_metrics_flags() {
    let help = |cmd: &str| {
        let out = blobdrive([cmd, "--help"]);
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let (mount, serve) = (help("mount"), help("serve"));
    for flag in [
        "--cache-size",
        "--max-dirty",
        "--read-ahead",
        "--flush-delay",
        "--cache-dir",
        "--disk-cache-size",
        "--metrics-listen",
        "--metrics-allow-remote",
        "--metrics-textfile",
        "--key-file",
    ] {
        // The flag's help line, without the padding that aligns it.
        let line = |text: &str| {
            text.lines()
                .find(|l| l.trim_start().starts_with(flag))
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                .unwrap_or_else(|| panic!("no {flag} in:\n{text}"))
        };
        assert_eq!(line(&mount), line(&serve), "{flag} differs");
    }
    // A bad value is refused alike, before anything is opened.
    for cmd in [
        &["mount", "c/d.vhd", "/nonexistent"][..],
        &["serve", "c/d.vhd", "--nbd", "unix:/tmp/x.sock"][..],
    ] {
        let mut args = cmd.to_vec();
        args.push("--metrics-textfile=/nonexistent");
        let err = assert_one_line_failure(&args, 2);
        assert!(err.contains("is not a directory"), "{args:?}: {err}");
    }
}
