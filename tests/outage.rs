//! The drive engine on a bad network, over the real REST client and Azurite
//! behind a fault proxy: a write that lands after the client gave up on it
//! is fenced, an outage costs a bounded wait however many runs are dirty,
//! and a slow append stream is flushed within `flush_delay`. Byte checks read
//! the blob directly from Azurite (never through the proxy).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use blobdrive::blob::{BlobClient, BlobPath, RetryPolicy};
use blobdrive::drive::{BlobPageStore, Drive, DriveOptions, Mode};
use blobdrive::units::ByteRange;
use bytes::Bytes;
use common::fault_proxy::{FaultProxy, Rates};
use common::ContainerGuard;

const MIB: u64 = 1024 * 1024;

/// A client through `proxy` that gives up on an attempt after
/// `attempt_secs` and on a request after `total_secs`.
fn client_via(proxy: &FaultProxy, attempt_secs: u64, total_secs: u64) -> BlobClient {
    let mut account = common::account();
    account.endpoint = proxy.endpoint.clone();
    BlobClient::new(account)
        .expect("client builds")
        .with_retry(RetryPolicy {
            attempt_timeout: Duration::from_secs(attempt_secs),
            max_total: Duration::from_secs(total_secs),
            base_delay: Duration::from_millis(50),
            ..RetryPolicy::default()
        })
}

async fn open(client: &BlobClient, path: &BlobPath, flush_delay: Duration) -> Drive {
    Drive::open(
        Arc::new(BlobPageStore::new(client.clone(), path.clone())),
        DriveOptions {
            mode: Mode::ReadWrite,
            // Room for 256 scattered writes (a 256 KiB chunk each) without
            // a writer having to flush.
            cache_bytes: 256 * MIB,
            max_dirty_bytes: Some(128 * MIB),
            flush_delay,
            target: path.to_string(),
            ..DriveOptions::default()
        },
    )
    .await
    .expect("open the drive")
}

async fn blob_bytes(client: &BlobClient, path: &BlobPath, start: u64, len: u64) -> Vec<u8> {
    client
        .get_blob_range(path, ByteRange::new(start, start + len))
        .await
        .expect("read the blob")
        .to_vec()
}

/// How long a held request may take to reach Azurite once released. It
/// lands in a few seconds, but Azurite answers nothing while it sweeps
/// deleted data (by default every ten minutes of its life, listing every
/// extent in one go: minutes once a suite has written tens of thousands;
/// `scripts/test.sh` starts its Azurite with a longer interval, an Azurite
/// started otherwise may not have one), and a request released then lands
/// only after: the tests wait for where it lands, not for how fast.
const LATE_LANDING: Duration = Duration::from_secs(300);

/// The hazard the fence exists for, shown without it: an unfenced Put Page
/// held past the client's give-up lands after a newer write and replaces it.
/// (If this stops happening, the proxy no longer reproduces late writes and
/// the fenced test below proves nothing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfenced_late_write_lands_over_newer_data() {
    let g = ContainerGuard::new("late-unfenced").await;
    let path = g.path("d.vhd");
    common::make_drive(&g.client, &path, 16 * MIB).await;
    let proxy = FaultProxy::start_random(&common::account().endpoint, Rates::none(), 1).await;
    let client = client_via(&proxy, 1, 10);
    proxy.land_late("comp=page", Duration::from_secs(3));
    let old = Bytes::from(vec![0xAA; 4096]);
    let new = Bytes::from(vec![0xBB; 4096]);
    // The first attempt is held; the retry lands at once.
    client
        .put_pages(&path, 0, old, None)
        .await
        .expect("put page (retried)");
    client
        .put_pages(&path, 0, new.clone(), None)
        .await
        .expect("newer put page");
    assert_eq!(blob_bytes(&g.client, &path, 0, 4096).await, new.to_vec());
    let status = proxy.late_landed(LATE_LANDING).await;
    assert_eq!(status, Some(201), "the held request reached Azurite");
    assert_eq!(
        blob_bytes(&g.client, &path, 0, 4096).await,
        vec![0xAA; 4096],
        "without a fence the late write replaced the newer data"
    );
}

/// The same sequence through the drive: its writes are fenced with the
/// blob's sequence number, so the late request is refused (412) and the
/// blob keeps the newer data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_lands_late_never_overwrites_newer_data() {
    let g = ContainerGuard::new("late-fenced").await;
    let path = g.path("d.vhd");
    common::make_drive(&g.client, &path, 16 * MIB).await;
    let proxy = FaultProxy::start_random(&common::account().endpoint, Rates::none(), 2).await;
    let client = client_via(&proxy, 1, 20);
    let drive = open(&client, &path, Duration::from_secs(3600)).await;
    let before = g
        .client
        .get_properties(&path)
        .await
        .unwrap()
        .sequence_number;

    proxy.land_late("x-ms-page-write: update", Duration::from_secs(4));
    drive.write_at(8192, &[0xAA; 4096]).await.unwrap();
    drive
        .flush()
        .await
        .expect("the retry after the give-up succeeds");
    drive.write_at(8192, &[0xBB; 4096]).await.unwrap();
    drive.flush().await.expect("the newer write succeeds");
    assert_eq!(
        blob_bytes(&g.client, &path, 8192, 4096).await,
        vec![0xBB; 4096]
    );

    let status = proxy.late_landed(LATE_LANDING).await;
    assert_eq!(
        status,
        Some(412),
        "the late request is refused by the fence"
    );
    assert_eq!(
        blob_bytes(&g.client, &path, 8192, 4096).await,
        vec![0xBB; 4096],
        "the blob holds the newer data"
    );
    let after = g
        .client
        .get_properties(&path)
        .await
        .unwrap()
        .sequence_number;
    assert!(
        after > before,
        "sequence number raised: {before:?} -> {after:?}"
    );
    drive.close().await.expect("close");
}

/// Storage black-holed with 256 scattered dirty runs: `flush` fails within
/// two retry budgets (before: every run spent its own budget, 32 budgets at
/// 8 in flight), nothing is lost, and the data goes out once storage answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_fails_flush_in_bounded_time_however_many_runs_are_dirty() {
    let g = ContainerGuard::new("outage-runs").await;
    let path = g.path("d.vhd");
    common::make_drive(&g.client, &path, 32 * MIB).await;
    let proxy = FaultProxy::start_random(&common::account().endpoint, Rates::none(), 3).await;
    let budget = 4;
    let client = client_via(&proxy, 2, budget);
    let drive = open(&client, &path, Duration::from_secs(3600)).await;
    let piece = |i: u64| vec![(i % 251) as u8 + 1; 4096];
    for i in 0..256u64 {
        drive.write_at(i * 128 * 1024, &piece(i)).await.unwrap();
    }
    assert_eq!(
        drive.unflushed_bytes(),
        256 * 4096,
        "all dirty before the outage"
    );
    proxy.hang_all(true);
    let started = Instant::now();
    let err = drive.flush().await.expect_err("flush while storage hangs");
    let took = started.elapsed();
    println!("flush of 256 runs on a black hole: failed after {took:.1?}: {err}");
    assert!(
        took < Duration::from_secs(2 * budget),
        "bounded by the budget ({budget} s), took {took:?}"
    );
    assert_eq!(drive.unflushed_bytes(), 256 * 4096, "nothing dropped");

    proxy.hang_all(false);
    // Storage answers again; a loaded machine may need more than one
    // short budget to get through.
    let mut tries = 0;
    while let Err(e) = drive.flush().await {
        tries += 1;
        assert!(tries < 5, "flush once storage answers: {e}");
    }
    for i in [0u64, 1, 100, 255] {
        assert_eq!(
            blob_bytes(&g.client, &path, i * 128 * 1024, 4096).await,
            piece(i)
        );
    }
    drive.close().await.expect("close");
}

/// 512-byte appends every 250 ms with no fsync: the first block is in the
/// blob within `flush_delay` + 1 s (the background flusher does not hold a
/// slow stream's head back for a 4 MiB boundary it will not reach for hours).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_appended_block_is_durable_within_flush_delay_without_fsync() {
    let g = ContainerGuard::new("append").await;
    let path = g.path("d.vhd");
    common::make_drive(&g.client, &path, 16 * MIB).await;
    let flush_delay = Duration::from_secs(1);
    let drive = Arc::new(open(&g.client, &path, flush_delay).await);
    let writer = {
        let drive = drive.clone();
        tokio::spawn(async move {
            for i in 0..40u64 {
                drive.write_at(i * 512, &[0x5A; 512]).await.unwrap();
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    let started = Instant::now();
    let durable_after = loop {
        if blob_bytes(&g.client, &path, 0, 512).await == vec![0x5A; 512] {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "the first block is still not in the blob after 8 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!("first appended block durable after {durable_after:.2?}");
    assert!(
        durable_after <= flush_delay + Duration::from_secs(1),
        "durable after {durable_after:?}"
    );
    writer.await.unwrap();
    drive.close().await.expect("close");
    assert_eq!(
        blob_bytes(&g.client, &path, 0, 40 * 512).await,
        vec![0x5A; 40 * 512]
    );
}
