//! The drive engine through the service model (`service-model/`), over the
//! real REST client and Azurite: over a blob's caps the model answers 503
//! ServerBusy as the service does (its status, code and XML body, before
//! the request's body), and the engine retries until every page has
//! landed; nothing is lost and nothing fails. Byte checks read the blob
//! directly from Azurite (never through the model).

mod common;

use std::sync::Arc;
use std::time::Duration;

use blobdrive::blob::BlobClient;
use blobdrive::drive::{BlobPageStore, Drive, DriveOptions, Mode};
use blobdrive::units::ByteRange;
use common::ContainerGuard;
use service_model::{Profile, ServiceModel};

const MIB: u64 = 1024 * 1024;

/// A model in front of the test account's Azurite, and a client through it.
async fn through(profile: Profile) -> (ServiceModel, BlobClient) {
    let endpoint = common::account().endpoint;
    let upstream = format!(
        "{}:{}",
        endpoint.host_str().expect("the endpoint has a host"),
        endpoint.port_or_known_default().expect("and a port")
    );
    let model = ServiceModel::start("127.0.0.1:0".parse().unwrap(), &upstream, profile)
        .await
        .expect("the model starts");
    let mut account = common::account();
    account
        .endpoint
        .set_port(Some(model.addr().port()))
        .expect("an http endpoint takes a port");
    account
        .endpoint
        .set_host(Some("127.0.0.1"))
        .expect("an http endpoint takes a host");
    (model, BlobClient::new(account).expect("client builds"))
}

/// Requests and 503s the model counted so far.
fn counts(model: &ServiceModel) -> (u64, u64) {
    let s = model.stats();
    (s["requests"].as_u64().unwrap(), s["busy"].as_u64().unwrap())
}

/// 300 scattered 4 KiB writes flushed at once: 300 Put Pages, eight in
/// flight at first, against a blob allowed 100 requests/s with a queue of
/// 50 ms: rounds of eight overrun the queue and some Puts are answered 503.
/// The client's limit of page writes backs off (`blob/limiter.rs`): after
/// the first flush it is below where it started, so a second flush of 300
/// more sends fewer at once (its share of 503s is printed, not asserted:
/// 5-6.5% backed off against 9-13% at a fixed eight in flight is too
/// narrow a margin for a loaded machine). Both flushes succeed and every
/// page is in the blob.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_over_the_blob_caps_is_slowed_and_refused_but_every_page_lands() {
    let g = ContainerGuard::new("model-busy").await;
    let path = g.path("d.vhd");
    common::make_drive(&g.client, &path, 64 * MIB).await;
    let mut profile = Profile::named("standard").expect("standard exists");
    profile.blob.requests_per_s = Some(100.0);
    profile.queue_bound = Duration::from_millis(50);
    let (model, client) = through(profile).await;
    let drive = Drive::open(
        Arc::new(BlobPageStore::new(client.clone(), path.clone())),
        DriveOptions {
            mode: Mode::ReadWrite,
            cache_bytes: 256 * MIB,
            max_dirty_bytes: Some(128 * MIB),
            flush_delay: Duration::from_secs(3600),
            target: path.to_string(),
            ..DriveOptions::default()
        },
    )
    .await
    .expect("open the drive through the model");
    let pages: Vec<u64> = (0..600u64).map(|i| i * 100 * 1024).collect();
    let mut shares = Vec::new();
    let mut busy = Vec::new();
    let mut limits = Vec::new();
    for round in [0, 1] {
        let before = counts(&model);
        for (i, &offset) in pages.iter().enumerate().skip(round).step_by(2) {
            drive
                .write_at(offset, &[(i % 250) as u8 + 1; 4096])
                .await
                .expect("write");
        }
        drive
            .flush()
            .await
            .expect("the flush gets through the 503s");
        let after = counts(&model);
        let share = (after.1 - before.1) as f64 / (after.0 - before.0) as f64;
        eprintln!(
            "flush {round}: {} requests, 503 share {share:.3}, limit of page writes now {}",
            after.0 - before.0,
            client.concurrency_limits().0
        );
        shares.push(share);
        busy.push(after.1 - before.1);
        limits.push(client.concurrency_limits().0);
    }
    drive.close().await.expect("close");
    assert!(busy[0] > 0, "the first flush met 503s: {busy:?}");
    // A flush keeps at most eight Put Pages in flight, and the limit grows
    // only while half of it is in use, so once cut it stays at most 16.
    assert!(
        limits[0] < blobdrive::blob::limiter::INITIAL_LIMIT,
        "the 503s cut the limit of page writes: {limits:?} (503 shares {shares:?})"
    );
    let stats = model.stats();
    assert!(
        stats["busy"].as_u64().unwrap() > 0,
        "the caps refused some requests: {stats}"
    );
    assert!(
        stats["queued"].as_u64().unwrap() > 0,
        "and slowed others: {stats}"
    );
    for (i, &offset) in pages.iter().enumerate() {
        let got = g
            .client
            .get_blob_range(&path, ByteRange::new(offset, offset + 4096))
            .await
            .expect("read the blob");
        assert!(
            got.iter().all(|&b| b == (i % 250) as u8 + 1),
            "page {i} at {offset}"
        );
    }
    eprintln!("through the model: {stats}");
}

/// Read-ahead follows the link and the reader (`drive/link.rs`): through
/// the model of a standard blob (60 MiB/s, 5 ms), a cold sequential read
/// of 64 MiB in 1 MiB reads fetches at most 35% more than it read (the
/// window the link asks for is four 4 MiB steps, 25% more; a fixed 32 MiB
/// window fetched 50% more), and 256 random 4 KiB reads, eight at a time (as a
/// filesystem's mount and a database make), fetch no read-ahead at all:
/// what they fetch is what they read. Byte counts come from the drive's
/// counters (as `blobdrive stats` shows them), not from timing; and the
/// sequential read takes at most half as many Gets as it makes reads (read
/// ahead in 4 MiB steps), every byte as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_ahead_fetches_little_beyond_a_sequential_reader_and_nothing_for_a_random_one() {
    const SIZE: u64 = 112 * MIB;
    const READ: u64 = 64 * MIB;
    let g = ContainerGuard::new("model-readahead").await;
    let path = g.path("d.vhd");
    common::make_drive(&g.client, &path, SIZE).await;
    // Data everywhere (written straight to Azurite), so anything read ahead
    // is fetched, not elided as a hole.
    for at in (0..SIZE).step_by(4 * MIB as usize) {
        let body = vec![(at / MIB) as u8 | 1; 4 * MIB as usize];
        g.client
            .put_pages(&path, at, body.into(), None)
            .await
            .expect("fill the blob");
    }
    let (_model, client) = through(Profile::named("standard").expect("standard exists")).await;
    let drive = Drive::open(
        Arc::new(BlobPageStore::new(client, path.clone())),
        DriveOptions {
            mode: Mode::ReadOnly,
            target: path.to_string(),
            ..DriveOptions::default()
        },
    )
    .await
    .expect("open the drive through the model");

    // What the open read (the VHD footer).
    let opened = drive.counters().bytes_down;
    // Random 4 KiB reads (a fixed sequence, so the test never depends on
    // the draw), eight at a time.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut offsets = Vec::new();
    for _ in 0..256 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        offsets.push(x % (SIZE / 4096) * 4096);
    }
    for batch in offsets.chunks(8) {
        let reads = batch.iter().map(|&at| drive.read_at(at, 4096));
        for (got, &at) in futures::future::join_all(reads)
            .await
            .into_iter()
            .zip(batch)
        {
            let got = got.expect("random read");
            assert!(
                got.iter().all(|&b| b == (at / MIB / 4 * 4) as u8 | 1),
                "at {at}"
            );
        }
    }
    let random = drive.counters().bytes_down - opened;
    let read = offsets.len() as u64 * 4096;
    assert!(
        random <= read,
        "the random reader fetched {random} bytes for {read} read: read-ahead ran"
    );

    let gets_before = drive.counters().get;
    for at in (0..READ).step_by(MIB as usize) {
        let got = drive
            .read_at(at, MIB as usize)
            .await
            .expect("sequential read");
        let want = vec![(at / MIB / 4 * 4) as u8 | 1; MIB as usize];
        assert!(got[..] == want[..], "at {at}");
    }
    // Read-ahead still running when the reads end counts too: give it a
    // moment to land (more time can only raise the count).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let fetched = drive.counters().bytes_down - random - opened;
    let gets = drive.counters().get - gets_before;
    eprintln!(
        "sequential: fetched {:.1} MiB in {gets} Gets for {} MiB read",
        fetched as f64 / MIB as f64,
        READ / MIB
    );
    assert!(
        fetched * 20 <= READ * 27,
        "fetched {fetched} bytes for a sequential read of {READ}: more than 35% beyond"
    );
    // Read-ahead ran: the data came in 4 MiB steps (about 23 Gets), not
    // one Get per 1 MiB read (64).
    assert!(fetched >= READ, "fetched {fetched} of {READ}");
    assert!(
        gets <= READ / MIB / 2,
        "{gets} Gets for {} reads of 1 MiB: read-ahead did not run",
        READ / MIB
    );
    drive.close().await.expect("close");
}
