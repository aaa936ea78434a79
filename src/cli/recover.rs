//! `blobdrive recover FILE [--break-lease]`: put the pages of a recovery file
//! (written when a flush could not complete at unmount) into their drive.
//!
//! The file is checked whole before anything is written: every checksum, the
//! account, and the blob's size must match, and the blob must not have
//! changed since the file was saved (its ETag; `--force` overrides), or
//! nothing is applied. The pages
//! go in under a new lease (through the drive engine, so they are flushed and
//! the lease released as at a normal unmount); the file is deleted only after
//! that succeeded.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::anyhow;
use clap::Args;

use super::drives;
use super::{output, CmdResult, Context};
use crate::drive::{self, BlobPageStore, Drive, DriveOptions, PageStore as _};
use crate::recovery;

/// Arguments of `recover`.
#[derive(Debug, Args)]
pub struct RecoverArgs {
    /// The recovery file named by the failed unmount.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Break the drive's lease first (when the host holding it is gone).
    #[arg(long)]
    pub break_lease: bool,
    /// Apply the file even though the blob changed since it was saved (its
    /// pages then replace whatever was written there since).
    #[arg(long)]
    pub force: bool,
}

/// Run `recover`.
pub fn run(ctx: &Context, args: &RecoverArgs) -> CmdResult {
    let rec = recovery::read_file(&args.file).map_err(|e| anyhow!("{e}"))?;
    let path = drives::parse_blob(&rec.header.target, None)?;
    let client = drives::connect(ctx)?;
    if client.account_name() != rec.header.account {
        return Err(anyhow!(
            "{} belongs to drive {path} of account '{}', but the account selected is '{}': \
             select that account (--account or --connection-string)",
            args.file.display(),
            rec.header.account,
            client.account_name()
        ));
    }
    let file = args.file.clone();
    let break_lease = args.break_lease;
    let force = args.force;
    drives::block_on(async move {
        let store = Arc::new(BlobPageStore::new(client.clone(), path.clone()));
        let opts = || DriveOptions {
            target: path.to_string(),
            ..DriveOptions::default()
        };
        let drive = match Drive::open(store.clone(), opts()).await {
            Err(drive::Error::InUse { .. }) if break_lease => {
                store
                    .break_lease()
                    .await
                    .map_err(|e| anyhow!("breaking the lease on {path}: {e}"))?;
                Drive::open(store, opts()).await
            }
            other => other,
        }
        .map_err(|e| anyhow!("{e}"))?;
        let blob_size = drive.size_bytes() + crate::units::VHD_FOOTER_BYTES;
        if blob_size != rec.header.blob_size_bytes {
            let _ = drive.close().await;
            return Err(anyhow!(
                "{path} is {blob_size} bytes but {} was saved from a {}-byte blob: \
                 refusing to apply it (the drive was resized or replaced)",
                file.display(),
                rec.header.blob_size_bytes
            ));
        }
        // Read under our lease, so the blob cannot change before the writes
        // (and before the open's own fence, which changes the ETag but no
        // page).
        let now = drive.etag_at_open().map(str::to_string);
        match (&rec.header.blob_etag, force) {
            (Some(saved), false) if now.as_ref() != Some(saved) => {
                let _ = drive.close().await;
                return Err(anyhow!(
                    "{path} changed since {} was saved (ETag {saved}, now {}): someone wrote \
                     to it after this host lost it, and applying the file would put older \
                     pages over those writes; check the drive, then run 'blobdrive recover {} \
                     --force' to apply it anyway",
                    file.display(),
                    now.as_deref().unwrap_or("none"),
                    file.display()
                ));
            }
            (None, false) => tracing::warn!(
                "{} does not say what the blob looked like when it was saved (the service did \
                 not answer then): cannot check that {path} is unchanged since",
                file.display()
            ),
            _ => {}
        }
        for (offset, data) in &rec.runs {
            drive
                .write_at(*offset, data)
                .await
                .map_err(|e| anyhow!("writing {path} at {offset}: {e}"))?;
        }
        drive.close().await.map_err(|e| {
            anyhow!(
                "{e}; {} is kept: run 'blobdrive recover {}' again",
                file.display(),
                file.display()
            )
        })?;
        std::fs::remove_file(&file)
            .map_err(|e| anyhow!("recovered, but removing {}: {e}", file.display()))?;
        output::print_text(&format!(
            "recovered {} bytes in {} records into {path}; removed {}\n",
            rec.header.data_bytes,
            rec.runs.len(),
            file.display()
        ));
        Ok(())
    })
}
