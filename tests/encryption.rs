//! Client-side encryption end to end: the built binary against Azurite,
//! with real FUSE, loop devices and ext4, and Python's `cryptography`
//! (AES-XTS) as the independent implementation that must read what blobdrive
//! wrote: the blob's bytes, fetched with the official SDK and decrypted with
//! the key from `key dump` (page number as the 16-byte little-endian tweak),
//! are exactly the plaintext that `download --decrypt` gives and that the
//! mount shows. Also: key slots (add, change, remove, dump), wrong or
//! missing keys refused with one line and nothing written, a snapshot
//! attached read-only with the key.

mod common;
mod system;
mod workload;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::ContainerGuard;
use rand::rngs::StdRng;
use rand::{Rng, RngCore};
use system::is_mounted;
use workload::fsx::{Exerciser, Mix, Target};

const BIN: &str = env!("CARGO_BIN_EXE_blobdrive");
const MARKER: &str = "BLOBDRIVE-KNOWN-PLAINTEXT-MARKER";

/// Decrypts a blob read with the SDK: every 512-byte page of the data area
/// with AES-XTS (tweak = page number, little-endian), holes included (an
/// all-zero page of ciphertext decrypts to noise, as it does through
/// `cryptsetup open --type plain`); the footer is dropped. Writes the
/// plaintext to argv[3] and one byte per page to argv[3] + ".holes" (1 where
/// the stored page was all zeros).
const PY_DECRYPT: &str = r#"
import os, sys
from azure.storage.blob import BlobServiceClient
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
blob = BlobServiceClient.from_connection_string(os.environ["CS"]).get_blob_client(sys.argv[1], sys.argv[2])
raw = blob.download_blob().readall()
key = bytes.fromhex(sys.argv[4])
data = raw[:-512]
out = bytearray(len(data))
holes = bytearray(len(data) // 512)
zero = bytes(512)
for i in range(0, len(data), 512):
    page = data[i:i+512]
    if page == zero:
        holes[i // 512] = 1
    d = Cipher(algorithms.AES(key), modes.XTS((i // 512).to_bytes(16, "little"))).decryptor()
    out[i:i+512] = d.update(page) + d.finalize()
open(sys.argv[3], "wb").write(out)
open(sys.argv[3] + ".holes", "wb").write(holes)
print("marker-in-ciphertext" if b"BLOBDRIVE-KNOWN-PLAINTEXT-MARKER" in raw else "clean")
"#;

/// Holds the independent decryption at `py_path` (written by [`PY_DECRYPT`])
/// against what blobdrive gives (`ours`), page by page: a page stored as
/// ciphertext decrypts to the same bytes on both sides; a hole (never
/// written, or cleared) reads as zeros in blobdrive and as noise through a
/// plain AES-XTS decryption, which is what the README tells users. Returns
/// the number of holes.
fn assert_independent_decryption(py_path: &Path, ours: &[u8]) -> usize {
    let py = std::fs::read(py_path).unwrap();
    let mut holes_path = py_path.as_os_str().to_owned();
    holes_path.push(".holes");
    let holes = std::fs::read(holes_path).unwrap();
    assert_eq!(py.len(), ours.len(), "both sides hold the whole data area");
    assert_eq!(holes.len(), py.len() / 512);
    let zero = [0u8; 512];
    for (n, (a, b)) in py.chunks(512).zip(ours.chunks(512)).enumerate() {
        if holes[n] == 1 {
            assert_eq!(b, zero, "page {n} is a hole: blobdrive reads zeros");
            assert_ne!(a, zero, "page {n} is a hole: plain AES-XTS gives noise");
        } else {
            assert!(a == b, "page {n}: independent decryption differs");
        }
    }
    holes.iter().filter(|h| **h == 1).count()
}

/// Runs the built binary in its own run directory; unmounts what it mounted.
struct Site {
    run_dir: tempfile::TempDir,
    root: tempfile::TempDir,
    mounted: std::cell::RefCell<Vec<PathBuf>>,
}

impl Site {
    fn new() -> Site {
        Site {
            run_dir: tempfile::Builder::new()
                .prefix("blobdrive-crypt-run-")
                .tempdir()
                .expect("temp dir"),
            root: tempfile::Builder::new()
                .prefix("blobdrive-crypt-")
                .tempdir()
                .expect("temp dir"),
            mounted: Default::default(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }

    fn dir(&self, name: &str) -> PathBuf {
        let d = self.path(name);
        std::fs::create_dir_all(&d).expect("mkdir");
        d
    }

    fn blobdrive(&self, args: &[&str]) -> Output {
        let out = Command::new(BIN)
            .args(args)
            .env("BLOBDRIVE_RUN_DIR", self.run_dir.path())
            .env("BLOBDRIVE_RECOVERY_DIR", common::recovery_dir())
            .env(
                "AZURE_STORAGE_CONNECTION_STRING",
                common::connection_string(),
            )
            .env_remove("NOTIFY_SOCKET")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run blobdrive");
        if args.first() == Some(&"mount") && out.status.success() {
            if let Some(dir) = args.iter().skip(1).find(|a| a.starts_with('/')) {
                self.mounted.borrow_mut().push(PathBuf::from(dir));
            }
        }
        out
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.blobdrive(args);
        assert!(
            out.status.success(),
            "blobdrive {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Runs a command that must fail with exactly one line; returns it.
    fn fails(&self, args: &[&str]) -> String {
        let out = self.blobdrive(args);
        assert!(!out.status.success(), "blobdrive {args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(err.starts_with("blobdrive: "), "{err}");
        err
    }

    fn unmount(&self, dir: &Path) {
        self.ok(&["unmount", dir.to_str().unwrap()]);
        self.mounted.borrow_mut().retain(|d| d != dir);
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        for dir in self.mounted.borrow().iter() {
            if is_mounted(dir) {
                let _ = self.blobdrive(&["unmount", dir.to_str().unwrap()]);
            }
        }
    }
}

fn write_key(path: &Path, byte: u8) {
    let key: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(31) ^ byte).collect();
    write_private(path, &key);
}

/// Writes a key or passphrase file only its owner may read (a looser one
/// is warned about).
fn write_private(path: &Path, bytes: &[u8]) {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, bytes))
        .expect("write a private file");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod 600");
}

/// The ETag of `blob`, asked on `rt`: the runtime the guard's client was
/// made on (a pooled connection belongs to its runtime; another runtime
/// would wait on it until the request times out).
fn etag(rt: &tokio::runtime::Runtime, guard: &ContainerGuard, blob: &str) -> Option<String> {
    rt.block_on(guard.client.get_properties(&guard.path(blob)))
        .expect("properties")
        .etag
}

#[test]
fn encrypted_ext4_drive_is_opaque_to_the_account_and_decrypts_with_an_independent_aes_xts() {
    if !system::can_run("encrypted ext4 drive", true) {
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let guard = rt.block_on(ContainerGuard::new("crypt"));
    let site = Site::new();
    let drive = format!("{}/secret.vhd", guard.name);
    let key = site.path("key");
    let wrong = site.path("wrong");
    write_key(&key, 1);
    write_key(&wrong, 2);
    let key_s = key.to_str().unwrap();
    let out = site.ok(&[
        "create",
        &drive,
        "--size",
        "64M",
        "--encrypt",
        "--key-file",
        key_s,
        "--mkfs",
        "ext4",
    ]);
    assert!(out.contains("encrypted"), "{out}");

    // Write through the mount: a file full of the marker, and a zero file.
    let mnt = site.dir("mnt");
    let mnt_s = mnt.to_str().unwrap();
    site.ok(&["mount", &drive, mnt_s, "--key-file", key_s]);
    let text = MARKER.repeat(4096);
    std::fs::write(mnt.join("notes.txt"), &text).unwrap();
    std::fs::write(mnt.join("zeros"), vec![0u8; 1 << 20]).unwrap();
    site.unmount(&mnt);

    // Without the key, or with a wrong one: one line, nothing mounted or
    // written (the blob's ETag stays).
    let before = etag(&rt, &guard, "secret.vhd");
    let e = site.fails(&["mount", &drive, mnt_s]);
    assert!(e.contains("is encrypted"), "{e}");
    let e = site.fails(&[
        "mount",
        &drive,
        mnt_s,
        "--key-file",
        wrong.to_str().unwrap(),
    ]);
    assert!(e.contains("does not open"), "{e}");
    assert!(!is_mounted(&mnt));
    assert_eq!(etag(&rt, &guard, "secret.vhd"), before, "nothing written");

    // The account sees ciphertext; Python's AES-XTS with the dumped key
    // decrypts it to exactly what `download --decrypt` writes.
    let hex = site.ok(&["key", "dump", &drive, "--key-file", key_s]);
    assert_eq!(hex.len(), 128, "a 512-bit key in hex");
    let py_plain = site.path("py.img");
    let verdict = common::python(
        PY_DECRYPT,
        &[&guard.name, "secret.vhd", py_plain.to_str().unwrap(), &hex],
    );
    assert_eq!(verdict, "clean", "the known plaintext is not in the blob");
    let ours = site.path("ours.img");
    site.ok(&[
        "download",
        &drive,
        ours.to_str().unwrap(),
        "--raw",
        "--decrypt",
        "--key-file",
        key_s,
    ]);
    let holes = assert_independent_decryption(&py_plain, &std::fs::read(&ours).unwrap());
    assert!(holes > 0, "a 64 MiB ext4 drive has pages never written");
    let py = std::fs::read(&py_plain).unwrap();
    assert!(
        py.windows(MARKER.len()).any(|w| w == MARKER.as_bytes()),
        "the plaintext holds the file"
    );
    // The default download is the ciphertext as stored.
    let cipher = site.path("cipher.img");
    site.ok(&["download", &drive, cipher.to_str().unwrap(), "--raw"]);
    let c = std::fs::read(&cipher).unwrap();
    assert!(!c.windows(MARKER.len()).any(|w| w == MARKER.as_bytes()));

    // Remount read-write with the key; a snapshot attaches read-only with it.
    let time = site.ok(&["snapshot", &drive]);
    site.ok(&["mount", &drive, mnt_s, "--key-file", key_s]);
    assert_eq!(
        std::fs::read_to_string(mnt.join("notes.txt")).unwrap(),
        text
    );
    let snap = site.dir("snap");
    let snap_s = snap.to_str().unwrap();
    site.ok(&[
        "mount",
        &drive,
        snap_s,
        "--snapshot",
        &time,
        "--key-file",
        key_s,
    ]);
    assert_eq!(
        std::fs::read_to_string(snap.join("notes.txt")).unwrap(),
        text
    );
    assert!(std::fs::write(snap.join("new"), b"x").is_err(), "read-only");
    site.unmount(&snap);
    site.unmount(&mnt);

    // A namespace mount shows the drive as its ciphertext, read-only.
    let ns = site.dir("ns");
    site.ok(&["mount", &guard.name, ns.to_str().unwrap()]);
    let file = ns.join("secret.vhd");
    let shown = std::fs::read(&file).unwrap();
    let stored = site.path("now.img");
    site.ok(&["download", &drive, stored.to_str().unwrap(), "--raw"]);
    assert!(
        shown == std::fs::read(&stored).unwrap(),
        "the file is the ciphertext"
    );
    assert!(std::fs::OpenOptions::new().write(true).open(&file).is_err());
    site.unmount(&ns);
}

/// `create --encrypt --partition-table gpt --mkfs ext4` makes a drive whose
/// table is ciphertext in the blob: `mount` unlocks first and reads the
/// layout through the key (auto picks the ext4 partition), and `info` shows
/// the GPT with the key and says the layout is unknown without it.
#[test]
fn encrypted_gpt_drive_attaches_by_partition_and_info_shows_its_table_with_the_key() {
    if !system::can_run("encrypted gpt drive", true) {
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let guard = rt.block_on(ContainerGuard::new("cryptgpt"));
    let site = Site::new();
    let drive = format!("{}/gpt.vhd", guard.name);
    let key = site.path("key");
    write_key(&key, 3);
    let key_s = key.to_str().unwrap();
    site.ok(&[
        "create",
        &drive,
        "--size",
        "64M",
        "--encrypt",
        "--key-file",
        key_s,
        "--partition-table",
        "gpt",
        "--mkfs",
        "ext4",
    ]);

    let mnt = site.dir("mnt");
    let mnt_s = mnt.to_str().unwrap();
    site.ok(&["mount", &drive, mnt_s, "--key-file", key_s]);
    let text = MARKER.repeat(1024);
    std::fs::write(mnt.join("notes.txt"), &text).unwrap();
    site.unmount(&mnt);
    site.ok(&["mount", &drive, mnt_s, "--key-file", key_s]);
    assert_eq!(
        std::fs::read_to_string(mnt.join("notes.txt")).unwrap(),
        text
    );
    site.unmount(&mnt);

    let info: serde_json::Value =
        serde_json::from_str(&site.ok(&["info", &drive, "--json", "--key-file", key_s])).unwrap();
    let table = &info["partition_table"];
    assert_eq!(table["kind"], "gpt", "{info}");
    assert_eq!(
        table["partitions"][0]["filesystem"]["type"], "ext4",
        "{info}"
    );
    let info: serde_json::Value =
        serde_json::from_str(&site.ok(&["info", &drive, "--json"])).unwrap();
    assert!(info["partition_table"].is_null(), "{info}");
    assert!(
        info["layout_problem"]
            .as_str()
            .is_some_and(|p| p.contains("unknown without the key")),
        "{info}"
    );
    // resize checks the same layout: with the key, the GPT's backup header
    // at the end is what a shrink would cut; without it, only stored data.
    let before = etag(&rt, &guard, "gpt.vhd");
    let line = site.fails(&[
        "resize",
        &drive,
        "--size",
        "32M",
        "--allow-shrink",
        "--key-file",
        key_s,
    ]);
    assert!(line.contains("GPT's backup header"), "{line}");
    let line = site.fails(&["resize", &drive, "--size", "32M", "--allow-shrink"]);
    assert!(line.contains("without its key"), "{line}");
    assert_eq!(etag(&rt, &guard, "gpt.vhd"), before);
}

#[test]
fn key_slots_add_change_remove_and_dump_without_touching_the_data() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let guard = rt.block_on(ContainerGuard::new("cryptkeys"));
    let site = Site::new();
    let drive = format!("{}/k.vhd", guard.name);
    let (k1, k2, pass) = (site.path("k1"), site.path("k2"), site.path("pass"));
    write_key(&k1, 1);
    write_key(&k2, 2);
    write_private(&pass, b"correct horse battery staple\n");
    let (k1, k2, pass) = (
        k1.to_str().unwrap(),
        k2.to_str().unwrap(),
        pass.to_str().unwrap(),
    );

    // Bad input, each one line: missing key file, wrong length, no key.
    let e = site.fails(&[
        "create",
        &drive,
        "--size",
        "16M",
        "--encrypt",
        "--key-file",
        "/nonexistent/k",
    ]);
    assert!(e.contains("cannot read key file"), "{e}");
    let short = site.path("short");
    std::fs::write(&short, b"0123456789").unwrap();
    let e = site.fails(&[
        "create",
        &drive,
        "--size",
        "16M",
        "--encrypt",
        "--key-file",
        short.to_str().unwrap(),
    ]);
    assert!(e.contains("holds 10 bytes"), "{e}");
    assert!(!e.contains("0123456789"), "no secret in messages");
    site.fails(&["create", &drive, "--size", "16M", "--encrypt"]);
    site.fails(&["info", &drive]); // nothing was created

    site.ok(&[
        "create",
        &drive,
        "--size",
        "16M",
        "--encrypt",
        "--key-file",
        k1,
    ]);
    let data_key = site.ok(&["key", "dump", &drive, "--key-file", k1]);
    let etag_before = etag(&rt, &guard, "k.vhd");

    site.ok(&[
        "key",
        "add",
        &drive,
        "--key-file",
        k1,
        "--new-passphrase-file",
        pass,
    ]);
    assert_eq!(
        site.ok(&["key", "dump", &drive, "--passphrase-file", pass]),
        data_key
    );
    site.ok(&[
        "key",
        "change",
        &drive,
        "--passphrase-file",
        pass,
        "--new-key-file",
        k2,
    ]);
    assert_eq!(
        site.ok(&["key", "dump", &drive, "--key-file", k2]),
        data_key
    );
    let e = site.fails(&["key", "dump", &drive, "--passphrase-file", pass]);
    assert!(e.contains("no passphrase slot"), "{e}");
    site.ok(&["key", "remove", &drive, "--key-file", k1]);
    let e = site.fails(&["key", "dump", &drive, "--key-file", k1]);
    assert!(e.contains("does not open"), "{e}");
    let e = site.fails(&["key", "remove", &drive, "--key-file", k2]);
    assert!(e.contains("last key slot"), "{e}");
    assert_eq!(
        site.ok(&["key", "dump", &drive, "--key-file", k2]),
        data_key
    );
    assert_ne!(etag(&rt, &guard, "k.vhd"), None);
    let _ = etag_before;

    // A tampered slot: one line, before anything is opened.
    let path = guard.path("k.vhd");
    let mut md = rt
        .block_on(guard.client.get_properties(&path))
        .unwrap()
        .metadata;
    let slot = md
        .keys()
        .find(|k| k.starts_with("blobdrivekey"))
        .unwrap()
        .clone();
    let v = md[&slot].replace("wrapped=", "wrapped=AAAA");
    md.insert(slot, v);
    let pairs: Vec<(String, String)> = md.into_iter().collect();
    rt.block_on(guard.client.set_metadata(&path, &pairs, None))
        .unwrap();
    let e = site.fails(&["key", "dump", &drive, "--key-file", k2]);
    assert!(e.contains("malformed"), "{e}");
}

#[test]
fn upload_encrypt_of_a_plain_image_decrypts_with_an_independent_aes_xts() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let guard = rt.block_on(ContainerGuard::new("cryptup"));
    let site = Site::new();
    let drive = format!("{}/up.vhd", guard.name);
    let key = site.path("key");
    write_key(&key, 7);
    let key_s = key.to_str().unwrap();
    // A 16 MiB raw image: the marker in a few places, zeros elsewhere.
    let mut image = vec![0u8; 16 << 20];
    for at in [0usize, 4096, 5 << 20, (16 << 20) - 4096] {
        image[at..at + MARKER.len()].copy_from_slice(MARKER.as_bytes());
    }
    let img = site.path("plain.img");
    std::fs::write(&img, &image).unwrap();
    let img_s = img.to_str().unwrap();

    let e = site.fails(&[
        "upload",
        img_s,
        &drive,
        "--resume",
        "--encrypt",
        "--key-file",
        key_s,
    ]);
    assert!(e.contains("--resume"), "{e}");
    site.ok(&["upload", img_s, &drive, "--encrypt", "--key-file", key_s]);

    let hex = site.ok(&["key", "dump", &drive, "--key-file", key_s]);
    let py = site.path("py.img");
    let verdict = common::python(
        PY_DECRYPT,
        &[&guard.name, "up.vhd", py.to_str().unwrap(), &hex],
    );
    assert_eq!(verdict, "clean");
    // The image's zero pages were skipped by the upload: they are holes.
    let holes = assert_independent_decryption(&py, &image);
    assert!(holes > 0, "the image's zero pages stay holes");
    let back = site.path("back.img");
    site.ok(&[
        "download",
        &drive,
        back.to_str().unwrap(),
        "--raw",
        "--decrypt",
        "--key-file",
        key_s,
    ]);
    assert!(
        std::fs::read(&back).unwrap() == image,
        "download --decrypt is the image"
    );
}

/// `download --since T1 --snapshot T2 --decrypt` on a decrypted download of
/// T1 gives exactly the file a full `download --decrypt` of T2 gives (it
/// decrypts the changed ranges the same way), and without `--decrypt` the
/// ciphertext copy is updated to the ciphertext of T2. The writes between the
/// snapshots go through the drive's encryption (`EncryptedStore` with the
/// data key `key dump` prints), and a range is cleared.
#[test]
fn download_since_with_decrypt_equals_a_full_decrypted_download() {
    use blobdrive::crypt::{DataKey, Secret};
    use blobdrive::drive::{BlobPageStore, EncryptedStore, PageStore};
    use blobdrive::units::ByteRange;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let guard = rt.block_on(ContainerGuard::new("cryptsince"));
    let site = Site::new();
    let drive = format!("{}/inc.vhd", guard.name);
    let key = site.path("key");
    write_key(&key, 9);
    let key_s = key.to_str().unwrap();
    let mut image = vec![0u8; 16 << 20];
    rand::rng().fill_bytes(&mut image[..1 << 20]);
    rand::rng().fill_bytes(&mut image[(6 << 20)..(7 << 20)]);
    let img = site.path("plain.img");
    std::fs::write(&img, &image).unwrap();
    site.ok(&[
        "upload",
        img.to_str().unwrap(),
        &drive,
        "--encrypt",
        "--key-file",
        key_s,
    ]);
    let t1 = site.ok(&["snapshot", &drive]);
    let file = |name: &str| site.path(name).to_string_lossy().into_owned();
    let (plain, cipher) = (file("plain.vhd"), file("cipher.vhd"));
    let decrypt = ["--decrypt", "--key-file", key_s];
    let with = |args: &[&str], extra: &[&str]| {
        let mut v = args.to_vec();
        v.extend_from_slice(extra);
        site.ok(&v)
    };
    with(&["download", &drive, &plain, "--snapshot", &t1], &decrypt);
    site.ok(&["download", &drive, &cipher, "--snapshot", &t1]);

    // Writes through the drive's encryption, and a clear.
    let hex = site.ok(&["key", "dump", &drive, "--key-file", key_s]);
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let data_key = std::sync::Arc::new(DataKey::from_secret(Secret::copy_of(&bytes)));
    let store = EncryptedStore::new(
        std::sync::Arc::new(BlobPageStore::new(
            guard.client.clone(),
            guard.path("inc.vhd"),
        )),
        data_key,
    );
    let marker = |len: usize| {
        MARKER
            .as_bytes()
            .iter()
            .copied()
            .cycle()
            .take(len)
            .collect::<Vec<u8>>()
    };
    rt.block_on(async {
        store.size_bytes().await.unwrap();
        store
            .write_pages(64 << 10, marker(64 << 10).into(), None)
            .await
            .unwrap();
        store
            .write_pages(9 << 20, marker(8192).into(), None)
            .await
            .unwrap();
        store
            .clear_pages(ByteRange::new(6 << 20, (6 << 20) + (256 << 10)), None)
            .await
            .unwrap();
    });
    let t2 = site.ok(&["snapshot", &drive]);

    let since = ["--since", t1.as_str(), "--snapshot", t2.as_str()];
    let full = file("full.vhd");
    with(
        &["download", &drive, &plain],
        &[&since[..], &decrypt[..]].concat(),
    );
    with(&["download", &drive, &full, "--snapshot", &t2], &decrypt);
    let (mine, theirs) = (
        std::fs::read(&plain).unwrap(),
        std::fs::read(&full).unwrap(),
    );
    assert!(
        mine == theirs,
        "the update equals a full decrypted download of T2"
    );
    assert!(
        mine[(64 << 10)..(128 << 10)] == marker(64 << 10)[..],
        "the written range is plaintext"
    );
    // Without --decrypt: the ciphertext, as a full download gives it.
    with(&["download", &drive, &cipher], &since);
    site.ok(&["download", &drive, &full, "--snapshot", &t2, "--overwrite"]);
    assert!(
        std::fs::read(&cipher).unwrap() == std::fs::read(&full).unwrap(),
        "the ciphertext update equals a full download of T2"
    );
}

/// The one device's counter `name` in `blobdrive stats DIR --json`.
fn device_counter(site: &Site, dir: &Path, name: &str) -> u64 {
    let stats: serde_json::Value =
        serde_json::from_str(&site.ok(&["stats", dir.to_str().unwrap(), "--json"]))
            .expect("stats is JSON");
    let devices = stats["devices"].as_object().expect("stats has devices");
    let device = devices.values().next().expect("one device");
    device[name]
        .as_u64()
        .unwrap_or_else(|| panic!("stats has no counter {name}: {device}"))
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// An fsx-style exerciser over a file in ext4 on an encrypted drive, with
/// the disk tier on and a page cache smaller than the file: random reads,
/// writes (some of them a known plaintext marker), hole punches, fsyncs
/// (after which the file's pages leave the kernel's cache, so later reads
/// go down to the drive) and remounts, every read compared with a model.
/// At each remount the whole file is read back through decryption (from
/// the blob and from the disk tier); at the end the image, downloaded and
/// decrypted, holds the model's bytes in that file (`debugfs`, e2fsprogs'
/// own reader), `e2fsck -fn` is clean, and no file of the disk tier holds
/// the marker in plaintext.
#[test]
fn fsx_operations_on_ext4_over_an_encrypted_drive_with_the_disk_tier_match_a_model() {
    if !system::can_run("fsx_on_an_encrypted_drive", true) {
        return;
    }
    let ops: u64 = std::env::var("BLOBDRIVE_CRYPT_FSX_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let seed = Exerciser::seed_from_env("BLOBDRIVE_FSX_SEED");
    println!("encrypted fsx: {ops} ops, seed {seed} (BLOBDRIVE_FSX_SEED={seed} BLOBDRIVE_CRYPT_FSX_OPS={ops} reproduces it)");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let guard = rt.block_on(ContainerGuard::new("crypt-fsx"));
    let site = Site::new();
    let key = site.path("key");
    write_key(&key, 7);
    let key_s = key.to_str().unwrap();
    let drive = format!("{}/fsx.vhd", guard.name);
    site.ok(&[
        "create",
        &drive,
        "--size",
        "64M",
        "--mkfs",
        "ext4",
        "--encrypt",
        "--key-file",
        key_s,
    ]);
    let mnt = site.dir("mnt");
    let cache = site.dir("tier");
    /// The exerciser's file in ext4 on the encrypted drive, mounted with a
    /// small memory cache and the disk tier.
    struct InExt4<'a> {
        site: &'a Site,
        drive: &'a str,
        mnt: &'a Path,
        key: &'a str,
        cache: &'a Path,
    }
    impl InExt4<'_> {
        fn mount(&self) {
            self.site.ok(&[
                "mount",
                self.drive,
                self.mnt.to_str().unwrap(),
                "--key-file",
                self.key,
                "--cache-dir",
                self.cache.to_str().unwrap(),
                "--cache-size",
                "4M",
            ]);
        }
    }
    impl Target for InExt4<'_> {
        fn remount(&mut self) -> std::fs::File {
            self.site.unmount(self.mnt);
            self.mount();
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(self.mnt.join("fsx"))
                .expect("open the exerciser's file")
        }
        /// Later reads come from the drive (its cache, the tier, the
        /// blob), not from ext4's page cache.
        fn after_fsync(&mut self, file: &std::fs::File) {
            use std::os::fd::AsRawFd;
            // SAFETY: a valid open fd; advice only.
            unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
        /// One write in ten is a known plaintext, looked for in the tier.
        fn fill(&mut self, rng: &mut StdRng, buf: &mut [u8]) {
            if rng.random_range(0..10) == 0 {
                for (i, b) in buf.iter_mut().enumerate() {
                    *b = MARKER.as_bytes()[i % MARKER.len()];
                }
            } else {
                rng.fill_bytes(buf);
            }
        }
    }
    let mut target = InExt4 {
        site: &site,
        drive: &drive,
        mnt: &mnt,
        key: key_s,
        cache: &cache,
    };
    let size: u64 = 12 << 20;
    target.mount();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(mnt.join("fsx"))
        .expect("create the exerciser's file");
    file.set_len(size).expect("size the file");
    let mix = Mix {
        read: 4500,
        write: 4000,
        punch: 900,
        fsync: 590,
    };
    let mut ex = Exerciser::new(seed, size, 64 * 1024, mix);
    let file = ex.run(0..ops, file, &mut target);
    drop(file);
    let model = std::mem::take(&mut ex.model);
    // A last remount: the whole file once more, now with the tier warm.
    site.unmount(&mnt);
    target.mount();
    assert!(
        std::fs::read(mnt.join("fsx")).expect("read after the last remount") == model,
        "the file differs from the model after the last remount (seed {seed})"
    );
    let disk_hits = device_counter(&site, &mnt, "disk_hits");
    site.unmount(&mnt);
    println!(
        "encrypted fsx: {}; {disk_hits} pages of the last read from the disk tier",
        ex.summary()
    );
    assert!(disk_hits > 0, "the last read used the disk tier");

    // The tier holds ciphertext only.
    let tier_files = files_under(&cache);
    let tier_bytes: u64 = tier_files
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0))
        .sum();
    assert!(tier_bytes > 0, "the disk tier kept something");
    for f in &tier_files {
        let bytes = std::fs::read(f).expect("read a tier file");
        assert!(
            !bytes.windows(MARKER.len()).any(|w| w == MARKER.as_bytes()),
            "{} holds plaintext",
            f.display()
        );
    }

    // The image, decrypted by `download --decrypt`, read by e2fsprogs.
    let image = site.path("fsx.img");
    let image_s = image.to_str().unwrap();
    site.ok(&[
        "download",
        &drive,
        image_s,
        "--decrypt",
        "--key-file",
        key_s,
    ]);
    let fsck = Command::new("e2fsck")
        .args(["-fn", image_s])
        .output()
        .expect("e2fsck");
    assert!(
        fsck.status.success(),
        "e2fsck -fn: {}",
        String::from_utf8_lossy(&fsck.stdout)
    );
    let cat = Command::new("debugfs")
        .args(["-R", "cat /fsx", image_s])
        .output()
        .expect("debugfs");
    assert!(
        cat.status.success(),
        "debugfs: {}",
        String::from_utf8_lossy(&cat.stderr)
    );
    assert!(
        cat.stdout == model,
        "the decrypted image's file differs from the model ({} bytes, seed {seed})",
        cat.stdout.len()
    );
}

/// A namespace mount given a key serves each encrypted drive that key opens
/// as its plaintext, writable like a plain drive; a drive another key
/// protects stays its ciphertext, read-only, and no write reaches it.
#[test]
fn namespace_mount_with_a_key_serves_the_drives_it_opens_decrypted_and_writable() {
    use std::os::unix::fs::FileExt;
    if !system::can_run("namespace mount with a key", false) {
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let guard = rt.block_on(ContainerGuard::new("crypt-ns"));
    let site = Site::new();
    let (key, other) = (site.path("key"), site.path("other"));
    write_key(&key, 3);
    write_key(&other, 4);
    let (key_s, other_s) = (key.to_str().unwrap(), other.to_str().unwrap());
    let mine = format!("{}/mine.vhd", guard.name);
    let theirs = format!("{}/theirs.vhd", guard.name);
    site.ok(&[
        "create",
        &mine,
        "--size",
        "16M",
        "--encrypt",
        "--key-file",
        key_s,
    ]);
    site.ok(&[
        "create",
        &theirs,
        "--size",
        "16M",
        "--encrypt",
        "--key-file",
        other_s,
    ]);
    let theirs_before = etag(&rt, &guard, "theirs.vhd");

    let ns = site.dir("ns");
    let ns_s = ns.to_str().unwrap();
    site.ok(&["mount", &guard.name, ns_s, "--key-file", key_s]);
    let data: Vec<u8> = MARKER.repeat(1 << 20 >> 5).into_bytes();
    let at = 3 << 20;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(ns.join("mine.vhd"))
        .expect("the drive the key opens is writable");
    file.write_all_at(&data, at)
        .expect("write through the mount");
    file.sync_all().expect("fsync");
    let mut back = vec![0u8; data.len()];
    file.read_exact_at(&mut back, at).expect("read back");
    assert!(back == data, "reads back the plaintext");
    drop(file);
    // The other drive: its ciphertext, read-only.
    assert!(
        std::fs::OpenOptions::new()
            .write(true)
            .open(ns.join("theirs.vhd"))
            .is_err(),
        "a drive the key does not open is read-only"
    );
    let shown = std::fs::read(ns.join("theirs.vhd")).expect("read the other drive");
    site.unmount(&ns);
    let stored = site.path("theirs.img");
    site.ok(&["download", &theirs, stored.to_str().unwrap(), "--raw"]);
    assert!(
        shown == std::fs::read(&stored).unwrap(),
        "the other drive is shown as its ciphertext"
    );
    assert_eq!(
        etag(&rt, &guard, "theirs.vhd"),
        theirs_before,
        "nothing written to it"
    );

    // In the blob: ciphertext, which decrypts to what was written.
    let raw = site.path("mine-raw.img");
    site.ok(&["download", &mine, raw.to_str().unwrap(), "--raw"]);
    let raw = std::fs::read(&raw).unwrap();
    assert!(!raw.windows(MARKER.len()).any(|w| w == MARKER.as_bytes()));
    let plain = site.path("mine.img");
    site.ok(&[
        "download",
        &mine,
        plain.to_str().unwrap(),
        "--raw",
        "--decrypt",
        "--key-file",
        key_s,
    ]);
    let plain = std::fs::read(&plain).unwrap();
    assert!(plain[at as usize..at as usize + data.len()] == data[..]);
}

/// A running command's PID whose arguments include `mount` and `dir` (the
/// daemon of that mount, once the command that started it has returned).
fn daemon_pid(dir: &Path) -> i32 {
    let dir = dir.to_string_lossy().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = raw
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).to_string())
            .collect();
        if args.first().is_some_and(|a| a.ends_with("blobdrive"))
            && args.iter().any(|a| a == "mount")
            && args.contains(&dir)
        {
            found.push(pid);
        }
    }
    // An attach runs as its holder and the serving process it forked (the
    // higher pid); the serving process holds the key in use.
    assert_eq!(
        found.len(),
        2,
        "a holder and a serving process for {dir}: {found:?}"
    );
    *found.iter().max().unwrap()
}

/// A `/proc/PID/status` field's number (`VmLck:  4 kB` gives 4).
fn status_number(pid: i32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.trim_start_matches(':').split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in {status}"))
}

/// Memory locks do not survive a fork: the daemon of an encrypted attach,
/// which got the data key unlocked by its parent, locks it again itself.
#[test]
fn the_daemon_of_an_encrypted_attach_keeps_its_data_key_locked_in_memory() {
    if !system::can_run("encrypted attach key locked", true) {
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let guard = rt.block_on(ContainerGuard::new("crypt-mlock"));
    let site = Site::new();
    let key = site.path("key");
    write_key(&key, 9);
    let key_s = key.to_str().unwrap();
    let drive = format!("{}/locked.vhd", guard.name);
    site.ok(&[
        "create",
        &drive,
        "--size",
        "32M",
        "--encrypt",
        "--key-file",
        key_s,
        "--mkfs",
        "ext4",
    ]);
    let dir = site.dir("locked");
    site.ok(&["mount", &drive, dir.to_str().unwrap(), "--key-file", key_s]);
    std::fs::write(dir.join("f"), b"data").unwrap();
    let pid = daemon_pid(&dir);
    let locked_kib = status_number(pid, "VmLck");
    site.unmount(&dir);
    assert!(
        locked_kib > 0,
        "the daemon {pid} holds the data key in memory that may be swapped (VmLck 0 kB)"
    );
}

/// Runs the built binary with at most `address_space` bytes of memory
/// (RLIMIT_AS: a regression that reads or allocates without bound fails
/// fast instead of taking the host's memory) and kills it after a minute.
fn run_bounded(site: &Site, args: &[&str], address_space: u64) -> Output {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env("BLOBDRIVE_RUN_DIR", site.run_dir.path())
        .env(
            "AZURE_STORAGE_CONNECTION_STRING",
            common::connection_string(),
        )
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe and touches no shared state.
    unsafe {
        cmd.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: address_space,
                rlim_max: address_space,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("run blobdrive");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("blobdrive {args:?} ran for over a minute");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

/// The one stderr line of a failed command.
fn failure_line(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert!(!out.status.success(), "succeeded: {err}");
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("blobdrive: "), "{err}");
    err
}

/// `--key-file /dev/zero` (or any endless file, or a pipe that never ends)
/// is refused after reading a few bytes, with one line.
#[test]
fn an_endless_key_or_passphrase_file_is_refused_after_a_bounded_read() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let guard = rt.block_on(ContainerGuard::new("crypt-zero"));
    let site = Site::new();
    let key = site.path("key");
    write_key(&key, 5);
    let drive = format!("{}/z.vhd", guard.name);
    site.ok(&[
        "create",
        &drive,
        "--size",
        "16M",
        "--encrypt",
        "--key-file",
        key.to_str().unwrap(),
    ]);
    let gib = 1 << 30;
    let out = run_bounded(
        &site,
        &["key", "dump", &drive, "--key-file", "/dev/zero"],
        gib,
    );
    let line = failure_line(&out);
    assert!(
        line.contains("key file /dev/zero holds more than 32 bytes"),
        "{line}"
    );
    let out = run_bounded(
        &site,
        &["key", "dump", &drive, "--passphrase-file", "/dev/zero"],
        gib,
    );
    let line = failure_line(&out);
    assert!(
        line.contains("passphrase file /dev/zero is longer than 1024 bytes"),
        "{line}"
    );
}

/// Like cryptsetup: a key file others may read, or that another user
/// owns, is warned about (and still used); a private one is not.
#[test]
fn a_key_file_others_can_read_or_another_user_owns_is_warned_about() {
    use std::os::unix::fs::PermissionsExt;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let guard = rt.block_on(ContainerGuard::new("crypt-perm"));
    let site = Site::new();
    let key = site.path("key");
    write_key(&key, 6);
    let key_s = key.to_str().unwrap();
    let drive = format!("{}/p.vhd", guard.name);
    let out = site.blobdrive(&[
        "create",
        &drive,
        "--size",
        "16M",
        "--encrypt",
        "--key-file",
        key_s,
    ]);
    assert!(out.status.success());
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dump = |what: &str| {
        let out = site.blobdrive(&["key", "dump", &drive, "--key-file", key_s]);
        assert!(out.status.success(), "{what}: {out:?}");
        assert_eq!(
            out.stdout.len(),
            129,
            "{what}: the key in hex and a newline"
        );
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    assert_eq!(
        dump("private"),
        "",
        "a private key file is not warned about"
    );

    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = dump("mode 0644");
    assert!(
        err.contains(&format!(
            "key file {key_s} can be read or changed by other users (mode 0644): chmod 600"
        )),
        "{err}"
    );
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&key, Some(65534), None).unwrap();
    let err = dump("owned by nobody");
    assert!(
        err.contains(&format!("key file {key_s} belongs to user 65534")),
        "{err}"
    );
}

const PASSPHRASE: &[u8] = b"a passphrase for the Argon2 test\n";

/// A passphrase slot altered to ask Argon2 for 1 GiB (which would run for
/// seconds and could have a namespace daemon serving other drives
/// OOM-killed) is refused by name, before Argon2 runs.
#[test]
fn a_key_slot_altered_to_ask_argon2_for_a_gigabyte_is_refused_without_running_it() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let guard = rt.block_on(ContainerGuard::new("crypt-argon"));
    let site = Site::new();
    let pass = site.path("pass");
    write_private(&pass, PASSPHRASE);
    let pass_s = pass.to_str().unwrap();
    let drive = format!("{}/a.vhd", guard.name);
    site.ok(&[
        "create",
        &drive,
        "--size",
        "16M",
        "--encrypt",
        "--passphrase-file",
        pass_s,
    ]);
    let path = guard.path("a.vhd");
    let mut metadata = rt
        .block_on(guard.client.get_properties(&path))
        .expect("properties")
        .metadata;
    let slot = metadata["blobdrivekey0"].clone();
    assert!(slot.contains(" m=65536 "), "{slot}");
    metadata.insert(
        "blobdrivekey0".into(),
        slot.replace(" m=65536 ", " m=1048576 "),
    );
    let pairs: Vec<(String, String)> = metadata.into_iter().collect();
    rt.block_on(guard.client.set_metadata(&path, &pairs, None))
        .expect("alter the slot");

    let out = run_bounded(
        &site,
        &["key", "dump", &drive, "--passphrase-file", pass_s],
        3 << 30,
    );
    let line = failure_line(&out);
    assert!(
        line.contains("key slot 0 was not tried")
            && line.contains("memory 1048576 KiB")
            && line.contains("exceed what this version runs"),
        "{line}"
    );
    // SAFETY: getrusage fills the struct it is given.
    let peak_kib = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage);
        usage.ru_maxrss
    };
    assert!(
        peak_kib < 512 * 1024,
        "a command of this test peaked at {peak_kib} KiB"
    );
}

/// Whether `/proc/PID/limits` says core files are off (soft and hard 0).
fn core_dumps_off(pid: i32) -> bool {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max core file size"))
        .expect("core size line");
    let words: Vec<&str> = line.split_whitespace().collect();
    words[words.len() - 3..] == ["0", "0", "bytes"]
}

/// `key change`, run as an unprivileged user, holds the drive's data key
/// while it waits for the new passphrase (a FIFO here): by then it cannot
/// be dumped (its /proc files are root's, its core size limit 0), and the
/// change completes once the passphrase comes.
#[test]
fn key_change_holding_the_data_key_cannot_be_dumped() {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    if !system::can_run("key change undumpable", false) {
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let guard = rt.block_on(ContainerGuard::new("crypt-dump"));
    let site = Site::new();
    let key = site.path("key");
    write_key(&key, 8);
    let drive = format!("{}/d.vhd", guard.name);
    let key_s = key.to_str().unwrap();
    site.ok(&[
        "create",
        &drive,
        "--size",
        "16M",
        "--encrypt",
        "--key-file",
        key_s,
    ]);
    let data_key = site.ok(&["key", "dump", &drive, "--key-file", key_s]);

    // Files the unprivileged user (nobody) can read.
    let shared = tempfile::Builder::new()
        .prefix("blobdrive-crypt-nobody-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let their_key = shared.path().join("key");
    std::fs::copy(&key, &their_key).unwrap();
    std::os::unix::fs::chown(&their_key, Some(65534), Some(65534)).unwrap();
    let fifo = shared.path().join("new-passphrase");
    system::run("mkfifo", &["-m", "0666", fifo.to_str().unwrap()]);

    let mut child = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN])
        .args(["key", "change", &drive, "--key-file"])
        .arg(&their_key)
        .arg("--new-passphrase-file")
        .arg(&fifo)
        .env(
            "AZURE_STORAGE_CONNECTION_STRING",
            common::connection_string(),
        )
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run blobdrive as nobody");
    let pid = child.id() as i32;
    // The FIFO opens for writing once blobdrive opens it to read the new
    // passphrase: it has unlocked the data key by then.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut writer = loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
        {
            Ok(w) => break w,
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {}
            Err(e) => panic!("open the FIFO: {e}"),
        }
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            panic!("key change ended first ({status}): {out:?}");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "key change never read the FIFO"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(status_number(pid, "Uid"), 65534, "runs as nobody");
    let owner = std::fs::metadata(format!("/proc/{pid}/status"))
        .unwrap()
        .uid();
    let core_off = core_dumps_off(pid);
    std::io::Write::write_all(&mut writer, PASSPHRASE).unwrap();
    drop(writer);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        owner, 0,
        "a process holding a data key is dumpable (its /proc files belong to it)"
    );
    assert!(
        core_off,
        "a process holding a data key may write a core file"
    );
    // The change went through: the new passphrase opens the same data key.
    let pass = site.path("pass");
    write_private(&pass, PASSPHRASE);
    let after = site.ok(&[
        "key",
        "dump",
        &drive,
        "--passphrase-file",
        pass.to_str().unwrap(),
    ]);
    assert_eq!(after, data_key);
}
