//! What a blob is, and how to say what went wrong with it: the footer check
//! (a drive or not, also after an interrupted grow), its snapshots, the bytes
//! it stores, whether it is leased (and the lease an operation takes on it;
//! the lease as people read it), and the one place that turns blob errors
//! into lines a person can act on. The commands under `cli/`, the lifecycle
//! operations and the namespace mount share them (`cli::drives` re-exports
//! them).
//!
//! Invariant: every message built here names the blob (or container) and the
//! account at most by name; keys and SAS signatures never reach an error line
//! (the blob layer's errors hold none).

use anyhow::anyhow;

use crate::blob::{
    BlobClient, BlobPath, BlobProperties, BlobType, Error as BlobError, ErrorKind, LeaseDuration,
    LeaseState, LeaseStatus, ListBlobsOptions, RenewedLease,
};
use crate::drive::{BlobPageStore, PageStore};
use crate::units::{ByteRange, VHD_FOOTER_BYTES};
use crate::vhd::{self, Footer};

/// The one line for a blob error: what failed, on which blob, what to do.
/// Common cases get their own wording; anything else keeps the blob layer's
/// line (operation, target, HTTP status and service code, message).
pub fn explain(e: &BlobError) -> String {
    let target = e.target.as_str();
    let container = target.split('/').next().unwrap_or(target);
    let base = target.split('@').next().unwrap_or(target);
    match e.code() {
        Some("ContainerNotFound") => {
            return format!(
                "container '{container}' does not exist ({} {target} failed); check the name, or make a drive there with 'blobdrive create {container}/NAME --size SIZE'",
                e.operation
            )
        }
        Some("BlobNotFound") => {
            return match target.split_once('@') {
                Some((b, t)) => format!("snapshot {t} of {b} does not exist; 'blobdrive info {b}' lists its snapshots"),
                None => format!("{target} does not exist; 'blobdrive list {container}' shows the drives there"),
            }
        }
        Some("BlobAlreadyExists") => {
            return format!(
                "{target} already exists; blobdrive never replaces a blob: pick another name, or delete it first with 'blobdrive delete {target}'"
            )
        }
        Some("SnapshotsPresent") => {
            return format!(
                "{target} has snapshots; add --include-snapshots to delete them with it"
            )
        }
        _ => {}
    }
    if e.is_lease_conflict() || e.code() == Some("LeaseIdMissing") {
        return mounted_elsewhere(base);
    }
    if e.is_auth_failure() {
        return format!("{} {target} failed: {}", e.operation, e.message);
    }
    if e.is_not_found() {
        // A HEAD answer carries no body; without a code, say what we know.
        return format!(
            "{target} does not exist (or container '{container}' does not); 'blobdrive list' shows the drives"
        );
    }
    if e.kind == ErrorKind::Transport {
        let hint = if e.message.contains("127.0.0.1") || e.message.contains("localhost") {
            "; is Azurite running? ('scripts/azurite.sh start')"
        } else {
            "; check the network and the account's endpoint"
        };
        return format!("{e}{hint}");
    }
    e.to_string()
}

/// The refusal for an operation on a leased drive.
pub fn mounted_elsewhere(base: &str) -> String {
    format!(
        "drive {base} is mounted (leased); unmount it first or run 'blobdrive break-lease {base}' if that host is gone"
    )
}

/// A blob error as an `anyhow` error with its explained line.
pub fn blob_err(e: BlobError) -> anyhow::Error {
    anyhow!(explain(&e))
}

/// What the last 512 bytes of a blob say.
#[derive(Debug, Clone)]
pub enum DiskCheck {
    /// A fixed VHD: a drive.
    Drive(Footer),
    /// A page blob that is not a drive, and why.
    NotADrive(vhd::Error),
    /// Not a page blob at all.
    WrongType(Option<BlobType>),
}

impl DiskCheck {
    /// The footer, when this is a drive.
    pub fn footer(&self) -> Option<&Footer> {
        match self {
            DiskCheck::Drive(f) => Some(f),
            _ => None,
        }
    }

    /// Why this is not a drive (`None` for a drive).
    pub fn problem(&self, path: &BlobPath) -> Option<String> {
        match self {
            DiskCheck::Drive(_) => None,
            DiskCheck::NotADrive(e) => Some(e.to_string()),
            DiskCheck::WrongType(t) => Some(wrong_type_line(path, *t)),
        }
    }
}

/// "C/B is a block blob, not a drive (...)".
pub fn wrong_type_line(path: &BlobPath, t: Option<BlobType>) -> String {
    format!(
        "{path} is {}, not a drive (page blob with a fixed VHD footer)",
        blob_type_name(t)
    )
}

/// `a page blob`, `a block blob`, ... for messages.
pub fn blob_type_name(t: Option<BlobType>) -> &'static str {
    match t {
        Some(BlobType::PageBlob) => "a page blob",
        Some(BlobType::BlockBlob) => "a block blob",
        Some(BlobType::AppendBlob) => "an append blob",
        None => "a blob of unknown type",
    }
}

/// Read and check the footer of `path`, a blob of `blob_size_bytes` and type `t`.
pub async fn check_disk(
    client: &BlobClient,
    path: &BlobPath,
    t: Option<BlobType>,
    blob_size_bytes: u64,
) -> Result<DiskCheck, BlobError> {
    if t != Some(BlobType::PageBlob) {
        return Ok(DiskCheck::WrongType(t));
    }
    let mut footer = [0u8; 512];
    if blob_size_bytes >= VHD_FOOTER_BYTES {
        let range = ByteRange::new(blob_size_bytes - VHD_FOOTER_BYTES, blob_size_bytes);
        let bytes = client.get_blob_range(path, range).await?;
        footer.copy_from_slice(&bytes);
    }
    Ok(match Footer::parse(&footer, blob_size_bytes) {
        Ok(f) => DiskCheck::Drive(f),
        // A grow interrupted after the blob grew: its recorded intent (or,
        // that lost, the last written page) says where the old footer is,
        // and the drive is still the old size. A zero last page with
        // neither is not a drive.
        Err(e) if footer.iter().all(|b| *b == 0) && blob_size_bytes > 0 => {
            let store = BlobPageStore::new(client.clone(), path.clone());
            match crate::drive::resize::locate_footer(&store, blob_size_bytes).await {
                Ok(found) => {
                    if let Some(line) = found.unfinished_grow_line(&path.to_string()) {
                        tracing::warn!(drive = %path, "{line}");
                    }
                    DiskCheck::Drive(found.footer)
                }
                Err(crate::drive::Error::Backend(b)) => return Err(b),
                Err(_) => DiskCheck::NotADrive(e),
            }
        }
        Err(e) => DiskCheck::NotADrive(e),
    })
}

/// The snapshot times of the base blob of `path`, oldest first.
pub async fn snapshots_of(client: &BlobClient, path: &BlobPath) -> Result<Vec<String>, BlobError> {
    let opts = ListBlobsOptions {
        prefix: Some(path.name.clone()),
        include_snapshots: true,
        ..ListBlobsOptions::default()
    };
    let listing = client.list_all_blobs(&path.container, &opts).await?;
    let mut times: Vec<String> = listing
        .blobs
        .into_iter()
        .filter(|b| b.name == path.name)
        .filter_map(|b| b.snapshot)
        .collect();
    times.sort();
    Ok(times)
}

/// True when a lease is held or being broken: the drive is mounted somewhere.
pub fn is_leased(state: Option<LeaseState>) -> bool {
    matches!(state, Some(LeaseState::Leased | LeaseState::Breaking))
}

/// The duration of the lease `restore` and the offline `resize` hold while
/// they change a drive ([`RenewedLease`]: renewed while they run, released
/// when they end or are interrupted): how long a killed one (SIGKILL, a
/// host gone) leaves the drive locked at most. A mount's lease is infinite
/// instead: it lives as long as the daemon, which releases it.
pub const OPERATION_LEASE_SECS: u32 = 60;

/// Takes the lease of an operation on `path` ([`OPERATION_LEASE_SECS`]).
pub async fn operation_lease(
    client: &BlobClient,
    path: &BlobPath,
) -> Result<RenewedLease, BlobError> {
    RenewedLease::acquire(client, path, OPERATION_LEASE_SECS).await
}

/// Releases an operation's lease. A failure is logged, not returned: the
/// operation's own result is what the caller reports, and the lease
/// expires by itself.
pub async fn release_operation_lease(lease: RenewedLease, path: &BlobPath) {
    let secs = lease.secs();
    if let Err(e) = lease.release().await {
        tracing::warn!(drive = %path, error = %e, "could not release the lease; it expires by itself within {secs} s");
    }
}

/// Properties of `path`, with the errors explained.
pub async fn properties(client: &BlobClient, path: &BlobPath) -> anyhow::Result<BlobProperties> {
    client.get_properties(path).await.map_err(blob_err)
}

/// Bytes that hold data (the sum of the page ranges), asked for in segments
/// so that a fragmented 8 TiB blob cannot time out (see `BlobPageStore`).
pub async fn stored_bytes(
    client: &BlobClient,
    path: &BlobPath,
    blob_size_bytes: u64,
) -> Result<u64, BlobError> {
    if blob_size_bytes == 0 {
        return Ok(0);
    }
    let store = BlobPageStore::new(client.clone(), path.clone());
    let ranges = store
        .page_ranges(ByteRange::new(0, blob_size_bytes))
        .await?;
    Ok(ranges.iter().map(ByteRange::len).sum())
}

/// Lease state as people read it: `available`, `leased (infinite)`, `broken`.
pub fn lease_text(state: Option<LeaseState>, duration: Option<LeaseDuration>) -> String {
    let state = state.map_or("-", lease_state_name);
    match duration {
        Some(d) => format!("{state} ({})", lease_duration_name(d)),
        None => state.to_string(),
    }
}

/// The service's spelling of a lease state (also the JSON value).
pub fn lease_state_name(s: LeaseState) -> &'static str {
    match s {
        LeaseState::Available => "available",
        LeaseState::Leased => "leased",
        LeaseState::Expired => "expired",
        LeaseState::Breaking => "breaking",
        LeaseState::Broken => "broken",
    }
}

/// The service's spelling of a lease duration (also the JSON value).
pub fn lease_duration_name(d: LeaseDuration) -> &'static str {
    match d {
        LeaseDuration::Infinite => "infinite",
        LeaseDuration::Fixed => "fixed",
    }
}

/// The service's spelling of a lease status (also the JSON value).
pub fn lease_status_name(s: LeaseStatus) -> &'static str {
    match s {
        LeaseStatus::Locked => "locked",
        LeaseStatus::Unlocked => "unlocked",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(code: &str, status: u16, target: &str) -> BlobError {
        BlobError::service("delete blob", target, status, Some(code.into()), "msg")
    }

    #[test]
    fn common_errors_get_one_actionable_line() {
        let e = explain(&service("ContainerNotFound", 404, "disks/a.vhd"));
        assert!(e.starts_with("container 'disks' does not exist"), "{e}");
        let e = explain(&service("BlobNotFound", 404, "disks/a.vhd"));
        assert!(e.starts_with("disks/a.vhd does not exist"), "{e}");
        let e = explain(&service(
            "BlobNotFound",
            404,
            "disks/a.vhd@2024-01-01T00:00:00Z",
        ));
        assert!(
            e.starts_with("snapshot 2024-01-01T00:00:00Z of disks/a.vhd does not exist"),
            "{e}"
        );
        let e = explain(&service("LeaseIdMissing", 412, "disks/a.vhd"));
        assert_eq!(e, mounted_elsewhere("disks/a.vhd"));
        assert!(e.contains("'blobdrive break-lease disks/a.vhd'"));
        let e = explain(&service("AuthenticationFailed", 403, "disks/a.vhd"));
        assert!(e.starts_with("delete blob disks/a.vhd failed: msg"), "{e}");
    }

    #[test]
    fn transport_errors_point_at_azurite_when_local() {
        let e = BlobError::other(
            ErrorKind::Transport,
            "get properties",
            "d/x",
            "could not connect: refused (endpoint 127.0.0.1)",
        );
        assert!(explain(&e).ends_with("('scripts/azurite.sh start')"));
    }
}
