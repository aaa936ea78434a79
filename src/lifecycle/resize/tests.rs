//! The partition policy of an online grow (`partitioned.rs`) on plain image
//! files laid out by sfdisk (no FUSE, no loop device): `tests/partitions.rs`
//! runs it on attached drives.

use std::path::{Path, PathBuf};

use super::partitioned::{check_table, grow_partition, put_back, read_table, MBR_LIMIT_BYTES};
use super::Area;
use crate::attach::loopdev::LoopArea;
use crate::attach::table::{self, NewSize, TableUndo};
use crate::daemon::registry::{AttachMode, AttachedDrive};

const LINUX: &str = crate::partition::LINUX_FILESYSTEM_GUID;

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

/// An image of `size_bytes` laid out by the sfdisk `script`, then grown
/// to `grown_bytes` (as the blob and its FUSE file grow).
fn image(dir: &Path, size_bytes: u64, script: &str, grown_bytes: u64) -> PathBuf {
    use std::io::Write as _;
    let file = dir.join("disk.img");
    std::fs::File::create(&file)
        .unwrap()
        .set_len(size_bytes)
        .unwrap();
    let mut child = std::process::Command::new("sfdisk")
        .args(["--quiet", "--no-reread", "--no-tell-kernel"])
        .arg(&file)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "sfdisk {script}");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(grown_bytes)
        .unwrap();
    file
}

fn entry(file: &Path) -> AttachedDrive {
    AttachedDrive {
        account: "acct".into(),
        drive: "c/disk.vhd".into(),
        snapshot: None,
        dir: "/mnt/disk".into(),
        loop_device: "/dev/loop9".into(),
        fs_type: "xfs".into(),
        partition: Some(1),
        mode: AttachMode::ReadWrite,
        pid: 1,
        holder_pid: None,
        fuse_dir: file.parent().unwrap().to_path_buf(),
        since_unix_secs: 0,
        alive: true,
    }
}

/// The loop device's area over partition `number` as the table holds it
/// now (as `mount --partition` attached it, or an earlier resize set it).
fn attached(file: &Path, number: u32) -> LoopArea {
    let table = read_table(file).unwrap();
    let part = table
        .partitions
        .iter()
        .find(|p| p.number == number)
        .unwrap();
    LoopArea {
        offset_bytes: part.start_bytes,
        size_limit_bytes: part.size_bytes,
    }
}

#[test]
fn the_last_gpt_partition_reaches_the_new_end_and_the_backup_moves() {
    if sfdisk_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = format!("label: gpt\nstart=2048, type={LINUX}\n");
    let file = image(dir.path(), 64 << 20, &script, 128 << 20);
    let (area, todo) =
        grow_partition(&entry(&file), &file, 1, attached(&file, 1), 128 << 20).unwrap();
    let size_bytes = (128 << 20) - (1 << 20) - 33 * 512;
    assert_eq!(
        area,
        Area::Partition {
            size_bytes,
            grown: true
        }
    );
    assert_eq!(todo, None);
    let table = read_table(&file).unwrap();
    assert!(table.warnings.is_empty(), "{:?}", table.warnings);
    assert_eq!(table.partitions[0].size_bytes, size_bytes);
    // Again: nothing left to do, and the answer is the same.
    let (again, _) =
        grow_partition(&entry(&file), &file, 1, attached(&file, 1), 128 << 20).unwrap();
    assert_eq!(
        again,
        Area::Partition {
            size_bytes,
            grown: false
        }
    );
}

#[test]
fn a_partition_followed_by_another_is_left_and_the_todo_names_the_last() {
    if sfdisk_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "label: gpt\nstart=2048, size=40960, type={LINUX}\nstart=43008, size=40960, type={LINUX}\n"
    );
    let file = image(dir.path(), 64 << 20, &script, 128 << 20);
    let before = std::fs::read(&file).unwrap();
    let (area, todo) =
        grow_partition(&entry(&file), &file, 1, attached(&file, 1), 128 << 20).unwrap();
    assert_eq!(area, Area::Unchanged);
    let todo = todo.unwrap();
    assert!(
        todo.contains("partition 2 follows it")
            && todo.contains("sfdisk --relocate gpt-bak-std")
            && todo.contains("-N 2")
            && todo.contains("--size 128M"),
        "{todo}"
    );
    assert!(std::fs::read(&file).unwrap() == before, "the image changed");
}

#[test]
fn an_mbr_partition_stops_at_two_tib_and_says_so() {
    if sfdisk_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk_bytes = 3u64 << 40; // sparse
    let file = image(
        dir.path(),
        64 << 20,
        "label: dos\nstart=2048, type=83\n",
        disk_bytes,
    );
    let (area, todo) =
        grow_partition(&entry(&file), &file, 1, attached(&file, 1), disk_bytes).unwrap();
    assert_eq!(
        area,
        Area::Partition {
            size_bytes: MBR_LIMIT_BYTES - (1 << 20),
            grown: true
        }
    );
    let todo = todo.unwrap();
    assert!(
        todo.contains("MBR") && todo.contains("stops there") && todo.contains("GPT"),
        "{todo}"
    );
}

#[test]
fn a_change_that_does_not_check_out_is_put_back() {
    if sfdisk_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script =
        format!("label: gpt\nstart=2048, size=40960, type={LINUX}\nstart=43008, type={LINUX}\n");
    let file = image(dir.path(), 64 << 20, &script, 128 << 20);
    let before_bytes = std::fs::read(&file).unwrap();
    let before = read_table(&file).unwrap();
    let mut undo = TableUndo::new().unwrap();
    table::set_partition_size(&file, 2, NewSize::AsFarAsPossible, &mut undo).unwrap();
    // Partition 2 grew: fine when asked, a fault when not, or for another.
    check_table(&file, &before, Some((2, None))).unwrap();
    let unasked = check_table(&file, &before, None).unwrap_err();
    assert!(unasked.to_string().contains("partition 2 changed unasked"));
    let wrong_end = check_table(&file, &before, Some((2, Some(64 << 20)))).unwrap_err();
    assert!(
        wrong_end.to_string().contains("reads back as"),
        "{wrong_end}"
    );
    let err = put_back(&entry(&file), &file, &mut undo, &before, wrong_end).unwrap_err();
    assert!(
        err.to_string()
            .contains("the partition table was put back as it was"),
        "{err}"
    );
    assert!(
        std::fs::read(&file).unwrap() == before_bytes,
        "not put back"
    );
}

#[test]
fn a_table_that_no_longer_matches_the_loop_device_is_left_alone() {
    if sfdisk_missing() {
        return;
    }
    // Partition 2 is last and could grow, but the loop device shows another
    // area (the table was sorted or remade since the mount): extending
    // partition 2 and giving the loop device its size from the device's own
    // offset would let the filesystem grow over partition 1's neighbour.
    let dir = tempfile::tempdir().unwrap();
    let script =
        format!("label: gpt\nstart=2048, size=40960, type={LINUX}\nstart=43008, type={LINUX}\n");
    let file = image(dir.path(), 64 << 20, &script, 128 << 20);
    let before = std::fs::read(&file).unwrap();
    let p2 = attached(&file, 2);
    for wrong in [
        // Partition 1's bytes: another start.
        attached(&file, 1),
        // The right start, but reaching past the partition.
        LoopArea {
            size_limit_bytes: p2.size_limit_bytes + 512,
            ..p2
        },
        // No limit: up to the end of the file.
        LoopArea {
            size_limit_bytes: 0,
            ..p2
        },
    ] {
        let mut e = entry(&file);
        e.partition = Some(2);
        let err = grow_partition(&e, &file, 2, wrong, 128 << 20).unwrap_err();
        assert!(
            err.to_string()
                .contains("the partition table changed since the mount"),
            "{err}"
        );
        assert!(std::fs::read(&file).unwrap() == before, "the image changed");
    }
    // The area it was attached with: partition 2 grows.
    let (area, _) = grow_partition(&entry(&file), &file, 2, p2, 128 << 20).unwrap();
    assert!(
        matches!(area, Area::Partition { grown: true, .. }),
        "{area:?}"
    );
}

#[test]
fn a_table_that_reads_only_through_its_backup_does_not_check_out() {
    if sfdisk_missing() {
        return;
    }
    // After the backup moved, the primary header is damaged (as a torn or
    // wrong write would leave it): the table still parses, from the backup,
    // with the same partitions, but it is not the table that was asked for.
    let dir = tempfile::tempdir().unwrap();
    let script = format!("label: gpt\nstart=2048, type={LINUX}\n");
    let file = image(dir.path(), 64 << 20, &script, 128 << 20);
    let before = read_table(&file).unwrap();
    let mut undo = TableUndo::new().unwrap();
    table::relocate_gpt_backup(&file, &mut undo).unwrap();
    check_table(&file, &before, None).unwrap();
    {
        use std::os::unix::fs::FileExt as _;
        let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        // The first usable LBA, inside the header's CRC.
        f.write_all_at(&[0xff], 512 + 40).unwrap();
    }
    let read = read_table(&file).unwrap();
    assert_eq!(read.partitions, before.partitions);
    let err = check_table(&file, &before, None).unwrap_err();
    assert!(
        err.to_string().contains("new fault") && err.to_string().contains("primary GPT"),
        "{err}"
    );
    // Put back, it reads as before (the backup at the old end again).
    let err = put_back(&entry(&file), &file, &mut undo, &before, err).unwrap_err();
    assert!(
        err.to_string()
            .contains("the partition table was put back as it was"),
        "{err}"
    );
}
