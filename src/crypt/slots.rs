//! Key slots: the data key of an encrypted drive, wrapped by each user key,
//! kept in the blob's metadata (so it travels with Copy Blob and snapshots).
//!
//! Metadata entries (values are printable ASCII, as the service requires):
//! - `blobdrivecrypt`: `v1 cipher=aes-xts-plain64 keybytes=64 page=512
//!   check=HEX`, where the check value is the first 16 bytes of
//!   HMAC-SHA256(data key, "blobdrive data key check"): it proves that an
//!   unwrapped key is this drive's before a page is read or written.
//! - `blobdrivekey0` .. `blobdrivekey7`: one slot each, `v1 kind=keyfile
//!   nonce=B64 wrapped=B64`, or `v1 kind=passphrase kdf=argon2id m=KIB t=N
//!   p=N salt=B64 nonce=B64 wrapped=B64`. `wrapped` is the data key sealed
//!   with AES-256-GCM under the key-encryption key (the key file's 32 bytes,
//!   or Argon2id of the passphrase with the recorded parameters); the slot's
//!   other fields are its associated data, so changing a parameter or the
//!   salt makes the slot fail to open rather than open to something else.
//!
//! A wrong key and an altered slot look the same to GCM: both are refused.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail};
use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use zeroize::Zeroize;

use super::secret::{Secret, UserKey};
use super::{DataKey, CIPHER_NAME, DATA_KEY_BYTES};
use crate::units::PAGE_SIZE;

/// Metadata name of the encryption header.
pub const HEADER_KEY: &str = "blobdrivecrypt";
/// Prefix of the slots' metadata names.
pub const SLOT_PREFIX: &str = "blobdrivekey";
/// Most key slots a drive has.
pub const MAX_SLOTS: u8 = 8;

/// Argon2id memory in KiB, passes and lanes for new passphrase slots
/// (RFC 9106's second recommended setting: 64 MiB, 3 passes, 4 lanes).
const ARGON2_M_KIB: u32 = 64 * 1024;
const ARGON2_T: u32 = 3;
const ARGON2_P: u32 = 4;
/// Upper bounds accepted when opening a slot: twice what new slots get. A
/// tampered slot must not make an unlock (in a namespace daemon serving
/// other drives too) allocate gigabytes or run for minutes; such a slot is
/// refused by name, before Argon2 runs.
const ARGON2_MAX_M_KIB: u32 = 2 * ARGON2_M_KIB;
const ARGON2_MAX_T: u32 = 2 * ARGON2_T;
const ARGON2_MAX_P: u32 = 2 * ARGON2_P;
const SALT_BYTES: usize = 16;
const CHECK_BYTES: usize = 16;

/// What protects a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SlotKind {
    /// A 32-byte key file.
    KeyFile,
    /// A passphrase (Argon2id).
    Passphrase,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Argon2Params {
    m_kib: u32,
    t: u32,
    p: u32,
    salt: Vec<u8>,
}

impl Argon2Params {
    /// Why these parameters are not run: more memory, passes or lanes than
    /// the caps allow (`None` when they are within them).
    fn over_cap(&self) -> Option<String> {
        let over = self.m_kib > ARGON2_MAX_M_KIB || self.t > ARGON2_MAX_T || self.p > ARGON2_MAX_P;
        over.then(|| {
            format!(
                "its Argon2 parameters (memory {} KiB, {} passes, {} lanes) exceed what this \
                 version runs (at most {ARGON2_MAX_M_KIB} KiB, {ARGON2_MAX_T} passes, \
                 {ARGON2_MAX_P} lanes): the slot was altered, or written by a newer blobdrive",
                self.m_kib, self.t, self.p
            )
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Slot {
    kdf: Option<Argon2Params>,
    nonce: [u8; NONCE_LEN],
    wrapped: Vec<u8>,
}

impl Slot {
    fn kind(&self) -> SlotKind {
        if self.kdf.is_some() {
            SlotKind::Passphrase
        } else {
            SlotKind::KeyFile
        }
    }

    /// The fields GCM authenticates (everything but nonce and ciphertext).
    fn aad(&self) -> String {
        match &self.kdf {
            None => "v1 kind=keyfile".to_string(),
            Some(a) => format!(
                "v1 kind=passphrase kdf=argon2id m={} t={} p={} salt={}",
                a.m_kib,
                a.t,
                a.p,
                B64.encode(&a.salt)
            ),
        }
    }

    fn encode(&self) -> String {
        format!(
            "{} nonce={} wrapped={}",
            self.aad(),
            B64.encode(self.nonce),
            B64.encode(&self.wrapped)
        )
    }

    fn decode(s: &str) -> anyhow::Result<Slot> {
        let mut words = s.split_whitespace();
        if words.next() != Some("v1") {
            bail!("unknown slot version");
        }
        let fields: BTreeMap<&str, &str> = words.filter_map(|w| w.split_once('=')).collect();
        let get = |k: &str| fields.get(k).copied().ok_or_else(|| anyhow!("no {k}"));
        let b64 = |k: &str| -> anyhow::Result<Vec<u8>> {
            B64.decode(get(k)?).map_err(|_| anyhow!("bad {k}"))
        };
        let num =
            |k: &str| -> anyhow::Result<u32> { get(k)?.parse().map_err(|_| anyhow!("bad {k}")) };
        let kdf = match get("kind")? {
            "keyfile" => None,
            "passphrase" => {
                if get("kdf")? != "argon2id" {
                    bail!("unknown kdf");
                }
                let a = Argon2Params {
                    m_kib: num("m")?,
                    t: num("t")?,
                    p: num("p")?,
                    salt: b64("salt")?,
                };
                Some(a)
            }
            _ => bail!("unknown kind"),
        };
        let nonce: [u8; NONCE_LEN] = b64("nonce")?
            .try_into()
            .map_err(|_| anyhow!("bad nonce length"))?;
        let wrapped = b64("wrapped")?;
        if wrapped.len() != DATA_KEY_BYTES + AES_256_GCM.tag_len() {
            bail!("bad wrapped key length");
        }
        Ok(Slot {
            kdf,
            nonce,
            wrapped,
        })
    }

    /// The key-encryption key for `user`, or `None` when `user` is not of
    /// this slot's kind.
    /// A passphrase slot whose parameters exceed the caps is an error
    /// saying so; Argon2 does not run.
    fn kek(&self, user: &UserKey) -> anyhow::Result<Option<Secret>> {
        match (&self.kdf, user) {
            (None, UserKey::KeyFile(k)) => Ok(Some(Secret::copy_of(k.bytes()))),
            (Some(a), UserKey::Passphrase(p)) => match a.over_cap() {
                Some(why) => Err(anyhow!(why)),
                None => derive(a, p).map(Some),
            },
            _ => Ok(None),
        }
    }

    fn seal(data_key: &DataKey, user: &UserKey) -> Slot {
        let kdf = match user {
            UserKey::KeyFile(_) => None,
            UserKey::Passphrase(_) => {
                let mut salt = vec![0u8; SALT_BYTES];
                aws_lc_rs::rand::fill(&mut salt).expect("the system random source works");
                Some(Argon2Params {
                    m_kib: ARGON2_M_KIB,
                    t: ARGON2_T,
                    p: ARGON2_P,
                    salt,
                })
            }
        };
        let mut nonce = [0u8; NONCE_LEN];
        aws_lc_rs::rand::fill(&mut nonce).expect("the system random source works");
        let mut slot = Slot {
            kdf,
            nonce,
            wrapped: Vec::new(),
        };
        let kek = slot
            .kek(user)
            .expect("our own Argon2 parameters are valid")
            .expect("the slot's kind follows the user key");
        // Sealed in a secret buffer, in place: no copy of the plain data
        // key is left in freed memory (appending the tag to a Vec could
        // move it).
        let mut buf = Secret::copy_of(data_key.bytes());
        let tag = aead_key(&kek)
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(slot.aad().as_bytes()),
                buf.bytes_mut(),
            )
            .expect("sealing 64 bytes cannot fail");
        slot.wrapped = [buf.bytes(), tag.as_ref()].concat();
        slot
    }

    /// The data key, when `user` opens this slot.
    fn open(&self, user: &UserKey) -> anyhow::Result<Option<Secret>> {
        let Some(kek) = self.kek(user)? else {
            return Ok(None);
        };
        let mut buf = Secret::copy_of(&self.wrapped);
        let opened = aead_key(&kek).open_in_place(
            Nonce::assume_unique_for_key(self.nonce),
            Aad::from(self.aad().as_bytes()),
            buf.bytes_mut(),
        );
        Ok(match opened {
            Ok(plain) => Some(Secret::copy_of(plain)),
            Err(_) => None,
        })
    }
}

fn aead_key(kek: &Secret) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, kek.bytes()).expect("32-byte key"))
}

fn derive(a: &Argon2Params, pass: &Secret) -> anyhow::Result<Secret> {
    let params = argon2::Params::new(a.m_kib, a.t, a.p, Some(32))
        .map_err(|_| anyhow!("argon2 parameters out of range"))?;
    // Argon2's memory is ours, to wipe after: it is derived from the
    // passphrase (`hash_password_into` would free it as it is).
    let mut blocks = vec![argon2::Block::default(); params.block_count()];
    let argon = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
    let mut out = Secret::zeroed(32);
    let derived =
        argon.hash_password_into_with_memory(pass.bytes(), &a.salt, out.bytes_mut(), &mut blocks);
    blocks.zeroize();
    derived.map_err(|_| anyhow!("argon2 parameters out of range"))?;
    Ok(out)
}

fn check_value(data_key: &DataKey) -> [u8; CHECK_BYTES] {
    let k = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, data_key.bytes());
    let tag = aws_lc_rs::hmac::sign(&k, b"blobdrive data key check");
    let mut out = [0u8; CHECK_BYTES];
    out.copy_from_slice(&tag.as_ref()[..CHECK_BYTES]);
    out
}

/// `N` bytes from exactly `2 * N` hex digits; None for anything else. By
/// bytes, not by `str` slices: metadata read from a listing may hold any
/// Unicode, and slicing a string inside a character panics.
fn parse_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| char::from(c).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; N];
    for (b, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        *b = (digit(pair[0])? << 4) | digit(pair[1])?;
    }
    Some(out)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The encryption header and key slots of one drive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySlots {
    check: [u8; CHECK_BYTES],
    slots: BTreeMap<u8, Slot>,
}

impl KeySlots {
    /// Whether `metadata` says the drive is encrypted.
    pub fn is_encrypted(metadata: &BTreeMap<String, String>) -> bool {
        metadata.contains_key(HEADER_KEY)
    }

    /// Whether two readings of a drive's metadata name the same encryption:
    /// both plain, or both encrypted under the same data key (the same key
    /// check value; the slots may differ: adding or removing a passphrase
    /// leaves the data key as it is). A malformed reading matches nothing.
    pub fn same_data_key(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> bool {
        match (Self::from_metadata(a), Self::from_metadata(b)) {
            (Ok(None), Ok(None)) => true,
            (Ok(Some(x)), Ok(Some(y))) => x.check == y.check,
            _ => false,
        }
    }

    /// The slots recorded in `metadata`; `Ok(None)` for a drive that is not
    /// encrypted. A malformed header or slot is an error naming it.
    pub fn from_metadata(metadata: &BTreeMap<String, String>) -> anyhow::Result<Option<KeySlots>> {
        let Some(header) = metadata.get(HEADER_KEY) else {
            return Ok(None);
        };
        let bad = || anyhow!("its encryption header (metadata {HEADER_KEY}) is malformed");
        let mut words = header.split_whitespace();
        if words.next() != Some("v1") {
            return Err(bad());
        }
        let fields: BTreeMap<&str, &str> = words.filter_map(|w| w.split_once('=')).collect();
        let page = PAGE_SIZE.to_string();
        let bytes = DATA_KEY_BYTES.to_string();
        if fields.get("cipher") != Some(&CIPHER_NAME)
            || fields.get("keybytes") != Some(&bytes.as_str())
            || fields.get("page") != Some(&page.as_str())
        {
            bail!("it is encrypted with a cipher this version does not know ({header})");
        }
        let check = fields
            .get("check")
            .and_then(|h| parse_hex::<CHECK_BYTES>(h))
            .ok_or_else(bad)?;
        let mut slots = BTreeMap::new();
        for (name, value) in metadata {
            let Some(n) = name.strip_prefix(SLOT_PREFIX) else {
                continue;
            };
            // Only the canonical digits: `blobdrivekey01` would otherwise be
            // slot 1 too, and one of the two silently dropped.
            let index: u8 = n
                .parse()
                .ok()
                .filter(|i: &u8| *i < MAX_SLOTS && n == i.to_string())
                .ok_or_else(|| anyhow!("metadata {name} is not a key slot this version knows"))?;
            let slot = Slot::decode(value)
                .map_err(|e| anyhow!("its key slot {index} is malformed ({e})"))?;
            slots.insert(index, slot);
        }
        Ok(Some(KeySlots { check, slots }))
    }

    /// The header and one slot (0) for a new drive.
    pub fn new(data_key: &DataKey, user: &UserKey) -> KeySlots {
        let mut slots = BTreeMap::new();
        slots.insert(0, Slot::seal(data_key, user));
        KeySlots {
            check: check_value(data_key),
            slots,
        }
    }

    /// Open the data key with `user`: the first slot it opens whose key
    /// matches the check value. Returns the key and that slot's index.
    pub fn unlock(&self, user: &UserKey) -> anyhow::Result<(DataKey, u8)> {
        let want = match user {
            UserKey::KeyFile(_) => SlotKind::KeyFile,
            UserKey::Passphrase(_) => SlotKind::Passphrase,
        };
        if !self.slots.values().any(|s| s.kind() == want) {
            bail!(
                "it has no {} slot (its slots: {})",
                kind_name(want),
                self.describe()
            );
        }
        // A slot refused for its parameters does not stop the others from
        // being tried; it is named when none opens.
        let mut refused = None;
        for (&i, slot) in &self.slots {
            let raw = match slot.open(user) {
                Ok(Some(raw)) => raw,
                Ok(None) => continue,
                Err(e) => {
                    refused.get_or_insert(format!("key slot {i} was not tried: {e}"));
                    continue;
                }
            };
            if raw.len() != DATA_KEY_BYTES {
                continue;
            }
            let key = DataKey::from_secret(raw);
            if check_value(&key) == self.check {
                return Ok((key, i));
            }
        }
        if let Some(why) = refused {
            bail!("{why}; no other slot opens with this {}", kind_name(want));
        }
        bail!(
            "the {} does not open it (wrong key, or its key slots were altered)",
            kind_name(want)
        )
    }

    /// Whether `key` is this drive's data key (its check value matches).
    pub fn matches(&self, key: &DataKey) -> bool {
        check_value(key) == self.check
    }

    /// Add a slot for `user`; returns its index.
    pub fn add(&mut self, data_key: &DataKey, user: &UserKey) -> anyhow::Result<u8> {
        let Some(index) = (0..MAX_SLOTS).find(|i| !self.slots.contains_key(i)) else {
            bail!("all {MAX_SLOTS} key slots are in use; remove one first");
        };
        self.slots.insert(index, Slot::seal(data_key, user));
        Ok(index)
    }

    /// Replace slot `index` with one for `user`.
    pub fn replace(&mut self, index: u8, data_key: &DataKey, user: &UserKey) {
        self.slots.insert(index, Slot::seal(data_key, user));
    }

    /// Remove slot `index`; the last slot is never removed (the data would
    /// be lost for good).
    pub fn remove(&mut self, index: u8) -> anyhow::Result<()> {
        if self.slots.len() <= 1 {
            bail!("that is its last key slot: without it the data could never be read again; add another key first");
        }
        self.slots.remove(&index);
        Ok(())
    }

    /// Indices and kinds of the slots in use.
    pub fn list(&self) -> Vec<(u8, SlotKind)> {
        self.slots.iter().map(|(&i, s)| (i, s.kind())).collect()
    }

    fn describe(&self) -> String {
        let v: Vec<String> = self
            .list()
            .iter()
            .map(|(i, k)| format!("{i} {}", kind_name(*k)))
            .collect();
        if v.is_empty() {
            "none".into()
        } else {
            v.join(", ")
        }
    }

    /// Write the header and slots into `metadata`, replacing any there.
    pub fn apply_to(&self, metadata: &mut BTreeMap<String, String>) {
        metadata.retain(|k, _| k != HEADER_KEY && !k.starts_with(SLOT_PREFIX));
        metadata.insert(
            HEADER_KEY.into(),
            format!(
                "v1 cipher={CIPHER_NAME} keybytes={DATA_KEY_BYTES} page={PAGE_SIZE} check={}",
                hex(&self.check)
            ),
        );
        for (i, s) in &self.slots {
            metadata.insert(format!("{SLOT_PREFIX}{i}"), s.encode());
        }
    }
}

fn kind_name(k: SlotKind) -> &'static str {
    match k {
        SlotKind::KeyFile => "key file",
        SlotKind::Passphrase => "passphrase",
    }
}

/// The data key as lower-case hex and a newline (for `key dump`), written
/// straight into a secret buffer: no other copy exists.
pub fn key_hex(key: &DataKey) -> Secret {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let bytes = key.bytes();
    let mut out = Secret::zeroed(2 * bytes.len() + 1);
    let buf = out.bytes_mut();
    for (i, b) in bytes.iter().enumerate() {
        buf[2 * i] = DIGITS[usize::from(b >> 4)];
        buf[2 * i + 1] = DIGITS[usize::from(b & 0xf)];
    }
    buf[2 * bytes.len()] = b'\n';
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_file(b: u8) -> UserKey {
        UserKey::KeyFile(Secret::copy_of(&[b; 32]))
    }

    fn round_trip(s: &KeySlots) -> KeySlots {
        let mut md = BTreeMap::new();
        md.insert("other".to_string(), "kept".to_string());
        s.apply_to(&mut md);
        assert_eq!(md.get("other").map(String::as_str), Some("kept"));
        KeySlots::from_metadata(&md).unwrap().unwrap()
    }

    #[test]
    fn two_readings_match_only_under_the_same_data_key() {
        let dk = DataKey::generate();
        let mut s = KeySlots::new(&dk, &key_file(1));
        let plain = BTreeMap::from([("other".to_string(), "x".to_string())]);
        let mut before = plain.clone();
        s.apply_to(&mut before);
        assert!(KeySlots::same_data_key(&plain, &plain));
        assert!(KeySlots::same_data_key(&before, &before));
        // A passphrase added in between: the same data key.
        s.add(&dk, &key_file(2)).unwrap();
        let mut more = plain.clone();
        s.apply_to(&mut more);
        assert!(KeySlots::same_data_key(&before, &more));
        // Encrypted since, no longer encrypted, or re-created with a new key.
        assert!(!KeySlots::same_data_key(&plain, &before));
        assert!(!KeySlots::same_data_key(&before, &plain));
        let mut other = plain.clone();
        KeySlots::new(&DataKey::generate(), &key_file(1)).apply_to(&mut other);
        assert!(!KeySlots::same_data_key(&before, &other));
    }

    #[test]
    fn slots_open_with_their_key_only() {
        let dk = DataKey::generate();
        let mut s = KeySlots::new(&dk, &key_file(1));
        let pass = UserKey::Passphrase(Secret::copy_of(b"correct horse"));
        assert_eq!(s.add(&dk, &pass).unwrap(), 1);
        let s = round_trip(&s);
        let (k, i) = s.unlock(&key_file(1)).unwrap();
        assert_eq!((k.bytes(), i), (dk.bytes(), 0));
        let (k, i) = s.unlock(&pass).unwrap();
        assert_eq!((k.bytes(), i), (dk.bytes(), 1));
        let e = s.unlock(&key_file(2)).unwrap_err().to_string();
        assert!(e.contains("does not open"), "{e}");
        let wrong = UserKey::Passphrase(Secret::copy_of(b"wrong"));
        assert!(s.unlock(&wrong).is_err());
    }

    #[test]
    fn altered_slot_or_header_is_refused() {
        let dk = DataKey::generate();
        let s = KeySlots::new(&dk, &key_file(1));
        let mut md = BTreeMap::new();
        s.apply_to(&mut md);
        // Another valid-looking key wrapped under the same key file: the
        // check value refuses it.
        let other = KeySlots::new(&DataKey::generate(), &key_file(1));
        let mut md2 = md.clone();
        let mut omd = BTreeMap::new();
        other.apply_to(&mut omd);
        md2.insert("blobdrivekey0".into(), omd["blobdrivekey0"].clone());
        let s2 = KeySlots::from_metadata(&md2).unwrap().unwrap();
        assert!(s2.unlock(&key_file(1)).is_err());
        // A garbled slot is named.
        md.insert("blobdrivekey0".into(), "v1 kind=keyfile nonce=x".into());
        let e = KeySlots::from_metadata(&md).unwrap_err().to_string();
        assert!(e.contains("key slot 0 is malformed"), "{e}");
    }

    #[test]
    fn a_slot_name_with_a_leading_zero_is_not_a_second_name_for_a_slot() {
        // `blobdrivekey01` beside `blobdrivekey1` would both be slot 1, one
        // silently dropped and deleted by the next rewrite.
        let dk = DataKey::generate();
        let mut md = BTreeMap::new();
        KeySlots::new(&dk, &key_file(1)).apply_to(&mut md);
        let slot = md["blobdrivekey0"].clone();
        for name in ["blobdrivekey00", "blobdrivekey+1", "blobdrivekey 1"] {
            let mut m = md.clone();
            m.insert(name.into(), slot.clone());
            let e = KeySlots::from_metadata(&m).unwrap_err().to_string();
            assert!(
                e.contains("not a key slot this version knows"),
                "{name}: {e}"
            );
        }
    }

    #[test]
    fn a_slot_asking_for_more_argon2_than_the_caps_is_refused_by_name_and_others_still_open() {
        let dk = DataKey::generate();
        let pass = UserKey::Passphrase(Secret::copy_of(b"correct horse"));
        let mut s = KeySlots::new(&dk, &pass);
        s.add(&dk, &pass).unwrap();
        let mut md = BTreeMap::new();
        s.apply_to(&mut md);
        // Slot 0 altered to ask for 4 GiB: refused before Argon2 runs
        // (which would take seconds and 4 GiB), slot 1 opens.
        let tampered = md["blobdrivekey0"].replace("m=65536", "m=4194304");
        md.insert("blobdrivekey0".into(), tampered);
        let s = KeySlots::from_metadata(&md).unwrap().unwrap();
        let started = std::time::Instant::now();
        let (k, i) = s.unlock(&pass).unwrap();
        assert_eq!((k.bytes(), i), (dk.bytes(), 1));
        assert!(started.elapsed() < std::time::Duration::from_secs(30));
        // With slot 1 gone, the line says why slot 0 was not tried.
        md.remove("blobdrivekey1");
        let s = KeySlots::from_metadata(&md).unwrap().unwrap();
        let e = s.unlock(&pass).unwrap_err().to_string();
        assert!(
            e.contains("key slot 0 was not tried") && e.contains("memory 4194304 KiB"),
            "{e}"
        );
        for (field, value) in [("t=3", "t=7"), ("p=4", "p=9")] {
            let mut one = BTreeMap::new();
            KeySlots::new(&dk, &pass).apply_to(&mut one);
            let slot = one["blobdrivekey0"].replace(field, value);
            one.insert("blobdrivekey0".into(), slot);
            let s = KeySlots::from_metadata(&one).unwrap().unwrap();
            let e = s.unlock(&pass).unwrap_err().to_string();
            assert!(e.contains("exceed what this version runs"), "{e}");
        }
    }

    #[test]
    fn key_hex_is_the_key_in_lower_case_hex_and_a_newline() {
        let mut raw = Secret::zeroed(DATA_KEY_BYTES);
        for (i, b) in raw.bytes_mut().iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(37);
        }
        let key = DataKey::from_secret(raw);
        let want = format!("{}\n", hex(key.bytes()));
        assert_eq!(key_hex(&key).bytes(), want.as_bytes());
    }

    #[test]
    fn a_check_value_of_non_ascii_characters_is_malformed_not_a_panic() {
        // 32 bytes, as a check value is, but "€" is three bytes: cutting the
        // text in pairs of bytes fell inside a character and panicked.
        let dk = DataKey::generate();
        let mut md = BTreeMap::new();
        KeySlots::new(&dk, &key_file(1)).apply_to(&mut md);
        let good = md[HEADER_KEY].clone();
        for check in [
            "a€€€€€€€€€€b",
            "+f00112233445566778899aabbccddee",
            "0x112233445566778899aabbccddeeff",
        ] {
            let (head, _) = good.rsplit_once("check=").unwrap();
            md.insert(HEADER_KEY.into(), format!("{head}check={check}"));
            let e = KeySlots::from_metadata(&md).unwrap_err().to_string();
            assert!(e.contains("is malformed"), "{check}: {e}");
        }
        md.insert(HEADER_KEY.into(), good);
        assert!(KeySlots::from_metadata(&md).unwrap().unwrap().matches(&dk));
    }

    #[test]
    fn the_last_slot_stays() {
        let dk = DataKey::generate();
        let mut s = KeySlots::new(&dk, &key_file(1));
        assert!(s.remove(0).is_err());
        s.add(&dk, &key_file(2)).unwrap();
        s.remove(0).unwrap();
        assert_eq!(s.list(), vec![(1, SlotKind::KeyFile)]);
    }
}
