//! A drive's state as read-only extended attributes, so `getfattr -d` shows
//! what `blobdrive info` reads: `user.blobdrive.lease` (`available`,
//! `leased (infinite)`, ...), `user.blobdrive.snapshots` (how many) and
//! `user.blobdrive.stored_bytes` (the bytes its page ranges hold, footer
//! included). A snapshot has only the last. Directories and blobs that are
//! not drives have none.
//!
//! Listing the names costs nothing; reading one asks the catalog (Get Blob
//! Properties, a listing for the snapshots, Get Page Ranges). Any other
//! name (`security.capability`, which the kernel asks about before writes,
//! `system.posix_acl_access`, ...) is answered `ENODATA` by the FUSE shim
//! on its own thread with no I/O ([`is_own_xattr`]). Setting or removing
//! one of these is `EPERM`; other names are not supported (`EOPNOTSUPP`).

use super::backend::{EntryKind, FsError, FsResult};
use super::core::FsCore;
use super::inodes::NodeKind;

/// The namespace of blobdrive's attributes.
pub const XATTR_PREFIX: &str = "user.blobdrive.";
/// The lease, as `info` words it.
pub const XATTR_LEASE: &str = "user.blobdrive.lease";
/// The number of snapshots.
pub const XATTR_SNAPSHOTS: &str = "user.blobdrive.snapshots";
/// The bytes the blob stores.
pub const XATTR_STORED_BYTES: &str = "user.blobdrive.stored_bytes";

/// True for a name this mount may have a value for; any other name is
/// `ENODATA` without asking the core.
pub fn is_own_xattr(name: &str) -> bool {
    name.starts_with(XATTR_PREFIX)
}

impl FsCore {
    /// The attribute names of `ino`, NUL-terminated each (`listxattr`).
    pub fn xattr_names(&self, ino: u64) -> FsResult<Vec<u8>> {
        let node = self.node(ino)?;
        let names: &[&str] = match &node.kind {
            NodeKind::File {
                path,
                kind: EntryKind::Drive { .. },
            } if !self.local.is_pending(ino) => {
                if path.snapshot.is_some() {
                    &[XATTR_STORED_BYTES]
                } else {
                    &[XATTR_LEASE, XATTR_SNAPSHOTS, XATTR_STORED_BYTES]
                }
            }
            _ => &[],
        };
        let mut out = Vec::new();
        for name in names {
            out.extend_from_slice(name.as_bytes());
            out.push(0);
        }
        Ok(out)
    }

    /// The value of attribute `name` of `ino` (`getxattr`); `ENODATA` for a
    /// name it does not have.
    pub async fn getxattr(&self, ino: u64, name: &str) -> FsResult<Vec<u8>> {
        let node = self.node(ino)?;
        let no_data = || FsError::new(libc::ENODATA, format!("no attribute {name}"));
        let NodeKind::File {
            path,
            kind: EntryKind::Drive { .. },
        } = &node.kind
        else {
            return Err(no_data());
        };
        let listed = self.xattr_names(ino)?;
        let has = listed
            .split(|b| *b == 0)
            .any(|listed_name| listed_name == name.as_bytes());
        if !has {
            return Err(no_data());
        }
        let state = self.catalog.drive_state(path).await?;
        let value = match name {
            XATTR_LEASE => state.lease.ok_or_else(no_data)?,
            XATTR_SNAPSHOTS => state.snapshots.ok_or_else(no_data)?.to_string(),
            XATTR_STORED_BYTES => state.stored_bytes.to_string(),
            _ => return Err(no_data()),
        };
        Ok(value.into_bytes())
    }

    /// The answer to `setxattr` or `removexattr` of `name` on `ino`:
    /// blobdrive's attributes are read-only (`EPERM`), others unsupported
    /// (`EOPNOTSUPP`), and a read-only mount refuses both (`EROFS`).
    pub fn xattr_change_refusal(&self, ino: u64, name: &str) -> FsError {
        let target = self
            .node(ino)
            .map(|node| self.node_name(&node))
            .unwrap_or_else(|_| format!("inode {ino}"));
        let what = format!("setting attribute {name} of {target}");
        if self.read_only() {
            return FsError::read_only(format!("{what} refused: the mount is read-only"));
        }
        if is_own_xattr(name) {
            return FsError::new(
                libc::EPERM,
                format!("{what} refused: blobdrive's attributes show the drive's state and are read-only"),
            );
        }
        FsError::new(
            libc::EOPNOTSUPP,
            format!("{what} refused: a namespace mount keeps no extended attributes"),
        )
    }
}
