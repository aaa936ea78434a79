//! A Kubernetes CSI (Container Storage Interface, spec v1.13.0) plugin:
//! `blobdrive csi` serves it on one Unix socket, over gRPC.
//!
//! The parts, each in its own module: [`messages`] (the spec's messages,
//! written by hand as prost types; the crate versions and why are said
//! there), [`services`] (the gRPC service traits `build.rs` generates),
//! [`identity`], [`controller`] and [`node`] (the three services), and
//! [`server`] (the socket and which services it serves). The command line
//! is `cli::csi`.
//!
//! What this layer owns: the mapping of CSI calls onto the drive operations
//! below it (`provision` makes and deletes drives; `daemon` attaches them
//! as `blobdrive mount` does) and of their failures onto the spec's gRPC
//! codes. What it does not: any rule of a drive (its size rule, its
//! refusals), which stay with the layers that own them.
//!
//! A volume's id is `CONTAINER/BLOB`, the drive's own name: stable across
//! plugin restarts and parseable without any state ([`volume::VolumeId`]).

pub mod controller;
pub mod credentials;
pub mod identity;
pub mod messages;
pub mod node;
pub mod server;
pub mod services;
pub mod volume;

/// The plugin's name, as a StorageClass's `provisioner` names it.
pub const DRIVER_NAME: &str = "blobdrive.csi.azure";
