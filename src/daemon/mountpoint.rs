//! A mount point seen from outside its daemon: whether something is mounted
//! there (the kernel's mount table), how to detach it lazily, and the key
//! under which the run directory keeps what belongs to it.
//!
//! What it owns: reading `/proc/self/mountinfo`, `umount2(MNT_DETACH)`, the
//! run directory (`$BLOBDRIVE_RUN_DIR`, default `/run/blobdrive`) and the
//! mount key. It sits below `attach.rs`, `control.rs`, `registry.rs` and
//! `format.rs`, which all need these and must not need each other for them.
//! Invariant: one canonical directory has one key, so the control socket and
//! the registry entry of a mount are found from its path alone.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use sha2::{Digest, Sha256};

/// Default directory of the control sockets.
pub const DEFAULT_RUN_DIR: &str = "/run/blobdrive";
/// Environment variable that overrides [`DEFAULT_RUN_DIR`] (tests, non-root users).
pub const RUN_DIR_ENV: &str = "BLOBDRIVE_RUN_DIR";

/// The directory holding control sockets.
pub fn run_dir() -> PathBuf {
    std::env::var_os(RUN_DIR_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_RUN_DIR))
}

/// The name of everything a mount keeps in the run directory: the first 16
/// hex digits of the SHA-256 of its canonical mountpoint path.
pub fn mount_key(canonical: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let digest = Sha256::digest(canonical.as_os_str().as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// True when something is mounted at `dir` (canonical) in this namespace.
pub(crate) fn is_mount_point(dir: &Path) -> std::io::Result<bool> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let wanted = escape_mountinfo(&dir.to_string_lossy());
    Ok(info
        .lines()
        .any(|line| line.split(' ').nth(4) == Some(wanted.as_str())))
}

/// A path as `/proc/self/mountinfo` prints it: space, tab, newline and
/// backslash in octal.
fn escape_mountinfo(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        match c {
            ' ' => out.push_str("\\040"),
            '\t' => out.push_str("\\011"),
            '\n' => out.push_str("\\012"),
            '\\' => out.push_str("\\134"),
            c => out.push(c),
        }
    }
    out
}

/// Detaches whatever is mounted at `dir` now and lets the kernel finish
/// when it is no longer busy (`umount -l`).
pub(crate) fn lazy_unmount(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .context("mount point path holds a NUL byte")?;
    // SAFETY: `path` is a valid NUL-terminated string for the call's duration.
    if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("cannot detach the dead mount {}", dir.display()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_match_the_kernel() {
        assert_eq!(escape_mountinfo("/mnt/a b\\c"), "/mnt/a\\040b\\134c");
        // `/proc` is a mount wherever mountinfo can be read at all; `/` is not
        // one in a chroot whose root is a plain directory.
        assert!(is_mount_point(Path::new("/proc")).unwrap());
        let plain = tempfile::tempdir().unwrap();
        let plain = plain.path().canonicalize().unwrap();
        assert!(!is_mount_point(&plain).unwrap());
    }
}
