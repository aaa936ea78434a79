//! `blobdrive upload FILE C/B`: copy a raw image or a fixed or dynamic VHD
//! into a page blob (a drive: a fixed VHD),
//! skipping zero ranges, in parallel, with a progress bar; `--resume`
//! continues an interrupted upload. The work is in `crate::transfer`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::Args;

use super::{output, CmdResult, CodedError, Context};
use crate::blob::{BlobClient, BlobPath};
use crate::transfer::{self, Display, Progress, Reporter, UploadOptions, UploadReport};
use crate::units::format_size;

/// Arguments of `upload`.
#[derive(Debug, Args)]
pub struct UploadArgs {
    /// The local image (raw, or a fixed or dynamic VHD).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// The page blob to write, CONTAINER/PATH or a full URL.
    #[arg(value_name = "C/B")]
    pub blob: String,
    /// Replace the blob if it exists (never while it is leased).
    #[arg(long)]
    pub overwrite: bool,
    /// Continue an interrupted upload of the same image, sending only what is missing.
    #[arg(long)]
    pub resume: bool,
    /// Round a raw image that is not a whole number of MiB up with zeros.
    #[arg(long)]
    pub pad: bool,
    /// Print what was done (bytes scanned, sent, skipped) as JSON.
    #[arg(long)]
    pub json: bool,
    /// Put Page requests in flight.
    #[arg(long, value_name = "N", default_value_t = transfer::DEFAULT_PARALLEL as u16,
          value_parser = clap::value_parser!(u16).range(1..=transfer::MAX_PARALLEL as i64))]
    pub parallel: u16,
    /// Length of the upload's lease in seconds (15-60; tests use short ones).
    #[arg(long, hide = true, default_value_t = transfer::upload::DEFAULT_LEASE_SECS,
          value_parser = clap::value_parser!(u32).range(15..=60))]
    pub lease_seconds: u32,
    /// Encrypt the image on the way (AES-256-XTS with a new random data
    /// key, wrapped by --key-file or --passphrase-file in a key slot).
    #[arg(long)]
    pub encrypt: bool,
    #[command(flatten)]
    pub key: super::key::KeyFlags,
}

/// Run `upload`.
pub fn run(ctx: &Context, args: &UploadArgs) -> CmdResult {
    let blob = BlobPath::parse(&args.blob)?;
    let encrypt = encryption(args, &blob)?;
    let account = ctx.account_for(&args.blob)?;
    let stop = Arc::new(AtomicBool::new(false));
    let opts = UploadOptions {
        overwrite: args.overwrite,
        resume: args.resume,
        pad: args.pad,
        parallel: usize::from(args.parallel),
        lease_secs: args.lease_seconds,
        stop: Some(stop.clone()),
        encrypt,
        ..UploadOptions::default()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let report = rt.block_on(async {
        let client = BlobClient::new(account)?;
        // Ctrl-C: record what is done, release the lease, then stop.
        let on_signal = stop.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                on_signal.store(true, Ordering::Relaxed);
            }
        });
        let progress = Progress::new(0);
        let reporter = Reporter::start(progress.clone(), "upload", Display::auto());
        let result = transfer::upload(&client, &args.file, &blob, &opts, &progress).await;
        reporter.finish();
        anyhow::Ok(result?)
    })?;
    if args.json {
        output::print_json(&report);
    } else {
        output::print_text(&summary(&args.file, &blob, &report));
    }
    Ok(())
}

/// The summary printed after an upload.
pub fn summary(file: &std::path::Path, blob: &BlobPath, r: &UploadReport) -> String {
    let kind = r.kind.map_or("image", |k| k.describe());
    let mut s = format!(
        "uploaded {} ({kind}, {} disk) to {blob}\n",
        file.display(),
        format_size(r.data_bytes)
    );
    s.push_str(&format!("  scanned  {}\n", format_size(r.scanned_bytes)));
    s.push_str(&format!(
        "  sent     {} in {} requests\n",
        format_size(r.sent_bytes),
        r.requests
    ));
    s.push_str(&format!(
        "  skipped  {} as zero ({} holes, {} zero pages)\n",
        format_size(r.hole_bytes + r.zero_bytes),
        format_size(r.hole_bytes),
        format_size(r.zero_bytes)
    ));
    if r.resumed_bytes > 0 || r.verified_bytes > 0 {
        s.push_str(&format!(
            "  resumed  {} already in the blob (verified), {} chunk(s) did not match and were sent again\n",
            format_size(r.resumed_bytes),
            r.chunks_mismatched
        ));
    }
    s.push_str(&format!(
        "  time     {:.1} s, {}\n",
        r.seconds,
        transfer::progress::format_rate(r.rate())
    ));
    s
}

/// The data key and key slots of `upload --encrypt` (read before anything
/// is sent, so a missing key file leaves nothing behind).
fn encryption(
    args: &UploadArgs,
    blob: &BlobPath,
) -> anyhow::Result<Option<(Arc<crate::crypt::DataKey>, crate::crypt::KeySlots)>> {
    let source = args.key.source();
    if !args.encrypt {
        if source.is_given() {
            return Err(
                CodedError::usage("--key-file and --passphrase-file need --encrypt").into(),
            );
        }
        return Ok(None);
    }
    if args.resume {
        return Err(CodedError::usage(
            "--encrypt cannot be combined with --resume (a resume compares the blob with the file); \
             start the upload again with --encrypt --overwrite",
        )
        .into());
    }
    let user = source
        .read(&format!("New passphrase for {blob}: "), true)?
        .ok_or_else(|| {
            CodedError::usage(
                "--encrypt needs --key-file FILE or --passphrase-file FILE (or a terminal to type a passphrase)",
            )
        })?;
    let key = crate::crypt::DataKey::generate();
    crate::crypt::forbid_core_dumps();
    let slots = crate::crypt::KeySlots::new(&key, &user);
    Ok(Some((Arc::new(key), slots)))
}
