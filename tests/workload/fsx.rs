//! A file exerciser in the manner of fsx: random reads, writes, hole
//! punches, fsyncs and remounts on one file, every read compared with a
//! model of what the file must hold, and the whole file after every
//! remount. The caller says how to remount (and anything to do after an
//! fsync, or what to write); the exerciser owns the model, the generator
//! and the counts. A failure names the operation and the seed.

use std::fs::File;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

/// How often each operation comes, in ten-thousandths; what is left over
/// after reads, writes, punches and fsyncs is remounts.
#[derive(Clone, Copy)]
pub struct Mix {
    pub read: u32,
    pub write: u32,
    pub punch: u32,
    pub fsync: u32,
}

/// The operations, in the order of [`Exerciser::counts`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Op {
    Read,
    Write,
    Punch,
    Fsync,
    Remount,
}

/// What the exerciser asks of the place the file lives in.
pub trait Target {
    /// Unmount, mount again and open the file again (the old handle is
    /// dropped before this is called).
    fn remount(&mut self) -> File;

    /// After each fsync (e.g. drop the file's cached pages).
    fn after_fsync(&mut self, _file: &File) {}

    /// The bytes of one write (random by default).
    fn fill(&mut self, rng: &mut StdRng, buf: &mut [u8]) {
        rng.fill_bytes(buf);
    }
}

/// The model, the generator and what was done.
pub struct Exerciser {
    /// What the file must hold.
    pub model: Vec<u8>,
    /// Operations done, by [`Op`].
    pub counts: [u64; 5],
    /// Time spent in each operation, by [`Op`].
    pub spent: [Duration; 5],
    /// The generator's seed, printed by the caller and in every failure.
    pub seed: u64,
    rng: StdRng,
    mix: Mix,
    max_len: u64,
}

impl Exerciser {
    /// An exerciser of a file of `size` bytes (all zeros at first), with
    /// operations of at most `max_len` bytes.
    pub fn new(seed: u64, size: u64, max_len: u64, mix: Mix) -> Exerciser {
        assert!(
            mix.read + mix.write + mix.punch + mix.fsync <= 10_000,
            "the mix is out of 10,000"
        );
        Exerciser {
            model: vec![0; size as usize],
            counts: [0; 5],
            spent: [Duration::ZERO; 5],
            seed,
            rng: StdRng::seed_from_u64(seed),
            mix,
            max_len,
        }
    }

    /// The seed in `$SEED_VAR` if set, else a fresh one.
    pub fn seed_from_env(seed_var: &str) -> u64 {
        std::env::var(seed_var)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random)
    }

    /// Start over on a new file of the same size (the generator goes on).
    pub fn reset_model(&mut self) {
        self.model.fill(0);
    }

    /// Operations numbered `ops` on `file`; returns the handle open at the
    /// end (a remount replaces it).
    pub fn run(&mut self, ops: Range<u64>, mut file: File, target: &mut dyn Target) -> File {
        let size = self.model.len() as u64;
        let seed = self.seed;
        for op in ops {
            let began = Instant::now();
            let kind = self.pick();
            let offset = self.rng.random_range(0..size);
            let len = self.rng.random_range(1..=self.max_len).min(size - offset);
            let (at, n) = (offset as usize, len as usize);
            match kind {
                Op::Read => {
                    let mut buf = vec![0u8; n];
                    file.read_exact_at(&mut buf, offset).unwrap_or_else(|e| {
                        panic!("op {op}: read {offset}+{len}: {e} (seed {seed})")
                    });
                    if buf != self.model[at..at + n] {
                        let first = (0..n).find(|&i| buf[i] != self.model[at + i]).unwrap_or(0);
                        panic!(
                            "op {op}: read {offset}+{len} differs from the model at byte {} (seed {seed})",
                            offset + first as u64
                        );
                    }
                }
                Op::Write => {
                    let mut buf = vec![0u8; n];
                    target.fill(&mut self.rng, &mut buf);
                    file.write_all_at(&buf, offset).unwrap_or_else(|e| {
                        panic!("op {op}: write {offset}+{len}: {e} (seed {seed})")
                    });
                    self.model[at..at + n].copy_from_slice(&buf);
                }
                Op::Punch => {
                    // SAFETY: a valid open fd and in-range arguments.
                    let rc = unsafe {
                        libc::fallocate(
                            file.as_raw_fd(),
                            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                            offset as libc::off_t,
                            len as libc::off_t,
                        )
                    };
                    assert_eq!(
                        rc,
                        0,
                        "op {op}: punch hole {offset}+{len}: {} (seed {seed})",
                        std::io::Error::last_os_error()
                    );
                    self.model[at..at + n].fill(0);
                }
                Op::Fsync => {
                    file.sync_all()
                        .unwrap_or_else(|e| panic!("op {op}: fsync: {e} (seed {seed})"));
                    target.after_fsync(&file);
                }
                Op::Remount => {
                    drop(file);
                    file = target.remount();
                    let mut whole = vec![0u8; self.model.len()];
                    file.read_exact_at(&mut whole, 0).unwrap_or_else(|e| {
                        panic!("op {op}: read the whole file after a remount: {e} (seed {seed})")
                    });
                    assert!(
                        whole == self.model,
                        "op {op}: the file differs from the model after a remount (seed {seed})"
                    );
                }
            }
            self.counts[kind as usize] += 1;
            self.spent[kind as usize] += began.elapsed();
        }
        file
    }

    /// One line of what was done, for the test's output.
    pub fn summary(&self) -> String {
        let c = &self.counts;
        format!(
            "{} reads, {} writes, {} punch holes, {} fsyncs, {} remounts: 0 mismatches",
            c[0], c[1], c[2], c[3], c[4]
        )
    }

    fn pick(&mut self) -> Op {
        let m = self.mix;
        let x = self.rng.random_range(0..10_000u32);
        if x < m.read {
            Op::Read
        } else if x < m.read + m.write {
            Op::Write
        } else if x < m.read + m.write + m.punch {
            Op::Punch
        } else if x < m.read + m.write + m.punch + m.fsync {
            Op::Fsync
        } else {
            Op::Remount
        }
    }
}
