//! Just enough HTTP/1.1 to pass requests and answers through one at a time
//! on persistent connections: a message's head (kept as the bytes that came,
//! so a signature over it stays valid) and its body, framed by
//! `Content-Length`, by chunks, or by the end of the connection.
//!
//! A body is held whole in memory before it is passed on (the model times
//! it as a unit); a head may be at most [`MAX_HEAD_BYTES`].

use std::io;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The longest head accepted.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// A parsed head: the first line's words and the headers (names in lower
/// case), beside the bytes as they came.
#[derive(Debug, Clone)]
pub struct Head {
    /// The head as received, through the blank line.
    pub raw: Vec<u8>,
    /// Request: method, target, version. Response: version, status, reason.
    pub line: [String; 3],
    /// Headers in order, names in lower case, values trimmed.
    pub headers: Vec<(String, String)>,
}

impl Head {
    /// Parses `raw` (a head through its blank line).
    pub fn parse(raw: Vec<u8>) -> io::Result<Head> {
        let text = std::str::from_utf8(&raw)
            .map_err(|_| invalid("a head that is not UTF-8"))?
            .to_string();
        let mut lines = text.split("\r\n");
        let first = lines.next().unwrap_or_default();
        let mut words = first.splitn(3, ' ');
        let mut word = || words.next().unwrap_or_default().to_string();
        let line = [word(), word(), word()];
        if line[0].is_empty() || line[1].is_empty() {
            return Err(invalid("a malformed first line"));
        }
        let headers = lines
            .filter(|l| !l.is_empty())
            .map(|l| {
                l.split_once(':')
                    .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
                    .ok_or_else(|| invalid("a header without a colon"))
            })
            .collect::<io::Result<_>>()?;
        Ok(Head { raw, line, headers })
    }

    /// A header's value (`name` in lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// True when a header holds `token` in its comma-separated list.
    pub fn has_token(&self, name: &str, token: &str) -> bool {
        self.headers
            .iter()
            .filter(|(k, _)| k == name)
            .flat_map(|(_, v)| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    }

    /// How a request's body is framed.
    pub fn request_body(&self) -> io::Result<Framing> {
        if self.has_token("transfer-encoding", "chunked") {
            return Ok(Framing::Chunked);
        }
        match self.header("content-length") {
            Some(v) => v
                .parse()
                .map(Framing::Length)
                .map_err(|_| invalid("a bad Content-Length")),
            None => Ok(Framing::Length(0)),
        }
    }

    /// How a response's body is framed, for a request with `method`.
    pub fn response_body(&self, method: &str) -> io::Result<Framing> {
        let status = self.status();
        if method == "HEAD" || status == 204 || status == 304 || (100..200).contains(&status) {
            return Ok(Framing::Length(0));
        }
        if self.has_token("transfer-encoding", "chunked") {
            return Ok(Framing::Chunked);
        }
        match self.header("content-length") {
            Some(v) => v
                .parse()
                .map(Framing::Length)
                .map_err(|_| invalid("a bad Content-Length")),
            None => Ok(Framing::UntilClose),
        }
    }

    /// A response's status code (0 when it is not a number).
    pub fn status(&self) -> u16 {
        self.line[1].parse().unwrap_or(0)
    }

    /// The head without header `name` (lower case), as bytes to send.
    pub fn without(&self, name: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.raw.len());
        let text = String::from_utf8_lossy(&self.raw);
        for line in text.split_inclusive("\r\n") {
            let is_it = line
                .split_once(':')
                .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case(name));
            if !is_it {
                out.extend_from_slice(line.as_bytes());
            }
        }
        out
    }
}

/// How a body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// Everything until the peer closes (responses only).
    UntilClose,
}

/// A body as received: its bytes on the wire (chunk framing included) and
/// its payload's length.
#[derive(Debug, Default)]
pub struct Body {
    /// The bytes to pass on, as they came.
    pub wire: Vec<u8>,
    /// Payload bytes (without chunk framing).
    pub payload_bytes: u64,
}

/// One side of a connection, with what was read past the last message.
#[derive(Debug)]
pub struct Conn {
    stream: TcpStream,
    buf: BytesMut,
}

impl Conn {
    /// Wraps `stream`.
    pub fn new(stream: TcpStream) -> Conn {
        let _ = stream.set_nodelay(true);
        Conn {
            stream,
            buf: BytesMut::with_capacity(16 * 1024),
        }
    }

    /// The stream, for writing and shutting down.
    pub fn stream(&mut self) -> &mut TcpStream {
        &mut self.stream
    }

    /// Reads more bytes into the buffer; false at the end of the stream.
    async fn fill(&mut self) -> io::Result<bool> {
        if self.buf.capacity() - self.buf.len() < 8 * 1024 {
            self.buf.reserve(64 * 1024);
        }
        Ok(self.stream.read_buf(&mut self.buf).await? > 0)
    }

    /// Reads the next head; `None` when the peer closed before sending a
    /// byte of it.
    pub async fn read_head(&mut self) -> io::Result<Option<Head>> {
        let mut scanned: usize = 0;
        loop {
            if let Some(end) = find(&self.buf[scanned.saturating_sub(3)..], b"\r\n\r\n")
                .map(|i| i + scanned.saturating_sub(3) + 4)
            {
                let raw = self.buf.split_to(end).to_vec();
                return Head::parse(raw).map(Some);
            }
            scanned = self.buf.len();
            if scanned > MAX_HEAD_BYTES {
                return Err(invalid("a head over 64 KiB"));
            }
            if !self.fill().await? {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(eof("in a head"))
                };
            }
        }
    }

    /// Reads exactly `n` bytes into `out`.
    async fn read_exact_into(&mut self, n: usize, out: &mut Vec<u8>) -> io::Result<()> {
        let mut left = n;
        while left > 0 {
            if self.buf.is_empty() && !self.fill().await? {
                return Err(eof("in a body"));
            }
            let take = left.min(self.buf.len());
            out.extend_from_slice(&self.buf[..take]);
            self.buf.advance(take);
            left -= take;
        }
        Ok(())
    }

    /// Reads one CRLF-terminated line into `out` (CRLF included).
    async fn read_line_into(&mut self, out: &mut Vec<u8>) -> io::Result<Vec<u8>> {
        loop {
            if let Some(i) = find(&self.buf, b"\r\n") {
                let line = self.buf.split_to(i + 2).to_vec();
                out.extend_from_slice(&line);
                return Ok(line);
            }
            if self.buf.len() > MAX_HEAD_BYTES {
                return Err(invalid("a chunk line over 64 KiB"));
            }
            if !self.fill().await? {
                return Err(eof("in a chunk line"));
            }
        }
    }

    /// Reads a body framed by `framing`.
    pub async fn read_body(&mut self, framing: Framing) -> io::Result<Body> {
        let mut body = Body::default();
        match framing {
            Framing::Length(n) => {
                let n = usize::try_from(n).map_err(|_| invalid("a body too large"))?;
                body.wire.reserve(n);
                self.read_exact_into(n, &mut body.wire).await?;
                body.payload_bytes = n as u64;
            }
            Framing::Chunked => loop {
                let line = self.read_line_into(&mut body.wire).await?;
                let text = std::str::from_utf8(&line).map_err(|_| invalid("a chunk size"))?;
                let size = text.trim_end().split(';').next().unwrap_or_default().trim();
                let size =
                    usize::from_str_radix(size, 16).map_err(|_| invalid("a bad chunk size"))?;
                if size == 0 {
                    // Trailers, through the blank line.
                    while self.read_line_into(&mut body.wire).await?.len() > 2 {}
                    break;
                }
                self.read_exact_into(size + 2, &mut body.wire).await?;
                body.payload_bytes += size as u64;
            },
            Framing::UntilClose => {
                while self.fill().await? {}
                body.payload_bytes = self.buf.len() as u64;
                body.wire.extend_from_slice(&self.buf);
                self.buf.clear();
            }
        }
        Ok(body)
    }

    /// Reads and drops up to `n` body bytes (a refused request's), for at
    /// most `limit`, so the client reads the answer rather than a reset.
    pub async fn discard(&mut self, n: u64, limit: std::time::Duration) {
        let _ = tokio::time::timeout(limit, async {
            let mut left = n;
            while left > 0 {
                if self.buf.is_empty() && !matches!(self.fill().await, Ok(true)) {
                    return;
                }
                let take = (left.min(self.buf.len() as u64)) as usize;
                self.buf.advance(take);
                left -= take as u64;
            }
        })
        .await;
    }

    /// Writes `parts` in order.
    pub async fn write_all(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        for p in parts {
            self.stream.write_all(p).await?;
        }
        self.stream.flush().await
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

fn eof(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("connection closed {what}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> Head {
        Head::parse(text.as_bytes().to_vec()).expect("a valid head")
    }

    #[test]
    fn framing_follows_the_headers_and_the_method() {
        let put = head("PUT /a/c/b?comp=page HTTP/1.1\r\nContent-Length: 512\r\n\r\n");
        assert_eq!(put.request_body().unwrap(), Framing::Length(512));
        let get = head("GET /a/c/b HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(get.request_body().unwrap(), Framing::Length(0));
        let chunked = head("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!(chunked.response_body("GET").unwrap(), Framing::Chunked);
        let props = head("HTTP/1.1 200 OK\r\nContent-Length: 1048576\r\n\r\n");
        assert_eq!(props.response_body("HEAD").unwrap(), Framing::Length(0));
        assert_eq!(
            props.response_body("GET").unwrap(),
            Framing::Length(1 << 20)
        );
        let open = head("HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!(open.response_body("GET").unwrap(), Framing::UntilClose);
    }

    #[test]
    fn a_header_can_be_left_out_and_the_rest_stays_as_it_came() {
        let h = head("PUT /x HTTP/1.1\r\nExpect: 100-continue\r\nx-ms-date: D\r\n\r\n");
        assert_eq!(
            h.without("expect"),
            b"PUT /x HTTP/1.1\r\nx-ms-date: D\r\n\r\n"
        );
    }
}
