//! Command-line interface: one file per command, thin.

/// Entry point of the `blobdrive` binary; returns the process exit code.
pub fn main() -> i32 {
    0
}
