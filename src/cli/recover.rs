//! `blobdrive recover FILE [--break-lease]`: put the pages of a recovery file
//! (written when a flush could not complete at unmount) into their drive.
//!
//! The file is checked whole before anything is written: every checksum, the
//! account, and the blob's size must match, and the blob must still be as
//! the writer lineage the file was saved from left it (its lease still held
//! under the lineage's id, or its sequence number and ETag unchanged since
//! the lineage's last write; `--force` overrides), or nothing is applied.
//! The pages go in under the lineage's lease (a new one with `--force`),
//! through the drive engine, so they are flushed and the lease released as
//! at a normal unmount; the file is deleted only after that succeeded.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::anyhow;
use clap::Args;

use super::drives;
use super::{output, CmdResult, Context};
use crate::blob::{Refusal, ResumeError, Taker};
use crate::drive::{BlobPageStore, Drive, DriveOptions, PageStore as _};
use crate::recovery;

/// Arguments of `recover`.
#[derive(Debug, Args)]
pub struct RecoverArgs {
    /// The recovery file named by the failed unmount.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Break the drive's lease first when it is held (the mount that saved
    /// the file, or another host): say so only when that mount or host is
    /// gone.
    #[arg(long)]
    pub break_lease: bool,
    /// Apply the file even though the blob changed since it was saved, or
    /// whether it did cannot be told (its pages then replace whatever was
    /// written there since).
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
        // Whether the file fits the drive, before anything changes it (the
        // lease and the open's fence would make a retry see another epoch).
        let props = client
            .get_properties(&path)
            .await
            .map_err(|e| anyhow!("cannot read {path}: {e}"))?;
        check_fits(&rec, &path, &file, &props)?;
        let store = Arc::new(BlobPageStore::new(client.clone(), path.clone()));
        // Without --force, the file goes in only as its writer lineage: under
        // its lease id, taken again only while the blob is as that lineage
        // left it (`blob/lineage.rs` decides, and names what changed).
        let lineage = match (&rec.header.lineage, force) {
            (_, true) => None,
            (Some(l), false) => Some(l.clone()),
            (None, false) => {
                return Err(anyhow!(
                    "{} was saved by an older blobdrive that did not record the state it left \
                     {path} in, so whether someone wrote to it since cannot be told; check the \
                     drive, then run 'blobdrive recover {} --force' to apply it anyway",
                    file.display(),
                    file.display()
                ))
            }
        };
        // The file goes in under a new lease, taken only while the blob is as
        // the lineage left it (`blob/lineage.rs` decides, and names what
        // changed); --force takes it whatever happened since.
        let lease_id = uuid::Uuid::new_v4().to_string();
        let refused = |refusal: Refusal| match refusal {
            Refusal::HeldByLineage { .. } | Refusal::LeasedElsewhere { .. } => {
                anyhow!("not applying {}: {refusal}", file.display())
            }
            Refusal::NotRecorded { .. } => anyhow!(
                "not applying {}: {refusal}; check the drive, then run 'blobdrive recover {} \
                 --force' to apply it anyway",
                file.display(),
                file.display()
            ),
            _ => anyhow!(
                "{path} changed since {} was saved: {refusal}; applying it would put older pages \
                 over those writes; check the drive, then run 'blobdrive recover {} --force' to \
                 apply it anyway",
                file.display(),
                file.display()
            ),
        };
        match &lineage {
            Some(l) => {
                let taker = Taker::Recovery {
                    lease_id: lease_id.clone(),
                    break_held: break_lease,
                };
                match client
                    .resume_lineage(&path, &l.lease_id, &l.mark, &taker)
                    .await
                {
                    Ok(_) => {}
                    Err(ResumeError::Refused(r)) => return Err(refused(r)),
                    Err(ResumeError::Backend(e)) => {
                        return Err(anyhow!(
                            "cannot check {path} before recovering into it: {e}"
                        ))
                    }
                }
            }
            None if break_lease => {
                // Forced: whatever holds the lease now is overridden.
                let props = client
                    .get_properties(&path)
                    .await
                    .map_err(|e| anyhow!("cannot read {path}: {e}"))?;
                if props.lease_state == Some(crate::blob::LeaseState::Leased) {
                    store
                        .break_lease()
                        .await
                        .map_err(|e| anyhow!("breaking the lease on {path}: {e}"))?;
                }
            }
            None => {}
        }
        let opts = DriveOptions {
            target: path.to_string(),
            lease_id: Some(lease_id),
            ..DriveOptions::default()
        };
        let drive = Drive::open(store, opts).await.map_err(|e| anyhow!("{e}"))?;
        let applied = async {
            for (offset, data) in &rec.runs {
                drive
                    .write_at(*offset, data)
                    .await
                    .map_err(|e| anyhow!("writing {path} at {offset}: {e}"))?;
            }
            for (offset, len) in &rec.zeros {
                drive
                    .discard(*offset, *len)
                    .await
                    .map_err(|e| anyhow!("zeroing {path} at {offset}+{len}: {e}"))?;
            }
            Ok::<(), anyhow::Error>(())
        }
        .await;
        if let Err(e) = applied {
            // What went in is flushed and the lease released, as at an
            // unmount; the file is kept whole for another try.
            let _ = drive.close().await;
            return Err(anyhow!(
                "{e:#}; {} is kept: run 'blobdrive recover {} --force' again once the drive \
                 is reachable (this try may have written part of it)",
                file.display(),
                file.display()
            ));
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
            rec.runs.len() + rec.zeros.len(),
            file.display()
        ));
        Ok(())
    })
}

/// Refuses a file that does not fit the drive as it is now: a blob smaller
/// than the one it was saved from (shrunk or replaced), a record past the
/// data area, or, on an encrypted drive, a record that is not whole 512-byte
/// sectors (its ciphertext cannot be written in part). A grown drive takes
/// the file: its pages are where they were.
fn check_fits(
    rec: &recovery::Recovery,
    path: &crate::blob::BlobPath,
    file: &std::path::Path,
    props: &crate::blob::BlobProperties,
) -> anyhow::Result<()> {
    let blob_size = props.content_length;
    let saved = rec.header.blob_size_bytes;
    if blob_size < saved {
        return Err(anyhow!(
            "{path} is {blob_size} bytes but {} was saved from a {saved}-byte blob: refusing to \
             apply it (the drive was resized or replaced)",
            file.display()
        ));
    }
    let data_end = blob_size.saturating_sub(crate::units::VHD_FOOTER_BYTES);
    let encrypted = crate::crypt::KeySlots::is_encrypted(&props.metadata);
    let records = rec
        .runs
        .iter()
        .map(|(offset, data)| (*offset, data.len() as u64))
        .chain(rec.zeros.iter().copied());
    for (offset, len) in records {
        let end = offset.saturating_add(len);
        if end > data_end {
            return Err(anyhow!(
                "{} holds bytes {offset}..{end}, past the end of {path}'s data area \
                 ({data_end} bytes): refusing to apply it",
                file.display()
            ));
        }
        let page = crate::units::PAGE_SIZE;
        if encrypted && (offset % page != 0 || len % page != 0) {
            return Err(anyhow!(
                "{} holds bytes {offset}..{end}, not whole 512-byte sectors, and {path} is \
                 encrypted: refusing to apply it",
                file.display()
            ));
        }
    }
    Ok(())
}
