//! What this host serves over NBD: one JSON file per `blobdrive serve`
//! process in `<run dir>/serve/<key>.json`, beside the attach registry
//! (`registry.rs`), so `blobdrive list --mounted` shows exports as it shows
//! attaches, and `blobdrive stats` and `unmount` find the server's control
//! socket from what the user knows: the NBD socket path, the `tcp:` endpoint
//! or an export's name.
//!
//! `<key>` is the mount key (`mountpoint::mount_key`) of the server's
//! [`control key`](ServedEntry::key): the canonical path of its Unix socket,
//! or its `tcp:IP:PORT` endpoint. The control socket is the one a mount at
//! that path would have (`control::socket_path_of_canonical`). The server
//! writes its entry once it serves and removes it when it exits (only if
//! the entry is still its own: another server may have taken the name); an entry
//! whose process is gone is shown as stale, never hidden (its drives may
//! still be leased).

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use super::mountpoint::{ensure_run_dir, mount_key, run_dir};
use super::registry::{process_alive, AttachMode};
use crate::private_dir;

/// One export of a serving process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServedDrive {
    /// Storage account name.
    pub account: String,
    /// The export name: `container/blob`, or `container/blob@TIME` for a snapshot.
    pub export: String,
    /// The NBD URI clients use.
    pub uri: String,
    /// Read-write, read-only or snapshot.
    pub mode: AttachMode,
}

/// One `blobdrive serve` process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServedEntry {
    /// Where clients connect: `unix:PATH` or `tcp:IP:PORT`.
    pub endpoint: String,
    /// What names the server's control socket: the canonical path of its
    /// Unix socket, or its `tcp:IP:PORT` endpoint.
    pub key: PathBuf,
    /// The serving process.
    pub pid: u32,
    /// The drives it exports.
    pub exports: Vec<ServedDrive>,
    /// Where its log goes (`--log-file`, or the default in the run directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_file: Option<PathBuf>,
    /// When it started serving, seconds since the Unix epoch.
    pub since_unix_secs: u64,
    /// False when the process is gone (the entry is stale); not stored.
    #[serde(skip_deserializing, default = "alive_default")]
    pub alive: bool,
}

fn alive_default() -> bool {
    true
}

/// Directory of the serve registry.
fn serve_dir() -> PathBuf {
    run_dir().join("serve")
}

fn entry_file(key: &Path) -> PathBuf {
    serve_dir().join(format!("{}.json", mount_key(key)))
}

/// Where a background server logs without `--log-file`:
/// `<run dir>/serve/<key of ENDPOINT>.log` (0600, appended to), `endpoint`
/// as `--nbd` names it. Fails, saying why in one line, when the run
/// directory is not this user's to use (the server could not be reached
/// by `stats` or `unmount` either).
pub fn default_log_file(endpoint: &str) -> anyhow::Result<PathBuf> {
    ensure_serve_dir()?;
    Ok(serve_dir().join(format!("{}.log", mount_key(Path::new(endpoint)))))
}

/// Makes (or checks) the run directory, as a mount does
/// (`mountpoint::ensure_run_dir`: the shared directory above this user's
/// too), then the registry directory in it.
fn ensure_serve_dir() -> anyhow::Result<()> {
    ensure_run_dir().map_err(|e| {
        anyhow::anyhow!("cannot use the run directory {}: {e}", run_dir().display())
    })?;
    private_dir::ensure(&serve_dir())
        .with_context(|| format!("cannot create {}", serve_dir().display()))
}

/// Records `entry` (atomically: a reader never sees half a file).
pub fn write(entry: &ServedEntry) -> anyhow::Result<()> {
    let path = entry_file(&entry.key);
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_string_pretty(entry).context("cannot encode serve entry")?;
    ensure_serve_dir()?;
    private_dir::create_file(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))
}

/// Forgets the server whose control key is `key`; a missing entry is fine.
pub fn remove(key: &Path) {
    let path = entry_file(key);
    if let Err(err) = std::fs::remove_file(&path) {
        if err.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(%err, path = %path.display(), "cannot remove serve entry");
        }
    }
}

/// Forgets the server whose control key is `key` if the entry is this
/// process's (another server may have recorded itself under the same key
/// since this one stopped serving).
pub fn remove_own(key: &Path) {
    let path = entry_file(key);
    if read_entry(&path).is_some_and(|e| e.pid == std::process::id()) {
        remove(key);
    }
}

/// Every serving process this host records, sorted by endpoint; stale
/// entries (process gone) have `alive == false`.
pub fn list_served() -> Vec<ServedEntry> {
    let Ok(dir) = std::fs::read_dir(serve_dir()) else {
        return Vec::new();
    };
    let mut entries: Vec<ServedEntry> = dir
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter_map(|p| read_entry(&p))
        .collect();
    entries.sort_by(|a, b| a.endpoint.cmp(&b.endpoint));
    entries
}

/// The server `target` names: its NBD socket path, its endpoint
/// (`unix:PATH`, `tcp:IP:PORT`) or one of its export names. A directory
/// (a mount point, or an attach's directory even when gone) is never taken
/// for an export name. Among servers exporting the name, a live one is
/// preferred to a stale entry; two live ones make the name ambiguous, an
/// error that lists their endpoints.
pub fn find(target: &Path) -> anyhow::Result<Option<ServedEntry>> {
    let text = target.to_string_lossy();
    let canonical = target.canonicalize().ok();
    let all = list_served();
    if let Some(e) = all.iter().find(|e| {
        e.endpoint == text || e.key == target || canonical.as_deref() == Some(e.key.as_path())
    }) {
        return Ok(Some(e.clone()));
    }
    if canonical.as_deref().is_some_and(Path::is_dir)
        || super::registry::find_by_dir(target).is_some()
    {
        return Ok(None);
    }
    let (live, stale): (Vec<ServedEntry>, Vec<ServedEntry>) = all
        .into_iter()
        .filter(|e| e.exports.iter().any(|x| x.export == text))
        .partition(|e| e.alive);
    match live.len() {
        0 => Ok(stale.into_iter().next()),
        1 => Ok(live.into_iter().next()),
        _ => {
            let endpoints: Vec<&str> = live.iter().map(|e| e.endpoint.as_str()).collect();
            anyhow::bail!(
                "{text} is exported by {} servers ({}): name one by its socket or endpoint",
                live.len(),
                endpoints.join(", ")
            )
        }
    }
}

/// The live server on this host exporting `drive` (`container/blob`) of
/// `account` read-write, if any: the one `blobdrive snapshot` asks to flush.
pub fn find_read_write(account: &str, drive: &str) -> Option<ServedEntry> {
    list_served().into_iter().find(|e| {
        e.alive
            && e.exports.iter().any(|x| {
                x.mode == AttachMode::ReadWrite && x.account == account && x.export == drive
            })
    })
}

fn read_entry(path: &Path) -> Option<ServedEntry> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut entry: ServedEntry = match serde_json::from_str(&text) {
        Ok(entry) => entry,
        Err(err) => {
            tracing::warn!(%err, path = %path.display(), "unreadable serve entry");
            return None;
        }
    };
    entry.alive = process_alive(entry.pid);
    Some(entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_served_export_is_found_by_socket_endpoint_or_name() {
        let dir = tempfile::tempdir().unwrap();
        std::env::set_var(super::super::mountpoint::RUN_DIR_ENV, dir.path());
        let entry = ServedEntry {
            endpoint: "tcp:127.0.0.1:10809".into(),
            key: PathBuf::from("tcp:127.0.0.1:10809"),
            pid: std::process::id(),
            exports: vec![ServedDrive {
                account: "devstoreaccount1".into(),
                export: "c/disk.vhd".into(),
                uri: "nbd://127.0.0.1:10809/c/disk.vhd".into(),
                mode: AttachMode::ReadWrite,
            }],
            log_file: None,
            since_unix_secs: 1,
            alive: true,
        };
        write(&entry).unwrap();
        assert_eq!(list_served(), vec![entry.clone()]);
        let found = |t: &str| find(Path::new(t)).unwrap();
        assert!(found("tcp:127.0.0.1:10809").is_some());
        assert!(found("c/disk.vhd").is_some());
        assert!(found("c/other.vhd").is_none());
        // A stale entry exporting the same name (sorted first) is passed over.
        let stale = ServedEntry {
            endpoint: "tcp:127.0.0.1:1".into(),
            key: PathBuf::from("tcp:127.0.0.1:1"),
            pid: 999_999_999,
            ..entry.clone()
        };
        write(&stale).unwrap();
        assert_eq!(found("c/disk.vhd").unwrap().pid, entry.pid);
        // Two live ones: ambiguous, in one line naming both.
        let other = ServedEntry {
            endpoint: "tcp:127.0.0.1:2".into(),
            key: PathBuf::from("tcp:127.0.0.1:2"),
            ..entry.clone()
        };
        write(&other).unwrap();
        let err = find(Path::new("c/disk.vhd")).unwrap_err().to_string();
        assert!(
            err.contains("tcp:127.0.0.1:2") && err.contains("tcp:127.0.0.1:10809"),
            "{err}"
        );
        remove(&stale.key);
        remove(&other.key);
        assert!(find_read_write("devstoreaccount1", "c/disk.vhd").is_some());
        assert!(find_read_write("other", "c/disk.vhd").is_none());
        remove(&entry.key);
        assert!(list_served().is_empty());
        std::env::remove_var(super::super::mountpoint::RUN_DIR_ENV);
    }
}
