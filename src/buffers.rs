//! Reusable byte buffers for large request bodies and read replies.
//!
//! A cold sequential read moves every byte through the reply to the kernel
//! (up to 1 MiB); Get bodies that are not streamed into the cache (the
//! client's other callers, an encrypting store) and flush spans are large
//! too (4 MiB). Freshly
//! allocated, each costs page faults and the kernel's zeroing of new pages
//! on first touch: 12-15% of the daemon's CPU in a cold read (`perf`:
//! `exc_page_fault`, `clear_page_erms`, `do_anonymous_page`). Buffers taken
//! here come back when the last [`Bytes`] that shares them is dropped
//! ([`Bytes::from_owner`]), so their pages stay mapped and warm.
//!
//! Bounded: at most [`MAX_IDLE_BYTES`] wait for reuse, so the pool holds no
//! more than the peak of buffers in use plus that. Buffers smaller than
//! [`MIN_POOLED_BYTES`] are left to the allocator, which reuses small ones
//! well by itself.

use std::sync::{Mutex, OnceLock};

use bytes::Bytes;

/// Smallest buffer worth pooling.
pub const MIN_POOLED_BYTES: usize = 64 * 1024;
/// Largest buffer pooled: one Put Page or Get of the largest size, plus slack.
const MAX_POOLED_BYTES: usize = 8 * 1024 * 1024;
/// Idle buffers kept for reuse at most, in bytes.
pub const MAX_IDLE_BYTES: usize = 32 * 1024 * 1024;

struct Pool {
    idle: Mutex<(Vec<Vec<u8>>, usize)>,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool {
        idle: Mutex::new((Vec::new(), 0)),
    })
}

/// An empty buffer with room for at least `len` bytes: an idle one of a
/// fitting size (at most twice `len`) when there is one.
pub fn take(len: usize) -> Vec<u8> {
    if !(MIN_POOLED_BYTES..=MAX_POOLED_BYTES).contains(&len) {
        return Vec::with_capacity(len);
    }
    let reused = {
        let mut idle = pool().idle.lock().expect("buffer pool mutex poisoned");
        let (list, bytes) = &mut *idle;
        let fit = list
            .iter()
            .position(|b| b.capacity() >= len && b.capacity() <= 2 * len);
        fit.map(|i| {
            let b = list.swap_remove(i);
            *bytes -= b.capacity();
            b
        })
    };
    match reused {
        Some(mut b) => {
            b.clear();
            b
        }
        // Power-of-two sizes, so buffers fit the next request of a size
        // near theirs.
        None => Vec::with_capacity(len.next_power_of_two()),
    }
}

/// `buf` as [`Bytes`]; its memory goes back to the pool when the last
/// handle to it is dropped.
pub fn freeze(buf: Vec<u8>) -> Bytes {
    if !(MIN_POOLED_BYTES..=MAX_POOLED_BYTES * 2).contains(&buf.capacity()) {
        return Bytes::from(buf);
    }
    Bytes::from_owner(Pooled(buf))
}

/// A buffer that returns to the pool when dropped.
struct Pooled(Vec<u8>);

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.0);
        let mut idle = pool().idle.lock().expect("buffer pool mutex poisoned");
        let (list, bytes) = &mut *idle;
        if *bytes + buf.capacity() <= MAX_IDLE_BYTES {
            *bytes += buf.capacity();
            list.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_buffer_is_taken_again_and_small_ones_are_not_pooled() {
        let mut b = take(300_000);
        b.extend_from_slice(&[7u8; 300_000]);
        let frozen = freeze(b);
        let copy = frozen.clone();
        drop(frozen);
        assert_eq!(copy[299_999], 7, "still shared: not back yet");
        drop(copy);
        // Other tests may take it first; it comes back at most once here.
        let again = take(300_000);
        assert!(again.is_empty() && again.capacity() >= 300_000);
        assert!(take(100).capacity() < MIN_POOLED_BYTES);
    }
}
