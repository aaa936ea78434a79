//! The fuser shim: turns kernel requests into [`FsCore`] calls on tokio tasks.
//! It serves namespace mounts (and `create --mkfs`); an attach's private
//! mount is served by our own protocol layer, `session.rs`, with the same
//! limits defined here.
//!
//! Every handler copies what it needs from the request, moves the reply into a
//! task on the runtime and returns at once, so a slow blob never stalls the FUSE
//! thread; each task holds an [`InFlight`](super::core::InFlight) guard so
//! shutdown can wait for the last one. Errors become the errno they carry.

use std::ffi::OsStr;
use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{
    Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use tokio::runtime::Handle;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::backend::FsError;
use super::core::{FsCore, ATTR_TTL};

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

    /// Runs `work` on the runtime with an in-flight guard.
    fn spawn<F, Fut>(&self, work: F)
    where
        F: FnOnce(Arc<FsCore>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.core.spawn_in_flight(&self.runtime, work);
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

impl Filesystem for BlobFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if let Err(nearest) = config.set_max_write(MAX_WRITE_BYTES) {
            tracing::debug!(nearest, "kernel refused max_write; using its limit");
            let _ = config.set_max_write(nearest);
        }
        if let Err(nearest) = config.set_max_background(MAX_BACKGROUND) {
            let _ = config.set_max_background(nearest);
        }
        let wanted = InitFlags::FUSE_ASYNC_DIO | InitFlags::FUSE_PARALLEL_DIROPS;
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
                Ok(attr) => reply.entry(&ATTR_TTL, &attr, Generation(0)),
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
                Ok(attr) => reply.attr(&ATTR_TTL, &attr),
                Err(err) => reply.error(errno(&err)),
            }
        });
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.spawn(move |core| async move {
            match core.setattr(ino.0, size).await {
                Ok(attr) => reply.attr(&ATTR_TTL, &attr),
                Err(err) => {
                    log_err("setattr", &err);
                    reply.error(errno(&err))
                }
            }
        });
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
