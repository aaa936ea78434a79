//! The on-disk form of one cached chunk, as its slot holds it (`slab.rs`):
//! a header with the chunk number, two page bitmaps and a CRC-32C, followed
//! by the bytes of the pages that hold something other than zeros.
//!
//! ```text
//! magic "BDCHUNK2" | chunk index u64 LE | held bits (64 B) | zero bits (64 B)
//! | data length u32 LE | crc32c u32 LE | data (held, non-zero pages, in order)
//! ```
//!
//! `held` marks the pages whose blob content the slot knows; `zero` (a subset
//! of `held`) marks those known to be all zeros, which take no bytes. The CRC
//! covers the header before it and all the data. Invariant: [`decode`] returns
//! a chunk only if every byte checks out (magic, index, lengths, CRC), so a
//! torn or flipped slot is never served. The magic names the layout: a
//! chunk of the first layout (`BDCHUNK1`, one file per chunk) is never read
//! as one of this one.

use bytes::Bytes;

use super::{ChunkBits, PAGES, PAGE_BYTES};

const MAGIC: &[u8; 8] = b"BDCHUNK2";
const BITS_BYTES: usize = PAGES / 8;
/// Bytes before the data.
pub(crate) const HEADER_BYTES: usize = 8 + 8 + 2 * BITS_BYTES + 4 + 4;
const CRC_AT: usize = HEADER_BYTES - 4;

/// The known pages of one chunk, as held in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedChunk {
    /// Pages whose content is known.
    pub held: ChunkBits,
    /// Known pages that are all zeros (a subset of `held`).
    pub zero: ChunkBits,
    /// The non-zero held pages, 512 bytes each, in page order (a slice of
    /// the slot read, without a copy).
    pub data: Bytes,
    /// `held` and not `zero`: the pages in `data`.
    stored: ChunkBits,
}

impl CachedChunk {
    /// A chunk from its bitmaps and the bytes of its held non-zero pages.
    pub fn new(held: ChunkBits, zero: ChunkBits, data: impl Into<Bytes>) -> Self {
        let data: Bytes = data.into();
        let mut stored = ChunkBits::default();
        for (i, (h, z)) in held.words().iter().zip(zero.words()).enumerate() {
            stored.set_word(i, h & !z);
        }
        debug_assert_eq!(stored.count() * PAGE_BYTES, data.len());
        CachedChunk {
            held,
            zero,
            data,
            stored,
        }
    }

    /// Content of page `slot`: `None` when unknown, `Some(None)` for zeros.
    pub fn page(&self, slot: usize) -> Option<Option<&[u8]>> {
        if !self.held.get(slot) {
            return None;
        }
        if self.zero.get(slot) {
            return Some(None);
        }
        let n = self.stored.rank(slot);
        Some(Some(&self.data[n * PAGE_BYTES..(n + 1) * PAGE_BYTES]))
    }

    /// Every page's content, indexed by slot (`None` unknown, `Some(None)` zero).
    pub fn pages(&self) -> Vec<Option<Option<&[u8]>>> {
        let mut n = 0;
        (0..PAGES)
            .map(|slot| {
                if !self.held.get(slot) {
                    None
                } else if self.zero.get(slot) {
                    Some(None)
                } else {
                    let p = &self.data[n * PAGE_BYTES..(n + 1) * PAGE_BYTES];
                    n += 1;
                    Some(Some(p))
                }
            })
            .collect()
    }

    /// Size of the encoded chunk.
    pub fn encoded_len(&self) -> usize {
        HEADER_BYTES + self.data.len()
    }
}

fn put_bits(out: &mut Vec<u8>, bits: &ChunkBits) {
    for w in bits.words() {
        out.extend_from_slice(&w.to_le_bytes());
    }
}

fn get_bits(raw: &[u8]) -> ChunkBits {
    let mut bits = ChunkBits::default();
    for (i, w) in raw.chunks_exact(8).enumerate() {
        let w = u64::from_le_bytes(w.try_into().expect("8-byte slice"));
        bits.set_word(i, w);
    }
    bits
}

/// The header of chunk `index`; its slot holds this followed by
/// `chunk.data` (written separately, so the data is not copied once more).
pub fn header(index: u64, chunk: &CachedChunk) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&index.to_le_bytes());
    put_bits(&mut out, &chunk.held);
    put_bits(&mut out, &chunk.zero);
    out.extend_from_slice(&(chunk.data.len() as u32).to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&out), &chunk.data);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The chunk index and data length a header claims, when `raw` starts
/// with one (nothing is verified: [`decode`] does that).
pub fn peek(raw: &[u8]) -> Option<(u64, usize)> {
    if raw.len() < HEADER_BYTES || &raw[..8] != MAGIC {
        return None;
    }
    let index = u64::from_le_bytes(raw[8..16].try_into().expect("8 bytes"));
    let len = u32::from_le_bytes(raw[CRC_AT - 4..CRC_AT].try_into().expect("4 bytes"));
    Some((index, len as usize))
}

/// Why a slot was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bad {
    /// Shorter than its header says, or not a chunk.
    Torn,
    /// Written for another chunk.
    WrongIndex,
    /// Checksum mismatch: bytes changed on disk.
    Checksum,
}

/// Parse and verify the slot of chunk `index`.
pub fn decode(index: u64, raw: Bytes) -> Result<CachedChunk, Bad> {
    if raw.len() < HEADER_BYTES || &raw[..8] != MAGIC {
        return Err(Bad::Torn);
    }
    let u32_at = |at: usize| u32::from_le_bytes(raw[at..at + 4].try_into().expect("4 bytes"));
    let stored_index = u64::from_le_bytes(raw[8..16].try_into().expect("8 bytes"));
    let held = get_bits(&raw[16..16 + BITS_BYTES]);
    let zero = get_bits(&raw[16 + BITS_BYTES..16 + 2 * BITS_BYTES]);
    let data_len = u32_at(CRC_AT - 4) as usize;
    if raw.len() != HEADER_BYTES + data_len {
        return Err(Bad::Torn);
    }
    let crc = crc32c::crc32c_append(crc32c::crc32c(&raw[..CRC_AT]), &raw[HEADER_BYTES..]);
    if crc != u32_at(CRC_AT) {
        return Err(Bad::Checksum);
    }
    if stored_index != index {
        return Err(Bad::WrongIndex);
    }
    let zero_not_held = held
        .words()
        .iter()
        .zip(zero.words())
        .any(|(h, z)| z & !h != 0);
    if zero_not_held || (held.count() - zero.count()) * PAGE_BYTES != data_len {
        return Err(Bad::Torn);
    }
    Ok(CachedChunk::new(held, zero, raw.slice(HEADER_BYTES..)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CachedChunk {
        let mut held = ChunkBits::default();
        let mut zero = ChunkBits::default();
        held.set(0);
        held.set(3);
        zero.set(3);
        held.set(511);
        let mut data = vec![7u8; PAGE_BYTES];
        data.extend(vec![9u8; PAGE_BYTES]);
        CachedChunk::new(held, zero, data)
    }

    fn file(index: u64, chunk: &CachedChunk) -> Vec<u8> {
        [header(index, chunk), chunk.data.to_vec()].concat()
    }

    #[test]
    fn a_chunk_round_trips_and_zero_pages_take_no_bytes() {
        let c = sample();
        let raw = file(42, &c);
        assert_eq!(raw.len(), HEADER_BYTES + 2 * PAGE_BYTES);
        let back = decode(42, raw.into()).expect("valid file");
        assert_eq!(back, c);
        assert_eq!(back.page(0), Some(Some(&[7u8; PAGE_BYTES][..])));
        assert_eq!(back.page(3), Some(None));
        assert_eq!(back.page(4), None);
        assert_eq!(back.page(511), Some(Some(&[9u8; PAGE_BYTES][..])));
        assert_eq!(back.pages()[511], back.page(511));
    }

    #[test]
    fn every_flipped_byte_and_every_truncation_is_refused() {
        let raw = file(5, &sample());
        for at in 0..raw.len() {
            let mut bad = raw.clone();
            bad[at] ^= 0x40;
            assert!(decode(5, bad.into()).is_err(), "flip at {at} accepted");
        }
        for len in 0..raw.len() {
            assert!(
                decode(5, Bytes::copy_from_slice(&raw[..len])).is_err(),
                "truncated to {len} accepted"
            );
        }
        assert_eq!(decode(6, raw.into()), Err(Bad::WrongIndex));
    }
}
