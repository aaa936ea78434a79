//! The fuser shim: turns kernel requests into [`FsCore`] calls on tokio tasks.
//! It serves namespace mounts (and `create --mkfs`); an attach's private
//! mount is served by our own protocol layer, `session.rs`, with the same
//! limits defined here.
//!
//! Every handler copies what it needs from the request, moves the reply into a
//! task on the runtime and returns at once, so a slow blob never stalls the FUSE
//! thread; each task holds an [`InFlight`](super::core::InFlight) guard so
//! shutdown can wait for the last one. Errors become the errno they carry.
//!
//! Every change to the tree (mkdir, rmdir, create, unlink, rename, link,
//! symlink, mknod, setattr, setxattr, removexattr) is answered with a
//! meaning or a refusal (see `changes.rs`, `xattrs.rs`) and a refused one
//! is logged as one line. `ENOSYS` is left only where the kernel then does
//! the right thing itself: `lseek` with `SEEK_DATA`/`SEEK_HOLE` (the whole
//! file counts as data), `copy_file_range` (the caller copies through
//! reads and writes), and `bmap`, `ioctl`, `poll`; POSIX locks are not
//! negotiated, so the kernel keeps them locally and never asks.

use std::ffi::OsStr;
use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{
    Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, TimeOrNow, WriteFlags,
};
use tokio::runtime::Handle;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::backend::FsError;
use super::core::{FsCore, ATTR_TTL};
use super::xattrs::is_own_xattr;

/// Largest write the kernel sends in one request.
pub const MAX_WRITE_BYTES: u32 = 1024 * 1024;
/// Async requests (readahead, direct I/O from the loop device) the kernel keeps in flight.
pub const MAX_BACKGROUND: u16 = 128;

/// Bytes of write data that handed-off write requests may hold at once.
/// Past it the session thread waits for some to finish, and the kernel holds
/// further requests: with [`MAX_BACKGROUND`] async requests it could
/// otherwise hand over 128 MiB of writes that all wait for the same flush
/// (79 MiB were measured while writing 2 GiB with a 256 MiB cache).
pub const MAX_WRITE_DATA_IN_FLIGHT: u32 = 16 * 1024 * 1024;

/// Bytes of write data that handed-off write requests hold, bounded by
/// [`MAX_WRITE_DATA_IN_FLIGHT`]; shared by both FUSE front ends (this shim
/// and `session.rs`).
pub(crate) struct WriteBudget(Arc<Semaphore>);

impl WriteBudget {
    /// A budget of [`MAX_WRITE_DATA_IN_FLIGHT`] bytes.
    pub(crate) fn new() -> Self {
        WriteBudget(Arc::new(Semaphore::new(MAX_WRITE_DATA_IN_FLIGHT as usize)))
    }

    /// Room for `len` bytes of write data, waiting on the calling (session)
    /// thread when the budget is spent (backpressure to the kernel).
    pub(crate) fn permit(&self, runtime: &Handle, len: usize) -> OwnedSemaphorePermit {
        let n = (len as u32).clamp(1, MAX_WRITE_DATA_IN_FLIGHT);
        match self.0.clone().try_acquire_many_owned(n) {
            Ok(permit) => permit,
            Err(_) => runtime
                .block_on(self.0.clone().acquire_many_owned(n))
                .expect("the write budget is never closed"),
        }
    }
}

/// The [`Filesystem`] given to fuser.
pub struct BlobFs {
    core: Arc<FsCore>,
    runtime: Handle,
    write_budget: WriteBudget,
}

impl BlobFs {
    /// A shim that serves `core` on `runtime`.
    pub fn new(core: Arc<FsCore>, runtime: Handle) -> Self {
        BlobFs {
            core,
            runtime,
            write_budget: WriteBudget::new(),
        }
    }

    /// Room for `len` bytes of write data (see [`WriteBudget::permit`]).
    fn write_permit(&self, len: usize) -> OwnedSemaphorePermit {
        self.write_budget.permit(&self.runtime, len)
    }

    /// `C/DIR/NAME` for a log line: the name `name` in directory `parent`.
    fn child_name(&self, parent: INodeNo, name: &OsStr) -> String {
        let dir = self
            .core
            .node(parent.0)
            .map(|n| self.core.node_name(&n))
            .unwrap_or_else(|_| format!("inode {}/", parent.0));
        format!("{dir}{}", name.to_string_lossy())
    }

    /// Runs `work` on the runtime with an in-flight guard.
    fn spawn<F, Fut>(&self, work: F)
    where
        F: FnOnce(Arc<FsCore>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.core.spawn_in_flight(&self.runtime, work);
    }
}

/// Answers `getxattr`/`listxattr`: the length when asked with `size` 0,
/// the bytes when they fit, else `ERANGE`.
fn reply_xattr(reply: ReplyXattr, value: &[u8], size: u32) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if value.len() <= size as usize {
        reply.data(value);
    } else {
        reply.error(Errno::ERANGE);
    }
}

fn errno(err: &FsError) -> Errno {
    Errno::from_i32(err.errno)
}

/// Logs failures worth a line: everything but the routine "not found".
pub(crate) fn log_err(op: &str, err: &FsError) {
    if err.errno == libc::ENOENT {
        tracing::trace!(op, %err, "request failed");
    } else {
        tracing::debug!(op, %err, "request failed");
    }
}

/// Logs a change the mount refused or could not make: one line a user can
/// act on (the message names the blob and, where one would do it, the
/// command), at warning level; a routine "not found" or "exists" quieter.
fn log_change(op: &str, err: &FsError) {
    match err.errno {
        libc::ENOENT => tracing::trace!(op, %err, "change failed"),
        libc::EEXIST => tracing::debug!(op, %err, "change failed"),
        _ => tracing::warn!(op, "{err}"),
    }
}

/// A name the kernel gave, as UTF-8 (blob names are); `None` answers `EINVAL`.
fn utf8(name: &OsStr) -> Option<String> {
    name.to_str().map(str::to_string)
}

impl Filesystem for BlobFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if let Err(nearest) = config.set_max_write(MAX_WRITE_BYTES) {
            tracing::debug!(nearest, "kernel refused max_write; using its limit");
            let _ = config.set_max_write(nearest);
        }
        if let Err(nearest) = config.set_max_background(MAX_BACKGROUND) {
            let _ = config.set_max_background(nearest);
        }
        let wanted = InitFlags::FUSE_ASYNC_DIO
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2;
        if let Err(missing) = config.add_capabilities(wanted) {
            tracing::warn!(
                ?missing,
                "kernel lacks FUSE capabilities; I/O will be slower"
            );
            let _ = config.add_capabilities(wanted & !missing);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let Some(name) = name.to_str().map(str::to_string) else {
            reply.error(Errno::ENOENT);
            return;
        };
        self.spawn(move |core| async move {
            match core.lookup(parent.0, &name).await {
                Ok(attr) => reply.entry(&core.ttl(attr.ino.0), &attr, Generation(0)),
                Err(err) => {
                    log_err("lookup", &err);
                    reply.error(errno(&err))
                }
            }
        });
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.spawn(move |core| async move {
            match core.getattr(ino.0).await {
                Ok(attr) => reply.attr(&core.ttl(ino.0), &attr),
                Err(err) => reply.error(errno(&err)),
            }
        });
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let other_changes = mode.is_some()
            || uid.is_some()
            || gid.is_some()
            || atime.is_some()
            || mtime.is_some()
            || ctime.is_some();
        self.spawn(move |core| async move {
            match core.setattr(ino.0, size, other_changes).await {
                Ok(attr) => reply.attr(&core.ttl(ino.0), &attr),
                Err(err) => {
                    log_change("setattr", &err);
                    reply.error(errno(&err))
                }
            }
        });
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        let what = format!("mknod {}", self.child_name(parent, name));
        let err = self.core.refuse_change(
            &what,
            "a namespace mount holds drives and directories only; a new drive is NAME.vhd opened with O_CREAT, then given a size",
        );
        log_change("mknod", &err);
        reply.error(errno(&err));
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let Some(name) = utf8(name) else {
            return reply.error(Errno::EINVAL);
        };
        self.spawn(move |core| async move {
            match core.mkdir(parent.0, &name).await {
                Ok(attr) => reply.entry(&ATTR_TTL, &attr, Generation(0)),
                Err(err) => {
                    log_change("mkdir", &err);
                    reply.error(errno(&err))
                }
            }
        });
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let Some(name) = utf8(name) else {
            return reply.error(Errno::ENOENT);
        };
        self.spawn(move |core| async move {
            match core.rmdir(parent.0, &name).await {
                Ok(()) => reply.ok(),
                Err(err) => {
                    log_change("rmdir", &err);
                    reply.error(errno(&err))
                }
            }
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let Some(name) = utf8(name) else {
            return reply.error(Errno::ENOENT);
        };
        self.spawn(move |core| async move {
            match core.unlink(parent.0, &name).await {
                Ok(()) => reply.ok(),
                Err(err) => {
                    log_change("unlink", &err);
                    reply.error(errno(&err))
                }
            }
        });
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        let what = format!(
            "symlink {} -> {}",
            self.child_name(parent, link_name),
            target.display()
        );
        let err = self
            .core
            .refuse_change(&what, "blob storage has no symbolic links");
        log_change("symlink", &err);
        reply.error(errno(&err));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        _flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        let what = format!(
            "rename {} to {}",
            self.child_name(parent, name),
            self.child_name(newparent, newname)
        );
        let err = self.core.refuse_change(
            &what,
            "a blob's name is fixed; 'blobdrive copy C/OLD C/NEW' then 'blobdrive delete C/OLD' renames a drive",
        );
        log_change("rename", &err);
        reply.error(errno(&err));
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let target = self
            .core
            .node(ino.0)
            .map(|n| self.core.node_name(&n))
            .unwrap_or_else(|_| format!("inode {}", ino.0));
        let what = format!("link {target} as {}", self.child_name(newparent, newname));
        let err = self.core.refuse_change(
            &what,
            "blob storage has no hard links ('blobdrive copy' makes a copy)",
        );
        log_change("link", &err);
        reply.error(errno(&err));
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let Some(name) = utf8(name) else {
            return reply.error(Errno::EINVAL);
        };
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        self.spawn(move |core| async move {
            match core.create(parent.0, &name, writable).await {
                Ok((attr, fh)) => reply.created(
                    &core.ttl(attr.ino.0),
                    &attr,
                    Generation(0),
                    FileHandle(fh),
                    FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES,
                ),
                Err(err) => {
                    log_change("create", &err);
                    reply.error(errno(&err))
                }
            }
        });
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        // Answered here, with no task and no I/O, for every name but ours:
        // the kernel asks for security.capability before writes.
        let Some(name) = name
            .to_str()
            .filter(|n| is_own_xattr(n))
            .map(str::to_string)
        else {
            tracing::trace!(ino = ino.0, ?name, "getxattr: not ours, ENODATA");
            return reply.error(Errno::ENODATA);
        };
        self.spawn(move |core| async move {
            match core.getxattr(ino.0, &name).await {
                Ok(value) => reply_xattr(reply, &value, size),
                Err(err) => {
                    log_err("getxattr", &err);
                    reply.error(errno(&err))
                }
            }
        });
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.core.xattr_names(ino.0) {
            Ok(names) => reply_xattr(reply, &names, size),
            Err(err) => reply.error(errno(&err)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let err = self
            .core
            .xattr_change_refusal(ino.0, &name.to_string_lossy());
        log_change("setxattr", &err);
        reply.error(errno(&err));
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let err = self
            .core
            .xattr_change_refusal(ino.0, &name.to_string_lossy());
        log_change("removexattr", &err);
        reply.error(errno(&err));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let writable = flags.acc_mode() != OpenAccMode::O_RDONLY;
        self.spawn(move |core| async move {
            match core.open(ino.0, writable).await {
                Ok((fh, immutable)) => {
                    // Content that never changes may stay in the page cache between
                    // opens; a drive's may have changed under another handle.
                    let mut reply_flags = FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES;
                    if immutable {
                        reply_flags |= FopenFlags::FOPEN_KEEP_CACHE;
                    }
                    reply.opened(FileHandle(fh), reply_flags)
                }
                Err(err) => {
                    tracing::info!(ino = ino.0, writable, %err, "open refused");
                    reply.error(errno(&err))
                }
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.spawn(move |core| async move {
            match core.read(fh.0, offset, size).await {
                Ok(data) => reply.data(&data),
                Err(err) => {
                    tracing::warn!(offset, size, %err, "read failed");
                    reply.error(errno(&err))
                }
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let permit = self.write_permit(data.len());
        let data = data.to_vec();
        self.spawn(move |core| async move {
            let _permit = permit;
            match core.write(fh.0, offset, &data).await {
                Ok(written) => reply.written(written),
                Err(err) => {
                    tracing::warn!(offset, len = data.len(), %err, "write failed");
                    reply.error(errno(&err))
                }
            }
        });
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.spawn(move |core| async move {
            match core.flush(fh.0).await {
                Ok(()) => reply.ok(),
                Err(err) => {
                    tracing::error!(%err, "flush on close failed");
                    reply.error(errno(&err))
                }
            }
        });
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.spawn(move |core| async move {
            match core.release(fh.0).await {
                Ok(()) => reply.ok(),
                Err(err) => reply.error(errno(&err)),
            }
        });
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.spawn(move |core| async move {
            match core.fsync(fh.0).await {
                Ok(()) => reply.ok(),
                Err(err) => {
                    tracing::error!(%err, "fsync failed");
                    reply.error(errno(&err))
                }
            }
        });
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.spawn(move |core| async move {
            match core.opendir(ino.0).await {
                Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
                Err(err) => {
                    log_err("opendir", &err);
                    reply.error(errno(&err))
                }
            }
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        // Served from the handle's listing in memory: no I/O, so no task.
        let entries = match self.core.readdir(fh.0) {
            Ok(entries) => entries,
            Err(err) => return reply.error(errno(&err)),
        };
        let dots = [(".", FileType::Directory), ("..", FileType::Directory)];
        let all = dots
            .iter()
            .map(|&(name, kind)| (ino, kind, name))
            .chain(entries.iter().map(|e| {
                let kind = if e.is_dir {
                    FileType::Directory
                } else {
                    FileType::RegularFile
                };
                (INodeNo(e.ino), kind, e.name.as_str())
            }));
        for (index, (entry_ino, kind, name)) in all.enumerate().skip(offset as usize) {
            if reply.add(entry_ino, index as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.core.releasedir(fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.core.statfs();
        reply.statfs(
            s.blocks,
            0,
            0,
            s.files,
            0,
            s.block_size,
            s.name_max,
            s.block_size,
        );
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // Permission checks are the kernel's (default_permissions).
        reply.ok();
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.spawn(move |core| async move {
            match core.fallocate(fh.0, offset, length, mode).await {
                Ok(()) => reply.ok(),
                Err(err) => {
                    log_err("fallocate", &err);
                    reply.error(errno(&err))
                }
            }
        });
    }
}
