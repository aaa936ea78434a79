//! Secret bytes and the user's key: a key file, or a passphrase from a file
//! or a prompt.
//!
//! A [`Secret`] is a heap buffer that is locked in memory (`mlock`, so it is
//! never written to swap; best effort, as locked memory is limited for
//! non-root users) and zeroed when dropped. Its `Debug` shows only its
//! length. Messages about a key name the file, never its content.

use std::io::IsTerminal;
use std::path::Path;

use anyhow::{anyhow, bail};
use zeroize::Zeroize;

/// Bytes of a key file: one AES-256 key-encryption key.
pub const KEY_FILE_BYTES: usize = 32;

/// Longest passphrase accepted (a file of more is not a passphrase).
const MAX_PASSPHRASE_BYTES: usize = 1024;

/// Secret bytes: locked in memory where possible, zeroed on drop.
pub struct Secret {
    buf: Box<[u8]>,
    locked: bool,
}

impl Secret {
    /// `len` zero bytes, to be filled in place.
    pub fn zeroed(len: usize) -> Secret {
        let buf = vec![0u8; len].into_boxed_slice();
        // SAFETY: the range is the buffer just allocated, which lives as
        // long as `self` (a boxed slice never moves its heap data).
        let locked = len > 0 && unsafe { libc::mlock(buf.as_ptr().cast(), len) } == 0;
        Secret { buf, locked }
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
        if self.locked {
            // SAFETY: unlocks exactly the range locked in `zeroed`.
            unsafe { libc::munlock(self.buf.as_ptr().cast(), self.buf.len()) };
        }
    }
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
    pub fn read(&self, prompt: &str, confirm: bool) -> anyhow::Result<Option<UserKey>> {
        if let Some(f) = &self.key_file {
            return read_key_file(f).map(Some);
        }
        if let Some(f) = &self.passphrase_file {
            return read_passphrase_file(f).map(Some);
        }
        if !std::io::stdin().is_terminal() {
            return Ok(None);
        }
        prompt_passphrase(prompt, confirm).map(Some)
    }
}

/// Read a key file: exactly [`KEY_FILE_BYTES`] bytes.
pub fn read_key_file(path: &Path) -> anyhow::Result<UserKey> {
    let mut raw =
        std::fs::read(path).map_err(|e| anyhow!("cannot read key file {}: {e}", path.display()))?;
    let len = raw.len();
    let key = Secret::copy_of(&raw);
    raw.zeroize();
    if len != KEY_FILE_BYTES {
        bail!(
            "key file {} holds {len} bytes; a key file holds exactly {KEY_FILE_BYTES} random bytes \
             (make one with 'head -c {KEY_FILE_BYTES} /dev/urandom > FILE')",
            path.display()
        );
    }
    Ok(UserKey::KeyFile(key))
}

/// Read a passphrase file: its content without one trailing newline.
pub fn read_passphrase_file(path: &Path) -> anyhow::Result<UserKey> {
    let mut raw = std::fs::read(path)
        .map_err(|e| anyhow!("cannot read passphrase file {}: {e}", path.display()))?;
    let mut end = raw.len();
    if raw[..end].ends_with(b"\n") {
        end -= 1;
        if raw[..end].ends_with(b"\r") {
            end -= 1;
        }
    }
    let pass = Secret::copy_of(&raw[..end]);
    raw.zeroize();
    check_passphrase(&pass, &format!("passphrase file {}", path.display()))?;
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
