//! The inode table: stable inode numbers for the names the kernel has seen.
//!
//! A node is the root, a directory (a container or a virtual directory inside
//! one), or a file (a blob or a snapshot of one). The same `(parent, name)` keeps
//! its inode number for the life of the mount, so the kernel's caches and open
//! handles stay valid across listing refreshes. Nodes are never removed: the table
//! grows with the names listed, which is bounded by the account's size.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::SystemTime;

use super::backend::{EntryKind, EntryPath};

/// Inode number of the mount's root directory.
pub const ROOT_INO: u64 = 1;

/// What an inode stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeKind {
    /// The account root: lists containers.
    Account,
    /// A container (`prefix` empty) or a virtual directory (`prefix` ends in `/`).
    Dir {
        /// Container name.
        container: String,
        /// Blob-name prefix listed by this directory.
        prefix: String,
    },
    /// A blob or a snapshot of one.
    File {
        /// Where it lives.
        path: EntryPath,
        /// Drive, raw page blob or block blob, with its size.
        kind: EntryKind,
    },
}

/// One inode.
#[derive(Debug, Clone)]
pub struct Node {
    /// Inode number.
    pub ino: u64,
    /// What it stands for.
    pub kind: NodeKind,
    /// Last-modified time shown by `stat`.
    pub modified: SystemTime,
}

impl Node {
    /// True for a snapshot, which only ever opens read-only.
    pub fn is_snapshot(&self) -> bool {
        matches!(&self.kind, NodeKind::File { path, .. } if path.snapshot.is_some())
    }
}

struct Inner {
    nodes: HashMap<u64, Node>,
    by_name: HashMap<(u64, String), u64>,
    next_ino: u64,
}

/// Inode numbers ↔ nodes, and `(parent, name)` → inode number.
pub struct InodeTable {
    inner: Mutex<Inner>,
}

impl InodeTable {
    /// A table holding only the root, which stands for `root`.
    pub fn new(root: NodeKind, mounted_at: SystemTime) -> Self {
        let root = Node {
            ino: ROOT_INO,
            kind: root,
            modified: mounted_at,
        };
        InodeTable {
            inner: Mutex::new(Inner {
                nodes: HashMap::from([(ROOT_INO, root)]),
                by_name: HashMap::new(),
                next_ino: ROOT_INO + 1,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .expect("inode table lock poisoned: a panic happened while holding it")
    }

    /// The node with this number.
    pub fn get(&self, ino: u64) -> Option<Node> {
        self.lock().nodes.get(&ino).cloned()
    }

    /// The node named `name` in `parent`, created or refreshed with `kind`.
    pub fn upsert(&self, parent: u64, name: &str, kind: NodeKind, modified: SystemTime) -> Node {
        let mut inner = self.lock();
        let key = (parent, name.to_string());
        if let Some(&ino) = inner.by_name.get(&key) {
            let node = inner
                .nodes
                .get_mut(&ino)
                .expect("by_name only holds numbers of existing nodes");
            node.kind = kind;
            node.modified = modified;
            return node.clone();
        }
        let ino = inner.next_ino;
        inner.next_ino += 1;
        let node = Node {
            ino,
            kind,
            modified,
        };
        inner.nodes.insert(ino, node.clone());
        inner.by_name.insert(key, ino);
        node
    }

    /// Number of inodes, for `statfs`.
    pub fn len(&self) -> usize {
        self.lock().nodes.len()
    }

    /// Always false: the root is always there.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Total size of the drives the table knows, for `statfs`.
    pub fn known_file_bytes(&self) -> u64 {
        self.lock()
            .nodes
            .values()
            .filter_map(|node| match &node.kind {
                NodeKind::File { path, kind } if path.snapshot.is_none() => kind.file_size(),
                _ => None,
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_name_keeps_its_inode_number_when_relisted() {
        let table = InodeTable::new(NodeKind::Account, SystemTime::UNIX_EPOCH);
        let dir = |p: &str| NodeKind::Dir {
            container: "c".into(),
            prefix: p.into(),
        };
        let a = table.upsert(ROOT_INO, "c", dir(""), SystemTime::UNIX_EPOCH);
        let b = table.upsert(ROOT_INO, "c", dir(""), SystemTime::UNIX_EPOCH);
        let other = table.upsert(a.ino, "c", dir("c/"), SystemTime::UNIX_EPOCH);
        assert_eq!(a.ino, b.ino);
        assert_ne!(a.ino, other.ino);
        assert_eq!(table.len(), 3);
    }
}
