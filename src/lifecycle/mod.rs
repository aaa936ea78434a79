//! A drive's life after create: resize (offline, and online through the
//! daemon that holds the lease), restore from a snapshot, server-side copy,
//! snapshot pruning, and the diff between two states that incremental
//! downloads use.
//!
//! This module holds the logic; the commands under `cli/` only parse and
//! print. Invariants: nothing here replaces a blob it did not create, except
//! a restore, which holds the drive's lease and keeps a safety snapshot
//! unless told not to; a resize never leaves a blob without a valid footer
//! at one of the two sizes (see `drive::resize`).

pub mod copy;
pub mod diff;
pub mod layout;
pub mod resize;
