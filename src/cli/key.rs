//! `blobdrive key add|remove|change|dump C/B`: the key slots of an encrypted
//! drive, and the flags and unlock step every command that opens an
//! encrypted drive shares (`--key-file F`, `--passphrase-file F`, or a
//! passphrase prompt on a terminal).
//!
//! Slots change without touching the data: the data key stays, only its
//! wrapping changes. A slot change rewrites the blob's metadata (keeping the
//! other entries), which the service refuses while the drive is leased, so
//! keys change while the drive is not mounted read-write. The last slot is
//! never removed. `dump` prints the data key in hex on stdout, for
//! recovery with standard tools (`cryptsetup open --type plain --cipher
//! aes-xts-plain64 --key-size 512 --key-file <(xxd -r -p ...)`).

use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::anyhow;
use clap::{Args, Subcommand};

use super::drives::{self, blob_err};
use super::{output, CmdResult, CodedError, Context};
use crate::blob::{BlobClient, BlobPath};
use crate::crypt::secret::KeySource;
use crate::crypt::{DataKey, KeySlots, UserKey};

/// `--key-file` / `--passphrase-file`: the key that opens an encrypted drive.
#[derive(Debug, Clone, Default, Args)]
pub struct KeyFlags {
    /// File of exactly 32 random bytes that opens (or, with --encrypt,
    /// protects) the drive's data key.
    #[arg(long, value_name = "FILE", conflicts_with = "passphrase_file")]
    pub key_file: Option<PathBuf>,
    /// File whose content (less one trailing newline) is the passphrase.
    /// Neither flag on a terminal: the passphrase is asked for.
    #[arg(long, value_name = "FILE")]
    pub passphrase_file: Option<PathBuf>,
}

impl KeyFlags {
    /// The source these flags name.
    pub fn source(&self) -> KeySource {
        KeySource {
            key_file: self.key_file.clone(),
            passphrase_file: self.passphrase_file.clone(),
        }
    }
}

/// The slots of `path`, read from its metadata, with the whole metadata.
async fn read_slots(
    client: &BlobClient,
    path: &BlobPath,
) -> anyhow::Result<(Option<KeySlots>, Metadata)> {
    let props = client.get_properties(path).await.map_err(blob_err)?;
    let slots = KeySlots::from_metadata(&props.metadata)
        .map_err(|e| anyhow!("cannot open encrypted drive {path}: {e}"))?;
    Ok((
        slots,
        Metadata {
            entries: props.metadata,
            etag: props.etag,
        },
    ))
}

/// A drive's metadata as read, with the ETag it was read at, so writing it
/// back cannot undo a change made in between.
struct Metadata {
    entries: BTreeMap<String, String>,
    etag: Option<String>,
}

/// Read the user's key for `path` (a prompt when no flag and a terminal).
fn user_key(flags: &KeySource, path: &BlobPath, prompt: &str) -> anyhow::Result<UserKey> {
    flags.read(prompt, false)?.ok_or_else(|| {
        anyhow!(
            "drive {path} is encrypted: give --key-file FILE or --passphrase-file FILE \
             (or run on a terminal to type the passphrase)"
        )
    })
}

/// Open the data key of `path` when it is encrypted. A plain drive with a
/// key flag is a usage error; an encrypted drive without a key, or with a
/// wrong one, fails with one line before anything is mounted or written.
pub async fn unlock(
    client: &BlobClient,
    path: &BlobPath,
    flags: &KeyFlags,
) -> anyhow::Result<Option<Arc<DataKey>>> {
    let source = flags.source();
    let (slots, _) = read_slots(client, path).await?;
    let Some(slots) = slots else {
        if source.is_given() {
            return Err(CodedError::usage(format!(
                "drive {path} is not encrypted; --key-file and --passphrase-file apply to encrypted drives"
            ))
            .into());
        }
        return Ok(None);
    };
    let user = user_key(&source, path, &format!("Passphrase for {path}: "))?;
    let (key, slot) = slots
        .unlock(&user)
        .map_err(|e| anyhow!("cannot unlock drive {path}: {e}"))?;
    tracing::info!(drive = %path, slot, "unlocked");
    Ok(Some(Arc::new(key)))
}

/// Arguments of `key`.
#[derive(Debug, Args)]
pub struct KeyArgs {
    #[command(subcommand)]
    pub action: KeyAction,
}

/// What `key` does.
#[derive(Debug, Subcommand)]
pub enum KeyAction {
    /// Add a key slot: the new key opens the drive too.
    Add(ChangeArgs),
    /// Replace the slot the current key opens with one for the new key.
    Change(ChangeArgs),
    /// Remove the slot the given key opens (or --slot N); never the last one.
    Remove(RemoveArgs),
    /// Print the data key in hex on stdout (for standard tools).
    Dump(DumpArgs),
}

/// `key add` / `key change`.
#[derive(Debug, Args)]
pub struct ChangeArgs {
    /// The encrypted drive, CONTAINER/PATH.
    #[arg(value_name = "C/B")]
    pub blob: String,
    #[command(flatten)]
    pub key: KeyFlags,
    /// The new key: a file of exactly 32 random bytes.
    #[arg(long, value_name = "FILE", conflicts_with = "new_passphrase_file")]
    pub new_key_file: Option<PathBuf>,
    /// The new passphrase, from this file (neither on a terminal: asked for).
    #[arg(long, value_name = "FILE")]
    pub new_passphrase_file: Option<PathBuf>,
}

/// `key remove`.
#[derive(Debug, Args)]
pub struct RemoveArgs {
    /// The encrypted drive, CONTAINER/PATH.
    #[arg(value_name = "C/B")]
    pub blob: String,
    #[command(flatten)]
    pub key: KeyFlags,
    /// Remove slot N instead of the one the key opens.
    #[arg(long, value_name = "N")]
    pub slot: Option<u8>,
}

/// `key dump`.
#[derive(Debug, Args)]
pub struct DumpArgs {
    /// The encrypted drive, CONTAINER/PATH (or a snapshot of it).
    #[arg(value_name = "C/B")]
    pub blob: String,
    #[command(flatten)]
    pub key: KeyFlags,
    /// The snapshot to read the slots of.
    #[arg(long, value_name = "TIME")]
    pub snapshot: Option<String>,
}

/// Run `key`.
pub fn run(ctx: &Context, args: &KeyArgs) -> CmdResult {
    match &args.action {
        KeyAction::Add(a) => change(ctx, a, false),
        KeyAction::Change(a) => change(ctx, a, true),
        KeyAction::Remove(a) => remove(ctx, a),
        KeyAction::Dump(a) => dump(ctx, a),
    }
}

/// Open `path`'s slots with the current key: the slots, the metadata, the
/// data key and the slot it opened.
async fn open_slots(
    client: &BlobClient,
    path: &BlobPath,
    flags: &KeyFlags,
) -> anyhow::Result<(KeySlots, Metadata, DataKey, u8)> {
    let (slots, metadata) = read_slots(client, path).await?;
    let slots = slots.ok_or_else(|| anyhow!("drive {path} is not encrypted"))?;
    let user = user_key(&flags.source(), path, &format!("Passphrase for {path}: "))?;
    let (key, slot) = slots
        .unlock(&user)
        .map_err(|e| anyhow!("cannot unlock drive {path}: {e}"))?;
    Ok((slots, metadata, key, slot))
}

/// Write `slots` into the drive's metadata (keeping the other entries), only
/// if nothing changed the blob since the metadata was read: two `key`
/// commands at once must not drop each other's slot.
async fn save_slots(
    client: &BlobClient,
    path: &BlobPath,
    slots: &KeySlots,
    metadata: Metadata,
) -> anyhow::Result<()> {
    let Metadata { mut entries, etag } = metadata;
    slots.apply_to(&mut entries);
    let pairs: Vec<(String, String)> = entries.into_iter().collect();
    let saved = match &etag {
        Some(etag) => client.set_metadata_if_unchanged(path, &pairs, etag).await,
        None => client.set_metadata(path, &pairs, None).await,
    };
    saved.map_err(|e| match e.code() {
        Some("LeaseIdMissing") => anyhow!(drives::mounted_elsewhere(&path.to_string())),
        Some("ConditionNotMet") => anyhow!(
            "drive {path} changed while its key slots were being updated (another \
             'blobdrive key' at the same time?); nothing was written: run the command again"
        ),
        _ => blob_err(e),
    })
}

fn change(ctx: &Context, args: &ChangeArgs, replace: bool) -> CmdResult {
    let path = drives::parse_blob(&args.blob, None)?;
    drives::require_base(&path, "key slots change on the drive itself")?;
    let client = drives::connect_for(ctx, &args.blob)?;
    let new_source = KeySource {
        key_file: args.new_key_file.clone(),
        passphrase_file: args.new_passphrase_file.clone(),
    };
    drives::block_on(async move {
        let (mut slots, metadata, key, opened) = open_slots(&client, &path, &args.key).await?;
        let new = new_source.read("New passphrase: ", true)?.ok_or_else(|| {
            anyhow!("give the new key: --new-key-file FILE or --new-passphrase-file FILE")
        })?;
        let slot = if replace {
            slots.replace(opened, &key, &new);
            opened
        } else {
            slots
                .add(&key, &new)
                .map_err(|e| anyhow!("cannot add a key to {path}: {e}"))?
        };
        save_slots(&client, &path, &slots, metadata).await?;
        let verb = if replace { "changed" } else { "added" };
        output::print_text(&format!("{verb} key slot {slot} of {path}\n"));
        Ok(())
    })
}

fn remove(ctx: &Context, args: &RemoveArgs) -> CmdResult {
    let path = drives::parse_blob(&args.blob, None)?;
    drives::require_base(&path, "key slots change on the drive itself")?;
    let client = drives::connect_for(ctx, &args.blob)?;
    drives::block_on(async move {
        let (mut slots, metadata, _key, opened) = open_slots(&client, &path, &args.key).await?;
        let slot = args.slot.unwrap_or(opened);
        if !slots.list().iter().any(|(i, _)| *i == slot) {
            return Err(CodedError::usage(format!("drive {path} has no key slot {slot}")).into());
        }
        slots
            .remove(slot)
            .map_err(|e| anyhow!("cannot remove key slot {slot} of {path}: {e}"))?;
        save_slots(&client, &path, &slots, metadata).await?;
        output::print_text(&format!("removed key slot {slot} of {path}\n"));
        Ok(())
    })
}

fn dump(ctx: &Context, args: &DumpArgs) -> CmdResult {
    let path = drives::parse_blob(&args.blob, args.snapshot.as_deref())?;
    let client = drives::connect_for(ctx, &args.blob)?;
    drives::block_on(async move {
        let (_, _, key, _) = open_slots(&client, &path, &args.key).await?;
        let hex = crate::crypt::slots::key_hex(&key);
        // Straight to the descriptor: stdout's buffer would keep a copy
        // of the key in freed memory.
        let cannot = |e: std::io::Error| anyhow!("cannot write the key to stdout: {e}");
        let fd = std::io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .map_err(cannot)?;
        std::fs::File::from(fd)
            .write_all(hex.bytes())
            .map_err(cannot)?;
        Ok(())
    })
}
