//! `blobdrive create C/B --size SIZE [--mkfs FS] [--partition-table gpt]`: a new page blob of size + 512
//! bytes whose last page is a fixed VHD footer.
//!
//! The size rules are checked while parsing (and again by the create). The
//! drive is made by `provision::create::create_drive`, which a namespace
//! mount's `truncate -s` shares: conditional (`If-None-Match: *`), so an
//! existing blob is never replaced; only the footer is written; a failure
//! after the blob was made deletes it again.
//!
//! `--mkfs FS` then formats the new drive through a private FUSE mount of it
//! (see `daemon::format`): the filesystem is durable in the blob before the
//! command returns. If formatting fails, the new drive is deleted again.

use std::sync::Arc;
use std::time::Instant;

use clap::Args;

use super::drives::{self, blob_err};
use super::{output, values, CmdResult, CodedError, Context};
use crate::crypt::{DataKey, KeySlots};
use crate::provision::create::{create_drive, CreateError};
use crate::units::{exact_size, format_size};

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
        let slots = encryption.as_ref().map(|(_, slots)| slots);
        create_drive(&client, &path, size_bytes, slots)
            .await
            .map_err(|e| match e {
                CreateError::Size(e) => anyhow::anyhow!("{e}"),
                CreateError::Blob(e) => blob_err(e),
                CreateError::Footer { error, cleanup: Ok(()) } => anyhow::anyhow!(
                    "writing the VHD footer of {path} failed, so the empty blob was deleted again: {}",
                    drives::explain(&error)
                ),
                CreateError::Footer { error, cleanup: Err(d) } => anyhow::anyhow!(
                    "writing the VHD footer of {path} failed ({}), and deleting the empty blob failed too ({d}); delete it with 'blobdrive delete --force {path}'",
                    drives::explain(&error)
                ),
            })?;
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
