//! Secret bytes and the user's key: a key file, or a passphrase from a file
//! or a prompt.
//!
//! A [`Secret`] is a heap buffer that is locked in memory (`mlock`, so it is
//! never written to swap; best effort, as locked memory is limited for
//! non-root users) and zeroed when dropped. Its `Debug` shows only its
//! length. Messages about a key name the file, never its content.
//!
//! Memory locks are per page and not inherited across `fork` (mlock(2)).
//! So every live secret is recorded in a list: a dropped secret unlocks
//! its pages and locks again those another live secret still shares, and
//! the mount daemon, which unlocks the key in the parent before forking,
//! locks them all again in the child ([`relock_after_fork`]).
//!
//! Reading a user key first makes the process undumpable
//! ([`super::forbid_core_dumps`]). Key and passphrase files are read into
//! locked buffers of bounded size (`/dev/zero` is refused, not read
//! forever), and one readable by other users, or owned by another user, is
//! warned about, as cryptsetup does.

use std::io::{IsTerminal, Read};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Mutex;

use anyhow::{anyhow, bail};
use zeroize::Zeroize;

/// Bytes of a key file: one AES-256 key-encryption key.
pub const KEY_FILE_BYTES: usize = 32;

/// Longest passphrase accepted (a file of more is not a passphrase).
const MAX_PASSPHRASE_BYTES: usize = 1024;

/// The heap ranges (address, length) of the live, non-empty secrets.
static LOCKED: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// Secret bytes: locked in memory where possible, zeroed on drop.
pub struct Secret {
    buf: Box<[u8]>,
}

/// `mlock` of `len` bytes at `addr`; whether it worked.
fn lock_range(addr: usize, len: usize) -> bool {
    // SAFETY: callers pass the range of a live secret's buffer; mlock only
    // changes how the kernel pages that memory.
    unsafe { libc::mlock(addr as *const libc::c_void, len) == 0 }
}

/// The first and one past the last page of a range.
fn pages_of(addr: usize, len: usize) -> (usize, usize) {
    // SAFETY: sysconf has no memory effects.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    (addr / page, (addr + len).div_ceil(page))
}

impl Secret {
    /// `len` zero bytes, to be filled in place.
    pub fn zeroed(len: usize) -> Secret {
        let buf = vec![0u8; len].into_boxed_slice();
        if len > 0 {
            let range = (buf.as_ptr() as usize, len);
            // A boxed slice never moves its heap data, so the range stays
            // this secret's until it is dropped.
            lock_range(range.0, range.1);
            LOCKED
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(range);
        }
        Secret { buf }
    }

    /// A secret holding a copy of `bytes` (the caller zeroes its original).
    pub fn copy_of(bytes: &[u8]) -> Secret {
        let mut s = Secret::zeroed(bytes.len());
        s.buf.copy_from_slice(bytes);
        s
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// The bytes, to fill in place.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        self.buf.zeroize();
        if self.buf.is_empty() {
            return;
        }
        let range = (self.buf.as_ptr() as usize, self.buf.len());
        let mut locked = LOCKED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(i) = locked.iter().position(|r| *r == range) {
            locked.swap_remove(i);
        }
        // SAFETY: unlocks this secret's own range (munlock of memory that
        // is not locked does nothing).
        unsafe { libc::munlock(range.0 as *const libc::c_void, range.1) };
        // Locks are per page, not counted: the secrets sharing a page with
        // this one were just unlocked too.
        let (first, end) = pages_of(range.0, range.1);
        for &(addr, len) in locked.iter() {
            let (f, e) = pages_of(addr, len);
            if f < end && first < e {
                lock_range(addr, len);
            }
        }
    }
}

/// Locks every live secret again, in the child of a `fork` (which inherits
/// the memory but not its locks). Call it before the child starts a thread.
/// Whether every one is locked (true when there are none).
pub fn relock_after_fork() -> bool {
    // try_lock: a fork while another thread held the list (against the
    // caller's contract) must not hang the child.
    let Ok(locked) = LOCKED.try_lock() else {
        return false;
    };
    locked.iter().all(|&(addr, len)| lock_range(addr, len))
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes)", self.buf.len())
    }
}

/// What the user unlocks a drive with (or protects a new key slot with).
#[derive(Debug)]
pub enum UserKey {
    /// The 32 bytes of a key file: used as the key-encryption key itself.
    KeyFile(Secret),
    /// A passphrase: the key-encryption key is derived with Argon2id.
    Passphrase(Secret),
}

/// Where a user key comes from (the command-line flags).
#[derive(Debug, Clone, Default)]
pub struct KeySource {
    /// `--key-file F`.
    pub key_file: Option<std::path::PathBuf>,
    /// `--passphrase-file F`.
    pub passphrase_file: Option<std::path::PathBuf>,
}

impl KeySource {
    /// Whether a key or passphrase file was named.
    pub fn is_given(&self) -> bool {
        self.key_file.is_some() || self.passphrase_file.is_some()
    }

    /// Read the key: the key file, the passphrase file, or (neither given,
    /// standard input a terminal) a passphrase prompt saying `prompt`.
    /// `None` when nothing was given and there is no terminal to ask on.
    /// From here on the process holds key material: it is made undumpable
    /// first.
    pub fn read(&self, prompt: &str, confirm: bool) -> anyhow::Result<Option<UserKey>> {
        let given = self.is_given() || std::io::stdin().is_terminal();
        if given {
            super::forbid_core_dumps();
        }
        if let Some(f) = &self.key_file {
            return read_key_file(f).map(Some);
        }
        if let Some(f) = &self.passphrase_file {
            return read_passphrase_file(f).map(Some);
        }
        if !given {
            return Ok(None);
        }
        prompt_passphrase(prompt, confirm).map(Some)
    }
}

/// At most `limit` bytes of the file at `path` (`what` names it in errors),
/// read straight into a locked buffer: no copy of a key is left behind, and
/// an endless file (`/dev/zero`, a pipe) costs `limit` bytes, not all memory.
/// Also the file's metadata, for [`warn_if_exposed`] once the content was
/// accepted (a refused key gets its one error line, no warning).
fn read_bounded(
    path: &Path,
    what: &str,
    limit: usize,
) -> anyhow::Result<(Secret, Option<std::fs::Metadata>)> {
    let cannot = |e: std::io::Error| anyhow!("cannot read {what} {}: {e}", path.display());
    let mut file = std::fs::File::open(path).map_err(cannot)?;
    let meta = file.metadata().ok();
    let mut buf = Secret::zeroed(limit);
    let mut len = 0;
    while len < limit {
        match file.read(&mut buf.bytes_mut()[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(cannot(e)),
        }
    }
    Ok((Secret::copy_of(&buf.bytes()[..len]), meta))
}

/// The warning cryptsetup gives too: a key file other users may read, or
/// that belongs to someone else (who could replace it), is not private.
/// Only regular files are judged (a device or pipe has its own rules).
pub fn warn_if_exposed(path: &Path, what: &str, meta: Option<&std::fs::Metadata>) {
    let Some(meta) = meta.filter(|m| m.file_type().is_file()) else {
        return;
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        tracing::warn!(
            "{what} {} can be read or changed by other users (mode {mode:04o}): \
             chmod 600 {}",
            path.display(),
            path.display()
        );
    }
    if meta.uid() != me {
        tracing::warn!(
            "{what} {} belongs to user {}, not to the user running blobdrive ({me})",
            path.display(),
            meta.uid()
        );
    }
}

/// Read a key file: exactly [`KEY_FILE_BYTES`] bytes.
pub fn read_key_file(path: &Path) -> anyhow::Result<UserKey> {
    let (key, meta) = read_bounded(path, "key file", KEY_FILE_BYTES + 1)?;
    if key.len() != KEY_FILE_BYTES {
        let holds = if key.len() > KEY_FILE_BYTES {
            format!("more than {KEY_FILE_BYTES}")
        } else {
            key.len().to_string()
        };
        bail!(
            "key file {} holds {holds} bytes; a key file holds exactly {KEY_FILE_BYTES} random bytes \
             (make one with 'head -c {KEY_FILE_BYTES} /dev/urandom > FILE')",
            path.display()
        );
    }
    warn_if_exposed(path, "key file", meta.as_ref());
    Ok(UserKey::KeyFile(key))
}

/// Read a passphrase file: its content without one trailing newline.
pub fn read_passphrase_file(path: &Path) -> anyhow::Result<UserKey> {
    // Room for the longest passphrase, "\r\n", and one byte to tell a
    // longer file.
    let (raw, meta) = read_bounded(path, "passphrase file", MAX_PASSPHRASE_BYTES + 3)?;
    let mut end = raw.len();
    if raw.bytes()[..end].ends_with(b"\n") {
        end -= 1;
        if raw.bytes()[..end].ends_with(b"\r") {
            end -= 1;
        }
    }
    let pass = Secret::copy_of(&raw.bytes()[..end]);
    check_passphrase(&pass, &format!("passphrase file {}", path.display()))?;
    warn_if_exposed(path, "passphrase file", meta.as_ref());
    Ok(UserKey::Passphrase(pass))
}

fn check_passphrase(pass: &Secret, what: &str) -> anyhow::Result<()> {
    if pass.is_empty() {
        bail!("{what} is empty");
    }
    if pass.len() > MAX_PASSPHRASE_BYTES {
        bail!("{what} is longer than {MAX_PASSPHRASE_BYTES} bytes");
    }
    Ok(())
}

/// Ask for a passphrase on the terminal without echo (twice when `confirm`).
fn prompt_passphrase(prompt: &str, confirm: bool) -> anyhow::Result<UserKey> {
    let read = |p: &str| -> anyhow::Result<Secret> {
        let mut s = rpassword::prompt_password(p)
            .map_err(|e| anyhow!("cannot read the passphrase from the terminal: {e}"))?;
        let out = Secret::copy_of(s.as_bytes());
        s.zeroize();
        Ok(out)
    };
    let pass = read(prompt)?;
    check_passphrase(&pass, "the passphrase")?;
    if confirm {
        let again = read("Repeat the passphrase: ")?;
        if again.bytes() != pass.bytes() {
            bail!("the two passphrases differ");
        }
    }
    Ok(UserKey::Passphrase(pass))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_file_of_the_wrong_length_is_refused_without_its_content() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("k");
        std::fs::write(&f, b"secret-bytes").unwrap();
        let e = read_key_file(&f).unwrap_err().to_string();
        assert!(e.contains("holds 12 bytes"), "{e}");
        assert!(!e.contains("secret-bytes"));
    }

    #[test]
    fn endless_key_and_passphrase_files_are_refused_after_a_bounded_read() {
        let e = read_key_file(Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("holds more than 32 bytes"), "{e}");
        let e = read_passphrase_file(Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("longer than 1024 bytes"), "{e}");
    }

    #[test]
    fn passphrase_file_loses_one_trailing_newline() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("p");
        std::fs::write(&f, b"pass word\n").unwrap();
        match read_passphrase_file(&f).unwrap() {
            UserKey::Passphrase(p) => assert_eq!(p.bytes(), b"pass word"),
            other => panic!("{other:?}"),
        }
        std::fs::write(&f, b"\n").unwrap();
        assert!(read_passphrase_file(&f).is_err());
    }
}
