//! File workloads shared by the many-hosts and crash tests: a small seeded
//! random generator (a failing run prints its seed; set it again to replay
//! the same choices), file contents and their SHA-256, and tree listings;
//! and the fsx-style exerciser of the fault and encryption tests (`fsx`).
#![allow(dead_code)]

pub mod fsx;

use std::collections::BTreeMap;
use std::path::Path;

use sha2::{Digest, Sha256};

/// xorshift64*: plenty for choosing sizes, names and moments.
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed` (0 is replaced: xorshift needs a bit set).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    /// The seed of `$NAME` if set, else a fresh one; printed either way so a
    /// failure can be replayed.
    pub fn from_env(name: &str) -> Rng {
        let seed = std::env::var(name)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| uuid::Uuid::new_v4().as_u64_pair().0);
        println!("{name}={seed}");
        Rng::new(seed)
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `[low, high)`.
    pub fn range(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low).max(1)
    }

    /// True with probability `percent` in 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.range(0, 100) < percent
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            out.extend_from_slice(&self.next().to_le_bytes());
        }
        out.truncate(len);
        out
    }
}

/// SHA-256 of `data`, in hex.
pub fn sha(data: &[u8]) -> String {
    format!("{:x}", Sha256::digest(data))
}

/// SHA-256 of the file at `path`, in hex.
pub fn sha_file(path: &Path) -> std::io::Result<String> {
    Ok(sha(&std::fs::read(path)?))
}

/// Every regular file under `dir` (relative path → SHA-256), leaving out
/// `lost+found` and the names in `skip`.
pub fn tree(dir: &Path, skip: &[&str]) -> std::io::Result<BTreeMap<String, String>> {
    fn walk(
        base: &Path,
        dir: &Path,
        skip: &[&str],
        out: &mut BTreeMap<String, String>,
    ) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            let rel = path
                .strip_prefix(base)
                .expect("walked below base")
                .to_string_lossy()
                .to_string();
            if rel == "lost+found" || skip.contains(&rel.as_str()) {
                continue;
            }
            if path.is_dir() {
                walk(base, &path, skip, out)?;
            } else {
                out.insert(rel, sha_file(&path)?);
            }
        }
        Ok(())
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, skip, &mut out)?;
    Ok(out)
}

/// A manifest: one `SHA256  PATH` line per file, sorted by path.
pub fn manifest_text(files: &BTreeMap<String, String>) -> String {
    files
        .iter()
        .map(|(path, sum)| format!("{sum}  {path}\n"))
        .collect()
}

/// Parses [`manifest_text`].
pub fn parse_manifest(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once("  "))
        .map(|(sum, path)| (path.to_string(), sum.to_string()))
        .collect()
}
