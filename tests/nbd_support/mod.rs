//! A small NBD client of the tests' own, for what the real clients (qemu,
//! libnbd's tools) never send: options out of order, requests past the end
//! or over the maximum, a wrong magic, and exact control of which
//! connection writes and which flushes. Built from the specification's
//! constants in `blobdrive::nbd::proto`, blocking, over a Unix socket.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use blobdrive::nbd::proto::*;

/// One option reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionReply {
    /// The option answered.
    pub option: u32,
    /// `NBD_REP_*`.
    pub reply: u32,
    /// Its data.
    pub data: Vec<u8>,
}

/// One answered request: the error (0 for success) and the data read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// `NBD_E*`, or 0.
    pub error: u32,
    /// READ data, or block status descriptors as raw bytes.
    pub data: Vec<u8>,
}

/// A client connection.
pub struct Client {
    /// The socket.
    pub stream: UnixStream,
    next_cookie: u64,
    /// Structured replies were negotiated.
    pub structured: bool,
}

impl Client {
    /// Connects and reads the greeting; sends fixed newstyle + no zeroes.
    pub fn connect(socket: &Path) -> Client {
        let stream = UnixStream::connect(socket).expect("connects to the NBD socket");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout set");
        let mut c = Client {
            stream,
            next_cookie: 1,
            structured: false,
        };
        let mut greeting = [0u8; 18];
        c.stream.read_exact(&mut greeting).expect("greeting");
        assert_eq!(&greeting[..8], &NBDMAGIC.to_be_bytes());
        assert_eq!(&greeting[8..16], &IHAVEOPT.to_be_bytes());
        c.send(&(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES).to_be_bytes());
        c
    }

    /// Writes raw bytes.
    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    /// Sends an option with `data`.
    pub fn option(&mut self, option: u32, data: &[u8]) {
        let mut b = IHAVEOPT.to_be_bytes().to_vec();
        b.extend_from_slice(&option.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.send(&b);
    }

    /// Reads one option reply.
    pub fn reply(&mut self) -> OptionReply {
        let mut head = [0u8; 20];
        self.stream.read_exact(&mut head).expect("option reply");
        assert_eq!(&head[..8], &NBD_REP_MAGIC.to_be_bytes(), "reply magic");
        let option = u32::from_be_bytes(head[8..12].try_into().unwrap());
        let reply = u32::from_be_bytes(head[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(head[16..20].try_into().unwrap());
        let mut data = vec![0u8; len as usize];
        self.stream
            .read_exact(&mut data)
            .expect("option reply data");
        OptionReply {
            option,
            reply,
            data,
        }
    }

    /// Sends an option and reads replies up to the final one (ACK or an
    /// error); returns them all.
    pub fn ask(&mut self, option: u32, data: &[u8]) -> Vec<OptionReply> {
        self.option(option, data);
        let mut out = Vec::new();
        loop {
            let r = self.reply();
            let last = r.reply == NBD_REP_ACK || r.reply & NBD_REP_FLAG_ERROR != 0;
            out.push(r);
            if last {
                return out;
            }
        }
    }

    /// Negotiates structured replies and `base:allocation`, then GO to
    /// `export`; returns the export size and flags.
    pub fn go_structured(&mut self, export: &str) -> (u64, u16) {
        let acks = self.ask(NBD_OPT_STRUCTURED_REPLY, &[]);
        assert_eq!(acks.last().unwrap().reply, NBD_REP_ACK);
        self.structured = true;
        let replies = self.ask(
            NBD_OPT_SET_META_CONTEXT,
            &meta_data(export, &[BASE_ALLOCATION]),
        );
        assert_eq!(replies.last().unwrap().reply, NBD_REP_ACK, "{replies:?}");
        self.go(export)
    }

    /// GO to `export` asking for block sizes; returns size and flags.
    pub fn go(&mut self, export: &str) -> (u64, u16) {
        let replies = self.ask(NBD_OPT_GO, &go_data(export, &[NBD_INFO_BLOCK_SIZE]));
        let last = replies.last().unwrap();
        assert_eq!(last.reply, NBD_REP_ACK, "GO answered {replies:?}");
        let info = replies
            .iter()
            .find(|r| r.reply == NBD_REP_INFO && r.data[..2] == NBD_INFO_EXPORT.to_be_bytes())
            .expect("NBD_INFO_EXPORT");
        let size = u64::from_be_bytes(info.data[2..10].try_into().unwrap());
        let flags = u16::from_be_bytes(info.data[10..12].try_into().unwrap());
        (size, flags)
    }

    /// Sends a request (with `payload` for a WRITE); returns its cookie.
    pub fn request(
        &mut self,
        command: u16,
        flags: u16,
        offset_bytes: u64,
        len_bytes: u32,
        payload: &[u8],
    ) -> u64 {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        let header = Request {
            flags,
            command,
            cookie,
            offset_bytes,
            len_bytes,
        }
        .encode();
        self.send(&header);
        self.send(payload);
        cookie
    }

    /// Reads the whole reply to one request (which must be `cookie`).
    pub fn answer(&mut self, cookie: u64, read_len: u32) -> Answer {
        if !self.structured {
            let mut head = [0u8; 16];
            self.stream.read_exact(&mut head).expect("simple reply");
            assert_eq!(&head[..4], &NBD_SIMPLE_REPLY_MAGIC.to_be_bytes());
            let error = u32::from_be_bytes(head[4..8].try_into().unwrap());
            assert_eq!(u64::from_be_bytes(head[8..16].try_into().unwrap()), cookie);
            let mut data = Vec::new();
            if error == 0 && read_len > 0 {
                data = vec![0u8; read_len as usize];
                self.stream.read_exact(&mut data).expect("read data");
            }
            return Answer { error, data };
        }
        let mut error = 0;
        let mut data = Vec::new();
        loop {
            let mut head = [0u8; 20];
            self.stream
                .read_exact(&mut head)
                .expect("structured reply chunk");
            assert_eq!(&head[..4], &NBD_STRUCTURED_REPLY_MAGIC.to_be_bytes());
            let flags = u16::from_be_bytes(head[4..6].try_into().unwrap());
            let kind = u16::from_be_bytes(head[6..8].try_into().unwrap());
            assert_eq!(u64::from_be_bytes(head[8..16].try_into().unwrap()), cookie);
            let len = u32::from_be_bytes(head[16..20].try_into().unwrap());
            let mut payload = vec![0u8; len as usize];
            self.stream.read_exact(&mut payload).expect("chunk payload");
            match kind {
                NBD_REPLY_TYPE_OFFSET_DATA => data.extend_from_slice(&payload[8..]),
                NBD_REPLY_TYPE_BLOCK_STATUS => data.extend_from_slice(&payload[4..]),
                NBD_REPLY_TYPE_ERROR => {
                    error = u32::from_be_bytes(payload[..4].try_into().unwrap())
                }
                _ => {}
            }
            if flags & NBD_REPLY_FLAG_DONE != 0 {
                return Answer { error, data };
            }
        }
    }

    /// Reads the whole next reply, whichever request it answers (replies
    /// to pipelined requests come in the order they complete); structured
    /// replies only. Returns its cookie and the answer.
    pub fn answer_any(&mut self) -> (u64, Answer) {
        assert!(self.structured, "answer_any reads structured replies");
        let mut cookie = None;
        let mut error = 0;
        let mut data = Vec::new();
        loop {
            let mut head = [0u8; 20];
            self.stream
                .read_exact(&mut head)
                .expect("structured reply chunk");
            assert_eq!(&head[..4], &NBD_STRUCTURED_REPLY_MAGIC.to_be_bytes());
            let flags = u16::from_be_bytes(head[4..6].try_into().unwrap());
            let kind = u16::from_be_bytes(head[6..8].try_into().unwrap());
            let this = u64::from_be_bytes(head[8..16].try_into().unwrap());
            assert_eq!(*cookie.get_or_insert(this), this, "chunks of one reply");
            let len = u32::from_be_bytes(head[16..20].try_into().unwrap());
            let mut payload = vec![0u8; len as usize];
            self.stream.read_exact(&mut payload).expect("chunk payload");
            match kind {
                NBD_REPLY_TYPE_OFFSET_DATA => data.extend_from_slice(&payload[8..]),
                NBD_REPLY_TYPE_ERROR => {
                    error = u32::from_be_bytes(payload[..4].try_into().unwrap())
                }
                _ => {}
            }
            if flags & NBD_REPLY_FLAG_DONE != 0 {
                return (this, Answer { error, data });
            }
        }
    }

    /// A request and its answer.
    pub fn call(
        &mut self,
        command: u16,
        flags: u16,
        offset_bytes: u64,
        len_bytes: u32,
        payload: &[u8],
    ) -> Answer {
        let cookie = self.request(command, flags, offset_bytes, len_bytes, payload);
        let read_len = if command == NBD_CMD_READ {
            len_bytes
        } else {
            0
        };
        self.answer(cookie, read_len)
    }

    /// True once the server closed the connection (reads EOF).
    pub fn closed_by_server(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.stream.read(&mut b), Ok(0) | Err(_))
    }
}

/// The data of `NBD_OPT_GO`/`INFO`.
pub fn go_data(export: &str, requests: &[u16]) -> Vec<u8> {
    let mut b = (export.len() as u32).to_be_bytes().to_vec();
    b.extend_from_slice(export.as_bytes());
    b.extend_from_slice(&(requests.len() as u16).to_be_bytes());
    for r in requests {
        b.extend_from_slice(&r.to_be_bytes());
    }
    b
}

/// The data of `NBD_OPT_SET_META_CONTEXT`/`LIST_META_CONTEXT`.
pub fn meta_data(export: &str, queries: &[&str]) -> Vec<u8> {
    let mut b = (export.len() as u32).to_be_bytes().to_vec();
    b.extend_from_slice(export.as_bytes());
    b.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        b.extend_from_slice(&(q.len() as u32).to_be_bytes());
        b.extend_from_slice(q.as_bytes());
    }
    b
}

/// Block status descriptors `(length, flags)` from an answer's data.
pub fn descriptors(data: &[u8]) -> Vec<(u32, u32)> {
    data.chunks_exact(8)
        .map(|d| {
            (
                u32::from_be_bytes(d[..4].try_into().unwrap()),
                u32::from_be_bytes(d[4..].try_into().unwrap()),
            )
        })
        .collect()
}
