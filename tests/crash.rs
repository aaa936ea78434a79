//! Crashes under a real filesystem: attach a drive, run a metadata-heavy
//! workload in it (untar a tree of a couple of thousand small files, rename
//! and delete them, create files and fsync them), `kill -9` the daemon at a
//! random moment, break the lease and attach again. Each round checks what a
//! user relies on after a crash: the journal replays, the filesystem checker
//! finds nothing to fix (`e2fsck -fn` for ext4, `xfs_repair -n` for xfs, after
//! a clean unmount, on the drive file of a read-only namespace mount), and every file whose fsync
//! (and its directory's) returned before the kill reads back intact.
//!
//! The drive lives in a dedicated Azurite, reached from a host namespace (see
//! `netns/mod.rs`), which also cleans up after a failure.
//!
//! `BLOBDRIVE_CRASH_ROUNDS` sets the rounds per filesystem (default 20);
//! `BLOBDRIVE_CRASH_SEED` replays a run's kill moments and file choices.

mod netns;
mod system;
mod workload;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use netns::Storage;
use workload::{sha, sha_file, Rng};

fn rounds() -> u32 {
    std::env::var("BLOBDRIVE_CRASH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20)
}

/// A tarball of `dirs` directories of `files` small files each, made once
/// per test in `dir` with the real `tar`.
fn make_tree_tarball(dir: &Path, rng: &mut Rng, dirs: u32, files: u32) -> PathBuf {
    let tree = dir.join("tree");
    for d in 0..dirs {
        let sub = tree.join(format!("d{d:02}"));
        std::fs::create_dir_all(&sub).expect("mkdir");
        for f in 0..files {
            let len = rng.range(0, 3000) as usize;
            std::fs::write(sub.join(format!("f{f:03}.txt")), rng.bytes(len)).expect("write");
        }
    }
    let tarball = dir.join("tree.tar");
    system::run(
        "tar",
        &[
            "-cf",
            &tarball.to_string_lossy(),
            "-C",
            &tree.to_string_lossy(),
            ".",
        ],
    );
    tarball
}

fn fsync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Creates `path` with `data` and fsyncs it and its directory.
fn write_durably(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::File::create(path)?;
    file.write_all(data)?;
    file.sync_all()?;
    fsync_dir(path.parent().expect("a file in a directory"))
}

/// The workload of one round in `root` (the mounted filesystem): remove the
/// tree of the round before, untar a new one, then rename, delete and write-and-fsync files until an error (the
/// daemon was killed) or `budget` runs out. Files whose fsyncs returned go
/// into `durable`; they are never touched again.
fn workload(
    root: &Path,
    round: u32,
    tarball: &Path,
    rng: &mut Rng,
    budget: Duration,
    durable: &mut BTreeMap<String, String>,
) -> std::io::Result<()> {
    let start = Instant::now();
    // The trees of the rounds before (a kill may have left one half
    // removed) go: thousands of unlinks.
    for entry in std::fs::read_dir(root)? {
        let path = entry?.path();
        if path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('t'))
        {
            std::fs::remove_dir_all(path)?;
        }
    }
    let tree = root.join(format!("t{round:03}"));
    std::fs::create_dir(&tree)?;
    let tar = Command::new("tar")
        .args([
            "-xf",
            &tarball.to_string_lossy(),
            "-C",
            &tree.to_string_lossy(),
        ])
        .output()?;
    if !tar.status.success() {
        return Err(std::io::Error::other("tar failed"));
    }
    let mut k = 0u32;
    while start.elapsed() < budget {
        // A few durable files.
        for _ in 0..rng.range(1, 4) {
            let name = format!("durable/r{round:03}-k{k:04}.bin");
            k += 1;
            let len = rng.range(1, 12_000) as usize;
            let data = rng.bytes(len);
            write_durably(&root.join(&name), &data)?;
            durable.insert(name, sha(&data));
        }
        // Metadata churn in the untarred tree.
        let d = tree.join(format!("d{:02}", rng.range(0, 40)));
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        let names: Vec<PathBuf> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
        for path in names {
            match rng.range(0, 4) {
                0 => std::fs::remove_file(&path)?,
                1 => std::fs::rename(&path, path.with_extension("moved"))?,
                2 => {
                    let mut f = std::fs::OpenOptions::new().append(true).open(&path)?;
                    f.write_all(&rng.bytes(200))?;
                }
                _ => {}
            }
        }
        if rng.chance(30) {
            fsync_dir(&d)?;
        }
    }
    Ok(())
}

/// Every durable file reads back with the content its fsync made durable.
fn check_durable(root: &Path, durable: &BTreeMap<String, String>) {
    for (name, sum) in durable {
        let got = sha_file(&root.join(name))
            .unwrap_or_else(|e| panic!("{name}, fsynced before the crash, is unreadable: {e}"));
        assert_eq!(&got, sum, "{name}, fsynced before the crash, changed");
    }
}

fn crash_rounds(test: &str, fs: &str, size: &str) {
    if !netns::can_run(test) {
        return;
    }
    let checker = if fs == "ext4" { "e2fsck" } else { "xfs_repair" };
    assert!(
        blobdrive::attach::tool_exists(checker),
        "{checker} is not installed (scripts/setup.sh installs it)"
    );
    // A dedicated Azurite: the loop's thousands of requests neither wait
    // behind nor slow down the other tests' shared one.
    let mut storage = Storage::start();
    let host = storage.host(fs);
    let container = "crash";
    let drive = format!("{container}/crash.vhd");
    host.ok(&["create", &drive, "--size", size, "--mkfs", fs]);
    // The drive as a plain file, for the checker between rounds.
    let files = host.mount(container, "files", &["--read-only"]);
    let image = host.view(&files).join("crash.vhd");
    let mut rng = Rng::from_env("BLOBDRIVE_CRASH_SEED");
    let tarball = make_tree_tarball(&host.dir("source"), &mut rng, 40, 50);
    let mut durable = BTreeMap::new();
    let rounds = rounds();
    let mut kills_mid_workload = 0;
    for round in 0..rounds {
        let t = Instant::now();
        let lap = |what: &str| println!("round {round}: {what} at {:?}", t.elapsed());
        let dir = host.mount(&drive, "m", &[]);
        lap("mounted");
        let root = host.view(&dir);
        check_durable(&root, &durable);
        std::fs::create_dir_all(root.join("durable")).expect("mkdir durable");
        fsync_dir(&root).expect("fsync the root");
        lap("prepared");

        let kill_after = Duration::from_millis(rng.range(200, 3000));
        let mut worker_rng = Rng::new(rng.next());
        let (result, durable_after) = std::thread::scope(|scope| {
            let mut mine = durable.clone();
            let root = &root;
            let tarball = &tarball;
            let worker = scope.spawn(move || {
                let r = workload(
                    root,
                    round,
                    tarball,
                    &mut worker_rng,
                    Duration::from_secs(6),
                    &mut mine,
                );
                (r, mine)
            });
            std::thread::sleep(kill_after);
            // The whole daemon, holder too: what a host crash does to it
            // (a serving process alone is replaced; see tests/takeover.rs).
            host.kill_daemon(&dir);
            let start = Instant::now();
            while !worker.is_finished() {
                assert!(
                    start.elapsed() < Duration::from_secs(60),
                    "round {round}: the workload hangs after the daemon was killed"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            worker.join().expect("the workload panicked")
        });
        if result.is_err() {
            kills_mid_workload += 1;
        }
        durable = durable_after;
        println!(
            "round {round}: killed after {kill_after:?} ({}); {} durable files",
            match &result {
                Ok(()) => "workload had finished".to_string(),
                Err(e) => format!("workload stopped: {e}"),
            },
            durable.len()
        );
        // The dead daemon's leftovers go, and its lease is broken.
        lap("killed");
        let out = host.blobdrive(&["unmount", &dir.to_string_lossy()]);
        lap("cleaned up");
        assert!(
            !out.status.success(),
            "unmount of a killed daemon claimed success"
        );
        assert!(!host.is_mounted(&dir), "{} still mounted", dir.display());
        host.ok(&["break-lease", &drive]);
        lap("lease broken");

        // Attach again: the journal replays; fsynced files are intact.
        let dir = host.mount(&drive, "m", &[]);
        lap("attached again");
        check_durable(&host.view(&dir), &durable);
        host.unmount(&dir);
        lap("unmounted");
        system::check_filesystem(
            &image,
            fs,
            &format!("round {round}: after the crash and replay"),
        );
        lap("checked");
    }
    println!(
        "{rounds} rounds, {kills_mid_workload} killed mid-workload, {} durable files checked",
        durable.len()
    );
    assert!(
        kills_mid_workload * 2 >= rounds,
        "most kills should land while the workload runs ({kills_mid_workload} of {rounds})"
    );
}

#[test]
fn ext4_survives_kill_9_mid_workload_with_a_clean_fsck_and_every_fsynced_file() {
    crash_rounds(
        "ext4_survives_kill_9_mid_workload_with_a_clean_fsck_and_every_fsynced_file",
        "ext4",
        "64M",
    );
}

#[test]
fn xfs_survives_kill_9_mid_workload_with_a_clean_repair_check_and_every_fsynced_file() {
    crash_rounds(
        "xfs_survives_kill_9_mid_workload_with_a_clean_repair_check_and_every_fsynced_file",
        "xfs",
        "320M",
    );
}
