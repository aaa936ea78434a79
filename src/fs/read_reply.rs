//! Replies to FUSE reads written as one vectored write of the cache's own
//! memory.
//!
//! Why: fuser's `ReplyData::data` takes one slice, and a read's bytes sit
//! in the page cache's 4 KiB blocks, so every read was first copied into
//! one buffer: 11-12% of the daemon's CPU in a cold sequential read
//! through ext4 (`perf`: `memmove` under the copy into the reply). The
//! kernel takes a reply as any number of iovecs, a 16-byte header first,
//! in one `writev` on the session's `/dev/fuse` descriptor (which is what
//! fuser does with its one slice). So [`ReadReplier`] writes the header
//! and the slices itself, on a duplicate of that descriptor.
//!
//! The `ReplyData` of a read answered this way is then forgotten: dropped
//! unanswered, it would send `EIO` for the same request. In fuser 0.18 a
//! reply is the request's id and a reference count on the session's
//! descriptor (a test below checks it is no bigger than that, and
//! Cargo.toml pins the version), so forgetting it holds that descriptor
//! open until the process exits instead of until the session ends; the
//! daemon exits when its session ends.
//!
//! Falls back to fuser's own reply (one slice, copied into a buffer when
//! needed) before the descriptor is known, for more slices than one write
//! takes, and when the kernel refuses the write for any reason but the
//! request being gone.

use std::io::IoSlice;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::OnceLock;

use fuser::{ReplyData, RequestId};

/// Iovecs one `writev` takes (`UIO_MAXIOV`).
const MAX_IOVECS: usize = 1024;

/// Sends read replies straight from the slices a device hands out.
#[derive(Default)]
pub struct ReadReplier {
    /// A duplicate of the session's `/dev/fuse` descriptor, set once the
    /// session is made (reads come only after that).
    device: OnceLock<OwnedFd>,
}

impl ReadReplier {
    /// Sends replies on `device`, a duplicate of the session's descriptor.
    /// A second call is ignored.
    pub fn set_device(&self, device: OwnedFd) {
        let _ = self.device.set(device);
    }

    /// Answers request `unique` (whose reply is `reply`) with the bytes of
    /// `data`, in order.
    pub fn send(&self, unique: RequestId, reply: ReplyData, data: &[IoSlice<'_>]) {
        let device = match (data, self.device.get()) {
            ([], _) => return reply.data(&[]),
            ([one], _) => return reply.data(one),
            (_, Some(device)) if data.len() < MAX_IOVECS => device,
            _ => return reply.data(&concat(data)),
        };
        let len: usize = data.iter().map(|s| s.len()).sum();
        let header = out_header(unique, len);
        let mut iov = Vec::with_capacity(data.len() + 1);
        iov.push(IoSlice::new(&header));
        iov.extend_from_slice(data);
        // SAFETY: `iov` is a valid array of `iov.len()` iovecs whose buffers
        // outlive the call (`IoSlice` is ABI-compatible with `iovec`).
        let rc = unsafe {
            libc::writev(
                device.as_raw_fd(),
                iov.as_ptr().cast::<libc::iovec>(),
                iov.len() as libc::c_int,
            )
        };
        if rc >= 0 {
            std::mem::forget(reply);
            return;
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ENOENT) {
            // The kernel no longer waits for this request (interrupted, or
            // the connection is going away): nothing more to send.
            tracing::debug!(unique = unique.0, "read reply for a request already gone");
            std::mem::forget(reply);
        } else {
            tracing::warn!(%err, "vectored read reply refused; sending a copy");
            reply.data(&concat(data));
        }
    }
}

/// The kernel's `fuse_out_header` of a successful reply carrying `len`
/// bytes: total length, error 0, the request's id, in native byte order.
fn out_header(unique: RequestId, len: usize) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&((16 + len) as u32).to_ne_bytes());
    h[8..16].copy_from_slice(&unique.0.to_ne_bytes());
    h
}

fn concat(data: &[IoSlice<'_>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.iter().map(|s| s.len()).sum());
    for s in data {
        out.extend_from_slice(s);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_is_no_more_than_a_request_id_and_a_shared_descriptor() {
        // What makes forgetting an answered reply harmless: if fuser's reply
        // ever holds more (a buffer, a second handle), forgetting it would
        // leak that on every read. Then stop forgetting and revisit.
        assert!(std::mem::size_of::<ReplyData>() <= 16);
    }

    #[test]
    fn the_header_counts_itself_and_carries_the_request_id() {
        let h = out_header(RequestId(0x0102_0304_0506_0708), 4096);
        assert_eq!(u32::from_ne_bytes(h[0..4].try_into().unwrap()), 16 + 4096);
        assert_eq!(i32::from_ne_bytes(h[4..8].try_into().unwrap()), 0);
        assert_eq!(
            u64::from_ne_bytes(h[8..16].try_into().unwrap()),
            0x0102_0304_0506_0708
        );
    }
}
