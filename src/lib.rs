//! blobdrive: Azure page blobs as Linux disks.
//!
//! Layers, each knowing only those below: `cli` → `csi` (the Kubernetes
//! CSI plugin) → `lifecycle` (resize, copy,
//! restore, diff) → `daemon` → `fs` → `drive` → `blob`, and `nbd` (an NBD
//! server over `fs`'s devices) beside `daemon`, with `vhd` (the VHD formats), `partition` (partition tables and
//! superblocks, read before an attach), `attach` (loop devices and
//! filesystems), `transfer` (upload, download), `recovery` (recovery files),
//! `provision` (the one create and delete of a drive, and the checks they
//! share with the other commands),
//! `metrics` (latency histograms and event counts for Prometheus, fed by every
//! layer), `private_dir` (directories and files only their owner may open),
//! `open_files` (a daemon's open-file limit and its tools') and `units`
//! (page arithmetic) beside them. ARCHITECTURE.md at the top of the
//! repository describes them and the life of a request; docs/ holds the facts
//! the code relies on, with their sources.

pub mod attach;
pub mod blob;
pub mod buffers;
pub mod cli;
pub mod crypt;
pub mod csi;
pub mod daemon;
pub mod drive;
pub mod fs;
pub mod lifecycle;
pub mod metrics;
pub mod nbd;
pub mod open_files;
pub mod partition;
pub mod private_dir;
pub mod provision;
pub mod recovery;
pub mod shared_memory;
pub mod transfer;
pub mod units;
pub mod version;
pub mod vhd;
