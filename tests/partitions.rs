//! Partitioned drives end to end: images laid out by sfdisk and formatted by
//! mkfs.ext4, mkfs.xfs and mkfs.vfat, uploaded with `blobdrive upload`, then
//! attached through the built binary by partition (`--partition N`, `-o
//! partition=N`, `auto`) read-write, read-only and as a snapshot. After each
//! read-write attach, every byte outside the attached partition (the tables,
//! the other partitions) is checked unchanged in the blob. Bad inputs (a
//! corrupt GPT, a partition past the disk end, a partition that does not
//! exist, LVM and LUKS partitions, unknown bytes) each end in one line.
//! Online grow of a drive attached by partition: the last one (GPT, and a
//! logical MBR one) is extended with its xfs, mounted, checked by sfdisk and
//! xfs_repair; one followed by another is left, with commands that work; a
//! table renumbered since the mount is refused with nothing changed.
//!
//! Each test has its own run and temp directories; the [`Site`] guard undoes
//! every attach under them even when the test fails.

mod common;
mod system;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use blobdrive::units::ByteRange;
use common::ContainerGuard;
use sha2::{Digest, Sha256};

const BIN: &str = env!("CARGO_BIN_EXE_blobdrive");
const MIB: u64 = 1 << 20;
const LINUX: &str = "0FC63DAF-8483-4772-8E79-3D69D8477DE4";
const EFI: &str = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B";
const BIOS_BOOT: &str = "21686148-6449-6E6F-744E-656564454649";
const LVM: &str = "E6D6D379-F507-44C2-A23C-238F2A3DF928";

fn can_run(test: &str) -> bool {
    if !system::can_run(test, true) {
        return false;
    }
    for tool in ["sfdisk", "mkfs.xfs", "mkfs.vfat", "cryptsetup"] {
        if !blobdrive::attach::tool_exists(tool) {
            assert!(
                std::env::var(system::REQUIRE_ENV).as_deref() != Ok("1"),
                "{test}: {tool} is not installed (scripts/setup.sh installs it)"
            );
            println!("SKIPPED: {test}: {tool} not installed");
            return false;
        }
    }
    true
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// One test's run directory and temp directory; on drop, every attach made
/// under them is undone.
struct Site {
    run_dir: tempfile::TempDir,
    root: tempfile::TempDir,
}

impl Site {
    fn new() -> Site {
        let make = |prefix: &str| tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
        Site {
            run_dir: make("blobdrive-part-run-"),
            root: make("blobdrive-part-"),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }

    fn dir(&self, name: &str) -> String {
        let dir = self.path(name);
        std::fs::create_dir_all(&dir).unwrap();
        dir.canonicalize().unwrap().to_string_lossy().into_owned()
    }

    fn blobdrive(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .args(args)
            .env("BLOBDRIVE_RUN_DIR", self.run_dir.path())
            .env("BLOBDRIVE_RECOVERY_DIR", common::recovery_dir())
            .env(
                "AZURE_STORAGE_CONNECTION_STRING",
                common::connection_string(),
            )
            .env_remove("NOTIFY_SOCKET")
            .output()
            .expect("run blobdrive")
    }

    /// Runs `blobdrive ARGS`, panicking with its stderr on failure; returns stderr.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.blobdrive(args);
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "blobdrive {args:?} failed: {stderr}");
        stderr
    }

    /// Runs `blobdrive ARGS`, which must fail with exit 1 and one line; returns it.
    fn refused(&self, args: &[&str]) -> String {
        let out = self.blobdrive(args);
        let text = String::from_utf8_lossy(&out.stderr).trim().to_string();
        assert_eq!(out.status.code(), Some(1), "blobdrive {args:?}: {text}");
        assert_eq!(text.lines().count(), 1, "one line expected: {text:?}");
        assert!(text.starts_with("blobdrive: "), "{text}");
        assert!(self.leftovers().is_empty(), "{:?}", self.leftovers());
        text
    }

    /// Mounts and loop devices left under this site.
    fn leftovers(&self) -> Vec<String> {
        let roots = [
            self.run_dir.path().to_string_lossy().to_string(),
            self.root.path().to_string_lossy().to_string(),
        ];
        let mut found = Vec::new();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        for point in mounts.lines().filter_map(|l| l.split(' ').nth(4)) {
            if roots.iter().any(|r| point.starts_with(r.as_str())) {
                found.push(format!("mount {point}"));
            }
        }
        let loops = system::run_quietly("losetup", &["-a"])
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        for line in loops.lines() {
            if roots.iter().any(|r| line.contains(r.as_str())) {
                found.push(format!("loop {line}"));
            }
        }
        found
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        let mut leftovers = self.leftovers();
        // Mount points under the temp dir are the user's DIRs: unmount them
        // through blobdrive first (flush, lease), then force what is left.
        for item in &leftovers {
            if let Some(point) = item.strip_prefix("mount ") {
                if point.starts_with(&*self.root.path().to_string_lossy()) {
                    let _ = self.blobdrive(&["unmount", point]);
                }
            }
        }
        leftovers = self.leftovers();
        leftovers.reverse();
        for item in leftovers {
            if let Some(point) = item.strip_prefix("mount ") {
                let _ = system::run_quietly("umount", &["-l", point]);
            } else if let Some(dev) = item.strip_prefix("loop ").and_then(|l| l.split(':').next()) {
                let _ = system::run_quietly("losetup", &["-d", dev]);
            }
        }
    }
}

/// A partition of an image: number, first byte, length.
#[derive(Debug, Clone, Copy)]
struct Part {
    number: u32,
    start: u64,
    size: u64,
}

impl Part {
    fn end(&self) -> u64 {
        self.start + self.size
    }
}

/// Makes a `size` image at `path` laid out by the sfdisk `script`; returns
/// the partitions sfdisk made.
fn sfdisk_image(path: &Path, size: u64, script: &str) -> Vec<Part> {
    let file = std::fs::File::create(path).unwrap();
    file.set_len(size).unwrap();
    drop(file);
    let mut child = Command::new("sfdisk")
        .args(["--quiet", "--no-reread", "--no-tell-kernel"])
        .arg(path)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "sfdisk failed on {script}");
    let dump = system::run("sfdisk", &["--dump", &path.to_string_lossy()]);
    let name = path.file_name().unwrap().to_string_lossy().to_string();
    dump.lines()
        .filter_map(|l| {
            let (dev, rest) = l.split_once(" : ")?;
            let number = dev.trim().rsplit(&*name).next()?.parse().ok()?;
            let field = |key: &str| -> u64 {
                rest.split(',')
                    .find_map(|f| f.trim().strip_prefix(key))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap()
            };
            Some(Part {
                number,
                start: field("start=") * 512,
                size: field("size=") * 512,
            })
        })
        .collect()
}

/// Makes a filesystem with `mkfs` (program, args) in partition `part` of `image`.
fn mkfs_in(image: &Path, part: Part, program: &str, args: &[&str]) {
    let fs = image.with_extension(format!("p{}", part.number));
    let file = std::fs::File::create(&fs).unwrap();
    file.set_len(part.size).unwrap();
    drop(file);
    let mut all: Vec<&str> = args.to_vec();
    let fs_s = fs.to_string_lossy().to_string();
    all.push(&fs_s);
    // mkfs.xfs refuses filesystems under 300 MB unless it runs under the xfs
    // test suite's variables; a small one keeps this test lean.
    let out = Command::new(program)
        .args(&all)
        .envs([("TEST_DIR", "1"), ("TEST_DEV", "1"), ("QA_CHECK_FS", "1")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{program}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let data = std::fs::read(&fs).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(image)
        .unwrap()
        .write_all_at(&data, part.start)
        .unwrap();
    std::fs::remove_file(fs).unwrap();
}

fn part(parts: &[Part], number: u32) -> Part {
    *parts
        .iter()
        .find(|p| p.number == number)
        .expect("partition")
}

/// SHA-256 of the drive's bytes outside `[skip.start, skip.end)`, read from the blob.
fn hash_outside(guard: &ContainerGuard, blob: &str, disk: u64, skip: Part) -> String {
    let path = guard.path(blob);
    let mut hasher = Sha256::new();
    runtime().block_on(async {
        for (from, to) in [(0, skip.start), (skip.end(), disk)] {
            let mut at = from;
            while at < to {
                let end = (at + 8 * MIB).min(to);
                let data = guard
                    .client
                    .get_blob_range(&path, ByteRange::new(at, end))
                    .await
                    .expect("read the drive");
                hasher.update(&data);
                at = end;
            }
        }
    });
    format!("{:x}", hasher.finalize())
}

/// Mounts, writes `name` (1 MiB), unmounts; checks every byte outside the
/// partition is unchanged in the blob. Returns the mount's stderr.
fn write_through(
    site: &Site,
    guard: &ContainerGuard,
    blob: &str,
    disk: u64,
    p: Part,
    mount_args: &[&str],
    name: &str,
) -> String {
    let before = hash_outside(guard, blob, disk, p);
    let dir = site.dir("mnt");
    let drive = format!("{}/{blob}", guard.name);
    let mut args = vec!["mount", &drive, &dir];
    args.extend(mount_args);
    let stderr = site.ok(&args);
    std::fs::write(Path::new(&dir).join(name), pattern(name)).unwrap();
    site.ok(&["unmount", &dir]);
    assert_eq!(
        hash_outside(guard, blob, disk, p),
        before,
        "bytes outside partition {} changed",
        p.number
    );
    stderr
}

/// Mounts read-only (extra args), checks the files, unmounts.
fn read_back(site: &Site, drive: &str, mount_args: &[&str], names: &[&str]) {
    let dir = site.dir("ro");
    let mut args = vec!["mount", drive, &dir];
    args.extend(mount_args);
    site.ok(&args);
    for name in names {
        let got = std::fs::read(Path::new(&dir).join(name)).unwrap_or_default();
        assert!(got == pattern(name), "{name} read back differs");
    }
    assert!(
        std::fs::write(Path::new(&dir).join("new"), b"x").is_err(),
        "read-only mount took a write"
    );
    site.ok(&["unmount", &dir]);
}

fn pattern(name: &str) -> Vec<u8> {
    let seed = name
        .bytes()
        .fold(7u8, |a, b| a.wrapping_mul(31).wrapping_add(b));
    (0..MIB as usize)
        .map(|i| (i as u8).wrapping_mul(13) ^ seed)
        .collect()
}

fn upload(site: &Site, image: &Path, drive: &str) {
    site.ok(&["upload", &image.to_string_lossy(), drive]);
}

fn info_json(site: &Site, drive: &str) -> serde_json::Value {
    let out = site.blobdrive(&["info", drive, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn gpt_drive_with_two_ext4_partitions_and_an_efi_partition() {
    if !can_run("gpt_drive_with_two_ext4_partitions_and_an_efi_partition") {
        return;
    }
    let site = Site::new();
    let guard = runtime().block_on(ContainerGuard::new("part-gpt"));
    let disk = 48 * MIB;
    let image = site.path("gpt.img");
    let parts = sfdisk_image(
        &image,
        disk,
        &format!(
            "label: gpt\nstart=2048, size=8192, type={EFI}, name=EFI\n\
             start=10240, size=30720, type={LINUX}, name=data\n\
             start=40960, size=53248, type={LINUX}, name=logs\n"
        ),
    );
    mkfs_in(&image, part(&parts, 1), "mkfs.vfat", &["-n", "ESP"]);
    mkfs_in(&image, part(&parts, 2), "mkfs.ext4", &["-q", "-L", "data"]);
    mkfs_in(&image, part(&parts, 3), "mkfs.ext4", &["-q", "-L", "logs"]);
    let drive = format!("{}/gpt.vhd", guard.name);
    upload(&site, &image, &drive);

    let info = info_json(&site, &drive);
    let table = &info["partition_table"];
    assert_eq!(table["kind"], "gpt");
    let listed: Vec<(u64, &str, &str, &str)> = table["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["number"].as_u64().unwrap(),
                p["type_name"].as_str().unwrap(),
                p["filesystem"]["type"].as_str().unwrap_or("-"),
                p["filesystem"]["label"].as_str().unwrap_or("-"),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            (1, "EFI System", "vfat", "ESP"),
            (2, "Linux filesystem", "ext4", "data"),
            (3, "Linux filesystem", "ext4", "logs")
        ]
    );
    assert_eq!(table["partitions"][1]["start_bytes"], 10240 * 512);
    assert_eq!(table["partitions"][1]["label"], "data");

    // auto: two Linux partitions with ext4, the larger one wins, and it says so.
    let said = write_through(
        &site,
        &guard,
        "gpt.vhd",
        disk,
        part(&parts, 3),
        &[],
        "logs.bin",
    );
    assert!(said.contains("attaching partition 3"), "{said}");
    let said = write_through(
        &site,
        &guard,
        "gpt.vhd",
        disk,
        part(&parts, 2),
        &["-o", "partition=2,noatime"],
        "data.bin",
    );
    assert!(!said.contains("attaching partition"), "{said}");
    read_back(
        &site,
        &drive,
        &["--partition", "3", "--read-only"],
        &["logs.bin"],
    );
    let snapshot = site
        .blobdrive(&["snapshot", &drive])
        .stdout
        .iter()
        .map(|&b| b as char)
        .collect::<String>();
    read_back(
        &site,
        &drive,
        &["--partition", "2", "--snapshot", snapshot.trim()],
        &["data.bin"],
    );
    assert!(site.leftovers().is_empty(), "{:?}", site.leftovers());
}

#[test]
fn mbr_drive_with_xfs_in_a_logical_partition() {
    if !can_run("mbr_drive_with_xfs_in_a_logical_partition") {
        return;
    }
    let site = Site::new();
    let guard = runtime().block_on(ContainerGuard::new("part-mbr"));
    let disk = 64 * MIB;
    let image = site.path("mbr.img");
    let parts = sfdisk_image(
        &image,
        disk,
        "label: dos\nstart=2048, size=16384, type=83\nstart=18432, type=5\nstart=20480, type=83\n",
    );
    let numbers: Vec<u32> = parts.iter().map(|p| p.number).collect();
    assert_eq!(numbers, [1, 2, 5]);
    mkfs_in(&image, part(&parts, 1), "mkfs.ext4", &["-q", "-L", "boot"]);
    mkfs_in(
        &image,
        part(&parts, 5),
        "mkfs.xfs",
        &["-q", "-L", "logical"],
    );
    let drive = format!("{}/mbr.vhd", guard.name);
    upload(&site, &image, &drive);

    let info = info_json(&site, &drive);
    assert_eq!(info["partition_table"]["kind"], "mbr");
    let p5 = &info["partition_table"]["partitions"][2];
    assert_eq!(
        (p5["number"].as_u64(), p5["type_id"].as_str()),
        (Some(5), Some("0x83"))
    );
    assert_eq!(p5["filesystem"]["type"], "xfs");
    assert_eq!(p5["filesystem"]["label"], "logical");
    assert_eq!(p5["start_bytes"].as_u64(), Some(part(&parts, 5).start));

    let said = write_through(
        &site,
        &guard,
        "mbr.vhd",
        disk,
        part(&parts, 5),
        &[],
        "x.bin",
    );
    assert!(said.contains("attaching partition 5"), "{said}");
    write_through(
        &site,
        &guard,
        "mbr.vhd",
        disk,
        part(&parts, 1),
        &["--partition", "1"],
        "e.bin",
    );
    read_back(&site, &drive, &["--read-only"], &["x.bin"]);
    read_back(&site, &drive, &["--partition", "1", "-o", "ro"], &["e.bin"]);
}

#[test]
fn ubuntu_cloud_image_layout_with_partition_one_last() {
    if !can_run("ubuntu_cloud_image_layout_with_partition_one_last") {
        return;
    }
    let site = Site::new();
    let guard = runtime().block_on(ContainerGuard::new("part-cloud"));
    let disk = 64 * MIB;
    let image = site.path("cloud.img");
    let parts = sfdisk_image(
        &image,
        disk,
        &format!(
            "label: gpt\ncloud.img14 : start=2048, size=8192, type={BIOS_BOOT}\n\
             cloud.img15 : start=10240, size=20480, type={EFI}, name=UEFI\n\
             cloud.img1 : start=30720, size=96256, type={LINUX}\n"
        ),
    );
    mkfs_in(&image, part(&parts, 15), "mkfs.vfat", &["-n", "UEFI"]);
    mkfs_in(
        &image,
        part(&parts, 1),
        "mkfs.ext4",
        &["-q", "-L", "cloudimg-rootfs"],
    );
    let drive = format!("{}/cloud.vhd", guard.name);
    upload(&site, &image, &drive);

    let text = String::from_utf8_lossy(&site.blobdrive(&["info", &drive]).stdout).to_string();
    assert!(text.contains("GPT (disk id"), "{text}");
    assert!(text.contains("ext4 'cloudimg-rootfs'"), "{text}");

    let said = write_through(
        &site,
        &guard,
        "cloud.vhd",
        disk,
        part(&parts, 1),
        &[],
        "etc.bin",
    );
    assert!(said.contains("attaching partition 1 "), "{said}");
    let snapshot = String::from_utf8_lossy(&site.blobdrive(&["snapshot", &drive]).stdout)
        .trim()
        .to_string();
    read_back(&site, &drive, &["--snapshot", &snapshot], &["etc.bin"]);
    read_back(&site, &drive, &["-r", "--partition", "auto"], &["etc.bin"]);
}

#[test]
fn created_gpt_data_disk_is_laid_out_as_azure_does_and_attaches() {
    if !can_run("created_gpt_data_disk_is_laid_out_as_azure_does_and_attaches") {
        return;
    }
    let site = Site::new();
    let guard = runtime().block_on(ContainerGuard::new("part-create"));
    let drive = format!("{}/data.vhd", guard.name);
    site.ok(&[
        "create",
        &drive,
        "--size",
        "32M",
        "--mkfs",
        "ext4",
        "--partition-table",
        "gpt",
    ]);
    let info = info_json(&site, &drive);
    let parts = info["partition_table"]["partitions"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(parts.len(), 1);
    assert_eq!(parts[0]["start_bytes"].as_u64(), Some(MIB));
    // To the last usable sector: the disk less the backup GPT (33 sectors).
    assert_eq!(
        parts[0]["size_bytes"].as_u64(),
        Some(32 * MIB - MIB - 33 * 512)
    );
    assert_eq!(parts[0]["type_id"], LINUX);
    assert_eq!(parts[0]["filesystem"]["type"], "ext4");
    // sfdisk, an independent reader, sees the same table.
    let dir = site.dir("rw");
    site.ok(&["mount", &drive, &dir]);
    std::fs::write(Path::new(&dir).join("a.bin"), pattern("a.bin")).unwrap();
    site.ok(&["unmount", &dir]);
    read_back(&site, &drive, &["-r"], &["a.bin"]);
}

#[test]
fn bad_partition_tables_and_choices_are_refused_in_one_line() {
    if !can_run("bad_partition_tables_and_choices_are_refused_in_one_line") {
        return;
    }
    let site = Site::new();
    let guard = runtime().block_on(ContainerGuard::new("part-bad"));
    let dir = site.dir("mnt");
    let disk = 32 * MIB;

    // A GPT whose both headers fail their checksums.
    let image = site.path("corrupt.img");
    sfdisk_image(
        &image,
        disk,
        &format!("label: gpt\nstart=2048, type={LINUX}\n"),
    );
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&image)
        .unwrap();
    for lba in [1, disk / 512 - 1] {
        file.write_all_at(b"\xff\xff", lba * 512 + 40).unwrap();
    }
    let corrupt = format!("{}/corrupt.vhd", guard.name);
    upload(&site, &image, &corrupt);
    let line = site.refused(&["mount", &corrupt, &dir]);
    assert!(
        line.contains("corrupt GPT") && line.contains("nothing was attached"),
        "{line}"
    );
    let text = String::from_utf8_lossy(&site.blobdrive(&["info", &corrupt]).stdout).to_string();
    assert!(text.contains("unreadable: corrupt GPT"), "{text}");

    // An MBR partition running past the end (the image was cut short).
    let image = site.path("short.img");
    sfdisk_image(&image, 2 * disk, "label: dos\nstart=2048, type=83\n");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&image)
        .unwrap()
        .set_len(disk)
        .unwrap();
    let short = format!("{}/short.vhd", guard.name);
    upload(&site, &image, &short);
    let line = site.refused(&["mount", &short, &dir]);
    assert!(line.contains("ends past the end of the disk"), "{line}");

    // Partition 9 of a disk with two; an LVM PV (its on-disk label) and a
    // LUKS container (made by cryptsetup) picked by number or left to auto.
    let image = site.path("volumes.img");
    let parts = sfdisk_image(
        &image,
        disk,
        &format!("label: gpt\nstart=2048, size=16384, type={LVM}\nstart=18432, size=40960, type={LINUX}\n"),
    );
    let pv = part(&parts, 1).start + 512;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&image)
        .unwrap();
    let mut label = vec![0u8; 64];
    label[..8].copy_from_slice(b"LABELONE");
    label[20] = 32;
    label[24..32].copy_from_slice(b"LVM2 001");
    label[32..64].copy_from_slice(b"Abcdefghijklmnopqrstuvwxyz012345");
    file.write_all_at(&label, pv).unwrap();
    let luks = image.with_extension("luks");
    let key = image.with_extension("key");
    std::fs::write(&key, b"not a secret").unwrap();
    std::fs::File::create(&luks)
        .unwrap()
        .set_len(part(&parts, 2).size)
        .unwrap();
    system::run(
        "cryptsetup",
        &[
            "luksFormat",
            "--batch-mode",
            "--type",
            "luks1",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            &key.to_string_lossy(),
            &luks.to_string_lossy(),
        ],
    );
    file.write_all_at(
        &std::fs::read(&luks).unwrap()[..4 << 20],
        part(&parts, 2).start,
    )
    .unwrap();
    let volumes = format!("{}/volumes.vhd", guard.name);
    upload(&site, &image, &volumes);
    let line = site.refused(&["mount", &volumes, &dir, "--partition", "9"]);
    assert!(
        line.contains("has no partition 9") && line.contains("1 (Linux LVM"),
        "{line}"
    );
    let line = site.refused(&["mount", &volumes, &dir, "--partition", "1"]);
    assert!(
        line.contains("LVM2 physical volume") && line.contains("vgchange"),
        "{line}"
    );
    let line = site.refused(&["mount", &volumes, &dir, "-o", "partition=2"]);
    assert!(
        line.contains("LUKS") && line.contains("cryptsetup open"),
        "{line}"
    );
    let line = site.refused(&["mount", &volumes, &dir]);
    assert!(!line.contains("mkfs"), "{line}");
    let info = info_json(&site, &volumes);
    assert_eq!(
        info["partition_table"]["partitions"][1]["filesystem"]["type"],
        "crypto_LUKS"
    );

    // Unknown bytes and no table: the kernel is asked, and no mkfs is advised.
    let junk = format!("{}/junk.vhd", guard.name);
    site.ok(&["create", &junk, "--size", "16M"]);
    let image = site.path("junk.img");
    std::fs::write(&image, vec![0x5au8; 16 * MIB as usize]).unwrap();
    site.ok(&["delete", &junk]);
    upload(&site, &image, &junk);
    let line = site.refused(&["mount", &junk, &dir]);
    assert!(
        line.contains("holds no filesystem the kernel recognises"),
        "{line}"
    );
    assert!(
        !line.contains("--mkfs") && !line.contains("mkfs.ext4"),
        "{line}"
    );
}

/// Issue 28, item 11: `auto` never attaches a lone partition that is not
/// Linux data (here a Linux extended boot partition holding ext4 beside an
/// LVM PV: /boot would be mounted read-write); tables made for 4096-byte
/// sectors (`fdisk -b 4096`, MBR and GPT) are refused, never read 8x short.
#[test]
fn auto_skips_a_lone_boot_partition_and_4k_sector_tables_are_refused() {
    if !can_run("auto_skips_a_lone_boot_partition_and_4k_sector_tables_are_refused") {
        return;
    }
    const XBOOTLDR: &str = "BC13C2FF-59E6-4262-A352-B275FD6F7172";
    let site = Site::new();
    let guard = runtime().block_on(ContainerGuard::new("part-auto"));
    let dir = site.dir("mnt");
    let disk = 32 * MIB;

    let image = site.path("boot.img");
    let parts = sfdisk_image(
        &image,
        disk,
        &format!("label: gpt\nstart=2048, size=16384, type={XBOOTLDR}\nstart=18432, size=40960, type={LVM}\n"),
    );
    mkfs_in(&image, part(&parts, 1), "mkfs.ext4", &["-q", "-L", "boot"]);
    let mut label = vec![0u8; 64];
    label[..8].copy_from_slice(b"LABELONE");
    label[20] = 32;
    label[24..32].copy_from_slice(b"LVM2 001");
    label[32..64].copy_from_slice(b"Abcdefghijklmnopqrstuvwxyz012345");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&image)
        .unwrap()
        .write_all_at(&label, part(&parts, 2).start + 512)
        .unwrap();
    let boot = format!("{}/boot.vhd", guard.name);
    upload(&site, &image, &boot);
    let line = site.refused(&["mount", &boot, &dir]);
    assert!(
        line.contains("not a Linux data or root partition")
            && line.contains("1 (Linux extended boot")
            && line.contains("2 (Linux LVM")
            && line.contains("--partition N"),
        "{line}"
    );
    // Named, it attaches.
    site.ok(&["mount", &boot, &dir, "--partition", "1", "--read-only"]);
    site.ok(&["unmount", &dir]);

    // fdisk with 4096-byte sectors: partition 1 at 4 KiB sector 256 (1 MiB)
    // holding ext4. With 512-byte sectors it would start at 128 KiB.
    for (label, script) in [
        ("dos", "o\nn\np\n1\n256\n\nw\n"),
        ("gpt", "g\nn\n1\n256\n\nw\n"),
    ] {
        let image = site.path(&format!("4k-{label}.img"));
        std::fs::File::create(&image)
            .unwrap()
            .set_len(disk)
            .unwrap();
        let mut fdisk = Command::new("fdisk")
            .args(["-b", "4096"])
            .arg(&image)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        use std::io::Write;
        fdisk
            .stdin
            .take()
            .unwrap()
            .write_all(script.as_bytes())
            .unwrap();
        assert!(fdisk.wait().unwrap().success(), "fdisk -b 4096 ({label})");
        let at = Part {
            number: 1,
            start: MIB,
            size: 16 * MIB,
        };
        mkfs_in(&image, at, "mkfs.ext4", &["-q"]);
        let drive = format!("{}/4k-{label}.vhd", guard.name);
        upload(&site, &image, &drive);
        for args in [&[][..], &["--partition", "1"][..]] {
            let mut all = vec!["mount", drive.as_str(), dir.as_str()];
            all.extend(args);
            let line = site.refused(&all);
            assert!(
                line.contains("4096-byte sectors"),
                "{label} {args:?}: {line}"
            );
        }
        let info = info_json(&site, &drive);
        assert!(
            info["layout_problem"]
                .as_str()
                .is_some_and(|p| p.contains("4096-byte sectors")),
            "{label}: {info}"
        );
    }
}

/// Bytes of the filesystem mounted at `dir`, as `df` sees it.
fn df_bytes(dir: &str) -> u64 {
    let out = system::run("df", &["-B1", "--output=size", dir]);
    out.lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("df printed {out:?}"))
}

/// The registry entry of the one attach under `site` (JSON).
fn attach_entry(site: &Site) -> serde_json::Value {
    let entry = std::fs::read_dir(site.run_dir.path().join("attach"))
        .expect("registry")
        .filter_map(Result::ok)
        .find(|e| e.path().extension().is_some_and(|x| x == "json"))
        .expect("registry entry");
    serde_json::from_str(&std::fs::read_to_string(entry.path()).unwrap()).unwrap()
}

/// `blobdrive resize ... --json` of an attached drive: exit 0, the report.
fn resize_json(site: &Site, drive: &str, size: &str) -> serde_json::Value {
    let out = site.blobdrive(&["resize", drive, "--size", size, "--json"]);
    assert!(
        out.status.success(),
        "resize: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("resize json")
}

/// Partition `number` of `info --json`, and the table's warnings.
fn info_part(site: &Site, drive: &str, number: u64) -> (serde_json::Value, Vec<String>) {
    let info = info_json(site, drive);
    let table = &info["partition_table"];
    let part = table["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .find(|p| p["number"] == number)
        .expect("partition")
        .clone();
    let warnings = table["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap().to_string())
        .collect();
    (part, warnings)
}

/// Downloads the drive and checks it with tools other than blobdrive's:
/// `sfdisk --verify` on the table, `xfs_repair -n` on the partition at
/// `start`/`size` (through a read-only loop device over the image).
fn check_image(site: &Site, drive: &str, start: u64, size: u64) {
    let image = site.path("check.img");
    let _ = std::fs::remove_file(&image);
    let image_s = image.to_string_lossy().to_string();
    site.ok(&["download", drive, &image_s, "--raw"]);
    let verify = system::run("sfdisk", &["--verify", &image_s]);
    assert!(verify.contains("No errors detected"), "{verify}");
    let dev = system::run(
        "losetup",
        &[
            "--find",
            "--show",
            "--read-only",
            "--offset",
            &start.to_string(),
            "--sizelimit",
            &size.to_string(),
            &image_s,
        ],
    );
    let repair = Command::new("xfs_repair")
        .args(["-n", dev.trim()])
        .output()
        .expect("xfs_repair runs");
    let _ = system::run_quietly("losetup", &["-d", dev.trim()]);
    assert!(
        repair.status.success(),
        "xfs_repair -n: {}{}",
        String::from_utf8_lossy(&repair.stdout),
        String::from_utf8_lossy(&repair.stderr)
    );
    std::fs::remove_file(&image).unwrap();
}

#[test]
fn online_grow_of_a_gpt_drive_extends_its_last_partition_and_xfs() {
    let test = "online_grow_of_a_gpt_drive_extends_its_last_partition_and_xfs";
    if !can_run(test) {
        return;
    }
    let site = Site::new();
    let guard = runtime().block_on(ContainerGuard::new("part-grow"));
    let drive = format!("{}/grow.vhd", guard.name);
    site.ok(&[
        "create",
        &drive,
        "--size",
        "1G",
        "--mkfs",
        "xfs",
        "--partition-table",
        "gpt",
    ]);
    let dir = site.dir("mnt");
    site.ok(&["mount", &drive, &dir]);
    let names = ["a.bin", "b.bin", "c.bin"];
    for name in names {
        std::fs::write(Path::new(&dir).join(name), pattern(name)).unwrap();
    }
    let before = df_bytes(&dir);
    assert!(before < 1 << 30, "df {before}");

    // One online grow of a drive at a time: while another holds the attach's
    // lock, a second is refused in one line before anything grows.
    let fuse_dir = std::fs::File::open(attach_entry(&site)["fuse_dir"].as_str().unwrap()).unwrap();
    use std::os::fd::AsRawFd as _;
    // SAFETY: flock on a descriptor this test owns.
    assert_eq!(
        unsafe { libc::flock(fuse_dir.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    let out = site.blobdrive(&["resize", &drive, "--size", "2G"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("another 'blobdrive resize'"), "{err}");
    assert_eq!(
        info_json(&site, &drive)["virtual_size_bytes"],
        1u64 << 30,
        "grew while locked"
    );
    drop(fuse_dir);

    let report = resize_json(&site, &drive, "2G");
    assert_eq!(report["online"], true);
    assert_eq!(report["new_size_bytes"], 2u64 << 30);
    assert_eq!(report["partition"], 1);
    assert_eq!(report["partition_grown"], true);
    assert_eq!(report["filesystem"], "xfs");
    assert_eq!(report["filesystem_grown"], true);
    assert!(report["todo"].is_null(), "{report}");
    // The partition ends at the last usable sector (the backup GPT takes 33).
    let part_bytes = (2u64 << 30) - MIB - 33 * 512;
    let entry = attach_entry(&site);
    let dev = entry["loop_device"].as_str().unwrap();
    assert_eq!(
        system::run("blockdev", &["--getsize64", dev]).trim(),
        part_bytes.to_string(),
        "the loop device took the partition's new size"
    );
    let dio = system::run("losetup", &["--noheadings", "--output", "DIO", dev]);
    assert_eq!(dio.trim(), "1", "the loop device kept direct I/O");
    // No remount: the mounted filesystem shows the new size.
    let after = df_bytes(&dir);
    assert!(after > before + (900 << 20), "df {before} -> {after}");
    std::fs::write(Path::new(&dir).join("d.bin"), pattern("d.bin")).unwrap();
    site.ok(&["unmount", &dir]);

    let (p1, warnings) = info_part(&site, &drive, 1);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(p1["start_bytes"], MIB);
    assert_eq!(p1["size_bytes"], part_bytes);
    assert_eq!(p1["filesystem"]["type"], "xfs");
    read_back(
        &site,
        &drive,
        &["-r"],
        &["a.bin", "b.bin", "c.bin", "d.bin"],
    );
    check_image(&site, &drive, MIB, part_bytes);
    assert!(site.leftovers().is_empty(), "{:?}", site.leftovers());
}

#[test]
fn online_grow_of_a_partition_with_another_after_it_says_what_is_left() {
    let test = "online_grow_of_a_partition_with_another_after_it_says_what_is_left";
    if !can_run(test) {
        return;
    }
    let site = Site::new();
    let guard = runtime().block_on(ContainerGuard::new("part-notlast"));
    let disk = 64 * MIB;
    let image = site.path("two.img");
    let parts = sfdisk_image(
        &image,
        disk,
        &format!(
            "label: gpt\nstart=2048, size=49152, type={LINUX}, name=data\n\
             start=51200, size=20480, type={LINUX}, name=logs\n"
        ),
    );
    let (p1, p2) = (part(&parts, 1), part(&parts, 2));
    mkfs_in(&image, p1, "mkfs.xfs", &["-q", "-L", "data"]);
    mkfs_in(&image, p2, "mkfs.ext4", &["-q", "-L", "logs"]);
    let drive = format!("{}/two.vhd", guard.name);
    upload(&site, &image, &drive);

    let dir = site.dir("mnt");
    site.ok(&["mount", &drive, &dir, "--partition", "1"]);
    std::fs::write(Path::new(&dir).join("a.bin"), pattern("a.bin")).unwrap();
    let before = df_bytes(&dir);
    let outside = hash_outside(&guard, "two.vhd", disk, p1);
    let report = resize_json(&site, &drive, "128M");
    assert_eq!(report["new_size_bytes"], 128 * MIB);
    assert_eq!(report["partition"], 1);
    assert_eq!(report["partition_grown"], false);
    assert_eq!(report["filesystem_grown"], false);
    let todo = report["todo"].as_str().expect("a todo").to_string();
    assert!(
        todo.contains("partition 2 follows it") && todo.contains("-N 2"),
        "{todo}"
    );
    assert_eq!(df_bytes(&dir), before);
    let dev = attach_entry(&site)["loop_device"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        system::run("blockdev", &["--getsize64", &dev]).trim(),
        p1.size.to_string()
    );
    // Nothing outside the attached partition changed (the table included).
    std::fs::write(Path::new(&dir).join("b.bin"), pattern("b.bin")).unwrap();
    assert_eq!(hash_outside(&guard, "two.vhd", disk, p1), outside);

    // The todo's command is exact: run as given, partition 2 takes the space.
    let command = todo
        .split_once("run '")
        .and_then(|(_, rest)| rest.split_once('\''))
        .map(|(cmd, _)| cmd.to_string())
        .expect("a command in the todo");
    let out = Command::new("sh").args(["-c", &command]).output().unwrap();
    assert!(
        out.status.success(),
        "{command}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    site.ok(&["unmount", &dir]);
    let (info2, warnings) = info_part(&site, &drive, 2);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(info2["start_bytes"], p2.start);
    assert_eq!(info2["size_bytes"], 128 * MIB - p2.start - 33 * 512);
    assert_eq!(info2["filesystem"]["type"], "ext4");
    let (info1, _) = info_part(&site, &drive, 1);
    assert_eq!(info1["size_bytes"], p1.size);
    read_back(
        &site,
        &drive,
        &["-r", "--partition", "1"],
        &["a.bin", "b.bin"],
    );

    // Grown offline, the GPT's backup stays where the primary says it is
    // (a warning, not an error), and the drive still attaches.
    site.ok(&["resize", &drive, "--size", "192M"]);
    let (_, warnings) = info_part(&site, &drive, 2);
    assert!(
        warnings.len() == 1 && warnings[0].contains("backup GPT header is at sector"),
        "{warnings:?}"
    );
    read_back(&site, &drive, &["-r", "--partition", "1"], &["a.bin"]);

    // As the offline resize advises: attach the last partition and resize
    // again to the same size: the backup moves, partition 2 reaches the new
    // end and its loop device follows. ext4 grows online only with
    // CAP_SYS_RESOURCE; without it the refusal is one line, and all below
    // the filesystem grew all the same.
    site.ok(&["mount", &drive, &dir, "--partition", "2"]);
    let out = site.blobdrive(&["resize", &drive, "--size", "192M", "--json"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    if blobdrive::attach::filesystem::has_cap_sys_resource() {
        assert!(out.status.success(), "{err}");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["partition_grown"], true);
        assert_eq!(report["filesystem_grown"], true);
    } else {
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains("CAP_SYS_RESOURCE"), "{err}");
    }
    let p2_bytes = 192 * MIB - p2.start - 33 * 512;
    let dev = attach_entry(&site)["loop_device"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        system::run("blockdev", &["--getsize64", &dev]).trim(),
        p2_bytes.to_string()
    );
    site.ok(&["unmount", &dir]);
    let (info2, warnings) = info_part(&site, &drive, 2);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(info2["size_bytes"], p2_bytes);
    read_back(
        &site,
        &drive,
        &["-r", "--partition", "1"],
        &["a.bin", "b.bin"],
    );
    assert!(site.leftovers().is_empty(), "{:?}", site.leftovers());
}

#[test]
fn online_grow_of_a_logical_mbr_partition_extends_its_extended_partition_first() {
    let test = "online_grow_of_a_logical_mbr_partition_extends_its_extended_partition_first";
    if !can_run(test) {
        return;
    }
    let site = Site::new();
    let guard = runtime().block_on(ContainerGuard::new("part-logical"));
    let disk = 64 * MIB;
    let image = site.path("mbr.img");
    let parts = sfdisk_image(
        &image,
        disk,
        "label: dos\nstart=2048, size=16384, type=83\nstart=18432, type=5\nstart=20480, type=83\n",
    );
    let p5 = part(&parts, 5);
    mkfs_in(&image, part(&parts, 1), "mkfs.ext4", &["-q", "-L", "boot"]);
    mkfs_in(&image, p5, "mkfs.xfs", &["-q", "-L", "logical"]);
    let p1 = part(&parts, 1);
    let drive = format!("{}/mbr.vhd", guard.name);
    upload(&site, &image, &drive);
    // Partition 1's bytes: hashed as all but what precedes it, of a disk
    // that ends where it does.
    let before_p1 = Part {
        number: 0,
        start: 0,
        size: p1.start,
    };
    let p1_hash = hash_outside(&guard, "mbr.vhd", p1.end(), before_p1);

    let dir = site.dir("mnt");
    site.ok(&["mount", &drive, &dir, "--partition", "5"]);
    std::fs::write(Path::new(&dir).join("x.bin"), pattern("x.bin")).unwrap();
    let before = df_bytes(&dir);
    let report = resize_json(&site, &drive, "128M");
    assert_eq!(report["partition"], 5);
    assert_eq!(report["partition_grown"], true);
    assert_eq!(report["filesystem_grown"], true);
    assert!(report["todo"].is_null(), "{report}");
    let after = df_bytes(&dir);
    assert!(after > before + (48 << 20), "df {before} -> {after}");
    site.ok(&["unmount", &dir]);

    // Both reach the new end; partition 1 is as it was.
    let (ext, warnings) = info_part(&site, &drive, 2);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(ext["start_bytes"], part(&parts, 2).start);
    assert_eq!(ext["size_bytes"], 128 * MIB - part(&parts, 2).start);
    let (logical, _) = info_part(&site, &drive, 5);
    assert_eq!(logical["start_bytes"], p5.start);
    assert_eq!(logical["size_bytes"], 128 * MIB - p5.start);
    let (boot, _) = info_part(&site, &drive, 1);
    assert_eq!(boot["size_bytes"], part(&parts, 1).size);
    assert_eq!(
        hash_outside(&guard, "mbr.vhd", p1.end(), before_p1),
        p1_hash,
        "partition 1 changed"
    );
    read_back(&site, &drive, &["-r", "--partition", "5"], &["x.bin"]);
    check_image(&site, &drive, p5.start, 128 * MIB - p5.start);
    assert!(site.leftovers().is_empty(), "{:?}", site.leftovers());
}

#[test]
fn online_grow_refuses_a_table_renumbered_since_the_mount_and_changes_nothing() {
    let test = "online_grow_refuses_a_table_renumbered_since_the_mount_and_changes_nothing";
    if !can_run(test) {
        return;
    }
    let site = Site::new();
    let guard = runtime().block_on(ContainerGuard::new("part-sorted"));
    let disk = 64 * MIB;
    let image = site.path("sorted.img");
    // Numbers out of disk order: partition 2 first, partition 1 last.
    let parts = sfdisk_image(
        &image,
        disk,
        &format!(
            "label: gpt\nsorted.img2 : start=2048, size=49152, type={LINUX}, name=data\n\
             sorted.img1 : start=51200, type={LINUX}, name=logs\n"
        ),
    );
    let (p2, p1) = (part(&parts, 2), part(&parts, 1));
    mkfs_in(&image, p2, "mkfs.xfs", &["-q", "-L", "data"]);
    mkfs_in(&image, p1, "mkfs.ext4", &["-q", "-L", "logs"]);
    let drive = format!("{}/sorted.vhd", guard.name);
    upload(&site, &image, &drive);

    let dir = site.dir("mnt");
    site.ok(&["mount", &drive, &dir, "--partition", "2"]);
    std::fs::write(Path::new(&dir).join("a.bin"), pattern("a.bin")).unwrap();
    let before = df_bytes(&dir);
    let entry = attach_entry(&site);
    let dev = entry["loop_device"].as_str().unwrap().to_string();
    // The table sorted while attached (sfdisk -r, as a tidy-up would):
    // the attached partition is number 1 now, and number 2 is the last one.
    let file = Path::new(entry["fuse_dir"].as_str().unwrap()).join("sorted.vhd");
    let file_s = file.to_string_lossy().to_string();
    system::run(
        "sfdisk",
        &["--no-reread", "--no-tell-kernel", "-r", &file_s],
    );
    let dump_before = system::run("sfdisk", &["--dump", &file_s]);
    let neighbour = hash_outside(&guard, "sorted.vhd", disk, p2);

    // Extending partition 2 (now the neighbour) and giving the loop device
    // its size from the attached one's start would let xfs grow over the
    // ext4 filesystem: refused, in one line, nothing changed but the disk.
    let out = site.blobdrive(&["resize", &drive, "--size", "128M"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("the partition table changed since the mount"),
        "{err}"
    );
    assert_eq!(
        system::run("blockdev", &["--getsize64", &dev]).trim(),
        p2.size.to_string(),
        "the loop device kept its size"
    );
    assert_eq!(df_bytes(&dir), before);
    let dump_after = system::run("sfdisk", &["--dump", &file_s]);
    assert_eq!(dump_after, dump_before, "the table changed");
    assert_eq!(
        hash_outside(&guard, "sorted.vhd", disk, p2),
        neighbour,
        "bytes outside the attached partition changed"
    );
    site.ok(&["unmount", &dir]);
    assert!(site.leftovers().is_empty(), "{:?}", site.leftovers());
}
