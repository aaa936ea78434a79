//! Split brain, searched for at random: two hosts (each its own network and
//! mount namespace, see `netns/mod.rs`) share one drive, and a seeded
//! schedule of 10 to 20 operations writes stamped blocks on both and injects
//! faults between them: fsync (NBD FLUSH), `kill -9` of the serving process
//! and of the holder, SIGSTOP and SIGCONT, the host's link down and up,
//! `break-lease` and an attach on the other host, unmount, `recover` (never
//! `--force`) of the recovery files a host's daemons left, and `upgrade`.
//!
//! Each schedule runs over one path, chosen by its seed: attaches
//! (`blobdrive mount`, the stamped blocks written with O_DIRECT to the
//! attach's loop device, past the end of a small filesystem the attach
//! needs to mount, so no filesystem sits between the test and the blocks),
//! or NBD exports (`blobdrive serve`, the client of `nbd_support/`).
//!
//! Every 512-byte sector of a written 4 KiB block carries its write's id,
//! the writing host, the *epoch* (the harness's own count of attaches and
//! lease takeovers: each attach that succeeds, and each `recover` that
//! applies a file, starts a new one) and a CRC-32C. The checker reads the
//! blob through the Python SDK (an independent client), after each fsync,
//! unmount, `recover` and `upgrade` that succeeded, after each wait, and at
//! the end, and holds every sector to:
//!
//! - (a) the last write to it that a successful fsync or unmount covered is
//!   there, or a write that had not completed when that one was issued;
//! - (b) it holds no write from an epoch older than that of a write to the
//!   same block that was made durable or was seen in the blob before: old
//!   data over a newer writer's (an acknowledged write that nothing flushed
//!   may be lost when its whole attach dies, so its mere absence proves
//!   nothing; its replacement by an older epoch's data does);
//! - (c) right after an fsync (or unmount) returned success, the writes it
//!   covered are in the blob (a failure of (a) there is reported as (c));
//! - (d) a `recover` without `--force` leaves no sector failing (b).
//!
//! The generator favours the sequences that expose a stale writer: a write
//! with a long `--flush-delay`, then a fault on that host, then the other
//! host breaking the lease and writing the same blocks, then the first host
//! coming back (its holder's takeover, its unmount, `recover`).
//!
//! `BLOBDRIVE_SPLIT_BRAIN_SCHEDULES` sets how many schedules run (default
//! 10, about four to five minutes on a 2-core machine);
//! `BLOBDRIVE_SPLIT_BRAIN_SEED` replays a run: schedule *i* uses the seed plus
//! *i* times a fixed odd constant, and prints it, so one failing schedule
//! replays alone with its own seed and `..._SCHEDULES=1`. With
//! `BLOBDRIVE_SPLIT_BRAIN_KEEP_GOING=1` a schedule that finds a violation does
//! not stop the run (a soak counts them all, `scripts/split-brain.sh`).

mod nbd_support;
mod netns;
mod system;
mod workload;

use std::collections::BTreeSet;
use std::fmt;
use std::io::Write as _;
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use blobdrive::nbd::proto::{NBD_CMD_FLUSH, NBD_CMD_WRITE};
use netns::{Host, Storage};
use workload::Rng;

const BLOCK: usize = 4096;
const SECTOR: usize = 512;
const SECTORS: usize = BLOCK / SECTOR;
/// The drive: small, so creating one per schedule costs little.
const DRIVE_MIB: u64 = 32;
/// The filesystem an attach needs in order to mount: the first 4 MiB only.
const FS_MIB: u64 = 4;
/// Where the stamped blocks live, far past the filesystem's end.
const REGION_BYTES: u64 = 16 << 20;
/// Few slots, so that the two hosts and successive epochs write the same
/// blocks often: a stale write is only visible over a newer one.
const SLOTS: u32 = 16;
const MAGIC: &[u8; 8] = b"SPLTBRN1";
const CONTAINER: &str = "splitbrain";
/// The client's total retry time in every daemon here: an fsync or a
/// takeover against a host whose link is down fails after this, not after
/// the default minutes.
const RETRY_SECS: &str = "10";

fn schedules() -> u32 {
    std::env::var("BLOBDRIVE_SPLIT_BRAIN_SCHEDULES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10)
}

fn keep_going() -> bool {
    std::env::var("BLOBDRIVE_SPLIT_BRAIN_KEEP_GOING").as_deref() == Ok("1")
}

fn base_seed() -> u64 {
    std::env::var("BLOBDRIVE_SPLIT_BRAIN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| uuid::Uuid::new_v4().as_u64_pair().0)
}

/// The seed of schedule `i` of a run seeded with `base`: schedule 0 is the
/// base itself, so any schedule replays alone from its own seed.
fn schedule_seed(base: u64, i: u32) -> u64 {
    base.wrapping_add(u64::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

// ---------------------------------------------------------------------------
// The schedule

/// Which way the hosts reach the drive in one schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Via {
    Attach,
    Nbd,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    /// Attach (or serve) on `host`, with a long flush delay or the default;
    /// breaks the lease first when the other host holds the drive.
    Attach {
        host: usize,
        long_delay: bool,
    },
    Write {
        host: usize,
        blocks: Vec<u32>,
    },
    Fsync {
        host: usize,
    },
    KillServing {
        host: usize,
    },
    KillHolder {
        host: usize,
    },
    Stop {
        host: usize,
    },
    Cont {
        host: usize,
    },
    LinkDown {
        host: usize,
    },
    LinkUp {
        host: usize,
    },
    BreakLease {
        host: usize,
    },
    Unmount {
        host: usize,
    },
    /// `recover FILE` of the host's newest recovery file not yet tried.
    Recover {
        host: usize,
        break_lease: bool,
    },
    Upgrade {
        host: usize,
    },
    Wait {
        secs: u64,
    },
}

const HOSTS: [&str; 2] = ["A", "B"];

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Attach { host, long_delay } => write!(
                f,
                "attach {} (flush delay {})",
                HOSTS[*host],
                if *long_delay { "10m" } else { "1s" }
            ),
            Op::Write { host, blocks } => write!(f, "write {} blocks {blocks:?}", HOSTS[*host]),
            Op::Fsync { host } => write!(f, "fsync {}", HOSTS[*host]),
            Op::KillServing { host } => write!(f, "kill -9 serving process of {}", HOSTS[*host]),
            Op::KillHolder { host } => write!(f, "kill -9 holder of {}", HOSTS[*host]),
            Op::Stop { host } => write!(f, "SIGSTOP {}", HOSTS[*host]),
            Op::Cont { host } => write!(f, "SIGCONT {}", HOSTS[*host]),
            Op::LinkDown { host } => write!(f, "link down {}", HOSTS[*host]),
            Op::LinkUp { host } => write!(f, "link up {}", HOSTS[*host]),
            Op::BreakLease { host } => write!(f, "break-lease from {}", HOSTS[*host]),
            Op::Unmount { host } => write!(f, "unmount {}", HOSTS[*host]),
            Op::Recover { host, break_lease } => write!(
                f,
                "recover on {}{}",
                HOSTS[*host],
                if *break_lease { " --break-lease" } else { "" }
            ),
            Op::Upgrade { host } => write!(f, "upgrade {}", HOSTS[*host]),
            Op::Wait { secs } => write!(f, "wait {secs}s"),
        }
    }
}

/// What the generator expects the state to be after the operations so far:
/// only to choose operations that make sense; an operation that does not
/// apply when it runs is skipped (and says so in the log).
#[derive(Default, Clone)]
struct Predicted {
    attached: [bool; 2],
    holder: [bool; 2],
    stopped: [bool; 2],
    link_down: [bool; 2],
    /// The host may have a recovery file to apply.
    recovery: [bool; 2],
    written: [Vec<u32>; 2],
}

impl Predicted {
    fn apply(&mut self, op: &Op, path: Via) {
        match op {
            Op::Attach { host, .. } => {
                if !self.link_down[*host] {
                    let other = 1 - host;
                    if self.attached[other] {
                        // The other host's data may be saved once it
                        // notices the lost lease.
                        self.recovery[other] = true;
                    }
                    self.attached[*host] = true;
                    self.holder[*host] = path == Via::Attach;
                    self.written[*host].clear();
                }
            }
            Op::Write { host, blocks } => self.written[*host].extend(blocks),
            Op::KillServing { host } => {
                if !self.holder[*host] {
                    self.attached[*host] = false;
                    self.stopped[*host] = false;
                }
                self.recovery[*host] = true;
            }
            Op::KillHolder { host } => self.holder[*host] = false,
            Op::Stop { host } => self.stopped[*host] = true,
            Op::Cont { host } => self.stopped[*host] = false,
            Op::LinkDown { host } => self.link_down[*host] = true,
            Op::LinkUp { host } => self.link_down[*host] = false,
            Op::BreakLease { .. } => {
                for h in 0..2 {
                    if self.attached[h] {
                        self.recovery[h] = true;
                    }
                }
            }
            Op::Unmount { host } => {
                self.attached[*host] = false;
                self.recovery[*host] = true;
            }
            Op::Recover { host, .. } => self.recovery[*host] = false,
            Op::Fsync { .. } | Op::Upgrade { .. } | Op::Wait { .. } => {}
        }
    }
}

/// A seeded schedule: its path and its operations.
struct Plan {
    path: Via,
    ops: Vec<Op>,
}

fn random_blocks(rng: &mut Rng, like: &[u32]) -> Vec<u32> {
    let n = rng.range(1, 5) as usize;
    (0..n)
        .map(|_| {
            if !like.is_empty() && rng.chance(70) {
                like[rng.range(0, like.len() as u64) as usize]
            } else {
                rng.range(0, u64::from(SLOTS)) as u32
            }
        })
        .collect()
}

/// The sequence that exposes a stale writer, with its variations: `x`
/// writes with a long flush delay, a fault takes `x` away from storage or
/// stops it, `y` breaks the lease, writes the same blocks and makes them
/// durable, then `x` comes back and is flushed, unmounted or recovered.
fn stale_writer_motif(rng: &mut Rng, path: Via, state: &Predicted) -> Vec<Op> {
    let x = rng.range(0, 2) as usize;
    let y = 1 - x;
    let mut ops = Vec::new();
    if !state.attached[x] {
        ops.push(Op::Attach {
            host: x,
            long_delay: true,
        });
    }
    if rng.chance(40) {
        ops.push(Op::Write {
            host: x,
            blocks: random_blocks(rng, &[]),
        });
        ops.push(Op::Fsync { host: x });
    }
    let blocks = random_blocks(rng, &[]);
    ops.push(Op::Write {
        host: x,
        blocks: blocks.clone(),
    });
    // How x is taken away while y works.
    let fault = rng.range(0, 4);
    match fault {
        0 => {
            ops.push(Op::LinkDown { host: x });
            if path == Via::Attach {
                ops.push(Op::KillServing { host: x });
            }
        }
        1 => ops.push(Op::LinkDown { host: x }),
        2 => ops.push(Op::Stop { host: x }),
        _ => {}
    }
    if state.attached[y] {
        ops.push(Op::Unmount { host: y });
    }
    ops.push(Op::Attach {
        host: y,
        long_delay: rng.chance(50),
    });
    ops.push(Op::Write {
        host: y,
        blocks: random_blocks(rng, &blocks),
    });
    let y_leaves = rng.chance(60);
    if y_leaves {
        ops.push(Op::Unmount { host: y });
    } else {
        ops.push(Op::Fsync { host: y });
    }
    match fault {
        0 | 1 => ops.push(Op::LinkUp { host: x }),
        2 => ops.push(Op::Cont { host: x }),
        _ => {}
    }
    match rng.range(0, 3) {
        0 => ops.push(Op::Wait {
            secs: rng.range(5, 20),
        }),
        1 => ops.push(Op::Fsync { host: x }),
        _ => {}
    }
    if rng.chance(70) {
        ops.push(Op::Unmount { host: x });
        // While y still holds the drive, the recovery must break its
        // lease to apply at all.
        ops.push(Op::Recover {
            host: x,
            break_lease: !y_leaves,
        });
    } else if path == Via::Attach && rng.chance(50) {
        ops.push(Op::Upgrade { host: x });
    }
    ops
}

/// One operation chosen at random among those that fit the predicted state.
fn random_op(rng: &mut Rng, path: Via, s: &Predicted) -> Op {
    let host = rng.range(0, 2) as usize;
    let mut choices: Vec<(u64, Op)> = Vec::new();
    if s.attached[host] {
        choices.push((
            30,
            Op::Write {
                host,
                blocks: random_blocks(rng, &s.written[1 - host]),
            },
        ));
        choices.push((10, Op::Fsync { host }));
        choices.push((5, Op::KillServing { host }));
        if path == Via::Attach && s.holder[host] {
            choices.push((2, Op::KillHolder { host }));
            choices.push((3, Op::Upgrade { host }));
        }
        if s.stopped[host] {
            choices.push((15, Op::Cont { host }));
        } else {
            choices.push((5, Op::Stop { host }));
            choices.push((6, Op::Unmount { host }));
        }
    } else {
        // An attach with the link down fails after a retry budget: tried
        // now and then, not again and again.
        choices.push((
            if s.link_down[host] { 2 } else { 25 },
            Op::Attach {
                host,
                long_delay: rng.chance(60),
            },
        ));
    }
    if s.link_down[host] {
        let weight = if s.attached[host] { 12 } else { 25 };
        choices.push((weight, Op::LinkUp { host }));
    } else {
        choices.push((5, Op::LinkDown { host }));
        choices.push((3, Op::BreakLease { host }));
    }
    if s.recovery[host] {
        choices.push((
            8,
            Op::Recover {
                host,
                break_lease: rng.chance(30),
            },
        ));
    }
    choices.push((
        2,
        Op::Wait {
            secs: rng.range(2, 12),
        },
    ));
    let total: u64 = choices.iter().map(|(w, _)| w).sum();
    let mut pick = rng.range(0, total);
    for (w, op) in choices {
        if pick < w {
            return op;
        }
        pick -= w;
    }
    unreachable!("the weights cover the pick")
}

fn plan(seed: u64) -> Plan {
    let mut rng = Rng::new(seed);
    let path = if rng.chance(60) {
        Via::Attach
    } else {
        Via::Nbd
    };
    let len = rng.range(10, 21) as usize;
    let mut state = Predicted::default();
    let mut ops = Vec::new();
    let motif_at = if rng.chance(75) {
        Some(rng.range(0, 4) as usize)
    } else {
        None
    };
    while ops.len() < len {
        let next = if motif_at == Some(ops.len()) {
            stale_writer_motif(&mut rng, path, &state)
        } else {
            vec![random_op(&mut rng, path, &state)]
        };
        for op in next {
            state.apply(&op, path);
            ops.push(op);
        }
    }
    Plan { path, ops }
}

// ---------------------------------------------------------------------------
// Stamped blocks

/// A 4 KiB block of write `id`: every sector stamped and checksummed.
fn stamp(id: u64, host: usize, epoch: u32, block: u32) -> Vec<u8> {
    let mut out = vec![0u8; BLOCK];
    for (i, sector) in out.chunks_mut(SECTOR).enumerate() {
        sector[..8].copy_from_slice(MAGIC);
        sector[8..16].copy_from_slice(&id.to_le_bytes());
        sector[16..20].copy_from_slice(&epoch.to_le_bytes());
        sector[20] = host as u8;
        sector[21] = i as u8;
        sector[22..26].copy_from_slice(&block.to_le_bytes());
        let mut x = id.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ (i as u64 + 1);
        for b in &mut sector[26..504] {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        let crc = crc32c::crc32c(&sector[..504]);
        sector[504..508].copy_from_slice(&crc.to_le_bytes());
    }
    out
}

/// What one sector of the blob holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    Zero,
    Write(u64),
    /// Neither zeros nor a sound stamp of this block and sector.
    Garbage,
}

fn parse_sector(sector: &[u8], block: u32, index: usize) -> Found {
    if sector.iter().all(|b| *b == 0) {
        return Found::Zero;
    }
    let crc = u32::from_le_bytes(sector[504..508].try_into().unwrap());
    if &sector[..8] != MAGIC
        || crc32c::crc32c(&sector[..504]) != crc
        || sector[21] as usize != index
        || u32::from_le_bytes(sector[22..26].try_into().unwrap()) != block
    {
        return Found::Garbage;
    }
    Found::Write(u64::from_le_bytes(sector[8..16].try_into().unwrap()))
}

// ---------------------------------------------------------------------------
// Devices: the loop device of an attach, or an NBD connection

enum Device {
    /// The loop device, and the host's temp dir its drive file must be in.
    Loop(String, PathBuf),
    Nbd {
        socket: PathBuf,
        export: String,
        /// None after a request that failed or did not answer: the next
        /// request connects again.
        client: Option<nbd_support::Client>,
    },
}

/// The outcome of one request with a deadline.
enum Outcome {
    Ok,
    Failed(String),
    /// No answer in time: the request may still land.
    NoAnswer,
}

/// Runs `f` on a thread of its own and waits for it at most `limit`: a
/// request to a stopped or unreachable daemon may never end, and the
/// schedule goes on without it (the cleanup's kills end it).
fn with_deadline<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<std::thread::Result<T>> {
    static QUIET: std::sync::Once = std::sync::Once::new();
    QUIET.call_once(|| {
        // The NBD client panics when the server is gone, which is an
        // outcome here (the request failed), not a failure of the test.
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() != Some(REQUEST_THREAD) {
                previous(info);
            }
        }));
    });
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(REQUEST_THREAD.into())
        .spawn(move || {
            let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
        })
        .expect("spawn a request thread");
    rx.recv_timeout(limit).ok()
}

const REQUEST_THREAD: &str = "split-brain-request";

fn aligned_copy(data: &[u8]) -> (Vec<u8>, usize) {
    let mut buf = vec![0u8; data.len() + BLOCK];
    let at = buf.as_ptr().align_offset(BLOCK);
    buf[at..at + data.len()].copy_from_slice(data);
    (buf, at)
}

/// Opens the attach's loop device, if it is still the attach's: a loop
/// device is freed when its attach ends and may then serve another drive
/// (another host's, or another test's), which must never get these writes.
/// While the descriptor is open the kernel does not rebind the device.
fn open_loop(device: &str, owner: &Path, direct: bool) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true);
    if direct {
        options.custom_flags(libc::O_DIRECT);
    }
    let file = options.open(device)?;
    let name = Path::new(device).file_name().unwrap_or_default();
    let backing =
        std::fs::read_to_string(Path::new("/sys/block").join(name).join("loop/backing_file"))
            .unwrap_or_default();
    if !Path::new(backing.trim()).starts_with(owner) {
        return Err(std::io::Error::other(format!(
            "{device} no longer serves this attach (its file: {:?})",
            backing.trim()
        )));
    }
    Ok(file)
}

fn loop_write(device: &str, owner: &Path, offset: u64, data: &[u8]) -> std::io::Result<()> {
    let file = open_loop(device, owner, true)?;
    let (buf, at) = aligned_copy(data);
    file.write_all_at(&buf[at..at + data.len()], offset)
}

fn loop_fsync(device: &str, owner: &Path) -> std::io::Result<()> {
    // A block device's fsync sends the device a flush, which the loop
    // device passes to the drive file as FUSE fsync.
    open_loop(device, owner, false)?.sync_all()
}

fn nbd_connect(socket: &Path, export: &str) -> nbd_support::Client {
    let mut client = nbd_support::Client::connect(socket);
    client.go(export);
    client
}

impl Device {
    /// WRITE (`data` at `offset`) or, with `None`, FLUSH.
    fn request(&mut self, offset: u64, data: Option<Vec<u8>>, limit: Duration) -> Outcome {
        match self {
            Device::Loop(dev, owner) => {
                let (dev, owner) = (dev.clone(), owner.clone());
                let answer = with_deadline(limit, move || match data {
                    Some(d) => loop_write(&dev, &owner, offset, &d),
                    None => loop_fsync(&dev, &owner),
                });
                match answer {
                    None => Outcome::NoAnswer,
                    Some(Err(_)) => Outcome::Failed("the request panicked".into()),
                    Some(Ok(Ok(()))) => Outcome::Ok,
                    Some(Ok(Err(e))) => Outcome::Failed(e.to_string()),
                }
            }
            Device::Nbd {
                socket,
                export,
                client,
            } => {
                let (socket, export, taken) = (socket.clone(), export.clone(), client.take());
                let answer = with_deadline(limit, move || {
                    let mut c = taken.unwrap_or_else(|| nbd_connect(&socket, &export));
                    let a = match data {
                        Some(d) => c.call(NBD_CMD_WRITE, 0, offset, d.len() as u32, &d),
                        None => c.call(NBD_CMD_FLUSH, 0, 0, 0, &[]),
                    };
                    (a.error, c)
                });
                match answer {
                    None => Outcome::NoAnswer,
                    // The client panics on a closed connection or a reply
                    // it cannot parse: the server is gone or stuck.
                    Some(Err(_)) => Outcome::Failed("the connection failed".into()),
                    Some(Ok((error, c))) => {
                        *client = Some(c);
                        if error == 0 {
                            Outcome::Ok
                        } else {
                            Outcome::Failed(format!("NBD error {error}"))
                        }
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The run of one schedule

struct WriteRec {
    id: u64,
    host: usize,
    epoch: u32,
    block: u32,
    /// The logical time it was issued and, once answered (either way),
    /// the time it was.
    issued: u64,
    completed: Option<u64>,
    acked: bool,
    durable: bool,
    seen: bool,
}

struct Attachment {
    epoch: u32,
    /// The mount point, or the NBD socket.
    target: PathBuf,
    device: Device,
    holder_alive: bool,
    /// The NBD server's pid (an attach's processes are in the registry).
    server_pid: Option<i32>,
    /// Acknowledged writes no fsync or unmount has covered yet.
    unflushed: Vec<u64>,
}

struct HostState {
    host: Host,
    attach: Option<Attachment>,
    stopped: Option<i32>,
    link_up: bool,
    tried_recoveries: BTreeSet<PathBuf>,
    made: u32,
}

struct Run<'a> {
    seed: u64,
    path: Via,
    drive: String,
    blob: String,
    checker: &'a Host,
    connection_string: String,
    hosts: Vec<HostState>,
    writes: Vec<WriteRec>,
    clock: u64,
    epoch: u32,
    log: Vec<String>,
    faults: u32,
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: a plain syscall on a daemon process this schedule started.
    unsafe {
        libc::kill(pid, sig);
    }
}

fn alive(pid: i32) -> bool {
    blobdrive::daemon::registry::process_alive(pid as u32)
}

/// `blobdrive ARGS` on `host` with a deadline: success and the first line
/// of what it said, or None if it did not end in time.
fn blobdrive_on(host: &Host, args: &[&str], limit: Duration) -> Option<(bool, String)> {
    let mut cmd = host.command(netns::BIN, args);
    let out = netns::run_with_timeout(&mut cmd, limit)?;
    let said = String::from_utf8_lossy(&out.stderr);
    let line = said
        .lines()
        .rev()
        .find(|l| l.starts_with("blobdrive:"))
        .or_else(|| said.lines().last())
        .unwrap_or("")
        .to_string();
    Some((out.status.success(), line))
}

impl Run<'_> {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn note(&mut self, text: String) {
        eprintln!("  {text}");
        self.log.push(text);
    }

    /// The serving process and holder of `host`'s attach as the registry
    /// names them now (a takeover changes the serving process).
    fn attach_pids(&self, host: usize) -> Option<(i32, Option<i32>)> {
        let h = &self.hosts[host];
        let a = h.attach.as_ref()?;
        if self.path == Via::Nbd {
            return a.server_pid.filter(|p| alive(*p)).map(|p| (p, None));
        }
        let dir = a.target.to_string_lossy().to_string();
        h.host
            .attached()
            .into_iter()
            .find(|e| e["dir"].as_str() == Some(&dir))
            .and_then(|e| {
                Some((
                    e["pid"].as_i64()? as i32,
                    e["holder_pid"].as_i64().map(|p| p as i32),
                ))
            })
    }

    fn execute(&mut self, op: &Op) -> Result<String, String> {
        match op {
            Op::Attach { host, long_delay } => self.attach(*host, *long_delay),
            Op::Write { host, blocks } => self.write(*host, blocks),
            Op::Fsync { host } => self.fsync(*host),
            Op::KillServing { host } => self.kill_serving(*host),
            Op::KillHolder { host } => {
                let Some((_, Some(holder))) = self.attach_pids(*host) else {
                    return Ok("skipped: no holder".into());
                };
                signal(holder, libc::SIGKILL);
                if let Some(a) = &mut self.hosts[*host].attach {
                    a.holder_alive = false;
                }
                self.faults += 1;
                Ok(format!("killed holder {holder}"))
            }
            Op::Stop { host } => {
                let Some((pid, _)) = self.attach_pids(*host) else {
                    return Ok("skipped: nothing serving".into());
                };
                signal(pid, libc::SIGSTOP);
                self.hosts[*host].stopped = Some(pid);
                self.faults += 1;
                Ok(format!("stopped {pid}"))
            }
            Op::Cont { host } => match self.hosts[*host].stopped.take() {
                Some(pid) => {
                    signal(pid, libc::SIGCONT);
                    Ok(format!("continued {pid}"))
                }
                None => Ok("skipped: nothing stopped".into()),
            },
            Op::LinkDown { host } => {
                self.hosts[*host].host.set_link(false);
                self.hosts[*host].link_up = false;
                self.faults += 1;
                Ok("down".into())
            }
            Op::LinkUp { host } => {
                self.hosts[*host].host.set_link(true);
                self.hosts[*host].link_up = true;
                Ok("up".into())
            }
            Op::BreakLease { host } => {
                self.faults += 1;
                let drive = self.drive.clone();
                match blobdrive_on(
                    &self.hosts[*host].host,
                    &["break-lease", &drive],
                    Duration::from_secs(60),
                ) {
                    Some((true, _)) => Ok("broken".into()),
                    Some((false, line)) => Ok(format!("failed: {line}")),
                    None => Ok("no answer".into()),
                }
            }
            Op::Unmount { host } => self.unmount(*host),
            Op::Recover { host, break_lease } => self.recover(*host, *break_lease),
            Op::Upgrade { host } => self.upgrade(*host),
            Op::Wait { secs } => {
                std::thread::sleep(Duration::from_secs(*secs));
                self.check("after a wait", &[])?;
                Ok("waited".into())
            }
        }
    }

    fn attach(&mut self, host: usize, long_delay: bool) -> Result<String, String> {
        if self.hosts[host].attach.is_some() {
            return Ok("skipped: already attached".into());
        }
        let other = 1 - host;
        let mut said = String::new();
        if self.hosts[other].attach.is_some() {
            // The drive is the other host's: take it over, as an operator
            // whose host seems gone would.
            self.faults += 1;
            let drive = self.drive.clone();
            match blobdrive_on(
                &self.hosts[host].host,
                &["break-lease", &drive],
                Duration::from_secs(60),
            ) {
                Some((true, _)) => said.push_str("broke the lease; "),
                Some((false, line)) => said.push_str(&format!("break-lease failed ({line}); ")),
                None => said.push_str("break-lease did not answer; "),
            }
        }
        let delay = if long_delay { "10m" } else { "1s" };
        let h = &mut self.hosts[host];
        h.made += 1;
        let name = format!(
            "{}{}",
            if self.path == Via::Attach { "m" } else { "s" },
            h.made
        );
        let attached = match self.path {
            Via::Attach => h
                .host
                .try_mount(&self.drive, &name, &["--flush-delay", delay])
                .and_then(|dir| {
                    let d = dir.to_string_lossy().to_string();
                    let entry = h
                        .host
                        .attached()
                        .into_iter()
                        .find(|e| e["dir"].as_str() == Some(&d))
                        .ok_or("the registry does not list the attach")?;
                    let dev = entry["loop_device"]
                        .as_str()
                        .ok_or("the registry names no loop device")?
                        .to_string();
                    let owner = h.host.root.path().to_path_buf();
                    Ok((dir, Device::Loop(dev, owner), None))
                }),
            Via::Nbd => h
                .host
                .try_serve(&self.drive, &name, &["--flush-delay", delay])
                .map(|(socket, pid)| {
                    let export = self.drive.clone();
                    (
                        socket.clone(),
                        Device::Nbd {
                            socket,
                            export,
                            client: None,
                        },
                        Some(pid),
                    )
                }),
        };
        match attached {
            Ok((target, device, server_pid)) => {
                self.epoch += 1;
                let epoch = self.epoch;
                self.hosts[host].attach = Some(Attachment {
                    epoch,
                    target,
                    device,
                    holder_alive: self.path == Via::Attach,
                    server_pid,
                    unflushed: Vec::new(),
                });
                Ok(format!("{said}attached, epoch {epoch}"))
            }
            Err(e) => Ok(format!(
                "{said}failed: {}",
                e.lines().next().unwrap_or_default()
            )),
        }
    }

    fn write(&mut self, host: usize, blocks: &[u32]) -> Result<String, String> {
        let Some(epoch) = self.hosts[host].attach.as_ref().map(|a| a.epoch) else {
            return Ok("skipped: not attached".into());
        };
        let mut said = Vec::new();
        for &block in blocks {
            let id = self.writes.len() as u64 + 1;
            let issued = self.tick();
            let data = stamp(id, host, epoch, block);
            let offset = REGION_BYTES + u64::from(block) * BLOCK as u64;
            let a = self.hosts[host].attach.as_mut().expect("attached");
            let outcome = a.device.request(offset, Some(data), Duration::from_secs(4));
            let completed = match outcome {
                Outcome::NoAnswer => None,
                _ => Some(self.tick()),
            };
            let acked = matches!(outcome, Outcome::Ok);
            if acked {
                self.hosts[host]
                    .attach
                    .as_mut()
                    .expect("attached")
                    .unflushed
                    .push(id);
            }
            self.writes.push(WriteRec {
                id,
                host,
                epoch,
                block,
                issued,
                completed,
                acked,
                durable: false,
                seen: false,
            });
            match outcome {
                Outcome::Ok => said.push(format!("#{id}@{block} ok")),
                Outcome::Failed(e) => said.push(format!("#{id}@{block} failed ({e})")),
                Outcome::NoAnswer => {
                    said.push(format!("#{id}@{block} no answer"));
                    // The device is stuck: more writes would only wait too.
                    break;
                }
            }
        }
        Ok(said.join(", "))
    }

    /// Marks what a successful fsync or unmount of `host`'s attach covered
    /// (its acknowledged writes so far) as durable; returns them.
    fn mark_durable(&mut self, host: usize) -> Vec<u64> {
        let covered = match &mut self.hosts[host].attach {
            Some(a) => std::mem::take(&mut a.unflushed),
            None => Vec::new(),
        };
        for id in &covered {
            self.writes[*id as usize - 1].durable = true;
        }
        covered
    }

    fn fsync(&mut self, host: usize) -> Result<String, String> {
        let Some(a) = self.hosts[host].attach.as_mut() else {
            return Ok("skipped: not attached".into());
        };
        match a.device.request(0, None, Duration::from_secs(20)) {
            Outcome::Ok => {
                let covered = self.mark_durable(host);
                self.check(&format!("fsync of {}", HOSTS[host]), &covered)?;
                Ok(format!("ok, {} writes durable", covered.len()))
            }
            Outcome::Failed(e) => Ok(format!("failed ({e})")),
            Outcome::NoAnswer => Ok("no answer".into()),
        }
    }

    fn kill_serving(&mut self, host: usize) -> Result<String, String> {
        let Some((pid, _)) = self.attach_pids(host) else {
            return Ok("skipped: nothing serving".into());
        };
        signal(pid, libc::SIGKILL);
        self.faults += 1;
        let h = &mut self.hosts[host];
        if h.stopped == Some(pid) {
            h.stopped = None;
        }
        let holder_alive = h.attach.as_ref().is_some_and(|a| a.holder_alive);
        if holder_alive {
            return Ok(format!("killed {pid}; the holder takes over"));
        }
        // Nothing takes over: the attach is gone with what it had not
        // flushed (as a disk's volatile cache is in a crash). Its remains
        // (an NBD socket, a dead FUSE mount) go with an unmount.
        let a = h.attach.take().expect("attached");
        let target = a.target.to_string_lossy().to_string();
        let _ = blobdrive_on(&h.host, &["unmount", &target], Duration::from_secs(60));
        Ok(format!("killed {pid}; the attach is gone"))
    }

    fn unmount(&mut self, host: usize) -> Result<String, String> {
        if self.hosts[host].attach.is_none() {
            return Ok("skipped: not attached".into());
        }
        if let Some(pid) = self.hosts[host].stopped {
            // The watchdog replaces a serving process stopped for long.
            if self.attach_pids(host).map(|p| p.0) == Some(pid) {
                return Ok("skipped: its daemon is stopped".into());
            }
            self.hosts[host].stopped = None;
        }
        let Some(a) = &self.hosts[host].attach else {
            return Ok("skipped: not attached".into());
        };
        let target = a.target.to_string_lossy().to_string();
        let result = blobdrive_on(
            &self.hosts[host].host,
            &["unmount", &target],
            Duration::from_secs(45),
        );
        match result {
            Some((true, _)) => {
                let covered = self.mark_durable(host);
                self.hosts[host].attach = None;
                self.check(&format!("unmount of {}", HOSTS[host]), &covered)?;
                Ok(format!("ok, {} writes durable", covered.len()))
            }
            Some((false, line)) => {
                // A failed unmount may leave the attach serving (busy) or
                // end it (its data in a recovery file), the daemon exiting
                // just after the answer.
                let start = Instant::now();
                let gone = loop {
                    // A holder that lives on may still take over (its
                    // takeover waits for storage or the lease): the attach
                    // is not gone while it does.
                    let serving = self
                        .attach_pids(host)
                        .is_some_and(|(pid, holder)| alive(pid) || holder.is_some_and(alive));
                    if !serving {
                        break true;
                    }
                    if start.elapsed() > Duration::from_secs(5) {
                        break false;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                };
                if gone {
                    self.hosts[host].attach = None;
                }
                Ok(format!("failed: {line}"))
            }
            None => Ok("no answer".into()),
        }
    }

    fn recover(&mut self, host: usize, break_lease: bool) -> Result<String, String> {
        let h = &mut self.hosts[host];
        let Some(file) = h
            .host
            .recovery_files()
            .into_iter()
            .rev()
            .find(|f| !h.tried_recoveries.contains(f))
        else {
            return Ok("skipped: no recovery file".into());
        };
        h.tried_recoveries.insert(file.clone());
        let file_s = file.to_string_lossy().to_string();
        let mut args = vec!["recover", file_s.as_str()];
        if break_lease {
            args.push("--break-lease");
        }
        match blobdrive_on(&h.host, &args, Duration::from_secs(60)) {
            Some((true, _)) => {
                self.epoch += 1;
                let name = file.file_name().unwrap_or_default().to_string_lossy();
                let said = format!("applied {name} (epoch {})", self.epoch);
                self.check(&format!("recover without --force on {}", HOSTS[host]), &[])
                    .map_err(|e| format!("(d) {e}"))?;
                Ok(said)
            }
            Some((false, line)) => Ok(format!("refused: {line}")),
            None => Ok("no answer".into()),
        }
    }

    fn upgrade(&mut self, host: usize) -> Result<String, String> {
        let Some(a) = &self.hosts[host].attach else {
            return Ok("skipped: not attached".into());
        };
        if self.path != Via::Attach || self.hosts[host].stopped.is_some() {
            return Ok("skipped".into());
        }
        let dir = a.target.to_string_lossy().to_string();
        match blobdrive_on(
            &self.hosts[host].host,
            &["upgrade", &dir],
            Duration::from_secs(60),
        ) {
            Some((true, _)) => {
                self.check(&format!("upgrade of {}", HOSTS[host]), &[])?;
                Ok("handed over".into())
            }
            Some((false, line)) => Ok(format!("failed: {line}")),
            None => Ok("no answer".into()),
        }
    }

    /// The stamped region of the blob, read by the Python SDK.
    fn read_blob(&self) -> Vec<u8> {
        let script = r#"
import os, sys
from azure.storage.blob import BlobClient
c = BlobClient.from_connection_string(os.environ["CS"], sys.argv[1], sys.argv[2])
sys.stdout.buffer.write(c.download_blob(offset=int(sys.argv[3]), length=int(sys.argv[4])).readall())
"#;
        let len = u64::from(SLOTS) * BLOCK as u64;
        let mut cmd = self.checker.command(
            "python3",
            &[
                "-c",
                script,
                CONTAINER,
                &self.blob,
                &REGION_BYTES.to_string(),
                &len.to_string(),
            ],
        );
        cmd.env("CS", &self.connection_string);
        let out = netns::run_with_timeout(&mut cmd, Duration::from_secs(120))
            .expect("the SDK's read of the blob did not end in 2 minutes");
        assert!(
            out.status.success() && out.stdout.len() as u64 == len,
            "the SDK could not read the blob: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    fn describe(&self, found: Found) -> String {
        match found {
            Found::Zero => "zeros".into(),
            Found::Garbage => "bytes no write of this run produced".into(),
            Found::Write(id) => match self.writes.get(id as usize - 1) {
                Some(w) => format!(
                    "write #{id} of {} in epoch {} ({})",
                    HOSTS[w.host],
                    w.epoch,
                    match (w.completed, w.acked) {
                        (None, _) => "never answered",
                        (Some(_), true) => "acknowledged",
                        (Some(_), false) => "failed",
                    }
                ),
                None => format!("unknown write #{id}"),
            },
        }
    }

    /// Reads the blob and holds every sector to (a), (b) and (c) (see the
    /// module's doc); `covered` is what the fsync or unmount that asked for
    /// this check made durable.
    fn check(&mut self, why: &str, covered: &[u64]) -> Result<(), String> {
        let bytes = self.read_blob();
        let mut problems = Vec::new();
        let mut seen = Vec::new();
        for block in 0..SLOTS {
            let here: Vec<&WriteRec> = self.writes.iter().filter(|w| w.block == block).collect();
            // The last durable write (by issue) that must still be there,
            // unless a write that had not completed when it was issued
            // replaced it.
            let last_durable = here.iter().filter(|w| w.durable).max_by_key(|w| w.issued);
            for s in 0..SECTORS {
                let at = block as usize * BLOCK + s * SECTOR;
                let found = parse_sector(&bytes[at..at + SECTOR], block, s);
                let what = self.describe(found);
                let holder = match found {
                    Found::Write(id) => self.writes.get(id as usize - 1),
                    _ => None,
                };
                if matches!(found, Found::Garbage)
                    || (matches!(found, Found::Write(_)) && holder.is_none())
                {
                    problems.push(format!("block {block} sector {s} holds {what}"));
                    continue;
                }
                if let Some(d) = last_durable {
                    let allowed = holder
                        .is_some_and(|w| w.id == d.id || w.completed.is_none_or(|c| c > d.issued));
                    if !allowed {
                        let check = if covered.contains(&d.id) {
                            "(c)"
                        } else {
                            "(a)"
                        };
                        problems.push(format!(
                            "{check} block {block} sector {s}: write #{} of {} in epoch {} was \
                             made durable, but the blob holds {what}",
                            d.id, HOSTS[d.host], d.epoch
                        ));
                    }
                }
                if let Some(w) = holder {
                    if let Some(v) = here
                        .iter()
                        .filter(|v| v.epoch > w.epoch && (v.durable || v.seen))
                        .max_by_key(|v| v.epoch)
                    {
                        problems.push(format!(
                            "(b) block {block} sector {s} holds {what}, older than write #{} of \
                             {} in epoch {}, which was {}",
                            v.id,
                            HOSTS[v.host],
                            v.epoch,
                            if v.durable {
                                "made durable"
                            } else {
                                "in the blob before"
                            }
                        ));
                    }
                    seen.push(w.id);
                }
            }
        }
        if problems.is_empty() {
            for id in seen {
                self.writes[id as usize - 1].seen = true;
            }
            return Ok(());
        }
        problems.dedup();
        Err(format!("after {why}: {}", problems.join("; ")))
    }

    /// Brings both hosts back (links up, daemons continued), unmounts what
    /// is attached, serving attaches first, and checks the blob a last time.
    /// An attach whose holder waits to take over (for storage, or for the
    /// lease the other host holds) is unmounted once it serves again: that
    /// is when a stale takeover would write.
    fn finish(&mut self) -> Result<(), String> {
        for h in &mut self.hosts {
            if !h.link_up {
                h.host.set_link(true);
                h.link_up = true;
            }
            if let Some(pid) = h.stopped.take() {
                signal(pid, libc::SIGCONT);
            }
        }
        // The holder's pause between takeovers grows to 30 s.
        let deadline = Instant::now() + Duration::from_secs(50);
        loop {
            let mut waiting = false;
            for (h, name) in HOSTS.iter().enumerate() {
                let Some(a) = &self.hosts[h].attach else {
                    continue;
                };
                let target = a.target.to_string_lossy().to_string();
                let serving = self.path == Via::Nbd
                    || !a.holder_alive
                    || matches!(
                        blobdrive_on(
                            &self.hosts[h].host,
                            &["stats", &target],
                            Duration::from_secs(10),
                        ),
                        Some((true, _))
                    )
                    || self.attach_pids(h).is_none();
                if serving || Instant::now() > deadline {
                    let said = self.unmount(h)?;
                    self.note(format!("end: unmount {name}: {said}"));
                    // Whatever that did, the schedule is over for it (the
                    // host's cleanup kills what is left).
                    self.hosts[h].attach = None;
                } else {
                    waiting = true;
                }
            }
            if !waiting {
                break;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        self.check("the end of the schedule", &[])
    }
}

/// A schedule's result: faults injected, and the violation if any.
struct ScheduleResult {
    faults: u32,
    violation: Option<String>,
}

fn drive_image(dir: &Path) -> PathBuf {
    let image = dir.join("drive.raw");
    let file = std::fs::File::create(&image).expect("create the image");
    file.set_len(DRIVE_MIB << 20).expect("size the image");
    drop(file);
    // A filesystem in the first few MiB only: the attach mounts it, and
    // nothing of it reaches the stamped region.
    system::run(
        "mkfs.ext4",
        &["-q", "-F", &image.to_string_lossy(), &format!("{FS_MIB}M")],
    );
    image
}

fn run_schedule(
    storage: &mut Storage,
    checker: &Host,
    image: &Path,
    index: u32,
    seed: u64,
) -> ScheduleResult {
    let plan = plan(seed);
    let blob = format!("s{index}-{seed:016x}.vhd");
    let drive = format!("{CONTAINER}/{blob}");
    eprintln!(
        "schedule {index}: BLOBDRIVE_SPLIT_BRAIN_SEED={seed} ({:?} path, {} operations)",
        plan.path,
        plan.ops.len()
    );
    let setup = Instant::now();
    // The checker keeps the default retry time: a busy Azurite may take
    // longer than the hosts' short budget.
    let image_s = image.to_string_lossy().to_string();
    let mut upload = checker.command(netns::BIN, &["upload", &image_s, &drive]);
    upload.env_remove("BLOBDRIVE_RETRY_TOTAL_SECS");
    let out = netns::run_with_timeout(&mut upload, Duration::from_secs(300))
        .expect("the upload of the drive did not end in 5 minutes");
    assert!(
        out.status.success(),
        "the upload of the drive failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hosts = (0..2)
        .map(|h| HostState {
            host: storage.host(&format!("{}{index}", HOSTS[h].to_lowercase())),
            attach: None,
            stopped: None,
            link_up: true,
            tried_recoveries: BTreeSet::new(),
            made: 0,
        })
        .collect();
    let mut run = Run {
        seed,
        path: plan.path,
        drive,
        blob,
        checker,
        connection_string: storage.connection_string(),
        hosts,
        writes: Vec::new(),
        clock: 0,
        epoch: 0,
        log: Vec::new(),
        faults: 0,
    };
    let setup_secs = setup.elapsed().as_secs_f64();
    let mut violation = None;
    let started = Instant::now();
    for (i, op) in plan.ops.iter().enumerate() {
        let at = started.elapsed().as_secs_f64();
        match run.execute(op) {
            Ok(said) => run.note(format!("{i:2}. [{at:5.1}s] {op}: {said}")),
            Err(e) => {
                run.note(format!("{i:2}. [{at:5.1}s] {op}: VIOLATION"));
                violation = Some(e);
                break;
            }
        }
    }
    if violation.is_none() {
        if let Err(e) = run.finish() {
            violation = Some(e);
        }
    }
    eprintln!(
        "schedule {index}: {} faults, {:.1} s",
        run.faults,
        started.elapsed().as_secs_f64()
    );
    let violation = violation.map(|v| {
        let logs: Vec<String> = run.hosts.iter().map(|h| log_tails(&h.host)).collect();
        format!(
            "split brain in schedule {index}, BLOBDRIVE_SPLIT_BRAIN_SEED={} ({:?} path): {v}\n\
             the schedule so far:\n{}\n{}",
            run.seed,
            run.path,
            run.log.join("\n"),
            logs.join("\n")
        )
    });
    let faults = run.faults;
    // The hosts go here (their Drop unmounts and kills what is left).
    let teardown = Instant::now();
    drop(run);
    eprintln!(
        "schedule {index}: set up in {:.1} s, cleaned up in {:.1} s",
        setup_secs,
        teardown.elapsed().as_secs_f64()
    );
    ScheduleResult { faults, violation }
}

/// The last lines of each daemon log of `host`, for a failure's message.
fn log_tails(host: &Host) -> String {
    let mut out = String::new();
    let Ok(entries) = std::fs::read_dir(host.root.path()) else {
        return out;
    };
    let mut logs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    logs.sort();
    for log in logs {
        let bytes = std::fs::read(&log).unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let tail = &lines[lines.len().saturating_sub(12)..];
        out.push_str(&format!(
            "--- {} {} ({} bytes; its last lines)\n{}\n",
            host.name,
            log.file_name().unwrap_or_default().to_string_lossy(),
            bytes.len(),
            tail.join("\n")
        ));
    }
    out
}

#[test]
fn random_fault_schedules_over_two_hosts_never_put_old_data_over_newer() {
    let test = "random_fault_schedules_over_two_hosts_never_put_old_data_over_newer";
    if !netns::can_run(test) {
        return;
    }
    // Every daemon and command the hosts run inherits this: an outage
    // costs seconds, not the default minutes, per attempt.
    std::env::set_var("BLOBDRIVE_RETRY_TOTAL_SECS", RETRY_SECS);
    let started = Instant::now();
    let base = base_seed();
    let count = schedules();
    eprintln!("BLOBDRIVE_SPLIT_BRAIN_SEED={base} BLOBDRIVE_SPLIT_BRAIN_SCHEDULES={count}");
    let work = tempfile::tempdir().expect("temp dir");
    let image = drive_image(work.path());
    let mut faults = 0;
    let mut violations = Vec::new();
    let mut ran = 0;
    let mut i = 0;
    'storages: while i < count {
        // A storage namespace numbers its hosts below 200: a long soak
        // starts a fresh one (and Azurite) every 40 schedules.
        let mut storage = Storage::start();
        let checker = storage.host("checker");
        for _ in 0..40 {
            if i == count {
                break;
            }
            let outcome = run_schedule(&mut storage, &checker, &image, i, schedule_seed(base, i));
            i += 1;
            ran += 1;
            faults += outcome.faults;
            if let Some(v) = outcome.violation {
                eprintln!("{v}");
                violations.push(v);
                if !keep_going() {
                    break 'storages;
                }
            }
        }
    }
    let summary = format!(
        "split-brain summary: {ran} schedules run, {faults} faults injected, {} violations \
         found, {:.0} s",
        violations.len(),
        started.elapsed().as_secs_f64()
    );
    eprintln!("{summary}");
    let _ = std::io::stderr().flush();
    assert!(
        violations.is_empty(),
        "{}\n{summary}",
        violations.join("\n\n")
    );
}
