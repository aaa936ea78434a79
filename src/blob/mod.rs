//! Azure Blob REST client: typed operations over HTTP, no cache, no FUSE.

pub mod error;

pub use error::{Error, ErrorKind, Result};
