//! The fixed newstyle negotiation: greeting, client flags, then options
//! until `NBD_OPT_GO` or `NBD_OPT_EXPORT_NAME` picks an export.
//!
//! Bad input is answered as the specification says and negotiation goes
//! on: an option out of order or malformed gets `NBD_REP_ERR_INVALID`, an
//! unknown or unoffered one `NBD_REP_ERR_UNSUP` (newer qemu asks for
//! extended headers first and falls back), an unknown export
//! `NBD_REP_ERR_UNKNOWN`. Only a framing error (a wrong magic, a truncated
//! message, an option too long to skip) ends the connection, and so does an
//! unknown name given to `NBD_OPT_EXPORT_NAME`, which has no error reply.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::export::{Export, Exports, MAX_PAYLOAD_BYTES, MIN_BLOCK_BYTES, PREFERRED_BLOCK_BYTES};
use super::proto::*;
use super::refusals;

/// Option data read whole; a longer option is skipped and refused with
/// `NBD_REP_ERR_TOO_BIG`.
pub const MAX_OPTION_BYTES: u32 = 64 * 1024;
/// An option longer than this is not even skipped: the connection ends.
const MAX_SKIPPED_OPTION_BYTES: u32 = 16 * 1024 * 1024;
/// The id of `base:allocation` in replies to `NBD_OPT_SET_META_CONTEXT`.
pub const ALLOCATION_CONTEXT_ID: u32 = 1;

/// What the negotiation settled.
pub struct Negotiated {
    /// The export chosen.
    pub export: Arc<Export>,
    /// Structured replies were negotiated.
    pub structured: bool,
    /// `base:allocation` was selected for this export: its context id.
    pub allocation_context: Option<u32>,
    /// The client asked for block sizes with `NBD_OPT_GO`, so it promised
    /// to keep to them: unaligned requests get `NBD_EINVAL`.
    pub block_sizes_agreed: bool,
}

/// Why a negotiation ended without an export.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The connection failed or closed mid-message.
    #[error("connection closed or failed during the handshake: {0}")]
    Io(#[from] std::io::Error),
    /// The client broke the framing (a wrong magic, an oversized option).
    #[error("handshake framing error: {0}")]
    Framing(String),
    /// The client asked `NBD_OPT_EXPORT_NAME` for an export that does not
    /// exist (that option has no error reply).
    #[error("no export named {0:?}")]
    UnknownExport(String),
}

/// Negotiates on `stream`; `Ok(None)` when the client ended it
/// (`NBD_OPT_ABORT`).
pub async fn negotiate<S>(
    stream: &mut S,
    exports: &Exports,
) -> Result<Option<Negotiated>, HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut greeting = Vec::with_capacity(18);
    greeting.extend_from_slice(&NBDMAGIC.to_be_bytes());
    greeting.extend_from_slice(&IHAVEOPT.to_be_bytes());
    greeting.extend_from_slice(&(NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES).to_be_bytes());
    stream.write_all(&greeting).await?;
    stream.flush().await?;
    let client_flags = stream.read_u32().await?;
    if client_flags & !(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES) != 0 {
        return Err(HandshakeError::Framing(format!(
            "unknown client flags {client_flags:#x}"
        )));
    }
    let no_zeroes = client_flags & NBD_FLAG_C_NO_ZEROES != 0;
    let mut state = State::default();
    loop {
        let magic = stream.read_u64().await?;
        if magic != IHAVEOPT {
            return Err(HandshakeError::Framing(format!(
                "option without IHAVEOPT (magic {magic:#x})"
            )));
        }
        let option = stream.read_u32().await?;
        let len = stream.read_u32().await?;
        if len > MAX_OPTION_BYTES {
            if len > MAX_SKIPPED_OPTION_BYTES {
                return Err(HandshakeError::Framing(format!(
                    "option {} of {len} bytes",
                    option_name(option)
                )));
            }
            skip(stream, u64::from(len)).await?;
            if let Some(left_out) = admit(option, NBD_REP_ERR_TOO_BIG) {
                tracing::warn!(
                    option = option_name(option),
                    len,
                    left_out,
                    "NBD option too long: refused{}",
                    refusals::note(left_out)
                );
            }
            let reply = option_error(option, NBD_REP_ERR_TOO_BIG, "option data too long");
            stream.write_all(&reply).await?;
            stream.flush().await?;
            continue;
        }
        let mut data = vec![0u8; len as usize];
        stream.read_exact(&mut data).await?;
        match state.option(option, &data, exports, no_zeroes) {
            Step::Reply(bytes) => {
                stream.write_all(&bytes).await?;
                stream.flush().await?;
            }
            Step::Go(bytes, negotiated) => {
                stream.write_all(&bytes).await?;
                stream.flush().await?;
                return Ok(Some(negotiated));
            }
            Step::Abort(bytes) => {
                // The client may already have closed its end.
                let _ = stream.write_all(&bytes).await;
                let _ = stream.flush().await;
                return Ok(None);
            }
            Step::Close(err) => return Err(err),
        }
    }
}

/// Reads and drops `len` bytes.
async fn skip<S: AsyncRead + Unpin>(stream: &mut S, len: u64) -> std::io::Result<()> {
    let copied = tokio::io::copy(&mut stream.take(len), &mut tokio::io::sink()).await?;
    if copied < len {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// What one option leads to.
pub enum Step {
    /// Send these bytes and read the next option.
    Reply(Vec<u8>),
    /// Send these bytes and enter transmission.
    Go(Vec<u8>, Negotiated),
    /// Send these bytes (best effort) and close: the client aborted.
    Abort(Vec<u8>),
    /// Close without a reply.
    Close(HandshakeError),
}

/// The negotiation so far: the options' effects, with no I/O, so a fuzz
/// target can drive it with any bytes.
#[derive(Default)]
pub struct State {
    structured: bool,
    /// The export `NBD_OPT_SET_META_CONTEXT` named and whether it selected
    /// `base:allocation`.
    selected: Option<(String, bool)>,
}

/// Whether a refusal of `option` with `reply` is logged now, and how many
/// like it were not (`refusals.rs`): a peer may send bad options without
/// end on one connection, or on many, and each gets its error reply, not
/// a log line.
fn admit(option: u32, reply: u32) -> Option<u64> {
    // The replies (`NBD_REP_ERR_*`, bit 31 set) never equal a
    // transmission error, so these kinds stay apart from the requests'.
    refusals::global().admit((option_name(option), reply), std::time::Instant::now())
}

fn refuse(option: u32, reply: u32, message: &str) -> Step {
    if reply == NBD_REP_ERR_UNSUP && option == NBD_OPT_EXTENDED_HEADERS {
        tracing::debug!(option = option_name(option), "NBD option not offered");
    } else if let Some(left_out) = admit(option, reply) {
        tracing::warn!(
            option = option_name(option),
            option_number = option,
            left_out,
            "NBD option refused: {message}{}",
            refusals::note(left_out)
        );
    }
    Step::Reply(option_error(option, reply, message).to_vec())
}

impl State {
    /// The answer to `option` with `data`.
    pub fn option(&mut self, option: u32, data: &[u8], exports: &Exports, no_zeroes: bool) -> Step {
        match option {
            NBD_OPT_EXPORT_NAME => {
                let name = String::from_utf8_lossy(data).into_owned();
                let Some(export) = exports.find(&name) else {
                    return Step::Close(HandshakeError::UnknownExport(name));
                };
                let mut out = Vec::with_capacity(134);
                out.extend_from_slice(&export.device.size_bytes().to_be_bytes());
                out.extend_from_slice(&export.transmission_flags().to_be_bytes());
                if !no_zeroes {
                    out.extend_from_slice(&[0u8; 124]);
                }
                let negotiated = self.negotiated(export, false);
                Step::Go(out, negotiated)
            }
            NBD_OPT_ABORT => Step::Abort(option_reply(option, NBD_REP_ACK, &[]).to_vec()),
            NBD_OPT_LIST => {
                if !data.is_empty() {
                    return refuse(option, NBD_REP_ERR_INVALID, "NBD_OPT_LIST takes no data");
                }
                let mut out = Vec::new();
                for export in exports.all() {
                    out.extend_from_slice(&option_reply(
                        option,
                        NBD_REP_SERVER,
                        &server_entry(&export.name),
                    ));
                }
                out.extend_from_slice(&option_reply(option, NBD_REP_ACK, &[]));
                Step::Reply(out)
            }
            NBD_OPT_INFO | NBD_OPT_GO => {
                let request = match InfoRequest::parse(data) {
                    Ok(r) => r,
                    Err(e) => return refuse(option, NBD_REP_ERR_INVALID, &e.to_string()),
                };
                let Some(export) = exports.find(&request.name) else {
                    return refuse(
                        option,
                        NBD_REP_ERR_UNKNOWN,
                        &format!("no export named {:?}", request.name),
                    );
                };
                let mut out = Vec::new();
                let info = info_export(export.device.size_bytes(), export.transmission_flags());
                out.extend_from_slice(&option_reply(option, NBD_REP_INFO, &info));
                let sizes =
                    info_block_size(MIN_BLOCK_BYTES, PREFERRED_BLOCK_BYTES, MAX_PAYLOAD_BYTES);
                out.extend_from_slice(&option_reply(option, NBD_REP_INFO, &sizes));
                if request.requests.contains(&NBD_INFO_NAME) {
                    let mut name = NBD_INFO_NAME.to_be_bytes().to_vec();
                    name.extend_from_slice(export.name.as_bytes());
                    out.extend_from_slice(&option_reply(option, NBD_REP_INFO, &name));
                }
                out.extend_from_slice(&option_reply(option, NBD_REP_ACK, &[]));
                if option == NBD_OPT_INFO {
                    return Step::Reply(out);
                }
                let agreed = request.requests.contains(&NBD_INFO_BLOCK_SIZE);
                let negotiated = self.negotiated(export, agreed);
                Step::Go(out, negotiated)
            }
            NBD_OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    return refuse(
                        option,
                        NBD_REP_ERR_INVALID,
                        "NBD_OPT_STRUCTURED_REPLY takes no data",
                    );
                }
                self.structured = true;
                Step::Reply(option_reply(option, NBD_REP_ACK, &[]).to_vec())
            }
            NBD_OPT_LIST_META_CONTEXT | NBD_OPT_SET_META_CONTEXT => {
                let set = option == NBD_OPT_SET_META_CONTEXT;
                if set {
                    // Replaced even when this one fails.
                    self.selected = None;
                }
                if !self.structured {
                    return refuse(
                        option,
                        NBD_REP_ERR_INVALID,
                        "metadata contexts need structured replies first",
                    );
                }
                let request = match MetaContextRequest::parse(data) {
                    Ok(r) => r,
                    Err(e) => return refuse(option, NBD_REP_ERR_INVALID, &e.to_string()),
                };
                if exports.find(&request.export).is_none() {
                    return refuse(
                        option,
                        NBD_REP_ERR_UNKNOWN,
                        &format!("no export named {:?}", request.export),
                    );
                }
                let matches = |q: &str| {
                    if set {
                        q == BASE_ALLOCATION
                    } else {
                        q == BASE_ALLOCATION || q == "base:"
                    }
                };
                let chosen = if set {
                    request.queries.iter().any(|q| matches(q))
                } else {
                    request.queries.is_empty() || request.queries.iter().any(|q| matches(q))
                };
                let mut out = Vec::new();
                if chosen {
                    let id = if set { ALLOCATION_CONTEXT_ID } else { 0 };
                    out.extend_from_slice(&option_reply(
                        option,
                        NBD_REP_META_CONTEXT,
                        &meta_context(id, BASE_ALLOCATION),
                    ));
                }
                out.extend_from_slice(&option_reply(option, NBD_REP_ACK, &[]));
                if set {
                    self.selected = Some((request.export, chosen));
                }
                Step::Reply(out)
            }
            NBD_OPT_STARTTLS => refuse(option, NBD_REP_ERR_UNSUP, "TLS is not offered"),
            NBD_OPT_EXTENDED_HEADERS => refuse(
                option,
                NBD_REP_ERR_UNSUP,
                "extended headers are not offered",
            ),
            _ => refuse(option, NBD_REP_ERR_UNSUP, "unknown option"),
        }
    }

    fn negotiated(&self, export: Arc<Export>, block_sizes_agreed: bool) -> Negotiated {
        let allocation_context = match &self.selected {
            Some((name, true)) if exports_same(name, &export) => Some(ALLOCATION_CONTEXT_ID),
            _ => None,
        };
        Negotiated {
            export,
            structured: self.structured,
            allocation_context: allocation_context.filter(|_| self.structured),
            block_sizes_agreed,
        }
    }
}

/// True when `name` (as a client gave it) names `export` (the empty name is
/// the default export, which `Exports::find` resolved already).
fn exports_same(name: &str, export: &Export) -> bool {
    name.is_empty() || name == export.name
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nbd::refusals::logged;

    /// Sends `option` with `data` as a client does.
    async fn send<W: AsyncWrite + Unpin>(w: &mut W, option: u32, data: &[u8]) {
        w.write_all(&IHAVEOPT.to_be_bytes()).await.unwrap();
        w.write_all(&option.to_be_bytes()).await.unwrap();
        w.write_all(&(data.len() as u32).to_be_bytes())
            .await
            .unwrap();
        w.write_all(data).await.unwrap();
    }

    #[test]
    fn a_peer_sending_many_bad_options_gets_each_answer_but_few_log_lines() {
        const ROUNDS: usize = 200;
        let (answered, log) = logged(async {
            let exports = Exports::new(Vec::new());
            let (mut server, client) = tokio::io::duplex(64 * 1024);
            let (mut from_server, mut to_server) = tokio::io::split(client);
            let peer = tokio::spawn(async move {
                to_server
                    .write_all(&(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES).to_be_bytes())
                    .await
                    .unwrap();
                let too_long = vec![0u8; MAX_OPTION_BYTES as usize + 1];
                for _ in 0..ROUNDS {
                    send(&mut to_server, 0x7777, &[]).await;
                    send(&mut to_server, NBD_OPT_STARTTLS, &[]).await;
                    send(&mut to_server, NBD_OPT_LIST, b"x").await;
                    send(&mut to_server, NBD_OPT_GO, b"short").await;
                    send(&mut to_server, NBD_OPT_LIST_META_CONTEXT, &[]).await;
                    send(&mut to_server, NBD_OPT_STRUCTURED_REPLY, &[]).await;
                    send(&mut to_server, NBD_OPT_SET_META_CONTEXT, b"junk").await;
                    send(&mut to_server, NBD_OPT_INFO, &[0, 0, 0, 1, b'n', 0, 0]).await;
                    send(&mut to_server, 0x7778, &too_long).await;
                }
                send(&mut to_server, NBD_OPT_ABORT, &[]).await;
            });
            let drain = tokio::spawn(async move {
                let mut answers = Vec::new();
                from_server.read_to_end(&mut answers).await.unwrap();
                answers
            });
            let outcome = negotiate(&mut server, &exports).await;
            assert!(matches!(outcome, Ok(None)), "the client aborted");
            drop(server);
            peer.await.unwrap();
            drain.await.unwrap()
        });
        // Every bad option was answered (an error reply each, an ACK for
        // STRUCTURED_REPLY and ABORT)...
        let replies = answered
            .windows(8)
            .filter(|w| *w == NBD_REP_MAGIC.to_be_bytes())
            .count();
        assert!(replies > 9 * ROUNDS, "{replies} replies");
        // ...but each kind of refusal was logged once in the interval, not
        // once per option.
        let lines = log.lines().filter(|l| l.contains("NBD option")).count();
        assert!(
            (1..=8).contains(&lines),
            "{lines} lines for {} refusals:\n{log}",
            8 * ROUNDS
        );
    }
}
