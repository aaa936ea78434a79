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
