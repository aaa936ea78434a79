//! The drive engine: a block device over one page blob, with no FUSE knowledge.

pub mod store;

pub use store::{ByteRange, PageStore};
