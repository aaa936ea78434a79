//! What a namespace mount makes of a change to its tree. Every operation
//! gets a meaning or a refusal with its errno and one log line (the FUSE
//! shim logs the error's message), never `ENOSYS`:
//!
//! - `mkdir` at the account's top creates a container (the service's name
//!   rules: `EINVAL`); inside a container it makes a directory of this mount
//!   only (`local.rs`), kept until a drive is made in it;
//! - `rmdir` removes an empty container (`ENOTEMPTY` while it holds a
//!   blob) or an empty directory of this mount; a directory of blob names
//!   is never empty;
//! - creating `NAME.vhd` makes a pending file of size 0; giving it a size
//!   (`truncate -s`, `fallocate -l`, `qemu-img create -f raw`) makes the
//!   drive through the catalog, as `blobdrive create` does; other names are
//!   refused (`EPERM`): only drives are made here;
//! - `rm` deletes a drive or a snapshot under `blobdrive delete`'s
//!   refusals (`EBUSY` while leased, `ENOTEMPTY` while it has snapshots,
//!   `EPERM` for a blob that is not a drive);
//! - `rename`, `link`, `symlink` and `mknod` are refused with `EPERM`: a
//!   blob's name is fixed, and a drive is a blob, not a name for one;
//! - a read-only mount answers `EROFS` to each of them.

use std::time::SystemTime;

use fuser::FileAttr;

use super::backend::{EntryKind, EntryPath, FsError, FsResult};
use super::core::{FsCore, SNAPSHOT_SEPARATOR};
use super::inodes::{Node, NodeKind};

/// The name ending of the files a namespace mount can create (drives).
pub const DRIVE_SUFFIX: &str = ".vhd";

impl FsCore {
    /// The node as a user names it in a log line: `C/B`, `C/DIR/`, `/`.
    pub fn node_name(&self, node: &Node) -> String {
        match &node.kind {
            NodeKind::Account => "/".to_string(),
            NodeKind::Dir { container, prefix } => format!("{container}/{prefix}"),
            NodeKind::File { path, .. } => path.to_string(),
        }
    }

    /// The refusal of a change on a read-only mount (`EROFS`), else of a
    /// change this mount never makes (`EPERM`), with `why`.
    pub fn refuse_change(&self, what: &str, why: &str) -> FsError {
        if self.read_only() {
            FsError::read_only(format!("{what} refused: the mount is read-only"))
        } else {
            FsError::new(libc::EPERM, format!("{what} refused: {why}"))
        }
    }

    fn refuse_if_read_only(&self, what: &str) -> FsResult<()> {
        if self.read_only() {
            return Err(FsError::read_only(format!(
                "{what} refused: the mount is read-only"
            )));
        }
        Ok(())
    }

    /// The node named `name` in directory `parent`, if any.
    async fn child(&self, parent: u64, name: &str) -> FsResult<Option<Node>> {
        let (entries, index) = self.listing(parent).await?;
        match index.get(name) {
            Some(&i) => Ok(Some(self.node(entries[i].ino)?)),
            None => Ok(None),
        }
    }

    /// `mkdir`: a container at the account's top, else a directory of this
    /// mount (see the module comment).
    pub async fn mkdir(&self, parent: u64, name: &str) -> FsResult<FileAttr> {
        let parent_node = self.node(parent)?;
        let what = format!("mkdir {}{name}", self.node_name(&parent_node));
        self.refuse_if_read_only(&what)?;
        if self.child(parent, name).await?.is_some() {
            return Err(FsError::new(libc::EEXIST, format!("{what}: it exists")));
        }
        let (kind, local) = match &parent_node.kind {
            NodeKind::Account => {
                self.catalog
                    .create_container(name)
                    .await
                    .map_err(|e| FsError::new(e.errno, format!("{what} refused: {}", e.message)))?;
                let kind = NodeKind::Dir {
                    container: name.to_string(),
                    prefix: String::new(),
                };
                (kind, false)
            }
            NodeKind::Dir { container, prefix } => {
                if name.contains(SNAPSHOT_SEPARATOR) {
                    return Err(FsError::new(
                        libc::EINVAL,
                        format!("{what} refused: '{SNAPSHOT_SEPARATOR}' marks a snapshot's time in this mount"),
                    ));
                }
                let kind = NodeKind::Dir {
                    container: container.clone(),
                    prefix: format!("{prefix}{name}/"),
                };
                (kind, true)
            }
            NodeKind::File { .. } => {
                return Err(FsError::new(
                    libc::ENOTDIR,
                    format!("{what}: not a directory"),
                ))
            }
        };
        let node = self.inodes.upsert(parent, name, kind, SystemTime::now());
        if local {
            self.local.add_dir(parent, name, node.ino);
        }
        self.forget_listing(parent);
        tracing::info!(dir = %self.node_name(&node), "directory made");
        Ok(self.attr(&node))
    }

    /// `rmdir`: an empty container is deleted, an empty directory of this
    /// mount forgotten; anything holding a name is `ENOTEMPTY`.
    pub async fn rmdir(&self, parent: u64, name: &str) -> FsResult<()> {
        let parent_node = self.node(parent)?;
        let what = format!("rmdir {}{name}", self.node_name(&parent_node));
        self.refuse_if_read_only(&what)?;
        let node = self
            .child(parent, name)
            .await?
            .ok_or_else(|| FsError::not_found(format!("{what}: no such directory")))?;
        let NodeKind::Dir { container, prefix } = &node.kind else {
            return Err(FsError::new(
                libc::ENOTDIR,
                format!("{what}: not a directory"),
            ));
        };
        self.forget_listing(node.ino);
        let (entries, _) = self.listing(node.ino).await?;
        if !entries.is_empty() {
            return Err(FsError::new(
                libc::ENOTEMPTY,
                format!("{what} refused: it holds {} names", entries.len()),
            ));
        }
        if prefix.is_empty() {
            self.catalog
                .delete_container(container)
                .await
                .map_err(|e| FsError::new(e.errno, format!("{what}: {}", e.message)))?;
        }
        self.local.remove(parent, name);
        self.forget_listing(parent);
        tracing::info!(dir = %self.node_name(&node), "directory removed");
        Ok(())
    }

    /// `create` (`open` with `O_CREAT` of a new name): a pending `NAME.vhd`
    /// of size 0, opened; its size makes the drive. Returns its attributes
    /// and handle.
    pub async fn create(
        &self,
        parent: u64,
        name: &str,
        writable: bool,
    ) -> FsResult<(FileAttr, u64)> {
        let parent_node = self.node(parent)?;
        let what = format!("creating {}{name}", self.node_name(&parent_node));
        self.refuse_if_read_only(&what)?;
        let NodeKind::Dir { container, prefix } = &parent_node.kind else {
            return Err(FsError::new(
                libc::EPERM,
                format!("{what} refused: the top of an account mount holds containers only (mkdir makes one)"),
            ));
        };
        if !name.to_ascii_lowercase().ends_with(DRIVE_SUFFIX) || name.len() <= DRIVE_SUFFIX.len() {
            return Err(FsError::new(
                libc::EPERM,
                format!("{what} refused: a namespace mount makes drives only, named NAME{DRIVE_SUFFIX} (then 'truncate -s SIZE' gives the size); other blobs are read-only here"),
            ));
        }
        if name.contains(SNAPSHOT_SEPARATOR) {
            return Err(FsError::new(
                libc::EINVAL,
                format!(
                    "{what} refused: '{SNAPSHOT_SEPARATOR}' marks a snapshot's time in this mount"
                ),
            ));
        }
        if self.child(parent, name).await?.is_some() {
            return Err(FsError::new(libc::EEXIST, format!("{what}: it exists")));
        }
        let path = EntryPath {
            container: container.clone(),
            blob: format!("{prefix}{name}"),
            snapshot: None,
        };
        let kind = NodeKind::File {
            path,
            kind: EntryKind::Drive { size_bytes: 0 },
        };
        let node = self.inodes.upsert(parent, name, kind, SystemTime::now());
        self.local.add_pending(parent, name, node.ino);
        self.forget_listing(parent);
        let (fh, _) = match self.open(node.ino, writable).await {
            Ok(opened) => opened,
            Err(err) => {
                self.local.remove(parent, name);
                return Err(err);
            }
        };
        tracing::debug!(file = %self.node_name(&node), "created; a size makes it a drive");
        Ok((self.attr(&node), fh))
    }

    /// A size given to file `node` (`truncate`): a pending file becomes a
    /// drive of that size; a drive keeps its size (`EPERM` for another).
    pub(super) async fn resize_file(&self, node: &Node, size_bytes: u64) -> FsResult<()> {
        let NodeKind::File { path, .. } = &node.kind else {
            return Err(FsError::new(libc::EISDIR, "is a directory"));
        };
        if let Some((parent, name)) = self.local.take_pending(node.ino) {
            if size_bytes == 0 {
                self.local.restore_pending(node.ino, parent, &name);
                return Ok(());
            }
            return self
                .make_drive(node.ino, parent, &name, path, size_bytes)
                .await;
        }
        let now = self.attr(node).size;
        if size_bytes != now {
            return Err(FsError::new(
                libc::EPERM,
                format!(
                    "{path}: a drive has a fixed size ({now} bytes, not {size_bytes}); 'blobdrive resize {path} --size SIZE' changes it"
                ),
            ));
        }
        Ok(())
    }

    /// `fallocate` of mode 0 (`extend`) or `KEEP_SIZE` up to `end_bytes`
    /// through handle `fh`: a pending file becomes a drive of `end_bytes`;
    /// a drive's pages are there already (nothing to do) as long as the
    /// range is inside it.
    pub(super) async fn allocate(&self, fh: u64, end_bytes: u64, extend: bool) -> FsResult<()> {
        let open = self.writable_device(fh)?;
        let (handle, _) = self.handles.get(fh)?;
        let node = self.node(handle.ino)?;
        if extend && self.local.is_pending(node.ino) {
            return self.resize_file(&node, end_bytes).await;
        }
        if extend && end_bytes > open.device.size_bytes() {
            return Err(FsError::new(
                libc::EPERM,
                format!(
                    "{}: fallocate past the end of a fixed-size drive; 'blobdrive resize' grows it",
                    self.node_name(&node)
                ),
            ));
        }
        Ok(())
    }

    /// Makes the drive of pending file `ino` (`name` in `parent`, taken out
    /// of the pending set by the caller) and moves its open handles to it.
    async fn make_drive(
        &self,
        ino: u64,
        parent: u64,
        name: &str,
        path: &EntryPath,
        size_bytes: u64,
    ) -> FsResult<()> {
        if let Err(err) = self.catalog.create_drive(path, size_bytes).await {
            self.local.restore_pending(ino, parent, name);
            return Err(err);
        }
        self.local.remove(parent, name);
        let kind = NodeKind::File {
            path: path.clone(),
            kind: EntryKind::Drive { size_bytes },
        };
        self.inodes.upsert(parent, name, kind, SystemTime::now());
        self.forget_listing(parent);
        self.handles
            .reopen_writable(&*self.catalog, ino)
            .await
            .map_err(|e| {
                FsError::new(
                    e.errno,
                    format!("{path} was created, but opening it failed: {}", e.message),
                )
            })
    }

    /// Forgets pending file `ino` once its last handle is released: it
    /// never got a size, so nothing of it exists in storage.
    pub(super) fn forget_unsized(&self, ino: u64) {
        if let Some((parent, name)) = self.local.take_pending(ino) {
            self.local.remove(parent, &name);
            self.forget_listing(parent);
            tracing::debug!(
                name,
                "created file released without a size: nothing was made"
            );
        }
    }

    /// `unlink`: deletes a drive or a snapshot through the catalog (with
    /// `blobdrive delete`'s refusals); a pending file is just forgotten.
    pub async fn unlink(&self, parent: u64, name: &str) -> FsResult<()> {
        let parent_node = self.node(parent)?;
        let what = format!("rm {}{name}", self.node_name(&parent_node));
        self.refuse_if_read_only(&what)?;
        let node = self
            .child(parent, name)
            .await?
            .ok_or_else(|| FsError::not_found(format!("{what}: no such file")))?;
        let NodeKind::File { path, .. } = &node.kind else {
            return Err(FsError::new(
                libc::EISDIR,
                format!("{what}: is a directory"),
            ));
        };
        if self.local.get(parent, name).is_some() {
            self.local.remove(parent, name);
            self.forget_listing(parent);
            return Ok(());
        }
        self.catalog.delete(path).await?;
        self.forget_listing(parent);
        tracing::info!(drive = %path, "deleted (rm)");
        Ok(())
    }
}
