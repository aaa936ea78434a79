//! What a namespace mount shows that storage does not hold (yet):
//!
//! - directories made with `mkdir` inside a container. Storage has no empty
//!   directories (a directory is a prefix of blob names), so one exists in
//!   this mount only, until a drive is made in it (then the blob names carry
//!   it) or `rmdir` removes it or the mount ends, as mountpoint-s3 does;
//! - `NAME.vhd` files created and not yet given a size (*pending*): nothing
//!   is in storage until the size makes the drive; one that never gets a size
//!   is gone at its last release, so a lone `touch` leaves nothing behind.
//!
//! Invariant: an entry here never hides a name storage lists (the listing
//! merges these only under names it lacks), and a pending file is made in
//! storage by one caller at most ([`Local::take_pending`] hands it out once).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

/// One name held here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalEntry {
    /// Its inode.
    pub ino: u64,
    /// A directory (else a pending file).
    pub is_dir: bool,
}

#[derive(Default)]
struct Inner {
    /// Parent inode → name → entry.
    entries: HashMap<u64, BTreeMap<String, LocalEntry>>,
    /// Pending files: inode → (parent inode, name).
    pending: HashMap<u64, (u64, String)>,
}

/// The mount-only directories and pending files.
#[derive(Default)]
pub struct Local {
    inner: Mutex<Inner>,
}

impl Local {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .expect("local entries lock poisoned: a panic happened while holding it")
    }

    /// Adds directory `name` (inode `ino`) in `parent`.
    pub fn add_dir(&self, parent: u64, name: &str, ino: u64) {
        let entry = LocalEntry { ino, is_dir: true };
        self.lock()
            .entries
            .entry(parent)
            .or_default()
            .insert(name.to_string(), entry);
    }

    /// Adds pending file `name` (inode `ino`) in `parent`.
    pub fn add_pending(&self, parent: u64, name: &str, ino: u64) {
        let entry = LocalEntry { ino, is_dir: false };
        let mut inner = self.lock();
        inner
            .entries
            .entry(parent)
            .or_default()
            .insert(name.to_string(), entry);
        inner.pending.insert(ino, (parent, name.to_string()));
    }

    /// The entries held in `parent`, by name.
    pub fn children(&self, parent: u64) -> Vec<(String, LocalEntry)> {
        self.lock()
            .entries
            .get(&parent)
            .map(|names| names.iter().map(|(n, e)| (n.clone(), *e)).collect())
            .unwrap_or_default()
    }

    /// The entry `name` in `parent`, if held here.
    pub fn get(&self, parent: u64, name: &str) -> Option<LocalEntry> {
        self.lock().entries.get(&parent)?.get(name).copied()
    }

    /// True while file `ino` is pending (created, no size yet).
    pub fn is_pending(&self, ino: u64) -> bool {
        self.lock().pending.contains_key(&ino)
    }

    /// Takes pending file `ino` out of the pending set (its name stays
    /// listed) for the one caller that makes its drive: `None` when it is
    /// not pending (any more). Give it back with [`Local::restore_pending`]
    /// when making the drive failed.
    pub fn take_pending(&self, ino: u64) -> Option<(u64, String)> {
        self.lock().pending.remove(&ino)
    }

    /// Puts back a pending file [`Local::take_pending`] handed out.
    pub fn restore_pending(&self, ino: u64, parent: u64, name: &str) {
        self.lock().pending.insert(ino, (parent, name.to_string()));
    }

    /// Removes `name` from `parent` (and from the pending set); the entry
    /// it was, if any.
    pub fn remove(&self, parent: u64, name: &str) -> Option<LocalEntry> {
        let mut inner = self.lock();
        let names = inner.entries.get_mut(&parent)?;
        let entry = names.remove(name)?;
        if names.is_empty() {
            inner.entries.remove(&parent);
        }
        inner.pending.remove(&entry.ino);
        Some(entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_file_is_handed_out_once_and_removed_with_its_name() {
        let local = Local::default();
        local.add_pending(1, "d.vhd", 7);
        local.add_dir(1, "sub", 8);
        assert!(local.is_pending(7));
        assert_eq!(local.take_pending(7), Some((1, "d.vhd".to_string())));
        assert_eq!(local.take_pending(7), None);
        local.restore_pending(7, 1, "d.vhd");
        assert!(local.is_pending(7));
        assert_eq!(local.children(1).len(), 2);
        assert_eq!(
            local.remove(1, "d.vhd"),
            Some(LocalEntry {
                ino: 7,
                is_dir: false
            })
        );
        assert!(!local.is_pending(7));
        assert_eq!(local.get(1, "sub").map(|e| e.is_dir), Some(true));
    }
}
