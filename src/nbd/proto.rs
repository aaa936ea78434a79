//! The NBD wire format: the specification's constants under their own
//! names, and pure parsers and encoders of the messages the server reads
//! and writes. No I/O and no state: `handshake.rs` and `transmission.rs`
//! move the bytes, this module only says what they mean.
//!
//! Source: the protocol document of the NetworkBlockDevice/nbd project
//! (`doc/proto.md`), summarised in `docs/nbd.md`. All integers on the wire
//! are big-endian.
//!
//! Invariant: a parser never trusts a length field: every count and string
//! length is checked against the bytes actually given, and a parse error is
//! a value ([`Malformed`]), never a panic (`tests/fuzz_parsers.rs` feeds
//! these parsers mutated messages).

use bytes::{BufMut, BytesMut};

/// `NBDMAGIC`: the first 8 bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: after `NBDMAGIC` (newstyle) and before every option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every option reply.
pub const NBD_REP_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of a transmission request (compact headers).
pub const NBD_REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub const NBD_SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk.
pub const NBD_STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flag: the server speaks fixed newstyle.
pub const NBD_FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Handshake flag: the server can skip the 124 zero bytes after EXPORT_NAME.
pub const NBD_FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flag: the client speaks fixed newstyle.
pub const NBD_FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client flag: the client wants no zero padding after EXPORT_NAME.
pub const NBD_FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Transmission flag: always set.
pub const NBD_FLAG_HAS_FLAGS: u16 = 1 << 0;
/// Transmission flag: the export refuses writes.
pub const NBD_FLAG_READ_ONLY: u16 = 1 << 1;
/// Transmission flag: `NBD_CMD_FLUSH` is understood.
pub const NBD_FLAG_SEND_FLUSH: u16 = 1 << 2;
/// Transmission flag: `NBD_CMD_FLAG_FUA` is understood.
pub const NBD_FLAG_SEND_FUA: u16 = 1 << 3;
/// Transmission flag: `NBD_CMD_TRIM` is understood.
pub const NBD_FLAG_SEND_TRIM: u16 = 1 << 5;
/// Transmission flag: `NBD_CMD_WRITE_ZEROES` is understood.
pub const NBD_FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
/// Transmission flag: every connection to the export shares one cache, so
/// a flush on one makes the writes completed on all of them durable.
pub const NBD_FLAG_CAN_MULTI_CONN: u16 = 1 << 8;

/// Option: choose an export and enter transmission (old style, no errors).
pub const NBD_OPT_EXPORT_NAME: u32 = 1;
/// Option: end the negotiation.
pub const NBD_OPT_ABORT: u32 = 2;
/// Option: list the exports.
pub const NBD_OPT_LIST: u32 = 3;
/// Option: TLS (not offered).
pub const NBD_OPT_STARTTLS: u32 = 5;
/// Option: describe an export.
pub const NBD_OPT_INFO: u32 = 6;
/// Option: describe an export and enter transmission.
pub const NBD_OPT_GO: u32 = 7;
/// Option: use structured replies.
pub const NBD_OPT_STRUCTURED_REPLY: u32 = 8;
/// Option: list metadata contexts.
pub const NBD_OPT_LIST_META_CONTEXT: u32 = 9;
/// Option: select metadata contexts.
pub const NBD_OPT_SET_META_CONTEXT: u32 = 10;
/// Option: 64-bit headers (an extension; not offered).
pub const NBD_OPT_EXTENDED_HEADERS: u32 = 11;

/// Option reply: done.
pub const NBD_REP_ACK: u32 = 1;
/// Option reply: one export of a list.
pub const NBD_REP_SERVER: u32 = 2;
/// Option reply: one piece of information about an export.
pub const NBD_REP_INFO: u32 = 3;
/// Option reply: one selected metadata context.
pub const NBD_REP_META_CONTEXT: u32 = 4;
/// Bit 31 marks an option reply as an error.
pub const NBD_REP_FLAG_ERROR: u32 = 1 << 31;
/// Option error: not supported.
pub const NBD_REP_ERR_UNSUP: u32 = NBD_REP_FLAG_ERROR + 1;
/// Option error: forbidden by policy.
pub const NBD_REP_ERR_POLICY: u32 = NBD_REP_FLAG_ERROR + 2;
/// Option error: syntactically or semantically invalid (or out of order).
pub const NBD_REP_ERR_INVALID: u32 = NBD_REP_FLAG_ERROR + 3;
/// Option error: no such export.
pub const NBD_REP_ERR_UNKNOWN: u32 = NBD_REP_FLAG_ERROR + 6;
/// Option error: the server is shutting down.
pub const NBD_REP_ERR_SHUTDOWN: u32 = NBD_REP_FLAG_ERROR + 7;
/// Option error: the request is too large.
pub const NBD_REP_ERR_TOO_BIG: u32 = NBD_REP_FLAG_ERROR + 9;

/// Information type: size and transmission flags.
pub const NBD_INFO_EXPORT: u16 = 0;
/// Information type: the export's name.
pub const NBD_INFO_NAME: u16 = 1;
/// Information type: a description.
pub const NBD_INFO_DESCRIPTION: u16 = 2;
/// Information type: block size constraints.
pub const NBD_INFO_BLOCK_SIZE: u16 = 3;

/// Command: read.
pub const NBD_CMD_READ: u16 = 0;
/// Command: write.
pub const NBD_CMD_WRITE: u16 = 1;
/// Command: disconnect (no reply).
pub const NBD_CMD_DISC: u16 = 2;
/// Command: make completed writes durable.
pub const NBD_CMD_FLUSH: u16 = 3;
/// Command: discard.
pub const NBD_CMD_TRIM: u16 = 4;
/// Command: write zeros.
pub const NBD_CMD_WRITE_ZEROES: u16 = 6;
/// Command: block status of the selected metadata contexts.
pub const NBD_CMD_BLOCK_STATUS: u16 = 7;

/// Command flag: durable before the reply.
pub const NBD_CMD_FLAG_FUA: u16 = 1 << 0;
/// Command flag (WRITE_ZEROES): keep the area allocated.
pub const NBD_CMD_FLAG_NO_HOLE: u16 = 1 << 1;
/// Command flag (READ): do not fragment the reply.
pub const NBD_CMD_FLAG_DF: u16 = 1 << 2;
/// Command flag (BLOCK_STATUS): exactly one extent per context.
pub const NBD_CMD_FLAG_REQ_ONE: u16 = 1 << 3;
/// Command flag (WRITE_ZEROES): fail unless fast.
pub const NBD_CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

/// Structured reply flag: the last chunk of the reply.
pub const NBD_REPLY_FLAG_DONE: u16 = 1 << 0;
/// Structured reply chunk: nothing (success).
pub const NBD_REPLY_TYPE_NONE: u16 = 0;
/// Structured reply chunk: data at an offset.
pub const NBD_REPLY_TYPE_OFFSET_DATA: u16 = 1;
/// Structured reply chunk: extents of one metadata context.
pub const NBD_REPLY_TYPE_BLOCK_STATUS: u16 = 5;
/// Structured reply chunk: an error.
pub const NBD_REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

/// Error: not permitted (a write to a read-only export).
pub const NBD_EPERM: u32 = 1;
/// Error: I/O error.
pub const NBD_EIO: u32 = 5;
/// Error: out of memory.
pub const NBD_ENOMEM: u32 = 12;
/// Error: invalid argument (past the end, too long, unknown command).
pub const NBD_EINVAL: u32 = 22;
/// Error: a write past the end of the export.
pub const NBD_ENOSPC: u32 = 28;
/// Error: value too large.
pub const NBD_EOVERFLOW: u32 = 75;
/// Error: not supported.
pub const NBD_ENOTSUP: u32 = 95;
/// Error: the server is shutting down.
pub const NBD_ESHUTDOWN: u32 = 108;

/// `base:allocation` status: the extent is a hole (not allocated).
pub const NBD_STATE_HOLE: u32 = 1 << 0;
/// `base:allocation` status: the extent reads as zeros.
pub const NBD_STATE_ZERO: u32 = 1 << 1;
/// The one metadata context served.
pub const BASE_ALLOCATION: &str = "base:allocation";

/// Bytes of a request header (compact form).
pub const REQUEST_BYTES: usize = 28;
/// Bytes of an option header after `IHAVEOPT`: option and length.
pub const OPTION_HEADER_BYTES: usize = 8;
/// Longest string the specification allows (names, queries).
pub const MAX_STRING_BYTES: usize = 4096;

/// A message that does not parse: what was wrong, for the log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Malformed(pub &'static str);

/// Reads big-endian fields from a byte slice, failing instead of panicking.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], Malformed> {
        if self.bytes.len() < n {
            return Err(Malformed(what));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, Malformed> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, Malformed> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, Malformed> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    /// A string of `len` bytes: valid UTF-8, at most [`MAX_STRING_BYTES`].
    fn string(&mut self, len: u32, what: &'static str) -> Result<String, Malformed> {
        if len as usize > MAX_STRING_BYTES {
            return Err(Malformed(what));
        }
        let b = self.take(len as usize, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| Malformed(what))
    }

    fn end(&self, what: &'static str) -> Result<(), Malformed> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(Malformed(what))
        }
    }
}

/// The data of `NBD_OPT_INFO` and `NBD_OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    /// Export name (empty: the default export).
    pub name: String,
    /// Information types asked for.
    pub requests: Vec<u16>,
}

impl InfoRequest {
    /// Parses the option's data.
    pub fn parse(data: &[u8]) -> Result<Self, Malformed> {
        let mut r = Reader { bytes: data };
        let len = r.u32("export name length missing")?;
        let name = r.string(len, "export name longer than the option or not UTF-8")?;
        let count = r.u16("information request count missing")?;
        let mut requests = Vec::with_capacity(usize::from(count).min(data.len() / 2));
        for _ in 0..count {
            requests.push(r.u16("fewer information requests than counted")?);
        }
        r.end("bytes after the information requests")?;
        Ok(InfoRequest { name, requests })
    }
}

/// The data of `NBD_OPT_LIST_META_CONTEXT` and `NBD_OPT_SET_META_CONTEXT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextRequest {
    /// Export name.
    pub export: String,
    /// Queries (`base:allocation`, `base:`, ...).
    pub queries: Vec<String>,
}

impl MetaContextRequest {
    /// Parses the option's data.
    pub fn parse(data: &[u8]) -> Result<Self, Malformed> {
        let mut r = Reader { bytes: data };
        let len = r.u32("export name length missing")?;
        let export = r.string(len, "export name longer than the option or not UTF-8")?;
        let count = r.u32("query count missing")?;
        let mut queries = Vec::new();
        for _ in 0..count {
            let len = r.u32("fewer queries than counted")?;
            queries.push(r.string(len, "query longer than the option or not UTF-8")?);
        }
        r.end("bytes after the queries")?;
        Ok(MetaContextRequest { export, queries })
    }
}

/// One transmission request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// `NBD_CMD_FLAG_*`.
    pub flags: u16,
    /// `NBD_CMD_*`.
    pub command: u16,
    /// Opaque, echoed in the reply.
    pub cookie: u64,
    /// Byte offset in the export.
    pub offset_bytes: u64,
    /// Byte length (the payload length of a WRITE).
    pub len_bytes: u32,
}

impl Request {
    /// Parses a 28-byte header; a wrong magic is a framing error.
    pub fn parse(header: &[u8; REQUEST_BYTES]) -> Result<Self, Malformed> {
        let mut r = Reader { bytes: header };
        if r.u32("short header")? != NBD_REQUEST_MAGIC {
            return Err(Malformed("bad request magic"));
        }
        Ok(Request {
            flags: r.u16("short header")?,
            command: r.u16("short header")?,
            cookie: r.u64("short header")?,
            offset_bytes: r.u64("short header")?,
            len_bytes: r.u32("short header")?,
        })
    }

    /// Encodes the header (what a client sends; for tests).
    pub fn encode(&self) -> [u8; REQUEST_BYTES] {
        let mut b = BytesMut::with_capacity(REQUEST_BYTES);
        b.put_u32(NBD_REQUEST_MAGIC);
        b.put_u16(self.flags);
        b.put_u16(self.command);
        b.put_u64(self.cookie);
        b.put_u64(self.offset_bytes);
        b.put_u32(self.len_bytes);
        let mut out = [0u8; REQUEST_BYTES];
        out.copy_from_slice(&b);
        out
    }

    /// The bytes of payload that follow this header.
    pub fn payload_bytes(&self) -> u64 {
        if self.command == NBD_CMD_WRITE {
            u64::from(self.len_bytes)
        } else {
            0
        }
    }

    /// The command's name, for logs.
    pub fn command_name(&self) -> &'static str {
        match self.command {
            NBD_CMD_READ => "READ",
            NBD_CMD_WRITE => "WRITE",
            NBD_CMD_DISC => "DISC",
            NBD_CMD_FLUSH => "FLUSH",
            NBD_CMD_TRIM => "TRIM",
            NBD_CMD_WRITE_ZEROES => "WRITE_ZEROES",
            NBD_CMD_BLOCK_STATUS => "BLOCK_STATUS",
            _ => "unknown",
        }
    }
}

/// The option name, for logs.
pub fn option_name(option: u32) -> &'static str {
    match option {
        NBD_OPT_EXPORT_NAME => "EXPORT_NAME",
        NBD_OPT_ABORT => "ABORT",
        NBD_OPT_LIST => "LIST",
        NBD_OPT_STARTTLS => "STARTTLS",
        NBD_OPT_INFO => "INFO",
        NBD_OPT_GO => "GO",
        NBD_OPT_STRUCTURED_REPLY => "STRUCTURED_REPLY",
        NBD_OPT_LIST_META_CONTEXT => "LIST_META_CONTEXT",
        NBD_OPT_SET_META_CONTEXT => "SET_META_CONTEXT",
        NBD_OPT_EXTENDED_HEADERS => "EXTENDED_HEADERS",
        _ => "unknown",
    }
}

/// An option reply: header and `data`.
pub fn option_reply(option: u32, reply: u32, data: &[u8]) -> BytesMut {
    let mut b = BytesMut::with_capacity(20 + data.len());
    b.put_u64(NBD_REP_MAGIC);
    b.put_u32(option);
    b.put_u32(reply);
    b.put_u32(data.len() as u32);
    b.put_slice(data);
    b
}

/// An error option reply with a message for the client's log.
pub fn option_error(option: u32, reply: u32, message: &str) -> BytesMut {
    option_reply(option, reply, message.as_bytes())
}

/// `NBD_REP_SERVER` data: one export's name.
pub fn server_entry(name: &str) -> Vec<u8> {
    let mut b = Vec::with_capacity(4 + name.len());
    b.extend_from_slice(&(name.len() as u32).to_be_bytes());
    b.extend_from_slice(name.as_bytes());
    b
}

/// `NBD_INFO_EXPORT` data: size and transmission flags.
pub fn info_export(size_bytes: u64, flags: u16) -> Vec<u8> {
    let mut b = Vec::with_capacity(12);
    b.extend_from_slice(&NBD_INFO_EXPORT.to_be_bytes());
    b.extend_from_slice(&size_bytes.to_be_bytes());
    b.extend_from_slice(&flags.to_be_bytes());
    b
}

/// `NBD_INFO_BLOCK_SIZE` data: minimum, preferred and maximum payload.
pub fn info_block_size(min: u32, preferred: u32, max_payload: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(14);
    b.extend_from_slice(&NBD_INFO_BLOCK_SIZE.to_be_bytes());
    b.extend_from_slice(&min.to_be_bytes());
    b.extend_from_slice(&preferred.to_be_bytes());
    b.extend_from_slice(&max_payload.to_be_bytes());
    b
}

/// `NBD_REP_META_CONTEXT` data: context id and name.
pub fn meta_context(id: u32, name: &str) -> Vec<u8> {
    let mut b = Vec::with_capacity(4 + name.len());
    b.extend_from_slice(&id.to_be_bytes());
    b.extend_from_slice(name.as_bytes());
    b
}

/// A simple reply header (the data of a READ follows it).
pub fn simple_reply(cookie: u64, error: u32) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[0..4].copy_from_slice(&NBD_SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&error.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out
}

/// A structured reply chunk header for a payload of `len` bytes.
pub fn chunk_header(cookie: u64, flags: u16, kind: u16, len: u32) -> [u8; 20] {
    let mut out = [0u8; 20];
    out[0..4].copy_from_slice(&NBD_STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&flags.to_be_bytes());
    out[6..8].copy_from_slice(&kind.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out[16..20].copy_from_slice(&len.to_be_bytes());
    out
}

/// A complete `NBD_REPLY_TYPE_ERROR` chunk (the last of its reply).
pub fn error_chunk(cookie: u64, error: u32, message: &str) -> BytesMut {
    let message = &message.as_bytes()[..message.len().min(MAX_STRING_BYTES)];
    let len = 6 + message.len();
    let mut b = BytesMut::with_capacity(20 + len);
    b.put_slice(&chunk_header(
        cookie,
        NBD_REPLY_FLAG_DONE,
        NBD_REPLY_TYPE_ERROR,
        len as u32,
    ));
    b.put_u32(error);
    b.put_u16(message.len() as u16);
    b.put_slice(message);
    b
}

/// A complete `NBD_REPLY_TYPE_BLOCK_STATUS` chunk: `(length, status)`
/// descriptors of context `id`.
pub fn block_status_chunk(cookie: u64, id: u32, extents: &[(u32, u32)]) -> BytesMut {
    let len = 4 + 8 * extents.len();
    let mut b = BytesMut::with_capacity(20 + len);
    b.put_slice(&chunk_header(
        cookie,
        NBD_REPLY_FLAG_DONE,
        NBD_REPLY_TYPE_BLOCK_STATUS,
        len as u32,
    ));
    b.put_u32(id);
    for (length, status) in extents {
        b.put_u32(*length);
        b.put_u32(*status);
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_round_trips_and_a_bad_magic_is_refused() {
        let req = Request {
            flags: NBD_CMD_FLAG_FUA,
            command: NBD_CMD_WRITE,
            cookie: 7,
            offset_bytes: 4096,
            len_bytes: 512,
        };
        let mut bytes = req.encode();
        assert_eq!(Request::parse(&bytes), Ok(req));
        assert_eq!(req.payload_bytes(), 512);
        bytes[0] ^= 1;
        assert!(Request::parse(&bytes).is_err());
    }

    #[test]
    fn info_request_lengths_are_checked() {
        let mut data = 3u32.to_be_bytes().to_vec();
        data.extend_from_slice(b"c/d");
        data.extend_from_slice(&1u16.to_be_bytes());
        data.extend_from_slice(&NBD_INFO_BLOCK_SIZE.to_be_bytes());
        let parsed = InfoRequest::parse(&data).unwrap();
        assert_eq!(parsed.name, "c/d");
        assert_eq!(parsed.requests, vec![NBD_INFO_BLOCK_SIZE]);
        // A name that claims more bytes than the option has.
        let mut bad = 300u32.to_be_bytes().to_vec();
        bad.extend_from_slice(b"c/d");
        assert!(InfoRequest::parse(&bad).is_err());
        // Two requests counted, one given.
        let mut short = data.clone();
        short[7 + 1] = 2;
        assert!(InfoRequest::parse(&short).is_err());
    }

    #[test]
    fn meta_context_queries_parse() {
        let mut data = 0u32.to_be_bytes().to_vec();
        data.extend_from_slice(&1u32.to_be_bytes());
        data.extend_from_slice(&(BASE_ALLOCATION.len() as u32).to_be_bytes());
        data.extend_from_slice(BASE_ALLOCATION.as_bytes());
        let parsed = MetaContextRequest::parse(&data).unwrap();
        assert_eq!(parsed.export, "");
        assert_eq!(parsed.queries, vec![BASE_ALLOCATION.to_string()]);
        data.push(0);
        assert!(MetaContextRequest::parse(&data).is_err());
    }

    #[test]
    fn error_codes_are_the_specifications() {
        assert_eq!(NBD_REP_ERR_UNSUP, 0x8000_0001);
        assert_eq!(NBD_REP_ERR_INVALID, 0x8000_0003);
        assert_eq!(NBD_REP_ERR_UNKNOWN, 0x8000_0006);
        assert_eq!(NBD_REPLY_TYPE_ERROR, 0x8001);
    }
}
