//! `blobdrive download C/B FILE`: copy a page blob into a local sparse image,
//! reading only the ranges that hold data, in parallel, with a progress bar.
//! The work is in `crate::transfer`. With `--since T1`, FILE is a download
//! made at snapshot T1, brought up to date in place to snapshot T2: only the
//! ranges written since are fetched (decrypted with `--decrypt`, as a full
//! download does) and the cleared ones punched out (`crate::lifecycle::diff`).
//! Every download records in the file what it holds
//! (`crate::transfer::file_state`), and `--since` refuses a file whose record
//! does not say T1. `--since` needs `--snapshot`: the file must always hold a
//! state a snapshot names, and taking that snapshot is `blobdrive snapshot`'s
//! job (it freezes a filesystem attached here first).

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
    /// Read this snapshot of the blob (with --since: the snapshot FILE is
    /// brought to; required there). FILE records what it holds: drive,
    /// snapshot, ETag, --decrypt, --raw (in the extended attribute
    /// user.blobdrive.download, or FILE.blobdrive.json where the filesystem
    /// has none).
    #[arg(long, value_name = "TIME")]
    pub snapshot: Option<String>,
    /// Leave out the VHD footer: write the plain disk image.
    #[arg(long)]
    pub raw: bool,
    /// Replace FILE if it exists.
    #[arg(long, conflicts_with = "since")]
    pub overwrite: bool,
    /// FILE is a download of snapshot T1 (its record says so): bring it to
    /// the snapshot given with --snapshot, fetching only what changed.
    /// Re-run after an interruption to finish.
    #[arg(long, value_name = "T1")]
    pub since: Option<String>,
    /// Print the result of `--since` as JSON.
    #[arg(long, requires = "since")]
    pub json: bool,
    /// Get Blob requests in flight.
    #[arg(long, value_name = "N", default_value_t = transfer::DEFAULT_PARALLEL as u16,
          value_parser = clap::value_parser!(u16).range(1..=transfer::MAX_PARALLEL as i64))]
    pub parallel: u16,
    /// Write the plaintext of an encrypted drive (default: its ciphertext,
    /// as stored); with --since, FILE must be a --decrypt download.
    #[arg(long)]
    pub decrypt: bool,
    #[command(flatten)]
    pub key: super::key::KeyFlags,
}

/// Run `download`.
pub fn run(ctx: &Context, args: &DownloadArgs) -> CmdResult {
    if args.key.source().is_given() && !args.decrypt {
        return Err(super::CodedError::usage(
            "--key-file and --passphrase-file need --decrypt (without it the download is the ciphertext as stored)",
        )
        .into());
    }
    if let Some(since) = &args.since {
        return run_since(ctx, args, since);
    }
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

/// `download C/B FILE --since T1 --snapshot T2 [--decrypt] [--raw]`.
fn run_since(ctx: &Context, args: &DownloadArgs, since: &str) -> CmdResult {
    use crate::lifecycle::diff::{self, BlobStates, UpdateTarget};
    use crate::transfer::file_state::{Content, Format};
    let path = super::drives::parse_blob(&args.blob, None)?;
    super::drives::require_base(
        &path,
        "give the drive, and the later snapshot with --snapshot",
    )?;
    let Some(to) = args.snapshot.clone() else {
        return Err(super::CodedError::usage(format!(
            "--since needs --snapshot T2: the file must hold a state a snapshot names; take one with 'blobdrive snapshot {path}' and give its time"
        ))
        .into());
    };
    let client = super::drives::connect_for(ctx, &args.blob)?;
    super::drives::block_on(async move {
        super::diff::check_states(&client, &path, since, Some(&to)).await?;
        let mut states = BlobStates::new(client.clone(), &path);
        if args.decrypt {
            let at = path.clone().with_snapshot(Some(&to));
            let Some(key) = super::key::unlock(&client, &at, &args.key).await? else {
                return Err(super::CodedError::usage(format!(
                    "{path} is not encrypted; --decrypt applies to encrypted drives"
                ))
                .into());
            };
            states = states.decrypting(key);
        }
        let d = diff::diff(&states, since, Some(&to))
            .await
            .map_err(super::drives::blob_err)?;
        let flags = format!(
            "{}{}",
            if args.raw { " --raw" } else { "" },
            if args.decrypt { " --decrypt" } else { "" }
        );
        let target = UpdateTarget {
            path: &args.file,
            account: client.account_name().to_string(),
            blob: path.to_string(),
            content: if args.decrypt {
                Content::Decrypted
            } else {
                Content::Stored
            },
            format: Format::of(args.raw),
            parallel: usize::from(args.parallel),
            full_download: format!("blobdrive download {path} NEW-FILE --snapshot {to}{flags}"),
        };
        let progress = Progress::new(0);
        let reporter = Reporter::start(progress.clone(), "update", Display::auto());
        let result = diff::update_file(&states, &d, &target, &progress).await;
        reporter.finish();
        let report = result?;
        if args.json {
            output::print_json(&serde_json::json!({
                "drive": path.to_string(),
                "file": args.file,
                "from": d.from,
                "to": d.to,
                "file_bytes": report.file_bytes,
                "fetched_bytes": report.fetched_bytes,
                "punched_bytes": report.punched_bytes,
                "requests": report.requests,
                "resumed": report.resumed,
                "up_to_date": report.up_to_date,
            }));
        } else if report.up_to_date {
            output::print_text(&format!(
                "{} already holds snapshot {to} of {path}: nothing to do\n",
                args.file.display()
            ));
        } else {
            output::print_text(&format!(
                "updated {} from {path} at {} to {to}{}: fetched {} in {} requests, punched {}\n",
                args.file.display(),
                d.from,
                if report.resumed {
                    " (the interrupted update applied again)"
                } else {
                    ""
                },
                format_size(report.fetched_bytes),
                report.requests,
                format_size(report.punched_bytes)
            ));
        }
        Ok(())
    })
}
