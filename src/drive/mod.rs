//! The drive engine: a block device over one page blob, with no FUSE knowledge.

pub mod blob_store;
pub mod store;

pub use blob_store::BlobPageStore;
pub use store::{ByteRange, PageStore};
