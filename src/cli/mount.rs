//! `blobdrive mount C/B DIR` attaches one drive (lease, FUSE file, loop device,
//! filesystem at DIR); `blobdrive mount [C] DIR` mounts the account or one
//! container as directories. Which one is decided by the source: a name with a
//! `/` (or a URL) is a drive, a bare name a container, none the account.

use std::path::PathBuf;

use clap::Args;

use super::{values, CmdResult, CodedError, Context};

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
pub fn run(_ctx: &Context, _args: &MountArgs) -> CmdResult {
    Err(CodedError::not_available("mount").into())
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
