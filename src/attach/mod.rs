//! Attaching a drive file as a filesystem: a loop device with direct I/O over
//! the FUSE file, and the filesystem inside it mounted at the user's directory.
//!
//! This module only drives the kernel's tools (`losetup` and the loop
//! device's status ioctls, `blkid`, `mount`, `umount`, `fsfreeze`, `mkfs.*`,
//! `sfdisk`); it knows nothing of blobs or FUSE. Every
//! step that succeeds is undone by the matching teardown, in reverse order,
//! so a mount that fails half way leaves nothing behind.

pub mod filesystem;
pub mod loopdev;
pub mod table;
mod tool;

pub use filesystem::{FsType, MountedFs};
pub use loopdev::{LoopDevice, ReadQueue};
pub use tool::{tool_exists, ToolError};
