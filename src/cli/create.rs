//! `blobdrive create C/B --size SIZE [--mkfs FS]`: a new page blob of size + 512
//! bytes whose last page is a fixed VHD footer. The size rules are checked while
//! parsing; the create itself must be conditional so it never replaces a blob.

use clap::Args;

use super::{values, CmdResult, CodedError, Context};

/// Arguments of `create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// The new drive, CONTAINER/PATH (the container is created if missing).
    #[arg(value_name = "C/B")]
    pub blob: String,
    /// Disk size: a whole number of MiB from 16M to 8 TiB − 1 MiB (512M, 10G, 1T).
    #[arg(long, value_name = "SIZE", value_parser = values::drive_size)]
    pub size: u64,
    /// Format the new drive with this filesystem.
    #[arg(long, value_name = "FS", value_parser = ["ext4", "ext3", "ext2", "xfs"])]
    pub mkfs: Option<String>,
}

/// Run `create`.
pub fn run(_ctx: &Context, _args: &CreateArgs) -> CmdResult {
    Err(CodedError::not_available("create").into())
}
