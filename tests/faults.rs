//! Reliability under faults, through the real binary against the real
//! emulator: injected 503s and connection resets (a fault proxy between
//! blobdrive and Azurite), a lease broken by another client while mounted,
//! storage unreachable at unmount, and kill -9 of the daemon mid-stream.
//! What must hold: every acknowledged write reaches the blob, and data that
//! cannot be flushed lands in a recovery file that `blobdrive recover` applies.
//! Byte checks read the blob directly from Azurite (never through the proxy or
//! the mount).
//!
//! Tests that need FUSE print `SKIPPED: ...` where it is missing (a failure
//! under `BLOBDRIVE_REQUIRE_FUSE=1`).

mod common;
mod mount_support;
mod system;
mod workload;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blobdrive::blob::{BlobClient, BlobPath};
use blobdrive::units::ByteRange;
use common::fault_proxy::{Fault, FaultProxy, Rates};
use common::{make_drive, ContainerGuard};
use mount_support::*;
use sha2::{Digest, Sha256};
use workload::fsx::{Exerciser, Mix, Target};

const MIB: u64 = 1024 * 1024;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("tokio runtime")
}

/// The blob's bytes `[start, end)`, read directly from Azurite.
async fn blob_bytes(client: &BlobClient, path: &BlobPath, start: u64, end: u64) -> Vec<u8> {
    client
        .get_blob_range(path, ByteRange::new(start, end))
        .await
        .expect("read the blob")
        .to_vec()
}

/// A connection string whose blob endpoint is `proxy`.
fn via_proxy(proxy: &FaultProxy) -> String {
    let mut account = common::account();
    account.endpoint = proxy.endpoint.clone();
    account.connection_string()
}

/// `n` bytes of a pattern unique to `tag`.
fn pattern(tag: u64, n: usize) -> Vec<u8> {
    let mut state = tag.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// The recovery files in `dir`.
fn recovery_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "bdrec"))
        .collect()
}

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn lease_broken_while_mounted_fails_writes_and_recover_applies_the_dirty_pages() {
    if !can_run("lease_broken_while_mounted", false) {
        return;
    }
    let rt = runtime();
    let guard = rt.block_on(ContainerGuard::new("faults-lease"));
    let path = guard.path("d.vhd");
    rt.block_on(make_drive(&guard.client, &path, 16 * MIB));
    let sandbox = Sandbox::new(common::connection_string());
    let mount = sandbox.mount("ns", Some(&guard.name), &[]);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(mount.path("d.vhd"))
        .expect("open the drive file");
    let durable = pattern(1, MIB as usize);
    file.write_all_at(&durable, 0).unwrap();
    file.sync_all().expect("fsync before the break");

    rt.block_on(guard.client.break_lease(&path, Some(0)))
        .expect("another client breaks the lease");
    let dirty = pattern(2, MIB as usize);
    // The kernel may take this write into its cache; the fsync that follows
    // must fail, and so must later writes.
    let _ = file.write_all_at(&dirty, 2 * MIB);
    let err = file.sync_all().expect_err("fsync after the lease is lost");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let err = file
        .write_all_at(&pattern(3, 4096), 8 * MIB)
        .and_then(|()| file.sync_all())
        .expect_err("writes after the lease is lost");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    drop(file);

    let out = mount.try_unmount();
    let stderr = stderr_of(&out);
    assert!(!out.status.success(), "unmount must fail: {stderr}");
    assert!(
        stderr.contains("blobdrive recover") && stderr.contains(".bdrec"),
        "unmount names the recovery file: {stderr}\nlog: {}",
        mount.log_text()
    );
    assert!(
        mount.log_text().contains("RECOVERY FILE"),
        "the daemon logs it loudly"
    );
    let files = recovery_files(&sandbox.recovery_dir());
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(
        rt.block_on(blob_bytes(&guard.client, &path, 2 * MIB, 3 * MIB)),
        vec![0u8; MIB as usize],
        "nothing reached the blob without the lease"
    );

    // Whoever broke the lease writes to the drive: recover refuses to put
    // older pages over that, until forced.
    let theirs = pattern(13, 4096);
    rt.block_on(
        guard
            .client
            .put_pages(&path, 8 * MIB, bytes::Bytes::from(theirs.clone()), None),
    )
    .unwrap();
    let file_s = files[0].to_string_lossy().to_string();
    let out = sandbox.blobdrive(&["recover", &file_s]);
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("changed since") && stderr.contains("--force"),
        "{stderr}"
    );
    assert!(files[0].exists(), "a refused file is kept");
    let out = sandbox.blobdrive_ok(&["recover", &file_s, "--force"]);
    assert!(out.contains("recovered"), "{out}");
    assert_eq!(
        rt.block_on(blob_bytes(&guard.client, &path, 8 * MIB, 8 * MIB + 4096)),
        theirs,
        "pages the file does not hold are left alone"
    );
    assert!(!files[0].exists(), "recover removes the file on success");
    assert_eq!(
        rt.block_on(blob_bytes(&guard.client, &path, 2 * MIB, 3 * MIB)),
        dirty,
        "the dirty pages are in the blob"
    );
    assert_eq!(
        rt.block_on(blob_bytes(&guard.client, &path, 0, MIB)),
        durable
    );
}

#[test]
fn recover_refuses_a_damaged_file_and_a_resized_blob() {
    let rt = runtime();
    let guard = rt.block_on(ContainerGuard::new("faults-refuse"));
    let path = guard.path("r.vhd");
    rt.block_on(make_drive(&guard.client, &path, 4 * MIB));
    let sandbox = Sandbox::new(common::connection_string());
    let header = blobdrive::recovery::Header {
        account: common::account().name.clone(),
        target: path.to_string(),
        blob_size_bytes: 8 * MIB + 512,
        reason: "test".into(),
        saved_at: String::new(),
        records: 0,
        data_bytes: 4096,
        blob_etag: None,
        // Saved as the blob is now, so only the size stands in the way.
        lineage: Some(blobdrive::recovery::LineageRecord {
            lease_id: "3f1c0c7e-1111-4222-8333-444455556666".into(),
            mark: blobdrive::blob::Mark {
                epoch: None,
                etag: rt
                    .block_on(guard.client.get_properties(&path))
                    .unwrap()
                    .etag,
            },
        }),
    };
    let runs = vec![(0u64, bytes::Bytes::from(pattern(9, 4096)))];
    let dir = sandbox.recovery_dir();
    let file = blobdrive::recovery::write_file(&dir, header, &runs, &[]).unwrap();
    let file_s = file.to_string_lossy().to_string();
    let out = sandbox.blobdrive(&["recover", &file_s]);
    let stderr = stderr_of(&out);
    assert!(!out.status.success());
    assert!(stderr.contains("refusing to apply it"), "{stderr}");
    assert!(file.exists(), "a refused file is kept");

    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() - 200;
    bytes[at] ^= 0x40;
    std::fs::write(&file, &bytes).unwrap();
    let out = sandbox.blobdrive(&["recover", &file_s]);
    let stderr = stderr_of(&out);
    assert!(!out.status.success());
    assert!(stderr.contains("checksum mismatch"), "{stderr}");
    assert_eq!(
        rt.block_on(blob_bytes(&guard.client, &path, 0, 4096)),
        vec![0u8; 4096],
        "nothing applied"
    );
}

#[test]
fn storage_unreachable_at_unmount_saves_a_recovery_file() {
    if !can_run("storage_unreachable_at_unmount", false) {
        return;
    }
    let rt = runtime();
    let guard = rt.block_on(ContainerGuard::new("faults-cut"));
    let path = guard.path("u.vhd");
    rt.block_on(make_drive(&guard.client, &path, 16 * MIB));
    let upstream = common::account().endpoint.clone();
    let proxy = rt.block_on(FaultProxy::start(&upstream, Fault::ServerBusy, 0));
    let sandbox = Sandbox::new(via_proxy(&proxy)).with_env("BLOBDRIVE_RETRY_TOTAL_SECS", "4");
    let mount = sandbox.mount("ns", Some(&guard.name), &[]);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(mount.path("u.vhd"))
        .expect("open the drive file");
    let durable = pattern(11, MIB as usize);
    file.write_all_at(&durable, 0).unwrap();
    file.sync_all().expect("fsync while storage is up");
    let dirty = pattern(12, MIB as usize);
    file.write_all_at(&dirty, 4 * MIB).unwrap();
    proxy.cut();
    drop(file);

    let started = Instant::now();
    let out = mount.try_unmount();
    let stderr = stderr_of(&out);
    assert!(!out.status.success(), "unmount must fail: {stderr}");
    assert!(
        stderr.contains("blobdrive recover") && stderr.contains(".bdrec"),
        "unmount names the recovery file: {stderr}\nlog: {}",
        mount.log_text()
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "bounded by the retry budget"
    );
    let files = recovery_files(&sandbox.recovery_dir());
    assert_eq!(files.len(), 1, "{files:?}");

    // The dead mount still holds the lease: recover needs --break-lease.
    let direct = Sandbox::new(common::connection_string());
    let file_s = files[0].to_string_lossy().to_string();
    let out = direct.blobdrive(&["recover", &file_s]);
    assert!(!out.status.success(), "lease still held");
    assert!(
        stderr_of(&out).contains("break-lease"),
        "{}",
        stderr_of(&out)
    );
    direct.blobdrive_ok(&["recover", &file_s, "--break-lease"]);
    assert_eq!(
        rt.block_on(blob_bytes(&guard.client, &path, 4 * MIB, 5 * MIB)),
        dirty
    );
    assert_eq!(
        rt.block_on(blob_bytes(&guard.client, &path, 0, MIB)),
        durable
    );
}

#[test]
fn fio_verify_passes_under_injected_503s_and_resets_and_the_blob_matches() {
    if !can_run("fio_verify_under_faults", false) {
        return;
    }
    if Command::new("fio").arg("--version").output().is_err() {
        println!("SKIPPED: fio is not installed");
        assert!(
            std::env::var_os(REQUIRE_ENV).is_none(),
            "fio is required under {REQUIRE_ENV}"
        );
        return;
    }
    let seed: u64 = std::env::var("BLOBDRIVE_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("fault seed {seed} (BLOBDRIVE_FAULT_SEED={seed} reproduces the draws)");
    let rt = runtime();
    let guard = rt.block_on(ContainerGuard::new("faults-fio"));
    let path = guard.path("f.vhd");
    let size = 64 * MIB;
    rt.block_on(make_drive(&guard.client, &path, size));
    let upstream = common::account().endpoint.clone();
    let proxy = rt.block_on(FaultProxy::start_random(
        &upstream,
        Rates::issue_default(),
        seed,
    ));
    let sandbox = Sandbox::new(via_proxy(&proxy));
    let fio = |file: &Path, verify_only: bool| {
        let file = file.to_string_lossy().to_string();
        let mut args = vec![
            "--name=faults".to_string(),
            format!("--filename={file}"),
            "--rw=randwrite".into(),
            "--bs=64k".into(),
            "--size=48M".into(),
            "--ioengine=psync".into(),
            "--direct=1".into(),
            "--verify=crc32c".into(),
            "--verify_fatal=1".into(),
            "--randrepeat=1".into(),
            "--randseed=7".into(),
            "--fsync_on_close=1".into(),
            // No verify state file in the working directory.
            "--verify_state_save=0".into(),
        ];
        if verify_only {
            args.push("--verify_only=1".into());
        }
        let out = Command::new("fio").args(&args).output().expect("run fio");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "fio failed: {text}");
        assert!(!text.contains("verify: bad"), "fio verify error: {text}");
    };
    let mount = sandbox.mount("ns", Some(&guard.name), &[]);
    fio(&mount.path("f.vhd"), false);
    let seen_hash = {
        let bytes = std::fs::read(mount.path("f.vhd")).expect("read the drive file");
        Sha256::digest(&bytes).to_vec()
    };
    let retries_first: u64 = sandbox.stats(&mount.dir)["devices"]
        .as_object()
        .map(|d| d.values().filter_map(|v| v["retries"].as_u64()).sum())
        .unwrap_or(0);
    mount.unmount();

    // Again after a remount: every block read back from the blob, through faults.
    let mount = sandbox.mount("ns2", Some(&guard.name), &[]);
    fio(&mount.path("f.vhd"), true);
    mount.unmount();

    let blob = rt.block_on(blob_bytes(&guard.client, &path, 0, size));
    assert_eq!(
        Sha256::digest(&blob).to_vec(),
        seen_hash,
        "the blob (read directly) matches the drive file"
    );
    let t = proxy.tally();
    println!(
        "requests {} through the proxy: {} ServerBusy, {} resets mid-request, {} mid-response, \
         {} delayed; daemon retries (first mount stats): {retries_first}",
        t.seen, t.busy, t.reset_request, t.reset_response, t.delayed
    );
    assert!(
        t.busy > 0 && t.reset_request + t.reset_response > 0,
        "{t:?}"
    );
}

#[test]
fn kill_9_keeps_every_fsynced_byte_and_the_lease_refuses_a_new_writer() {
    if !can_run("kill_9_mid_stream", false) {
        return;
    }
    let rt = runtime();
    let guard = rt.block_on(ContainerGuard::new("faults-kill"));
    let path = guard.path("k.vhd");
    let chunk = 256 * 1024usize;
    let chunks = 128u64;
    rt.block_on(make_drive(&guard.client, &path, chunks * chunk as u64));
    let sandbox = Sandbox::new(common::connection_string());
    let mount = sandbox.mount("ns", Some(&guard.name), &[]);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(mount.path("k.vhd"))
        .expect("open the drive file");
    let acked = Arc::new(AtomicU64::new(0));
    let acked2 = acked.clone();
    let writer = std::thread::spawn(move || {
        for i in 0..chunks {
            if file
                .write_all_at(&pattern(100 + i, chunk), i * chunk as u64)
                .is_err()
                || file.sync_data().is_err()
            {
                return;
            }
            acked2.store(i + 1, Ordering::SeqCst);
        }
    });
    wait_for("20 acknowledged chunks", Duration::from_secs(60), || {
        acked.load(Ordering::SeqCst) >= 20
    });
    send_signal(mount.pid, libc::SIGKILL);
    let acked_at_kill = acked.load(Ordering::SeqCst);
    let dir = mount.dir.to_string_lossy().to_string();
    let _ = Command::new("umount").args(["-l", &dir]).output();
    writer.join().expect("writer thread");
    let acked = acked.load(Ordering::SeqCst);
    println!("{acked_at_kill} chunks acknowledged at the kill, {acked} in all");
    for i in 0..acked {
        let got = rt.block_on(blob_bytes(
            &guard.client,
            &path,
            i * chunk as u64,
            (i + 1) * chunk as u64,
        ));
        assert!(
            got == pattern(100 + i, chunk),
            "chunk {i} acknowledged but not in the blob"
        );
    }

    // The dead daemon's lease is still there: a new writer is refused.
    let mount2 = sandbox.mount("ns2", Some(&guard.name), &[]);
    let err = OpenOptions::new()
        .write(true)
        .open(mount2.path("k.vhd"))
        .expect_err("a writable open while the lease is held");
    assert_eq!(err.raw_os_error(), Some(libc::EBUSY), "{err}");
    sandbox.blobdrive_ok(&["break-lease", &path.to_string()]);
    let file = OpenOptions::new()
        .write(true)
        .open(mount2.path("k.vhd"))
        .expect("writable open after break-lease");
    drop(file);
    mount2.unmount();
    drop(mount);
}

/// An fsx-style run: `ops` (`BLOBDRIVE_FSX_OPS`, default 100,000) random
/// reads (47%), writes (40%), punch holes (10%), fsyncs (2.97%) and remounts
/// (0.03%) of a drive file against a `Vec<u8>` model; `BLOBDRIVE_FSX_SEED`
/// replays a run. Every remount compares the whole drive with the model, and
/// the blob is compared at the end.
///
/// The operations go to a fresh drive every [`FSX_OPS_PER_DRIVE`]: Azurite
/// stalls (one core busy for minutes, every request timing out) on a page
/// blob fragmented by some 40,000 random Put and Clear Pages, which the
/// real service does not.
const FSX_OPS_PER_DRIVE: u64 = 20_000;

#[test]
fn random_operations_match_a_model_across_fsyncs_and_remounts() {
    if !can_run("random_operations_match_a_model", false) {
        return;
    }
    let ops: u64 = std::env::var("BLOBDRIVE_FSX_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let seed = Exerciser::seed_from_env("BLOBDRIVE_FSX_SEED");
    println!("fsx: {ops} ops, seed {seed} (BLOBDRIVE_FSX_SEED={seed} BLOBDRIVE_FSX_OPS={ops} reproduces it)");
    let rt = runtime();
    // An emulator of its own: the shared one slows down under the suite's
    // accumulated data, and 100,000 operations would time out behind it.
    let azurite = common::private_azurite::PrivateAzurite::start();
    let account = common::private_azurite::account_or_shared(&azurite);
    let guard = rt.block_on(ContainerGuard::new_in(&account, "faults-fsx"));
    let sandbox = Sandbox::new(account.connection_string());
    let size = 8 * MIB;
    let mix = Mix {
        read: 4700,
        write: 4000,
        punch: 1000,
        fsync: 297,
    };
    let mut ex = Exerciser::new(seed, size, 128 * 1024, mix);
    /// A drive file of a namespace mount; a remount is a new mount
    /// (numbered, so each has its own directory).
    struct DriveFile<'a> {
        sandbox: &'a Sandbox,
        container: &'a str,
        name: String,
        generation: u32,
        mount: Option<DaemonMount>,
    }
    impl DriveFile<'_> {
        fn mount_and_open(&mut self) -> std::fs::File {
            let mount = self.sandbox.mount(
                &format!("fsx{}", self.generation),
                Some(self.container),
                &[],
            );
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(mount.path(&self.name))
                .expect("open the drive file");
            self.mount = Some(mount);
            file
        }
        fn unmount(&mut self) {
            if let Some(m) = self.mount.take() {
                m.unmount();
            }
            self.generation += 1;
        }
    }
    impl Target for DriveFile<'_> {
        fn remount(&mut self) -> std::fs::File {
            self.unmount();
            self.mount_and_open()
        }
    }
    let mut target = DriveFile {
        sandbox: &sandbox,
        container: &guard.name,
        name: String::new(),
        generation: 0,
        mount: None,
    };
    let mut first_op = 0;
    while first_op < ops {
        let last_op = ops.min(first_op + FSX_OPS_PER_DRIVE);
        let name = format!("x{}.vhd", first_op / FSX_OPS_PER_DRIVE);
        let path = guard.path(&name);
        rt.block_on(make_drive(&guard.client, &path, size));
        ex.reset_model();
        target.name = name.clone();
        let file = target.mount_and_open();
        let file = ex.run(first_op..last_op, file, &mut target);
        drop(file);
        target.unmount();
        let blob = rt.block_on(blob_bytes(&guard.client, &path, 0, size));
        assert!(
            blob == ex.model,
            "the blob {name} differs from the model after op {last_op} (seed {seed})"
        );
        // Frees Azurite's memory of it.
        rt.block_on(guard.client.delete_blob(&path, true, None))
            .expect("delete a finished drive");
        first_op = last_op;
    }
    println!("fsx: {}", ex.summary());
    println!("fsx: seconds spent in each: {:.1?}", ex.spent);
}

/// What `kill -9` of an attach daemon leaves behind (the filesystem at DIR,
/// the loop device, the private FUSE mount), removed on drop.
struct DeadAttach {
    dir: String,
    loop_device: Option<String>,
    fuse_dir: Option<String>,
}

impl DeadAttach {
    fn clean(&mut self) {
        let quiet = |program: &str, args: &[&str]| {
            let _ = Command::new(program).args(args).output();
        };
        quiet("umount", &["-l", &self.dir]);
        if let Some(dev) = self.loop_device.take() {
            quiet("losetup", &["-d", &dev]);
        }
        if let Some(fuse) = self.fuse_dir.take() {
            quiet("umount", &["-l", &fuse]);
        }
    }
}

impl Drop for DeadAttach {
    fn drop(&mut self) {
        self.clean();
    }
}

/// The attach registry entry of `dir` in `sandbox`.
fn attach_entry(sandbox: &Sandbox, dir: &Path) -> serde_json::Value {
    let reg = sandbox.root.path().join("run").join("attach");
    std::fs::read_dir(&reg)
        .expect("attach registry")
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .find(|v| v["dir"].as_str().map(Path::new) == Some(dir))
        .expect("a registry entry for the attach")
}

#[test]
fn kill_9_of_an_attached_ext4_keeps_fsynced_files_and_e2fsck_is_clean_after_replay() {
    if !can_run("kill_9_attached_ext4", true) {
        return;
    }
    let rt = runtime();
    let guard = rt.block_on(ContainerGuard::new("faults-ext4"));
    let name = format!("{}/e.vhd", guard.name);
    let sandbox = Sandbox::new(common::connection_string());
    sandbox.blobdrive_ok(&["create", &name, "--size", "64M", "--mkfs", "ext4"]);
    let dir = sandbox.dir("fs");
    let dir_s = dir.canonicalize().unwrap().to_string_lossy().to_string();
    sandbox.blobdrive_ok(&["mount", &name, &dir_s]);
    let entry = attach_entry(&sandbox, Path::new(&dir_s));
    let mut dead = DeadAttach {
        dir: dir_s.clone(),
        loop_device: entry["loop_device"].as_str().map(String::from),
        fuse_dir: entry["fuse_dir"].as_str().map(String::from),
    };
    let pid = entry["pid"].as_i64().expect("pid in the registry") as i32;
    let holder = entry["holder_pid"]
        .as_i64()
        .expect("holder pid in the registry") as i32;
    let acked = Arc::new(AtomicU64::new(0));
    let acked2 = acked.clone();
    let base = PathBuf::from(&dir_s);
    let writer = std::thread::spawn(move || {
        for i in 0..400u64 {
            let write = || -> std::io::Result<()> {
                let f = std::fs::File::create(base.join(format!("f{i}")))?;
                f.write_all_at(&pattern(500 + i, 64 * 1024), 0)?;
                f.sync_all()?;
                std::fs::File::open(&base)?.sync_all()
            };
            if write().is_err() {
                return;
            }
            acked2.store(i + 1, Ordering::SeqCst);
        }
    });
    wait_for("10 fsynced files", Duration::from_secs(60), || {
        acked.load(Ordering::SeqCst) >= 10
    });
    // The whole daemon, as a host crash would: the holder first, or it
    // would start a serving process that takes over.
    send_signal(holder, libc::SIGKILL);
    send_signal(pid, libc::SIGKILL);

    // `unmount` removes what the dead daemon left and says what was lost.
    let out = sandbox.blobdrive(&["unmount", &dir_s]);
    assert!(!out.status.success(), "unmount after the daemon died");
    let stderr = stderr_of(&out);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("had died") && stderr.contains("removed"),
        "{stderr}"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let fuse_dir = entry["fuse_dir"].as_str().unwrap().to_string();
    for point in [&dir_s, &fuse_dir] {
        assert!(
            !mounts
                .lines()
                .any(|l| l.split(' ').nth(4) == Some(point.as_str())),
            "{point} is still mounted after unmount"
        );
    }
    let listed = sandbox.blobdrive_ok(&["list", "--mounted", "--json"]);
    assert!(!listed.contains(&dir_s), "still registered: {listed}");
    dead.clean();
    writer.join().expect("writer thread");
    let acked = acked.load(Ordering::SeqCst);
    println!("{acked} files fsynced before the kill");

    // The dead daemon's lease refuses a new writer until --break-lease.
    let dir2 = sandbox.dir("fs2").canonicalize().unwrap();
    let dir2_s = dir2.to_string_lossy().to_string();
    let out = sandbox.blobdrive(&["mount", &name, &dir2_s]);
    assert!(!out.status.success(), "mount while the lease is held");
    let stderr = stderr_of(&out);
    assert!(stderr.contains("break-lease"), "{stderr}");
    sandbox.blobdrive_ok(&["mount", &name, &dir2_s, "--break-lease"]);
    for i in 0..acked {
        let got = std::fs::read(dir2.join(format!("f{i}")))
            .unwrap_or_else(|e| panic!("file f{i} fsynced before the kill: {e}"));
        assert!(got == pattern(500 + i, 64 * 1024), "file f{i} differs");
    }
    sandbox.blobdrive_ok(&["unmount", &dir2_s]);

    // The filesystem (journal replayed by that mount) checks clean.
    let ro = sandbox.mount("ro", Some(&guard.name), &["--read-only"]);
    let out = Command::new("e2fsck")
        .args(["-fn", &ro.path("e.vhd").to_string_lossy()])
        .output()
        .expect("run e2fsck");
    assert!(
        out.status.success(),
        "e2fsck -fn: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ro.unmount();
}

#[test]
fn a_hung_backend_turns_fsync_into_eio_in_bounded_time_and_keeps_the_data() {
    if !can_run("hung_backend_gives_eio", false) {
        return;
    }
    let rt = runtime();
    let guard = rt.block_on(ContainerGuard::new("faults-hang"));
    let path = guard.path("h.vhd");
    rt.block_on(make_drive(&guard.client, &path, 16 * MIB));
    let upstream = common::account().endpoint.clone();
    let proxy = rt.block_on(FaultProxy::start(&upstream, Fault::ServerBusy, 0));
    let sandbox = Sandbox::new(via_proxy(&proxy)).with_env("BLOBDRIVE_RETRY_TOTAL_SECS", "3");
    let mount = sandbox.mount("ns", Some(&guard.name), &[]);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(mount.path("h.vhd"))
        .expect("open the drive file");
    let data = pattern(21, MIB as usize);
    proxy.hang_all(true);
    file.write_all_at(&data, 3 * MIB).unwrap();
    let started = Instant::now();
    let err = file.sync_all().expect_err("fsync while the backend hangs");
    let took = started.elapsed();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(took < Duration::from_secs(30), "EIO after {took:?}");
    println!(
        "fsync on a hung backend: EIO after {:.1} s",
        took.as_secs_f64()
    );

    // The data stayed dirty: once storage answers again, fsync makes it durable.
    proxy.hang_all(false);
    file.write_all_at(&data[..512], 3 * MIB).unwrap();
    file.sync_all().expect("fsync once storage answers");
    drop(file);
    mount.unmount();
    assert_eq!(
        rt.block_on(blob_bytes(&guard.client, &path, 3 * MIB, 4 * MIB)),
        data
    );
}

/// Storage black-holed (every request read, never answered) under a mount
/// with 256 scattered dirty runs: fsync fails within two retry budgets,
/// SIGTERM leaves a recovery file within one budget, and once storage
/// answers the file applies cleanly and the blob holds every run.
#[test]
fn a_black_holed_backend_bounds_fsync_and_sigterm_saves_a_recovery_file_at_once() {
    if !can_run("black_holed_backend", false) {
        return;
    }
    const BUDGET_SECS: u64 = 8;
    let rt = runtime();
    let guard = rt.block_on(ContainerGuard::new("faults-blackhole"));
    let path = guard.path("b.vhd");
    rt.block_on(make_drive(&guard.client, &path, 64 * MIB));
    let upstream = common::account().endpoint.clone();
    let proxy = rt.block_on(FaultProxy::start(&upstream, Fault::ServerBusy, 0));
    let sandbox = Sandbox::new(via_proxy(&proxy))
        .with_env("BLOBDRIVE_RETRY_TOTAL_SECS", &BUDGET_SECS.to_string());
    // Room for every scattered write without a writer having to flush.
    let mount = sandbox.mount("ns", Some(&guard.name), &["--cache-size", "512M"]);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(mount.path("b.vhd"))
        .expect("open the drive file");
    let run = |i: u64| pattern(100 + i, 4096);
    let at = |i: u64| i * 256 * 1024;
    proxy.hang_all(true);
    for i in 0..256 {
        file.write_all_at(&run(i), at(i)).unwrap();
    }
    let started = Instant::now();
    let err = file.sync_all().expect_err("fsync while storage hangs");
    let fsync_took = started.elapsed();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    println!(
        "black hole, 256 dirty runs, {BUDGET_SECS} s budget: fsync EIO after {:.1} s",
        fsync_took.as_secs_f64()
    );
    assert!(
        fsync_took < Duration::from_secs(2 * BUDGET_SECS),
        "fsync took {fsync_took:?}\nlog: {}",
        mount.log_text()
    );
    drop(file);

    let started = Instant::now();
    send_signal(mount.pid, libc::SIGTERM);
    let saved_after = loop {
        if !recovery_files(&sandbox.recovery_dir()).is_empty() {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(4 * BUDGET_SECS),
            "no recovery file after SIGTERM\nlog: {}",
            mount.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    println!(
        "SIGTERM -> recovery file after {:.1} s",
        saved_after.as_secs_f64()
    );
    assert!(
        saved_after < Duration::from_secs(BUDGET_SECS + 2),
        "the recovery file came {saved_after:?} after SIGTERM\nlog: {}",
        mount.log_text()
    );
    wait_for(
        "the daemon to exit",
        Duration::from_secs(4 * BUDGET_SECS),
        || !process_alive(mount.pid),
    );
    let files = recovery_files(&sandbox.recovery_dir());
    assert_eq!(files.len(), 1, "one recovery file: {files:?}");
    drop(mount);

    // Storage answers again: the file applies and every run is in the blob.
    proxy.hang_all(false);
    let direct = Sandbox::new(common::connection_string());
    let file_s = files[0].to_string_lossy().to_string();
    direct.blobdrive_ok(&["recover", &file_s, "--break-lease"]);
    for i in [0u64, 1, 77, 128, 255] {
        assert_eq!(
            rt.block_on(blob_bytes(&guard.client, &path, at(i), at(i) + 4096)),
            run(i),
            "run {i}"
        );
    }
}

/// A user error: `args` fail with `exit` and a single stderr line holding `needle`.
fn expect_error(sandbox: &Sandbox, args: &[&str], exit: i32, needle: &str) {
    let out = sandbox.blobdrive(args);
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(exit), "{args:?}: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{args:?}: one line expected: {stderr}");
    assert!(
        lines[0].starts_with("blobdrive: ") && lines[0].contains(needle),
        "{args:?}: expected '{needle}' in: {stderr}"
    );
}

#[test]
fn bad_input_gets_one_clear_line_and_a_non_zero_exit() {
    let rt = runtime();
    let guard = rt.block_on(ContainerGuard::new("faults-bad"));
    let c = guard.name.clone();
    let sandbox = Sandbox::new(common::connection_string());
    let d = format!("{c}/d.vhd");
    sandbox.blobdrive_ok(&["create", &d, "--size", "16M"]);
    let dir = sandbox.dir("m").to_string_lossy().to_string();
    let cases: Vec<(Vec<String>, i32, &str)> = vec![
        (
            vec!["create".into(), d.clone(), "--size".into(), "10Q".into()],
            2,
            "invalid size '10Q'",
        ),
        (
            vec![
                "create".into(),
                format!("{c}/e.vhd"),
                "--size".into(),
                "17.5M".into(),
            ],
            2,
            "not a whole number of MiB",
        ),
        (
            vec![
                "create".into(),
                format!("{c}/e.vhd"),
                "--size".into(),
                "8M".into(),
            ],
            2,
            "too small",
        ),
        (
            vec![
                "create".into(),
                format!("{c}/e.vhd"),
                "--size".into(),
                "9T".into(),
            ],
            2,
            "too large",
        ),
        (
            vec![
                "create".into(),
                "Bad_Name/d.vhd".into(),
                "--size".into(),
                "16M".into(),
            ],
            2,
            "invalid container name",
        ),
        (
            vec!["create".into(), c.clone(), "--size".into(), "16M".into()],
            2,
            "a blob name is missing",
        ),
        (
            vec!["create".into(), d.clone(), "--size".into(), "16M".into()],
            1,
            "never replaces a blob",
        ),
        (
            vec!["info".into(), format!("{c}/nope.vhd")],
            1,
            "does not exist",
        ),
        (
            vec!["info".into(), "no-such-container-x/x.vhd".into()],
            1,
            "container 'no-such-container-x' does not exist",
        ),
        (
            vec![
                "info".into(),
                d.clone(),
                "--snapshot".into(),
                "notatime".into(),
            ],
            1,
            "snapshot notatime",
        ),
        (
            vec!["mount".into(), format!("{c}/nope.vhd"), dir.clone()],
            1,
            "does not exist",
        ),
        (
            vec!["mount".into(), d.clone(), "/nonexistent/dir".into()],
            1,
            "does not exist",
        ),
        (
            vec![
                "mount".into(),
                d.clone(),
                dir.clone(),
                "--read-only".into(),
                "--break-lease".into(),
            ],
            2,
            "--break-lease",
        ),
        (
            vec![
                "mount".into(),
                c.clone(),
                dir.clone(),
                "--break-lease".into(),
            ],
            2,
            "applies to a drive",
        ),
        (
            vec!["unmount".into(), dir.clone()],
            1,
            "is not a blobdrive mount",
        ),
        (
            vec!["recover".into(), "/nonexistent/x.bdrec".into()],
            1,
            "x.bdrec",
        ),
        (vec!["frobnicate".into()], 2, "unrecognized subcommand"),
        (
            vec![
                "--connection-string".into(),
                "garbage".into(),
                "list".into(),
            ],
            1,
            "malformed connection string",
        ),
    ];
    for (args, exit, needle) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        expect_error(&sandbox, &args, *exit, needle);
    }
    // --new-uuid cannot look into an encrypted copy without its key.
    let key_file = sandbox.root.path().join("key");
    std::fs::write(&key_file, [7u8; 32]).expect("write a key file");
    let enc = format!("{c}/enc.vhd");
    let key_arg = key_file.to_string_lossy().into_owned();
    sandbox.blobdrive_ok(&[
        "create",
        &enc,
        "--size",
        "16M",
        "--encrypt",
        "--key-file",
        &key_arg,
    ]);
    expect_error(
        &sandbox,
        &["copy", &enc, &format!("{c}/enc-copy.vhd"), "--new-uuid"],
        1,
        "cannot change the filesystems of an encrypted drive",
    );
    let mut account = common::account();
    account.credential = blobdrive::blob::Credential::SharedKey { key: vec![0u8; 64] };
    let wrong_key = Sandbox::new(account.connection_string());
    expect_error(&wrong_key, &["info", &d], 1, "refused the credentials");

    // Blobs that are not drives.
    let client = &guard.client;
    rt.block_on(client.put_block_blob(&guard.path("notes.txt"), bytes::Bytes::from_static(b"hi")))
        .unwrap();
    rt.block_on(client.create_page_blob(&guard.path("raw.vhd"), 16 * MIB + 512))
        .unwrap();
    let footer_at = ByteRange::new(16 * MIB, 16 * MIB + 512);
    let mut footer = rt
        .block_on(client.get_blob_range(&guard.path("d.vhd"), footer_at))
        .unwrap()
        .to_vec();
    footer[40] ^= 1; // a byte the checksum covers
    rt.block_on(make_drive(client, &guard.path("bad.vhd"), 16 * MIB));
    rt.block_on(client.put_pages(&guard.path("bad.vhd"), 16 * MIB, footer.into(), None))
        .unwrap();
    for (blob, needle) in [
        ("notes.txt", "is a block blob, not a drive"),
        ("raw.vhd", "is not a drive: no VHD footer"),
        ("bad.vhd", "is not a drive: corrupted VHD footer: checksum"),
    ] {
        let name = format!("{c}/{blob}");
        expect_error(&sandbox, &["info", &name], 1, needle);
        let needle = needle.replace("is a block blob, not a drive", "is not a drive");
        expect_error(&sandbox, &["mount", &name, &dir], 1, &needle);
    }

    // Permissions: a SAS that may only read and list; an attach without root.
    let sas = common::python(PY_READ_ONLY_SAS, &[]);
    let read_only = Sandbox::new(format!(
        "BlobEndpoint={};SharedAccessSignature={sas}",
        common::azurite_url()
    ));
    let no_write = "SAS token for account 'devstoreaccount1' does not allow this operation";
    expect_error(
        &read_only,
        &["create", &format!("{c}/n.vhd"), "--size", "16M"],
        1,
        no_write,
    );
    expect_error(&read_only, &["mount", &d, &dir], 1, no_write);
    let mut as_nobody = Command::new("setpriv");
    as_nobody
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_blobdrive"))
        .args(["mount", &d, &dir]);
    let out = as_nobody.output().expect("setpriv runs (util-linux)");
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("blobdrive: attaching a drive needs root"),
        "{stderr}"
    );
}

/// An account SAS that may read and list, nothing else.
const PY_READ_ONLY_SAS: &str = r#"
import os, datetime
from azure.storage.blob import BlobServiceClient, generate_account_sas, ResourceTypes, AccountSasPermissions
s = BlobServiceClient.from_connection_string(os.environ["CS"])
print(generate_account_sas(s.account_name, s.credential.account_key,
    ResourceTypes(service=True, container=True, object=True),
    AccountSasPermissions(read=True, list=True),
    datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)))
"#;
