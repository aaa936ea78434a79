//! `blobdrive create C/B --size SIZE [--mkfs FS] [--partition-table gpt]`: a new page blob of size + 512
//! bytes whose last page is a fixed VHD footer.
//!
//! The size rules are checked while parsing. The create is conditional
//! (`If-None-Match: *`), so an existing blob is never replaced (CloudDrive's
//! Create() could lose a drive that way). Only the footer is written: a new
//! drive of any size stores 512 bytes. If the footer cannot be written, the
//! blob just created (ours, empty) is deleted again, so a failed create leaves
//! nothing that looks like a half-made drive.
//!
//! `--mkfs FS` then formats the new drive through a private FUSE mount of it
//! (see `daemon::format`): the filesystem is durable in the blob before the
//! command returns. If formatting fails, the new drive is deleted again.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use clap::Args;

use super::drives::{self, blob_err};
use super::{output, values, CmdResult, CodedError, Context};
use crate::crypt::{DataKey, KeySlots};
use crate::units::{exact_size, format_size};
use crate::vhd::Footer;

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
    /// Write a partition table first: `gpt` makes the layout of an Azure
    /// Linux data disk (one partition from 1 MiB to the end; --mkfs formats it).
    #[arg(long, value_name = "TABLE", value_parser = ["gpt"])]
    pub partition_table: Option<String>,
    /// Encrypt the drive's data on this host (AES-256-XTS) with a random
    /// data key, kept wrapped by the key file or passphrase in a key slot.
    #[arg(long)]
    pub encrypt: bool,
    #[command(flatten)]
    pub key: super::key::KeyFlags,
}

/// Run `create`.
pub fn run(ctx: &Context, args: &CreateArgs) -> CmdResult {
    // Checked before anything is created: a drive made without the
    // filesystem or table asked for would surprise whoever mounts it.
    let mut tools: Vec<(String, String)> = Vec::new();
    if let Some(fs) = &args.mkfs {
        tools.push((format!("--mkfs {fs}"), format!("mkfs.{fs}")));
    }
    if let Some(t) = &args.partition_table {
        tools.push((format!("--partition-table {t}"), "sfdisk".into()));
        tools.push((format!("--partition-table {t}"), "losetup".into()));
    }
    for (flag, tool) in tools {
        if !crate::attach::tool_exists(&tool) {
            return Err(
                CodedError::usage(format!("{flag} needs {tool}, which is not installed")).into(),
            );
        }
    }
    let path = drives::parse_blob(&args.blob, None)?;
    drives::require_base(&path, "a new drive cannot be a snapshot")?;
    let source = args.key.source();
    if source.is_given() && !args.encrypt {
        return Err(CodedError::usage("--key-file and --passphrase-file need --encrypt").into());
    }
    // The key is read before anything is created: a missing key file must
    // not leave a drive behind.
    let encryption = if args.encrypt {
        let user = source
            .read(&format!("New passphrase for {path}: "), true)?
            .ok_or_else(|| {
                CodedError::usage(
                    "--encrypt needs --key-file FILE or --passphrase-file FILE (or a terminal to type a passphrase)",
                )
            })?;
        let key = Arc::new(DataKey::generate());
        crate::crypt::forbid_core_dumps();
        let slots = KeySlots::new(&key, &user);
        Some((key, slots))
    } else {
        None
    };
    let data_key = encryption.as_ref().map(|(k, _)| k.clone());
    let client = drives::connect_for(ctx, &args.blob)?;
    let size_bytes = args.size;
    let account = client.account().clone();
    let created = path.clone();
    drives::block_on(async move {
        let started = Instant::now();
        match client.create_container(&path.container).await {
            Ok(true) => tracing::info!(container = %path.container, "created container"),
            Ok(false) => {}
            // A SAS scoped to one container, or to blobs only, may not create
            // containers; if the container exists the drive can still be made,
            // and if not, creating the blob says so.
            Err(e) if e.is_auth_failure() => {
                tracing::debug!(container = %path.container, error = %e, "cannot create the container; trying the blob");
            }
            Err(e) => return Err(blob_err(e)),
        }
        let footer = Footer::new_fixed(size_bytes);
        client
            .create_page_blob(&path, footer.blob_size_bytes())
            .await
            .map_err(blob_err)?;
        let bytes = Bytes::copy_from_slice(&footer.to_bytes());
        // Key slots go in before the footer: a blob that looks like a drive
        // always says whether it is encrypted.
        let slots_saved = match &encryption {
            Some((_, slots)) => save_new_slots(&client, &path, slots).await,
            None => Ok(()),
        };
        let written = match slots_saved {
            Ok(()) => client.put_pages(&path, size_bytes, bytes, None).await,
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            let why = drives::explain(&e);
            return Err(match client.delete_blob(&path, false, None).await {
                Ok(()) => anyhow::anyhow!(
                    "writing the VHD footer of {path} failed, so the empty blob was deleted again: {why}"
                ),
                Err(d) => anyhow::anyhow!(
                    "writing the VHD footer of {path} failed ({why}), and deleting the empty blob failed too ({}); delete it with 'blobdrive delete --force {path}'",
                    d
                ),
            });
        }
        tracing::info!(drive = %path, ms = started.elapsed().as_millis() as u64, "created drive");
        output::print_text(&format!(
            "created {path}: {} fixed VHD ({}){}\n",
            format_size(size_bytes),
            exact_size(size_bytes),
            if encryption.is_some() {
                ", encrypted (aes-xts-plain64)"
            } else {
                ""
            }
        ));
        Ok(())
    })?;
    let format = crate::daemon::format::Format {
        gpt: args.partition_table.is_some(),
        fs: args.mkfs.as_deref().map(crate::attach::FsType::from_name),
    };
    if format.gpt || format.fs.is_some() {
        format_new_drive(ctx, account, &created, size_bytes, &format, data_key)?;
    }
    Ok(())
}

/// Formats the drive just created; on failure deletes it again, so a failed
/// `create --mkfs` leaves no unformatted drive behind.
fn format_new_drive(
    ctx: &Context,
    account: crate::blob::Account,
    path: &crate::blob::BlobPath,
    size_bytes: u64,
    format: &crate::daemon::format::Format,
    data_key: Option<Arc<DataKey>>,
) -> CmdResult {
    let started = Instant::now();
    let Err(err) = crate::daemon::format::format_drive(account, path, size_bytes, format, data_key)
    else {
        tracing::info!(drive = %path, ms = started.elapsed().as_millis() as u64, "formatted");
        output::print_text(&format!("formatted {path} as {format}\n"));
        return Ok(());
    };
    let client = drives::connect(ctx)?;
    let doomed = path.clone();
    let deleted = drives::block_on(async move {
        client
            .delete_blob(&doomed, false, None)
            .await
            .map_err(blob_err)
    });
    Err(match deleted {
        Ok(()) => err.context(format!("the new drive {path} was deleted again")),
        Err(d) => err.context(format!(
            "the new drive {path} is not formatted and deleting it failed ({d:#}); \
             delete it with 'blobdrive delete {path}'"
        )),
    })
}

/// Add the encryption header and first key slot to the new blob's metadata
/// (keeping what the create put there).
async fn save_new_slots(
    client: &crate::blob::BlobClient,
    path: &crate::blob::BlobPath,
    slots: &KeySlots,
) -> crate::blob::Result<()> {
    let mut metadata = client.get_properties(path).await?.metadata;
    slots.apply_to(&mut metadata);
    let pairs: Vec<(String, String)> = metadata.into_iter().collect();
    client.set_metadata(path, &pairs, None).await
}
