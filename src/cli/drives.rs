//! What the drive commands (`create`, `info`, `list`, `snapshot`,
//! `break-lease`, `delete`) share: the runtime and client, naming a blob from
//! the command line. The footer check, snapshots, bytes stored, lease
//! wording and the one line for a blob error live in
//! `crate::provision::checks` (the lifecycle operations and the namespace
//! mount use them too) and are re-exported here.
//!
//! Invariant: every message built here names the blob (or container) and the
//! account at most by name; keys and SAS signatures never reach an error line
//! (the blob layer's errors hold none).

use std::future::Future;

use anyhow::anyhow;

use super::CodedError;
use crate::blob::{BlobClient, BlobPath, BlobType};
pub use crate::provision::checks::{
    blob_err, blob_type_name, check_disk, explain, is_leased, lease_duration_name,
    lease_state_name, lease_status_name, lease_text, mounted_elsewhere, properties, snapshots_of,
    stored_bytes, wrong_type_line, DiskCheck,
};

/// Run one command's async body on a small runtime of its own.
pub fn block_on<F: Future<Output = anyhow::Result<()>>>(body: F) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| anyhow!("cannot start the async runtime: {e}"))?;
    rt.block_on(body)
}

/// Run an async body returning a value on a small runtime of its own, which
/// is gone (with its threads) when this returns.
pub fn block_on_value<T, F: Future<Output = anyhow::Result<T>>>(body: F) -> anyhow::Result<T> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| anyhow!("cannot start the async runtime: {e}"))?;
    rt.block_on(body)
}

/// The client of the account chosen as the README's Configuration section
/// says (flags, environment, else Azurite), signed in as `--auth` says.
pub fn connect(ctx: &super::Context) -> anyhow::Result<BlobClient> {
    let account = ctx.account().map_err(|e| anyhow!(explain(&e)))?;
    BlobClient::new(account).map_err(|e| anyhow!(explain(&e)))
}

/// The client for a command on the blob `operand` names: a blob URL with its
/// own SAS signs in with it (see [`super::Context::account_for`]).
pub fn connect_for(ctx: &super::Context, operand: &str) -> anyhow::Result<BlobClient> {
    let account = ctx.account_for(operand).map_err(|e| anyhow!(explain(&e)))?;
    BlobClient::new(account).map_err(|e| anyhow!(explain(&e)))
}

/// Parse a `C/B` (or URL) operand; `snapshot` (from `--snapshot`) selects a
/// snapshot. A bad name, or two different snapshot times, is a usage error.
pub fn parse_blob(operand: &str, snapshot: Option<&str>) -> anyhow::Result<BlobPath> {
    let path = BlobPath::parse(operand).map_err(|e| CodedError::usage(e.message))?;
    match (path.snapshot.as_deref(), snapshot) {
        (Some(a), Some(b)) if a != b => Err(CodedError::usage(format!(
            "{operand} names snapshot {a} but --snapshot says {b}: give one"
        ))
        .into()),
        (_, Some(b)) => Ok(path.with_snapshot(Some(b))),
        _ => Ok(path),
    }
}

/// Refuse a snapshot where only the base blob makes sense (`what` says why).
pub fn require_base(path: &BlobPath, what: &str) -> anyhow::Result<()> {
    match &path.snapshot {
        Some(t) => {
            Err(CodedError::usage(format!("{} names snapshot {t}: {what}", path.base())).into())
        }
        None => Ok(()),
    }
}

/// `page blob`, `block blob`, ... without the article (table notes).
pub fn blob_type_noun(t: Option<BlobType>) -> &'static str {
    let name = blob_type_name(t);
    name.strip_prefix("an ")
        .or_else(|| name.strip_prefix("a "))
        .unwrap_or(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blob::{LeaseDuration, LeaseState};

    #[test]
    fn snapshot_flag_and_url_must_agree() {
        let p = parse_blob("c1x/d.vhd", Some("T1")).unwrap();
        assert_eq!(p.snapshot.as_deref(), Some("T1"));
        let url = "http://127.0.0.1:10000/devstoreaccount1/c1x/d.vhd?snapshot=T1";
        assert_eq!(
            parse_blob(url, Some("T1")).unwrap().snapshot.as_deref(),
            Some("T1")
        );
        assert!(parse_blob(url, Some("T2")).is_err());
        let e = parse_blob("nocontainer", None).unwrap_err();
        assert_eq!(e.downcast_ref::<CodedError>().map(|c| c.code), Some(2));
    }

    #[test]
    fn lease_text_reads_well() {
        assert_eq!(
            lease_text(Some(LeaseState::Leased), Some(LeaseDuration::Infinite)),
            "leased (infinite)"
        );
        assert_eq!(lease_text(Some(LeaseState::Available), None), "available");
        assert!(is_leased(Some(LeaseState::Breaking)));
        assert!(!is_leased(Some(LeaseState::Broken)));
    }
}
