//! A drive's layout read from its blob, for `info`, the partition choice of
//! `mount` and the shrink check of `resize`: the project's one detector,
//! [`crate::partition::Layout::read`] (the partition table first), over the
//! drive's [`PageStore`]. An encrypted drive is read through its
//! `EncryptedStore` once its key is unlocked, so the table and superblocks
//! are read as plaintext, never guessed from ciphertext.
//!
//! The partition parsers are synchronous; they run on a blocking thread
//! whose reads are Gets on the caller's runtime, in 64 KiB-aligned pieces
//! kept for reuse (the tables and superblocks sit in a few small spots).

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::anyhow;
use bytes::Bytes;

use crate::blob::{BlobClient, BlobPath};
use crate::crypt::DataKey;
use crate::drive::{BlobPageStore, EncryptedStore, PageStore};
use crate::partition::{self, DiskReader, Layout};
use crate::units::ByteRange;

/// Granularity of [`StoreDisk`] reads.
const PIECE_BYTES: u64 = 64 * 1024;

/// The first `disk_bytes` of a drive's store as a [`DiskReader`]. Used only
/// on a blocking thread: each read waits for a Get on `rt`.
struct StoreDisk {
    rt: tokio::runtime::Handle,
    store: Arc<dyn PageStore>,
    disk_bytes: u64,
    pieces: HashMap<u64, Bytes>,
}

impl StoreDisk {
    /// One read of `range`, checked to be whole.
    fn fetch(&self, range: ByteRange) -> std::io::Result<Bytes> {
        let data = self.rt.block_on(self.store.read(range)).map_err(|e| {
            std::io::Error::other(crate::provision::checks::blob_err(e).to_string())
        })?;
        if data.len() as u64 != range.len() {
            return Err(std::io::Error::other("short read of the drive"));
        }
        Ok(data)
    }
}

impl DiskReader for StoreDisk {
    fn size_bytes(&self) -> u64 {
        self.disk_bytes
    }

    fn read_at(&mut self, offset_bytes: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let end = offset_bytes + len as u64;
        if len as u64 > PIECE_BYTES {
            // Large reads (the emptiness check of a whole MiB) go out as one
            // request, not one per piece.
            return self
                .fetch(ByteRange::new(offset_bytes, end))
                .map(|b| b.to_vec());
        }
        let mut out = Vec::with_capacity(len);
        let mut piece = offset_bytes / PIECE_BYTES * PIECE_BYTES;
        while piece < end {
            if !self.pieces.contains_key(&piece) {
                let range = ByteRange::new(piece, (piece + PIECE_BYTES).min(self.disk_bytes));
                let data = self.fetch(range)?;
                self.pieces.insert(piece, data);
            }
            let data = &self.pieces[&piece];
            let from = offset_bytes.max(piece) - piece;
            let to = end.min(piece + data.len() as u64) - piece;
            out.extend_from_slice(&data[from as usize..to as usize]);
            piece += PIECE_BYTES;
        }
        Ok(out)
    }
}

/// The store a drive's layout is read through: the blob's pages, decrypted
/// with `key` when the drive is encrypted (its unlocked data key).
pub fn store_for(
    client: &BlobClient,
    path: &BlobPath,
    key: Option<Arc<DataKey>>,
) -> Arc<dyn PageStore> {
    let plain = Arc::new(BlobPageStore::new(client.clone(), path.clone()));
    match key {
        Some(key) => Arc::new(EncryptedStore::new(plain, key)),
        None => plain,
    }
}

/// Reads the layout of the drive in `store` (`disk_bytes` of disk before
/// its footer; an encrypted drive's store must be its `EncryptedStore`).
/// The outer error is a failed read, naming `drive`; the inner one a table
/// that does not add up.
pub async fn read_layout(
    store: Arc<dyn PageStore>,
    drive: &str,
    disk_bytes: u64,
) -> anyhow::Result<Result<Layout, partition::Error>> {
    let mut disk = StoreDisk {
        rt: tokio::runtime::Handle::current(),
        store,
        disk_bytes,
        pieces: HashMap::new(),
    };
    let read = tokio::task::spawn_blocking(move || Layout::read(&mut disk))
        .await
        .map_err(|e| anyhow!("reading the partition table of {drive} failed: {e}"))?;
    match read {
        Err(partition::Error::Io(e)) => {
            Err(anyhow!("cannot read the partition table of {drive}: {e}"))
        }
        other => Ok(other),
    }
}
