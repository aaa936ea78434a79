//! What this host has attached: one JSON file per attached drive in
//! `<run dir>/attach/<key>.json` (CloudDrive's GetMountedDrives), and the
//! private FUSE mountpoint of each attach, `<run dir>/attach/<key>/`, where
//! the run dir is this user's private one (`mountpoint::run_dir`). The
//! directory is 0700 and the entries 0600 (`private_dir`).
//!
//! `<key>` is the mount key of the user's directory (see `mountpoint::mount_key`),
//! so one directory holds at most one attach and `blobdrive unmount DIR` finds
//! it. The daemon writes its entry once DIR is mounted and removes it when it
//! exits; an entry whose daemon is gone (a crash, `kill -9`) is reported as
//! stale, never hidden, because its lease and loop device may still be there.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use super::mountpoint::{mount_key, run_dir};
use crate::private_dir;

/// How a drive is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttachMode {
    /// Read-write; the daemon holds the blob's lease.
    ReadWrite,
    /// Read-only view of the live blob, no lease.
    ReadOnly,
    /// A snapshot, read-only, no lease.
    Snapshot,
}

impl AttachMode {
    /// `read-write`, `read-only` or `snapshot`.
    pub fn name(self) -> &'static str {
        match self {
            AttachMode::ReadWrite => "read-write",
            AttachMode::ReadOnly => "read-only",
            AttachMode::Snapshot => "snapshot",
        }
    }
}

/// One attached drive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachedDrive {
    /// Storage account name.
    pub account: String,
    /// `container/blob`.
    pub drive: String,
    /// Snapshot time, for a snapshot attach.
    pub snapshot: Option<String>,
    /// Where the filesystem is mounted (canonical path).
    pub dir: PathBuf,
    /// The loop device, e.g. `/dev/loop3`.
    pub loop_device: PathBuf,
    /// Filesystem type found on the drive.
    pub fs_type: String,
    /// The partition attached (None: the whole disk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<u32>,
    /// Read-write, read-only or snapshot.
    pub mode: AttachMode,
    /// The serving process's id (it changes at a takeover).
    pub pid: u32,
    /// The holder's process id: the process that keeps the FUSE connection
    /// and starts a new serving process when one dies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder_pid: Option<u32>,
    /// The private FUSE mountpoint serving the drive file.
    pub fuse_dir: PathBuf,
    /// When it was attached, seconds since the Unix epoch.
    pub since_unix_secs: u64,
    /// False when the daemon is gone (the entry is stale); not stored.
    #[serde(skip_deserializing, default = "alive_default")]
    pub alive: bool,
}

fn alive_default() -> bool {
    true
}

/// Directory of the registry and of the private FUSE mountpoints.
pub fn attach_dir() -> PathBuf {
    run_dir().join("attach")
}

fn entry_file(key: &str) -> PathBuf {
    attach_dir().join(format!("{key}.json"))
}

/// The private FUSE mountpoint of the attach at `dir` (canonical).
pub fn fuse_dir_of(dir: &Path) -> PathBuf {
    attach_dir().join(mount_key(dir))
}

/// Records `entry` (atomically: a reader never sees half a file).
pub fn write(entry: &AttachedDrive) -> anyhow::Result<()> {
    let path = entry_file(&mount_key(&entry.dir));
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_string_pretty(entry).context("cannot encode registry entry")?;
    private_dir::ensure(&attach_dir())
        .with_context(|| format!("cannot create {}", attach_dir().display()))?;
    private_dir::create_file(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))
}

/// Forgets the attach at `dir` (canonical); missing entries are fine.
pub fn remove(dir: &Path) {
    let path = entry_file(&mount_key(dir));
    if let Err(err) = std::fs::remove_file(&path) {
        if err.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(%err, path = %path.display(), "cannot remove registry entry");
        }
    }
}

/// The entry of the attach at `dir`, if any: found by its canonical path,
/// or by the path as given when `dir` cannot be resolved any more (its dead
/// mount, or the directory removed after the daemon died).
pub fn find_by_dir(dir: &Path) -> Option<AttachedDrive> {
    match dir.canonicalize() {
        Ok(canonical) => read_entry(&entry_file(&mount_key(&canonical))),
        Err(_) => list_mounted().into_iter().find(|e| e.dir == dir),
    }
}

/// Every drive this host has attached, sorted by directory; stale entries
/// (daemon gone) have `alive == false`.
pub fn list_mounted() -> Vec<AttachedDrive> {
    let Ok(dir) = std::fs::read_dir(attach_dir()) else {
        return Vec::new();
    };
    let mut entries: Vec<AttachedDrive> = dir
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter_map(|p| read_entry(&p))
        .collect();
    entries.sort_by(|a, b| a.dir.cmp(&b.dir));
    entries
}

/// The live read-write attach of `drive` (`container/blob`) of `account` on
/// this host, if any: the one `blobdrive snapshot` must freeze and flush.
pub fn find_read_write(account: &str, drive: &str) -> Option<AttachedDrive> {
    list_mounted().into_iter().find(|e| {
        e.alive && e.mode == AttachMode::ReadWrite && e.account == account && e.drive == drive
    })
}

fn read_entry(path: &Path) -> Option<AttachedDrive> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut entry: AttachedDrive = match serde_json::from_str(&text) {
        Ok(entry) => entry,
        Err(err) => {
            tracing::warn!(%err, path = %path.display(), "unreadable registry entry");
            return None;
        }
    };
    // Between a serving process's death and its successor's start only
    // the holder runs: the attach is alive.
    entry.alive = process_alive(entry.pid) || entry.holder_pid.is_some_and(process_alive);
    Some(entry)
}

/// Whether process `pid` is running: it exists and is not a zombie (a
/// daemon that exited but whose parent has not reaped it yet).
pub fn process_alive(pid: u32) -> bool {
    // pid 0 would address our own process group.
    let Ok(pid @ 1..) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    let exists = unsafe { libc::kill(pid, 0) } == 0
        || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    // A killed daemon whose parent has not reaped it yet is a zombie: gone.
    exists && !is_zombie(pid)
}

/// True when `/proc/PID/stat` shows the process as a zombie.
fn is_zombie(pid: libc::pid_t) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // "PID (comm) STATE ...": comm may hold spaces and parentheses.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        == Some("Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_a_dead_daemon_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        std::env::set_var(super::super::mountpoint::RUN_DIR_ENV, dir.path());
        let mut entry = AttachedDrive {
            account: "devstoreaccount1".into(),
            drive: "c/disk.vhd".into(),
            snapshot: None,
            dir: PathBuf::from("/mnt/data"),
            loop_device: PathBuf::from("/dev/loop7"),
            fs_type: "ext4".into(),
            partition: Some(1),
            mode: AttachMode::ReadWrite,
            pid: std::process::id(),
            holder_pid: None,
            fuse_dir: fuse_dir_of(Path::new("/mnt/data")),
            since_unix_secs: 1,
            alive: true,
        };
        write(&entry).unwrap();
        assert_eq!(list_mounted(), vec![entry.clone()]);
        assert!(find_read_write("devstoreaccount1", "c/disk.vhd").is_some());
        assert!(find_read_write("other", "c/disk.vhd").is_none());

        entry.pid = u32::MAX;
        write(&entry).unwrap();
        let listed = list_mounted();
        assert!(!listed[0].alive, "pid {} cannot be alive", u32::MAX);
        assert!(find_read_write("devstoreaccount1", "c/disk.vhd").is_none());
        remove(Path::new("/mnt/data"));
        assert!(list_mounted().is_empty());
        std::env::remove_var(super::super::mountpoint::RUN_DIR_ENV);
    }
}
