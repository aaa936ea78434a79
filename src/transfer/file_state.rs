//! What a downloaded file holds: the record `download` leaves on the file it
//! writes, which `download --since` reads to know the file's state before it
//! changes a byte.
//!
//! The record names the account, the drive, the snapshot (or none: the live
//! drive), that state's ETag, whether the file is the ciphertext as stored or
//! the decrypted image, with the VHD footer or `--raw`, and the file's size
//! and modification time when blobdrive last wrote it. It is kept in the
//! extended attribute `user.blobdrive.download` (JSON), which travels with
//! the file through a rename, `cp -a`, `rsync -X` and `tar --xattrs`; where
//! the filesystem has no user extended attributes (vfat, some NFS mounts) it
//! is the file `FILE.blobdrive.json` beside it instead.
//!
//! An update marks the record "updating from T1 to T2" (still holding T1)
//! and syncs that before it touches the file, and records "holds T2" only
//! after the file was synced at the end. A run that finds its own mark
//! applies the whole T1→T2 difference again: every written range gets T2's
//! bytes again and every cleared range is punched again, so the result is
//! the same as an uninterrupted run. (Such a run cannot tell its own part-way
//! writes from another program's, so it checks the record, not the file's
//! modification time.)
//!
//! Invariants: a file whose record is missing, unreadable, for another drive
//! or mode, or whose size or modification time moved since blobdrive wrote
//! it (written by something else, or mounted read-write) is never updated;
//! the record of a state is only written after the file holding it was
//! synced.

use std::ffi::CString;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The extended attribute holding the record.
pub const XATTR_NAME: &str = "user.blobdrive.download";

/// Appended to the file's name for the record beside it, where the
/// filesystem has no user extended attributes.
pub const SIDECAR_SUFFIX: &str = ".blobdrive.json";

/// Version of the record's layout; another one is refused.
const VERSION: u32 = 1;

/// Longest record read back (a record is a few hundred bytes).
const MAX_RECORD_BYTES: usize = 16 * 1024;

/// What the file's data area holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Content {
    /// The blob's bytes as stored (an encrypted drive's ciphertext).
    Stored,
    /// The plaintext of an encrypted drive (`--decrypt`).
    Decrypted,
}

/// Whether the file ends with the VHD footer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// The whole blob: the disk and its VHD footer.
    Vhd,
    /// The plain disk image (`--raw`).
    Raw,
}

impl Format {
    /// The format `raw` selects.
    pub fn of(raw: bool) -> Format {
        if raw {
            Format::Raw
        } else {
            Format::Vhd
        }
    }
}

/// An update from the held state to `to`, started and not yet finished.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Updating {
    /// The snapshot the file is being brought to.
    pub to: String,
}

/// The record of what a downloaded file holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileState {
    /// Layout version ([`VERSION`]).
    pub version: u32,
    /// The storage account.
    pub account: String,
    /// The drive, `container/path` (no snapshot).
    pub blob: String,
    /// The snapshot the file holds; `None`: the live drive as it was read.
    pub snapshot: Option<String>,
    /// The ETag of that state, as the service gave it.
    pub etag: Option<String>,
    /// Ciphertext as stored, or decrypted.
    pub content: Content,
    /// With the VHD footer, or raw.
    pub format: Format,
    /// The file's size when blobdrive last wrote it.
    pub file_bytes: u64,
    /// The file's modification time then (seconds, nanoseconds).
    pub mtime: (i64, i64),
    /// Set while an update runs; the file then mixes `snapshot` and `to`.
    pub updating: Option<Updating>,
}

/// The state of a drive a download reads, as the record names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// The storage account.
    pub account: String,
    /// The drive, `container/path` (no snapshot).
    pub blob: String,
    /// The snapshot; `None`: the live drive.
    pub snapshot: Option<String>,
    /// The state's ETag.
    pub etag: Option<String>,
}

impl FileState {
    /// The record of `file`, which now holds `source` in that content and
    /// format: its size and modification time are taken from the file.
    pub fn holding(
        source: &Source,
        content: Content,
        format: Format,
        file: &File,
    ) -> std::io::Result<FileState> {
        let meta = file.metadata()?;
        Ok(FileState {
            version: VERSION,
            account: source.account.clone(),
            blob: source.blob.clone(),
            snapshot: source.snapshot.clone(),
            etag: source.etag.clone(),
            content,
            format,
            file_bytes: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            updating: None,
        })
    }

    /// Whether the file still is as blobdrive left it (same size and
    /// modification time).
    pub fn matches(&self, meta: &std::fs::Metadata) -> bool {
        self.file_bytes == meta.len() && self.mtime == (meta.mtime(), meta.mtime_nsec())
    }
}

/// The record beside `path` (for filesystems without user xattrs).
pub fn sidecar_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(SIDECAR_SUFFIX);
    path.with_file_name(name)
}

fn c_path(path: &Path) -> std::io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("a path with a NUL byte"))
}

fn c_name() -> CString {
    CString::new(XATTR_NAME).expect("no NUL in the name")
}

/// Errors meaning "this filesystem keeps no user extended attributes".
fn no_xattrs(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOTSUP))
}

/// The record's bytes in the xattr of `path`: `Ok(None)` when it has none.
fn read_xattr(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    let (p, n) = (c_path(path)?, c_name());
    let mut buf = vec![0u8; MAX_RECORD_BYTES];
    // SAFETY: valid C strings and a buffer of the length given.
    let len = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if len < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENODATA) => Ok(None),
            _ => Err(e),
        };
    }
    buf.truncate(len as usize);
    Ok(Some(buf))
}

/// Reads the record of the file at `path`: its xattr, or else the file
/// beside it. `Ok(None)`: no record. A record that does not parse, or of
/// another version, is an error (the line says so).
pub fn read(path: &Path) -> anyhow::Result<Option<FileState>> {
    let bytes = match read_xattr(path) {
        Ok(Some(b)) => Some(b),
        Ok(None) => None,
        Err(e) if no_xattrs(&e) => None,
        Err(e) => anyhow::bail!("cannot read the download record of {}: {e}", path.display()),
    };
    let bytes = match bytes {
        Some(b) => b,
        None => match std::fs::read(sidecar_path(path)) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => anyhow::bail!("cannot read {}: {e}", sidecar_path(path).display()),
        },
    };
    let state: FileState = serde_json::from_slice(&bytes).map_err(|e| {
        anyhow::anyhow!(
            "the download record of {} is not one blobdrive wrote ({e}); download the snapshot in full into a new file",
            path.display()
        )
    })?;
    if state.version != VERSION {
        anyhow::bail!(
            "the download record of {} has version {}, which this blobdrive does not know; download the snapshot in full into a new file",
            path.display(),
            state.version
        );
    }
    Ok(Some(state))
}

/// Where a record was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// In the file's extended attribute.
    Xattr,
    /// In the file beside it.
    Sidecar,
}

/// Records `state` for `file`, open at `path` (the name the record is for:
/// the sidecar is named after it), and makes the record durable: the xattr
/// by syncing the file, the sidecar by writing it under a temporary name,
/// syncing, renaming and syncing the directory. A sidecar left from before
/// is removed when the xattr took the record, so one record rules.
pub fn write(file: &File, path: &Path, state: &FileState) -> std::io::Result<Kept> {
    let json = serde_json::to_vec(state).map_err(std::io::Error::other)?;
    let n = c_name();
    // SAFETY: a valid descriptor, C string and buffer of the length given.
    let rc = unsafe {
        libc::fsetxattr(
            file.as_raw_fd(),
            n.as_ptr(),
            json.as_ptr().cast(),
            json.len(),
            0,
        )
    };
    let side = sidecar_path(path);
    if rc == 0 {
        file.sync_all()?;
        match std::fs::remove_file(&side) {
            Ok(()) => sync_dir(path)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        return Ok(Kept::Xattr);
    }
    let e = std::io::Error::last_os_error();
    if !no_xattrs(&e) {
        return Err(e);
    }
    let tmp = side.with_file_name(format!(
        ".{}.{}.tmp",
        side.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    // As private as the download it describes (see [`create_private`]).
    let mut f = create_private(&tmp)?;
    f.write_all(&json)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, &side)?;
    sync_dir(path)?;
    Ok(Kept::Sidecar)
}

/// Creates `path` (truncating one that exists) readable and writable by its
/// owner only (0600, whatever the umask): a downloaded image is as private
/// as the drive it came from, and so are its record and temporaries. The
/// user may chmod it afterwards.
pub fn create_private(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
}

/// Takes an exclusive `flock` on `file` (open at `path`) for as long as
/// `file` stays open, without waiting: a `download --since` holds it for the
/// whole update, and a full download over an existing file takes it before
/// it renames the new file into place, so two of them never write one file
/// at once. Held by another: [`super::Error::Busy`].
pub fn lock_exclusive(file: &File, path: &Path) -> super::Result<()> {
    // SAFETY: a plain syscall on a descriptor this function borrows.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Err(super::Error::Busy {
            path: path.to_path_buf(),
        });
    }
    Err(super::io_error("lock", path)(e))
}

fn sync_dir(path: &Path) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

/// What an update of a file is asked to do: bring a download of `from`
/// (an earlier snapshot of `source.blob`) to the snapshot `to`.
#[derive(Debug, Clone)]
pub struct UpdateAsk<'a> {
    /// The file, for the lines.
    pub path: &'a Path,
    /// The account, drive and the ETag of snapshot `from`.
    pub from: &'a Source,
    /// The later snapshot.
    pub to: &'a str,
    /// The content and format asked for (`--decrypt`, `--raw`).
    pub content: Content,
    /// With the footer or raw.
    pub format: Format,
    /// A command that makes a fresh full download of `to`, for the advice.
    pub full_download: &'a str,
}

/// How an update goes ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// The file holds `from` as recorded: update it.
    Update,
    /// An update `from`→`to` was interrupted: apply it again, whole.
    Resume,
    /// The file already holds `to`: nothing to do.
    UpToDate,
}

/// Decides whether the file (its record `state`, its metadata `meta`) may
/// be updated as `ask` says; the error is the one line saying why not and
/// what to do instead.
pub fn plan_update(
    state: Option<&FileState>,
    meta: &std::fs::Metadata,
    ask: &UpdateAsk<'_>,
) -> Result<Plan, String> {
    let file = ask.path.display();
    let fresh = format!(
        "download {} in full into a new file instead: '{}'",
        ask.to, ask.full_download
    );
    let Some(s) = state else {
        return Err(format!(
            "{file} has no download record (it was not written by a blobdrive download that records one, or was copied without its extended attributes or its {SIDECAR_SUFFIX} file), so which snapshot it holds is unknown; {fresh}"
        ));
    };
    if s.account != ask.from.account || s.blob != ask.from.blob {
        return Err(format!(
            "{file} holds a download of {} in account {}, not of {} in account {}; {fresh}",
            s.blob, s.account, ask.from.blob, ask.from.account
        ));
    }
    if s.format != ask.format {
        return Err(match s.format {
            Format::Raw => format!("{file} is a --raw download (no VHD footer): give --raw"),
            Format::Vhd => format!("{file} is a download with its VHD footer: leave out --raw"),
        });
    }
    if s.content != ask.content {
        return Err(match s.content {
            Content::Decrypted => format!(
                "{file} holds the decrypted image (downloaded with --decrypt): give --decrypt and the key"
            ),
            Content::Stored => format!(
                "{file} holds the drive's bytes as stored (its ciphertext; downloaded without --decrypt): leave out --decrypt"
            ),
        });
    }
    let Some(held) = s.snapshot.as_deref() else {
        return Err(format!(
            "{file} holds the live drive as it was read (ETag {}), which no snapshot names, not snapshot {}; {fresh}",
            s.etag.as_deref().unwrap_or("unknown"),
            ask.from.snapshot.as_deref().unwrap_or("?")
        ));
    };
    let from = ask.from.snapshot.as_deref().unwrap_or_default();
    if held == from && s.etag.is_some() && ask.from.etag.is_some() && s.etag != ask.from.etag {
        return Err(format!(
            "snapshot {from} of {} is not the state {file} was downloaded from (ETag {} then, {} now: the drive was replaced?); {fresh}",
            s.blob,
            s.etag.as_deref().unwrap_or_default(),
            ask.from.etag.as_deref().unwrap_or_default()
        ));
    }
    if let Some(u) = &s.updating {
        if held == from && u.to == ask.to {
            return Ok(Plan::Resume);
        }
        return Err(format!(
            "{file} was being updated from snapshot {held} to {} when that update stopped, so it holds neither; run it again to finish it: --since {held} --snapshot {}",
            u.to, u.to
        ));
    }
    if held != from && held != ask.to {
        return Err(format!(
            "{file} holds snapshot {held} of {}, not {from}: give --since {held}",
            s.blob
        ));
    }
    if !s.matches(meta) {
        return Err(format!(
            "{file} was changed after blobdrive wrote it (its size or modification time is not the recorded one: written to, or mounted read-write?), so it may no longer hold {held}; {fresh}"
        ));
    }
    if held == ask.to {
        return Ok(Plan::UpToDate);
    }
    Ok(Plan::Update)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(snapshot: &str) -> Source {
        Source {
            account: "acct".into(),
            blob: "c/d.vhd".into(),
            snapshot: Some(snapshot.into()),
            etag: Some(format!("etag-{snapshot}")),
        }
    }

    #[test]
    fn plans_follow_the_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("img");
        let file = File::create(&path).unwrap();
        file.set_len(4096).unwrap();
        let meta = file.metadata().unwrap();
        let t1 = source("t1");
        let s = FileState::holding(&t1, Content::Stored, Format::Vhd, &file).unwrap();
        let ask = UpdateAsk {
            path: &path,
            from: &t1,
            to: "t2",
            content: Content::Stored,
            format: Format::Vhd,
            full_download: "blobdrive download c/d.vhd NEW --snapshot t2",
        };
        assert_eq!(plan_update(Some(&s), &meta, &ask), Ok(Plan::Update));
        let e = plan_update(None, &meta, &ask).unwrap_err();
        assert!(e.contains("no download record") && e.contains("NEW"), "{e}");
        let t0 = source("t0");
        let e = plan_update(
            Some(&s),
            &meta,
            &UpdateAsk {
                from: &t0,
                ..ask.clone()
            },
        )
        .unwrap_err();
        assert!(
            e.contains("holds snapshot t1") && e.contains("--since t1"),
            "{e}"
        );
        let e = plan_update(
            Some(&s),
            &meta,
            &UpdateAsk {
                format: Format::Raw,
                ..ask.clone()
            },
        )
        .unwrap_err();
        assert!(e.contains("leave out --raw"), "{e}");
        let e = plan_update(
            Some(&s),
            &meta,
            &UpdateAsk {
                content: Content::Decrypted,
                ..ask.clone()
            },
        )
        .unwrap_err();
        assert!(e.contains("leave out --decrypt"), "{e}");
        let mut u = s.clone();
        u.updating = Some(Updating { to: "t2".into() });
        assert_eq!(plan_update(Some(&u), &meta, &ask), Ok(Plan::Resume));
        let e = plan_update(
            Some(&u),
            &meta,
            &UpdateAsk {
                to: "t3",
                ..ask.clone()
            },
        )
        .unwrap_err();
        assert!(e.contains("--snapshot t2"), "{e}");
        let mut done = s.clone();
        done.snapshot = Some("t2".into());
        assert_eq!(plan_update(Some(&done), &meta, &ask), Ok(Plan::UpToDate));
        file.set_len(8192).unwrap();
        let e = plan_update(Some(&s), &file.metadata().unwrap(), &ask).unwrap_err();
        assert!(e.contains("was changed after blobdrive wrote it"), "{e}");
    }

    #[test]
    fn a_record_round_trips_through_the_xattr_or_the_file_beside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("img");
        let file = File::create(&path).unwrap();
        assert_eq!(read(&path).unwrap(), None);
        let s = FileState::holding(&source("t1"), Content::Decrypted, Format::Raw, &file).unwrap();
        write(&file, &path, &s).unwrap();
        assert_eq!(read(&path).unwrap(), Some(s));
    }
}
