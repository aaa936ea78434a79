//! `blobdrive info C/B [--snapshot T] [--json]`: one drive's sizes, disk type,
//! lease, bytes actually stored and snapshots, and what the disk holds: its
//! partition table with each partition's place, type, name and filesystem
//! (type, label, UUID from the superblock), or the whole disk's filesystem.
//! A partition table that does not add up is shown as a problem line; the
//! rest of `info` is still printed and the exit code stays 0 (it is a drive).
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
use crate::partition::{Filesystem, Layout, TableKind};
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
    /// The key of an encrypted drive: its partition table and filesystems
    /// are shown only with it (without it they are unknown; no prompt).
    #[command(flatten)]
    pub key: super::key::KeyFlags,
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
    /// Snapshot times of the drive (of its base blob), oldest first; null
    /// when the credential may not list them (a blob SAS, such as a
    /// managed-disk export's).
    pub snapshots: Option<Vec<String>>,
    /// The partition table, null when the disk has none (or is not a drive).
    pub partition_table: Option<TableInfo>,
    /// The filesystem on the whole disk, when it has no partition table.
    pub filesystem: Option<FsInfo>,
    /// Why the partition table is not shown: `unreadable: ...` (it does
    /// not add up), or `unknown without the key ...` (an encrypted drive
    /// whose key was not given).
    pub layout_problem: Option<String>,
    /// Client-side encryption: the cipher (`"aes-xts-plain64"`), or `None`
    /// for a plain drive.
    pub encryption: Option<String>,
    /// Key slots in use (index and kind); empty for a plain drive.
    pub key_slots: Vec<(u8, crate::crypt::SlotKind)>,
    /// How the last copy or restore into the blob stands (`pending`,
    /// `success`, `aborted`, `failed`); null when it never was a copy
    /// destination. Pending, failed or aborted: it does not attach read-write.
    pub copy_status: Option<crate::blob::CopyStatus>,
}

/// `partition_table` of `info --json`.
#[derive(Debug, Serialize)]
pub struct TableInfo {
    /// `gpt` or `mbr`.
    pub kind: TableKind,
    /// GPT disk GUID or MBR disk signature.
    pub disk_id: String,
    /// Things that are off but do not stop the table being used.
    pub warnings: Vec<String>,
    /// The partitions by number.
    pub partitions: Vec<PartInfo>,
}

/// One partition in `info --json`.
#[derive(Debug, Serialize)]
pub struct PartInfo {
    /// Number as Linux gives it (MBR logical partitions from 5).
    pub number: u32,
    /// First byte on the disk.
    pub start_bytes: u64,
    /// Length in bytes.
    pub size_bytes: u64,
    /// Type name (`Linux filesystem`, `EFI System`, ...; `unknown`).
    pub type_name: &'static str,
    /// Type GUID (GPT) or `0x83`-style byte (MBR).
    pub type_id: String,
    /// GPT partition name.
    pub label: Option<String>,
    /// GPT unique partition GUID.
    pub uuid: Option<String>,
    /// What its superblock says, null when nothing was recognised.
    pub filesystem: Option<FsInfo>,
}

/// A filesystem (or LVM/LUKS/swap signature) in `info --json`.
#[derive(Debug, Serialize)]
pub struct FsInfo {
    /// `ext4`, `xfs`, `vfat`, `btrfs`, `ntfs`, `swap`, `LVM2_member`, `crypto_LUKS`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Its label.
    pub label: Option<String>,
    /// Its UUID (serial number for FAT and NTFS).
    pub uuid: Option<String>,
}

impl FsInfo {
    fn of(fs: &Filesystem) -> FsInfo {
        FsInfo {
            kind: fs.kind.name(),
            label: fs.label.clone(),
            uuid: fs.uuid.clone(),
        }
    }
}

/// Run `info`.
pub fn run(ctx: &Context, args: &InfoArgs) -> CmdResult {
    let path = drives::parse_blob(&args.blob, args.snapshot.as_deref())?;
    let client = drives::connect_for(ctx, &args.blob)?;
    let json = args.json;
    drives::block_on(async {
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
            async {
                // Listing needs a permission a read-only blob SAS lacks:
                // then the snapshots are unknown, not none.
                match drives::snapshots_of(&client, &path).await {
                    Ok(times) => Ok(Some(times)),
                    Err(e) if e.is_auth_failure() => {
                        tracing::debug!(error = %e, "cannot list the snapshots");
                        Ok(None)
                    }
                    Err(e) => Err(e),
                }
            },
        )
        .map_err(blob_err)?;
        let footer = check.footer();
        // An encrypted drive's layout is read through its key or not at
        // all: its ciphertext could pass for anything.
        let encrypted = !matches!(
            crate::crypt::KeySlots::from_metadata(&props.metadata),
            Ok(None)
        );
        let key = if args.key.source().is_given() {
            super::key::unlock(&client, &path, &args.key).await?
        } else {
            None
        };
        let layout = match footer {
            Some(_) if encrypted && key.is_none() => Some(Err(LayoutUnknown::NoKey)),
            Some(f) => {
                let store = crate::lifecycle::layout::store_for(&client, &path, key);
                let read = crate::lifecycle::layout::read_layout(
                    store,
                    &path.to_string(),
                    f.current_size_bytes,
                )
                .await?;
                Some(read.map_err(LayoutUnknown::Unreadable))
            }
            None => None,
        };
        let (partition_table, filesystem, layout_problem) = layout_fields(layout);
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
            partition_table,
            filesystem,
            layout_problem,
            encryption: None,
            key_slots: Vec::new(),
            copy_status: props.copy_status.clone(),
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

/// Why a drive's layout is not shown.
enum LayoutUnknown {
    /// Encrypted, and no key was given.
    NoKey,
    /// The table does not add up.
    Unreadable(crate::partition::Error),
}

impl std::fmt::Display for LayoutUnknown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LayoutUnknown::NoKey => f.write_str(
                "unknown without the key (the drive is encrypted; give --key-file or \
                 --passphrase-file to read it)",
            ),
            LayoutUnknown::Unreadable(e) => write!(f, "unreadable: {e}"),
        }
    }
}

/// The JSON fields of a layout: table, whole-disk filesystem, problem.
fn layout_fields(
    layout: Option<Result<Layout, LayoutUnknown>>,
) -> (Option<TableInfo>, Option<FsInfo>, Option<String>) {
    match layout {
        None => (None, None, None),
        Some(Err(e)) => (None, None, Some(e.to_string())),
        Some(Ok(layout)) => {
            let table = layout.table.as_ref().map(|t| TableInfo {
                kind: t.kind,
                disk_id: t.disk_id.clone(),
                warnings: t.warnings.clone(),
                partitions: layout
                    .parts
                    .iter()
                    .map(|p| PartInfo {
                        number: p.partition.number,
                        start_bytes: p.partition.start_bytes,
                        size_bytes: p.partition.size_bytes,
                        type_name: p.partition.kind.name(),
                        type_id: p.partition.kind.id(),
                        label: p.partition.label.clone(),
                        uuid: p.partition.uuid.clone(),
                        filesystem: p.filesystem.as_ref().map(FsInfo::of),
                    })
                    .collect(),
            });
            (table, layout.whole.as_ref().map(FsInfo::of), None)
        }
    }
}

/// `ext4 'label' (UUID u)`, or `-`.
fn fs_text(fs: Option<&FsInfo>) -> String {
    let Some(fs) = fs else {
        return "-".into();
    };
    let mut out = fs.kind.to_string();
    if let Some(l) = &fs.label {
        out.push_str(&format!(" '{l}'"));
    }
    if let Some(u) = &fs.uuid {
        out.push_str(&format!(" {u}"));
    }
    out
}

/// The human form of the partition table: a header line, then one aligned
/// row per partition.
fn render_table(t: &TableInfo) -> String {
    let mut table = output::Table::new(&[
        ("#", output::Align::Right),
        ("start", output::Align::Right),
        ("size", output::Align::Right),
        ("type", output::Align::Left),
        ("name", output::Align::Left),
        ("filesystem", output::Align::Left),
    ]);
    for p in &t.partitions {
        table.row([
            p.number.to_string(),
            format_size(p.start_bytes),
            format_size(p.size_bytes),
            format!("{} ({})", p.type_name, p.type_id),
            p.label.clone().unwrap_or_else(|| "-".into()),
            fs_text(p.filesystem.as_ref()),
        ]);
    }
    let mut out = String::new();
    for w in &t.warnings {
        out.push_str(&format!("warning: {w}\n"));
    }
    if !table.is_empty() {
        out.push_str(&table.render());
    }
    out
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
    if let Some(status) = &info.copy_status {
        let line = crate::drive::error::copy_status_problem(&info.name, Some(status)).map_or_else(
            || status.as_str().to_string(),
            |p| format!("{}: {p}", status.as_str()),
        );
        rows.push(("copy", line));
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
    if let Some(p) = &info.layout_problem {
        rows.push(("partitions", p.clone()));
    } else if let Some(t) = &info.partition_table {
        rows.push((
            "partitions",
            format!(
                "{} (disk id {}), {} partition{}",
                t.kind.name(),
                t.disk_id,
                t.partitions.len(),
                if t.partitions.len() == 1 { "" } else { "s" }
            ),
        ));
    } else if info.is_drive {
        rows.push(("partitions", "none (no partition table)".into()));
        rows.push((
            "filesystem",
            match &info.filesystem {
                Some(fs) => fs_text(Some(fs)),
                None => "none recognised".into(),
            },
        ));
    }
    rows.push((
        "snapshots",
        match &info.snapshots {
            Some(times) => times.len().to_string(),
            None => "unknown (the credential may not list the container)".to_string(),
        },
    ));
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut out = String::new();
    for (k, v) in rows {
        out.push_str(&format!("{k:<width$}  {v}\n"));
    }
    for t in info.snapshots.iter().flatten() {
        out.push_str(&format!("{:width$}  {t}\n", ""));
    }
    if let Some(t) = &info.partition_table {
        out.push_str(&render_table(t));
    }
    out
}
