//! `download`: a page blob (or a snapshot of it) into a sparse local file.
//!
//! The blob's page ranges (listed in adaptive segments by
//! `drive::BlobPageStore`) say where its data is; only those ranges are read,
//! in pieces of at most 4 MiB, `parallel` at a time, and of what arrives only
//! the non-zero pages are written. The file is sized first, so everything
//! else stays a hole and costs no disk. With `raw`, the VHD footer is checked
//! and left out, which leaves the plain disk image. With a key, the data area
//! is read through `drive::EncryptedStore` ([`source_store`], which
//! `download --since` reads through too), so the file is the plaintext.
//!
//! The finished file carries the record of what it holds
//! (`super::file_state`: drive, snapshot, ETag, decrypted or not, raw or
//! not), written once the file is synced and before it is renamed into place.
//!
//! Every read is pinned (`PageStore::pin_reads`, If-Match) to the ETag the
//! blob had at the start, the one the record names: a live drive written
//! meanwhile fails the download ([`Error::Changed`]) instead of giving a file
//! that mixes two states, and a leased drive (mounted read-write) is warned
//! about up front. The file, its temporary and its record are created 0600.
//!
//! Invariants: the target is written under a temporary name in the same
//! directory and renamed into place only after every byte arrived and was
//! synced, so a failed download never leaves a truncated image under the
//! name asked for; an existing file is replaced only with `overwrite`, and
//! not while a `download --since` holds its lock
//! (`file_state::lock_exclusive`).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::StreamExt;

use super::file_state::{self, Content, FileState, Format, Source};
use super::progress::Progress;
use super::scan::{nonzero_runs, BLOCK_BYTES};
use super::{io_error, Error, Result, DEFAULT_PARALLEL, MAX_PARALLEL};
use crate::blob::{BlobClient, BlobPath, BlobType, LeaseState};
use crate::drive::store::is_changed;
use crate::drive::{BlobPageStore, EncryptedStore, PageStore};
use crate::units::{ByteRange, PAGE_SIZE, VHD_FOOTER_BYTES};
use crate::vhd::Footer;

/// How a download runs.
#[derive(Debug, Clone)]
pub struct DownloadOptions {
    /// Leave out the VHD footer (the blob must have a valid one).
    pub raw: bool,
    /// Replace an existing local file.
    pub overwrite: bool,
    /// Requests in flight (1 to [`MAX_PARALLEL`]).
    pub parallel: usize,
    /// Decrypt the data area with this key (an encrypted drive's image in
    /// plaintext); `None` writes the blob's bytes as they are.
    pub decrypt: Option<Arc<crate::crypt::DataKey>>,
}

impl Default for DownloadOptions {
    fn default() -> Self {
        DownloadOptions {
            raw: false,
            overwrite: false,
            parallel: DEFAULT_PARALLEL,
            decrypt: None,
        }
    }
}

/// What a download did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct DownloadReport {
    /// Size of the file written.
    pub file_bytes: u64,
    /// Bytes of the blob gone through (received, or skipped as holes).
    pub scanned_bytes: u64,
    /// Bytes received.
    pub received_bytes: u64,
    /// Bytes received but zero, left as holes.
    pub zero_bytes: u64,
    /// Bytes where the blob holds no pages, never read.
    pub hole_bytes: u64,
    /// Requests (Get Blob, page ranges, properties).
    pub requests: u64,
    /// Wall time in seconds.
    pub seconds: f64,
}

impl DownloadReport {
    /// Bytes received per second.
    pub fn rate(&self) -> f64 {
        if self.seconds > 0.0 {
            self.received_bytes as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// Removes the temporary file unless disarmed.
struct TempFile {
    path: PathBuf,
    armed: bool,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if self.armed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn temp_name(target: &Path) -> PathBuf {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "image".into());
    let tmp = format!(".{name}.blobdrive-{}.part", std::process::id());
    target.with_file_name(tmp)
}

/// The store a download reads `blob` (a snapshot when it names one)
/// through: its bytes as stored, or with `key` an encrypted drive's
/// plaintext (the pages below the footer decrypted, the footer as stored).
/// A full download and `download --since` both read through it, so both
/// give the same bytes.
pub fn source_store(
    client: &BlobClient,
    blob: &BlobPath,
    key: Option<Arc<crate::crypt::DataKey>>,
) -> Arc<dyn PageStore> {
    let stored = Arc::new(BlobPageStore::new(client.clone(), blob.clone()));
    match key {
        Some(key) => Arc::new(EncryptedStore::new(stored, key)),
        None => stored,
    }
}

/// Download `blob` (a snapshot when it names one) into `target`.
pub async fn download(
    client: &BlobClient,
    blob: &BlobPath,
    target: &Path,
    opts: &DownloadOptions,
    progress: &Arc<Progress>,
) -> Result<DownloadReport> {
    let started = Instant::now();
    if !opts.overwrite && target.symlink_metadata().is_ok() {
        return Err(Error::FileExists {
            path: target.to_path_buf(),
        });
    }
    // A `download --since` updating the file to be replaced holds its lock:
    // refuse rather than pull the file from under it. Held until the new
    // file is renamed into place.
    // (Only a regular file is opened: a FIFO's open would block, and a
    // rename replaces a symlink, not the file it names.)
    let replaced_file = target.symlink_metadata().is_ok_and(|m| m.is_file());
    let _replaced = if replaced_file {
        let old = File::open(target).map_err(io_error("open", target))?;
        file_state::lock_exclusive(&old, target)?;
        Some(old)
    } else {
        None
    };
    let props = client.get_properties(blob).await?;
    Progress::add(&progress.requests, 1);
    let not_a_drive = |reason: String| Error::NotADrive {
        blob: blob.to_string(),
        reason,
    };
    if props.blob_type != Some(BlobType::PageBlob) {
        return Err(not_a_drive("not a page blob".into()));
    }
    let blob_len = props.content_length;
    let live = blob.snapshot.is_none();
    if live && props.lease_state == Some(LeaseState::Leased) {
        tracing::warn!(
            "{} is leased (mounted read-write?): a download of a drive in use is refused if it changes meanwhile; download a snapshot instead ('blobdrive snapshot {}' then --snapshot T)",
            blob,
            blob.base()
        );
    }
    let store = source_store(client, blob, opts.decrypt.clone());
    // Every read answers only while the blob is the state seen above, whose
    // ETag the record names: a drive written meanwhile fails the download
    // instead of giving a file that mixes two states.
    store.pin_reads(props.etag.as_deref());
    let changed = |e: crate::blob::Error| {
        if is_changed(&e) {
            Error::Changed {
                blob: blob.base().to_string(),
            }
        } else {
            Error::Blob(e)
        }
    };
    let file_len = if opts.raw {
        if blob_len < VHD_FOOTER_BYTES {
            return Err(not_a_drive("too small to hold a VHD footer".into()));
        }
        let tail = store
            .read_stored(ByteRange::new(blob_len - VHD_FOOTER_BYTES, blob_len))
            .await
            .map_err(changed)?;
        Progress::add(&progress.requests, 1);
        check_raw_footer(&blob.to_string(), &tail, blob_len)?;
        blob_len - VHD_FOOTER_BYTES
    } else {
        blob_len
    };
    progress.total_bytes.store(file_len, Ordering::Relaxed);

    let tmp_path = temp_name(target);
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp_path)
        .map_err(io_error("create", &tmp_path))?;
    let mut guard = TempFile {
        path: tmp_path.clone(),
        armed: true,
    };
    file.set_len(file_len)
        .map_err(io_error("size", &tmp_path))?;
    let file = Arc::new(file);

    let ranges = if file_len == 0 {
        Vec::new()
    } else {
        store
            .page_ranges(ByteRange::new(0, file_len))
            .await
            .map_err(changed)?
    };
    let data: u64 = ranges.iter().map(ByteRange::len).sum();
    Progress::add(&progress.hole_bytes, file_len - data);
    Progress::add(&progress.scanned_bytes, file_len - data);
    let pieces = ranges.iter().flat_map(|r| split(*r));
    let parallel = opts.parallel.clamp(1, MAX_PARALLEL);
    let mut results = futures::stream::iter(pieces)
        .map(|piece| fetch_and_write(store.as_ref(), piece, file.clone(), &tmp_path, progress))
        .buffer_unordered(parallel);
    while let Some(r) = results.next().await {
        r.map_err(|e| match e {
            Error::Blob(e) => changed(e),
            e => e,
        })?;
    }
    drop(results);
    let sync_file = file.clone();
    tokio::task::spawn_blocking(move || sync_file.sync_all())
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))
        .and_then(|r| r)
        .map_err(io_error("sync", &tmp_path))?;
    let source = Source {
        account: client.account_name().to_string(),
        blob: blob.base().to_string(),
        snapshot: blob.snapshot.clone(),
        etag: props.etag.clone(),
    };
    let content = if opts.decrypt.is_some() {
        Content::Decrypted
    } else {
        Content::Stored
    };
    let state = FileState::holding(&source, content, Format::of(opts.raw), &file)
        .and_then(|state| file_state::write(&file, target, &state))
        .map_err(io_error("record the state of", &tmp_path))?;
    tracing::debug!(file = %target.display(), kept = ?state, "download recorded");
    std::fs::rename(&tmp_path, target).map_err(io_error("rename into", target))?;
    guard.armed = false;
    Ok(DownloadReport {
        file_bytes: file_len,
        scanned_bytes: Progress::get(&progress.scanned_bytes),
        received_bytes: Progress::get(&progress.transferred_bytes),
        zero_bytes: Progress::get(&progress.zero_bytes),
        hole_bytes: Progress::get(&progress.hole_bytes),
        requests: Progress::get(&progress.requests),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Checks `tail`, the last 512 bytes of `blob` (`blob_len` bytes, a state
/// of a drive) as stored, is the VHD footer `--raw` leaves out: the one
/// check of a full `--raw` download and of `download --since --raw`.
pub fn check_raw_footer(blob: &str, tail: &[u8], blob_len: u64) -> Result<()> {
    let not_a_drive = |reason: String| Error::NotADrive {
        blob: blob.to_string(),
        reason,
    };
    let footer: &[u8; 512] = tail
        .try_into()
        .map_err(|_| not_a_drive("too small to hold a VHD footer".into()))?;
    Footer::parse(footer, blob_len).map_err(|e| {
        not_a_drive(format!(
            "{e}; --raw needs a fixed VHD (an incomplete upload has no footer yet)"
        ))
    })?;
    Ok(())
}

/// `r` cut at the 4 MiB grid.
fn split(r: ByteRange) -> impl Iterator<Item = ByteRange> {
    let mut at = r.start;
    std::iter::from_fn(move || {
        if at >= r.end {
            return None;
        }
        let end = ((at / BLOCK_BYTES + 1) * BLOCK_BYTES).min(r.end);
        let piece = ByteRange::new(at, end);
        at = end;
        Some(piece)
    })
}

async fn fetch_and_write(
    store: &dyn PageStore,
    piece: ByteRange,
    file: Arc<File>,
    path: &Path,
    progress: &Arc<Progress>,
) -> Result<()> {
    let data: Bytes = store.read(piece).await?;
    Progress::add(&progress.requests, 1);
    Progress::add(&progress.transferred_bytes, data.len() as u64);
    let progress = progress.clone();
    let written = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        // Page ranges are 512-aligned; a blob size is too.
        debug_assert!(piece.start % PAGE_SIZE == 0 && data.len() as u64 % PAGE_SIZE == 0);
        let runs = nonzero_runs(piece.start, &data);
        let mut nonzero = 0u64;
        for (offset, bytes) in runs {
            file.write_all_at(&bytes, offset)?;
            nonzero += bytes.len() as u64;
        }
        Progress::add(&progress.zero_bytes, piece.len() - nonzero);
        Progress::add(&progress.scanned_bytes, piece.len());
        Ok(())
    })
    .await
    .map_err(|e| std::io::Error::other(e.to_string()))
    .and_then(|r| r);
    written.map_err(io_error("write", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_follow_the_4mib_grid() {
        let mib = 1 << 20;
        let got: Vec<ByteRange> = split(ByteRange::new(3 * mib, 9 * mib)).collect();
        assert_eq!(
            got,
            vec![
                ByteRange::new(3 * mib, 4 * mib),
                ByteRange::new(4 * mib, 8 * mib),
                ByteRange::new(8 * mib, 9 * mib)
            ]
        );
    }

    #[test]
    fn temp_file_sits_beside_the_target() {
        let t = temp_name(Path::new("/data/disk.img"));
        assert_eq!(t.parent(), Some(Path::new("/data")));
        assert!(t
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with(".disk.img.blobdrive-"));
    }
}
