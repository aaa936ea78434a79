//! `blobdrive download C/B FILE`: copy a page blob into a local sparse image,
//! reading only the ranges that hold data, in parallel, with a progress bar.
//! The work is in `crate::transfer`.

use std::path::PathBuf;

use clap::Args;

use super::{output, CmdResult, Context};
use crate::blob::{BlobClient, BlobPath};
use crate::transfer::{self, Display, DownloadOptions, DownloadReport, Progress, Reporter};
use crate::units::format_size;

/// Arguments of `download`.
#[derive(Debug, Args)]
pub struct DownloadArgs {
    /// The page blob to read, CONTAINER/PATH or a full URL.
    #[arg(value_name = "C/B")]
    pub blob: String,
    /// The local image to write.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Read this snapshot of the blob.
    #[arg(long, value_name = "TIME")]
    pub snapshot: Option<String>,
    /// Leave out the VHD footer: write the plain disk image.
    #[arg(long)]
    pub raw: bool,
    /// Replace FILE if it exists.
    #[arg(long)]
    pub overwrite: bool,
    /// Get Blob requests in flight.
    #[arg(long, value_name = "N", default_value_t = transfer::DEFAULT_PARALLEL as u16,
          value_parser = clap::value_parser!(u16).range(1..=transfer::MAX_PARALLEL as i64))]
    pub parallel: u16,
    /// Write the plaintext of an encrypted drive (default: its ciphertext,
    /// as stored).
    #[arg(long)]
    pub decrypt: bool,
    #[command(flatten)]
    pub key: super::key::KeyFlags,
}

/// Run `download`.
pub fn run(ctx: &Context, args: &DownloadArgs) -> CmdResult {
    let mut blob = BlobPath::parse(&args.blob)?;
    if let Some(t) = &args.snapshot {
        blob = blob.with_snapshot(Some(t));
    }
    let account = ctx.account_for(&args.blob)?;
    let opts = DownloadOptions {
        raw: args.raw,
        overwrite: args.overwrite,
        parallel: usize::from(args.parallel),
        decrypt: None,
    };
    if args.key.source().is_given() && !args.decrypt {
        return Err(super::CodedError::usage(
            "--key-file and --passphrase-file need --decrypt (without it the download is the ciphertext as stored)",
        )
        .into());
    }
    let mut opts = opts;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let report = rt.block_on(async {
        let client = BlobClient::new(account)?;
        if args.decrypt {
            opts.decrypt = super::key::unlock(&client, &blob, &args.key).await?;
            if opts.decrypt.is_none() {
                return Err(super::CodedError::usage(format!(
                    "{blob} is not encrypted; --decrypt applies to encrypted drives"
                ))
                .into());
            }
        }
        let progress = Progress::new(0);
        let reporter = Reporter::start(progress.clone(), "download", Display::auto());
        let result = transfer::download(&client, &blob, &args.file, &opts, &progress).await;
        reporter.finish();
        anyhow::Ok(result?)
    })?;
    output::print_text(&summary(&blob, &args.file, &report));
    Ok(())
}

/// The summary printed after a download.
pub fn summary(blob: &BlobPath, file: &std::path::Path, r: &DownloadReport) -> String {
    format!(
        "downloaded {blob} to {} ({})\n  scanned  {}\n  received {} in {} requests\n  \
         skipped  {} as zero ({} without pages, {} zero pages)\n  time     {:.1} s, {}\n",
        file.display(),
        format_size(r.file_bytes),
        format_size(r.scanned_bytes),
        format_size(r.received_bytes),
        r.requests,
        format_size(r.hole_bytes + r.zero_bytes),
        format_size(r.hole_bytes),
        format_size(r.zero_bytes),
        r.seconds,
        transfer::progress::format_rate(r.rate()),
    )
}
