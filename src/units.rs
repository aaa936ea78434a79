//! Units and sizes shared by every layer: the 512-byte page, the 4 MiB Put Page
//! limit, the VHD footer size, and a parser for human sizes (`512M`, `10G`).
//!
//! Offsets in bytes and in pages are easy to mix up; a mix-up corrupts a disk.
//! Page quantities carry the `_pages` suffix or the [`PageIndex`] type.

/// Size of one page of a page blob, the unit of every write and clear.
pub const PAGE_SIZE: u64 = 512;
/// Largest body a single Put Page (update) may carry.
pub const MAX_PUT_PAGE_BYTES: u64 = 4 * 1024 * 1024;
/// Size of the fixed VHD footer at the end of a drive's blob.
pub const VHD_FOOTER_BYTES: u64 = 512;
/// Largest page blob the service accepts (8 TiB).
pub const MAX_PAGE_BLOB_BYTES: u64 = 8 * 1024 * 1024 * 1024 * 1024;

/// A half-open byte range `[start, end)` of a blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ByteRange {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
}

impl ByteRange {
    /// A range from `start` (inclusive) to `end` (exclusive).
    pub fn new(start: u64, end: u64) -> Self {
        debug_assert!(start <= end, "range start {start} after end {end}");
        ByteRange { start, end }
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// True when the range holds no byte.
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }
}
