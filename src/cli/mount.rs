//! `blobdrive mount C/B DIR` attaches one drive (lease, FUSE file, loop device,
//! filesystem at DIR); `blobdrive mount [C] DIR` mounts the account or one
//! container as directories. Which one is decided by the source: a name with a
//! `/` (or a URL) is a drive, a bare name a container, none the account.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use clap::Args;

use super::{values, CmdResult, CodedError, Context};
use crate::blob;
use crate::daemon::{run_mount, MountOptions};
use crate::drive::DriveOptions;
use crate::fs::azure::AzureCatalog;
use crate::fs::Catalog;

/// Arguments of `mount`.
#[derive(Debug, Args)]
pub struct MountArgs {
    /// `C/B DIR` for a drive, `C DIR` for a container, `DIR` for the account.
    #[arg(value_name = "SOURCE", num_args = 1..=2, required = true)]
    pub operands: Vec<String>,
    /// Mount read-only (no lease; any number of hosts may do this).
    #[arg(long, short = 'r')]
    pub read_only: bool,
    /// Mount this snapshot (always read-only).
    #[arg(long, value_name = "TIME")]
    pub snapshot: Option<String>,
    /// Memory for the page cache.
    #[arg(long, value_name = "SIZE", default_value = "512M", value_parser = values::size)]
    pub cache_size: u64,
    /// Stay in the foreground instead of detaching.
    #[arg(long, short = 'f')]
    pub foreground: bool,
    /// Take the drive over from a host that holds its lease (breaks the lease).
    #[arg(long)]
    pub break_lease: bool,
    /// Let users other than the one mounting use the mount (FUSE allow_other).
    #[arg(long)]
    pub allow_other: bool,
    /// Where a background daemon writes its log (default: nowhere; -v sets the level).
    #[arg(long, value_name = "PATH")]
    pub log_file: Option<PathBuf>,
}

impl MountArgs {
    /// The source (`C/B`, `C`, or none for the account) and the mount point.
    pub fn source_and_dir(&self) -> (Option<&str>, PathBuf) {
        match self.operands.as_slice() {
            [source, dir] => (Some(source.as_str()), PathBuf::from(dir)),
            [dir] => (None, PathBuf::from(dir)),
            // clap guarantees one or two operands.
            _ => (None, PathBuf::new()),
        }
    }
}

/// Run `mount`.
pub fn run(ctx: &Context, args: &MountArgs) -> CmdResult {
    let (source, dir) = args.source_and_dir();
    match source {
        Some(s) if s.contains('/') => Err(CodedError::not_available("mount C/B DIR").into()),
        container => mount_namespace(ctx, container, &dir, args),
    }
}

/// The account (or one container) as directories, drives as files.
fn mount_namespace(
    ctx: &Context,
    container: Option<&str>,
    dir: &Path,
    args: &MountArgs,
) -> CmdResult {
    if args.snapshot.is_some() {
        return Err(CodedError::usage(
            "--snapshot applies to a drive (C/B DIR); a namespace mount shows \
             snapshots as read-only files anyway",
        )
        .into());
    }
    if args.break_lease {
        return Err(CodedError::usage("--break-lease applies to a drive (C/B DIR)").into());
    }
    if let Some(c) = container {
        blob::path::validate_container_name(c)?;
    }
    // Checked before the fork, so a bad account fails in the user's terminal.
    let account = blob::Account::from_env(ctx.connection_string.as_deref())?;
    let opts = MountOptions {
        read_only: args.read_only,
        foreground: args.foreground,
        allow_other: args.allow_other,
        container: container.map(str::to_string),
        log_file: args.log_file.clone(),
        source: Some(match container {
            Some(c) => format!("{}/{c}", account.name),
            None => account.name.clone(),
        }),
    };
    let drive_options = DriveOptions {
        cache_bytes: args.cache_size,
        ..DriveOptions::default()
    };
    let container = container.map(str::to_string);
    run_mount(dir, &opts, move || async move {
        let client = blob::BlobClient::new(account)?;
        match &container {
            Some(c) => {
                // Fail now, not at the first `ls`, when the container is missing.
                let probe = blob::ListBlobsOptions {
                    max_results: Some(1),
                    ..Default::default()
                };
                client
                    .list_blobs(c, &probe)
                    .await
                    .with_context(|| format!("cannot mount container {c}"))?;
            }
            None => {
                client
                    .list_containers()
                    .await
                    .context("cannot list the account's containers")?;
            }
        }
        let catalog: Arc<dyn Catalog> = Arc::new(AzureCatalog::new(client, drive_options));
        Ok(catalog)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn mount_args(argv: &[&str]) -> MountArgs {
        let all = ["blobdrive", "mount"].iter().chain(argv.iter());
        match Cli::try_parse_from(all).expect("parses").command {
            Command::Mount(a) => a,
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn one_operand_is_the_mount_point_of_the_account() {
        let a = mount_args(&["/mnt/ns"]);
        assert_eq!(a.source_and_dir(), (None, PathBuf::from("/mnt/ns")));
        assert_eq!(a.cache_size, 512 << 20);
    }

    #[test]
    fn two_operands_are_source_then_mount_point() {
        let a = mount_args(&["c/disk.vhd", "/mnt/d", "--cache-size", "2G"]);
        assert_eq!(
            a.source_and_dir(),
            (Some("c/disk.vhd"), PathBuf::from("/mnt/d"))
        );
        assert_eq!(a.cache_size, 2 << 30);
    }
}
