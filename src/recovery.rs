//! Recovery files: the dirty pages of a drive whose last flush could not
//! complete (lease lost, storage unreachable past the retry budget), saved on
//! local disk so `blobdrive recover FILE` can put them in the blob later.
//!
//! This module owns the file format and where files go; it does not decide
//! when to save (the FUSE adapter does, when closing a drive fails) and does
//! not talk to the blob service (the `recover` command does).
//!
//! Format (integers little-endian):
//! ```text
//! magic "BDRECOV2" | header_len u32 | header JSON | header_crc32c u32
//! records: kind u32 | offset_bytes u64 | len_bytes u64 | crc32c(kind|offset|len|data) u32 | data
//! trailer: "BDRECEND" | record_count u64 | crc32c(magic|count) u32
//! ```
//! A record of kind 0 holds `len_bytes` of data, as the blob would hold
//! them (ciphertext for an encrypted drive); one of kind 1 holds no data
//! and says the range reads as zeros (a punched or zeroed range a salvage
//! took from the write log). Files of the first format (`BDRECOV1`: data
//! records only, `offset u64 | len u32 | crc | data`) are still read.
//! The header names the drive (account, container/blob, no credentials),
//! its blob size and the writer lineage the data belongs to. Invariants: a file is complete and fsynced before it gets
//! its final name (written under a temporary name, renamed, directory
//! fsynced); a file whose checksums, record count or trailer do not match is
//! refused whole, never applied in part.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::drive::Drive;

const MAGIC_V1: &[u8; 8] = b"BDRECOV1";
const MAGIC: &[u8; 8] = b"BDRECOV2";
const KIND_DATA: u32 = 0;
const KIND_ZERO: u32 = 1;
const TRAILER: &[u8; 8] = b"BDRECEND";
/// Environment variable naming the recovery directory.
pub const DIR_ENV: &str = "BLOBDRIVE_RECOVERY_DIR";
/// Where recovery files go when [`DIR_ENV`] is not set.
pub const DEFAULT_DIR: &str = "/var/lib/blobdrive/recovery";
/// Largest header accepted when reading (a sanity bound).
const MAX_HEADER_BYTES: u32 = 64 * 1024;
/// How long saving waits for the blob's ETag.
const ETAG_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// Largest record accepted when reading (runs are cut to this when written).
const MAX_RECORD_BYTES: u32 = 64 * 1024 * 1024;

/// What a recovery file says about the drive it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// Storage account name (never a key or token).
    pub account: String,
    /// `container/blob` of the drive.
    pub target: String,
    /// Size of the page blob (data area + 512-byte footer) when saved.
    pub blob_size_bytes: u64,
    /// Why the data could not be flushed.
    pub reason: String,
    /// RFC 3339 time of the save.
    pub saved_at: String,
    /// Records that follow.
    pub records: u64,
    /// Bytes of data in all records.
    pub data_bytes: u64,
    /// The blob's ETag as files of older versions read it when saving
    /// (not a proof of anything: it may include another writer's pages).
    /// Read for old files only, never written.
    #[serde(default, skip_serializing)]
    pub blob_etag: Option<String>,
    /// The writer lineage the data belongs to: `recover` applies the file
    /// only while the blob is still as that lineage left it
    /// (`blob/lineage.rs`), unless forced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<LineageRecord>,
}

/// The writer lineage a recovery file's data belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineageRecord {
    /// The lease id the lineage wrote under. It lets `recover` take the
    /// lease again while the lineage still holds it; the file is as
    /// private as the data it holds.
    pub lease_id: String,
    /// What the lineage left the blob as.
    #[serde(flatten)]
    pub mark: crate::blob::Mark,
}

/// Why a recovery file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    /// The file could not be read or written.
    #[error("cannot read or write recovery file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file is not a recovery file, or is damaged.
    #[error("{path} is not a usable recovery file: {reason}")]
    Corrupt {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// A recovery file read back and checked.
#[derive(Debug, Clone)]
pub struct Recovery {
    /// The header.
    pub header: Header,
    /// `(offset_bytes, data)` runs, in file order.
    pub runs: Vec<(u64, Bytes)>,
    /// `(offset_bytes, len_bytes)` ranges that read as zeros.
    pub zeros: Vec<(u64, u64)>,
}

/// The directory recovery files go to: `$BLOBDRIVE_RECOVERY_DIR`, else
/// [`DEFAULT_DIR`].
pub fn dir() -> PathBuf {
    std::env::var_os(DIR_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DIR))
}

/// Saves the unflushed data of `drive` (which failed to close because of
/// `reason`) in a new file of [`dir()`]. `Ok(None)` when nothing was dirty.
/// The file I/O runs on a blocking thread.
pub async fn save_drive(
    drive: &Drive,
    account: &str,
    reason: &str,
) -> Result<Option<PathBuf>, RecoveryError> {
    if drive.unflushed_bytes() == 0 {
        return Ok(None);
    }
    let runs = drive.unflushed_data();
    let data_bytes = runs.iter().map(|(_, d)| d.len() as u64).sum();
    let lineage = lineage_of(drive).await;
    let header = Header {
        account: account.to_string(),
        target: drive.target().to_string(),
        blob_size_bytes: drive.size_bytes() + crate::units::VHD_FOOTER_BYTES,
        reason: reason.to_string(),
        saved_at: now_rfc3339(),
        records: 0,
        data_bytes,
        blob_etag: None,
        lineage,
    };
    let dir = dir();
    tokio::task::spawn_blocking(move || write_file(&dir, header, &runs, &[]).map(Some))
        .await
        .map_err(|e| RecoveryError::Io {
            path: String::from("recovery file"),
            source: std::io::Error::other(e),
        })?
}

/// The lineage `drive`'s unflushed data belongs to: its lease id and the
/// mark read under the lease when it is still held (the blob's state then
/// is the lineage's own, whoever wrote last), else the mark the drive's
/// writes left (its last change's ETag, when known).
async fn lineage_of(drive: &Drive) -> Option<LineageRecord> {
    let lease_id = drive.lease_id()?.to_string();
    // Asked briefly: when storage is unreachable the file matters more (and
    // not at all when the last flush already found it silent).
    let wait = if drive.storage_unanswered() {
        std::time::Duration::ZERO
    } else {
        ETAG_WAIT
    };
    let mark = match tokio::time::timeout(wait, drive.state_under_lease()).await {
        Ok(Ok(mark)) => mark,
        Ok(Err(e)) => {
            tracing::info!(target = drive.target(), error = %e, "the lease is not shown held: the recovery file records the state this drive's writes left");
            drive.lineage_mark().unwrap_or_default()
        }
        Err(_) => drive.lineage_mark().unwrap_or_default(),
    };
    Some(LineageRecord { lease_id, mark })
}

/// Writes a recovery file for `header`, the data `runs` and the ranges
/// `zeros` (`(offset_bytes, len_bytes)`, reading as zeros) in `dir`
/// (created if missing) and returns its path. Runs longer than 4 MiB are
/// cut; the header's `records` is set here. Fsyncs the file and the
/// directory.
pub fn write_file(
    dir: &Path,
    mut header: Header,
    runs: &[(u64, Bytes)],
    zeros: &[(u64, u64)],
) -> Result<PathBuf, RecoveryError> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| RecoveryError::Io { path, source }
    };
    // A directory made here is 0700 (the file itself is 0600 either way); one
    // that exists is left as it is: refusing it would lose the data.
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(crate::private_dir::DIR_MODE)
        .create(dir)
        .map_err(io(dir))?;
    let mut records = Vec::new();
    for (offset, data) in runs {
        let mut at = 0usize;
        while at < data.len() {
            let end = (at + crate::units::MAX_PUT_PAGE_BYTES as usize).min(data.len());
            records.push((offset + at as u64, data.slice(at..end)));
            at = end;
        }
    }
    header.records = (records.len() + zeros.len()) as u64;
    let name = file_name(&header.target);
    let path = dir.join(&name);
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(crate::private_dir::FILE_MODE)
        .open(&tmp)
        .map_err(io(&tmp))?;
    let json = serde_json::to_vec(&header).expect("a header of strings and numbers serializes");
    let mut buf = Vec::with_capacity(json.len() + 16);
    buf.extend_from_slice(MAGIC);
    buf.extend_from_slice(&(json.len() as u32).to_le_bytes());
    buf.extend_from_slice(&json);
    buf.extend_from_slice(&crc32c::crc32c(&buf).to_le_bytes());
    file.write_all(&buf).map_err(io(&tmp))?;
    let data = records
        .iter()
        .map(|(offset, data)| (KIND_DATA, *offset, data.len() as u64, data.as_ref()));
    let zero = zeros
        .iter()
        .map(|(offset, len)| (KIND_ZERO, *offset, *len, &[][..]));
    for (kind, offset, len, data) in data.chain(zero) {
        let mut head = [0u8; 20];
        head[..4].copy_from_slice(&kind.to_le_bytes());
        head[4..12].copy_from_slice(&offset.to_le_bytes());
        head[12..].copy_from_slice(&len.to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&head), data);
        file.write_all(&head).map_err(io(&tmp))?;
        file.write_all(&crc.to_le_bytes()).map_err(io(&tmp))?;
        file.write_all(data).map_err(io(&tmp))?;
    }
    file.write_all(&trailer(header.records)).map_err(io(&tmp))?;
    file.sync_all().map_err(io(&tmp))?;
    drop(file);
    std::fs::rename(&tmp, &path).map_err(io(&path))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))?;
    Ok(path)
}

/// Reads and checks a recovery file: magic, header checksum, every record's
/// checksum, the record count and the trailer. Any mismatch refuses the file.
pub fn read_file(path: &Path) -> Result<Recovery, RecoveryError> {
    let shown = path.display().to_string();
    let corrupt = |reason: &str| RecoveryError::Corrupt {
        path: shown.clone(),
        reason: reason.to_string(),
    };
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|source| RecoveryError::Io {
            path: shown.clone(),
            source,
        })?;
    let mut r = Cursor {
        bytes: &bytes,
        at: 0,
    };
    let v1 = match r.take(8) {
        Some(m) if m == MAGIC.as_slice() => false,
        Some(m) if m == MAGIC_V1.as_slice() => true,
        _ => return Err(corrupt("it does not start with the recovery file magic")),
    };
    let header_len = r.u32().ok_or_else(|| corrupt("truncated header"))?;
    if header_len > MAX_HEADER_BYTES {
        return Err(corrupt("header too large"));
    }
    let json = r
        .take(header_len as usize)
        .ok_or_else(|| corrupt("truncated header"))?;
    let head_end = r.at;
    let crc = r.u32().ok_or_else(|| corrupt("truncated header"))?;
    if crc32c::crc32c(&bytes[..head_end]) != crc {
        return Err(corrupt("header checksum mismatch"));
    }
    let header: Header =
        serde_json::from_slice(json).map_err(|e| corrupt(&format!("bad header: {e}")))?;
    let mut runs = Vec::new();
    let mut zeros = Vec::new();
    for n in 0..header.records {
        let bad = |what: &str| corrupt(&format!("record {n}: {what}"));
        let start = r.at;
        let kind = if v1 {
            KIND_DATA
        } else {
            r.u32().ok_or_else(|| bad("truncated"))?
        };
        let offset = r.u64().ok_or_else(|| bad("truncated"))?;
        let len =
            if v1 { r.u32().map(u64::from) } else { r.u64() }.ok_or_else(|| bad("truncated"))?;
        let head_end = r.at;
        let crc = r.u32().ok_or_else(|| bad("truncated"))?;
        let data = match kind {
            KIND_DATA if len > u64::from(MAX_RECORD_BYTES) => return Err(bad("length too large")),
            KIND_DATA => r.take(len as usize).ok_or_else(|| bad("truncated"))?,
            KIND_ZERO => &[][..],
            _ => return Err(bad("unknown kind")),
        };
        let actual = crc32c::crc32c_append(crc32c::crc32c(&bytes[start..head_end]), data);
        if actual != crc {
            return Err(bad("checksum mismatch"));
        }
        if offset.checked_add(len).is_none() {
            return Err(bad("ends past 2^64"));
        }
        // The first format held whole pages only; a salvage's records
        // keep the bytes of the requests as the kernel sent them.
        if v1 && (offset % 512 != 0 || len % 512 != 0) {
            return Err(bad("not whole 512-byte pages"));
        }
        match kind {
            KIND_DATA => runs.push((offset, Bytes::copy_from_slice(data))),
            _ => zeros.push((offset, len)),
        }
    }
    if r.take(20) != Some(trailer(header.records).as_slice()) || r.at != bytes.len() {
        return Err(corrupt(
            "trailer missing or wrong (file truncated or extended)",
        ));
    }
    Ok(Recovery {
        header,
        runs,
        zeros,
    })
}

fn trailer(records: u64) -> [u8; 20] {
    let mut t = [0u8; 20];
    t[..8].copy_from_slice(TRAILER);
    t[8..16].copy_from_slice(&records.to_le_bytes());
    let crc = crc32c::crc32c(&t[..16]);
    t[16..].copy_from_slice(&crc.to_le_bytes());
    t
}

/// `container-path_to_blob-YYYYmmddTHHMMSS-PID.bdrec`: unique per save and
/// readable in a directory listing.
fn file_name(target: &str) -> String {
    let safe: String = target
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(100)
        .collect();
    let stamp = time::OffsetDateTime::now_utc()
        .format(time::macros::format_description!(
            "[year][month][day]T[hour][minute][second]"
        ))
        .unwrap_or_default();
    let nonce: u32 = rand::random();
    format!("{safe}-{stamp}-{}-{nonce:08x}.bdrec", std::process::id())
}

pub(crate) fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let s = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            account: "devstoreaccount1".into(),
            target: "c/dir/disk.vhd".into(),
            blob_size_bytes: 8 * 1024 * 1024 + 512,
            reason: "lease lost".into(),
            saved_at: now_rfc3339(),
            records: 0,
            data_bytes: 0,
            blob_etag: None,
            lineage: Some(LineageRecord {
                lease_id: "5c4a2f8e-0000-4000-8000-000000000000".into(),
                mark: crate::blob::Mark {
                    epoch: Some(3),
                    etag: Some("\"0x8DC0\"".into()),
                },
            }),
        }
    }

    #[test]
    fn a_written_file_reads_back_with_its_runs_cut_to_4_mib() {
        let dir = tempfile::tempdir().unwrap();
        let big = Bytes::from(vec![7u8; 5 * 1024 * 1024]);
        let runs = vec![(0u64, Bytes::from(vec![1u8; 512])), (1024 * 1024, big)];
        let path = write_file(dir.path(), header(), &runs, &[]).unwrap();
        let rec = read_file(&path).unwrap();
        assert_eq!(rec.header.records, 3);
        assert_eq!(rec.runs.len(), 3);
        assert_eq!(rec.runs[1].0, 1024 * 1024);
        assert_eq!(rec.runs[2].0, 1024 * 1024 + 4 * 1024 * 1024);
        assert!(rec.runs[2].1.iter().all(|&b| b == 7));
    }

    #[test]
    fn a_recovery_file_and_the_directory_made_for_it_are_private() {
        use std::os::unix::fs::MetadataExt;
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("var/lib/blobdrive/recovery");
        let runs = vec![(0u64, Bytes::from(vec![9u8; 512]))];
        let path = write_file(&dir, header(), &runs, &[]).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700, "the recovery directory");
        assert_eq!(
            mode(&root.path().join("var")),
            0o700,
            "a parent made for it"
        );
        assert_eq!(mode(&path), 0o600, "the recovery file");
    }

    #[test]
    fn a_flipped_bit_or_a_truncation_refuses_the_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let runs = vec![(512u64, Bytes::from(vec![3u8; 4096]))];
        let path = write_file(dir.path(), header(), &runs, &[]).unwrap();
        let good = std::fs::read(&path).unwrap();
        let mut flipped = good.clone();
        let at = good.len() - 100;
        flipped[at] ^= 1;
        std::fs::write(&path, &flipped).unwrap();
        let err = read_file(&path).unwrap_err().to_string();
        assert!(err.contains("checksum mismatch"), "{err}");
        std::fs::write(&path, &good[..good.len() - 10]).unwrap();
        assert!(read_file(&path).is_err());
        std::fs::write(&path, b"hello").unwrap();
        assert!(read_file(&path).unwrap_err().to_string().contains("magic"));
    }

    #[test]
    fn zero_ranges_and_the_lineage_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let runs = vec![(100u64, Bytes::from(vec![5u8; 7]))];
        let zeros = vec![(1 << 20, 3u64 << 30)];
        let path = write_file(dir.path(), header(), &runs, &zeros).unwrap();
        let rec = read_file(&path).unwrap();
        assert_eq!(rec.header.records, 2);
        assert_eq!(
            rec.runs, runs,
            "a salvage's unaligned bytes are kept as sent"
        );
        assert_eq!(rec.zeros, zeros);
        assert_eq!(rec.header.lineage, header().lineage);
    }

    #[test]
    fn a_file_of_the_first_format_still_reads() {
        // As the first format wrote it: one data record of one page.
        let header = serde_json::json!({
            "account": "a", "target": "c/d.vhd", "blob_size_bytes": 1049088u64,
            "reason": "r", "saved_at": "t", "records": 1, "data_bytes": 512,
            "blob_etag": "\"0x1\""
        });
        let json = serde_json::to_vec(&header).unwrap();
        let mut buf = Vec::new();
        buf.extend_from_slice(MAGIC_V1);
        buf.extend_from_slice(&(json.len() as u32).to_le_bytes());
        buf.extend_from_slice(&json);
        let crc = crc32c::crc32c(&buf);
        buf.extend_from_slice(&crc.to_le_bytes());
        let mut head = [0u8; 12];
        head[..8].copy_from_slice(&4096u64.to_le_bytes());
        head[8..].copy_from_slice(&512u32.to_le_bytes());
        let data = [7u8; 512];
        let crc = crc32c::crc32c_append(crc32c::crc32c(&head), &data);
        buf.extend_from_slice(&head);
        buf.extend_from_slice(&crc.to_le_bytes());
        buf.extend_from_slice(&data);
        buf.extend_from_slice(&trailer(1));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.bdrec");
        std::fs::write(&path, &buf).unwrap();
        let rec = read_file(&path).unwrap();
        assert_eq!(rec.runs, vec![(4096, Bytes::from(vec![7u8; 512]))]);
        assert_eq!(rec.header.lineage, None, "an old file records no lineage");
        assert_eq!(rec.header.blob_etag.as_deref(), Some("\"0x1\""));
    }
}
