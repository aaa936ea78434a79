//! Server-side copies: `copy` (a new, independent drive from a drive, a
//! snapshot, or a SAS URL of another account), `restore` (a snapshot copied
//! back onto its drive), and snapshot pruning and deletion.
//!
//! Invariants: a copy never replaces an existing blob (`If-None-Match: *`),
//! and a copy that fails or is cancelled (Ctrl-C or SIGTERM: Abort Copy Blob) deletes
//! the half-made destination, which only it created, also when the service
//! refuses the abort (the copy finished meanwhile: the user asked for no
//! copy, and the error line says the abort was refused). A drive in use (its
//! lease held) is copied from a snapshot taken for the copy, never from the
//! live blob: frozen and flushed first when this host has it attached
//! read-write (`daemon::freeze`, what `snapshot` does), else as a crash
//! would leave it, which the report says; that snapshot is deleted once
//! the copy has ended. A restore refuses a leased (mounted) drive, holds a
//! lease of its own while it copies (`blob::RenewedLease`: renewed,
//! released at the end and when interrupted, left to expire only while the
//! service may still be copying), and takes a safety snapshot first unless
//! told not to; every failure line after it names it. A source URL may carry a SAS
//! signature: it is never logged or printed (see [`redact`]).
//!
//! The wait for a service-side copy polls its state; a poll that fails is
//! tried again until the polls have failed for [`POLL_FAILURES_FOR`] times
//! the client's retry budget in a row (10 minutes by default): the copy goes
//! on at the service whether or not we hear about it.
//!
//! Azurite (checked with 3.x in memory, and with the official Python SDK)
//! shares page storage between a Copy Blob destination and its source
//! snapshot: a write to the copy changes the snapshot. So on the development
//! account the pages are copied by the client instead (read, Put Page);
//! everywhere else the service copies (in tests also on Azurite, with
//! [`SERVICE_COPY_ENV`]).

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use serde::Serialize;

use crate::blob::{BlobClient, BlobPath, CopyState, CopyStatus};
use crate::provision::checks::{self, blob_err, release_operation_lease, OPERATION_LEASE_SECS};

/// How often a pending copy is polled.
const POLL: Duration = Duration::from_millis(500);

/// How long the polls of a pending copy may fail in a row before the wait
/// gives up, in multiples of the client's retry budget (each failed poll has
/// spent one budget on retries already).
pub const POLL_FAILURES_FOR: u32 = 5;

/// Test hook: set to `1`, copies and restores on the development account
/// use Copy Blob as they do on the service (Azurite's copies then share
/// pages with their source, see the module doc). For the tests of the wait
/// for a service-side copy only.
pub const SERVICE_COPY_ENV: &str = "BLOBDRIVE_TEST_SERVICE_COPY";

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
    /// What state of the source the copy holds.
    pub consistency: Consistency,
    /// The snapshot of the source this copy took and copied from (a drive
    /// in use), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_snapshot: Option<String>,
    /// True when that snapshot was deleted again after the copy.
    pub source_snapshot_deleted: bool,
}

/// What state of its source a copy holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Consistency {
    /// The source was at rest: a snapshot, a drive nobody had leased, or a
    /// URL (which blobdrive cannot look into).
    AtRest,
    /// A drive attached read-write on this host, copied from a snapshot
    /// taken with its filesystem frozen and the daemon flushed: every write
    /// made before the copy is in it, and the filesystem is clean.
    Frozen,
    /// A drive leased elsewhere (another host, a namespace mount), copied
    /// from a snapshot of the blob as it was: what a crash at that moment
    /// would leave (data still in that host's memory is not in it).
    CrashConsistent,
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
    /// Cancelled here (Ctrl-C, SIGTERM): what Abort Copy Blob got. The
    /// service may refuse it (the copy finished meanwhile, or it never said
    /// which copy it is); `copy` deletes the destination either way.
    Cancelled(Abort),
    /// The polls failed for the whole budget, or in a way no retry cures:
    /// the copy may still be pending. Why, as one phrase after "the copy's".
    Unknown(String),
}

/// What Abort Copy Blob did.
#[derive(Debug)]
enum Abort {
    /// The service aborted the copy.
    Aborted,
    /// The service had no pending copy to abort: it had ended meanwhile.
    NothingPending,
    /// The abort failed otherwise, as one phrase: the copy may go on.
    Failed(String),
}

impl Abort {
    /// Aborts the copy `state` names into `dest`.
    async fn send(client: &BlobClient, dest: &BlobPath, state: &CopyState) -> Abort {
        let Some(id) = &state.id else {
            return Abort::Failed("the service gave no copy id to abort".to_string());
        };
        match client.abort_copy(dest, id).await {
            Ok(()) => Abort::Aborted,
            Err(e) => {
                // The error line says it; the whole answer is for -vv.
                tracing::debug!(drive = %dest, error = %e, "Abort Copy Blob was refused");
                match e.code() {
                    Some("NoPendingCopyOperation") => Abort::NothingPending,
                    _ => Abort::Failed(checks::explain(&e)),
                }
            }
        }
    }
}

/// Waits for the copy into `dest` to finish, reporting `(copied, total)`
/// bytes to `progress`; `cancel` resolving aborts it (Abort Copy Blob). A
/// poll that fails is tried again (see the module doc for how long).
async fn wait_copy(
    client: &BlobClient,
    dest: &BlobPath,
    mut state: CopyState,
    progress: &mut dyn FnMut(u64, u64),
    cancel: impl Future<Output = ()>,
) -> Waited {
    tokio::pin!(cancel);
    let budget = client.retry_policy().max_total * POLL_FAILURES_FOR;
    // When the first of the polls failing in a row was sent.
    let mut failing_since: Option<Instant> = None;
    loop {
        if let Some((done, total)) = state.progress_bytes {
            progress(done, total);
        }
        if state.status != Some(CopyStatus::Pending) {
            return Waited::Ended(state);
        }
        // A poll in flight is raced with `cancel` too: Ctrl-C must not wait
        // for a slow answer.
        let poll = async {
            tokio::time::sleep(POLL).await;
            (Instant::now(), client.copy_state(dest).await)
        };
        tokio::select! {
            (sent, polled) = poll => match polled {
                Ok(now) => {
                    failing_since = None;
                    state = now;
                }
                Err(e) => {
                    let since = *failing_since.get_or_insert(sent);
                    if !e.is_transient() {
                        return Waited::Unknown(format!("state could not be read: {}", checks::explain(&e)));
                    }
                    if since.elapsed() >= budget {
                        return Waited::Unknown(format!(
                            "state could not be read for {} s: {}",
                            since.elapsed().as_secs(),
                            checks::explain(&e)
                        ));
                    }
                    if since == sent {
                        // Once per streak: the error line says the rest.
                        tracing::warn!(drive = %dest, error = %e, "could not read the state of the copy; asking again for up to {} s", budget.as_secs());
                    } else {
                        tracing::debug!(drive = %dest, error = %e, "could not read the state of the copy; asking again");
                    }
                }
            },
            () = &mut cancel => return Waited::Cancelled(Abort::send(client, dest, &state).await),
        }
    }
}

/// True when the account is Azurite's development account, whose Copy Blob
/// leaves the copy sharing pages with its source (see the module doc).
fn copies_share_pages(client: &BlobClient) -> bool {
    client.account().name == crate::blob::account::DEV_ACCOUNT_NAME
        && std::env::var(SERVICE_COPY_ENV).as_deref() != Ok("1")
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
///
/// A drive in use (its lease held) is copied from a snapshot taken for the
/// copy: with its filesystem frozen and flushed when this host has it
/// attached read-write (what `blobdrive snapshot` does), else as it is
/// (crash-consistent, which the report says). That snapshot is deleted
/// once the copy has ended, never before.
pub async fn copy(
    client: &BlobClient,
    source: &CopySource,
    dest: &BlobPath,
    progress: &mut dyn FnMut(u64, u64),
    cancel: impl Future<Output = ()>,
) -> anyhow::Result<CopyReport> {
    let live = match source {
        CopySource::Blob(p) if p.snapshot.is_none() => p,
        _ => return copy_from(client, source, dest, progress, cancel).await,
    };
    let props = checks::properties(client, live).await?;
    if !checks::is_leased(props.lease_state) {
        return copy_from(client, source, dest, progress, cancel).await;
    }
    require_drive(client, live).await?;
    let taken = crate::daemon::freeze::snapshot_drive(client, live).await?;
    let consistency = match &taken.frozen {
        Some(dir) => {
            tracing::info!(drive = %live, snapshot = %taken.time, dir = %dir.display(), "copying from a snapshot taken with the filesystem frozen");
            Consistency::Frozen
        }
        None => {
            tracing::info!(drive = %live, snapshot = %taken.time, "copying from a snapshot of a drive leased elsewhere");
            Consistency::CrashConsistent
        }
    };
    let snap = live.clone().with_snapshot(Some(&taken.time));
    let copied = copy_from(
        client,
        &CopySource::Blob(snap.clone()),
        dest,
        progress,
        cancel,
    )
    .await;
    // The copy has ended here: it succeeded (the service said so), or it
    // failed and its destination was deleted. Only now may its source go.
    let deleted = client.delete_blob(&snap, false, None).await;
    let leftover = |e: &crate::blob::Error| {
        format!(
            "the snapshot {} taken for the copy could not be deleted ({}); delete it with 'blobdrive snapshot delete {live} {}'",
            taken.time,
            checks::explain(e),
            taken.time
        )
    };
    match (copied, deleted) {
        (Ok(report), deleted) => {
            if let Err(e) = &deleted {
                tracing::warn!("{}", leftover(e));
            }
            Ok(CopyReport {
                source: live.to_string(),
                consistency,
                source_snapshot: Some(taken.time),
                source_snapshot_deleted: deleted.is_ok(),
                ..report
            })
        }
        (Err(e), Ok(())) => Err(e),
        (Err(e), Err(d)) => Err(anyhow!("{e:#}; {}", leftover(&d))),
    }
}

/// [`copy`] of a source at rest, or of the snapshot [`copy`] took.
async fn copy_from(
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
        Waited::Ended(s) if s.status == Some(CopyStatus::Success) => None,
        Waited::Cancelled(Abort::Aborted) => Some("was aborted".to_string()),
        Waited::Cancelled(Abort::NothingPending) => Some(
            "was aborted, though Abort Copy Blob was refused: the service had no pending copy to abort (it had finished)"
                .to_string(),
        ),
        Waited::Cancelled(Abort::Failed(why)) => Some(format!(
            "was aborted, though Abort Copy Blob was refused: {why}"
        )),
        Waited::Ended(s) => Some(format!(
            "failed: the service {} it ({})",
            match s.status {
                Some(CopyStatus::Aborted) => "aborted",
                _ => "could not copy",
            },
            s.description.as_deref().unwrap_or("no reason given")
        )),
        Waited::Unknown(why) => Some(format!("failed: the copy's {why}")),
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
        consistency: Consistency::AtRest,
        source_snapshot: None,
        source_snapshot_deleted: false,
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
        consistency: Consistency::AtRest,
        source_snapshot: None,
        source_snapshot_deleted: false,
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

/// How a restore under its lease stopped short.
enum Stopped {
    /// It failed; why, as one phrase.
    Failed(String),
    /// `cancel` resolved (Ctrl-C, SIGTERM); what the drive holds now.
    Interrupted(String),
    /// The service may still be copying onto the drive: its lease is left
    /// to expire rather than released. Why, as one phrase.
    CopyUnknown(String),
}

/// Puts the drive `path` back to its snapshot `time`, under a lease of its
/// own (see [`checks::OPERATION_LEASE_SECS`]). `cancel` resolving (the CLI:
/// Ctrl-C or SIGTERM) stops it: the service's copy is aborted, the lease
/// released, and the error line says what the drive holds and names the
/// safety snapshot.
pub async fn restore(
    client: &BlobClient,
    path: &BlobPath,
    time: &str,
    safety_snapshot: bool,
    cancel: impl Future<Output = ()>,
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
    let lease = checks::operation_lease(client, path)
        .await
        .map_err(blob_err)?;
    tokio::pin!(cancel);
    let safety = if safety_snapshot {
        let taken = tokio::select! {
            taken = client.snapshot(path) => taken.map_err(blob_err),
            () = &mut cancel => Err(anyhow!(
                "restore of {path} from {time} was interrupted before it changed anything"
            )),
        };
        match taken {
            Ok(t) => Some(t),
            Err(e) => {
                release_operation_lease(lease, path).await;
                return Err(e);
            }
        }
    } else {
        None
    };
    let stopped = restore_leased(client, path, &snap, lease.id(), &mut cancel).await;
    let Err(stopped) = stopped else {
        release_operation_lease(lease, path).await;
        return Ok(RestoreReport {
            drive: path.to_string(),
            snapshot: time.to_string(),
            safety_snapshot: safety,
        });
    };
    let before = match &safety {
        Some(t) => format!(
            "the state before it is safety snapshot {t} ('blobdrive restore {path} --snapshot {t}' puts it back)"
        ),
        None => "no safety snapshot was taken (--no-safety-snapshot)".to_string(),
    };
    let what = match stopped {
        Stopped::Failed(why) => {
            release_operation_lease(lease, path).await;
            format!("failed ({why})")
        }
        Stopped::Interrupted(holds) => {
            release_operation_lease(lease, path).await;
            format!("was interrupted: {holds}; run the restore again")
        }
        Stopped::CopyUnknown(why) => {
            // Released, the lease would let a mount write under the
            // service's copy; expired, it leaves the drive to the check of
            // the copy's status that every read-write open makes.
            lease.abandon();
            format!(
                "did not finish: {why}; the service may still be copying, so the drive stays locked until its lease \
                 expires (within {OPERATION_LEASE_SECS} s); 'blobdrive info {path}' shows the copy's status"
            )
        }
    };
    bail!("restore of {path} from {time} {what}; {before}")
}

/// The copy of a restore, once the lease is held and the safety snapshot
/// taken: `snap` onto `path`, every request under `lease_id`.
async fn restore_leased(
    client: &BlobClient,
    path: &BlobPath,
    snap: &BlobPath,
    lease_id: &str,
    cancel: &mut (impl Future<Output = ()> + Unpin),
) -> Result<(), Stopped> {
    let failed = |e: crate::blob::Error| Stopped::Failed(checks::explain(&e));
    if copies_share_pages(client) {
        let by_client = async {
            let size = client.get_properties(snap).await?.content_length;
            let lid = Some(lease_id);
            client.resize(path, size, lid).await?;
            client
                .clear_pages(path, crate::units::ByteRange::new(0, size), lid)
                .await?;
            copy_pages(client, snap, path, lid).await
        };
        return tokio::select! {
            done = by_client => done.map_err(failed),
            () = cancel => Err(Stopped::Interrupted(
                "the drive holds part of each state".to_string(),
            )),
        };
    }
    let url = client.source_url(snap);
    let started = client
        .start_copy(path, &url, Some(lease_id))
        .await
        .map_err(|e| {
            // A request that failed without an answer (retries spent on
            // timeouts, 5xx, lost connections) may have started the copy.
            if e.is_transient() {
                Stopped::CopyUnknown(format!(
                    "Copy Blob got no answer ({}), so whether it started is unknown",
                    checks::explain(&e)
                ))
            } else {
                failed(e)
            }
        })?;
    match wait_copy(client, path, started, &mut |_, _| {}, cancel).await {
        Waited::Ended(s) if s.status == Some(CopyStatus::Success) => Ok(()),
        Waited::Ended(s) => Err(Stopped::Failed(
            s.description
                .unwrap_or_else(|| "no reason given".to_string()),
        )),
        Waited::Cancelled(Abort::Aborted) => Err(Stopped::Interrupted(
            "the service's copy was aborted, which leaves the drive empty (zero length)"
                .to_string(),
        )),
        Waited::Cancelled(Abort::NothingPending) => Err(Stopped::Interrupted(
            "the service's copy had ended before the abort; 'blobdrive info' shows how".to_string(),
        )),
        Waited::Cancelled(Abort::Failed(why)) => Err(Stopped::CopyUnknown(format!(
            "it was interrupted, but Abort Copy Blob failed ({why})"
        ))),
        Waited::Unknown(why) => Err(Stopped::CopyUnknown(format!("the copy's {why}"))),
    }
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
