//! A catalog that shows exactly one drive: the private FUSE mount behind
//! `blobdrive mount C/B DIR`.
//!
//! The FUSE root is the drive's container; the drive keeps its real name
//! (`a/b/disk.vhd`, or `disk.vhd@<time>` for a snapshot) so stats and logs name
//! the real blob, and nothing else of the container is listed: attaching a
//! drive never lists a container of thousands of blobs or reads their footers.
//! Opens go to the wrapped catalog (the real one), so leases, caching and
//! errors are exactly those of a namespace mount.

use std::sync::Arc;

use async_trait::async_trait;

use super::backend::{Catalog, Device, DirEntry, EntryKind, EntryPath, FsError, FsResult};
use super::core::SNAPSHOT_SEPARATOR;

/// One drive (or one snapshot of it) and nothing else.
pub struct OneDriveCatalog {
    inner: Arc<dyn Catalog>,
    drive: EntryPath,
    size_bytes: u64,
}

impl OneDriveCatalog {
    /// Shows `drive` (a disk of `size_bytes`) from `inner`, which opens it.
    pub fn new(inner: Arc<dyn Catalog>, drive: EntryPath, size_bytes: u64) -> Self {
        OneDriveCatalog {
            inner,
            drive,
            size_bytes,
        }
    }

    /// The drive file's path relative to the FUSE root (the container):
    /// the blob name, with `@<time>` for a snapshot.
    pub fn file_name(&self) -> String {
        relative_file_name(&self.drive)
    }
}

/// The node id of the `depth`-th component (0-based) of the drive's path
/// below the FUSE root: 2, 3, ... in order, the drive file last. Fixed by the
/// attach spec alone: this catalog lists exactly one entry per directory, so
/// the inode table numbers the path in this order in any process, whatever
/// the kernel looked up first. A process taking an attach's connection over
/// resolves the kernel's ids by walking the same path.
pub fn node_id_at_depth(depth: usize) -> u64 {
    super::inodes::ROOT_INO + 1 + depth as u64
}

/// Where the drive `path` appears below a FUSE root at its container.
pub fn relative_file_name(path: &EntryPath) -> String {
    match &path.snapshot {
        Some(time) => format!("{}{SNAPSHOT_SEPARATOR}{time}", path.blob),
        None => path.blob.clone(),
    }
}

#[async_trait]
impl Catalog for OneDriveCatalog {
    async fn list_containers(&self) -> FsResult<Vec<String>> {
        Ok(vec![self.drive.container.clone()])
    }

    async fn list_dir(&self, container: &str, prefix: &str) -> FsResult<Vec<DirEntry>> {
        if container != self.drive.container {
            return Ok(Vec::new());
        }
        let Some(rest) = self.drive.blob.strip_prefix(prefix) else {
            return Ok(Vec::new());
        };
        let entry = match rest.split_once('/') {
            Some((dir, _)) => DirEntry {
                name: dir.to_string(),
                kind: EntryKind::Dir,
                snapshot: None,
                modified: None,
            },
            None => DirEntry {
                name: rest.to_string(),
                kind: EntryKind::Drive {
                    size_bytes: self.size_bytes,
                },
                snapshot: self.drive.snapshot.clone(),
                modified: None,
            },
        };
        Ok(vec![entry])
    }

    async fn open(&self, path: &EntryPath, writable: bool) -> FsResult<Arc<dyn Device>> {
        if *path != self.drive {
            return Err(FsError::not_found(format!(
                "{path} is not the attached drive"
            )));
        }
        self.inner.open(path, writable).await
    }

    async fn drive_state(&self, path: &EntryPath) -> FsResult<super::backend::DriveState> {
        self.inner.drive_state(path).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nothing;

    #[async_trait]
    impl Catalog for Nothing {
        async fn list_containers(&self) -> FsResult<Vec<String>> {
            Ok(Vec::new())
        }
        async fn list_dir(&self, _: &str, _: &str) -> FsResult<Vec<DirEntry>> {
            Ok(Vec::new())
        }
        async fn open(&self, path: &EntryPath, _: bool) -> FsResult<Arc<dyn Device>> {
            Err(FsError::io(format!("opened {path}")))
        }
    }

    fn catalog(blob: &str, snapshot: Option<&str>) -> OneDriveCatalog {
        let drive = EntryPath {
            container: "c".into(),
            blob: blob.into(),
            snapshot: snapshot.map(str::to_string),
        };
        OneDriveCatalog::new(Arc::new(Nothing), drive, 1 << 20)
    }

    #[tokio::test]
    async fn only_the_drive_and_its_parent_directories_are_listed() {
        let c = catalog("a/b/disk.vhd", None);
        let root = c.list_dir("c", "").await.unwrap();
        assert_eq!(root.len(), 1);
        assert_eq!((root[0].name.as_str(), root[0].kind), ("a", EntryKind::Dir));
        let leaf = c.list_dir("c", "a/b/").await.unwrap();
        assert_eq!(leaf[0].name, "disk.vhd");
        assert_eq!(
            leaf[0].kind,
            EntryKind::Drive {
                size_bytes: 1 << 20
            }
        );
        assert!(c.list_dir("c", "x/").await.unwrap().is_empty());
        assert!(c.list_dir("other", "").await.unwrap().is_empty());
        assert_eq!(c.file_name(), "a/b/disk.vhd");
    }

    #[tokio::test]
    async fn node_ids_follow_the_drive_path_whatever_is_looked_up_first() {
        use crate::fs::{FsConfig, FsCore};
        let core = FsCore::new(
            Arc::new(catalog("a/b/disk.vhd", None)),
            FsConfig {
                container: Some("c".into()),
                ..FsConfig::default()
            },
        );
        assert!(core.lookup(1, "elsewhere").await.is_err());
        let mut ino = 1;
        for (depth, part) in ["a", "b", "disk.vhd"].into_iter().enumerate() {
            ino = core.lookup(ino, part).await.unwrap().ino.0;
            assert_eq!(ino, node_id_at_depth(depth));
        }
        assert_eq!(ino, 4);
    }

    #[tokio::test]
    async fn a_snapshot_is_listed_as_name_at_time_and_other_blobs_do_not_open() {
        let c = catalog("disk.vhd", Some("2026-01-01T00:00:00.0000000Z"));
        let root = c.list_dir("c", "").await.unwrap();
        assert_eq!(
            root[0].snapshot.as_deref(),
            Some("2026-01-01T00:00:00.0000000Z")
        );
        assert_eq!(c.file_name(), "disk.vhd@2026-01-01T00:00:00.0000000Z");
        let base = EntryPath {
            container: "c".into(),
            blob: "disk.vhd".into(),
            snapshot: None,
        };
        let err = c.open(&base, false).await.err().expect("refused");
        assert_eq!(err.errno, libc::ENOENT);
    }
}
