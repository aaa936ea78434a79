//! The salvage of an attach: when its serving processes cannot go on (a
//! crash loop, takeovers that failed for their whole budget, or a takeover
//! refused because another writer came between), what its write log holds
//! is saved in a recovery file straight from the log, and the attach ends.
//!
//! It needs neither storage nor the lease: nothing is read from the blob
//! and nothing is written to it. The log's records are the kernel's WRITE
//! and FALLOCATE requests as received, with plaintext data; they are merged
//! (last writer winning, as a takeover's replay would apply them), sealed
//! with the drive's data key when the drive is encrypted (a recovery file
//! holds what the blob would), and punched or zeroed ranges become the
//! file's zero-range records. The file records the attach's writer lineage
//! (its lease id and the mark its serving processes left in the state), so
//! `recover` applies it only while the blob is still as the attach left it.
//!
//! Invariant: the log is trimmed only after the file is complete and
//! fsynced; a salvage that cannot write the file leaves the log as it was
//! (the holder tries again).

use std::io;
use std::path::PathBuf;

use bytes::Bytes;

use super::attach::AttachOptions;
use super::handover::Handover;
use crate::fs::session::{logged_changes, Piece};
use crate::fs::write_log::WriteLog;
use crate::recovery::{self, Header, LineageRecord};
use crate::units::{PAGE_SIZE, VHD_FOOTER_BYTES};

/// Saves what `log` holds for the attach `spec` (whose state is `state`) in
/// a new recovery file, and returns its path; None when the log holds no
/// acknowledged write.
pub fn save_log(
    spec: &AttachOptions,
    state: &Handover,
    log: &WriteLog,
    reason: &str,
) -> io::Result<Option<PathBuf>> {
    let key = spec.data_key.as_deref();
    let mut runs: Vec<(u64, Bytes)> = Vec::new();
    let mut zeros: Vec<(u64, u64)> = Vec::new();
    let mut data_bytes = 0u64;
    logged_changes(log, |start, end, piece| {
        let whole_pages = start % PAGE_SIZE == 0 && end % PAGE_SIZE == 0;
        if key.is_some() && !whole_pages {
            // A sector's ciphertext depends on all of it: the rest is in
            // the blob, which a salvage does not read.
            return Err(io::Error::other(format!(
                "the write log holds a change of bytes {start}..{end}, not whole 512-byte \
                 sectors, which an encrypted drive cannot seal without reading the blob"
            )));
        }
        match piece {
            Piece::Data(data) => {
                let mut buf = data.to_vec();
                if let Some(key) = key {
                    key.encrypt_pages(start / PAGE_SIZE, &mut buf);
                }
                data_bytes += buf.len() as u64;
                runs.push((start, Bytes::from(buf)));
            }
            Piece::Zero(_) => zeros.push((start, end - start)),
        }
        Ok(())
    })?;
    if runs.is_empty() && zeros.is_empty() {
        return Ok(None);
    }
    let header = Header {
        account: spec.account.clone(),
        target: format!("{}/{}", spec.drive.container, spec.drive.blob),
        blob_size_bytes: state
            .drive_bytes()
            .map_or(0, |bytes| bytes + VHD_FOOTER_BYTES),
        reason: reason.to_string(),
        saved_at: recovery::now_rfc3339(),
        records: 0,
        data_bytes,
        blob_etag: None,
        lineage: Some(LineageRecord {
            lease_id: state.lease_id(),
            mark: state.mark().unwrap_or_default(),
        }),
    };
    recovery::write_file(&recovery::dir(), header, &runs, &zeros)
        .map(Some)
        .map_err(|e| io::Error::other(e.to_string()))
}
