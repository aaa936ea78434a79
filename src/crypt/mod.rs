//! Client-side encryption of a drive's data area: the data key, the page
//! cipher, and the key slots that keep the data key in the blob's metadata.
//!
//! What it owns: AES-256-XTS over 512-byte pages with the page number as the
//! tweak (16 bytes, little-endian: the layout of dm-crypt's `aes-xts-plain64`,
//! so the written pages of a downloaded image open with standard tools and
//! the dumped key; holes read as zeros here and as noise there), and
//! the key slots (`slots.rs`) that wrap the random data key with a user's key
//! file or a passphrase (Argon2id). It knows nothing of the drive engine or
//! of HTTP.
//!
//! Invariants: an all-zero 512-byte page of ciphertext is never produced by
//! encryption in practice (probability 2^-4096) and is what the service
//! returns for a page that was never written or was cleared, so decryption
//! leaves all-zero pages as zeros (they are holes, not data). Secret bytes
//! (data key, key-encryption keys, passphrases) live in [`Secret`] buffers
//! that are locked in memory where the system allows it and zeroed on drop;
//! they have no `Debug` or `Display` that shows them. A process that has
//! read a user key cannot be dumped ([`forbid_core_dumps`]).

pub mod secret;
pub mod slots;
pub mod xts;

pub use secret::{Secret, UserKey};
pub use slots::{KeySlots, SlotKind};
pub use xts::is_hole;

use xts::PageCipher;

/// Bytes of the data key: two AES-256 keys, as XTS-AES-256 takes them.
pub const DATA_KEY_BYTES: usize = xts::XTS_KEY_BYTES;

/// The cipher name recorded in the metadata (dm-crypt's spelling).
pub const CIPHER_NAME: &str = "aes-xts-plain64";

/// The unwrapped data key of one drive and the page cipher built from it.
pub struct DataKey {
    cipher: PageCipher,
}

impl std::fmt::Debug for DataKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DataKey(<secret>)")
    }
}

impl DataKey {
    /// A new random data key.
    pub fn generate() -> DataKey {
        let mut key = Secret::zeroed(DATA_KEY_BYTES);
        aws_lc_rs::rand::fill(key.bytes_mut()).expect("the system random source works");
        DataKey::from_secret(key)
    }

    /// The data key held in `key` (exactly [`DATA_KEY_BYTES`]).
    pub fn from_secret(key: Secret) -> DataKey {
        assert_eq!(key.len(), DATA_KEY_BYTES, "data keys are 64 bytes");
        DataKey {
            cipher: PageCipher::new(key),
        }
    }

    /// The raw key bytes (for wrapping into a slot, or `key dump`).
    pub fn bytes(&self) -> &[u8] {
        self.cipher.key().bytes()
    }

    /// Encrypt whole pages in place; `buf` starts at page `first_page`.
    pub fn encrypt_pages(&self, first_page: u64, buf: &mut [u8]) {
        self.cipher.encrypt_in_place(first_page, buf);
    }

    /// Encrypt whole pages of `plain` into `out` (same length): the copy
    /// a write makes anyway and the encryption in one pass.
    pub fn encrypt_pages_into(&self, first_page: u64, plain: &[u8], out: &mut [u8]) {
        self.cipher.encrypt_into(first_page, plain, out);
    }

    /// Decrypt whole pages in place; `buf` starts at page `first_page`.
    /// All-zero pages stay zero: they hold no data (never written, or
    /// cleared), and decrypting them would make noise of a hole.
    pub fn decrypt_pages(&self, first_page: u64, buf: &mut [u8]) {
        self.cipher.decrypt_in_place(first_page, buf);
    }

    /// Encrypt packed pages in place: page `i` of `buf` is drive page
    /// `pages[i]` (for copies kept outside the blob, such as the disk tier).
    pub fn encrypt_scattered(&self, pages: &[u64], buf: &mut [u8]) {
        self.cipher.encrypt_scattered(pages, buf);
    }

    /// The reverse of [`DataKey::encrypt_scattered`]; zero pages included.
    pub fn decrypt_scattered(&self, pages: &[u64], buf: &mut [u8]) {
        self.cipher.decrypt_scattered(pages, buf);
    }
}

/// Stop the process from being dumped (core files, ptrace by other users)
/// once it holds key material: not dumpable (which also makes its `/proc`
/// files root's), and a core size limit of 0, soft and hard, which the
/// programs it runs inherit and a later change of credentials (which resets
/// the dumpable flag) keeps. Best effort: failure is logged, not fatal.
pub fn forbid_core_dumps() {
    // SAFETY: prctl(PR_SET_DUMPABLE, 0) has no memory preconditions.
    let rc = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if rc != 0 {
        tracing::warn!("could not turn off core dumps for this process");
    }
    let none = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: setrlimit reads the struct it is given.
    if unsafe { libc::setrlimit(libc::RLIMIT_CORE, &none) } != 0 {
        tracing::warn!("could not set the core file size limit of this process to 0");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = crate::units::PAGE_SIZE as usize;

    fn key() -> DataKey {
        let mut s = Secret::zeroed(DATA_KEY_BYTES);
        for (i, b) in s.bytes_mut().iter_mut().enumerate() {
            *b = i as u8;
        }
        DataKey::from_secret(s)
    }

    #[test]
    fn pages_round_trip_and_differ_by_page_number() {
        let k = key();
        let plain = vec![0x5au8; 2 * PAGE];
        let mut c = plain.clone();
        k.encrypt_pages(7, &mut c);
        assert_ne!(c[..PAGE], plain[..PAGE]);
        assert_ne!(c[..PAGE], c[PAGE..], "same plaintext, other tweak");
        let mut one = plain[..PAGE].to_vec();
        k.encrypt_pages(8, &mut one);
        assert_eq!(one, c[PAGE..], "page 8 alone encrypts the same");
        k.decrypt_pages(7, &mut c);
        assert_eq!(c, plain);
    }

    #[test]
    fn zero_plaintext_encrypts_to_noise_and_zero_ciphertext_is_a_hole() {
        let k = key();
        let mut c = vec![0u8; PAGE];
        k.encrypt_pages(3, &mut c);
        assert!(c.iter().any(|&b| b != 0));
        k.decrypt_pages(3, &mut c);
        assert_eq!(c, vec![0u8; PAGE]);
        let mut hole = vec![0u8; PAGE];
        k.decrypt_pages(3, &mut hole);
        assert_eq!(hole, vec![0u8; PAGE]);
    }
}
