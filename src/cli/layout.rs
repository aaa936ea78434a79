//! Reading a drive's partition layout straight from its blob (for `info` and
//! the partition choice of `mount`): a [`DiskReader`] over Get Blob ranges.

use anyhow::anyhow;

use super::drives::explain;
use crate::blob::{BlobClient, BlobPath};
use crate::partition::DiskReader;
use crate::units::ByteRange;

/// The disk of a drive read straight from its blob (for `info` and the
/// partition choice of `mount`), in 64 KiB-aligned pieces kept for reuse:
/// the table and the superblocks sit in a few small spots. Each read runs on
/// the caller's runtime, so the partition parsers stay plain synchronous code.
struct BlobDisk<'a> {
    rt: &'a tokio::runtime::Runtime,
    client: &'a BlobClient,
    path: &'a BlobPath,
    disk_bytes: u64,
    pieces: std::collections::HashMap<u64, bytes::Bytes>,
}

/// Granularity of [`BlobDisk`] reads.
const PIECE_BYTES: u64 = 64 * 1024;

impl BlobDisk<'_> {
    /// One Get Blob of `range`, checked to be whole.
    fn fetch(&self, range: ByteRange) -> std::io::Result<bytes::Bytes> {
        let data = self
            .rt
            .block_on(self.client.get_blob_range(self.path, range))
            .map_err(|e| std::io::Error::other(explain(&e)))?;
        if data.len() as u64 != range.len() {
            return Err(std::io::Error::other("short read of the drive"));
        }
        Ok(data)
    }
}

impl DiskReader for BlobDisk<'_> {
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

/// Reads the partition table of drive `path` (`disk_bytes` of disk before
/// its footer) and what each partition holds, on a runtime of its own (so it
/// can run before `mount` forks: the runtime and its threads are gone when
/// this returns). The outer error is a failed read, the inner one a table
/// that does not add up.
pub fn read_layout(
    client: &BlobClient,
    path: &BlobPath,
    disk_bytes: u64,
) -> anyhow::Result<Result<crate::partition::Layout, crate::partition::Error>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| anyhow!("cannot start the async runtime: {e}"))?;
    let mut disk = BlobDisk {
        rt: &rt,
        client,
        path,
        disk_bytes,
        pieces: Default::default(),
    };
    match crate::partition::Layout::read(&mut disk) {
        Err(crate::partition::Error::Io(e)) => {
            Err(anyhow!("cannot read the partition table of {path}: {e}"))
        }
        other => Ok(other),
    }
}
