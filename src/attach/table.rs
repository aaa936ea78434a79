//! Writing a partition table with `sfdisk` (for `create --partition-table`).
//!
//! The layout is the one Azure's Linux VMs use for a data disk made in the
//! portal and partitioned as Azure's documentation shows: a GPT with one
//! "Linux filesystem" partition from 1 MiB to the end of the usable area.
//! sfdisk writes the protective MBR, both headers and both entry arrays; it
//! works on a plain file (the drive file of a FUSE mount) and is told not to
//! ask the kernel to re-read anything.

use std::path::Path;

use super::tool::{run_with_input, ToolError};

/// The sfdisk script of the data-disk layout.
const DATA_DISK_GPT: &str =
    "label: gpt\nfirst-lba: 2048\nstart=2048, type=0FC63DAF-8483-4772-8E79-3D69D8477DE4\n";

/// Writes a GPT with one Linux filesystem partition from 1 MiB to the end.
pub fn write_data_disk_gpt(file: &Path) -> Result<(), ToolError> {
    run_with_input(
        "sfdisk",
        [
            "--quiet".as_ref(),
            "--no-reread".as_ref(),
            "--no-tell-kernel".as_ref(),
            file.as_os_str(),
        ],
        DATA_DISK_GPT,
    )
    .map(|_| ())
}
