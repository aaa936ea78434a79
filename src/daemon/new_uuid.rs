//! `blobdrive copy --new-uuid`: the filesystems of a new copy get fresh
//! UUIDs, offline, so the copy attaches beside its source as another
//! machine's disk would (XFS refuses a second mounted filesystem with one
//! UUID, and tools that find filesystems by UUID would confuse the two).
//!
//! The copy's file is served by a private mount (`format::with_drive_file`,
//! which holds its lease and makes the change durable before returning);
//! each partition (or the whole disk, without a table) is attached to a
//! loop device limited to it, and `attach::filesystem::renew_uuid` does the
//! type's offline change. Areas holding no filesystem, or one of another
//! type, are left alone and reported as such.

use std::path::Path;

use anyhow::Context as _;
use serde::Serialize;

use super::format::{detach_and_wait, private_dir, with_drive_file};
use crate::attach::{filesystem, LoopDevice};
use crate::blob::{Account, BlobPath};
use crate::partition::{read_table, FileDisk};

/// What one area of the copy got.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Renewed {
    /// `partition N`, or `whole disk`.
    pub area: String,
    /// The filesystem type found there, if any.
    pub fs_type: Option<String>,
    /// Its new UUID; `None` when the area was left alone.
    pub uuid: Option<String>,
}

/// Gives every filesystem of drive `path` (`size_bytes` disk bytes, not
/// attached anywhere, not encrypted) a fresh UUID; returns what each area
/// got.
pub fn renew_uuids(
    account: Account,
    path: &BlobPath,
    size_bytes: u64,
) -> anyhow::Result<Vec<Renewed>> {
    let scratch = private_dir(path, "-replay")?;
    let renewed = with_drive_file(account, path, size_bytes, None, |file| {
        renew_in_file(file, &scratch)
            .with_context(|| format!("giving the filesystems of {path} new UUIDs failed"))
    });
    let _ = std::fs::remove_dir(&scratch);
    renewed
}

fn renew_in_file(file: &Path, scratch: &Path) -> anyhow::Result<Vec<Renewed>> {
    let mut disk = FileDisk::open(file)?;
    let areas: Vec<(String, Option<(u64, u64)>)> = match read_table(&mut disk)? {
        Some(table) => table
            .partitions
            .iter()
            .map(|p| {
                (
                    format!("partition {}", p.number),
                    Some((p.start_bytes, p.size_bytes)),
                )
            })
            .collect(),
        None => vec![("whole disk".to_string(), None)],
    };
    drop(disk);
    let mut out = Vec::new();
    for (area, limits) in areas {
        let device = LoopDevice::attach_area(file, false, limits)?;
        let renewed = (|| -> anyhow::Result<Renewed> {
            let fs = filesystem::detect(&device.device)?;
            let uuid = match &fs {
                Some(fs) => filesystem::renew_uuid(&device.device, fs, scratch)?,
                None => None,
            };
            Ok(Renewed {
                area: area.clone(),
                fs_type: fs.map(|f| f.name().to_string()),
                uuid,
            })
        })();
        let detached = detach_and_wait(&device);
        let renewed = renewed.with_context(|| area.clone())?;
        detached?;
        tracing::info!(area = %renewed.area, fs = ?renewed.fs_type, uuid = ?renewed.uuid, "new UUID");
        out.push(renewed);
    }
    Ok(out)
}
