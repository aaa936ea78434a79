//! `mount.blobdrive`: the helper `mount -t blobdrive C/B DIR -o ro,...` and
//! /etc/fstab lines call. The same binary runs it when invoked under that
//! name (a symlink in /sbin, installed by the package and `scripts/install.sh`).
//!
//! mount(8) calls `mount.blobdrive SOURCE DIR [-sfnv] [-o OPTIONS]`. Options:
//! - blobdrive's own: `ro`/`rw`, `snapshot=T`, `cache-size=S`, `max-dirty=S`, `key-file=F`, `passphrase-file=F`, `flush-delay=D`, `break-lease`,
//!   `log-file=PATH`, `partition=N|auto`, `metrics-listen=[ADDR:]PORT`, `metrics-textfile=DIR`,
//!   `metrics-allow-remote`, `credentials=PATH` (a file of `AZURE_STORAGE_*=...` lines,
//!   so no secret sits in fstab, or of workload identity's variables);
//! - fstab and systemd ones, which concern mount(8) or systemd and are ignored
//!   here: `defaults`, `auto`, `noauto`, `user`, `users`, `nouser`, `owner`,
//!   `group`, `_netdev`, `nofail`, `comment=*`, `x-*` (`x-systemd.*`, ...);
//! - every other option goes to the drive's filesystem (`noatime`, `discard`...).
//!
//! The helper returns once the filesystem is mounted at DIR (the daemon stays
//! in the background), which is what mount(8) and systemd mount units expect.
//!
//! Secrets: the mount runs in this process ([`run_with_args`], no exec), so
//! the `blobdrive mount` arguments built here never reach another process's
//! command line; a SAS URL given as SOURCE was already overwritten in this
//! process's own arguments when it started (`argv.rs`), before the daemon
//! forks. `credentials=` variables go into this process's environment,
//! which only its user and root can read.

use std::ffi::OsString;
use std::path::Path;

use super::{print_error_line, run_with_args, EXIT_OK, EXIT_USAGE};

/// The name under which the binary acts as the mount helper.
pub const HELPER_NAME: &str = "mount.blobdrive";

/// Environment variables a `credentials=` file may set: the account's, the
/// sign-in mode, and workload identity's (what a pod's environment holds,
/// for mounts made through mount(8), which does not pass it on).
const CREDENTIAL_VARIABLES: [&str; 9] = [
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_ACCOUNT",
    "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_AUTH_MODE",
    "AZURE_FEDERATED_TOKEN_FILE",
    "AZURE_TENANT_ID",
    "AZURE_CLIENT_ID",
    "AZURE_AUTHORITY_HOST",
];

/// True when the program was started as `mount.blobdrive`.
pub fn invoked_as_helper(argv0: &OsString) -> bool {
    Path::new(argv0)
        .file_name()
        .is_some_and(|name| name == HELPER_NAME)
}

/// What mount(8) asked for, as a `blobdrive mount` command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelperRequest {
    /// Arguments of `blobdrive` (without the program name).
    pub blobdrive_args: Vec<String>,
    /// `-f`: parse, then do nothing.
    pub fake: bool,
    /// `credentials=PATH`.
    pub credentials: Option<String>,
}

/// Parses the helper's command line (without the program name).
pub fn parse(args: &[String]) -> Result<HelperRequest, String> {
    let mut operands = Vec::new();
    let mut options: Vec<String> = Vec::new();
    let mut fake = false;
    let mut verbose = false;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if let Some(rest) = arg.strip_prefix("-o") {
            let value = if rest.is_empty() {
                iter.next().ok_or("-o needs a value")?.clone()
            } else {
                rest.to_string()
            };
            options.extend(value.split(',').map(str::to_string));
        } else if arg == "-t" || arg == "-N" {
            // The type (always blobdrive) and a namespace we do not support switching to.
            let value = iter.next().ok_or(format!("{arg} needs a value"))?;
            if arg == "-N" {
                return Err(format!("mount namespaces (-N {value}) are not supported"));
            }
        } else if arg.starts_with('-') && arg.len() > 1 {
            for flag in arg[1..].chars() {
                match flag {
                    's' | 'n' => {}
                    'f' => fake = true,
                    'v' => verbose = true,
                    other => return Err(format!("unknown flag -{other}")),
                }
            }
        } else {
            operands.push(arg.clone());
        }
    }
    let [source, dir] = operands.as_slice() else {
        return Err(format!(
            "usage: {HELPER_NAME} CONTAINER/BLOB DIR [-sfnv] [-o OPTIONS]"
        ));
    };
    let mut out = vec!["mount".to_string(), source.clone(), dir.clone()];
    if verbose {
        out.push("-v".into());
    }
    let mut credentials = None;
    let mut fs_options = Vec::new();
    for option in options.iter().map(|o| o.trim()).filter(|o| !o.is_empty()) {
        let (name, value) = match option.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (option, None),
        };
        match (name, value) {
            ("ro", None) => out.push("--read-only".into()),
            ("rw", None) => {}
            ("snapshot", Some(t)) => out.extend(["--snapshot".into(), t.to_string()]),
            ("cache-size" | "cache_size", Some(s)) => {
                out.extend(["--cache-size".into(), s.to_string()])
            }
            ("key-file" | "key_file", Some(f)) => out.extend(["--key-file".into(), f.to_string()]),
            ("passphrase-file" | "passphrase_file", Some(f)) => {
                out.extend(["--passphrase-file".into(), f.to_string()])
            }
            ("max-dirty" | "max_dirty", Some(s)) => {
                out.extend(["--max-dirty".into(), s.to_string()])
            }
            ("cache-dir" | "cache_dir", Some(d)) => {
                out.extend(["--cache-dir".into(), d.to_string()])
            }
            ("disk-cache-size" | "disk_cache_size", Some(s)) => {
                out.extend(["--disk-cache-size".into(), s.to_string()])
            }
            ("flush-delay" | "flush_delay", Some(d)) => {
                out.extend(["--flush-delay".into(), d.to_string()])
            }
            ("break-lease" | "break_lease", None) => out.push("--break-lease".into()),
            ("partition", Some(n)) => out.extend(["--partition".into(), n.to_string()]),
            ("log-file" | "log_file", Some(p)) => out.extend(["--log-file".into(), p.to_string()]),
            ("metrics-listen", Some(a)) => out.extend(["--metrics-listen".into(), a.to_string()]),
            ("metrics-textfile", Some(d)) => {
                out.extend(["--metrics-textfile".into(), d.to_string()])
            }
            ("metrics-allow-remote", None) => out.push("--metrics-allow-remote".into()),
            ("credentials", Some(p)) => credentials = Some(p.to_string()),
            (
                "snapshot" | "cache-size" | "cache_size" | "max-dirty" | "max_dirty" | "key-file"
                | "key_file" | "passphrase-file" | "passphrase_file" | "log-file" | "log_file"
                | "cache-dir" | "cache_dir" | "disk-cache-size" | "disk_cache_size" | "flush-delay"
                | "flush_delay" | "metrics-listen" | "metrics-textfile",
                None,
            )
            | ("credentials" | "partition", None) => {
                return Err(format!("option {name} needs a value"))
            }
            (
                "defaults" | "auto" | "noauto" | "user" | "users" | "nouser" | "owner" | "group"
                | "_netdev" | "nofail",
                _,
            )
            | ("comment", Some(_)) => {}
            (n, _) if n.starts_with("x-") => {}
            _ => fs_options.push(option.to_string()),
        }
    }
    if !fs_options.is_empty() {
        out.extend(["-o".into(), fs_options.join(",")]);
    }
    Ok(HelperRequest {
        blobdrive_args: out,
        fake,
        credentials,
    })
}

/// Reads `KEY=VALUE` lines (optionally quoted, `#` comments) and exports the
/// account variables among them. Called before any thread exists.
fn load_credentials(path: &str) -> Result<(), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read credentials {path}: {e}"))?;
    crate::crypt::secret::warn_if_exposed(
        std::path::Path::new(path),
        "credentials file",
        std::fs::metadata(path).ok().as_ref(),
    );
    for (key, value) in credential_lines(&text) {
        std::env::set_var(key, value);
    }
    Ok(())
}

/// The [`CREDENTIAL_VARIABLES`] that `KEY=VALUE` lines of `text` set
/// (`export ` and quotes allowed); other lines are passed over.
fn credential_lines(text: &str) -> Vec<(&str, &str)> {
    text.lines()
        .map(str::trim)
        .filter_map(|line| {
            let line = line.strip_prefix("export ").unwrap_or(line);
            let (key, value) = line.split_once('=')?;
            let key = key.trim();
            CREDENTIAL_VARIABLES
                .contains(&key)
                .then(|| (key, value.trim().trim_matches('"').trim_matches('\'')))
        })
        .collect()
}

/// Entry point when invoked as `mount.blobdrive`; returns the exit code.
pub fn main(args: Vec<OsString>) -> i32 {
    let args: Vec<String> = args
        .into_iter()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let request = match parse(&args) {
        Ok(r) => r,
        Err(message) => {
            print_error_line(&message);
            return EXIT_USAGE;
        }
    };
    if let Some(path) = &request.credentials {
        if let Err(message) = load_credentials(path) {
            print_error_line(&message);
            return EXIT_USAGE;
        }
    }
    if request.fake {
        return EXIT_OK;
    }
    let argv = std::iter::once("blobdrive".to_string()).chain(request.blobdrive_args);
    run_with_args(argv)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn fstab_and_systemd_options_are_ignored_and_the_rest_reach_the_filesystem() {
        let r = parse(&args(
            "c/d.vhd /mnt/d -o rw,_netdev,nofail,noauto,x-systemd.automount,\
             x-systemd.requires=network-online.target,comment=x,defaults,noatime,discard",
        ))
        .unwrap();
        assert_eq!(
            r.blobdrive_args,
            args("mount c/d.vhd /mnt/d -o noatime,discard")
        );
        assert!(!r.fake);
    }

    #[test]
    fn blobdrive_options_become_flags() {
        let r = parse(&args(
            "c/d.vhd /mnt/d -sv -o ro,snapshot=2026-01-01T00:00:00.0000000Z,cache-size=1G,\
             credentials=/etc/blobdrive/a.env",
        ))
        .unwrap();
        assert_eq!(
            r.blobdrive_args,
            args(
                "mount c/d.vhd /mnt/d -v --read-only --snapshot 2026-01-01T00:00:00.0000000Z \
                 --cache-size 1G"
            )
        );
        assert_eq!(r.credentials.as_deref(), Some("/etc/blobdrive/a.env"));
        let r = parse(&args("c/d.vhd /mnt/d -f -obreak-lease")).unwrap();
        assert!(r.fake);
        assert_eq!(r.blobdrive_args, args("mount c/d.vhd /mnt/d --break-lease"));
        // An encrypted drive's key comes from a file (no prompt at boot).
        let r = parse(&args(
            "c/d.vhd /mnt/d -o key-file=/etc/blobdrive/d.key,max-dirty=64M",
        ))
        .unwrap();
        assert_eq!(
            r.blobdrive_args,
            args("mount c/d.vhd /mnt/d --key-file /etc/blobdrive/d.key --max-dirty 64M")
        );
        let r = parse(&args("c/d.vhd /mnt/d -o passphrase-file=/etc/p")).unwrap();
        assert_eq!(
            r.blobdrive_args,
            args("mount c/d.vhd /mnt/d --passphrase-file /etc/p")
        );
        assert!(parse(&args("c/d.vhd /mnt/d -o key-file")).is_err());
        let r = parse(&args("c/d.vhd /mnt/d -o flush-delay=30s")).unwrap();
        assert_eq!(
            r.blobdrive_args,
            args("mount c/d.vhd /mnt/d --flush-delay 30s")
        );
    }

    #[test]
    fn partition_option_becomes_the_partition_flag() {
        let r = parse(&args("c/d.vhd /mnt/d -o partition=15,ro,noatime")).unwrap();
        assert_eq!(
            r.blobdrive_args,
            args("mount c/d.vhd /mnt/d --partition 15 --read-only -o noatime")
        );
        assert!(parse(&args("c/d.vhd /mnt/d -o partition")).is_err());
    }

    #[test]
    fn bad_helper_lines_are_refused() {
        assert!(parse(&args("c/d.vhd")).is_err());
        assert!(parse(&args("c/d.vhd /mnt -o")).is_err());
        assert!(parse(&args("c/d.vhd /mnt -o snapshot")).is_err());
        assert!(parse(&args("c/d.vhd /mnt -x")).is_err());
        assert!(invoked_as_helper(&OsString::from("/sbin/mount.blobdrive")));
        assert!(!invoked_as_helper(&OsString::from("/usr/bin/blobdrive")));
    }

    #[test]
    fn a_credentials_file_sets_account_and_workload_identity_variables_only() {
        let text = "# account\n\
            AZURE_STORAGE_ACCOUNT=acct\n\
            export AZURE_STORAGE_AUTH_MODE=\"workload\"\n\
            AZURE_FEDERATED_TOKEN_FILE=/var/run/secrets/azure/tokens/azure-identity-token\n\
            AZURE_TENANT_ID='72f988bf-86f1-41af-91ab-2d7cd011db47'\n\
            AZURE_CLIENT_ID=0b7e1a53-5d2c-4c1e-9f57-3c1f2b9e4d10\n\
            AZURE_AUTHORITY_HOST=https://login.microsoftonline.us\n\
            PATH=/tmp/evil\n\
            LD_PRELOAD=/tmp/evil.so\n";
        assert_eq!(
            credential_lines(text),
            vec![
                ("AZURE_STORAGE_ACCOUNT", "acct"),
                ("AZURE_STORAGE_AUTH_MODE", "workload"),
                (
                    "AZURE_FEDERATED_TOKEN_FILE",
                    "/var/run/secrets/azure/tokens/azure-identity-token"
                ),
                ("AZURE_TENANT_ID", "72f988bf-86f1-41af-91ab-2d7cd011db47"),
                ("AZURE_CLIENT_ID", "0b7e1a53-5d2c-4c1e-9f57-3c1f2b9e4d10"),
                ("AZURE_AUTHORITY_HOST", "https://login.microsoftonline.us"),
            ]
        );
    }
}
