//! The backend's own ceiling, for `scripts/bench.sh`: the project's REST client
//! alone (no FUSE, no cache) doing 4 MiB Put Page, 4 KiB Put Page at random
//! offsets, 4 MiB Get Blob and 4 KiB Get Blob against the configured account,
//! at several parallelism levels.
//!
//!   cargo run --release --example ceiling -- [--seconds S] [--blob-mib N]
//!   cargo run --release --example ceiling -- --read C/B [--seconds S] [--blob-mib N]
//!   cargo run --release --example ceiling -- --pass C/B --parallelism P
//!   cargo run --release --example ceiling -- --put-pass C/B --parallelism P [--blob-mib N]
//!   cargo run --release --example ceiling -- --small-read C/B --parallelism P [--seconds S] [--blob-mib N]
//!   cargo run --release --example ceiling -- --small-write C/B --parallelism P [--seconds S] [--blob-mib N]
//!
//! Prints one JSON object: for each operation the best rate and the parallelism
//! that gave it, plus the 4 KiB rate at queue depth 32 (what fio uses), so the
//! bench can divide blobdrive's figures by these. The account comes from the
//! environment like the CLI's (Azurite by default); a scratch container is made
//! and deleted. With `--read C/B` only the 4 MiB Get figure is measured, on
//! the first `--blob-mib` of an existing blob (the bench's own drive, so
//! both sides read the same stored layout). With `--pass C/B`, one pass
//! reads every 4 MiB slot of an existing blob that holds data, in order, with
//! `P` Gets in flight, and prints its MiB/s: the raw client doing what a cold
//! sequential read of that drive does, so the bench can time the two side by
//! side, alternating, minutes into a run rather than on a fresh backend.
//! With `--put-pass C/B`, one pass writes a new page blob of `--blob-mib`
//! random bytes, every 4 MiB slot once, in order, with `P` Put Pages in
//! flight, prints its MiB/s and deletes the blob: the raw client doing what a
//! sequential write or an upload does, timed just before it.
//! With `--small-read C/B`, 4 KiB Gets at random 4 KiB slots of the first
//! `--blob-mib` of an existing blob, `P` in flight, for `--seconds`: the raw
//! client doing what a cold random read at queue depth `P` does (the
//! bench's service-model steps time it through the model). With
//! `--small-write C/B`, a new page blob of `--blob-mib` takes 4 KiB Put
//! Pages at random 4 KiB slots, `P` in flight, for `--seconds`, and is
//! deleted: what a drain of scattered writes (or, at `P` 1, a write and
//! fsync loop) costs the raw client.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use blobdrive::blob::{Account, BlobClient, BlobPath};
use blobdrive::units::{ByteRange, MAX_GET_BYTES, MAX_PUT_PAGE_BYTES};
use bytes::Bytes;
use rand::Rng;

const LEVELS: [usize; 5] = [1, 4, 8, 16, 32];
const SMALL_BYTES: u64 = 4096;

#[derive(Clone, Copy)]
enum Op {
    Put4M,
    /// Put Page of 4 KiB at a random 4 KiB slot: what a flush of scattered
    /// writes sends.
    Put4K,
    Get4M,
    Get4K,
}

impl Op {
    fn bytes(self) -> u64 {
        match self {
            Op::Put4M | Op::Get4M => MAX_PUT_PAGE_BYTES,
            Op::Get4K | Op::Put4K => SMALL_BYTES,
        }
    }
}

struct Args {
    seconds: f64,
    blob_bytes: u64,
    /// An existing blob to measure 4 MiB Gets on, instead of a scratch one.
    read: Option<String>,
    /// An existing blob to read once, every slot holding data (`--pass`).
    pass: Option<String>,
    /// A new blob to write once, every slot, then delete (`--put-pass`).
    put_pass: Option<String>,
    /// An existing blob to read 4 KiB at random from (`--small-read`).
    small_read: Option<String>,
    /// A new blob to write 4 KiB at random to, then delete (`--small-write`).
    small_write: Option<String>,
    /// Requests in flight for `--pass`, `--put-pass` and the small modes.
    parallelism: usize,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        seconds: 3.0,
        blob_bytes: 1 << 30,
        read: None,
        pass: None,
        put_pass: None,
        small_read: None,
        small_write: None,
        parallelism: 4,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--seconds" => args.seconds = value.parse().context("--seconds")?,
            "--blob-mib" => args.blob_bytes = value.parse::<u64>().context("--blob-mib")? << 20,
            "--read" => args.read = Some(value),
            "--pass" => args.pass = Some(value),
            "--put-pass" => args.put_pass = Some(value),
            "--small-read" => args.small_read = Some(value),
            "--small-write" => args.small_write = Some(value),
            "--parallelism" => {
                args.parallelism = value.parse().context("--parallelism")?;
                anyhow::ensure!(args.parallelism > 0, "--parallelism must be at least 1");
            }
            other => anyhow::bail!("unknown flag {other}"),
        }
    }
    Ok(args)
}

/// Runs `op` with `parallelism` workers for `seconds`; returns operations done.
async fn measure(
    client: &BlobClient,
    path: &BlobPath,
    op: Op,
    parallelism: usize,
    seconds: f64,
    blob_bytes: u64,
) -> anyhow::Result<(u64, Duration)> {
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let payload = Bytes::from(vec![0xa5u8; op.bytes() as usize]);
    let slots = blob_bytes / op.bytes();
    let start = Instant::now();
    let mut workers = Vec::new();
    for worker in 0..parallelism {
        let (client, path, done, payload) =
            (client.clone(), path.clone(), done.clone(), payload.clone());
        workers.push(tokio::spawn(async move {
            let mut i = worker as u64;
            while Instant::now() < deadline {
                let slot = match op {
                    Op::Get4K | Op::Put4K => rand::rng().random_range(0..slots),
                    _ => i % slots,
                };
                let offset = slot * op.bytes();
                let range = ByteRange::new(offset, offset + op.bytes());
                match op {
                    Op::Put4M | Op::Put4K => {
                        client
                            .put_pages(&path, offset, payload.clone(), None)
                            .await?
                    }
                    Op::Get4M | Op::Get4K => {
                        client.get_blob_range(&path, range).await?;
                    }
                }
                done.fetch_add(1, Ordering::Relaxed);
                i += parallelism as u64;
            }
            anyhow::Ok(())
        }));
    }
    for w in workers {
        w.await??;
    }
    Ok((done.load(Ordering::Relaxed), start.elapsed()))
}

async fn best(
    client: &BlobClient,
    path: &BlobPath,
    op: Op,
    args: &Args,
) -> anyhow::Result<serde_json::Value> {
    let mut levels = serde_json::Map::new();
    let (mut best_rate, mut best_level) = (0.0f64, 0usize);
    let mut qd32 = 0.0;
    for &p in &LEVELS {
        let (ops, elapsed) = measure(client, path, op, p, args.seconds, args.blob_bytes).await?;
        let per_sec = ops as f64 / elapsed.as_secs_f64();
        let rate = match op {
            Op::Get4K | Op::Put4K => per_sec,
            _ => per_sec * op.bytes() as f64 / (1 << 20) as f64,
        };
        levels.insert(
            p.to_string(),
            serde_json::json!((rate * 10.0).round() / 10.0),
        );
        if rate > best_rate {
            (best_rate, best_level) = (rate, p);
        }
        if p == 32 {
            qd32 = rate;
        }
    }
    Ok(serde_json::json!({
        "unit": if matches!(op, Op::Get4K | Op::Put4K) { "IOPS" } else { "MiB/s" },
        "best": (best_rate * 10.0).round() / 10.0,
        "best_parallelism": best_level,
        "at_32": (qd32 * 10.0).round() / 10.0,
        "by_parallelism": levels,
    }))
}

/// One pass over every 4 MiB slot of `path` that holds data, in order,
/// `parallelism` Gets in flight. Returns the bytes read, the Gets made and
/// the time the Gets took (the Get Page Ranges before them is not counted,
/// as a mount's is not part of a read).
async fn pass(
    client: &BlobClient,
    path: &BlobPath,
    parallelism: usize,
) -> anyhow::Result<(u64, usize, Duration)> {
    let list = client.get_page_ranges(path, None).await?;
    // The daemon's read-ahead step: one Get per 4 MiB slot.
    let step = MAX_GET_BYTES;
    let mut slots: Vec<u64> = Vec::new();
    for r in &list.ranges {
        for slot in r.start / step..r.end.div_ceil(step) {
            if slots.last() != Some(&slot) {
                slots.push(slot);
            }
        }
    }
    let (slots, next, bytes) = (
        Arc::new(slots),
        Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let size = list.blob_size_bytes;
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..parallelism {
        let (client, path, slots, next, bytes) = (
            client.clone(),
            path.clone(),
            slots.clone(),
            next.clone(),
            bytes.clone(),
        );
        workers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&slot) = slots.get(i) else { break };
                let range = ByteRange::new(slot * step, (slot * step + step).min(size));
                let body = client.get_blob_range(&path, range).await?;
                bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for w in workers {
        w.await??;
    }
    Ok((bytes.load(Ordering::Relaxed), slots.len(), start.elapsed()))
}

/// Writes a new page blob of `blob_bytes` at `path` (one left by an
/// interrupted run is replaced), every 4 MiB slot once, in order,
/// `parallelism` Put Pages in flight, of random bytes (as a file's data
/// would be: sixteen random bodies in turn, so the pass holds 64 MiB, not
/// the whole blob); returns Put Pages sent and the time.
async fn put_pass(
    client: &BlobClient,
    path: &BlobPath,
    blob_bytes: u64,
    parallelism: usize,
) -> anyhow::Result<(usize, Duration)> {
    use futures::stream::{self, StreamExt, TryStreamExt};
    let step = MAX_PUT_PAGE_BYTES;
    // Made before the clock starts: the pass times the backend, not `rand`.
    let bodies: Vec<Bytes> = (0..16)
        .map(|_| {
            let mut data = vec![0u8; step as usize];
            rand::rng().fill(&mut data[..]);
            Bytes::from(data)
        })
        .collect();
    let slots: Vec<(u64, Bytes)> = (0..blob_bytes.div_ceil(step))
        .map(|slot| {
            let len = step.min(blob_bytes - slot * step) as usize;
            (
                slot * step,
                bodies[slot as usize % bodies.len()].slice(..len),
            )
        })
        .collect();
    let puts = slots.len();
    let _ = client.delete_blob(path, true, None).await;
    client.create_page_blob(path, blob_bytes).await?;
    let start = Instant::now();
    stream::iter(slots)
        .map(|(offset, data)| async move { client.put_pages(path, offset, data, None).await })
        .buffer_unordered(parallelism)
        .try_collect::<Vec<()>>()
        .await?;
    Ok((puts, start.elapsed()))
}

/// Writes every 4 MiB slot once (16 in flight), so reads return stored data
/// rather than zeros the service elides.
async fn fill(client: &BlobClient, path: &BlobPath, blob_bytes: u64) -> anyhow::Result<()> {
    use futures::stream::{self, StreamExt, TryStreamExt};
    let payload = Bytes::from(vec![0x5au8; MAX_PUT_PAGE_BYTES as usize]);
    stream::iter((0..blob_bytes).step_by(MAX_PUT_PAGE_BYTES as usize))
        .map(|offset| {
            let payload = payload.clone();
            async move { client.put_pages(path, offset, payload, None).await }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Prints one pass as JSON: MiB moved, its requests (`(name, count)`),
/// seconds, MiB/s and the parallelism.
fn print_pass(bytes: u64, requests: (&str, usize), took: Duration, parallelism: usize) {
    let mib = bytes as f64 / (1 << 20) as f64;
    let mut out = serde_json::json!({
        "mib": (mib * 10.0).round() / 10.0,
        "seconds": (took.as_secs_f64() * 1000.0).round() / 1000.0,
        "mibps": (mib / took.as_secs_f64() * 10.0).round() / 10.0,
        "parallelism": parallelism,
    });
    out[requests.0] = requests.1.into();
    println!("{out}");
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let account = Account::from_env(None)?;
    let client = BlobClient::new(account)?;
    if let Some(target) = &args.pass {
        let path = BlobPath::parse(target).context("--pass wants CONTAINER/BLOB")?;
        let (bytes, gets, took) = pass(&client, &path, args.parallelism).await?;
        print_pass(bytes, ("gets", gets), took, args.parallelism);
        return Ok(());
    }
    if let Some(target) = &args.put_pass {
        let path = BlobPath::parse(target).context("--put-pass wants CONTAINER/BLOB")?;
        let result = put_pass(&client, &path, args.blob_bytes, args.parallelism).await;
        let _ = client.delete_blob(&path, true, None).await;
        let (puts, took) = result?;
        print_pass(args.blob_bytes, ("puts", puts), took, args.parallelism);
        return Ok(());
    }
    let small = match (&args.small_read, &args.small_write) {
        (Some(t), _) => Some((t, Op::Get4K)),
        (None, Some(t)) => Some((t, Op::Put4K)),
        (None, None) => None,
    };
    if let Some((target, op)) = small {
        let path =
            BlobPath::parse(target).context("--small-read/--small-write want CONTAINER/BLOB")?;
        if matches!(op, Op::Put4K) {
            let _ = client.delete_blob(&path, true, None).await;
            client.create_page_blob(&path, args.blob_bytes).await?;
        }
        let result = measure(
            &client,
            &path,
            op,
            args.parallelism,
            args.seconds,
            args.blob_bytes,
        )
        .await;
        if matches!(op, Op::Put4K) {
            let _ = client.delete_blob(&path, true, None).await;
        }
        let (done, took) = result?;
        let iops = done as f64 / took.as_secs_f64();
        println!(
            "{}",
            serde_json::json!({
                "iops": (iops * 10.0).round() / 10.0,
                "requests": done,
                "seconds": (took.as_secs_f64() * 1000.0).round() / 1000.0,
                "parallelism": args.parallelism,
            })
        );
        return Ok(());
    }
    if let Some(target) = &args.read {
        let path = BlobPath::parse(target).context("--read wants CONTAINER/BLOB")?;
        let get = best(&client, &path, Op::Get4M, &args).await?;
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "get_4m": get }))?
        );
        return Ok(());
    }
    let container = format!(
        "ceiling-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    client.create_container(&container).await?;
    let path = BlobPath::new(&container, "ceiling.bin")?;
    let result = async {
        client.create_page_blob(&path, args.blob_bytes).await?;
        let put = best(&client, &path, Op::Put4M, &args).await?;
        let put_small = best(&client, &path, Op::Put4K, &args).await?;
        fill(&client, &path, args.blob_bytes).await?;
        let get = best(&client, &path, Op::Get4M, &args).await?;
        let small = best(&client, &path, Op::Get4K, &args).await?;
        anyhow::Ok(serde_json::json!({
            "put_4m": put,
            "put_4k": put_small,
            "get_4m": get,
            "get_4k": small,
            "seconds_per_level": args.seconds,
        }))
    }
    .await;
    let _ = client.delete_container(&container).await;
    println!("{}", serde_json::to_string_pretty(&result?)?);
    Ok(())
}
