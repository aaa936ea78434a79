//! Our own FUSE session for an attach's one-file device: opens `/dev/fuse`,
//! mounts with `mount(2)` (attaches run as root), negotiates INIT, reads
//! requests on one thread into pooled buffers and serves them from
//! [`FsCore`] on tokio tasks, each answered by one `writev(2)`.
//!
//! Why not fuser here (ARCHITECTURE.md, "FUSE layer"): a later takeover must
//! serve a connection it did not initialise, given the INIT result
//! ([`InitResult`], [`Session::new`]) instead of performing INIT, and must
//! answer requests the kernel resends (`unique` with bit 63, echoed as is).
//! Namespace mounts stay on fuser (`fuse.rs`).
//!
//! Invariants, the same as the fuser shim's: a request that may wait on I/O
//! runs on a task holding an [`InFlight`](super::core::InFlight) guard; write
//! data held by running writes is bounded by the shared write budget (the
//! reader waits when it is spent, which holds the kernel back); errors are
//! the errno of the [`FsError`](super::FsError). Every request is answered
//! exactly once through its [`Reply`]; one dropped unanswered is answered
//! `EIO` (and logged), so no kernel request can hang on a lost reply. The
//! replies go to the file the requests were read from (the kernel looks
//! them up in that file's processing queue).

use std::ffi::CString;
use std::future::Future;
use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use fuser::{FileAttr, FileType};
use tokio::runtime::Handle;

use super::core::{FsCore, ATTR_TTL};
use super::fuse::{
    log_err, WriteBudget, MAX_BACKGROUND, MAX_WRITE_BYTES, MAX_WRITE_DATA_IN_FLIGHT,
};
use super::wire::{self, init_flags, Attr, InitIn, InitOut, Kind, Op};
use super::write_log::{Record, Slot, WriteLog};

/// Size of each read buffer: the largest request (a header, `fuse_write_in`
/// and [`MAX_WRITE_BYTES`] of data) with room to spare. The kernel refuses
/// (`EINVAL`) a read into a buffer smaller than that or than 8 KiB.
pub const READ_BUFFER_BYTES: usize = MAX_WRITE_BYTES as usize + 4096;
const _: () = assert!(
    READ_BUFFER_BYTES >= wire::MIN_READ_BUFFER
        && READ_BUFFER_BYTES >= wire::IN_HEADER_LEN + wire::WRITE_IN_LEN + MAX_WRITE_BYTES as usize
);

/// Idle read buffers kept for reuse: enough for the writes the budget lets
/// run at once, plus the reader's own.
const POOL_KEEP: usize = (MAX_WRITE_DATA_IN_FLIGHT / MAX_WRITE_BYTES) as usize + 4;

/// Writes smaller than this are copied out of the read buffer (which goes
/// back to the pool at once); larger ones keep it until they are done, so
/// their data is never copied before the cache.
const KEEP_BUFFER_MIN_BYTES: usize = READ_BUFFER_BYTES / 2;

/// INIT flags asked for (those the kernel offers): the fuser shim's set,
/// `FUSE_ASYNC_READ | FUSE_BIG_WRITES | FUSE_MAX_PAGES` plus async direct
/// I/O (the loop device's requests run concurrently) and parallel dir ops.
const WANTED_FLAGS: u64 = init_flags::FUSE_ASYNC_READ
    | init_flags::FUSE_BIG_WRITES
    | init_flags::FUSE_ASYNC_DIO
    | init_flags::FUSE_PARALLEL_DIROPS
    | init_flags::FUSE_MAX_PAGES
    | init_flags::FUSE_INIT_EXT;

/// How the private FUSE mount is made.
#[derive(Debug, Clone)]
pub struct MountConfig {
    /// Source shown in `/proc/mounts`.
    pub fsname: String,
    /// Mount read-only.
    pub read_only: bool,
    /// Let other users than the mounting one in (`allow_other`).
    pub allow_other: bool,
}

/// What INIT settled for a connection; it lasts as long as the connection,
/// so a process taking the connection over is given it instead of INIT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitResult {
    /// Protocol minor the kernel speaks.
    pub kernel_minor: u32,
    /// Every flag the kernel offered.
    pub kernel_flags: u64,
    /// What was answered (flags granted, `max_write`, ...).
    pub reply: InitOut,
}

impl InitResult {
    /// True when the kernel takes `FUSE_NOTIFY_RESEND` (Linux 6.9+).
    pub fn has_resend(&self) -> bool {
        self.kernel_flags & init_flags::FUSE_HAS_RESEND != 0
    }
}

/// Opens `/dev/fuse` and mounts it at `dir`; returns the connection's file.
/// Needs CAP_SYS_ADMIN (attaches run as root); no fusermount3.
pub fn mount(dir: &Path, config: &MountConfig) -> io::Result<OwnedFd> {
    let dev: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?
        .into();
    mount_with(dev, dir, config)
}

/// Mounts the opened `/dev/fuse` file `dev` at `dir` (a holder opened it,
/// and keeps its own descriptor of the same file); returns it.
pub fn mount_with(dev: OwnedFd, dir: &Path, config: &MountConfig) -> io::Result<OwnedFd> {
    let root_mode = std::fs::metadata(dir)?.mode() & libc::S_IFMT;
    // SAFETY: getuid/getgid cannot fail and touch no memory.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut data = format!(
        "fd={},rootmode={root_mode:o},user_id={uid},group_id={gid},default_permissions",
        dev.as_raw_fd()
    );
    if config.allow_other {
        data.push_str(",allow_other");
    }
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME;
    if config.read_only {
        flags |= libc::MS_RDONLY;
    }
    let c =
        |bytes: &[u8]| CString::new(bytes).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL));
    let (source, target) = (c(config.fsname.as_bytes())?, c(dir.as_os_str().as_bytes())?);
    let (fstype, data) = (c(b"fuse.blobdrive")?, c(data.as_bytes())?);
    // SAFETY: every pointer is a NUL-terminated string alive for the call;
    // `dev` stays open until the kernel has taken its reference.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(dev)
}

/// Idle read buffers.
#[derive(Default)]
struct BufferPool {
    free: Mutex<Vec<Vec<u8>>>,
}

impl BufferPool {
    fn take(self: &Arc<Self>) -> PooledBuf {
        let reused = self.free.lock().expect("buffer pool lock poisoned").pop();
        PooledBuf {
            // Written, not just allocated: the pages are mapped before the
            // kernel copies a request into them (see `SharedMemory`, why a
            // fault during that copy at a process's death costs an EIO).
            buf: reused.unwrap_or_else(|| vec![0xff; READ_BUFFER_BYTES]),
            len: 0,
            pool: self.clone(),
        }
    }
}

/// A read buffer holding one request (`len` bytes); back to its pool on drop.
struct PooledBuf {
    buf: Vec<u8>,
    len: usize,
    pool: Arc<BufferPool>,
}

impl PooledBuf {
    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        let mut free = self.pool.free.lock().expect("buffer pool lock poisoned");
        if free.len() < POOL_KEEP {
            free.push(std::mem::take(&mut self.buf));
        }
    }
}

/// Where one request was read to: a pooled buffer, or the write log.
enum RequestBuf {
    Pooled(PooledBuf),
    /// Space in the log and the request's length.
    Log(Slot, usize),
}

impl RequestBuf {
    fn bytes(&self) -> &[u8] {
        match self {
            RequestBuf::Pooled(buf) => buf.bytes(),
            RequestBuf::Log(slot, len) => slot.bytes(*len),
        }
    }

    /// Keeps a request that changes the drive in the log (when there is
    /// one), before it is applied.
    fn keep(self, log: Option<&Arc<WriteLog>>) -> (Option<Record>, Option<PooledBuf>) {
        match (self, log) {
            (RequestBuf::Log(slot, len), Some(log)) => (Some(log.keep(slot, len)), None),
            (RequestBuf::Pooled(buf), _) => (None, Some(buf)),
            (RequestBuf::Log(..), None) => unreachable!("read into a log the session lacks"),
        }
    }
}

/// The data of a write handed to a task: copied when small, else the read
/// buffer itself, or the record in the write log.
enum WriteData {
    Copied(Vec<u8>),
    InBuffer(PooledBuf, Range<usize>),
    Logged(Record, Range<usize>),
}

impl WriteData {
    fn as_slice(&self) -> &[u8] {
        match self {
            WriteData::Copied(data) => data,
            WriteData::InBuffer(buf, range) => &buf.buf[range.clone()],
            WriteData::Logged(record, range) => &record.bytes()[range.clone()],
        }
    }

    /// The write is applied (or failed): its record, if any, says so
    /// before the reply goes out.
    fn settle(self, applied: bool) {
        if let WriteData::Logged(record, _) = self {
            record.settle(applied);
        }
    }
}

/// What a connection's owner keeps about it for a process that may take the
/// connection over: what INIT settled and the file handles the kernel holds.
pub trait ConnectionRecord: Send + Sync {
    /// INIT was answered with `init`.
    fn initialised(&self, init: &InitResult);
    /// The kernel now holds handle `fh` on node `ino`; false when it could
    /// not be recorded (the open is then refused).
    fn opened(&self, fh: u64, ino: u64, writable: bool) -> bool;
    /// The kernel released `fh`.
    fn released(&self, fh: u64);
}

/// Writes one message (header and body parts) to the connection.
fn write_message(dev: &OwnedFd, parts: &[&[u8]]) -> io::Result<()> {
    let iov: Vec<libc::iovec> = parts
        .iter()
        .map(|part| libc::iovec {
            iov_base: part.as_ptr() as *mut libc::c_void,
            iov_len: part.len(),
        })
        .collect();
    // SAFETY: each iovec points into a slice borrowed for the call; the
    // kernel only reads them. `dev` is an open file.
    let n = unsafe { libc::writev(dev.as_raw_fd(), iov.as_ptr(), iov.len() as libc::c_int) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The answer owed to one request: `Send`, answered once, from any task.
/// Dropped unanswered (a panic in its task, a forgotten path), it answers
/// `EIO` and says so in the log.
pub struct Reply {
    dev: Arc<OwnedFd>,
    unique: u64,
    opcode: u32,
    answered: bool,
}

impl Reply {
    fn new(dev: Arc<OwnedFd>, unique: u64, opcode: u32) -> Self {
        Reply {
            dev,
            unique,
            opcode,
            answered: false,
        }
    }

    /// Answers success with `body` (possibly empty).
    pub fn ok(self, body: &[u8]) {
        self.send(0, &[body]);
    }

    /// Answers the (positive) errno `errno`.
    pub fn error(self, errno: i32) {
        self.send(errno, &[]);
    }

    fn send(mut self, errno: i32, body: &[&[u8]]) {
        self.answered = true;
        self.write(errno, body);
    }

    fn write(&self, errno: i32, body: &[&[u8]]) {
        let body_len = body.iter().map(|b| b.len()).sum();
        let header = wire::out_header(self.unique, errno, body_len);
        let mut parts = Vec::with_capacity(body.len() + 1);
        parts.push(&header[..]);
        parts.extend(body.iter().copied().filter(|b| !b.is_empty()));
        match write_message(&self.dev, &parts) {
            Ok(()) => {}
            // The request was interrupted or aborted meanwhile: nothing waits.
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => {
                tracing::debug!(unique = self.unique, "reply to a request no longer waiting");
            }
            Err(err) => {
                tracing::warn!(unique = self.unique, opcode = self.opcode, %err, "cannot send a FUSE reply");
            }
        }
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if !self.answered {
            tracing::error!(
                unique = self.unique,
                opcode = self.opcode,
                "FUSE request left unanswered; answering EIO"
            );
            self.write(libc::EIO, &[]);
        }
    }
}

/// `stat` attributes of the core, on the wire.
fn wire_attr(attr: &FileAttr) -> Attr {
    Attr {
        ino: attr.ino.0,
        size: attr.size,
        blocks: attr.blocks,
        time: attr.mtime,
        kind: if attr.kind == FileType::Directory {
            Kind::Dir
        } else {
            Kind::File
        },
        perm: attr.perm,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        blksize: attr.blksize,
    }
}

/// One FUSE connection served from an [`FsCore`].
pub struct Session {
    dev: Arc<OwnedFd>,
    core: Arc<FsCore>,
    runtime: Handle,
    write_budget: WriteBudget,
    pool: Arc<BufferPool>,
    init: Option<InitResult>,
    log: Option<Arc<WriteLog>>,
    record: Option<Arc<dyn ConnectionRecord>>,
}

impl Session {
    /// Serves the connection `dev` from `core` on `runtime`. `init` is None
    /// for a fresh connection (its first request is INIT), or the result of
    /// the INIT another process answered on it.
    pub fn new(dev: OwnedFd, core: Arc<FsCore>, runtime: Handle, init: Option<InitResult>) -> Self {
        Session {
            dev: Arc::new(dev),
            core,
            runtime,
            write_budget: WriteBudget::new(),
            pool: Arc::default(),
            init,
            log: None,
            record: None,
        }
    }

    /// Reads every request into `log`, and keeps there those that change
    /// the drive until the blob has them (see `write_log.rs`).
    pub fn with_log(mut self, log: Arc<WriteLog>) -> Self {
        self.log = Some(log);
        self
    }

    /// Tells `record` what INIT settled and which handles the kernel holds.
    pub fn with_record(mut self, record: Arc<dyn ConnectionRecord>) -> Self {
        self.record = Some(record);
        self
    }

    /// Mounts `dir` ([`mount`]) and returns the session that will serve it.
    pub fn mount(
        dir: &Path,
        config: &MountConfig,
        core: Arc<FsCore>,
        runtime: Handle,
    ) -> io::Result<Self> {
        Ok(Session::new(mount(dir, config)?, core, runtime, None))
    }

    /// What INIT settled, once it has happened.
    pub fn init_result(&self) -> Option<InitResult> {
        self.init
    }

    /// Asks the kernel to queue again every request read from this
    /// connection and not answered (`FUSE_NOTIFY_RESEND`; `EINVAL` on a
    /// kernel without it, see [`InitResult::has_resend`]).
    pub fn notify_resend(&self) -> io::Result<()> {
        write_message(&self.dev, &[&wire::notify_resend()])
    }

    /// Starts the reader thread; it ends with `Ok` when the filesystem is
    /// unmounted (the kernel ends the connection).
    pub fn spawn(self) -> io::Result<std::thread::JoinHandle<io::Result<()>>> {
        std::thread::Builder::new()
            .name("fuse-session".into())
            .spawn(move || self.run())
    }

    fn run(mut self) -> io::Result<()> {
        loop {
            let (mut pooled, mut slot) = match &self.log {
                Some(log) => (None, Some(log.reserve())),
                None => (Some(self.pool.take()), None),
            };
            let (ptr, cap) = match (&mut pooled, &mut slot) {
                (Some(buf), _) => (buf.buf.as_mut_ptr(), buf.buf.len()),
                (_, Some(slot)) => (slot.as_mut_ptr(), slot.len()),
                _ => unreachable!("one buffer or the other"),
            };
            // SAFETY: the pointer and length describe a pooled buffer or
            // reserved log space, exclusively ours for the call; `dev` is
            // an open file.
            let n = unsafe { libc::read(self.dev.as_raw_fd(), ptr.cast(), cap) };
            if n < 0 {
                let err = io::Error::last_os_error();
                match err.raw_os_error() {
                    // Interrupted before we read it, or a signal: read again.
                    Some(libc::ENOENT | libc::EINTR | libc::EAGAIN) => continue,
                    Some(libc::ENODEV) => {
                        tracing::debug!("FUSE connection ended");
                        return Ok(());
                    }
                    _ => return Err(err),
                }
            }
            let buf = match (pooled, slot) {
                (Some(mut buf), _) => {
                    buf.len = n as usize;
                    RequestBuf::Pooled(buf)
                }
                (_, Some(slot)) => RequestBuf::Log(slot, n as usize),
                _ => unreachable!("one buffer or the other"),
            };
            self.handle(buf)?;
        }
    }

    /// Runs `work` on the runtime with an in-flight guard.
    fn spawn_task<F, Fut>(&self, work: F)
    where
        F: FnOnce(Arc<FsCore>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.core.spawn_in_flight(&self.runtime, work);
    }

    /// Serves one request read into `buf`. Errors end the session (INIT
    /// refused); everything else is answered.
    fn handle(&mut self, buf: RequestBuf) -> io::Result<()> {
        let req = match wire::parse(buf.bytes()) {
            Ok(req) => req,
            Err(err) => {
                tracing::warn!(%err, "malformed FUSE request");
                // Answer it if its id can be read, so nothing waits on it.
                if let Some(unique) = buf.bytes().get(8..16) {
                    let unique = u64::from_le_bytes(unique.try_into().expect("8 bytes"));
                    Reply::new(self.dev.clone(), unique, 0).error(libc::EIO);
                }
                return Ok(());
            }
        };
        let header = req.header;
        if req.op.is_unanswered() {
            return Ok(());
        }
        let reply = Reply::new(self.dev.clone(), header.unique, header.opcode);
        let ino = header.nodeid;
        if self.init.is_none() && !matches!(req.op, Op::Init(_)) {
            tracing::warn!(opcode = header.opcode, "FUSE request before INIT");
            reply.error(libc::EIO);
            return Ok(());
        }
        match req.op {
            Op::Init(init) => return self.init(reply, init),
            Op::Lookup { name } => {
                let Ok(name) = std::str::from_utf8(name).map(str::to_string) else {
                    reply.error(libc::ENOENT);
                    return Ok(());
                };
                self.spawn_task(move |core| async move {
                    match core.lookup(ino, &name).await {
                        Ok(attr) => reply.ok(&wire::entry_out(&wire_attr(&attr), ATTR_TTL)),
                        Err(err) => {
                            log_err("lookup", &err);
                            reply.error(err.errno)
                        }
                    }
                });
            }
            Op::Getattr => self.spawn_task(move |core| async move {
                match core.getattr(ino).await {
                    Ok(attr) => reply.ok(&wire::attr_out(&wire_attr(&attr), ATTR_TTL)),
                    Err(err) => reply.error(err.errno),
                }
            }),
            Op::Setattr { size } => self.spawn_task(move |core| async move {
                match core.setattr(ino, size, false).await {
                    Ok(attr) => reply.ok(&wire::attr_out(&wire_attr(&attr), ATTR_TTL)),
                    Err(err) => {
                        log_err("setattr", &err);
                        reply.error(err.errno)
                    }
                }
            }),
            Op::Open { flags } => {
                let writable = flags as i32 & libc::O_ACCMODE != libc::O_RDONLY;
                let record = self.record.clone();
                self.spawn_task(move |core| async move {
                    match core.open(ino, writable).await {
                        Ok((fh, _))
                            if record
                                .as_ref()
                                .is_some_and(|r| !r.opened(fh, ino, writable)) =>
                        {
                            tracing::error!(
                                ino,
                                "too many open handles to keep for a takeover; open refused"
                            );
                            let _ = core.release(fh).await;
                            reply.error(libc::EMFILE)
                        }
                        Ok((fh, immutable)) => {
                            // Content that never changes may stay in the page cache between
                            // opens; a drive's may have changed under another handle.
                            let mut open_flags = wire::FOPEN_PARALLEL_DIRECT_WRITES;
                            if immutable {
                                open_flags |= wire::FOPEN_KEEP_CACHE;
                            }
                            reply.ok(&wire::open_out(fh, open_flags))
                        }
                        Err(err) => {
                            tracing::info!(ino, writable, %err, "open refused");
                            reply.error(err.errno)
                        }
                    }
                });
            }
            Op::Read { fh, offset, size } => self.spawn_task(move |core| async move {
                match core.read(fh, offset, size).await {
                    Ok(data) => reply.ok(&data),
                    Err(err) => {
                        tracing::warn!(offset, size, %err, "read failed");
                        reply.error(err.errno)
                    }
                }
            }),
            Op::Write { fh, offset, data } => {
                let permit = self.write_budget.permit(&self.runtime, data.len());
                let start = data.as_ptr() as usize - buf.bytes().as_ptr() as usize;
                let range = start..start + data.len();
                let data = match buf.keep(self.log.as_ref()) {
                    (Some(record), _) => WriteData::Logged(record, range),
                    (None, Some(buf)) if range.len() >= KEEP_BUFFER_MIN_BYTES => {
                        WriteData::InBuffer(buf, range)
                    }
                    (None, Some(buf)) => WriteData::Copied(buf.bytes()[range].to_vec()),
                    (None, None) => unreachable!("a request is in a buffer or the log"),
                };
                self.spawn_task(move |core| async move {
                    let _permit = permit;
                    let result = core.write(fh, offset, data.as_slice()).await;
                    let len = data.as_slice().len();
                    data.settle(result.is_ok());
                    match result {
                        Ok(written) => reply.ok(&wire::write_out(written)),
                        Err(err) => {
                            tracing::warn!(offset, len, %err, "write failed");
                            reply.error(err.errno)
                        }
                    }
                });
            }
            Op::Flush { fh } => self.spawn_task(move |core| async move {
                match core.flush(fh).await {
                    Ok(()) => reply.ok(&[]),
                    Err(err) => {
                        tracing::error!(%err, "flush on close failed");
                        reply.error(err.errno)
                    }
                }
            }),
            Op::Release { fh } => {
                if let Some(record) = &self.record {
                    record.released(fh);
                }
                self.spawn_task(move |core| async move {
                    match core.release(fh).await {
                        Ok(()) => reply.ok(&[]),
                        Err(err) => reply.error(err.errno),
                    }
                })
            }
            Op::Fsync { fh } => self.spawn_task(move |core| async move {
                match core.fsync(fh).await {
                    Ok(()) => reply.ok(&[]),
                    Err(err) => {
                        tracing::error!(%err, "fsync failed");
                        reply.error(err.errno)
                    }
                }
            }),
            Op::Fallocate {
                fh,
                offset,
                length,
                mode,
            } => {
                let (record, _) = buf.keep(self.log.as_ref());
                self.spawn_task(move |core| async move {
                    let result = core.fallocate(fh, offset, length, mode as i32).await;
                    if let Some(record) = record {
                        record.settle(result.is_ok());
                    }
                    match result {
                        Ok(()) => reply.ok(&[]),
                        Err(err) => {
                            log_err("fallocate", &err);
                            reply.error(err.errno)
                        }
                    }
                })
            }
            Op::Statfs => {
                let s = self.core.statfs();
                reply.ok(&wire::statfs_out(
                    s.blocks,
                    s.files,
                    s.block_size,
                    s.name_max,
                ));
            }
            // Permission checks are the kernel's (default_permissions).
            Op::Access => reply.ok(&[]),
            Op::Opendir => self.spawn_task(move |core| async move {
                match core.opendir(ino).await {
                    Ok(fh) => reply.ok(&wire::open_out(fh, 0)),
                    Err(err) => {
                        log_err("opendir", &err);
                        reply.error(err.errno)
                    }
                }
            }),
            Op::Readdir { fh, offset, size } => self.readdir(reply, ino, fh, offset, size),
            Op::Releasedir { fh } => {
                self.core.releasedir(fh);
                reply.ok(&[]);
            }
            Op::Destroy => reply.ok(&[]),
            // No extended attributes: ENOSYS makes the kernel stop asking.
            Op::Getxattr | Op::Other(_) => reply.error(libc::ENOSYS),
            Op::Interrupt | Op::Forget | Op::BatchForget => {
                unreachable!("unanswered requests returned above")
            }
        }
        Ok(())
    }

    /// Served from the directory handle's listing in memory: no I/O, so no task.
    fn readdir(&self, reply: Reply, ino: u64, fh: u64, offset: u64, size: u32) {
        let entries = match self.core.readdir(fh) {
            Ok(entries) => entries,
            Err(err) => return reply.error(err.errno),
        };
        let dots = [(ino, Kind::Dir, "."), (ino, Kind::Dir, "..")];
        let all = dots.into_iter().chain(entries.iter().map(|e| {
            let kind = if e.is_dir { Kind::Dir } else { Kind::File };
            (e.ino, kind, e.name.as_str())
        }));
        let mut body = Vec::new();
        for (index, (entry_ino, kind, name)) in all.enumerate().skip(offset as usize) {
            let next = index as u64 + 1;
            if !wire::push_dirent(
                &mut body,
                size as usize,
                entry_ino,
                next,
                kind,
                name.as_bytes(),
            ) {
                break;
            }
        }
        reply.ok(&body);
    }

    /// Answers INIT: protocol 7.31 at least, the flags wanted that the
    /// kernel offers, 1 MiB writes and 128 background requests.
    fn init(&mut self, reply: Reply, init: InitIn) -> io::Result<()> {
        if self.init.is_some() {
            reply.error(libc::EIO);
            return Ok(());
        }
        if init.major > wire::FUSE_KERNEL_VERSION {
            // The kernel answers a lower major with a second INIT in it.
            let version_only = InitOut {
                major: wire::FUSE_KERNEL_VERSION,
                minor: wire::FUSE_KERNEL_MINOR_VERSION,
                max_readahead: 0,
                flags: 0,
                max_background: 0,
                congestion_threshold: 0,
                max_write: 0,
                time_gran: 0,
                max_pages: 0,
            };
            reply.ok(&version_only.encode());
            return Ok(());
        }
        if init.major < wire::FUSE_KERNEL_VERSION || init.minor < wire::MIN_KERNEL_MINOR_VERSION {
            reply.error(libc::EPROTO);
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "the kernel speaks FUSE {}.{}; blobdrive needs {}.{} or newer",
                    init.major,
                    init.minor,
                    wire::FUSE_KERNEL_VERSION,
                    wire::MIN_KERNEL_MINOR_VERSION
                ),
            ));
        }
        let missing = (init_flags::FUSE_ASYNC_DIO | init_flags::FUSE_PARALLEL_DIROPS) & !init.flags;
        if missing != 0 {
            tracing::warn!(missing = %format!("{missing:#x}"), "kernel lacks FUSE capabilities; I/O will be slower");
        }
        let page = 4096;
        let largest = MAX_WRITE_BYTES.max(init.max_readahead);
        let out = InitOut {
            major: wire::FUSE_KERNEL_VERSION,
            minor: init.minor.min(wire::FUSE_KERNEL_MINOR_VERSION),
            max_readahead: init.max_readahead,
            flags: WANTED_FLAGS & init.flags,
            max_background: MAX_BACKGROUND,
            congestion_threshold: MAX_BACKGROUND * 3 / 4,
            max_write: MAX_WRITE_BYTES,
            time_gran: 1,
            max_pages: (largest.div_ceil(page)).min(u16::MAX as u32) as u16,
        };
        let result = InitResult {
            kernel_minor: init.minor,
            kernel_flags: init.flags,
            reply: out,
        };
        // Known to a successor before the kernel hears the answer.
        if let Some(record) = &self.record {
            record.initialised(&result);
        }
        reply.ok(&out.encode());
        tracing::info!(
            protocol = %format!("7.{}", init.minor),
            flags = %format!("{:#x}", out.flags),
            resend = result.has_resend(),
            "FUSE connection initialised"
        );
        warn_request_timeout();
        self.init = Some(result);
        Ok(())
    }
}

/// What a range of the drive holds once every logged request is applied.
#[derive(Clone, Copy)]
pub enum Piece<'a> {
    /// These bytes (a slice of a write record).
    Data(&'a [u8]),
    /// Zeros, made by a FALLOCATE of this mode (punch hole or zero range).
    Zero(u32),
}

/// The final content of every range the log's COMMITTED records touch,
/// last writer winning, as non-overlapping `start -> (end, piece)`.
fn merge_records<'a>(
    records: &[super::write_log::Replayed<'a>],
) -> io::Result<std::collections::BTreeMap<u64, (u64, Piece<'a>)>> {
    let mut map: std::collections::BTreeMap<u64, (u64, Piece<'a>)> = Default::default();
    for record in records {
        let req = wire::parse(record.request).map_err(|err| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("write log record {} unreadable: {err}", record.seq),
            )
        })?;
        let (start, end, piece) = match req.op {
            Op::Write { offset, data, .. } => match offset.checked_add(data.len() as u64) {
                Some(end) => (offset, end, Piece::Data(data)),
                None => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("write log record {} ends past 2^64", record.seq),
                    ))
                }
            },
            Op::Fallocate {
                offset,
                length,
                mode,
                ..
            } if mode as i32 & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0 => {
                (offset, offset.saturating_add(length), Piece::Zero(mode))
            }
            // Plain preallocation changes no byte.
            Op::Fallocate { .. } => continue,
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "write log record {} holds opcode {}, not a write",
                        record.seq, req.header.opcode
                    ),
                ))
            }
        };
        if start >= end {
            continue;
        }
        // Cut what this record overwrites out of the ranges before it.
        let overlapping: Vec<u64> = map
            .range(..end)
            .filter(|(_, (e, _))| *e > start)
            .map(|(s, _)| *s)
            .collect();
        for s in overlapping {
            let (e, old) = map.remove(&s).expect("listed above");
            if s < start {
                let kept = match old {
                    Piece::Data(d) => Piece::Data(&d[..(start - s) as usize]),
                    zero => zero,
                };
                map.insert(s, (start, kept));
            }
            if e > end {
                let kept = match old {
                    Piece::Data(d) => Piece::Data(&d[(end - s) as usize..]),
                    zero => zero,
                };
                map.insert(end, (e, kept));
            }
        }
        map.insert(start, (end, piece));
    }
    Ok(map)
}

/// Calls `each(start, end, piece)` for what the log's COMMITTED records
/// leave each range they touch holding (last writer winning), in order of
/// `start`, without applying anything: what a salvage saves.
pub fn logged_changes(
    log: &WriteLog,
    mut each: impl FnMut(u64, u64, Piece<'_>) -> io::Result<()>,
) -> io::Result<()> {
    let records = log.committed()?;
    for (start, (end, piece)) in merge_records(&records)? {
        each(start, end, piece)?;
    }
    Ok(())
}

/// Applies what a process that died had acknowledged (the COMMITTED
/// records of `log`) to `core`, through the writable handle `fh` (an
/// attach serves one file, whichever handle a record came through).
///
/// The records are merged first, last writer winning, and each range is
/// applied once with its final content: applied one by one, an old record
/// could reach the blob (a flush pass, or a discard, which clears at once)
/// over newer data that was already durable, and a crash then would leave
/// the blob older than what an fsync had promised. Returns the bytes applied.
pub async fn replay(core: &FsCore, log: &WriteLog, fh: u64) -> io::Result<u64> {
    let records = log.committed()?;
    let merged = merge_records(&records)?;
    let mut applied = 0;
    for (start, (end, piece)) in merged {
        let result = match piece {
            Piece::Data(data) => core.write(fh, start, data).await.map(|_| ()),
            Piece::Zero(mode) => core.fallocate(fh, start, end - start, mode as i32).await,
        };
        result.map_err(|err| {
            io::Error::other(format!("replaying the write log at byte {start}: {err}"))
        })?;
        applied += end - start;
    }
    Ok(applied)
}

/// An admin-set FUSE request timeout (Linux 6.14+) would abort the
/// connection when a request waits longer: say so once.
fn warn_request_timeout() {
    for name in ["default_request_timeout", "max_request_timeout"] {
        let path = format!("/proc/sys/fs/fuse/{name}");
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        if text.trim().parse::<u64>().is_ok_and(|secs| secs > 0) {
            tracing::warn!(
                setting = %path,
                seconds = text.trim(),
                "a FUSE request timeout is set: a request waiting longer (a long flush) aborts the drive"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::memory::MemoryCatalog;
    use crate::fs::FsConfig;
    use std::os::fd::FromRawFd;

    /// A session whose "device" is one end of a seqpacket socket pair (one
    /// message per reply, as on `/dev/fuse`); returns the other end.
    fn session(runtime: &tokio::runtime::Runtime, init: Option<InitResult>) -> (Session, OwnedFd) {
        let catalog = MemoryCatalog::new();
        catalog.add_drive("c", "disk.vhd", 1 << 20);
        let config = FsConfig {
            container: Some("c".into()),
            ..FsConfig::default()
        };
        let core = Arc::new(FsCore::new(catalog, config));
        let mut fds = [0; 2];
        // SAFETY: `fds` is a valid out-array of two descriptors.
        let rc =
            unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, fds.as_mut_ptr()) };
        assert_eq!(rc, 0);
        // SAFETY: both descriptors were just created and are owned here only.
        let (ours, theirs) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        (
            Session::new(ours, core, runtime.handle().clone(), init),
            theirs,
        )
    }

    fn request(opcode: u32, unique: u64, nodeid: u64, args: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&((wire::IN_HEADER_LEN + args.len()) as u32).to_le_bytes());
        out.extend_from_slice(&opcode.to_le_bytes());
        out.extend_from_slice(&unique.to_le_bytes());
        out.extend_from_slice(&nodeid.to_le_bytes());
        out.extend_from_slice(&[0u8; 16]);
        out.extend_from_slice(args);
        out
    }

    fn write_req(offset: u64, fill: u8, len: usize) -> Vec<u8> {
        let mut args = Vec::new();
        args.extend_from_slice(&1u64.to_le_bytes());
        args.extend_from_slice(&offset.to_le_bytes());
        args.extend_from_slice(&(len as u32).to_le_bytes());
        args.extend_from_slice(&[0u8; 20]);
        args.extend(std::iter::repeat_n(fill, len));
        request(wire::opcode::FUSE_WRITE, 9, 3, &args)
    }

    fn discard_req(offset: u64, length: u64, mode: u32) -> Vec<u8> {
        let mut args = Vec::new();
        args.extend_from_slice(&1u64.to_le_bytes());
        args.extend_from_slice(&offset.to_le_bytes());
        args.extend_from_slice(&length.to_le_bytes());
        args.extend_from_slice(&mode.to_le_bytes());
        args.extend_from_slice(&[0u8; 4]);
        request(wire::opcode::FUSE_FALLOCATE, 9, 3, &args)
    }

    /// The drive's bytes 0..len after applying a merged map to zeros.
    fn image(map: &std::collections::BTreeMap<u64, (u64, Piece<'_>)>, len: usize) -> Vec<u8> {
        let mut out = vec![0xeeu8; len];
        for (start, (end, piece)) in map {
            let (s, e) = (*start as usize, *end as usize);
            match piece {
                Piece::Data(d) => out[s..e].copy_from_slice(d),
                Piece::Zero(_) => out[s..e].fill(0),
            }
        }
        out
    }

    #[test]
    fn the_replay_applies_each_range_once_with_its_last_content() {
        let reqs = [
            write_req(0, 1, 8192),
            discard_req(4096, 8192, 0x3),
            write_req(6144, 2, 1024),
            write_req(2048, 3, 1024),
            discard_req(0, 512, 0x0), // preallocation: changes nothing
        ];
        let records: Vec<super::super::write_log::Replayed<'_>> = reqs
            .iter()
            .enumerate()
            .map(|(i, r)| super::super::write_log::Replayed {
                seq: i as u64 + 1,
                request: r,
            })
            .collect();
        let map = merge_records(&records).unwrap();
        // Applied in order, one by one, the requests give this image.
        let mut expect = vec![0xeeu8; 12288];
        expect[..8192].fill(1);
        expect[4096..12288].fill(0);
        expect[6144..7168].fill(2);
        expect[2048..3072].fill(3);
        assert_eq!(image(&map, 12288), expect);
        // No two ranges overlap, so each byte is applied once.
        let mut last_end = 0;
        for (start, (end, _)) in &map {
            assert!(*start >= last_end && end > start);
            last_end = *end;
        }
    }

    fn feed(session: &mut Session, bytes: &[u8]) -> io::Result<()> {
        let mut buf = session.pool.take();
        buf.buf[..bytes.len()].copy_from_slice(bytes);
        buf.len = bytes.len();
        session.handle(RequestBuf::Pooled(buf))
    }

    /// The next reply: (unique, error, body).
    fn answer(peer: &OwnedFd) -> (u64, i32, Vec<u8>) {
        let mut buf = vec![0u8; 4096];
        // SAFETY: `buf` is writable for its length; `peer` is open.
        let n = unsafe { libc::read(peer.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        assert!(n >= wire::OUT_HEADER_LEN as isize, "no reply");
        buf.truncate(n as usize);
        let len = u32::from_le_bytes(buf[0..4].try_into().unwrap()) as usize;
        assert_eq!(len, buf.len(), "out header len is the message length");
        let error = i32::from_le_bytes(buf[4..8].try_into().unwrap());
        let unique = u64::from_le_bytes(buf[8..16].try_into().unwrap());
        (unique, error, buf[16..].to_vec())
    }

    fn init_args(minor: u32, flags: u64) -> Vec<u8> {
        let mut args = Vec::new();
        for v in [
            7,
            minor,
            131072,
            flags as u32 | init_flags::FUSE_INIT_EXT as u32,
            (flags >> 32) as u32,
        ] {
            args.extend_from_slice(&v.to_le_bytes());
        }
        args.resize(64, 0);
        args
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn init_is_answered_and_recorded_with_the_kernels_resend_support() {
        let rt = runtime();
        let (mut s, peer) = session(&rt, None);
        let offered = 0x5fd73fffffb_u64; // Linux 6.18's INIT flags
        feed(
            &mut s,
            &request(wire::opcode::FUSE_INIT, 2, 0, &init_args(45, offered)),
        )
        .unwrap();
        let (unique, error, body) = answer(&peer);
        assert_eq!((unique, error, body.len()), (2, 0, 64));
        let init = s.init_result().expect("recorded");
        assert!(init.has_resend());
        assert_eq!(init.reply.max_write, MAX_WRITE_BYTES);
        assert_eq!(init.reply.max_pages, 256);
        assert_ne!(init.reply.flags & init_flags::FUSE_ASYNC_DIO, 0);
        assert_eq!(
            init.reply.flags & init_flags::FUSE_HAS_RESEND,
            0,
            "only a kernel flag"
        );
    }

    #[test]
    fn an_old_kernel_is_refused_and_requests_before_init_get_eio() {
        let rt = runtime();
        let (mut s, peer) = session(&rt, None);
        feed(&mut s, &request(wire::opcode::FUSE_STATFS, 3, 1, &[])).unwrap();
        assert_eq!(answer(&peer), (3, -libc::EIO, Vec::new()));
        let err = feed(
            &mut s,
            &request(wire::opcode::FUSE_INIT, 4, 0, &init_args(30, 0)),
        )
        .unwrap_err();
        assert!(err.to_string().contains("needs 7.31"), "{err}");
        assert_eq!(answer(&peer).1, -libc::EPROTO);
    }

    #[test]
    fn a_resent_request_is_answered_with_the_same_unique() {
        let rt = runtime();
        let init = {
            let (mut s, peer) = session(&rt, None);
            feed(
                &mut s,
                &request(wire::opcode::FUSE_INIT, 2, 0, &init_args(45, 0)),
            )
            .unwrap();
            answer(&peer);
            s.init_result()
        };
        // A taken-over connection: given the INIT result, no INIT.
        let (mut s, peer) = session(&rt, init);
        let unique = 18 | wire::FUSE_UNIQUE_RESEND;
        feed(
            &mut s,
            &request(wire::opcode::FUSE_GETATTR, unique, 1, &[0u8; 16]),
        )
        .unwrap();
        let (got, error, body) = answer(&peer);
        assert_eq!((got, error, body.len()), (unique, 0, 104));
        feed(
            &mut s,
            &request(
                wire::opcode::FUSE_LOOKUP,
                7 | wire::FUSE_UNIQUE_RESEND,
                1,
                b"disk.vhd\0",
            ),
        )
        .unwrap();
        let (got, error, body) = answer(&peer);
        assert_eq!((got, error), (7 | wire::FUSE_UNIQUE_RESEND, 0));
        assert_eq!(
            u64::from_le_bytes(body[0..8].try_into().unwrap()),
            2,
            "the drive's node id"
        );
    }

    #[test]
    fn writes_and_reads_round_trip_and_unknown_ops_get_enosys() {
        let rt = runtime();
        let (mut s, peer) = session(&rt, None);
        feed(
            &mut s,
            &request(wire::opcode::FUSE_INIT, 1, 0, &init_args(45, 0)),
        )
        .unwrap();
        answer(&peer);
        feed(
            &mut s,
            &request(wire::opcode::FUSE_LOOKUP, 2, 1, b"disk.vhd\0"),
        )
        .unwrap();
        answer(&peer);
        let mut open = (libc::O_RDWR as u32).to_le_bytes().to_vec();
        open.extend_from_slice(&[0u8; 4]);
        feed(&mut s, &request(wire::opcode::FUSE_OPEN, 3, 2, &open)).unwrap();
        let (_, error, body) = answer(&peer);
        assert_eq!(error, 0);
        let fh = u64::from_le_bytes(body[0..8].try_into().unwrap());
        // One large write (kept in its buffer) and one small one (copied).
        for (unique, offset, len) in [(4u64, 0u64, 768 * 1024usize), (5, 4096, 512)] {
            let mut args = Vec::new();
            args.extend_from_slice(&fh.to_le_bytes());
            args.extend_from_slice(&offset.to_le_bytes());
            args.extend_from_slice(&(len as u32).to_le_bytes());
            args.extend_from_slice(&[0u8; 20]);
            args.extend(std::iter::repeat_n(unique as u8, len));
            feed(&mut s, &request(wire::opcode::FUSE_WRITE, unique, 2, &args)).unwrap();
            let (got, error, body) = answer(&peer);
            assert_eq!((got, error), (unique, 0));
            assert_eq!(
                u32::from_le_bytes(body[0..4].try_into().unwrap()) as usize,
                len
            );
        }
        let mut read = Vec::new();
        read.extend_from_slice(&fh.to_le_bytes());
        read.extend_from_slice(&4000u64.to_le_bytes());
        read.extend_from_slice(&200u32.to_le_bytes());
        read.extend_from_slice(&[0u8; 20]);
        feed(&mut s, &request(wire::opcode::FUSE_READ, 6, 2, &read)).unwrap();
        let (_, error, body) = answer(&peer);
        assert_eq!(error, 0);
        assert_eq!(&body[..96], &[4u8; 96][..]);
        assert_eq!(&body[96..], &[5u8; 104][..]);
        feed(
            &mut s,
            &request(
                wire::opcode::FUSE_GETXATTR,
                7,
                2,
                b"\0\0\0\0\0\0\0\0security.capability\0",
            ),
        )
        .unwrap();
        assert_eq!(answer(&peer), (7, -libc::ENOSYS, Vec::new()));
        feed(&mut s, &request(52, 8, 2, &[0u8; 24])).unwrap();
        assert_eq!(answer(&peer).1, -libc::ENOSYS);
        // FORGET gets no reply: the next reply is STATFS's.
        feed(&mut s, &request(wire::opcode::FUSE_FORGET, 9, 2, &[0u8; 8])).unwrap();
        feed(&mut s, &request(wire::opcode::FUSE_STATFS, 10, 1, &[])).unwrap();
        assert_eq!(answer(&peer).0, 10);
    }

    #[test]
    fn a_reply_dropped_unanswered_answers_eio() {
        let rt = runtime();
        let (s, peer) = session(&rt, None);
        drop(Reply::new(s.dev.clone(), 11, wire::opcode::FUSE_READ));
        assert_eq!(answer(&peer), (11, -libc::EIO, Vec::new()));
    }
}
