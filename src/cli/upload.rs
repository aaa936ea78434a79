//! `blobdrive upload FILE C/B`: copy a raw or VHD image into a page blob,
//! skipping zero ranges, in parallel, with a progress bar.

use std::path::PathBuf;

use clap::Args;

use super::{CmdResult, CodedError, Context};

/// Arguments of `upload`.
#[derive(Debug, Args)]
pub struct UploadArgs {
    /// The local image (raw, or a fixed VHD).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// The page blob to write, CONTAINER/PATH or a full URL.
    #[arg(value_name = "C/B")]
    pub blob: String,
}

/// Run `upload`.
pub fn run(_ctx: &Context, _args: &UploadArgs) -> CmdResult {
    Err(CodedError::not_available("upload").into())
}
