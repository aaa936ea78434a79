//! The directory of one drive's cache: its lock file (`flock`) and its
//! record (`record.json`), which says whose cache it is and whether its
//! contents can be trusted.
//!
//! The record is written to a temporary name, synced and renamed, so it is
//! always either the old one or the new one. A writer (read-write mount)
//! holds the lock exclusively and sets the record to `in-use` before its first
//! write, and to `clean` with the blob's ETag only after its last flush: a
//! crash leaves `in-use`, and the next open drops everything. Readers
//! (read-only and snapshot mounts) share the lock; they only ever trust or
//! reset a record (resetting needs the lock exclusively).

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::private_dir;

/// What `record.json` holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The blob (endpoint, container, name, snapshot) the cache is for.
    pub identity: String,
    /// `clean`: the chunks match the blob whose ETag is `etag`.
    /// `in-use`: a writer has it open (or crashed): nothing is trusted.
    pub state: String,
    /// The blob's ETag the chunks belong to.
    pub etag: Option<String>,
}

pub const CLEAN: &str = "clean";
pub const IN_USE: &str = "in-use";

impl Record {
    /// Does this record vouch for the chunks of `identity` at `etag`?
    pub fn trusts(&self, identity: &str, etag: Option<&str>) -> bool {
        self.identity == identity
            && self.state == CLEAN
            && etag.is_some()
            && self.etag.as_deref() == etag
    }
}

fn record_path(dir: &Path) -> PathBuf {
    dir.join("record.json")
}

/// Read the record; `None` when missing or unreadable (then nothing is trusted).
pub fn read(dir: &Path) -> Option<Record> {
    let raw = std::fs::read(record_path(dir)).ok()?;
    serde_json::from_slice(&raw).ok()
}

/// Replace the record atomically and durably.
pub fn write(dir: &Path, record: &Record) -> io::Result<()> {
    let tmp = dir.join(format!("record.json.tmp.{}", std::process::id()));
    {
        let mut f = private_dir::create_file(&tmp)?;
        f.write_all(&serde_json::to_vec_pretty(record).map_err(io::Error::other)?)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, record_path(dir))?;
    File::open(dir)?.sync_all()
}

/// How a lock is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    /// Several readers at once.
    Shared,
    /// One user alone.
    Exclusive,
}

/// A held `flock` on a directory's lock file; released when dropped.
#[derive(Debug)]
pub struct DirLock {
    file: File,
}

fn flock(file: &File, op: libc::c_int) -> io::Result<bool> {
    // SAFETY: flock on a file descriptor we own; no memory is passed.
    let rc = unsafe { libc::flock(file.as_raw_fd(), op | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(err)
    }
}

fn op_of(mode: LockMode) -> libc::c_int {
    match mode {
        LockMode::Shared => libc::LOCK_SH,
        LockMode::Exclusive => libc::LOCK_EX,
    }
}

impl DirLock {
    /// Take the lock of `dir` without waiting; `None` when someone holds it
    /// in a conflicting mode. Retries when the directory was removed (by
    /// `cache clear`) between opening the lock file and locking it.
    pub fn try_take(dir: &Path, mode: LockMode) -> io::Result<Option<DirLock>> {
        let path = dir.join("lock");
        for _ in 0..8 {
            private_dir::ensure(dir)?;
            let file = private_dir::open_file(&path)?;
            if !flock(&file, op_of(mode))? {
                return Ok(None);
            }
            let held = file.metadata()?;
            match std::fs::metadata(&path) {
                Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => {
                    return Ok(Some(DirLock { file }))
                }
                _ => continue,
            }
        }
        Err(io::Error::other("cache directory keeps disappearing"))
    }

    /// Change the lock's mode without waiting; false when it cannot be had now.
    pub fn try_convert(&self, mode: LockMode) -> io::Result<bool> {
        flock(&self.file, op_of(mode))
    }
}
