//! The qemu-img binaries a VHD test checks against: the machine's own (the
//! newest, from the distribution or its backports) and Debian 12's 7.2,
//! which `scripts/setup.sh` unpacks into `.tools/qemu-7.2` without
//! installing it. qemu before 10 sizes a VHD by its CHS geometry unless it
//! knows the footer's creator, so both must read our drives at their size.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Set by CI: what a test needs must be there.
const REQUIRE_ENV: &str = "BLOBDRIVE_REQUIRE_FUSE";

fn runs(program: &Path) -> bool {
    Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Where `scripts/setup.sh` unpacks Debian 12's qemu-img.
pub fn old_qemu_img() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/qemu-7.2/usr/bin/qemu-img")
}

/// Every qemu-img to test with, the machine's first. Prints `SKIPPED: why`
/// for one that is missing; under `BLOBDRIVE_REQUIRE_FUSE=1` a missing
/// machine qemu-img fails the test, and so does a missing 7.2 unless setup
/// recorded why it could not fetch it (`.tools/qemu-7.2.unavailable`).
pub fn qemu_imgs(test: &str) -> Vec<PathBuf> {
    let required = std::env::var(REQUIRE_ENV).as_deref() == Ok("1");
    let mut found = Vec::new();
    let system = PathBuf::from("qemu-img");
    if runs(&system) {
        found.push(system);
    } else {
        assert!(
            !required,
            "{test}: qemu-img is required (apt-get install qemu-utils)"
        );
        println!("SKIPPED: {test}: qemu-img not installed (apt-get install qemu-utils)");
    }
    let old = old_qemu_img();
    if runs(&old) {
        found.push(old);
    } else {
        let marker = Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/qemu-7.2.unavailable");
        match std::fs::read_to_string(&marker) {
            Ok(why) => println!("SKIPPED: {test} with qemu-img 7.2: {}", why.trim()),
            Err(_) => {
                assert!(
                    !required,
                    "{test}: qemu-img 7.2 missing at {}: run scripts/setup.sh",
                    old.display()
                );
                println!(
                    "SKIPPED: {test} with qemu-img 7.2: not at {} (scripts/setup.sh fetches it)",
                    old.display()
                );
            }
        }
    }
    found
}
