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

/// First sector of the partition: 1 MiB, the alignment every tool uses.
const FIRST_SECTOR: u64 = 2048;
/// Sectors the backup GPT takes at the end (32 of entries, 1 header).
const BACKUP_GPT_SECTORS: u64 = 33;

/// The sfdisk script of the data-disk layout for a disk of `disk_bytes`. The
/// size is given, so the partition ends at the last usable sector (sfdisk
/// would otherwise round its end down to a whole MiB).
fn data_disk_script(disk_bytes: u64) -> String {
    let sectors = disk_bytes / 512;
    let last_usable = sectors - BACKUP_GPT_SECTORS - 1;
    format!(
        "label: gpt\nfirst-lba: {FIRST_SECTOR}\nstart={FIRST_SECTOR}, size={}, type={}\n",
        last_usable - FIRST_SECTOR + 1,
        crate::partition::LINUX_FILESYSTEM_GUID
    )
}

/// Writes a GPT with one Linux filesystem partition from 1 MiB to the end.
pub fn write_data_disk_gpt(file: &Path) -> Result<(), ToolError> {
    let disk_bytes = std::fs::metadata(file)
        .map_err(|e| ToolError {
            tool: "sfdisk".into(),
            detail: format!("cannot read the size of {}: {e}", file.display()),
            code: None,
        })?
        .len();
    run_with_input(
        "sfdisk",
        [
            "--quiet".as_ref(),
            "--no-reread".as_ref(),
            "--no-tell-kernel".as_ref(),
            file.as_os_str(),
        ],
        &data_disk_script(disk_bytes),
    )
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_partition_runs_from_one_mib_to_the_last_usable_sector() {
        // 64 MiB: 131072 sectors, the last usable is 131072 - 34.
        assert_eq!(
            data_disk_script(64 << 20),
            "label: gpt\nfirst-lba: 2048\nstart=2048, size=128991, \
             type=0FC63DAF-8483-4772-8E79-3D69D8477DE4\n"
        );
    }
}
