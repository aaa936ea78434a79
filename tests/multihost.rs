//! Many hosts against one storage account, each host its own network and
//! mount namespace with its own daemons (see `netns/mod.rs`), the account a
//! dedicated in-memory Azurite in a storage namespace reached over veths:
//!
//! - one host writes and snapshots every few seconds while three others
//!   attach the newest snapshot read-only, check every file against the
//!   manifest written before that snapshot, and move on to the next one;
//! - split brain: a host whose daemon is paused with dirty data loses the
//!   drive to a host that mounts with `--break-lease`; when it resumes, none
//!   of its writes reaches the blob, it says so in its log and keeps its
//!   dirty pages in a recovery file.
//!
//! `BLOBDRIVE_MULTIHOST_ROUNDS` sets how many snapshots the writer takes
//! (default 20, about a minute and a half on a busy 2-core machine);
//! `BLOBDRIVE_MULTIHOST_SEED` replays a run's random choices.

mod netns;
mod system;
mod workload;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use netns::{Host, Storage};
use workload::{manifest_text, parse_manifest, sha, tree, Rng};

const MANIFEST: &str = "MANIFEST";

fn rounds() -> u32 {
    std::env::var("BLOBDRIVE_MULTIHOST_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20)
}

/// Writes `data` to `path` (creating its directory) without syncing.
fn write_file(path: &Path, data: &[u8]) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("mkdir");
    }
    std::fs::write(path, data).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// One round of the writer on `root` (its view of the mounted drive): new
/// files, a few rewrites, renames and deletes of older ones; `files` is the
/// model it keeps of the tree.
fn writer_round(root: &Path, round: u32, rng: &mut Rng, files: &mut BTreeMap<String, String>) {
    for i in 0..16 {
        let name = format!("r{round:03}/f{i:02}.bin");
        let len = match rng.range(0, 4) {
            0 => rng.range(0, 512),
            1 => rng.range(512, 16 << 10),
            _ => rng.range(16 << 10, 256 << 10),
        } as usize;
        let data = rng.bytes(len);
        write_file(&root.join(&name), &data);
        files.insert(name, sha(&data));
    }
    let older: Vec<String> = files
        .keys()
        .filter(|k| !k.starts_with(&format!("r{round:03}/")))
        .cloned()
        .collect();
    for name in older {
        match rng.range(0, 10) {
            0 => {
                std::fs::remove_file(root.join(&name)).expect("delete");
                files.remove(&name);
            }
            1 => {
                let len = rng.range(1, 64 << 10) as usize;
                let data = rng.bytes(len);
                write_file(&root.join(&name), &data);
                files.insert(name, sha(&data));
            }
            2 => {
                let to = format!("{name}.m{round}");
                std::fs::rename(root.join(&name), root.join(&to)).expect("rename");
                let sum = files.remove(&name).expect("in the model");
                files.insert(to, sum);
            }
            _ => {}
        }
    }
    let manifest = manifest_text(files);
    write_file(&root.join("MANIFEST.tmp"), manifest.as_bytes());
    std::fs::rename(root.join("MANIFEST.tmp"), root.join(MANIFEST)).expect("rename manifest");
}

/// What the readers share with the writer: the snapshots taken so far and
/// whether the writer is done.
#[derive(Default)]
struct Published {
    snapshots: Mutex<Vec<String>>,
    done: AtomicBool,
}

/// Checks the tree at `root` against its manifest; the differences, if any.
fn check_snapshot(root: &Path) -> Result<usize, String> {
    let manifest = std::fs::read_to_string(root.join(MANIFEST))
        .map_err(|e| format!("cannot read the manifest: {e}"))?;
    let want = parse_manifest(&manifest);
    let got = tree(root, &[MANIFEST]).map_err(|e| format!("cannot read the tree: {e}"))?;
    if want == got {
        return Ok(got.len());
    }
    let mut diffs = Vec::new();
    for (path, sum) in &want {
        match got.get(path) {
            None => diffs.push(format!("{path} missing")),
            Some(s) if s != sum => diffs.push(format!("{path} differs")),
            _ => {}
        }
    }
    for path in got.keys().filter(|p| !want.contains_key(*p)) {
        diffs.push(format!("{path} not in the manifest"));
    }
    Err(diffs.join(", "))
}

/// A reader host: attaches the newest snapshot, checks it, unmounts, and
/// again until the writer is done and the last snapshot was checked.
/// Returns the snapshots checked.
fn reader(host: &Host, drive: &str, published: &Published) -> Result<Vec<String>, String> {
    let mut checked: Vec<String> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let done = published.done.load(Ordering::Acquire);
        let newest = published.snapshots.lock().unwrap().last().cloned();
        let Some(snapshot) = newest.filter(|s| checked.last() != Some(s)) else {
            if done {
                return Ok(checked);
            }
            if Instant::now() > deadline {
                return Err(format!("{}: the writer never finished", host.name));
            }
            std::thread::sleep(Duration::from_millis(200));
            continue;
        };
        let dir = host.mount(drive, "snap", &["--snapshot", &snapshot]);
        let result = check_snapshot(&host.view(&dir));
        host.unmount(&dir);
        match result {
            Ok(files) => {
                println!("{}: snapshot {snapshot}: {files} files match", host.name);
                checked.push(snapshot);
            }
            Err(diffs) => {
                return Err(format!(
                    "{}: snapshot {snapshot} does not match its manifest: {diffs}",
                    host.name
                ))
            }
        }
    }
}

#[test]
fn readers_on_three_hosts_see_each_snapshot_exactly_as_its_manifest_says() {
    let test = "readers_on_three_hosts_see_each_snapshot_exactly_as_its_manifest_says";
    if !netns::can_run(test) {
        return;
    }
    let mut storage = Storage::start();
    let writer = storage.host("writer");
    let readers: Vec<Host> = (1..=3)
        .map(|i| storage.host(&format!("reader{i}")))
        .collect();
    let drive = "hosts/shared.vhd";
    writer.ok(&["create", drive, "--size", "64M", "--mkfs", "ext4"]);
    let dir = writer.mount(drive, "live", &[]);
    let live = writer.view(&dir);

    let published = Arc::new(Published::default());
    let mut rng = Rng::from_env("BLOBDRIVE_MULTIHOST_SEED");
    let rounds = rounds();
    let results = std::thread::scope(|scope| {
        let handles: Vec<_> = readers
            .iter()
            .map(|host| {
                let published = published.clone();
                scope.spawn(move || reader(host, drive, &published))
            })
            .collect();
        let mut files = BTreeMap::new();
        let writing = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for round in 0..rounds {
                writer_round(&live, round, &mut rng, &mut files);
                let snapshot = writer.ok(&["snapshot", drive]);
                println!(
                    "writer: round {round}: snapshot {snapshot}, {} files",
                    files.len()
                );
                published.snapshots.lock().unwrap().push(snapshot);
                std::thread::sleep(Duration::from_secs(2));
            }
        }));
        published.done.store(true, Ordering::Release);
        let results: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a reader panicked".into())))
            .collect();
        if let Err(panic) = writing {
            std::panic::resume_unwind(panic);
        }
        results
    });
    let last = published.snapshots.lock().unwrap().last().cloned();
    for result in results {
        let checked = result.unwrap_or_else(|e| panic!("{e}\nazurite: {}", storage.log_text()));
        assert_eq!(
            checked.last(),
            last.as_ref(),
            "a reader did not check the last snapshot"
        );
    }
    writer.unmount(&dir);
}

/// Writes `data` to `path` and pushes it to the device (`sync_file_range`:
/// written back and waited for, but no cache flush: the drive holds it dirty).
fn write_back_without_flush(path: &Path, data: &[u8]) {
    use std::io::Write as _;
    use std::os::fd::AsRawFd as _;
    let mut file = std::fs::File::create(path).expect("create");
    file.write_all(data).expect("write");
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: a valid open descriptor; offsets 0, 0 mean the whole file.
    let rc = unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, flags) };
    assert_eq!(
        rc,
        0,
        "sync_file_range: {}",
        std::io::Error::last_os_error()
    );
}

/// Writes `data` to `path` and fsyncs it.
fn write_durably(path: &Path, data: &[u8]) {
    use std::io::Write as _;
    let mut file = std::fs::File::create(path).expect("create");
    file.write_all(data).expect("write");
    file.sync_all().expect("fsync");
}

/// Dirty bytes the daemon at `dir` holds, from `blobdrive stats`.
fn dirty_bytes(host: &Host, dir: &Path) -> u64 {
    let out = host.ok(&["stats", &dir.to_string_lossy(), "--json"]);
    let stats: serde_json::Value = serde_json::from_str(&out).expect("stats JSON");
    stats["devices"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(_, c)| c["dirty_bytes"].as_u64())
        .sum()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn send_signal(pid: i32, signal: i32) {
    // SAFETY: plain syscall on a daemon this test started.
    unsafe {
        libc::kill(pid, signal);
    }
}

#[test]
fn a_paused_host_that_lost_its_drive_writes_nothing_after_the_takeover_and_keeps_its_pages() {
    let test =
        "a_paused_host_that_lost_its_drive_writes_nothing_after_the_takeover_and_keeps_its_pages";
    if !netns::can_run(test) {
        return;
    }
    let t = Instant::now();
    let lap = |what: &str| println!("{what} at {:?}", t.elapsed());
    let mut storage = Storage::start();
    let a = storage.host("a");
    let b = storage.host("b");
    let drive = "hosts/contested.vhd";
    a.ok(&["create", drive, "--size", "64M", "--mkfs", "ext4"]);
    // A long flush delay and journal commit interval: what A writes stays
    // dirty in its daemon until something asks for a flush.
    let a_dir = a.mount(drive, "a", &["--flush-delay", "10m", "-o", "commit=600"]);
    let mut rng = Rng::from_env("BLOBDRIVE_MULTIHOST_SEED");
    let base = rng.bytes(300_000);
    write_durably(&a.view(&a_dir).join("base.bin"), &base);

    // A's marker: random bytes no other writer produces.
    let token = rng.bytes(32);
    let marker: Vec<u8> = token.iter().copied().cycle().take(1 << 20).collect();
    write_back_without_flush(&a.view(&a_dir).join("marker.bin"), &marker);
    let dirty = dirty_bytes(&a, &a_dir);
    assert!(
        dirty >= marker.len() as u64,
        "A's daemon holds {dirty} dirty bytes, not the {} just written",
        marker.len()
    );
    let a_pid = a.daemon_pid(&a_dir);
    send_signal(a_pid, libc::SIGSTOP);
    lap("A paused with dirty data");

    // B takes the drive over while A is paused, and writes durably.
    let b_dir = b.mount(drive, "b", &["--break-lease"]);
    let b_data = rng.bytes(2 << 20);
    let b_view = b.view(&b_dir);
    assert_eq!(
        workload::sha_file(&b_view.join("base.bin")).expect("base.bin on B"),
        sha(&base),
        "B does not see what A had fsynced"
    );
    write_durably(&b_view.join("b.bin"), &b_data);
    lap("B took over and wrote");

    // A resumes and is asked to flush (its filesystem syncs): the blob
    // refuses its lease.
    send_signal(a_pid, libc::SIGCONT);
    let a_dir_s = a_dir.to_string_lossy().to_string();
    let mut sync = a.command("sync", &["-f", &a_dir_s]);
    let _ = netns::run_with_timeout(&mut sync, Duration::from_secs(60));
    let a_log = a.log_path("a");
    let log = || std::fs::read_to_string(&a_log).unwrap_or_default();
    system::wait_for("A to log the lost lease", Duration::from_secs(30), || {
        log().contains("lease lost")
    });
    system::wait_for(
        "A to save its pages in a recovery file",
        Duration::from_secs(30),
        || !a.recovery_files().is_empty(),
    );
    lap("A lost its lease and saved its pages");
    let files = a.recovery_files();
    assert_eq!(files.len(), 1, "one recovery file: {files:?}");
    let saved = std::fs::read(&files[0]).expect("read the recovery file");
    assert!(
        contains(&saved, &token),
        "A's recovery file does not hold its unflushed marker"
    );
    assert!(
        log().contains("SAVED TO A RECOVERY FILE"),
        "A's log does not name the recovery file: {}",
        log()
    );

    // B goes on writing after A's attempts, then unmounts cleanly.
    let b_more = rng.bytes(500_000);
    write_durably(&b_view.join("b-after.bin"), &b_more);
    b.unmount(&b_dir);
    lap("B unmounted");

    // The recovery file is refused without --force: the blob changed.
    let file_s = files[0].to_string_lossy().to_string();
    let recover = a.blobdrive(&["recover", &file_s]);
    assert!(
        !recover.status.success(),
        "recover applied A's stale pages over B's data"
    );

    // A's unmount fails, names the same file and leaves no second one.
    let unmount = a.blobdrive(&["unmount", &a_dir_s]);
    assert!(
        !unmount.status.success(),
        "A's unmount said its data is durable"
    );
    let said = String::from_utf8_lossy(&unmount.stderr);
    assert!(
        said.contains(&file_s),
        "A's unmount does not name {file_s}: {said}"
    );
    assert_eq!(a.recovery_files(), files, "a second recovery file appeared");
    lap("A unmounted");

    // What the blob holds: B's files intact, none of A's marker.
    assert_b_left_the_blob(
        &b,
        drive,
        &token,
        &[
            ("base.bin", &base),
            ("b.bin", &b_data),
            ("b-after.bin", &b_more),
        ],
    );
}

/// The takeover of an attach whose lease another host broke and wrote
/// under: A's serving process dies while A cannot reach storage, B breaks
/// the lease, writes and unmounts; when A's network comes back, A's holder
/// must not take the lease again and replay its write log over B's data:
/// the log goes to a recovery file, which `recover` refuses to apply.
#[test]
fn a_takeover_after_another_host_broke_the_lease_and_wrote_saves_the_log_instead_of_replaying_it() {
    if !netns::can_run("multihost_fenced_takeover") {
        return;
    }
    let mut storage = Storage::start();
    let a = storage.host("a");
    let b = storage.host("b");
    let drive = "hosts/fenced.vhd";
    a.ok(&["create", drive, "--size", "64M", "--mkfs", "ext4"]);
    let a_dir = a.mount(drive, "a", &["--flush-delay", "10m", "-o", "commit=600"]);
    let mut rng = Rng::from_env("BLOBDRIVE_MULTIHOST_SEED");
    let base = rng.bytes(200_000);
    write_durably(&a.view(&a_dir).join("base.bin"), &base);
    // A's marker: acknowledged, in A's write log only.
    let token = rng.bytes(32);
    let marker: Vec<u8> = token.iter().copied().cycle().take(1 << 20).collect();
    write_back_without_flush(&a.view(&a_dir).join("marker.bin"), &marker);
    assert!(dirty_bytes(&a, &a_dir) >= marker.len() as u64);

    // A's link goes down, then its serving process dies: its holder's
    // takeovers fail (no storage) and are tried again.
    let link = |state: &str| {
        let status = a
            .command("ip", &["link", "set", "eth0", state])
            .status()
            .unwrap();
        assert!(status.success(), "ip link set eth0 {state}");
    };
    let serving = a.stats(&a_dir)["pid"].as_i64().expect("the serving pid") as i32;
    link("down");
    send_signal(serving, libc::SIGKILL);

    // B breaks the lease, writes durably and unmounts.
    let b_dir = b.mount(drive, "b", &["--break-lease"]);
    let b_data = rng.bytes(1 << 20);
    write_durably(&b.view(&b_dir).join("b.bin"), &b_data);
    b.unmount(&b_dir);

    // A's network comes back: its next takeover is refused and the log is
    // saved, never replayed.
    link("up");
    let a_log = a.log_path("a");
    let log = || std::fs::read_to_string(&a_log).unwrap_or_default();
    system::wait_for(
        "A's holder to save its log in a recovery file",
        Duration::from_secs(180),
        || !a.recovery_files().is_empty(),
    );
    assert!(
        log().contains("another blobdrive host wrote"),
        "A's log names what changed: {}",
        log()
    );
    let files = a.recovery_files();
    assert_eq!(files.len(), 1, "{files:?}");
    let saved = std::fs::read(&files[0]).expect("read the recovery file");
    assert!(contains(&saved, &token), "A's log went to the file");
    let file_s = files[0].to_string_lossy().to_string();
    let recover = a.blobdrive(&["recover", &file_s]);
    assert!(
        !recover.status.success(),
        "recover applied A's stale pages over B's data"
    );

    // The blob holds B's filesystem, intact, and none of A's marker.
    assert_b_left_the_blob(
        &b,
        drive,
        &token,
        &[("base.bin", &base), ("b.bin", &b_data)],
    );
}

/// The drive as host `b` left it: downloaded, none of host A's `token`
/// anywhere in it, its ext4 clean, and each of `files` intact.
fn assert_b_left_the_blob(b: &Host, drive: &str, token: &[u8], files: &[(&str, &Vec<u8>)]) {
    let image = b.root.path().join("image.raw");
    b.ok(&["download", drive, &image.to_string_lossy(), "--raw"]);
    let bytes = std::fs::read(&image).expect("read the image");
    assert!(
        !contains(&bytes, token),
        "A's marker reached the blob after B took the drive over"
    );
    drop(bytes);
    let fsck =
        system::run_quietly("e2fsck", &["-fn", &image.to_string_lossy()]).expect("run e2fsck");
    assert!(
        fsck.status.success(),
        "the filesystem B left is not clean: {}",
        String::from_utf8_lossy(&fsck.stdout)
    );
    let device = system::LoopDevice::attach_read_only(&image);
    let check: PathBuf = b.root.path().join("check");
    let mounted = system::BlockMount::mount_with(&device.device, &check, "ro,noload");
    for (name, data) in files {
        assert_eq!(
            workload::sha_file(&mounted.path(name)).unwrap_or_default(),
            sha(data),
            "{name} is not intact in the blob"
        );
    }
    mounted.unmount();
    device.detach();
}
