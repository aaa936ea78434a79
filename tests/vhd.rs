//! The fixed VHD footer against the tool everyone else uses: qemu-img.
//!
//! Footers qemu writes must parse with the right size, and footers we write must
//! be read by qemu as fixed VHDs of the same virtual size. Tests print
//! `SKIPPED: <why>` when qemu-img is missing, unless `BLOBDRIVE_REQUIRE_FUSE=1`
//! (CI), where the machine is expected to have everything. Our footers are
//! checked with every qemu-img in use (`common::qemu`): the machine's and
//! Debian 12's 7.2.

mod common;

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use blobdrive::vhd::{DiskType, Error, Footer};

const MIB: u64 = 1024 * 1024;

/// True when qemu-img can run; otherwise prints why (or fails under CI).
fn have_qemu_img() -> bool {
    let ok = Command::new("qemu-img")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        assert!(
            std::env::var("BLOBDRIVE_REQUIRE_FUSE").as_deref() != Ok("1"),
            "qemu-img is required (apt-get install qemu-utils)"
        );
        println!("SKIPPED: qemu-img not installed (apt-get install qemu-utils)");
    }
    ok
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("qemu-img runs");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The last 512 bytes of a file and the file's length.
fn read_footer(path: &Path) -> ([u8; 512], u64) {
    let mut f = File::open(path).expect("open image");
    let len = f.metadata().expect("stat image").len();
    f.seek(SeekFrom::Start(len - 512)).expect("seek to footer");
    let mut b = [0u8; 512];
    f.read_exact(&mut b).expect("read footer");
    (b, len)
}

/// A raw image of `size` bytes with a little data in it.
fn raw_image(dir: &Path, size: u64) -> PathBuf {
    let path = dir.join("disk.raw");
    let mut f = File::create(&path).expect("create raw");
    f.set_len(size).expect("size raw");
    f.write_all(b"blobdrive test data").expect("write raw");
    path
}

/// `qemu-img convert` of a raw image to a VHD of the given subformat.
fn qemu_convert(dir: &Path, raw: &Path, subformat: &str) -> PathBuf {
    let out = dir.join(format!("disk-{subformat}.vhd"));
    run(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "vpc", "-o"])
        .arg(format!("subformat={subformat},force_size=on"))
        .arg(raw)
        .arg(&out));
    out
}

/// qemu's virtual size and format for an image read as vpc by `qemu_img`.
fn qemu_info(qemu_img: &Path, path: &Path) -> (u64, String) {
    let json = run(Command::new(qemu_img)
        .args(["info", "-f", "vpc", "--output=json"])
        .arg(path));
    let v: serde_json::Value = serde_json::from_str(&json).expect("qemu-img prints JSON");
    let size = v["virtual-size"].as_u64().expect("virtual-size");
    let format = v["format"].as_str().unwrap_or_default().to_string();
    (size, format)
}

#[test]
fn qemu_fixed_vhd_parses_with_its_size() {
    if !have_qemu_img() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    // 100 MiB is not a CHS multiple: qemu keeps it only because of force_size.
    let raw = raw_image(dir.path(), 100 * MIB);
    let vhd = qemu_convert(dir.path(), &raw, "fixed");
    let (bytes, len) = read_footer(&vhd);
    assert_eq!(len, 100 * MIB + 512);
    let footer = Footer::parse(&bytes, len).expect("qemu's fixed footer parses");
    assert_eq!(footer.current_size_bytes, 100 * MIB);
    assert_eq!(footer.disk_type, DiskType::Fixed);
    assert_eq!(footer.creator_app_name(), "qem2");
}

#[test]
fn qemu_dynamic_vhd_is_refused_as_not_fixed() {
    if !have_qemu_img() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let raw = raw_image(dir.path(), 32 * MIB);
    let vhd = qemu_convert(dir.path(), &raw, "dynamic");
    let (bytes, len) = read_footer(&vhd);
    let err = Footer::parse(&bytes, len).unwrap_err();
    assert_eq!(err, Error::NotFixed(DiskType::Dynamic));
    assert!(err.to_string().contains("only fixed VHDs"), "{err}");
}

#[test]
fn our_footer_is_a_fixed_vhd_of_the_same_size_to_qemu() {
    let qemus = common::qemu::qemu_imgs("our_footer_is_a_fixed_vhd_of_the_same_size_to_qemu");
    if qemus.is_empty() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    // 16 MiB is a CHS multiple by chance; 100 MiB and 1025 MiB are not, so qemu
    // must take the size from the current-size field, as we do.
    for size in [16 * MIB, 100 * MIB, 1025 * MIB] {
        let path = dir.path().join(format!("ours-{size}.vhd"));
        let mut f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)
            .expect("create image");
        f.set_len(size).expect("zero data area");
        f.seek(SeekFrom::Start(size)).expect("seek to footer");
        f.write_all(&Footer::new_fixed(size).to_bytes())
            .expect("write footer");
        drop(f);
        for qemu in &qemus {
            let (virtual_size, format) = qemu_info(qemu, &path);
            assert_eq!(format, "vpc");
            assert_eq!(
                virtual_size,
                size,
                "{}'s virtual size for {size} bytes",
                qemu.display()
            );
        }
    }
}
