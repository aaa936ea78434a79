//! Writing partition tables with `sfdisk`: a new one (for `create
//! --partition-table`) and the changes of an online grow (the backup GPT moved
//! to the new end of the disk, a partition extended).
//!
//! The new layout is the one Azure's Linux VMs use for a data disk made in the
//! portal and partitioned as Azure's documentation shows: a GPT with one
//! "Linux filesystem" partition from 1 MiB to the end of the usable area.
//! sfdisk writes the protective MBR, both headers and both entry arrays; it
//! works on a plain file (the drive file of a FUSE mount) and is told not to
//! ask the kernel to re-read anything. Every change of an existing table runs
//! with sfdisk's `--backup`, into a [`TableUndo`], so a change the caller
//! finds wrong afterwards is put back byte for byte; the file is fsynced after
//! each write (through FUSE, that is a flush to the blob).

use std::path::{Path, PathBuf};

use super::tool::{run, run_with_input, ToolError};

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

/// The new size of a partition being extended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewSize {
    /// As far as the free space after it reaches (sfdisk's `+`): on a GPT,
    /// to the last usable sector.
    AsFarAsPossible,
    /// Exactly this many sectors (an MBR partition stopped at 2 TiB).
    Sectors(u64),
}

/// Moves the backup GPT (header and entry array) to the end of `file`, as a
/// disk grown since it was written needs (`sfdisk --relocate gpt-bak-std`);
/// the protective MBR's size is corrected with it.
pub fn relocate_gpt_backup(file: &Path, undo: &mut TableUndo) -> Result<(), ToolError> {
    let prefix = undo.next_prefix();
    run(
        "sfdisk",
        [
            "--no-reread".as_ref(),
            "--no-tell-kernel".as_ref(),
            "--backup".as_ref(),
            "--backup-file".as_ref(),
            prefix.as_os_str(),
            "--relocate".as_ref(),
            "gpt-bak-std".as_ref(),
            file.as_os_str(),
        ],
    )?;
    sync(file)
}

/// Sets the size of partition `number` of `file`, its start unchanged
/// (`sfdisk -N`), MBR or GPT, primary, extended or logical. sfdisk may
/// exit 0 having changed nothing (a logical partition cannot leave its
/// extended one): the caller reads the table back.
pub fn set_partition_size(
    file: &Path,
    number: u32,
    size: NewSize,
    undo: &mut TableUndo,
) -> Result<(), ToolError> {
    let prefix = undo.next_prefix();
    let number = number.to_string();
    run_with_input(
        "sfdisk",
        [
            "--no-reread".as_ref(),
            "--no-tell-kernel".as_ref(),
            "--backup".as_ref(),
            "--backup-file".as_ref(),
            prefix.as_os_str(),
            "-N".as_ref(),
            number.as_ref(),
            file.as_os_str(),
        ],
        &size_script(size),
    )?;
    sync(file)
}

/// The one-line sfdisk script of `-N`: an empty start keeps the start.
fn size_script(size: NewSize) -> String {
    match size {
        NewSize::AsFarAsPossible => ",+\n".to_string(),
        // A plain number is sectors, not aligned (a suffix would align it).
        NewSize::Sectors(n) => format!(",{n}\n"),
    }
}

/// Writes what was written to `file` to where it is kept (through FUSE: the blob).
fn sync(file: &Path) -> Result<(), ToolError> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(file)
        .and_then(|f| f.sync_all())
        .map_err(|e| ToolError {
            tool: "fsync".into(),
            detail: format!("{}: {e}", file.display()),
            code: None,
        })
}

/// The sectors sfdisk overwrote in a series of changes to one table (its
/// `--backup` files, one set per run), to put them back. The files live in
/// a private directory under the temp directory, removed on drop unless
/// [`TableUndo::keep`] was called.
#[derive(Debug)]
pub struct TableUndo {
    dir: PathBuf,
    runs: u32,
    keep: bool,
}

/// One area sfdisk saved: which run, where on the disk, the file holding it.
#[derive(Debug, PartialEq, Eq)]
struct SavedArea {
    run: u32,
    offset_bytes: u64,
    path: PathBuf,
}

impl TableUndo {
    /// A new, empty undo record.
    pub fn new() -> Result<TableUndo, ToolError> {
        let dir = std::env::temp_dir().join(format!("blobdrive-table-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir(&dir).map_err(|e| ToolError {
            tool: "sfdisk".into(),
            detail: format!("cannot create {} for its backup: {e}", dir.display()),
            code: None,
        })?;
        Ok(TableUndo {
            dir,
            runs: 0,
            keep: false,
        })
    }

    /// The `--backup-file` prefix of the next run.
    fn next_prefix(&mut self) -> PathBuf {
        self.runs += 1;
        self.dir.join(format!("run{}", self.runs))
    }

    /// Where the saved sectors are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Leaves the saved sectors on disk after drop (a restore that failed).
    pub fn keep(&mut self) {
        self.keep = true;
    }

    /// Every saved area, the latest run first (so restoring in this order
    /// leaves what was there before the first run).
    fn saved(&self) -> std::io::Result<Vec<SavedArea>> {
        let mut areas = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if let Some((run, offset_bytes)) = parse_backup_name(&name) {
                areas.push(SavedArea {
                    run,
                    offset_bytes,
                    path,
                });
            }
        }
        areas.sort_by(|a, b| b.run.cmp(&a.run).then(a.offset_bytes.cmp(&b.offset_bytes)));
        Ok(areas)
    }

    /// Writes every saved area back into `file`, latest run first, and
    /// fsyncs it; returns how many areas were written.
    pub fn restore(&self, file: &Path) -> Result<usize, ToolError> {
        use std::os::unix::fs::FileExt as _;
        let failed = |e: std::io::Error| ToolError {
            tool: "restore".into(),
            detail: format!(
                "cannot put back the saved table sectors of {} (from {}): {e}",
                file.display(),
                self.dir.display()
            ),
            code: None,
        };
        let areas = self.saved().map_err(failed)?;
        let disk = std::fs::OpenOptions::new()
            .write(true)
            .open(file)
            .map_err(failed)?;
        for area in &areas {
            let bytes = std::fs::read(&area.path).map_err(failed)?;
            disk.write_all_at(&bytes, area.offset_bytes)
                .map_err(failed)?;
        }
        disk.sync_all().map_err(failed)?;
        tracing::info!(file = %file.display(), areas = areas.len(), "partition table put back");
        Ok(areas.len())
    }
}

impl Drop for TableUndo {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// `run<N>-<device name>-0x<offset in hex>.bak`, sfdisk's name for a saved
/// area: the run and the offset.
fn parse_backup_name(name: &str) -> Option<(u32, u64)> {
    let rest = name.strip_prefix("run")?.strip_suffix(".bak")?;
    let (run, rest) = rest.split_once('-')?;
    let (_, offset) = rest.rsplit_once("-0x")?;
    Some((run.parse().ok()?, u64::from_str_radix(offset, 16).ok()?))
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

    #[test]
    fn backup_names_give_the_run_and_the_offset() {
        assert_eq!(
            parse_backup_name("run2-disk.vhd-0x07ffbe00.bak"),
            Some((2, 0x07ff_be00))
        );
        // A device name holding dashes and "0x" still splits at the last one.
        assert_eq!(
            parse_backup_name("run11-my-0xdisk-0x00000200.bak"),
            Some((11, 512))
        );
        assert_eq!(parse_backup_name("run1-disk-0x00000200"), None);
        assert_eq!(parse_backup_name("other-disk-0x00000200.bak"), None);
        assert_eq!(size_script(NewSize::AsFarAsPossible), ",+\n");
        assert_eq!(size_script(NewSize::Sectors(4096)), ",4096\n");
    }

    fn table_of(file: &Path) -> crate::partition::Table {
        let mut disk = crate::partition::FileDisk::open(file).unwrap();
        crate::partition::read_table(&mut disk).unwrap().unwrap()
    }

    fn sfdisk_missing() -> bool {
        if crate::attach::tool_exists("sfdisk") {
            return false;
        }
        assert!(
            std::env::var("BLOBDRIVE_REQUIRE_FUSE").as_deref() != Ok("1"),
            "sfdisk is not installed"
        );
        true
    }

    #[test]
    fn a_grown_gpt_image_gets_its_backup_moved_and_its_partition_extended_then_put_back() {
        if sfdisk_missing() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("disk.img");
        std::fs::File::create(&file)
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
        write_data_disk_gpt(&file).unwrap();
        let before = table_of(&file);
        let image_before = {
            let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
            f.set_len(128 << 20).unwrap();
            std::fs::read(&file).unwrap()
        };
        let grown = table_of(&file);
        assert!(grown
            .warnings
            .iter()
            .any(|w| w.contains("backup GPT header is at sector")));

        let mut undo = TableUndo::new().unwrap();
        relocate_gpt_backup(&file, &mut undo).unwrap();
        let moved = table_of(&file);
        assert!(moved.warnings.is_empty(), "{:?}", moved.warnings);
        assert_eq!(moved.partitions, before.partitions);
        set_partition_size(&file, 1, NewSize::AsFarAsPossible, &mut undo).unwrap();
        let extended = table_of(&file);
        assert!(extended.warnings.is_empty(), "{:?}", extended.warnings);
        let p = &extended.partitions[0];
        assert_eq!(p.start_bytes, 1 << 20);
        // To the last usable sector: the disk less the backup's 33 sectors.
        assert_eq!(p.end_bytes(), (128 << 20) - 33 * 512);
        assert_eq!(p.uuid, before.partitions[0].uuid);

        assert_eq!(undo.restore(&file).unwrap(), 10);
        assert!(
            std::fs::read(&file).unwrap() == image_before,
            "restore differs"
        );
        let undo_dir = undo.dir().to_path_buf();
        drop(undo);
        assert!(!undo_dir.exists());
    }

    #[test]
    fn an_mbr_partition_takes_an_exact_size_and_a_logical_one_grows_inside_its_extended_one() {
        if sfdisk_missing() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("disk.img");
        std::fs::File::create(&file)
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
        run_with_input(
            "sfdisk",
            ["--quiet".as_ref(), file.as_os_str()],
            "label: dos\nstart=2048, size=16384, type=83\nstart=18432, type=5\nstart=20480, type=83\n",
        )
        .unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&file)
            .unwrap()
            .set_len(128 << 20)
            .unwrap();
        let end_sectors = (128 << 20) / 512;
        let mut undo = TableUndo::new().unwrap();
        set_partition_size(&file, 2, NewSize::Sectors(end_sectors - 18432), &mut undo).unwrap();
        set_partition_size(&file, 5, NewSize::Sectors(end_sectors - 20480), &mut undo).unwrap();
        let t = table_of(&file);
        let ends: Vec<(u32, u64)> = t
            .partitions
            .iter()
            .map(|p| (p.number, p.end_bytes()))
            .collect();
        assert_eq!(ends, [(1, 18432 * 512), (2, 128 << 20), (5, 128 << 20)]);
        undo.restore(&file).unwrap();
        let t = table_of(&file);
        assert_eq!(t.partitions[2].end_bytes(), 64 << 20);
    }
}
