//! `blobdrive info C/B [--snapshot T] [--json]`: one drive's sizes, disk type,
//! lease, bytes actually stored and snapshots.
//!
//! A block or append blob gets one error line and exit 1. A page blob that is
//! not a drive (no footer, corrupted footer, dynamic VHD, size mismatch) still
//! gets everything `info` knows about it printed, with the disk type saying
//! why it is not a drive, and then the same reason as the error line and exit
//! 1: a script checking the exit code never takes it for a drive, and a
//! person sees what the blob holds.

use clap::Args;
use serde::Serialize;

use super::drives::{self, blob_err, DiskCheck};
use super::{output, CmdResult, Context};
use crate::blob::{BlobPath, BlobType};
use crate::units::format_size;

/// Arguments of `info`.
#[derive(Debug, Args)]
pub struct InfoArgs {
    /// The drive, CONTAINER/PATH or a full URL.
    #[arg(value_name = "C/B")]
    pub blob: String,
    /// Show this snapshot of the drive instead of the drive itself.
    #[arg(long, value_name = "TIME")]
    pub snapshot: Option<String>,
    /// Print JSON for scripts instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `info --json`: field names are part of the interface.
#[derive(Debug, Serialize)]
pub struct DriveInfo {
    /// `container/blob`.
    pub name: String,
    /// Container.
    pub container: String,
    /// Blob name within the container.
    pub blob: String,
    /// Snapshot time, when showing a snapshot.
    pub snapshot: Option<String>,
    /// True for a page blob ending in a valid fixed VHD footer.
    pub is_drive: bool,
    /// `fixed` for a drive, else null.
    pub disk_type: Option<&'static str>,
    /// Why it is not a drive (null for a drive).
    pub problem: Option<String>,
    /// Disk size in bytes (the footer's current size), null when not a drive.
    pub virtual_size_bytes: Option<u64>,
    /// Blob size in bytes, footer included.
    pub blob_size_bytes: u64,
    /// Tool that wrote the footer (`bdrv`, `qem2`, `wa`, ...), null when not a drive.
    pub creator_app: Option<String>,
    /// Bytes that hold data (sum of the page ranges).
    pub stored_bytes: u64,
    /// `available`, `leased`, `expired`, `breaking`, `broken`.
    pub lease_state: Option<&'static str>,
    /// `locked` or `unlocked`.
    pub lease_status: Option<&'static str>,
    /// `infinite` or `fixed`, when leased.
    pub lease_duration: Option<&'static str>,
    /// `Last-Modified`.
    pub last_modified: Option<String>,
    /// ETag.
    pub etag: Option<String>,
    /// Snapshot times of the drive (of its base blob), oldest first.
    pub snapshots: Vec<String>,
    /// Client-side encryption: the cipher (`"aes-xts-plain64"`), or `None`
    /// for a plain drive.
    pub encryption: Option<String>,
    /// Key slots in use (index and kind); empty for a plain drive.
    pub key_slots: Vec<(u8, crate::crypt::SlotKind)>,
}

/// Run `info`.
pub fn run(ctx: &Context, args: &InfoArgs) -> CmdResult {
    let path = drives::parse_blob(&args.blob, args.snapshot.as_deref())?;
    let client = drives::connect(ctx)?;
    let json = args.json;
    drives::block_on(async move {
        let props = drives::properties(&client, &path).await?;
        if props.blob_type != Some(BlobType::PageBlob) {
            return Err(anyhow::anyhow!(drives::wrong_type_line(
                &path,
                props.blob_type
            )));
        }
        let size = props.content_length;
        let (check, stored, snapshots) = tokio::try_join!(
            drives::check_disk(&client, &path, props.blob_type, size),
            drives::stored_bytes(&client, &path, size),
            drives::snapshots_of(&client, &path),
        )
        .map_err(blob_err)?;
        let footer = check.footer();
        let info = DriveInfo {
            name: path.base().to_string(),
            container: path.container.clone(),
            blob: path.name.clone(),
            snapshot: path.snapshot.clone(),
            is_drive: footer.is_some(),
            disk_type: footer.map(|_| "fixed"),
            problem: check.problem(&path),
            virtual_size_bytes: footer.map(|f| f.current_size_bytes),
            blob_size_bytes: size,
            creator_app: footer.map(|f| f.creator_app_name()),
            stored_bytes: stored,
            lease_state: props.lease_state.map(drives::lease_state_name),
            lease_status: props.lease_status.map(drives::lease_status_name),
            lease_duration: props.lease_duration.map(drives::lease_duration_name),
            last_modified: props.last_modified.clone(),
            etag: props.etag.clone(),
            snapshots,
            encryption: None,
            key_slots: Vec::new(),
        };
        let mut info = info;
        match crate::crypt::KeySlots::from_metadata(&props.metadata) {
            Ok(Some(slots)) => {
                info.encryption = Some(crate::crypt::CIPHER_NAME.to_string());
                info.key_slots = slots.list();
            }
            Ok(None) => {}
            Err(e) => info.encryption = Some(format!("encrypted, unreadable header: {e}")),
        }
        if json {
            output::print_json(&info);
        } else {
            output::print_text(&render(&info, &check, &path, &props));
        }
        match info.problem {
            None => Ok(()),
            Some(p) => Err(anyhow::anyhow!("{path} is not a drive: {p}")),
        }
    })
}

/// The human form: aligned `key  value` lines, then the snapshots.
fn render(
    info: &DriveInfo,
    check: &DiskCheck,
    path: &BlobPath,
    props: &crate::blob::BlobProperties,
) -> String {
    let with_bytes = |b: u64| format!("{} ({b} bytes)", format_size(b));
    let mut rows: Vec<(&str, String)> = vec![("drive", info.name.clone())];
    if let Some(t) = &info.snapshot {
        rows.push(("snapshot", t.clone()));
    }
    let disk_type = match check {
        DiskCheck::Drive(f) => format!("fixed VHD (written by '{}')", f.creator_app_name()),
        _ => format!("not a drive: {}", check.problem(path).unwrap_or_default()),
    };
    rows.push(("disk type", disk_type));
    if let Some(v) = info.virtual_size_bytes {
        rows.push(("virtual size", with_bytes(v)));
    }
    rows.push(("blob size", with_bytes(info.blob_size_bytes)));
    rows.push(("stored", with_bytes(info.stored_bytes)));
    if info.snapshot.is_none() {
        rows.push((
            "lease",
            drives::lease_text(props.lease_state, props.lease_duration),
        ));
    }
    if let Some(m) = &info.last_modified {
        rows.push(("last modified", m.clone()));
    }
    if let Some(e) = &info.etag {
        rows.push(("etag", e.clone()));
    }
    if let Some(cipher) = &info.encryption {
        let slots: Vec<String> = info
            .key_slots
            .iter()
            .map(|(i, k)| match k {
                crate::crypt::SlotKind::KeyFile => format!("{i} key file"),
                crate::crypt::SlotKind::Passphrase => format!("{i} passphrase"),
            })
            .collect();
        rows.push((
            "encryption",
            format!("{cipher}; key slots: {}", slots.join(", ")),
        ));
    }
    rows.push(("snapshots", info.snapshots.len().to_string()));
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut out = String::new();
    for (k, v) in rows {
        out.push_str(&format!("{k:<width$}  {v}\n"));
    }
    for t in &info.snapshots {
        out.push_str(&format!("{:width$}  {t}\n", ""));
    }
    out
}
