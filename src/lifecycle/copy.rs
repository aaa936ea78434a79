//! Server-side copies: `copy` (a new, independent drive from a drive, a
//! snapshot, or a SAS URL of another account), `restore` (a snapshot copied
//! back onto its drive), and snapshot pruning and deletion.
//!
//! Invariants: a copy never replaces an existing blob (`If-None-Match: *`),
//! and a copy that fails or is cancelled (Ctrl-C or SIGTERM: Abort Copy Blob) deletes
//! the half-made destination, which only it created, also when the service
//! refuses the abort (the copy finished meanwhile: the user asked for no
//! copy, and the error line says the abort was refused). A restore refuses a
//! leased (mounted) drive, holds the drive's lease while it copies, and takes
//! a safety snapshot first unless told not to. A source URL may carry a SAS
//! signature: it is never logged or printed (see [`redact`]).
//!
//! Azurite (checked with 3.x in memory, and with the official Python SDK)
//! shares page storage between a Copy Blob destination and its source
//! snapshot: a write to the copy changes the snapshot. So on the development
//! account the pages are copied by the client instead (read, Put Page);
//! everywhere else the service copies.

use std::future::Future;
use std::time::Duration;

use anyhow::{anyhow, bail};
use serde::Serialize;

use super::checks::{self, blob_err};
use crate::blob::{BlobClient, BlobPath, CopyState, CopyStatus};

/// How often a pending copy is polled.
const POLL: Duration = Duration::from_millis(500);

/// Where a copy reads from.
#[derive(Debug, Clone)]
pub enum CopySource {
    /// A drive (or one of its snapshots) of this account.
    Blob(BlobPath),
    /// A URL the service can read, e.g. another account's blob with a SAS.
    Url(String),
}

impl CopySource {
    /// The source as it may be shown: a URL without its query (the SAS).
    pub fn display(&self) -> String {
        match self {
            CopySource::Blob(p) => p.to_string(),
            CopySource::Url(u) => redact(u),
        }
    }
}

/// A URL without its query string (which may hold a SAS signature).
pub fn redact(url: &str) -> String {
    match url.split_once('?') {
        Some((base, _)) => format!("{base}?<SAS>"),
        None => url.to_string(),
    }
}

/// What a copy did.
#[derive(Debug, Clone, Serialize)]
pub struct CopyReport {
    /// The source, without any SAS.
    pub source: String,
    /// The new drive.
    pub destination: String,
    /// Its size in bytes (blob size, footer included).
    pub blob_size_bytes: u64,
}

/// Checks that `path` (a blob or snapshot of this account) is a drive.
async fn require_drive(client: &BlobClient, path: &BlobPath) -> anyhow::Result<u64> {
    let props = checks::properties(client, path).await?;
    let check = checks::check_disk(client, path, props.blob_type, props.content_length)
        .await
        .map_err(blob_err)?;
    if let Some(p) = check.problem(path) {
        bail!("{path} is not a drive: {p}");
    }
    Ok(props.content_length)
}

/// How the wait for a service-side copy ended.
#[derive(Debug)]
enum Waited {
    /// The service's last word: success, failed, or aborted by someone else.
    Ended(CopyState),
    /// Cancelled here (Ctrl-C, SIGTERM). `abort` is what Abort Copy Blob got: the
    /// service may refuse it (the copy finished meanwhile, or it never said
    /// which copy it is), and the caller deletes the destination either way.
    Cancelled {
        /// `Ok` when the service aborted the copy; else why not, as one phrase.
        abort: Result<(), String>,
    },
}

/// Waits for the copy into `dest` to finish, reporting `(copied, total)`
/// bytes to `progress`; `cancel` resolving aborts it (Abort Copy Blob).
async fn wait_copy(
    client: &BlobClient,
    dest: &BlobPath,
    mut state: CopyState,
    progress: &mut dyn FnMut(u64, u64),
    cancel: impl Future<Output = ()>,
) -> anyhow::Result<Waited> {
    tokio::pin!(cancel);
    loop {
        if let Some((done, total)) = state.progress_bytes {
            progress(done, total);
        }
        if state.status != Some(CopyStatus::Pending) {
            return Ok(Waited::Ended(state));
        }
        // A poll in flight is raced with `cancel` too: Ctrl-C must not wait
        // for a slow answer.
        let poll = async {
            tokio::time::sleep(POLL).await;
            client.copy_state(dest).await
        };
        tokio::select! {
            polled = poll => {
                state = polled.map_err(blob_err)?;
            }
            () = &mut cancel => {
                let abort = match &state.id {
                    Some(id) => match client.abort_copy(dest, id).await {
                        Ok(()) => Ok(()),
                        Err(e) => {
                            // The error line says it; the whole answer is for -vv.
                            tracing::debug!(drive = %dest, error = %e, "Abort Copy Blob was refused");
                            Err(match e.code() {
                                Some("NoPendingCopyOperation") => {
                                    "the service had no pending copy to abort (it had finished)".to_string()
                                }
                                _ => checks::explain(&e),
                            })
                        }
                    },
                    None => Err("the service gave no copy id to abort".to_string()),
                };
                return Ok(Waited::Cancelled { abort });
            }
        }
    }
}

/// True when the account is Azurite's development account, whose Copy Blob
/// leaves the copy sharing pages with its source (see the module doc).
fn copies_share_pages(client: &BlobClient) -> bool {
    client.account().name == crate::blob::account::DEV_ACCOUNT_NAME
}

/// Copies the pages of `source` into `dest` (a blob of the same size that
/// holds no pages yet), through the client.
async fn copy_pages(
    client: &BlobClient,
    source: &BlobPath,
    dest: &BlobPath,
    lease_id: Option<&str>,
) -> crate::blob::Result<()> {
    use crate::drive::{BlobPageStore, PageStore};
    use crate::units::{ByteRange, MAX_PUT_PAGE_BYTES};
    let props = client.get_properties(source).await?;
    let size = props.content_length;
    let ranges = BlobPageStore::new(client.clone(), source.clone())
        .page_ranges(ByteRange::new(0, size))
        .await?;
    for r in ranges {
        let mut at = r.start;
        while at < r.end {
            let end = r.end.min(at + MAX_PUT_PAGE_BYTES);
            let data = client
                .get_blob_range(source, ByteRange::new(at, end))
                .await?;
            client.put_pages(dest, at, data, lease_id).await?;
            at = end;
        }
    }
    // As Copy Blob does: the metadata travels too (an encrypted drive's key
    // slots live there).
    let metadata: Vec<(String, String)> = props.metadata.into_iter().collect();
    client.set_metadata(dest, &metadata, lease_id).await
}

/// Copies `source` into the new drive `dest` on the service's side.
/// `cancel` resolving (the CLI: Ctrl-C or SIGTERM) aborts the copy and deletes `dest`.
pub async fn copy(
    client: &BlobClient,
    source: &CopySource,
    dest: &BlobPath,
    progress: &mut dyn FnMut(u64, u64),
    cancel: impl Future<Output = ()>,
) -> anyhow::Result<CopyReport> {
    let url = match source {
        CopySource::Blob(p) => {
            let size = require_drive(client, p).await?;
            if copies_share_pages(client) {
                return copy_by_client(client, p, dest, size, cancel).await;
            }
            client.source_url(p)
        }
        CopySource::Url(u) => u.clone(),
    };
    let started = client.start_copy(dest, &url, None).await.map_err(|e| {
        if e.is_already_exists() || e.code() == Some("ConditionNotMet") || e.status == Some(412) {
            anyhow!(exists_line(dest))
        } else if matches!(e.code(), Some("CannotVerifyCopySource" | "BlobNotFound")) {
            // About the source (the destination is new by design); the
            // general explanation would say the destination does not exist.
            anyhow!(
                "the service cannot read the copy source {} ({}): check that it exists, and that its SAS allows reading and has not expired",
                source.display(),
                e.code().unwrap_or_default()
            )
        } else {
            blob_err(e)
        }
    })?;
    let waited = wait_copy(client, dest, started, progress, cancel).await;
    let what = match &waited {
        Ok(Waited::Ended(s)) if s.status == Some(CopyStatus::Success) => None,
        Ok(Waited::Cancelled { abort: Ok(()) }) => Some("was aborted".to_string()),
        Ok(Waited::Cancelled { abort: Err(why) }) => Some(format!(
            "was aborted, though Abort Copy Blob was refused: {why}"
        )),
        Ok(Waited::Ended(s)) => Some(format!(
            "failed: the service {} it ({})",
            match s.status {
                Some(CopyStatus::Aborted) => "aborted",
                _ => "could not copy",
            },
            s.description.as_deref().unwrap_or("no reason given")
        )),
        Err(e) => Some(format!("failed: {e:#}")),
    };
    if let Some(what) = what {
        // Ours, half made (or whole, when the abort came too late): never
        // leave it looking like a drive nobody asked for.
        let removed = client.delete_blob(dest, false, None).await;
        let tail = match removed {
            Ok(()) => format!("{dest} was deleted again"),
            Err(e) => format!("{dest} could not be deleted ({}); delete it with 'blobdrive delete {dest} --force'", checks::explain(&e)),
        };
        bail!("copy of {} into {dest} {what}; {tail}", source.display());
    }
    let blob_size_bytes = match require_drive(client, dest).await {
        Ok(n) => n,
        Err(e) => {
            let _ = client.delete_blob(dest, false, None).await;
            bail!("{e:#}; the copy {dest} was deleted again");
        }
    };
    Ok(CopyReport {
        source: source.display(),
        destination: dest.to_string(),
        blob_size_bytes,
    })
}

fn exists_line(dest: &BlobPath) -> String {
    format!(
        "{dest} already exists; blobdrive copy never replaces a blob: pick another name, or delete it first with 'blobdrive delete {dest}'"
    )
}

/// [`copy`] through the client: a new blob (never replacing one), the
/// source's pages written into it; deleted again on failure or `cancel`.
async fn copy_by_client(
    client: &BlobClient,
    source: &BlobPath,
    dest: &BlobPath,
    size: u64,
    cancel: impl Future<Output = ()>,
) -> anyhow::Result<CopyReport> {
    client.create_page_blob(dest, size).await.map_err(|e| {
        if e.is_already_exists() {
            anyhow!(exists_line(dest))
        } else {
            blob_err(e)
        }
    })?;
    let outcome = tokio::select! {
        r = copy_pages(client, source, dest, None) => r.map_err(blob_err),
        () = cancel => Err(anyhow!("the copy was aborted")),
    };
    if let Err(e) = outcome {
        let _ = client.delete_blob(dest, false, None).await;
        bail!("copy of {source} into {dest} failed: {e:#}; {dest} was deleted again");
    }
    Ok(CopyReport {
        source: source.to_string(),
        destination: dest.to_string(),
        blob_size_bytes: size,
    })
}

/// What a restore did.
#[derive(Debug, Clone, Serialize)]
pub struct RestoreReport {
    /// The drive put back.
    pub drive: String,
    /// The snapshot it now matches.
    pub snapshot: String,
    /// The snapshot of the state before the restore (undo with it), unless skipped.
    pub safety_snapshot: Option<String>,
}

/// Puts the drive `path` back to its snapshot `time`.
pub async fn restore(
    client: &BlobClient,
    path: &BlobPath,
    time: &str,
    safety_snapshot: bool,
) -> anyhow::Result<RestoreReport> {
    let props = checks::properties(client, path).await?;
    if checks::is_leased(props.lease_state) {
        bail!(
            "drive {path} is mounted (leased); unmount it before restoring it (a restore replaces all its contents), \
             or run 'blobdrive break-lease {path}' if that host is gone"
        );
    }
    let snap = path.clone().with_snapshot(Some(time));
    require_drive(client, &snap).await?;
    let lease_id = uuid::Uuid::new_v4().to_string();
    client
        .acquire_lease(path, &lease_id, None)
        .await
        .map_err(blob_err)?;
    let result = async {
        let safety = if safety_snapshot {
            Some(client.snapshot(path).await.map_err(blob_err)?)
        } else {
            None
        };
        if copies_share_pages(client) {
            let size = client
                .get_properties(&snap)
                .await
                .map_err(blob_err)?
                .content_length;
            let lid = Some(lease_id.as_str());
            client.resize(path, size, lid).await.map_err(blob_err)?;
            client
                .clear_pages(path, crate::units::ByteRange::new(0, size), lid)
                .await
                .map_err(blob_err)?;
            copy_pages(client, &snap, path, lid)
                .await
                .map_err(blob_err)?;
            return Ok(RestoreReport {
                drive: path.to_string(),
                snapshot: time.to_string(),
                safety_snapshot: safety,
            });
        }
        let url = client.source_url(&snap);
        let started = client
            .start_copy(path, &url, Some(&lease_id))
            .await
            .map_err(blob_err)?;
        // A restore is not cancelled half way: the drive would hold a mix.
        let state = wait_copy(
            client,
            path,
            started,
            &mut |_, _| {},
            std::future::pending(),
        )
        .await?;
        let description = match state {
            Waited::Ended(s) if s.status == Some(CopyStatus::Success) => None,
            Waited::Ended(s) => Some(s.description),
            Waited::Cancelled { .. } => Some(None),
        };
        if let Some(description) = description {
            bail!(
                "restore of {path} from {time} failed ({}){}",
                description.as_deref().unwrap_or("no reason given"),
                match &safety {
                    Some(t) => format!("; the state before it is snapshot {t}"),
                    None => String::new(),
                }
            );
        }
        Ok(RestoreReport {
            drive: path.to_string(),
            snapshot: time.to_string(),
            safety_snapshot: safety,
        })
    }
    .await;
    if let Err(e) = client.release_lease(path, &lease_id).await {
        tracing::warn!(drive = %path, error = %e, "could not release the restore lease");
    }
    result
}

/// Deletes all but the newest `keep` snapshots of `path`; returns the
/// times deleted, oldest first.
pub async fn prune_snapshots(
    client: &BlobClient,
    path: &BlobPath,
    keep: usize,
) -> anyhow::Result<Vec<String>> {
    let times = checks::snapshots_of(client, path).await.map_err(blob_err)?;
    let doomed: Vec<String> = times[..times.len().saturating_sub(keep)].to_vec();
    for t in &doomed {
        client
            .delete_blob(&path.clone().with_snapshot(Some(t)), false, None)
            .await
            .map_err(blob_err)?;
        tracing::info!(drive = %path, snapshot = %t, "snapshot deleted");
    }
    Ok(doomed)
}

/// Deletes the snapshot `time` of `path`, after checking it is one.
pub async fn delete_snapshot(
    client: &BlobClient,
    path: &BlobPath,
    time: &str,
) -> anyhow::Result<()> {
    let times = checks::snapshots_of(client, path).await.map_err(blob_err)?;
    if !times.iter().any(|t| t == time) {
        bail!("{time} is not a snapshot of {path}; 'blobdrive info {path}' lists its snapshots");
    }
    client
        .delete_blob(&path.clone().with_snapshot(Some(time)), false, None)
        .await
        .map_err(blob_err)
}
