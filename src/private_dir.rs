//! Directories and files only their owner may open: the disk tier's pages,
//! the run directory's control sockets and registry, recovery files. They
//! hold plaintext pages or control a mount, so no other local user may read
//! them, and none may have placed anything in them.
//!
//! The rules, in one place:
//! - A directory blobdrive makes is created with mode 0700 (`mkdir` mode,
//!   not the umask's grace), a file with 0600 (`open` mode): no moment
//!   exists in which they are looser.
//! - An existing private directory must be a real directory (not a symbolic
//!   link) owned by this user. One that others may only read or enter is
//!   tightened to 0700 (an older blobdrive made them 0755); one that others
//!   may write to, or that belongs to someone else, is refused: what it holds
//!   may have been put there by another user.
//! - A directory the user names to hold private ones (`--cache-dir`,
//!   `BLOBDRIVE_RUN_DIR`) is never changed: it may be `/tmp`. It must belong
//!   to this user or root and, when others may write to it, carry the sticky
//!   bit (so nobody else can rename or remove what blobdrive makes there).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Mode of a private directory.
pub const DIR_MODE: u32 = 0o700;
/// Mode of a private file.
pub const FILE_MODE: u32 = 0o600;

/// This process's effective user id.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

fn refused(path: &Path, why: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("{} {why}", path.display()),
    )
}

/// Create `path` (and any missing parent) with mode 0700, or check the
/// directory already there: see the module doc for what is tightened and
/// what is refused. The error says in one line what is wrong.
pub fn ensure(path: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(path)?;
    check(path)
}

/// Check an existing private directory (see [`ensure`]).
pub fn check(path: &Path) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    if meta.file_type().is_symlink() {
        return Err(refused(
            path,
            "is a symbolic link; blobdrive keeps private files only in a real directory: remove it"
                .into(),
        ));
    }
    if !meta.is_dir() {
        return Err(refused(path, "is not a directory".into()));
    }
    let me = euid();
    if meta.uid() != me {
        return Err(refused(
            path,
            format!(
                "belongs to uid {}, not to this user (uid {me}): remove it, or choose another directory",
                meta.uid()
            ),
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(refused(
            path,
            format!(
                "is writable by other users (mode {mode:o}), so what it holds cannot be trusted: remove it"
            ),
        ));
    }
    if mode & 0o077 != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(DIR_MODE))?;
        tracing::warn!(dir = %path.display(), was = format!("{mode:o}"), "tightened to 0700");
    }
    Ok(())
}

/// Check a directory the user named to hold private ones (it is never
/// changed; see the module doc). A missing one is created 0700.
pub fn check_parent(path: &Path) -> io::Result<()> {
    let meta = match std::fs::metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return ensure(path),
        r => r?,
    };
    if !meta.is_dir() {
        return Err(refused(path, "is not a directory".into()));
    }
    let me = euid();
    if meta.uid() != me && meta.uid() != 0 {
        return Err(refused(
            path,
            format!(
                "belongs to uid {}, neither this user (uid {me}) nor root: choose another directory",
                meta.uid()
            ),
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        return Err(refused(
            path,
            format!(
                "is writable by other users without the sticky bit (mode {mode:o}): choose another directory"
            ),
        ));
    }
    Ok(())
}

/// Is `path` a real directory of this user that nobody else may write to
/// (so what blobdrive makes in it cannot be renamed, replaced or planted by
/// another user)?
pub fn is_ours_alone(path: &Path) -> bool {
    is_owned_by_alone(path, euid())
}

/// Is `path` a real directory of `uid` that nobody else may write to?
pub fn is_owned_by_alone(path: &Path, uid: u32) -> bool {
    std::fs::symlink_metadata(path)
        .is_ok_and(|m| m.is_dir() && m.uid() == uid && m.mode() & 0o022 == 0)
}

/// Create a new file at `path` with mode 0600 (an older file of that name is
/// replaced: it may carry a looser mode), for writing.
pub fn create_file(path: &Path) -> io::Result<File> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)
}

/// Open (or create, 0600) `path` for writing, keeping its contents; an older
/// file with a looser mode is tightened. Never waits: a FIFO planted there
/// fails to open (`O_NONBLOCK`) rather than hang the caller.
pub fn open_file(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    tighten_file(&file)?;
    Ok(file)
}

/// Set an open file's mode to 0600 when others may open it.
pub fn tighten_file(file: &File) -> io::Result<()> {
    if file.metadata()?.mode() & 0o077 != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn made_private_whatever_the_umask() {
        let root = tempfile::tempdir().unwrap();
        // SAFETY: umask only changes this process's file creation mask.
        let old = unsafe { libc::umask(0) };
        let made = root.path().join("a/b");
        ensure(&made).unwrap();
        let file = made.join("f");
        drop(create_file(&file).unwrap());
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        assert_eq!(mode(&root.path().join("a")), 0o700);
        assert_eq!(mode(&made), 0o700);
        assert_eq!(mode(&file), 0o600);
    }

    #[test]
    fn loose_dirs_are_tightened_writable_ones_and_links_refused() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("d");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        ensure(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);

        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = ensure(&dir).unwrap_err().to_string();
        assert!(err.contains("writable by other users"), "{err}");

        let link = root.path().join("l");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let err = ensure(&link).unwrap_err().to_string();
        assert!(err.contains("symbolic link"), "{err}");

        let file = root.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        drop(open_file(&file).unwrap());
        assert_eq!(mode(&file), 0o600);
    }

    #[test]
    fn a_named_parent_is_never_changed() {
        let root = tempfile::tempdir().unwrap();
        let shared = root.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        check_parent(&shared).unwrap();
        assert_eq!(mode(&shared), 0o1777);
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(check_parent(&shared).is_err());
        assert_eq!(mode(&shared), 0o777);
        let missing = root.path().join("new");
        check_parent(&missing).unwrap();
        assert_eq!(mode(&missing), 0o700);
    }
}
