//! `blobdrive download C/B FILE`: copy a page blob into a local image, skipping
//! ranges that hold no data, in parallel, with a progress bar.

use std::path::PathBuf;

use clap::Args;

use super::{CmdResult, CodedError, Context};

/// Arguments of `download`.
#[derive(Debug, Args)]
pub struct DownloadArgs {
    /// The page blob to read, CONTAINER/PATH or a full URL.
    #[arg(value_name = "C/B")]
    pub blob: String,
    /// The local image to write.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
}

/// Run `download`.
pub fn run(_ctx: &Context, _args: &DownloadArgs) -> CmdResult {
    Err(CodedError::not_available("download").into())
}
