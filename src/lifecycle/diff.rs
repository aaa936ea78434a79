//! The difference between two states of a drive (a snapshot and a later
//! snapshot or the live blob), and bringing a local copy of the earlier
//! state up to date with it (`download --since`).
//!
//! The service's diff (Get Page Ranges with `prevsnapshot`) lists the pages
//! written since the earlier snapshot and the ones cleared; an emulator may
//! ignore `prevsnapshot` and list every page holding data, and no cleared
//! ones. So the result is derived to be right either way: written = the
//! service's written ranges that hold data in the later state, plus any
//! range that holds data now and did not then; cleared = what held data in
//! the earlier state and holds none in the later one. Where the service
//! answers the diff properly only changed pages are fetched; elsewhere more
//! is fetched, never less. All ranges are half-open byte ranges of the data
//! area (the VHD footer is not part of it).
//!
//! The update of a local copy ([`update_file`]) reads the later state
//! through the same store as a full download (`transfer::download::
//! source_store`: decrypted with the key, or as stored), and trusts the file
//! only as far as its record says (`transfer::file_state`): the record must
//! name this drive, snapshot T1 at its ETag, the same content and format,
//! and a file unchanged since. It holds an exclusive lock on the file for
//! the whole update (a second update at once is refused), reads the record
//! only once it holds it, and marks the record "updating to T2" before
//! it writes, and records T2 only once the file is synced; a run that finds
//! its own mark applies the whole difference again, which writes every
//! written range with T2's bytes and punches every cleared range, so an
//! interrupted update re-run ends byte for byte where an uninterrupted one
//! would.

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use serde::Serialize;

use crate::blob::{BlobClient, BlobPath, Result as BlobResult};
use crate::crypt::DataKey;
use crate::drive::PageStore;
use crate::transfer::download::{check_raw_footer, source_store};
use crate::transfer::file_state::{self, Content, FileState, Format, Plan, Source, Updating};
use crate::transfer::Progress;
use crate::units::{ByteRange, MAX_PUT_PAGE_BYTES, VHD_FOOTER_BYTES};

/// Two states of one page blob, as the diff needs them. A state is a
/// snapshot time, or `None` for the live blob.
#[async_trait]
pub trait StateStore: Send + Sync {
    /// Size of the blob in that state, footer included.
    async fn blob_size(&self, state: Option<&str>) -> BlobResult<u64>;
    /// The ranges holding data within `within` in that state, sorted.
    async fn page_ranges(
        &self,
        state: Option<&str>,
        within: ByteRange,
    ) -> BlobResult<Vec<ByteRange>>;
    /// The ranges the service says were written in `state` since the
    /// snapshot `prev` (Get Page Ranges with `prevsnapshot`).
    async fn written_since(&self, state: Option<&str>, prev: &str) -> BlobResult<Vec<ByteRange>>;
    /// Reads `range` of that state.
    async fn read(&self, state: Option<&str>, range: ByteRange) -> BlobResult<Bytes>;
    /// The ETag of that state (`None` where the store has none).
    async fn etag(&self, _state: Option<&str>) -> BlobResult<Option<String>> {
        Ok(None)
    }
}

/// A drive of an account as a [`StateStore`].
pub struct BlobStates {
    client: BlobClient,
    path: BlobPath,
    key: Option<Arc<DataKey>>,
    /// The store each state is read through, made at its first read.
    stores: Mutex<HashMap<Option<String>, Arc<dyn PageStore>>>,
}

impl BlobStates {
    /// The states of the drive `path` (its base blob and snapshots), read
    /// as stored.
    pub fn new(client: BlobClient, path: &BlobPath) -> Self {
        BlobStates {
            client,
            path: path.base(),
            key: None,
            stores: Mutex::new(HashMap::new()),
        }
    }

    /// The same states read decrypted with `key` (an encrypted drive's
    /// plaintext; the footer as stored), as a full `download --decrypt`
    /// reads them.
    pub fn decrypting(mut self, key: Arc<DataKey>) -> Self {
        self.key = Some(key);
        self
    }

    fn at(&self, state: Option<&str>) -> BlobPath {
        self.path.clone().with_snapshot(state)
    }

    fn store(&self, state: Option<&str>) -> Arc<dyn PageStore> {
        let mut stores = self.stores.lock().expect("stores mutex poisoned");
        stores
            .entry(state.map(str::to_string))
            .or_insert_with(|| source_store(&self.client, &self.at(state), self.key.clone()))
            .clone()
    }
}

#[async_trait]
impl StateStore for BlobStates {
    async fn blob_size(&self, state: Option<&str>) -> BlobResult<u64> {
        Ok(self
            .client
            .get_properties(&self.at(state))
            .await?
            .content_length)
    }

    async fn page_ranges(
        &self,
        state: Option<&str>,
        within: ByteRange,
    ) -> BlobResult<Vec<ByteRange>> {
        self.store(state).page_ranges(within).await
    }

    async fn written_since(&self, state: Option<&str>, prev: &str) -> BlobResult<Vec<ByteRange>> {
        Ok(self
            .client
            .get_page_ranges_diff(&self.at(state), prev)
            .await?
            .written)
    }

    async fn read(&self, state: Option<&str>, range: ByteRange) -> BlobResult<Bytes> {
        self.store(state).read(range).await
    }

    async fn etag(&self, state: Option<&str>) -> BlobResult<Option<String>> {
        Ok(self.client.get_properties(&self.at(state)).await?.etag)
    }
}

/// Sorted, merged, without empty ranges.
pub fn normalize(mut v: Vec<ByteRange>) -> Vec<ByteRange> {
    v.retain(|r| !r.is_empty());
    v.sort_by_key(|r| r.start);
    let mut out: Vec<ByteRange> = Vec::with_capacity(v.len());
    for r in v {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// The parts of `a` inside `b` (both normalized).
pub fn intersect(a: &[ByteRange], b: &[ByteRange]) -> Vec<ByteRange> {
    let mut out = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        let start = a[i].start.max(b[j].start);
        let end = a[i].end.min(b[j].end);
        if start < end {
            out.push(ByteRange::new(start, end));
        }
        if a[i].end < b[j].end {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// The parts of `a` outside `b` (both normalized).
pub fn subtract(a: &[ByteRange], b: &[ByteRange]) -> Vec<ByteRange> {
    let mut out = Vec::new();
    let mut j = 0;
    for r in a {
        let mut at = r.start;
        while j < b.len() && b[j].end <= at {
            j += 1;
        }
        let mut k = j;
        while k < b.len() && b[k].start < r.end {
            if b[k].start > at {
                out.push(ByteRange::new(at, b[k].start));
            }
            at = at.max(b[k].end);
            k += 1;
        }
        if at < r.end {
            out.push(ByteRange::new(at, r.end));
        }
    }
    out
}

fn total(v: &[ByteRange]) -> u64 {
    v.iter().map(ByteRange::len).sum()
}

/// What changed between two states of a drive.
#[derive(Debug, Clone, Serialize)]
pub struct Diff {
    /// The earlier state (a snapshot time).
    pub from: String,
    /// The later state: a snapshot time, or `None` for the live drive.
    pub to: Option<String>,
    /// Disk size (data area) at `from`, in bytes.
    pub from_size_bytes: u64,
    /// Disk size at `to`, in bytes.
    pub to_size_bytes: u64,
    /// Ranges written (to be fetched), `[start, end)`.
    pub written: Vec<ByteRange>,
    /// Ranges cleared (to read as zeros), `[start, end)`.
    pub cleared: Vec<ByteRange>,
    /// Bytes in `written`.
    pub written_bytes: u64,
    /// Bytes in `cleared`.
    pub cleared_bytes: u64,
}

/// The diff of `store` from snapshot `from` to `to` (`None`: the live blob).
pub async fn diff(store: &dyn StateStore, from: &str, to: Option<&str>) -> BlobResult<Diff> {
    let data = |blob: u64| blob.saturating_sub(VHD_FOOTER_BYTES);
    let s1 = data(store.blob_size(Some(from)).await?);
    let s2 = data(store.blob_size(to).await?);
    let ranges = |state, size| async move {
        if size == 0 {
            Ok(Vec::new())
        } else {
            store
                .page_ranges(state, ByteRange::new(0, size))
                .await
                .map(normalize)
        }
    };
    let r1 = ranges(Some(from), s1).await?;
    let r2 = ranges(to, s2).await?;
    let service = normalize(store.written_since(to, from).await?);
    let mut written = intersect(&service, &r2);
    written.extend(subtract(&r2, &r1));
    let written = normalize(written);
    let cleared = intersect(&subtract(&r1, &r2), &[ByteRange::new(0, s2)]);
    Ok(Diff {
        from: from.to_string(),
        to: to.map(str::to_string),
        from_size_bytes: s1,
        to_size_bytes: s2,
        written_bytes: total(&written),
        cleared_bytes: total(&cleared),
        written,
        cleared,
    })
}

/// What an incremental download did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct UpdateReport {
    /// Size of the file now.
    pub file_bytes: u64,
    /// Bytes fetched from the service.
    pub fetched_bytes: u64,
    /// Bytes made holes (cleared since).
    pub punched_bytes: u64,
    /// Get Blob requests made for data.
    pub requests: u64,
    /// An interrupted update of the same two states was applied again.
    pub resumed: bool,
    /// The file held the later state already: nothing was done.
    pub up_to_date: bool,
}

/// The size a download of a state of `data_bytes` has: with the footer,
/// or without it (`raw`).
pub fn file_size_of(data_bytes: u64, raw: bool) -> u64 {
    if raw {
        data_bytes
    } else {
        data_bytes + VHD_FOOTER_BYTES
    }
}

fn punch(file: &std::fs::File, r: ByteRange) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let (Ok(off), Ok(len)) = (i64::try_from(r.start), i64::try_from(r.len())) else {
        return Err(std::io::Error::other("range too large"));
    };
    // SAFETY: a plain syscall on a descriptor this function borrows.
    let rc = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off,
            len,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EOPNOTSUPP) {
        // A filesystem without holes: zeros read the same.
        return write_zeros(file, r);
    }
    Err(err)
}

/// `r` in pieces of at most 4 MiB ([`MAX_PUT_PAGE_BYTES`]), in order: the
/// Get Blob requests of an update, and the writes that zero a range.
fn pieces(r: ByteRange) -> impl Iterator<Item = ByteRange> {
    (r.start..r.end)
        .step_by(MAX_PUT_PAGE_BYTES as usize)
        .map(move |at| ByteRange::new(at, r.end.min(at + MAX_PUT_PAGE_BYTES)))
}

/// Writes zeros over `r` a piece at a time, so a cleared range of any size
/// needs one 4 MiB buffer, not its size in memory.
fn write_zeros(file: &std::fs::File, r: ByteRange) -> std::io::Result<()> {
    let zeros = vec![0u8; r.len().min(MAX_PUT_PAGE_BYTES) as usize];
    for piece in pieces(r) {
        file.write_all_at(&zeros[..piece.len() as usize], piece.start)?;
    }
    Ok(())
}

/// The local file `download --since` brings up to date, and how.
#[derive(Debug, Clone)]
pub struct UpdateTarget<'a> {
    /// The file, a download of the diff's earlier snapshot.
    pub path: &'a Path,
    /// The storage account of the drive.
    pub account: String,
    /// The drive, `container/path`.
    pub blob: String,
    /// Decrypted (`--decrypt`, the states read with the key) or as stored.
    pub content: Content,
    /// With the footer, or `--raw`.
    pub format: Format,
    /// Get Blob requests in flight.
    pub parallel: usize,
    /// The command that downloads the later snapshot in full into a new
    /// file: the advice when the file cannot be updated.
    pub full_download: String,
}

/// Brings the file `target.path`, a download of the snapshot `diff.from`,
/// up to the snapshot `diff.to`, after its record says it holds `diff.from`
/// (or an interrupted update between the same two): see the module head.
/// `store` must read as `target.content` says (decrypted or as stored).
pub async fn update_file(
    store: &dyn StateStore,
    diff: &Diff,
    target: &UpdateTarget<'_>,
    progress: &Arc<Progress>,
) -> anyhow::Result<UpdateReport> {
    let path = target.path;
    let Some(to) = diff.to.as_deref() else {
        anyhow::bail!(
            "an update of {} needs the later state to be a snapshot (--snapshot T2), so the file names the state it holds",
            path.display()
        );
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?;
    // Held until the file is closed at the end: another update (or a full
    // download over it) is refused meanwhile. The size and the record are
    // read only now, so they are what this run alone goes on to change.
    file_state::lock_exclusive(&file, path)?;
    let meta = file.metadata()?;
    let record = file_state::read(path)?;
    let from = Source {
        account: target.account.clone(),
        blob: target.blob.clone(),
        snapshot: Some(diff.from.clone()),
        etag: store.etag(Some(&diff.from)).await?,
    };
    let ask = file_state::UpdateAsk {
        path,
        from: &from,
        to,
        content: target.content,
        format: target.format,
        full_download: &target.full_download,
    };
    let plan = file_state::plan_update(record.as_ref(), &meta, &ask).map_err(anyhow::Error::msg)?;
    let raw = target.format == Format::Raw;
    let mut report = UpdateReport {
        file_bytes: meta.len(),
        resumed: plan == Plan::Resume,
        up_to_date: plan == Plan::UpToDate,
        ..UpdateReport::default()
    };
    // `plan_update` refused a file without a record.
    let mut state =
        record.ok_or_else(|| anyhow::anyhow!("{} has no download record", path.display()))?;
    match plan {
        Plan::UpToDate => return Ok(report),
        Plan::Resume => {
            tracing::info!(file = %path.display(), from = %diff.from, to, "applying an interrupted update again");
        }
        Plan::Update => {
            let want = file_size_of(diff.from_size_bytes, raw);
            if meta.len() != want {
                anyhow::bail!(
                    "{} is {} bytes, but a {}download of snapshot {} is {want} bytes: it is not a copy made at that snapshot",
                    path.display(),
                    meta.len(),
                    if raw { "--raw " } else { "" },
                    diff.from,
                );
            }
        }
    }
    if raw {
        // The same check of T2's footer a full `--raw` download makes.
        let blob_len = diff.to_size_bytes + VHD_FOOTER_BYTES;
        let tail = store
            .read(Some(to), ByteRange::new(diff.to_size_bytes, blob_len))
            .await?;
        check_raw_footer(&format!("{}@{to}", target.blob), &tail, blob_len)?;
    }
    // From here on the file mixes the two states until the end: say so first.
    state.updating = Some(Updating { to: to.to_string() });
    file_state::write(&file, path, &state)
        .map_err(|e| anyhow::anyhow!("cannot record the update in {}: {e}", path.display()))?;
    let applied = apply(store, diff, &file, raw, target.parallel, progress)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "the update of {} from {} to {to} stopped: {e}; the file holds neither state now: run the same command again to finish it",
                path.display(),
                diff.from
            )
        })?;
    report = UpdateReport {
        resumed: report.resumed,
        ..applied
    };
    let holds = Source {
        snapshot: Some(to.to_string()),
        etag: store.etag(Some(to)).await?,
        ..from
    };
    let done = FileState::holding(&holds, target.content, target.format, &file)?;
    file_state::write(&file, path, &done)
        .map_err(|e| anyhow::anyhow!("cannot record the update in {}: {e}", path.display()))?;
    Ok(report)
}

/// Applies `diff` to `file`, a download of `diff.from` (with the footer, or
/// `raw` without) or a part-way update from it to `diff.to`: sizes it,
/// fetches the written ranges (`parallel` requests in flight), punches
/// holes for the cleared ones, writes the new footer and syncs. Idempotent:
/// it writes only the ranges that differ, each wholly, so running it again
/// on a file it stopped half way through gives the same file.
pub async fn apply(
    store: &dyn StateStore,
    diff: &Diff,
    file: &std::fs::File,
    raw: bool,
    parallel: usize,
    progress: &Arc<Progress>,
) -> anyhow::Result<UpdateReport> {
    use std::sync::atomic::Ordering;
    let mut report = UpdateReport::default();
    let (s1, s2) = (diff.from_size_bytes, diff.to_size_bytes);
    if !raw && s2 > s1 {
        // The old footer page is part of the new data area: zero unless written.
        punch(file, ByteRange::new(s1, s1 + VHD_FOOTER_BYTES))?;
    }
    let new_len = file_size_of(s2, raw);
    file.set_len(new_len)?;
    progress
        .total_bytes
        .store(diff.written_bytes, Ordering::Relaxed);
    let pieces = diff.written.iter().flat_map(|r| pieces(*r));
    let to = diff.to.as_deref();
    let mut fetches = futures::stream::iter(pieces)
        .map(|piece| async move { (piece, store.read(to, piece).await) })
        .buffered(parallel.max(1));
    while let Some((piece, data)) = fetches.next().await {
        let data = data?;
        file.write_all_at(&data, piece.start)?;
        report.requests += 1;
        report.fetched_bytes += data.len() as u64;
        Progress::add(&progress.requests, 1);
        Progress::add(&progress.transferred_bytes, data.len() as u64);
        Progress::add(&progress.scanned_bytes, data.len() as u64);
    }
    drop(fetches);
    for r in &diff.cleared {
        punch(file, *r)?;
        report.punched_bytes += r.len();
    }
    if !raw {
        let footer = store
            .read(to, ByteRange::new(s2, s2 + VHD_FOOTER_BYTES))
            .await?;
        file.write_all_at(&footer, s2)?;
    }
    file.sync_all()?;
    report.file_bytes = file.metadata()?.len();
    if report.file_bytes != new_len {
        anyhow::bail!(
            "the file is {} bytes after the update, not {new_len}",
            report.file_bytes
        );
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(a: u64, b: u64) -> ByteRange {
        ByteRange::new(a, b)
    }

    #[test]
    fn range_algebra() {
        let a = normalize(vec![r(10, 20), r(0, 5), r(4, 8)]);
        assert_eq!(a, vec![r(0, 8), r(10, 20)]);
        assert_eq!(intersect(&a, &[r(6, 12)]), vec![r(6, 8), r(10, 12)]);
        assert_eq!(
            subtract(&a, &[r(2, 3), r(7, 15)]),
            vec![r(0, 2), r(3, 7), r(15, 20)]
        );
        assert_eq!(subtract(&a, &[]), a);
    }

    #[test]
    fn zeros_are_written_in_4mib_pieces() {
        let mib = 1 << 20;
        let big = r(512, 1024 * mib + 1024);
        let got: Vec<ByteRange> = pieces(big).collect();
        assert_eq!(got.len(), 257);
        assert!(got.iter().all(|p| p.len() <= MAX_PUT_PAGE_BYTES));
        assert_eq!(got[0], r(512, 4 * mib + 512));
        assert_eq!(got[256], r(1024 * mib + 512, 1024 * mib + 1024));
        assert_eq!(normalize(got), vec![big]);

        // The fallback zeroes exactly the range, whatever its size.
        let file = tempfile::tempfile().unwrap();
        file.write_all_at(&vec![7u8; (10 * mib) as usize], 0)
            .unwrap();
        write_zeros(&file, r(512, 9 * mib + 512)).unwrap();
        let mut back = vec![0u8; (10 * mib) as usize];
        file.read_exact_at(&mut back, 0).unwrap();
        assert!(back[..512].iter().all(|&b| b == 7));
        assert!(back[512..(9 * mib + 512) as usize].iter().all(|&b| b == 0));
        assert!(back[(9 * mib + 512) as usize..].iter().all(|&b| b == 7));
    }
}
