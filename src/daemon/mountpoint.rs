//! A mount point seen from outside its daemon: whether something is mounted
//! there (the kernel's mount table), how to detach it lazily, and the key
//! under which the run directory keeps what belongs to it.
//!
//! What it owns: reading `/proc/self/mountinfo`, `umount2(MNT_DETACH)`, the
//! run directory (`$BLOBDRIVE_RUN_DIR`, default `/run/blobdrive`; a shared
//! one, such as `/tmp`, holds a private `blobdrive-UID` directory per user
//! and is never changed itself) and the mount key. It sits below `attach.rs`, `control.rs`, `registry.rs` and
//! `format.rs`, which all need these and must not need each other for them.
//! Invariant: one canonical directory has one key, so the control socket and
//! the registry entry of a mount are found from its path alone.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use sha2::{Digest, Sha256};

use crate::private_dir;

/// Default run directory.
pub const DEFAULT_RUN_DIR: &str = "/run/blobdrive";
/// Environment variable that overrides [`DEFAULT_RUN_DIR`] (tests, non-root users).
pub const RUN_DIR_ENV: &str = "BLOBDRIVE_RUN_DIR";
/// What the private directory of uid N in a shared run directory is called,
/// before the N.
const PRIVATE_PREFIX: &str = "blobdrive-";

/// The run directory as the user gave it (`$BLOBDRIVE_RUN_DIR`, else
/// [`DEFAULT_RUN_DIR`]); blobdrive never changes its mode.
pub fn base_run_dir() -> PathBuf {
    std::env::var_os(RUN_DIR_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_RUN_DIR))
}

/// The directory holding this user's control sockets, registry and private
/// FUSE mounts: the run directory itself when it is this user's and nobody
/// else may write to it (the default `/run/blobdrive`, which blobdrive makes
/// 0700, or a directory of one's own), or when it does not exist yet (it is
/// then made 0700); otherwise (a shared one such as `/tmp`, or another
/// user's) `blobdrive-UID` inside it, 0700. Computes the path only: the
/// daemon makes and checks it with [`ensure_run_dir`].
pub fn run_dir() -> PathBuf {
    let base = base_run_dir();
    let missing =
        std::fs::symlink_metadata(&base).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound);
    if missing || private_dir::is_ours_alone(&base) {
        base
    } else {
        base.join(format!("{PRIVATE_PREFIX}{}", private_dir::euid()))
    }
}

/// Make (0700) or check [`run_dir`] and return it. The run directory the
/// user gave is never changed: used as it is when it is this user's alone;
/// when it is shared, it must be root's or this user's, and sticky if others
/// may write to it, and the private directory in it must be a real directory
/// of this user that nobody else may write to (see `private_dir`). The
/// error says in one line what is wrong.
pub fn ensure_run_dir() -> std::io::Result<PathBuf> {
    let base = base_run_dir();
    let dir = run_dir();
    if dir != base {
        private_dir::check_parent(&base)?;
        private_dir::ensure(&dir)?;
    } else if !base.exists() {
        private_dir::ensure(&base)?;
    }
    Ok(dir)
}

/// The run directory of the user who owns the mount at `canonical`, for
/// root, who may control every mount: the kernel's mount table says whose
/// it is (a FUSE mount records `user_id=`; anything else, such as the
/// filesystem of an attach, which only root can make, is root's). `None`
/// when nothing is mounted there or it is root's. Only that user's
/// `blobdrive-UID` directory, owned by them and writable by nobody else, is
/// trusted: a socket another user left elsewhere under the mount's name is
/// never asked.
pub(crate) fn owners_run_dir(canonical: &Path) -> Option<PathBuf> {
    let uid = mount_owner(canonical)?;
    if uid == 0 {
        return None;
    }
    let dir = base_run_dir().join(format!("{PRIVATE_PREFIX}{uid}"));
    private_dir::is_owned_by_alone(&dir, uid).then_some(dir)
}

/// The uid that owns the mount at `canonical` (see [`owners_run_dir`]).
fn mount_owner(canonical: &Path) -> Option<u32> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let wanted = escape_mountinfo(&canonical.to_string_lossy());
    // The last mount at a path is the one seen there.
    let line = info
        .lines()
        .rfind(|line| line.split(' ').nth(4) == Some(wanted.as_str()))?;
    Some(owner_of_mountinfo_line(line))
}

/// The owner a mountinfo line records: `user_id=N` among the super options
/// (after ` - FSTYPE SOURCE`) of a FUSE mount, else root.
fn owner_of_mountinfo_line(line: &str) -> u32 {
    let Some((_, tail)) = line.split_once(" - ") else {
        return 0;
    };
    let mut fields = tail.split(' ');
    let fstype = fields.next().unwrap_or_default();
    let super_options = fields.nth(1).unwrap_or_default();
    if !(fstype == "fuse" || fstype.starts_with("fuse.")) {
        return 0;
    }
    super_options
        .split(',')
        .find_map(|o| o.strip_prefix("user_id=")?.parse().ok())
        .unwrap_or(0)
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

/// The mount points of every FUSE mount (type `fuse`, `fuseblk` or
/// `fuse.*`) this process can see and this user owns (root: every owner),
/// unescaped. Blobdrive's are among them (its daemon mounts as root with type
/// `fuse`, the subtype not shown): whose they are, only their control
/// sockets tell.
pub fn fuse_mounts() -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    fuse_mounts_in(&info, uid)
}

fn fuse_mounts_in(info: &str, uid: u32) -> Vec<PathBuf> {
    info.lines()
        .filter(|line| {
            let fstype = line
                .split_once(" - ")
                .and_then(|(_, tail)| tail.split(' ').next())
                .unwrap_or_default();
            (fstype == "fuse" || fstype == "fuseblk" || fstype.starts_with("fuse."))
                && (uid == 0 || owner_of_mountinfo_line(line) == uid)
        })
        .filter_map(|line| line.split(' ').nth(4))
        .map(|dir| PathBuf::from(unescape_mountinfo(dir)))
        .collect()
}

/// The path a mountinfo field stands for (the inverse of [`escape_mountinfo`]).
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            let d = std::str::from_utf8(d).ok()?;
            u8::from_str_radix(d, 8).ok()
        });
        match (bytes[i], octal) {
            (b'\\', Some(b)) => {
                out.push(b);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
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
    #[test]
    fn the_owner_of_a_mount_is_the_user_id_of_a_fuse_mount_else_root() {
        let fuse = "36 35 0:40 / /home/u/m rw,nosuid - fuse.blobdrive blobdrive rw,user_id=1000,group_id=1000";
        assert_eq!(owner_of_mountinfo_line(fuse), 1000);
        let plain = "37 35 7:0 / /mnt/d rw - ext4 /dev/loop0 rw";
        assert_eq!(owner_of_mountinfo_line(plain), 0);
        // A user_id in another filesystem's options means nothing.
        let other = "38 35 0:41 / /mnt/x rw - tmpfs tmpfs rw,user_id=7";
        assert_eq!(owner_of_mountinfo_line(other), 0);
        assert_eq!(owner_of_mountinfo_line("garbage"), 0);
    }

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

    #[test]
    fn fuse_mounts_are_read_unescaped_and_by_owner() {
        let info = "\
36 35 0:40 / /home/u/my\\040drives rw - fuse.blobdrive c rw,user_id=1000,group_id=1000
37 35 0:41 / /run/blobdrive/fuse/ab rw - fuse acct/c rw,user_id=0,group_id=0
38 35 7:0 / /mnt/d rw - ext4 /dev/loop0 rw
39 35 0:42 / /mnt/other rw - fuse.sshfs x rw,user_id=1001
";
        assert_eq!(
            fuse_mounts_in(info, 0),
            [
                PathBuf::from("/home/u/my drives"),
                PathBuf::from("/run/blobdrive/fuse/ab"),
                PathBuf::from("/mnt/other")
            ]
        );
        assert_eq!(
            fuse_mounts_in(info, 1000),
            [PathBuf::from("/home/u/my drives")]
        );
        assert_eq!(
            unescape_mountinfo(&escape_mountinfo("/a b\\c\td")),
            "/a b\\c\td"
        );
    }
}
