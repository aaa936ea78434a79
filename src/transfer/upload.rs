//! `upload`: a local image into a page blob, sending only the pages that
//! hold data, many Put Page requests at once, resumable.
//!
//! The pipeline: a blocking thread scans the image (holes of the file and
//! unallocated blocks of a dynamic VHD skipped unread, zero pages dropped,
//! see `scan.rs`) and hands runs of data pages, at most 4 MiB each, through
//! a bounded channel to the coordinator, which keeps up to `parallel` Put
//! Page requests in flight. Memory is bounded by the
//! channel and the in-flight requests (about 2 × parallel × 4 MiB).
//!
//! Resume protocol. The image is cut into chunks (4 MiB, larger for images
//! over 4 GiB). A chunk is recorded as done, with its content digest, in the
//! blob's metadata (`journal.rs`) only after all its Put Pages succeeded; the
//! record is written in batches (every 64 MiB sent or 5 s) and at the end of
//! a run, successful or not. `--resume` reads the record back, lists the
//! blob's page ranges, and for every recorded chunk compares three digests:
//! the recorded one, the file's and the blob's (read back); a chunk counts as
//! present only when all three agree. Every other chunk is sent again, after
//! a Clear Pages of it when the blob holds any page in it (a partly written
//! or corrupted chunk must not keep stray pages). So a kill at any instant is
//! safe: at worst, chunks sent but not yet recorded are sent twice.
//!
//! The VHD footer is written last, after every chunk is done, and the record
//! is removed after it: until then the blob has no footer and is not a valid
//! drive (`mount` and `info` say so). An existing blob is cleared of its
//! footer before anything else is written to it.
//!
//! Locking. The whole upload holds a 60-second lease, renewed every 20 s,
//! and every write carries it: two uploads cannot interleave and a mount
//! cannot attach. A fixed-length lease (not an infinite one) means a killed
//! upload's lock lapses on its own; `--resume` waits for that.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use super::image::{self, SourceImage};
use super::journal::{chunk_bytes_for, Identity, Journal};
use super::progress::Progress;
use super::scan::{ChunkAction, ChunkDigest, ChunkGrid, Scan, ScanEvent, BLOCK_BYTES};
use super::{io_error, Error, ImageKind, Result, DEFAULT_PARALLEL, MAX_PARALLEL};
use crate::blob::{BlobClient, BlobPath, BlobType, LeaseDuration};
use crate::drive::{BlobPageStore, PageStore};
use crate::units::{ByteRange, VHD_FOOTER_BYTES};

/// Default lease length of an upload, in seconds.
pub const DEFAULT_LEASE_SECS: u32 = 60;

/// How an upload runs.
#[derive(Debug, Clone)]
pub struct UploadOptions {
    /// Replace an existing blob (never a leased one).
    pub overwrite: bool,
    /// Continue an interrupted upload to the same blob.
    pub resume: bool,
    /// Round a raw image up to whole MiB with zeros.
    pub pad: bool,
    /// Requests in flight (1 to [`MAX_PARALLEL`]).
    pub parallel: usize,
    /// Lease length in seconds (15 to 60); renewed every third of it.
    pub lease_secs: u32,
    /// Record done chunks after this many bytes sent (and every 5 s).
    pub record_every_bytes: u64,
    /// Test hook: stop reading the image after this many chunks and end
    /// the run (as if interrupted) once they are sent, so exactly these
    /// chunks are recorded.
    pub stop_after_chunks: Option<u64>,
    /// Set to stop the upload (Ctrl-C): what is done is recorded, the lease
    /// released, and [`Error::Interrupted`] returned.
    pub stop: Option<Arc<AtomicBool>>,
    /// Encrypt the image with this data key, whose key slots go into the
    /// blob's metadata (kept through the run and after it). Not with
    /// `resume`: a resume compares the blob's bytes with the file's.
    pub encrypt: Option<(Arc<crate::crypt::DataKey>, crate::crypt::KeySlots)>,
}

impl Default for UploadOptions {
    fn default() -> Self {
        UploadOptions {
            overwrite: false,
            resume: false,
            pad: false,
            parallel: DEFAULT_PARALLEL,
            lease_secs: DEFAULT_LEASE_SECS,
            record_every_bytes: 64 << 20,
            stop_after_chunks: None,
            stop: None,
            encrypt: None,
        }
    }
}

/// What an upload did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct UploadReport {
    /// True when the blob is complete (footer written); false when stopped
    /// by the test hook.
    pub complete: bool,
    /// What the source was.
    pub kind: Option<ImageKind>,
    /// Bytes of the disk.
    pub data_bytes: u64,
    /// Bytes of the blob (disk + footer).
    pub blob_bytes: u64,
    /// Bytes of the image this run went through (read, or skipped as holes).
    pub scanned_bytes: u64,
    /// Bytes sent in Put Page requests (footer included).
    pub sent_bytes: u64,
    /// Bytes read but found to be zero pages, not sent.
    pub zero_bytes: u64,
    /// Bytes in holes of the file, not read.
    pub hole_bytes: u64,
    /// Bytes already in the blob and verified (resume).
    pub resumed_bytes: u64,
    /// Bytes checked against the blob before resuming.
    pub verified_bytes: u64,
    /// Chunks of the image.
    pub chunks: u64,
    /// Chunks recorded as done in this run.
    pub chunks_done: u64,
    /// Recorded chunks whose content in the blob did not match (sent again).
    pub chunks_mismatched: u64,
    /// Data requests (Put Page, Clear Pages, Get Blob).
    pub requests: u64,
    /// Wall time in seconds.
    pub seconds: f64,
}

impl UploadReport {
    /// Bytes sent per second.
    pub fn rate(&self) -> f64 {
        if self.seconds > 0.0 {
            self.sent_bytes as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// Upload `source` into `blob`, showing progress in `progress`.
pub async fn upload(
    client: &BlobClient,
    source: &Path,
    blob: &BlobPath,
    opts: &UploadOptions,
    progress: &Arc<Progress>,
) -> Result<UploadReport> {
    let started = Instant::now();
    if blob.snapshot.is_some() {
        return Err(Error::NotADrive {
            blob: blob.to_string(),
            reason: "a snapshot is read-only; upload to the blob itself".into(),
        });
    }
    let file = File::open(source).map_err(io_error("open", source))?;
    let image = image::inspect(source, &file, opts.pad)?;
    progress
        .total_bytes
        .store(image.data_len, Ordering::Relaxed);
    let identity = Identity {
        data_len: image.data_len,
        chunk_bytes: chunk_bytes_for(image.data_len),
        source_len: image.file_len,
        kind: kind_name(image.kind).to_string(),
    };
    let mut up = Uploader {
        client: client.clone(),
        blob: blob.clone(),
        opts: opts.clone(),
        grid: identity.grid(),
        journal: Journal::new(identity),
        lease_id: String::new(),
        progress: progress.clone(),
        report: UploadReport {
            kind: Some(image.kind),
            data_bytes: image.data_len,
            blob_bytes: image.blob_size(),
            chunks: 0,
            ..Default::default()
        },
    };
    up.report.chunks = up.grid.count();
    let fresh = up.claim(&image).await?;
    let keeper = keep_lease(
        client.clone(),
        blob.clone(),
        up.lease_id.clone(),
        opts.lease_secs,
    );
    let result = up.run(&file, &image, fresh).await;
    keeper.abort();
    let released = client.release_lease(blob, &up.lease_id).await;
    if let Err(e) = &released {
        warn!(blob = %blob, error = %e, "could not release the upload's lease; it lapses within {} s", opts.lease_secs);
    }
    let mut report = result?;
    report.seconds = started.elapsed().as_secs_f64();
    report.scanned_bytes = Progress::get(&progress.scanned_bytes);
    report.sent_bytes = Progress::get(&progress.transferred_bytes);
    report.zero_bytes = Progress::get(&progress.zero_bytes);
    report.hole_bytes = Progress::get(&progress.hole_bytes);
    report.verified_bytes = Progress::get(&progress.verified_bytes);
    report.requests = Progress::get(&progress.requests);
    Ok(report)
}

fn kind_name(kind: ImageKind) -> &'static str {
    match kind {
        ImageKind::Raw => "raw",
        ImageKind::RawPadded => "raw-padded",
        ImageKind::FixedVhd => "fixed-vhd",
        ImageKind::DynamicVhd => "dynamic-vhd",
    }
}

/// Renew the lease every third of its length until aborted. A failed
/// renewal is only logged: the next write then fails with the lease error,
/// which stops the upload with its record intact.
fn keep_lease(
    client: BlobClient,
    blob: BlobPath,
    lease_id: String,
    secs: u32,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let every = Duration::from_secs(u64::from(secs.max(3)) / 3);
        loop {
            tokio::time::sleep(every).await;
            if let Err(e) = client.renew_lease(&blob, &lease_id).await {
                warn!(blob = %blob, error = %e, "could not renew the upload's lease");
            }
        }
    })
}

/// Per chunk, while its Put Pages are in flight.
#[derive(Debug, Default)]
struct InFlight {
    outstanding: u32,
    digest: Option<u32>,
}

struct Uploader {
    client: BlobClient,
    blob: BlobPath,
    opts: UploadOptions,
    grid: ChunkGrid,
    journal: Journal,
    lease_id: String,
    progress: Arc<Progress>,
    report: UploadReport,
}

impl Uploader {
    fn name(&self) -> String {
        self.blob.to_string()
    }

    /// Create the blob, or take over the existing one as the options allow,
    /// and acquire the lease. Returns true for a newly created blob.
    async fn claim(&mut self, image: &SourceImage) -> Result<bool> {
        let size = image.blob_size();
        let mut created = self.client.create_page_blob(&self.blob, size).await;
        if created
            .as_ref()
            .is_err_and(|e| e.code() == Some("ContainerNotFound"))
        {
            // As `create` does: make the container, then the blob.
            self.client.create_container(&self.blob.container).await?;
            info!(container = %self.blob.container, "created container");
            created = self.client.create_page_blob(&self.blob, size).await;
        }
        match created {
            Ok(()) => {
                self.acquire(false).await?;
                self.record().await?;
                return Ok(true);
            }
            Err(e) if e.is_already_exists() => {}
            Err(e) => return Err(e.into()),
        }
        let props = self.client.get_properties(&self.blob).await?;
        if props.blob_type != Some(BlobType::PageBlob) {
            return Err(Error::NotADrive {
                blob: self.name(),
                reason: "exists and is not a page blob; delete it first".into(),
            });
        }
        if self.opts.resume {
            let found = match Journal::from_metadata(&props.metadata) {
                None if self.opts.overwrite => None,
                None => return Err(self.cannot_resume(
                    "it holds no interrupted upload (it is complete, or was not written by 'blobdrive upload'); use --overwrite to replace it",
                )),
                Some(Err(reason)) if !self.opts.overwrite => return Err(self.cannot_resume(&reason)),
                Some(Err(_)) => None,
                Some(Ok(j)) => Some(j),
            };
            if let Some(j) = found {
                if j.identity != self.journal.identity || props.content_length != size {
                    if !self.opts.overwrite {
                        return Err(self.cannot_resume(&format!(
                            "the interrupted upload was of a {}, this is a {}; use --overwrite to start over",
                            j.identity.describe(),
                            self.journal.identity.describe()
                        )));
                    }
                } else {
                    let wait = props.lease_duration == Some(LeaseDuration::Fixed);
                    self.acquire(wait).await?;
                    // Read the record again: its writer may have gone on
                    // until its lease lapsed.
                    let props = self.client.get_properties(&self.blob).await?;
                    if let Some(Ok(j)) = Journal::from_metadata(&props.metadata) {
                        if j.identity == self.journal.identity {
                            self.journal = j;
                        }
                    }
                    self.clear_footer(size).await?;
                    return Ok(false);
                }
            }
        } else if !self.opts.overwrite {
            return Err(Error::BlobExists { blob: self.name() });
        }
        // Overwrite: lock, mark as an upload in progress, drop the footer,
        // then take the new size; old pages are cleared chunk by chunk.
        self.acquire(false).await?;
        self.record().await?;
        if props.content_length >= VHD_FOOTER_BYTES {
            self.clear_footer(props.content_length).await?;
        }
        if props.content_length != size {
            self.client
                .resize(&self.blob, size, Some(&self.lease_id))
                .await?;
        }
        Ok(false)
    }

    fn cannot_resume(&self, reason: &str) -> Error {
        Error::CannotResume {
            blob: self.name(),
            reason: reason.to_string(),
        }
    }

    /// Acquire the lease; with `wait`, wait up to a lease length for a
    /// fixed-length lease (a killed upload's) to lapse.
    async fn acquire(&mut self, wait: bool) -> Result<()> {
        let id = uuid::Uuid::new_v4().to_string();
        let secs = self.opts.lease_secs;
        let deadline = Instant::now() + Duration::from_secs(u64::from(secs.max(60)) + 5);
        let mut told = false;
        loop {
            match self.client.acquire_lease(&self.blob, &id, Some(secs)).await {
                Ok(got) => {
                    self.lease_id = got;
                    return Ok(());
                }
                Err(e) if e.is_lease_conflict() && wait && Instant::now() < deadline => {
                    if !told {
                        info!(blob = %self.blob, "blob is leased, likely by the interrupted upload; waiting for its lease to lapse");
                        told = true;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(e) if e.is_lease_conflict() => return Err(Error::Leased { blob: self.name() }),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Write the record to the blob's metadata.
    async fn record(&self) -> Result<()> {
        self.client
            .set_metadata(
                &self.blob,
                &self.metadata(self.journal.to_metadata()),
                Some(&self.lease_id),
            )
            .await?;
        Ok(())
    }

    /// `entries` plus the key slots of an encrypted upload.
    fn metadata(&self, mut entries: Vec<(String, String)>) -> Vec<(String, String)> {
        if let Some((_, slots)) = &self.opts.encrypt {
            let mut md = std::collections::BTreeMap::new();
            slots.apply_to(&mut md);
            entries.extend(md);
        }
        entries
    }

    /// Clear the last page of a blob of `blob_size` bytes (where a footer lives).
    async fn clear_footer(&self, blob_size: u64) -> Result<()> {
        let r = ByteRange::new(blob_size - VHD_FOOTER_BYTES, blob_size);
        self.client
            .clear_pages(&self.blob, r, Some(&self.lease_id))
            .await?;
        Progress::add(&self.progress.requests, 1);
        Ok(())
    }

    /// Verify, send what is missing, write the footer, drop the record.
    async fn run(&mut self, file: &File, image: &SourceImage, fresh: bool) -> Result<UploadReport> {
        // Which chunks of the blob hold pages now (none when just created).
        let mut has_pages = vec![false; self.grid.count() as usize];
        let mut ranges = Vec::new();
        if !fresh {
            let store = BlobPageStore::new(self.client.clone(), self.blob.clone());
            ranges = store.page_ranges(ByteRange::new(0, image.data_len)).await?;
            for r in &ranges {
                for c in self.grid.chunk_of(r.start)..=self.grid.chunk_of(r.end - 1) {
                    has_pages[c as usize] = true;
                }
            }
        }
        if self.journal.done_count() > 0 {
            self.verify(file, image, &ranges).await?;
        }
        let resumed: u64 = (0..self.grid.count())
            .filter(|c| self.journal.done[*c as usize].is_some())
            .map(|c| self.grid.range(c).len())
            .sum();
        self.report.resumed_bytes = resumed;
        Progress::add(&self.progress.scanned_bytes, resumed);
        self.send(file, image, has_pages).await?;
        if self.report.complete {
            self.client
                .put_pages(
                    &self.blob,
                    image.data_len,
                    Bytes::copy_from_slice(&image.footer),
                    Some(&self.lease_id),
                )
                .await?;
            Progress::add(&self.progress.requests, 1);
            Progress::add(&self.progress.transferred_bytes, VHD_FOOTER_BYTES);
            self.client
                .set_metadata(&self.blob, &self.metadata(Vec::new()), Some(&self.lease_id))
                .await?;
        }
        Ok(std::mem::take(&mut self.report))
    }

    /// Check every recorded chunk: recorded digest, file digest and blob
    /// digest must agree; chunks that do not are un-recorded (sent again).
    async fn verify(
        &mut self,
        file: &File,
        image: &SourceImage,
        ranges: &[ByteRange],
    ) -> Result<()> {
        let recorded: Vec<u64> = (0..self.grid.count())
            .filter(|c| self.journal.done[*c as usize].is_some())
            .collect();
        // The file's digests, on a blocking thread.
        let file_digests = {
            let disk = image.reader(file, Path::new("image"))?;
            let grid = self.grid;
            let progress = self.progress.clone();
            let wanted: HashSet<u64> = recorded.iter().copied().collect();
            tokio::task::spawn_blocking(move || -> std::io::Result<HashMap<u64, u32>> {
                let mut out = HashMap::new();
                Scan {
                    disk: &disk,
                    grid,
                    examined: &progress.verified_bytes,
                }
                .run(
                    |c| {
                        if wanted.contains(&c) {
                            ChunkAction::Digest
                        } else {
                            ChunkAction::Skip
                        }
                    },
                    |ev| {
                        if let ScanEvent::ChunkEnd { chunk, digest, .. } = ev {
                            out.insert(chunk, digest);
                        }
                        true
                    },
                )?;
                Ok(out)
            })
        };
        // The blob's digests, read back in parallel.
        let blob_digests: Vec<Result<(u64, u32)>> = futures::stream::iter(recorded.iter().copied())
            .map(|c| self.blob_digest(c, ranges))
            .buffer_unordered(self.opts.parallel.clamp(1, MAX_PARALLEL))
            .collect()
            .await;
        let file_digests = file_digests
            .await
            .map_err(|e| Error::Io {
                what: "scan",
                path: "image".into(),
                error: std::io::Error::other(e.to_string()),
            })?
            .map_err(|e| Error::Io {
                what: "read",
                path: "image".into(),
                error: e,
            })?;
        for r in blob_digests {
            let (chunk, blob_digest) = r?;
            let want = self.journal.done[chunk as usize];
            let file_digest = file_digests.get(&chunk).copied();
            if want != Some(blob_digest) || file_digest != want {
                let range = self.grid.range(chunk);
                warn!(
                    blob = %self.blob, chunk, offset = range.start,
                    recorded = ?want, in_blob = blob_digest, in_file = ?file_digest,
                    "chunk does not match; sending it again"
                );
                self.journal.done[chunk as usize] = None;
                self.report.chunks_mismatched += 1;
            }
        }
        Ok(())
    }

    /// Digest of chunk `c` as stored in the blob.
    async fn blob_digest(&self, c: u64, ranges: &[ByteRange]) -> Result<(u64, u32)> {
        let chunk = self.grid.range(c);
        let mut digest = ChunkDigest::new();
        for r in ranges
            .iter()
            .filter(|r| r.end > chunk.start && r.start < chunk.end)
        {
            let mut at = r.start.max(chunk.start);
            let end = r.end.min(chunk.end);
            while at < end {
                let piece = ByteRange::new(at, (at + BLOCK_BYTES).min(end));
                let data = self.client.get_blob_range(&self.blob, piece).await?;
                Progress::add(&self.progress.requests, 1);
                digest.add(piece.start, &data);
                at = piece.end;
            }
        }
        Ok((c, digest.value()))
    }

    /// Scan and send every chunk not recorded as done.
    async fn send(&mut self, file: &File, image: &SourceImage, has_pages: Vec<bool>) -> Result<()> {
        let parallel = self.opts.parallel.clamp(1, MAX_PARALLEL);
        let todo: Vec<bool> = self.journal.done.iter().map(Option::is_none).collect();
        let (tx, mut rx) = mpsc::channel::<ScanEvent>(parallel);
        let scanner = {
            let disk = image.reader(file, Path::new("image"))?;
            let grid = self.grid;
            let progress = self.progress.clone();
            let todo = todo.clone();
            tokio::task::spawn_blocking(move || {
                Scan {
                    disk: &disk,
                    grid,
                    examined: &progress.scanned_bytes,
                }
                .run(
                    |c| {
                        if todo[c as usize] {
                            ChunkAction::Send
                        } else {
                            ChunkAction::Skip
                        }
                    },
                    |ev| tx.blocking_send(ev).is_ok(),
                )
            })
        };
        let sem = Arc::new(Semaphore::new(parallel));
        let mut puts: JoinSet<(u64, u64, crate::blob::Result<()>)> = JoinSet::new();
        let mut inflight: HashMap<u64, InFlight> = HashMap::new();
        let mut failed: HashSet<u64> = HashSet::new();
        let mut cleared = vec![false; has_pages.len()];
        let mut failure: Option<Error> = None;
        let mut stopping = false;
        let mut scan_open = true;
        let mut done_this_run = 0u64;
        let mut scanned_chunks = 0u64;
        let mut unrecorded = 0u64;
        let mut sent_since_record = 0u64;
        let mut last_record = Instant::now();
        loop {
            if (stopping || !scan_open) && puts.is_empty() {
                break;
            }
            if self
                .opts
                .stop
                .as_ref()
                .is_some_and(|s| s.load(Ordering::Relaxed))
                && !stopping
            {
                stopping = true;
                failure.get_or_insert(Error::Interrupted);
            }
            let mut commit: Option<u64> = None;
            tokio::select! {
                ev = rx.recv(), if scan_open && !stopping => match ev {
                    None => scan_open = false,
                    Some(ScanEvent::Run { chunk, offset_bytes, data }) => {
                        if let Err(e) = self.clear_once(chunk, &has_pages, &mut cleared).await {
                            failure.get_or_insert(e);
                            stopping = true;
                            continue;
                        }
                        let permit = sem.clone().acquire_owned().await.expect("the semaphore is never closed");
                        inflight.entry(chunk).or_default().outstanding += 1;
                        Progress::add(&self.progress.requests, 1);
                        let (client, blob, lease) = (self.client.clone(), self.blob.clone(), self.lease_id.clone());
                        let key = self.opts.encrypt.as_ref().map(|(k, _)| k.clone());
                        puts.spawn(async move {
                            let _permit = permit;
                            let data = match key {
                                Some(key) => {
                                    let mut buf = data.to_vec();
                                    key.encrypt_pages(offset_bytes / crate::units::PAGE_SIZE, &mut buf);
                                    Bytes::from(buf)
                                }
                                None => data,
                            };
                            let n = data.len() as u64;
                            (chunk, n, client.put_pages(&blob, offset_bytes, data, Some(&lease)).await)
                        });
                    }
                    Some(ScanEvent::ChunkEnd { chunk, digest, hole_bytes, zero_bytes }) => {
                        if let Err(e) = self.clear_once(chunk, &has_pages, &mut cleared).await {
                            failure.get_or_insert(e);
                            stopping = true;
                            continue;
                        }
                        Progress::add(&self.progress.hole_bytes, hole_bytes);
                        Progress::add(&self.progress.zero_bytes, zero_bytes);
                        let f = inflight.entry(chunk).or_default();
                        f.digest = Some(digest);
                        if f.outstanding == 0 {
                            commit = Some(chunk);
                        }
                        scanned_chunks += 1;
                        if self.opts.stop_after_chunks.is_some_and(|n| scanned_chunks >= n) {
                            stopping = true;
                        }
                    }
                },
                joined = puts.join_next(), if !puts.is_empty() => {
                    let Some(joined) = joined else { continue };
                    let (chunk, n, outcome) = joined.expect("a Put Page task never panics");
                    match outcome {
                        Ok(()) => {
                            Progress::add(&self.progress.transferred_bytes, n);
                            sent_since_record += n;
                            if let Some(f) = inflight.get_mut(&chunk) {
                                f.outstanding -= 1;
                                if f.outstanding == 0 && f.digest.is_some() && !failed.contains(&chunk) {
                                    commit = Some(chunk);
                                }
                            }
                        }
                        Err(e) => {
                            debug!(chunk, error = %e, "put page failed");
                            failed.insert(chunk);
                            inflight.remove(&chunk);
                            failure.get_or_insert(e.into());
                            stopping = true;
                        }
                    }
                }
            }
            if let Some(chunk) = commit {
                let f = inflight
                    .remove(&chunk)
                    .expect("a committed chunk is in flight");
                self.journal.done[chunk as usize] = f.digest;
                done_this_run += 1;
                unrecorded += 1;
            }
            let due = sent_since_record >= self.opts.record_every_bytes
                || last_record.elapsed() >= Duration::from_secs(5);
            if unrecorded > 0 && due && !stopping {
                if let Err(e) = self.record().await {
                    failure.get_or_insert(e);
                    stopping = true;
                }
                unrecorded = 0;
                sent_since_record = 0;
                last_record = Instant::now();
            }
        }
        drop(rx);
        let scanned = scanner.await;
        self.report.chunks_done = done_this_run;
        if failure.is_none() {
            match scanned {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => failure = Some(io_error("read", Path::new("image"))(e)),
                Err(e) => {
                    failure = Some(io_error("scan", Path::new("image"))(std::io::Error::other(
                        e.to_string(),
                    )))
                }
            }
        }
        // Record what is done, whatever happened (a lost lease makes this
        // fail too; the previous record then stands, which is still true).
        if unrecorded > 0 || failure.is_some() || stopping {
            if let Err(e) = self.record().await {
                warn!(blob = %self.blob, error = %e, "could not record the upload's progress");
            }
        }
        if let Some(cause) = failure {
            if matches!(cause, Error::Interrupted) {
                return Err(cause);
            }
            return Err(Error::Incomplete {
                blob: self.name(),
                done_chunks: self.journal.done_count(),
                chunks: self.grid.count(),
                cause: Box::new(cause),
            });
        }
        self.report.complete = !stopping && self.journal.complete();
        if !stopping && !self.journal.complete() {
            return Err(Error::Incomplete {
                blob: self.name(),
                done_chunks: self.journal.done_count(),
                chunks: self.grid.count(),
                cause: Box::new(Error::NotADrive {
                    blob: self.name(),
                    reason: "some chunks were not sent (internal error)".into(),
                }),
            });
        }
        Ok(())
    }

    /// Clear chunk `c` once, before its first write, when the blob holds
    /// pages in it (from an older blob or an interrupted run).
    async fn clear_once(&self, c: u64, has_pages: &[bool], cleared: &mut [bool]) -> Result<()> {
        let i = c as usize;
        if has_pages[i] && !cleared[i] {
            self.client
                .clear_pages(&self.blob, self.grid.range(c), Some(&self.lease_id))
                .await?;
            Progress::add(&self.progress.requests, 1);
            cleared[i] = true;
        }
        Ok(())
    }
}
