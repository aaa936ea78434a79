//! AES-256-XTS over 512-byte pages, done by AWS-LC (the library under
//! `aws-lc-rs`, already the project's TLS and key-wrapping crypto).
//!
//! Why AWS-LC and not RustCrypto's `xts-mode`: `xts-mode` encrypts one AES
//! block at a time (about 430 MB/s on this project's machines), which made
//! an encrypted drive cost a second core per 400 MB/s; AWS-LC's XTS uses the
//! CPU's AES instructions on many blocks at once (several GB/s) and is
//! FIPS-validated. The layout is the standard one either way: one data unit
//! per page, the page number as a 16-byte little-endian tweak (dm-crypt's
//! `aes-xts-plain64`); a unit test holds the two implementations to the same
//! bytes.
//!
//! Each call builds its own cipher context (two AES key schedules, well
//! under a microsecond) and frees it before returning, so a [`PageCipher`]
//! is shared between threads without a lock; AWS-LC wipes the expanded keys
//! when the context is freed.

use std::os::raw::c_int;
use std::ptr;

use aws_lc_sys::{
    EVP_CIPHER_CTX_free, EVP_CIPHER_CTX_new, EVP_CipherInit_ex, EVP_CipherUpdate, EVP_aes_256_xts,
    EVP_CIPHER_CTX,
};

use super::secret::Secret;

/// Bytes of one data unit: a drive page.
const UNIT: usize = crate::units::PAGE_SIZE as usize;

/// Bytes of an XTS-AES-256 key: two AES-256 keys.
pub const XTS_KEY_BYTES: usize = 64;

/// The page cipher of one data key.
pub struct PageCipher {
    key: Secret,
}

/// Which way a context works.
#[derive(Clone, Copy)]
enum Direction {
    Encrypt = 1,
    Decrypt = 0,
}

/// One AWS-LC cipher context keyed for a direction, freed on drop.
struct Context(*mut EVP_CIPHER_CTX);

impl Context {
    fn new(key: &[u8], direction: Direction) -> Context {
        assert_eq!(key.len(), XTS_KEY_BYTES, "XTS-AES-256 takes 64 key bytes");
        // SAFETY: EVP_CIPHER_CTX_new has no preconditions; a null return
        // (out of memory) is checked before use.
        let ctx = unsafe { EVP_CIPHER_CTX_new() };
        assert!(!ctx.is_null(), "AWS-LC could not allocate a cipher context");
        let ctx = Context(ctx);
        // SAFETY: ctx is a fresh context, the cipher is a static table and
        // key points at the 64 bytes EVP_aes_256_xts reads; no IV yet.
        let rc = unsafe {
            EVP_CipherInit_ex(
                ctx.0,
                EVP_aes_256_xts(),
                ptr::null_mut(),
                key.as_ptr(),
                ptr::null(),
                direction as c_int,
            )
        };
        // Only two equal key halves are refused, and a data key is 64 random
        // bytes (`DataKey::generate`) or was accepted the same way before.
        assert_eq!(
            rc, 1,
            "AWS-LC refused the XTS key (its two halves are equal)"
        );
        ctx
    }

    /// Run one page through the cipher with the tweak of `page`. `input`
    /// and `output` are both one page long; they may be the same memory.
    ///
    /// # Safety
    /// `input` and `output` must each point at `UNIT` readable (writable)
    /// bytes; they may overlap only exactly.
    unsafe fn page(&self, page: u64, input: *const u8, output: *mut u8) {
        let tweak = u128::from(page).to_le_bytes();
        // SAFETY: a keyed context; a 16-byte IV; a new IV starts a new unit.
        let rc = unsafe {
            EVP_CipherInit_ex(
                self.0,
                ptr::null(),
                ptr::null_mut(),
                ptr::null(),
                tweak.as_ptr(),
                -1,
            )
        };
        assert_eq!(rc, 1, "AWS-LC refused an XTS tweak");
        let mut written: c_int = 0;
        // SAFETY: the caller's contract; UNIT (512) fits a c_int and is
        // within XTS's limits for one data unit.
        let rc = unsafe { EVP_CipherUpdate(self.0, output, &mut written, input, UNIT as c_int) };
        assert!(
            rc == 1 && written == UNIT as c_int,
            "AWS-LC failed on a whole XTS data unit"
        );
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the pointer came from EVP_CIPHER_CTX_new and is freed once;
        // freeing cleanses the key schedules.
        unsafe { EVP_CIPHER_CTX_free(self.0) };
    }
}

impl PageCipher {
    /// The cipher of `key` ([`XTS_KEY_BYTES`] bytes; the secret is kept,
    /// locked and zeroed on drop as every [`Secret`]).
    pub fn new(key: Secret) -> PageCipher {
        assert_eq!(key.len(), XTS_KEY_BYTES, "XTS-AES-256 takes 64 key bytes");
        // Fail here, at once, rather than at the first page.
        drop(Context::new(key.bytes(), Direction::Encrypt));
        PageCipher { key }
    }

    /// The key bytes.
    pub fn key(&self) -> &Secret {
        &self.key
    }

    /// Encrypt whole pages in place; `buf` starts at page `first_page`.
    pub fn encrypt_in_place(&self, first_page: u64, buf: &mut [u8]) {
        assert_eq!(buf.len() % UNIT, 0, "whole pages only");
        self.in_place(Direction::Encrypt, first_page.., buf);
    }

    /// Run the pages of `buf` through the cipher in place, page `i` with
    /// the tweak of `pages`' `i`-th number (one context for them all).
    fn in_place(&self, direction: Direction, pages: impl Iterator<Item = u64>, buf: &mut [u8]) {
        let ctx = Context::new(self.key.bytes(), direction);
        for (n, page) in pages.zip(buf.chunks_exact_mut(UNIT)) {
            let p = page.as_mut_ptr();
            // SAFETY: one page, in and out exactly the same memory.
            unsafe { ctx.page(n, p, p) };
        }
    }

    /// Encrypt whole pages of `plain` into `out` (same length), so a copy
    /// and the encryption are one pass over the bytes.
    pub fn encrypt_into(&self, first_page: u64, plain: &[u8], out: &mut [u8]) {
        assert_eq!(plain.len() % UNIT, 0, "whole pages only");
        assert_eq!(plain.len(), out.len(), "output as long as the input");
        let ctx = Context::new(self.key.bytes(), Direction::Encrypt);
        for (i, (src, dst)) in plain
            .chunks_exact(UNIT)
            .zip(out.chunks_exact_mut(UNIT))
            .enumerate()
        {
            // SAFETY: one page each, distinct slices (a & and a &mut).
            unsafe { ctx.page(first_page + i as u64, src.as_ptr(), dst.as_mut_ptr()) };
        }
    }

    /// Decrypt whole pages in place; `buf` starts at page `first_page`.
    /// All-zero pages stay zero (see [`is_hole`]).
    pub fn decrypt_in_place(&self, first_page: u64, buf: &mut [u8]) {
        assert_eq!(buf.len() % UNIT, 0, "whole pages only");
        let mut ctx = None;
        for (i, page) in buf.chunks_exact_mut(UNIT).enumerate() {
            if is_hole(page) {
                continue;
            }
            let ctx = ctx.get_or_insert_with(|| Context::new(self.key.bytes(), Direction::Decrypt));
            let p = page.as_mut_ptr();
            // SAFETY: one page, in and out exactly the same memory.
            unsafe { ctx.page(first_page + i as u64, p, p) };
        }
    }

    /// Encrypt pages that are not contiguous on the drive, in place: page
    /// `i` of `buf` is drive page `pages[i]` (the disk tier packs a chunk's
    /// held pages this way).
    pub fn encrypt_scattered(&self, pages: &[u64], buf: &mut [u8]) {
        assert_eq!(buf.len(), pages.len() * UNIT, "one page number per page");
        self.in_place(Direction::Encrypt, pages.iter().copied(), buf);
    }

    /// The reverse of [`PageCipher::encrypt_scattered`]. Every page is
    /// decrypted, all-zero ones too: these pages were encrypted here, so
    /// none is a hole.
    pub fn decrypt_scattered(&self, pages: &[u64], buf: &mut [u8]) {
        assert_eq!(buf.len(), pages.len() * UNIT, "one page number per page");
        self.in_place(Direction::Decrypt, pages.iter().copied(), buf);
    }
}

/// True for an all-zero page of ciphertext: what the service returns for a
/// page never written or cleared, never what encryption makes in practice
/// (probability 2^-4096), so it is a hole and reads as zeros.
pub fn is_hole(page: &[u8]) -> bool {
    // Word-wise: the check runs on every page of every encrypted read.
    let (head, words, tail) = {
        // SAFETY: u64 has no invalid bit patterns; align_to gives the
        // aligned middle and the unaligned ends.
        unsafe { page.align_to::<u64>() }
    };
    head.iter().all(|&b| b == 0) && words.iter().all(|&w| w == 0) && tail.iter().all(|&b| b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aes::cipher::KeyInit;
    use aes::Aes256;
    use xts_mode::{get_tweak_default, Xts128};

    fn key() -> Secret {
        let mut s = Secret::zeroed(XTS_KEY_BYTES);
        for (i, b) in s.bytes_mut().iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(37).wrapping_add(11);
        }
        s
    }

    /// RustCrypto's `xts-mode`, the reference: page number as the tweak.
    fn reference(key: &[u8], first_page: u64, buf: &mut [u8], encrypt: bool) {
        let xts = Xts128::new(
            Aes256::new_from_slice(&key[..32]).expect("32-byte AES key"),
            Aes256::new_from_slice(&key[32..]).expect("32-byte AES key"),
        );
        for (i, page) in buf.chunks_exact_mut(UNIT).enumerate() {
            let tweak = get_tweak_default(u128::from(first_page + i as u64));
            if encrypt {
                xts.encrypt_sector(page, tweak);
            } else {
                xts.decrypt_sector(page, tweak);
            }
        }
    }

    #[test]
    fn aws_lc_and_rustcrypto_xts_give_the_same_ciphertext() {
        let k = key();
        let plain: Vec<u8> = (0..8 * UNIT).map(|i| (i * 7 % 251) as u8).collect();
        let first_page = (1u64 << 33) + 5; // tweaks past 32 bits
        let cipher = PageCipher::new(Secret::copy_of(k.bytes()));
        let mut ours = plain.clone();
        cipher.encrypt_in_place(first_page, &mut ours);
        let mut theirs = plain.clone();
        reference(k.bytes(), first_page, &mut theirs, true);
        assert_eq!(ours, theirs);
        let mut into = vec![0u8; plain.len()];
        cipher.encrypt_into(first_page, &plain, &mut into);
        assert_eq!(into, theirs);
        cipher.decrypt_in_place(first_page, &mut ours);
        assert_eq!(ours, plain);
        reference(k.bytes(), first_page, &mut theirs, false);
        assert_eq!(theirs, plain);
    }

    #[test]
    fn scattered_pages_encrypt_as_they_would_in_place() {
        let cipher = PageCipher::new(key());
        let mut whole: Vec<u8> = (0..4 * UNIT).map(|i| (i % 13) as u8).collect();
        let plain = whole.clone();
        cipher.encrypt_in_place(100, &mut whole);
        // Pages 101 and 103 alone, packed.
        let mut packed = [&plain[UNIT..2 * UNIT], &plain[3 * UNIT..]].concat();
        cipher.encrypt_scattered(&[101, 103], &mut packed);
        assert_eq!(
            packed,
            [&whole[UNIT..2 * UNIT], &whole[3 * UNIT..]].concat()
        );
        cipher.decrypt_scattered(&[101, 103], &mut packed);
        assert_eq!(
            packed,
            [&plain[UNIT..2 * UNIT], &plain[3 * UNIT..]].concat()
        );
        // A zero page is data here, not a hole.
        let mut zero = vec![0u8; UNIT];
        cipher.encrypt_scattered(&[7], &mut zero);
        assert!(!is_hole(&zero));
        cipher.decrypt_scattered(&[7], &mut zero);
        assert!(zero.iter().all(|&b| b == 0));
    }

    #[test]
    fn holes_stay_zero_and_unaligned_pages_are_checked_whole() {
        let cipher = PageCipher::new(key());
        let mut buf = vec![0u8; 3 * UNIT + 1];
        // A page that starts one byte into the buffer: not 8-byte aligned.
        let pages = &mut buf[1..];
        cipher.decrypt_in_place(9, pages);
        assert!(pages.iter().all(|&b| b == 0));
        pages[UNIT + 511] = 1;
        assert!(!is_hole(&pages[UNIT..2 * UNIT]));
        assert!(is_hole(&pages[..UNIT]));
    }
}
