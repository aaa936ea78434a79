//! The resume record of an upload, kept in the blob's own metadata while the
//! upload runs, and removed when it completes.
//!
//! Two entries: `blobdriveupload` names the upload (`v1 data=N chunk=N
//! source=N kind=K`), and `blobdriveuploaddone` holds, in base64, a bitmap of
//! the chunks recorded as done followed by the CRC32C content digest of each
//! of them. A chunk is recorded only after every Put Page of it succeeded,
//! so a crash at any point leaves a record that claims nothing unsent.
//!
//! Metadata holds at most 8 KiB in all, so the number of chunks is bounded
//! ([`MAX_CHUNKS`]): images larger than 4 GiB get larger chunks (a power of
//! two times 4 MiB), which only coarsens what a resume re-sends.

use std::collections::BTreeMap;

use base64::Engine;

use super::scan::{ChunkGrid, BLOCK_BYTES};

/// Metadata name of the upload's identity.
pub const UPLOAD_KEY: &str = "blobdriveupload";
/// Metadata name of the done chunks and their digests.
pub const DONE_KEY: &str = "blobdriveuploaddone";
/// Most chunks an upload has: 128 bytes of bitmap and 4 KiB of digests,
/// about 5.6 KiB in base64, within the service's 8 KiB of metadata.
pub const MAX_CHUNKS: u64 = 1024;

/// Chunk size for a data area of `data_len` bytes: 4 MiB, doubled until
/// there are at most [`MAX_CHUNKS`].
pub fn chunk_bytes_for(data_len: u64) -> u64 {
    let mut c = BLOCK_BYTES;
    while data_len.div_ceil(c) > MAX_CHUNKS {
        c *= 2;
    }
    c
}

/// What an upload is of: a resume must be of the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Bytes of the disk (data area).
    pub data_len: u64,
    /// Bytes per chunk.
    pub chunk_bytes: u64,
    /// Size of the source file.
    pub source_len: u64,
    /// `raw`, `raw-padded` or `fixed-vhd`.
    pub kind: String,
}

impl Identity {
    fn encode(&self) -> String {
        format!(
            "v1 data={} chunk={} source={} kind={}",
            self.data_len, self.chunk_bytes, self.source_len, self.kind
        )
    }

    fn decode(s: &str) -> Result<Identity, String> {
        let mut words = s.split_whitespace();
        if words.next() != Some("v1") {
            return Err(format!("unknown upload record {s:?}"));
        }
        let mut fields: BTreeMap<&str, &str> = BTreeMap::new();
        for w in words {
            if let Some((k, v)) = w.split_once('=') {
                fields.insert(k, v);
            }
        }
        let num = |k: &str| -> Result<u64, String> {
            fields
                .get(k)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("upload record lacks {k}"))
        };
        Ok(Identity {
            data_len: num("data")?,
            chunk_bytes: num("chunk")?,
            source_len: num("source")?,
            kind: fields.get("kind").copied().unwrap_or("").to_string(),
        })
    }

    /// The chunk grid of this upload.
    pub fn grid(&self) -> ChunkGrid {
        ChunkGrid {
            data_len: self.data_len,
            chunk_bytes: self.chunk_bytes,
        }
    }

    /// For messages: `2.0 GiB raw image of 2.0 GiB`.
    pub fn describe(&self) -> String {
        format!(
            "{} of {} from a {}-byte file",
            self.kind,
            crate::units::format_size(self.data_len),
            self.source_len
        )
    }
}

/// The record: identity and, per chunk, its digest once done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Journal {
    /// What is uploaded.
    pub identity: Identity,
    /// Per chunk: `Some(digest)` once recorded as done.
    pub done: Vec<Option<u32>>,
}

impl Journal {
    /// A record with nothing done.
    pub fn new(identity: Identity) -> Journal {
        let n = identity.grid().count() as usize;
        Journal {
            identity,
            done: vec![None; n],
        }
    }

    /// Chunks recorded as done.
    pub fn done_count(&self) -> u64 {
        self.done.iter().filter(|d| d.is_some()).count() as u64
    }

    /// True when every chunk is done.
    pub fn complete(&self) -> bool {
        self.done.iter().all(Option::is_some)
    }

    /// The metadata entries (they replace all of the blob's metadata).
    pub fn to_metadata(&self) -> Vec<(String, String)> {
        let n = self.done.len();
        let mut bytes = vec![0u8; n.div_ceil(8)];
        let mut digests = Vec::new();
        for (i, d) in self.done.iter().enumerate() {
            if let Some(d) = d {
                bytes[i / 8] |= 1 << (i % 8);
                digests.extend_from_slice(&d.to_le_bytes());
            }
        }
        bytes.extend_from_slice(&digests);
        vec![
            (UPLOAD_KEY.to_string(), self.identity.encode()),
            (
                DONE_KEY.to_string(),
                base64::engine::general_purpose::STANDARD.encode(&bytes),
            ),
        ]
    }

    /// The record in a blob's metadata: `None` when there is none,
    /// `Some(Err)` when it cannot be read.
    pub fn from_metadata(meta: &BTreeMap<String, String>) -> Option<Result<Journal, String>> {
        let id = meta.get(UPLOAD_KEY)?;
        Some(Self::decode(id, meta.get(DONE_KEY).map(String::as_str)))
    }

    fn decode(id: &str, done: Option<&str>) -> Result<Journal, String> {
        let identity = Identity::decode(id)?;
        if identity.chunk_bytes == 0
            || identity.chunk_bytes % BLOCK_BYTES != 0
            || identity.grid().count() > MAX_CHUNKS
        {
            return Err(format!("upload record has a bad chunk size: {id:?}"));
        }
        let mut j = Journal::new(identity);
        let Some(done) = done.filter(|d| !d.is_empty()) else {
            return Ok(j);
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(done)
            .map_err(|e| format!("upload record is damaged: {e}"))?;
        let n = j.done.len();
        let map_len = n.div_ceil(8);
        if bytes.len() < map_len {
            return Err("upload record is damaged: bitmap too short".into());
        }
        let mut digests = bytes[map_len..].chunks_exact(4);
        for i in 0..n {
            if bytes[i / 8] & (1 << (i % 8)) != 0 {
                let d = digests
                    .next()
                    .ok_or("upload record is damaged: digests missing")?;
                j.done[i] = Some(u32::from_le_bytes([d[0], d[1], d[2], d[3]]));
            }
        }
        Ok(j)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::{GIB, MIB, TIB};

    #[test]
    fn chunk_size_keeps_the_record_within_metadata_limits() {
        assert_eq!(chunk_bytes_for(2 * GIB), 4 * MIB);
        assert_eq!(chunk_bytes_for(4 * GIB), 4 * MIB);
        assert_eq!(chunk_bytes_for(4 * GIB + MIB), 8 * MIB);
        let c = chunk_bytes_for(8 * TIB - MIB);
        assert!((8 * TIB - MIB).div_ceil(c) <= MAX_CHUNKS);
        // A full record fits in the 8 KiB the service allows for metadata.
        let id = Identity {
            data_len: 8 * TIB - MIB,
            chunk_bytes: c,
            source_len: 8 * TIB - MIB,
            kind: "raw".into(),
        };
        let mut j = Journal::new(id);
        j.done.iter_mut().for_each(|d| *d = Some(u32::MAX));
        let size: usize = j.to_metadata().iter().map(|(k, v)| k.len() + v.len()).sum();
        assert!(size < 7 * 1024, "{size} bytes");
    }

    #[test]
    fn record_round_trips_through_metadata() {
        let id = Identity {
            data_len: 64 * MIB,
            chunk_bytes: 4 * MIB,
            source_len: 64 * MIB + 512,
            kind: "fixed-vhd".into(),
        };
        let mut j = Journal::new(id);
        j.done[0] = Some(7);
        j.done[5] = Some(0xdead_beef);
        j.done[15] = Some(0);
        let meta: BTreeMap<String, String> = j.to_metadata().into_iter().collect();
        let back = Journal::from_metadata(&meta)
            .expect("present")
            .expect("valid");
        assert_eq!(back, j);
        assert_eq!(back.done_count(), 3);
        assert!(Journal::from_metadata(&BTreeMap::new()).is_none());
    }

    #[test]
    fn damaged_record_is_an_error_not_a_guess() {
        let mut meta = BTreeMap::new();
        meta.insert(
            UPLOAD_KEY.to_string(),
            "v1 data=8388608 chunk=4194304 source=8388608 kind=raw".to_string(),
        );
        meta.insert(DONE_KEY.to_string(), "AQ==".to_string()); // chunk 0 done, no digest
        assert!(Journal::from_metadata(&meta).expect("present").is_err());
        meta.insert(UPLOAD_KEY.to_string(), "v9".to_string());
        assert!(Journal::from_metadata(&meta).expect("present").is_err());
    }
}
