//! The FUSE wire protocol, as far as an attach's one-file device needs it:
//! the kernel's structs, opcodes and flags (named as in
//! `include/uapi/linux/fuse.h`), parsing of requests and encoding of replies.
//!
//! Fields are in the host's byte order, which is little-endian on every
//! target blobdrive builds for (checked below), and laid out as the kernel's
//! `#[repr(C)]` structs, read and written field by field: no struct is ever
//! transmuted. Parsing never trusts a length from the wire: the
//! header's `len` must match the bytes actually read, and every field is read
//! through a bounds-checked cursor, so a short or oversized request is an
//! error, never a panic or an out-of-bounds read.

use std::time::{Duration, SystemTime};

#[cfg(target_endian = "big")]
compile_error!("the FUSE wire code reads and writes little-endian fields");

/// Protocol major version spoken (`FUSE_KERNEL_VERSION`).
pub const FUSE_KERNEL_VERSION: u32 = 7;
/// Newest protocol minor this layer knows (`FUSE_KERNEL_MINOR_VERSION`, Linux 6.18).
pub const FUSE_KERNEL_MINOR_VERSION: u32 = 45;
/// Oldest protocol minor accepted: 7.31 has every field of `fuse_init_out`
/// used here (`max_pages`, `map_alignment`) and the 40-byte `fuse_write_in`.
pub const MIN_KERNEL_MINOR_VERSION: u32 = 31;

/// Bit the kernel ORs into `unique` of a request it sends again after
/// `FUSE_NOTIFY_RESEND`; the reply must echo the whole value.
pub const FUSE_UNIQUE_RESEND: u64 = 1 << 63;

/// `enum fuse_opcode` values, by their kernel names.
pub mod opcode {
    pub const FUSE_LOOKUP: u32 = 1;
    pub const FUSE_FORGET: u32 = 2;
    pub const FUSE_GETATTR: u32 = 3;
    pub const FUSE_SETATTR: u32 = 4;
    pub const FUSE_OPEN: u32 = 14;
    pub const FUSE_READ: u32 = 15;
    pub const FUSE_WRITE: u32 = 16;
    pub const FUSE_STATFS: u32 = 17;
    pub const FUSE_RELEASE: u32 = 18;
    pub const FUSE_FSYNC: u32 = 20;
    pub const FUSE_GETXATTR: u32 = 22;
    pub const FUSE_FLUSH: u32 = 25;
    pub const FUSE_INIT: u32 = 26;
    pub const FUSE_OPENDIR: u32 = 27;
    pub const FUSE_READDIR: u32 = 28;
    pub const FUSE_RELEASEDIR: u32 = 29;
    pub const FUSE_ACCESS: u32 = 34;
    pub const FUSE_INTERRUPT: u32 = 36;
    pub const FUSE_DESTROY: u32 = 38;
    pub const FUSE_BATCH_FORGET: u32 = 42;
    pub const FUSE_FALLOCATE: u32 = 43;
}

/// `enum fuse_notify_code`: `FUSE_NOTIFY_RESEND` asks the kernel to queue
/// again every request read and not yet answered.
pub const FUSE_NOTIFY_RESEND: i32 = 7;

/// `fuse_init_in.flags` / `fuse_init_out.flags` bits (the upper 32 in `flags2`).
pub mod init_flags {
    pub const FUSE_ASYNC_READ: u64 = 1 << 0;
    pub const FUSE_BIG_WRITES: u64 = 1 << 5;
    pub const FUSE_ASYNC_DIO: u64 = 1 << 15;
    pub const FUSE_PARALLEL_DIROPS: u64 = 1 << 18;
    pub const FUSE_MAX_PAGES: u64 = 1 << 22;
    pub const FUSE_INIT_EXT: u64 = 1 << 30;
    pub const FUSE_HAS_RESEND: u64 = 1 << 39;
}

/// `fuse_open_out.open_flags`: the page cache may be kept between opens.
pub const FOPEN_KEEP_CACHE: u32 = 1 << 1;
/// `fuse_open_out.open_flags`: direct writes to the file may run in parallel.
pub const FOPEN_PARALLEL_DIRECT_WRITES: u32 = 1 << 6;
/// `fuse_setattr_in.valid`: `size` is set.
pub const FATTR_SIZE: u32 = 1 << 3;

/// Size of `struct fuse_in_header`.
pub const IN_HEADER_LEN: usize = 40;
/// Size of `struct fuse_out_header`.
pub const OUT_HEADER_LEN: usize = 16;
/// Size of `struct fuse_write_in` (the most a request puts before its data).
pub const WRITE_IN_LEN: usize = 40;
/// Smallest read buffer the kernel accepts (`FUSE_MIN_READ_BUFFER`).
pub const MIN_READ_BUFFER: usize = 8192;

/// Why a request could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Fewer bytes than a header.
    #[error("request of {0} bytes is shorter than its header")]
    ShortHeader(usize),
    /// The header's `len` disagrees with the bytes read.
    #[error("request header says {said} bytes, {read} were read")]
    BadLength {
        /// `fuse_in_header.len`.
        said: u32,
        /// Bytes the read returned.
        read: usize,
    },
    /// An argument runs past the end of the request.
    #[error("opcode {opcode}: arguments truncated")]
    Truncated {
        /// The request's opcode.
        opcode: u32,
    },
}

/// `struct fuse_in_header`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InHeader {
    /// Bytes of the whole request.
    pub len: u32,
    /// What is asked.
    pub opcode: u32,
    /// Request id, echoed by the reply (bit 63 set on a resend).
    pub unique: u64,
    /// Node the request is about.
    pub nodeid: u64,
    /// Caller's uid.
    pub uid: u32,
    /// Caller's gid.
    pub gid: u32,
    /// Caller's pid.
    pub pid: u32,
    /// Extensions after the arguments, in 8-byte units.
    pub total_extlen: u16,
}

/// Bounds-checked little-endian reader over a request's arguments.
struct Cursor<'a> {
    buf: &'a [u8],
    opcode: u32,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.buf.len() < n {
            return Err(WireError::Truncated {
                opcode: self.opcode,
            });
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    /// A NUL-terminated name (without its NUL).
    fn name(&mut self) -> Result<&'a [u8], WireError> {
        let end = self
            .buf
            .iter()
            .position(|&b| b == 0)
            .ok_or(WireError::Truncated {
                opcode: self.opcode,
            })?;
        let name = &self.buf[..end];
        self.buf = &self.buf[end + 1..];
        Ok(name)
    }

    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }
}

/// `struct fuse_init_in` (the fields used).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitIn {
    /// Kernel's protocol major.
    pub major: u32,
    /// Kernel's protocol minor.
    pub minor: u32,
    /// Largest readahead the kernel does.
    pub max_readahead: u32,
    /// What the kernel supports: `flags`, plus `flags2 << 32` with `FUSE_INIT_EXT`.
    pub flags: u64,
}

/// One kernel request, parsed; borrowed fields point into the read buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op<'a> {
    /// `FUSE_INIT`.
    Init(InitIn),
    /// `FUSE_LOOKUP` of `name` in the header's node.
    Lookup {
        /// Name looked up (bytes, no NUL).
        name: &'a [u8],
    },
    /// `FUSE_GETATTR`.
    Getattr,
    /// `FUSE_SETATTR`; only the size matters here.
    Setattr {
        /// New size when `FATTR_SIZE` is set.
        size: Option<u64>,
    },
    /// `FUSE_OPEN` with `open(2)` flags.
    Open {
        /// `open(2)` flags.
        flags: u32,
    },
    /// `FUSE_READ`.
    Read {
        /// File handle.
        fh: u64,
        /// Byte offset.
        offset: u64,
        /// Bytes asked.
        size: u32,
    },
    /// `FUSE_WRITE`; `data` is exactly `fuse_write_in.size` bytes.
    Write {
        /// File handle.
        fh: u64,
        /// Byte offset.
        offset: u64,
        /// The bytes to write.
        data: &'a [u8],
    },
    /// `FUSE_FLUSH` (a `close(2)`).
    Flush {
        /// File handle.
        fh: u64,
    },
    /// `FUSE_RELEASE` (the last close).
    Release {
        /// File handle.
        fh: u64,
    },
    /// `FUSE_FSYNC`.
    Fsync {
        /// File handle.
        fh: u64,
    },
    /// `FUSE_FALLOCATE`.
    Fallocate {
        /// File handle.
        fh: u64,
        /// Byte offset.
        offset: u64,
        /// Bytes.
        length: u64,
        /// `fallocate(2)` mode.
        mode: u32,
    },
    /// `FUSE_STATFS`.
    Statfs,
    /// `FUSE_GETXATTR`.
    Getxattr,
    /// `FUSE_ACCESS`.
    Access,
    /// `FUSE_OPENDIR`.
    Opendir,
    /// `FUSE_READDIR`.
    Readdir {
        /// Directory handle.
        fh: u64,
        /// Entries to skip (the `off` of the last entry returned).
        offset: u64,
        /// Largest reply body.
        size: u32,
    },
    /// `FUSE_RELEASEDIR`.
    Releasedir {
        /// Directory handle.
        fh: u64,
    },
    /// `FUSE_INTERRUPT` (never answered).
    Interrupt,
    /// `FUSE_FORGET` (never answered).
    Forget,
    /// `FUSE_BATCH_FORGET` (never answered).
    BatchForget,
    /// `FUSE_DESTROY`.
    Destroy,
    /// Anything else (answered `ENOSYS`).
    Other(u32),
}

impl Op<'_> {
    /// True for the requests the kernel expects no reply to.
    pub fn is_unanswered(&self) -> bool {
        matches!(self, Op::Interrupt | Op::Forget | Op::BatchForget)
    }
}

/// A parsed request: its header and what it asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request<'a> {
    /// The header (its `unique` goes into the reply).
    pub header: InHeader,
    /// The operation and its arguments.
    pub op: Op<'a>,
}

/// Parses the header of `buf`, the bytes one `read(2)` of `/dev/fuse` gave.
pub fn parse_header(buf: &[u8]) -> Result<InHeader, WireError> {
    if buf.len() < IN_HEADER_LEN {
        return Err(WireError::ShortHeader(buf.len()));
    }
    let mut c = Cursor { buf, opcode: 0 };
    let header = InHeader {
        len: c.u32()?,
        opcode: c.u32()?,
        unique: c.u64()?,
        nodeid: c.u64()?,
        uid: c.u32()?,
        gid: c.u32()?,
        pid: c.u32()?,
        total_extlen: c.u16()?,
    };
    if header.len as usize != buf.len() {
        return Err(WireError::BadLength {
            said: header.len,
            read: buf.len(),
        });
    }
    Ok(header)
}

/// Parses one request: `buf` must be exactly what one read returned.
pub fn parse(buf: &[u8]) -> Result<Request<'_>, WireError> {
    use opcode::*;
    let header = parse_header(buf)?;
    let opcode = header.opcode;
    // Extensions (security context, supplementary groups) follow the
    // arguments; none is asked for, but a kernel may still add them.
    let ext = header.total_extlen as usize * 8;
    let args_end = buf
        .len()
        .checked_sub(ext)
        .filter(|&end| end >= IN_HEADER_LEN)
        .ok_or(WireError::Truncated { opcode })?;
    let mut c = Cursor {
        buf: &buf[IN_HEADER_LEN..args_end],
        opcode,
    };
    let op = match opcode {
        FUSE_INIT => {
            let major = c.u32()?;
            let minor = c.u32()?;
            let max_readahead = c.u32()?;
            let mut flags = c.u32()? as u64;
            if flags & init_flags::FUSE_INIT_EXT != 0 {
                flags |= (c.u32()? as u64) << 32;
            }
            Op::Init(InitIn {
                major,
                minor,
                max_readahead,
                flags,
            })
        }
        FUSE_LOOKUP => Op::Lookup { name: c.name()? },
        FUSE_GETATTR => Op::Getattr,
        FUSE_SETATTR => {
            let valid = c.u32()?;
            let _padding = c.u32()?;
            let _fh = c.u64()?;
            let size = c.u64()?;
            Op::Setattr {
                size: (valid & FATTR_SIZE != 0).then_some(size),
            }
        }
        FUSE_OPEN => Op::Open { flags: c.u32()? },
        FUSE_READ => Op::Read {
            fh: c.u64()?,
            offset: c.u64()?,
            size: c.u32()?,
        },
        FUSE_WRITE => {
            let fh = c.u64()?;
            let offset = c.u64()?;
            let size = c.u32()? as usize;
            c.take(WRITE_IN_LEN - 20)?;
            let data = c.rest();
            if data.len() != size {
                return Err(WireError::Truncated { opcode });
            }
            Op::Write { fh, offset, data }
        }
        FUSE_FLUSH => Op::Flush { fh: c.u64()? },
        FUSE_RELEASE => Op::Release { fh: c.u64()? },
        FUSE_FSYNC => Op::Fsync { fh: c.u64()? },
        FUSE_FALLOCATE => Op::Fallocate {
            fh: c.u64()?,
            offset: c.u64()?,
            length: c.u64()?,
            mode: c.u32()?,
        },
        FUSE_STATFS => Op::Statfs,
        FUSE_GETXATTR => Op::Getxattr,
        FUSE_ACCESS => Op::Access,
        FUSE_OPENDIR => Op::Opendir,
        FUSE_READDIR => Op::Readdir {
            fh: c.u64()?,
            offset: c.u64()?,
            size: c.u32()?,
        },
        FUSE_RELEASEDIR => Op::Releasedir { fh: c.u64()? },
        FUSE_INTERRUPT => Op::Interrupt,
        FUSE_FORGET => Op::Forget,
        FUSE_BATCH_FORGET => Op::BatchForget,
        FUSE_DESTROY => Op::Destroy,
        other => Op::Other(other),
    };
    Ok(Request { header, op })
}

/// `struct fuse_out_header` of a reply with `body_len` bytes after it; `errno`
/// is positive (0 for success) and goes on the wire negated.
pub fn out_header(unique: u64, errno: i32, body_len: usize) -> [u8; OUT_HEADER_LEN] {
    let mut out = [0u8; OUT_HEADER_LEN];
    out[0..4].copy_from_slice(&((OUT_HEADER_LEN + body_len) as u32).to_le_bytes());
    out[4..8].copy_from_slice(&(-errno).to_le_bytes());
    out[8..16].copy_from_slice(&unique.to_le_bytes());
    out
}

/// The `FUSE_NOTIFY_RESEND` message: a bare header with `unique` 0 and the
/// notify code in `error`.
pub fn notify_resend() -> [u8; OUT_HEADER_LEN] {
    out_header(0, -FUSE_NOTIFY_RESEND, 0)
}

/// Appends little-endian fields to a reply body.
#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn zeros(&mut self, n: usize) -> &mut Self {
        self.0.resize(self.0.len() + n, 0);
        self
    }
}

/// `struct fuse_init_out`: what this side settled on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitOut {
    /// Protocol major.
    pub major: u32,
    /// Protocol minor.
    pub minor: u32,
    /// Readahead limit.
    pub max_readahead: u32,
    /// Negotiated flags (low 32 in `flags`, high 32 in `flags2`).
    pub flags: u64,
    /// Async requests the kernel keeps in flight.
    pub max_background: u16,
    /// Async requests at which the kernel reports congestion.
    pub congestion_threshold: u16,
    /// Largest write request.
    pub max_write: u32,
    /// Timestamp granularity in ns.
    pub time_gran: u32,
    /// Largest request in pages.
    pub max_pages: u16,
}

impl InitOut {
    /// The 64-byte reply body.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u32(self.major)
            .u32(self.minor)
            .u32(self.max_readahead)
            .u32(self.flags as u32)
            .u16(self.max_background)
            .u16(self.congestion_threshold)
            .u32(self.max_write)
            .u32(self.time_gran)
            .u16(self.max_pages)
            .u16(0) // map_alignment
            .u32((self.flags >> 32) as u32)
            .u32(0) // max_stack_depth
            .u16(0) // request_timeout: never set (a takeover may take longer)
            .zeros(22);
        debug_assert_eq!(w.0.len(), 64);
        w.0
    }
}

/// File type of an [`Attr`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file.
    File,
}

impl Kind {
    fn mode_bits(self) -> u32 {
        match self {
            Kind::Dir => libc::S_IFDIR,
            Kind::File => libc::S_IFREG,
        }
    }

    /// `DT_*` of a directory entry.
    fn dirent_type(self) -> u32 {
        match self {
            Kind::Dir => libc::DT_DIR as u32,
            Kind::File => libc::DT_REG as u32,
        }
    }
}

/// `struct fuse_attr`, in the terms of `stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    /// Node id (shown as the inode number).
    pub ino: u64,
    /// Bytes.
    pub size: u64,
    /// 512-byte blocks.
    pub blocks: u64,
    /// atime, mtime and ctime.
    pub time: SystemTime,
    /// Directory or file.
    pub kind: Kind,
    /// Permission bits.
    pub perm: u16,
    /// Links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Preferred I/O size.
    pub blksize: u32,
}

impl Attr {
    fn encode(&self, w: &mut Writer) {
        let since = self
            .time
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let (secs, nsecs) = (since.as_secs(), since.subsec_nanos());
        w.u64(self.ino).u64(self.size).u64(self.blocks);
        w.u64(secs).u64(secs).u64(secs);
        w.u32(nsecs).u32(nsecs).u32(nsecs);
        w.u32(self.kind.mode_bits() | self.perm as u32)
            .u32(self.nlink)
            .u32(self.uid)
            .u32(self.gid)
            .u32(0) // rdev
            .u32(self.blksize)
            .u32(0); // flags
    }
}

/// A cache lifetime as the kernel's seconds and nanoseconds.
fn ttl_fields(ttl: Duration) -> (u64, u32) {
    (ttl.as_secs(), ttl.subsec_nanos())
}

/// `struct fuse_entry_out`: a LOOKUP's answer.
pub fn entry_out(attr: &Attr, ttl: Duration) -> Vec<u8> {
    let mut w = Writer::default();
    let (secs, nsecs) = ttl_fields(ttl);
    w.u64(attr.ino).u64(0); // nodeid, generation
    w.u64(secs).u64(secs).u32(nsecs).u32(nsecs);
    attr.encode(&mut w);
    debug_assert_eq!(w.0.len(), 128);
    w.0
}

/// `struct fuse_attr_out`: a GETATTR's or SETATTR's answer.
pub fn attr_out(attr: &Attr, ttl: Duration) -> Vec<u8> {
    let mut w = Writer::default();
    let (secs, nsecs) = ttl_fields(ttl);
    w.u64(secs).u32(nsecs).u32(0);
    attr.encode(&mut w);
    debug_assert_eq!(w.0.len(), 104);
    w.0
}

/// `struct fuse_open_out`.
pub fn open_out(fh: u64, open_flags: u32) -> Vec<u8> {
    let mut w = Writer::default();
    w.u64(fh).u32(open_flags).u32(0);
    w.0
}

/// `struct fuse_write_out`.
pub fn write_out(size: u32) -> Vec<u8> {
    let mut w = Writer::default();
    w.u32(size).u32(0);
    w.0
}

/// `struct fuse_statfs_out` (a `fuse_kstatfs`).
pub fn statfs_out(blocks: u64, files: u64, bsize: u32, namelen: u32) -> Vec<u8> {
    let mut w = Writer::default();
    w.u64(blocks).u64(0).u64(0).u64(files).u64(0); // blocks, bfree, bavail, files, ffree
    w.u32(bsize).u32(namelen).u32(bsize).u32(0).zeros(24); // bsize, namelen, frsize, padding, spare
    debug_assert_eq!(w.0.len(), 80);
    w.0
}

/// Appends one `struct fuse_dirent` (padded to 8 bytes) to `out` if it fits
/// in `max_len`; returns false when it does not.
pub fn push_dirent(
    out: &mut Vec<u8>,
    max_len: usize,
    ino: u64,
    off: u64,
    kind: Kind,
    name: &[u8],
) -> bool {
    let entry_len = (24 + name.len()).next_multiple_of(8);
    if out.len() + entry_len > max_len {
        return false;
    }
    let mut w = Writer(std::mem::take(out));
    w.u64(ino)
        .u64(off)
        .u32(name.len() as u32)
        .u32(kind.dirent_type());
    w.0.extend_from_slice(name);
    w.zeros(entry_len - 24 - name.len());
    *out = w.0;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request as the kernel writes it: header, then `args`.
    fn request(opcode: u32, unique: u64, nodeid: u64, args: &[u8]) -> Vec<u8> {
        let mut w = Writer::default();
        w.u32((IN_HEADER_LEN + args.len()) as u32)
            .u32(opcode)
            .u64(unique)
            .u64(nodeid)
            .u32(0)
            .u32(0)
            .u32(42)
            .u16(0)
            .u16(0);
        w.0.extend_from_slice(args);
        w.0
    }

    fn write_in(fh: u64, offset: u64, size: u32) -> Vec<u8> {
        let mut w = Writer::default();
        w.u64(fh).u64(offset).u32(size).u32(0).u64(0).u32(0).u32(0);
        w.0
    }

    #[test]
    fn a_write_request_parses_with_its_data_borrowed_from_the_buffer() {
        let mut args = write_in(7, 4096, 5);
        args.extend_from_slice(b"hello");
        let buf = request(opcode::FUSE_WRITE, 18, 4, &args);
        let req = parse(&buf).unwrap();
        assert_eq!(req.header.unique, 18);
        assert_eq!(req.header.nodeid, 4);
        assert_eq!(req.header.pid, 42);
        assert_eq!(
            req.op,
            Op::Write {
                fh: 7,
                offset: 4096,
                data: b"hello"
            }
        );
    }

    #[test]
    fn a_resent_request_keeps_bit_63_in_unique_and_the_reply_echoes_it() {
        let unique = 18 | FUSE_UNIQUE_RESEND;
        let buf = request(opcode::FUSE_GETATTR, unique, 1, &[0u8; 16]);
        let req = parse(&buf).unwrap();
        assert_eq!(req.header.unique, unique);
        let out = out_header(req.header.unique, 0, 104);
        assert_eq!(u64::from_le_bytes(out[8..16].try_into().unwrap()), unique);
        assert_eq!(u32::from_le_bytes(out[0..4].try_into().unwrap()), 120);
    }

    #[test]
    fn a_len_that_disagrees_with_the_bytes_read_is_refused() {
        let mut buf = request(opcode::FUSE_GETATTR, 2, 1, &[0u8; 16]);
        // Oversized: the header claims more than was read.
        buf[0..4].copy_from_slice(&1_000_000u32.to_le_bytes());
        assert!(matches!(
            parse(&buf),
            Err(WireError::BadLength {
                said: 1_000_000,
                ..
            })
        ));
        // Undersized: the header claims less (the rest would go unread).
        buf[0..4].copy_from_slice(&40u32.to_le_bytes());
        assert!(matches!(
            parse(&buf),
            Err(WireError::BadLength { said: 40, .. })
        ));
        // Shorter than a header.
        assert_eq!(parse(&buf[..39]), Err(WireError::ShortHeader(39)));
    }

    #[test]
    fn truncated_arguments_are_refused_not_read_past() {
        // A READ with 8 bytes of its 40.
        let buf = request(opcode::FUSE_READ, 3, 4, &[0u8; 8]);
        assert_eq!(
            parse(&buf),
            Err(WireError::Truncated {
                opcode: opcode::FUSE_READ
            })
        );
        // A WRITE whose size says more than the data that follows.
        let mut args = write_in(1, 0, 4096);
        args.extend_from_slice(&[1u8; 100]);
        let buf = request(opcode::FUSE_WRITE, 4, 4, &args);
        assert!(parse(&buf).is_err());
        // A LOOKUP name without its NUL.
        let buf = request(opcode::FUSE_LOOKUP, 5, 1, b"disk.vhd");
        assert!(parse(&buf).is_err());
        // Extensions longer than the request.
        let mut buf = request(opcode::FUSE_STATFS, 6, 1, &[]);
        buf[36..38].copy_from_slice(&1u16.to_le_bytes());
        assert!(parse(&buf).is_err());
    }

    #[test]
    fn init_reads_flags2_only_with_init_ext() {
        let mut w = Writer::default();
        let low = (init_flags::FUSE_INIT_EXT | init_flags::FUSE_ASYNC_DIO) as u32;
        w.u32(7).u32(45).u32(131072).u32(low).u32(1 << 7).zeros(44);
        let buf = request(opcode::FUSE_INIT, 1, 0, &w.0);
        let Op::Init(init) = parse(&buf).unwrap().op else {
            panic!("not an INIT")
        };
        assert_eq!(
            (init.major, init.minor, init.max_readahead),
            (7, 45, 131072)
        );
        assert_ne!(init.flags & init_flags::FUSE_HAS_RESEND, 0);
        // Without FUSE_INIT_EXT the second word is not flags.
        let mut args = w.0.clone();
        args[12..16].copy_from_slice(&(init_flags::FUSE_ASYNC_DIO as u32).to_le_bytes());
        let Op::Init(init) = parse(&request(opcode::FUSE_INIT, 1, 0, &args)).unwrap().op else {
            panic!("not an INIT")
        };
        assert_eq!(init.flags, init_flags::FUSE_ASYNC_DIO);
    }

    #[test]
    fn lookup_fallocate_setattr_and_unknown_ops_parse() {
        let buf = request(opcode::FUSE_LOOKUP, 9, 1, b"disk.vhd\0");
        assert_eq!(parse(&buf).unwrap().op, Op::Lookup { name: b"disk.vhd" });
        let mut w = Writer::default();
        w.u64(2).u64(1 << 20).u64(4096).u32(0x11).u32(0);
        let buf = request(opcode::FUSE_FALLOCATE, 10, 4, &w.0);
        assert_eq!(
            parse(&buf).unwrap().op,
            Op::Fallocate {
                fh: 2,
                offset: 1 << 20,
                length: 4096,
                mode: 0x11
            }
        );
        let mut w = Writer::default();
        w.u32(FATTR_SIZE).u32(0).u64(0).u64(1 << 30).zeros(64);
        let buf = request(opcode::FUSE_SETATTR, 11, 4, &w.0);
        assert_eq!(
            parse(&buf).unwrap().op,
            Op::Setattr {
                size: Some(1 << 30)
            }
        );
        let buf = request(52, 12, 4, &[0u8; 24]); // FUSE_STATX
        assert_eq!(parse(&buf).unwrap().op, Op::Other(52));
        for (op, unanswered) in [
            (opcode::FUSE_FORGET, true),
            (opcode::FUSE_INTERRUPT, true),
            (opcode::FUSE_DESTROY, false),
        ] {
            let buf = request(op, 13, 4, &[0u8; 8]);
            assert_eq!(parse(&buf).unwrap().op.is_unanswered(), unanswered);
        }
    }

    #[test]
    fn replies_have_the_kernels_sizes_and_layout() {
        let attr = Attr {
            ino: 4,
            size: 2 << 30,
            blocks: (2 << 30) / 512,
            time: SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 5),
            kind: Kind::File,
            perm: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            blksize: 4096,
        };
        let entry = entry_out(&attr, Duration::from_secs(2));
        assert_eq!(entry.len(), 128);
        assert_eq!(u64::from_le_bytes(entry[0..8].try_into().unwrap()), 4); // nodeid
        assert_eq!(u64::from_le_bytes(entry[16..24].try_into().unwrap()), 2); // entry_valid
        let attr_bytes = &entry[40..];
        assert_eq!(
            u64::from_le_bytes(attr_bytes[8..16].try_into().unwrap()),
            2 << 30
        );
        assert_eq!(
            u32::from_le_bytes(attr_bytes[60..64].try_into().unwrap()),
            libc::S_IFREG | 0o644
        );
        assert_eq!(attr_out(&attr, Duration::from_secs(2)).len(), 104);
        assert_eq!(open_out(1, FOPEN_PARALLEL_DIRECT_WRITES).len(), 16);
        assert_eq!(write_out(5).len(), 8);
        assert_eq!(statfs_out(1, 2, 4096, 255).len(), 80);
        let init = InitOut {
            major: 7,
            minor: 45,
            max_readahead: 131072,
            flags: init_flags::FUSE_ASYNC_DIO | init_flags::FUSE_HAS_RESEND,
            max_background: 128,
            congestion_threshold: 96,
            max_write: 1 << 20,
            time_gran: 1,
            max_pages: 256,
        }
        .encode();
        assert_eq!(init.len(), 64);
        assert_eq!(
            u32::from_le_bytes(init[12..16].try_into().unwrap()),
            1 << 15
        );
        assert_eq!(u32::from_le_bytes(init[32..36].try_into().unwrap()), 1 << 7); // flags2
        let resend = notify_resend();
        assert_eq!(u32::from_le_bytes(resend[0..4].try_into().unwrap()), 16);
        assert_eq!(
            i32::from_le_bytes(resend[4..8].try_into().unwrap()),
            FUSE_NOTIFY_RESEND
        );
        assert_eq!(u64::from_le_bytes(resend[8..16].try_into().unwrap()), 0);
    }

    #[test]
    fn dirents_are_padded_and_stop_at_the_size_asked() {
        let mut out = Vec::new();
        assert!(push_dirent(&mut out, 64, 1, 1, Kind::Dir, b"."));
        assert_eq!(out.len(), 32);
        assert!(push_dirent(&mut out, 64, 1, 2, Kind::Dir, b".."));
        assert!(!push_dirent(&mut out, 64, 4, 3, Kind::File, b"disk.vhd"));
        assert_eq!(out.len(), 64);
    }
}
