//! The Azure Blob REST client against the running Azurite: every operation,
//! leases, snapshots, sparse page ranges, listings with markers, special
//! names, cross-checks with the official Python SDK, faults and bad input.

mod common;

use std::time::{Duration, Instant};

use blobdrive::blob::{
    Account, BlobClient, BlobPath, BlobType, Credential, ErrorKind, LeaseDuration, LeaseState,
    LeaseStatus, ListBlobsOptions, RetryPolicy,
};
use blobdrive::drive::{BlobPageStore, PageStore};
use blobdrive::units::{ByteRange, MAX_PUT_PAGE_BYTES, PAGE_SIZE};
use bytes::Bytes;
use common::fault_proxy::{Fault, FaultProxy};
use common::{python, ContainerGuard};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

fn pattern(len: usize, seed: u8) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect::<Vec<_>>(),
    )
}

fn lease_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

// ---------------------------------------------------------------- containers

#[tokio::test]
async fn containers_are_created_once_listed_and_deleted() {
    let client = common::client().await;
    let name = common::unique_name("cont");
    assert!(client.create_container(&name).await.unwrap());
    assert!(
        !client.create_container(&name).await.unwrap(),
        "second create reports it existed"
    );
    let all = client.list_containers().await.unwrap();
    assert!(all.iter().any(|c| c.name == name));
    client.delete_container(&name).await.unwrap();
    let all = client.list_containers().await.unwrap();
    assert!(!all.iter().any(|c| c.name == name));
}

#[tokio::test]
async fn missing_container_is_404_container_not_found() {
    let client = common::client().await;
    let name = common::unique_name("missing");
    let e = client
        .list_blobs(&name, &ListBlobsOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.status, Some(404));
    assert_eq!(e.code(), Some("ContainerNotFound"));
    assert!(e.is_not_found());
    assert!(e.to_string().contains(&name), "{e}");
    let p = BlobPath::new(&name, "d.vhd").unwrap();
    let e = client.get_properties(&p).await.unwrap_err();
    assert!(e.is_not_found(), "{e}");
    let e = client.create_page_blob(&p, MIB).await.unwrap_err();
    assert_eq!(e.code(), Some("ContainerNotFound"), "{e}");
    let e = client.delete_container(&name).await.unwrap_err();
    assert!(e.is_not_found(), "{e}");
}

// ---------------------------------------------------------------- page blobs

#[tokio::test]
async fn page_blob_pages_are_written_read_and_cleared() {
    let g = ContainerGuard::new("pages").await;
    let p = g.path("disk.vhd");
    g.client.create_page_blob(&p, 4 * MIB).await.unwrap();
    let props = g.client.get_properties(&p).await.unwrap();
    assert_eq!(props.blob_type, Some(BlobType::PageBlob));
    assert_eq!(props.content_length, 4 * MIB);
    assert_eq!(props.lease_state, Some(LeaseState::Available));
    assert_eq!(props.lease_status, Some(LeaseStatus::Unlocked));
    assert!(props.etag.is_some() && props.last_modified.is_some());

    let data = pattern(8192, 7);
    g.client
        .put_pages(&p, MIB, data.clone(), None)
        .await
        .unwrap();
    assert_eq!(
        g.client
            .get_blob_range(&p, ByteRange::new(MIB, MIB + 8192))
            .await
            .unwrap(),
        data
    );
    // Unaligned reads are fine; untouched pages read as zeros.
    let got = g
        .client
        .get_blob_range(&p, ByteRange::new(MIB - 3, MIB + 5))
        .await
        .unwrap();
    assert_eq!(
        &got[..],
        &[0, 0, 0, data[0], data[1], data[2], data[3], data[4]]
    );
    assert!(g
        .client
        .get_blob_range(&p, ByteRange::new(10, 10))
        .await
        .unwrap()
        .is_empty());

    let ranges = g.client.get_page_ranges(&p, None).await.unwrap();
    assert_eq!(ranges.blob_size_bytes, 4 * MIB);
    assert_eq!(ranges.ranges, vec![ByteRange::new(MIB, MIB + 8192)]);

    g.client
        .clear_pages(&p, ByteRange::new(MIB + 512, MIB + 1024), None)
        .await
        .unwrap();
    let ranges = g.client.get_page_ranges(&p, None).await.unwrap();
    assert_eq!(
        ranges.ranges,
        vec![
            ByteRange::new(MIB, MIB + 512),
            ByteRange::new(MIB + 1024, MIB + 8192)
        ]
    );
    let got = g
        .client
        .get_blob_range(&p, ByteRange::new(MIB + 512, MIB + 1024))
        .await
        .unwrap();
    assert!(got.iter().all(|b| *b == 0));
    // A full 4 MiB Put Page is accepted.
    g.client
        .put_pages(&p, 0, pattern(MAX_PUT_PAGE_BYTES as usize, 1), None)
        .await
        .unwrap();
}

#[tokio::test]
async fn create_page_blob_never_replaces_an_existing_blob() {
    let g = ContainerGuard::new("noreplace").await;
    let p = g.path("disk.vhd");
    g.client.create_page_blob(&p, MIB).await.unwrap();
    g.client
        .put_pages(&p, 0, pattern(512, 3), None)
        .await
        .unwrap();
    let e = g.client.create_page_blob(&p, 2 * MIB).await.unwrap_err();
    assert!(e.is_already_exists(), "{e}");
    assert_eq!(e.code(), Some("BlobAlreadyExists"));
    assert_eq!(
        g.client.get_properties(&p).await.unwrap().content_length,
        MIB
    );
    assert_eq!(
        g.client
            .get_blob_range(&p, ByteRange::new(0, 512))
            .await
            .unwrap(),
        pattern(512, 3)
    );
    // Nor a block blob of the same name.
    let b = g.path("block");
    g.client
        .put_block_blob(&b, Bytes::from_static(b"hello"))
        .await
        .unwrap();
    assert!(g
        .client
        .create_page_blob(&b, MIB)
        .await
        .unwrap_err()
        .is_already_exists());
}

#[tokio::test]
async fn oversized_or_unaligned_put_page_is_refused_before_sending() {
    // An endpoint where nothing listens: any request sent would be a
    // transport error, so InvalidInput proves nothing was sent.
    let mut account = Account::development();
    account.endpoint = url::Url::parse("http://127.0.0.1:9/devstoreaccount1").unwrap();
    let client = BlobClient::new(account)
        .unwrap()
        .with_retry(RetryPolicy::none());
    let p = BlobPath::new("any", "disk.vhd").unwrap();
    let too_big = Bytes::from(vec![0u8; (MAX_PUT_PAGE_BYTES + PAGE_SIZE) as usize]);
    let e = client.put_pages(&p, 0, too_big, None).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("4 MiB"), "{e}");
    for (off, len) in [(1u64, 512usize), (0, 100), (512, 0)] {
        let e = client
            .put_pages(&p, off, Bytes::from(vec![0u8; len]), None)
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidInput, "{off}+{len}: {e}");
    }
    let e = client
        .clear_pages(&p, ByteRange::new(0, 100), None)
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidInput);
    let e = client.create_page_blob(&p, 1000).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidInput);
    let e = client.create_page_blob(&p, 16 * TIB).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidInput);
    assert_eq!(client.retries(), 0);
    // The same client does reach the network for a valid request.
    let e = client
        .put_pages(&p, 0, Bytes::from(vec![0u8; 512]), None)
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transport, "{e}");
}

#[tokio::test]
async fn sparse_1tib_blob_lists_only_written_pages() {
    let g = ContainerGuard::new("sparse").await;
    let p = g.path("big.vhd");
    g.client.create_page_blob(&p, TIB).await.unwrap();
    let writes = [0, 300 * GIB + 4096, TIB - 512];
    for (i, off) in writes.iter().enumerate() {
        g.client
            .put_pages(
                &p,
                *off,
                pattern(1024.min((TIB - off) as usize), i as u8),
                None,
            )
            .await
            .unwrap();
    }
    let expected = vec![
        ByteRange::new(0, 1024),
        ByteRange::new(300 * GIB + 4096, 300 * GIB + 5120),
        ByteRange::new(TIB - 512, TIB),
    ];
    let list = g.client.get_page_ranges(&p, None).await.unwrap();
    assert_eq!(list.blob_size_bytes, TIB);
    assert_eq!(list.ranges, expected);
    // One segment: only what lies in it.
    let list = g
        .client
        .get_page_ranges(&p, Some(ByteRange::new(300 * GIB, 301 * GIB)))
        .await
        .unwrap();
    assert_eq!(list.ranges, vec![expected[1]]);
    // The store's segmented query gives the same, clipped to what it is asked.
    let store = BlobPageStore::new(g.client.clone(), p.clone());
    let started = Instant::now();
    assert_eq!(
        store.page_ranges(ByteRange::new(0, TIB)).await.unwrap(),
        expected
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        store
            .page_ranges(ByteRange::new(512, 300 * GIB + 4608))
            .await
            .unwrap(),
        vec![
            ByteRange::new(512, 1024),
            ByteRange::new(300 * GIB + 4096, 300 * GIB + 4608)
        ]
    );
}

#[tokio::test]
async fn empty_8tib_blob_gives_its_ranges_in_well_under_a_second() {
    let g = ContainerGuard::new("empty8t").await;
    let p = g.path("huge.vhd");
    let size = blobdrive::units::MAX_PAGE_BLOB_BYTES;
    g.client.create_page_blob(&p, size).await.unwrap();
    let store = BlobPageStore::new(g.client.clone(), p);
    assert_eq!(store.size_bytes().await.unwrap(), size);
    let started = Instant::now();
    assert!(store
        .page_ranges(ByteRange::new(0, size))
        .await
        .unwrap()
        .is_empty());
    let took = started.elapsed();
    assert!(took < Duration::from_millis(800), "took {took:?}");
}

#[tokio::test]
async fn dense_pages_across_segment_borders_are_merged() {
    let g = ContainerGuard::new("dense").await;
    let p = g.path("d.vhd");
    g.client.create_page_blob(&p, GIB).await.unwrap();
    // Data straddling the 256 MiB border of the first segment.
    let border = blobdrive::drive::blob_store::FIRST_SEGMENT_BYTES;
    g.client
        .put_pages(&p, border - 1024, pattern(2048, 9), None)
        .await
        .unwrap();
    let store = BlobPageStore::new(g.client.clone(), p);
    assert_eq!(
        store.page_ranges(ByteRange::new(0, GIB)).await.unwrap(),
        vec![ByteRange::new(border - 1024, border + 1024)]
    );
    assert_eq!(
        store
            .read(ByteRange::new(border - 1024, border + 1024))
            .await
            .unwrap(),
        pattern(2048, 9)
    );
}

#[tokio::test]
async fn resize_and_metadata_and_block_blobs() {
    let g = ContainerGuard::new("props").await;
    let p = g.path("disk.vhd");
    g.client.create_page_blob(&p, MIB).await.unwrap();
    g.client.resize(&p, 3 * MIB, None).await.unwrap();
    assert_eq!(
        g.client.get_properties(&p).await.unwrap().content_length,
        3 * MIB
    );
    let md = vec![
        ("Owner".to_string(), "blobdrive test".to_string()),
        ("kind".into(), "vhd".into()),
    ];
    g.client.set_metadata(&p, &md, None).await.unwrap();
    let props = g.client.get_properties(&p).await.unwrap();
    assert_eq!(
        props.metadata.get("owner").map(String::as_str),
        Some("blobdrive test")
    );
    assert_eq!(props.metadata.get("kind").map(String::as_str), Some("vhd"));
    // Names whose canonical order is not byte order (`_` sorts first).
    let md: Vec<(String, String)> = ["_a", "a1", "a_b", "ab", "B"]
        .iter()
        .map(|n| (n.to_string(), format!("v{n}")))
        .collect();
    g.client.set_metadata(&p, &md, None).await.unwrap();
    let props = g.client.get_properties(&p).await.unwrap();
    assert_eq!(props.metadata.len(), 5, "{:?}", props.metadata);
    // A read-modify-write of the metadata: only at the ETag it was read at.
    let read_at = props.etag.clone().expect("an ETag");
    g.client
        .set_metadata_if_unchanged(&p, &[("first".into(), "1".into())], &read_at)
        .await
        .expect("unchanged since it was read");
    let e = g
        .client
        .set_metadata_if_unchanged(&p, &[("second".into(), "2".into())], &read_at)
        .await
        .expect_err("the first write changed the ETag");
    assert_eq!(e.code(), Some("ConditionNotMet"), "{e}");
    let props = g.client.get_properties(&p).await.unwrap();
    assert_eq!(
        props.metadata.get("first").map(String::as_str),
        Some("1"),
        "the overtaken write changed nothing"
    );
    g.client.set_metadata(&p, &md, None).await.unwrap();
    let e = g
        .client
        .set_metadata(&p, &[("bad-name".into(), "x".into())], None)
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidInput);
    let e = g.client.resize(&p, 1000, None).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidInput);

    let b = g.path("notes/readme.txt");
    g.client
        .put_block_blob(&b, Bytes::from_static(b"hello, world"))
        .await
        .unwrap();
    let props = g.client.get_properties(&b).await.unwrap();
    assert_eq!(props.blob_type, Some(BlobType::BlockBlob));
    assert_eq!(props.content_length, 12);
    assert_eq!(
        &g.client
            .get_blob_range(&b, ByteRange::new(7, 12))
            .await
            .unwrap()[..],
        b"world"
    );
    // Reading past the end is the service's 416, not a short success.
    let e = g
        .client
        .get_blob_range(&b, ByteRange::new(20, 30))
        .await
        .unwrap_err();
    assert_eq!(e.status, Some(416), "{e}");
}

// ---------------------------------------------------------------- leases

#[tokio::test]
async fn second_writer_is_refused_while_lease_held() {
    let g = ContainerGuard::new("lease").await;
    let p = g.path("disk.vhd");
    g.client.create_page_blob(&p, MIB).await.unwrap();
    let id = lease_id();
    assert_eq!(g.client.acquire_lease(&p, &id, None).await.unwrap(), id);
    let props = g.client.get_properties(&p).await.unwrap();
    assert_eq!(props.lease_state, Some(LeaseState::Leased));
    assert_eq!(props.lease_duration, Some(LeaseDuration::Infinite));

    // Without the lease id: refused, and it reads as "lease lost".
    let e = g
        .client
        .put_pages(&p, 0, pattern(512, 1), None)
        .await
        .unwrap_err();
    assert!(e.is_lease_lost(), "{e}");
    assert_eq!(e.code(), Some("LeaseIdMissing"));
    // With another id: refused too.
    let e = g
        .client
        .put_pages(&p, 0, pattern(512, 1), Some(&lease_id()))
        .await
        .unwrap_err();
    assert!(e.is_lease_lost(), "{e}");
    let e = g
        .client
        .clear_pages(&p, ByteRange::new(0, 512), None)
        .await
        .unwrap_err();
    assert!(e.is_lease_lost(), "{e}");
    let e = g.client.delete_blob(&p, true, None).await.unwrap_err();
    assert!(e.is_lease_lost(), "{e}");
    // With it: accepted.
    g.client
        .put_pages(&p, 0, pattern(512, 1), Some(&id))
        .await
        .unwrap();
    g.client
        .clear_pages(&p, ByteRange::new(512, 1024), Some(&id))
        .await
        .unwrap();
    g.client.resize(&p, 2 * MIB, Some(&id)).await.unwrap();
    g.client
        .set_metadata(&p, &[("a".into(), "b".into())], Some(&id))
        .await
        .unwrap();
    g.client.release_lease(&p, &id).await.unwrap();
    // Released: anyone may write.
    g.client
        .put_pages(&p, 0, pattern(512, 2), None)
        .await
        .unwrap();
}

#[tokio::test]
async fn acquire_with_same_id_is_idempotent_and_another_id_conflicts() {
    let g = ContainerGuard::new("lease2").await;
    let p = g.path("disk.vhd");
    g.client.create_page_blob(&p, MIB).await.unwrap();
    let id = lease_id();
    g.client.acquire_lease(&p, &id, None).await.unwrap();
    assert_eq!(g.client.acquire_lease(&p, &id, None).await.unwrap(), id);
    let e = g
        .client
        .acquire_lease(&p, &lease_id(), None)
        .await
        .unwrap_err();
    assert!(e.is_lease_conflict(), "{e}");
    assert_eq!(e.code(), Some("LeaseAlreadyPresent"));
    assert_eq!(e.status, Some(409));

    g.client.renew_lease(&p, &id).await.unwrap();
    let id2 = lease_id();
    assert_eq!(g.client.change_lease(&p, &id, &id2).await.unwrap(), id2);
    let e = g
        .client
        .put_pages(&p, 0, pattern(512, 1), Some(&id))
        .await
        .unwrap_err();
    assert!(e.is_lease_lost(), "old id after change: {e}");
    g.client
        .put_pages(&p, 0, pattern(512, 1), Some(&id2))
        .await
        .unwrap();
    let e = g.client.release_lease(&p, &id).await.unwrap_err();
    assert!(e.is_lease_conflict() || e.is_lease_lost(), "{e}");
    g.client.release_lease(&p, &id2).await.unwrap();
    // Fixed-duration leases are accepted; out-of-range durations are not sent.
    g.client.acquire_lease(&p, &id, Some(15)).await.unwrap();
    assert_eq!(
        g.client.get_properties(&p).await.unwrap().lease_duration,
        Some(LeaseDuration::Fixed)
    );
    let e = g.client.acquire_lease(&p, &id, Some(5)).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidInput);
    g.client.release_lease(&p, &id).await.unwrap();
}

#[tokio::test]
async fn a_break_makes_the_blob_leasable_again() {
    let g = ContainerGuard::new("break").await;
    let p = g.path("disk.vhd");
    g.client.create_page_blob(&p, MIB).await.unwrap();
    let stale = lease_id();
    g.client.acquire_lease(&p, &stale, None).await.unwrap();
    assert_eq!(g.client.break_lease(&p, Some(0)).await.unwrap(), 0);
    assert_eq!(
        g.client.get_properties(&p).await.unwrap().lease_state,
        Some(LeaseState::Broken)
    );
    // The old holder has lost it.
    let e = g
        .client
        .put_pages(&p, 0, pattern(512, 1), Some(&stale))
        .await
        .unwrap_err();
    assert!(e.is_lease_lost(), "{e}");
    let fresh = lease_id();
    g.client.acquire_lease(&p, &fresh, None).await.unwrap();
    g.client
        .put_pages(&p, 0, pattern(512, 1), Some(&fresh))
        .await
        .unwrap();
    // A break with a period leaves it "breaking" for that long.
    let left = g.client.break_lease(&p, Some(30)).await.unwrap();
    assert!((1..=30).contains(&left), "{left}");
    assert_eq!(
        g.client.get_properties(&p).await.unwrap().lease_state,
        Some(LeaseState::Breaking)
    );
    g.client.break_lease(&p, Some(0)).await.unwrap();
    g.client.acquire_lease(&p, &stale, None).await.unwrap();
    // Through the PageStore.
    let store = BlobPageStore::new(g.client.clone(), p.clone());
    store.break_lease().await.unwrap();
    store.acquire_lease(&fresh).await.unwrap();
    store.acquire_lease(&fresh).await.unwrap();
    store
        .write_pages(0, pattern(512, 4), Some(&fresh))
        .await
        .unwrap();
    assert!(store
        .write_pages(0, pattern(512, 4), None)
        .await
        .unwrap_err()
        .is_lease_lost());
    store.release_lease(&fresh).await.unwrap();
}

// ---------------------------------------------------------------- snapshots

#[tokio::test]
async fn snapshot_reads_return_old_bytes_after_the_base_changed() {
    let g = ContainerGuard::new("snap").await;
    let p = g.path("disk.vhd");
    g.client.create_page_blob(&p, MIB).await.unwrap();
    g.client
        .put_pages(&p, 4096, pattern(1024, 1), None)
        .await
        .unwrap();
    let t = g.client.snapshot(&p).await.unwrap();
    let snap = p.clone().with_snapshot(Some(&t));
    g.client
        .put_pages(&p, 4096, pattern(1024, 2), None)
        .await
        .unwrap();
    g.client
        .put_pages(&p, 0, pattern(512, 3), None)
        .await
        .unwrap();

    let r = ByteRange::new(4096, 5120);
    assert_eq!(
        g.client.get_blob_range(&snap, r).await.unwrap(),
        pattern(1024, 1)
    );
    assert_eq!(
        g.client.get_blob_range(&p, r).await.unwrap(),
        pattern(1024, 2)
    );
    assert_eq!(
        g.client.get_page_ranges(&snap, None).await.unwrap().ranges,
        vec![r]
    );
    assert_eq!(
        g.client
            .get_page_ranges(&p, None)
            .await
            .unwrap()
            .ranges
            .len(),
        2
    );
    assert_eq!(
        g.client.get_properties(&snap).await.unwrap().content_length,
        MIB
    );

    // Snapshots are read-only, refused before sending.
    for e in [
        g.client
            .put_pages(&snap, 0, pattern(512, 1), None)
            .await
            .unwrap_err(),
        g.client
            .acquire_lease(&snap, &lease_id(), None)
            .await
            .unwrap_err(),
        g.client.snapshot(&snap).await.unwrap_err(),
        g.client.resize(&snap, 2 * MIB, None).await.unwrap_err(),
    ] {
        assert_eq!(e.kind, ErrorKind::InvalidInput, "{e}");
    }
    let store = BlobPageStore::new(g.client.clone(), snap.clone());
    assert_eq!(store.read(r).await.unwrap(), pattern(1024, 1));
    assert_eq!(
        store.page_ranges(ByteRange::new(0, MIB)).await.unwrap(),
        vec![r]
    );
    for e in [
        store
            .write_pages(0, pattern(512, 1), None)
            .await
            .unwrap_err(),
        store
            .clear_pages(ByteRange::new(0, 512), None)
            .await
            .unwrap_err(),
        store.acquire_lease(&lease_id()).await.unwrap_err(),
        store.break_lease().await.unwrap_err(),
    ] {
        assert_eq!(e.kind, ErrorKind::InvalidInput, "{e}");
    }

    // The listing shows the snapshot; delete refuses to orphan it silently.
    let opts = ListBlobsOptions {
        include_snapshots: true,
        ..Default::default()
    };
    let listing = g.client.list_all_blobs(&g.name, &opts).await.unwrap();
    assert_eq!(listing.blobs.len(), 2);
    assert!(listing
        .blobs
        .iter()
        .any(|b| b.snapshot.as_deref() == Some(t.as_str())));
    let e = g.client.delete_blob(&p, false, None).await.unwrap_err();
    assert_eq!(e.code(), Some("SnapshotsPresent"), "{e}");
    // Deleting the one snapshot, then the base with all snapshots.
    let t2 = g.client.snapshot(&p).await.unwrap();
    g.client.delete_blob(&snap, false, None).await.unwrap();
    assert!(g
        .client
        .get_properties(&snap)
        .await
        .unwrap_err()
        .is_not_found());
    g.client.delete_blob(&p, true, None).await.unwrap();
    assert!(g
        .client
        .get_properties(&p.clone().with_snapshot(Some(&t2)))
        .await
        .unwrap_err()
        .is_not_found());
    assert!(g
        .client
        .list_all_blobs(&g.name, &opts)
        .await
        .unwrap()
        .blobs
        .is_empty());
}

// ---------------------------------------------------------------- listings and names

#[tokio::test]
async fn listing_follows_markers_prefixes_and_metadata() {
    let g = ContainerGuard::new("list").await;
    for i in 0..25 {
        let dir = if i % 2 == 0 { "even" } else { "odd" };
        g.client
            .put_block_blob(
                &g.path(&format!("{dir}/blob-{i:02}")),
                Bytes::from(vec![1u8; i]),
            )
            .await
            .unwrap();
    }
    let p = g.path("top.vhd");
    g.client.create_page_blob(&p, MIB).await.unwrap();
    g.client
        .set_metadata(&p, &[("role".into(), "disk".into())], None)
        .await
        .unwrap();

    let opts = ListBlobsOptions {
        max_results: Some(7),
        ..Default::default()
    };
    let first = g.client.list_blobs(&g.name, &opts).await.unwrap();
    assert_eq!(first.blobs.len(), 7);
    assert!(first.next_marker.is_some());
    let all = g.client.list_all_blobs(&g.name, &opts).await.unwrap();
    assert_eq!(all.blobs.len(), 26);
    let mut names: Vec<_> = all.blobs.iter().map(|b| b.name.clone()).collect();
    names.dedup();
    assert_eq!(names.len(), 26, "no page repeated or skipped");

    let opts = ListBlobsOptions {
        delimiter: Some("/".into()),
        include_metadata: true,
        max_results: Some(2),
        ..Default::default()
    };
    let top = g.client.list_all_blobs(&g.name, &opts).await.unwrap();
    assert_eq!(top.prefixes, vec!["even/".to_string(), "odd/".to_string()]);
    assert_eq!(top.blobs.len(), 1);
    let b = &top.blobs[0];
    assert_eq!(b.name, "top.vhd");
    assert_eq!(b.blob_type, Some(BlobType::PageBlob));
    assert_eq!(b.content_length, MIB);
    assert_eq!(b.metadata.get("role").map(String::as_str), Some("disk"));

    let opts = ListBlobsOptions {
        prefix: Some("odd/".into()),
        ..Default::default()
    };
    assert_eq!(
        g.client
            .list_all_blobs(&g.name, &opts)
            .await
            .unwrap()
            .blobs
            .len(),
        12
    );
}

const SPECIAL_NAMES: &[&str] = &[
    "a b.vhd",
    "dir/sub dir/x%20y+z#h?q=1&r.vhd",
    "ünïcødé/ディスク.vhd",
    "100%",
    "%2F",
    "~tilde'quote(paren)*!@$,;=[]",
];

#[tokio::test]
async fn names_with_special_characters_round_trip() {
    let g = ContainerGuard::new("names").await;
    for name in SPECIAL_NAMES {
        let p = g.path(name);
        g.client
            .create_page_blob(&p, MIB)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut page = name.as_bytes().to_vec();
        page.resize(512, b' ');
        g.client
            .put_pages(&p, 0, Bytes::from(page), None)
            .await
            .unwrap();
        let got = g
            .client
            .get_blob_range(&p, ByteRange::new(0, name.len() as u64))
            .await
            .unwrap();
        assert_eq!(&got[..], name.as_bytes());
        let id = lease_id();
        g.client.acquire_lease(&p, &id, None).await.unwrap();
        g.client.release_lease(&p, &id).await.unwrap();
        let t = g.client.snapshot(&p).await.unwrap();
        let snap = p.clone().with_snapshot(Some(&t));
        assert_eq!(
            g.client.get_properties(&snap).await.unwrap().content_length,
            MIB
        );
        assert_eq!(
            g.client
                .get_page_ranges(&snap, None)
                .await
                .unwrap()
                .ranges
                .len(),
            1
        );
    }
    let listing = g
        .client
        .list_all_blobs(&g.name, &ListBlobsOptions::default())
        .await
        .unwrap();
    let mut listed: Vec<_> = listing.blobs.iter().map(|b| b.name.as_str()).collect();
    let mut want = SPECIAL_NAMES.to_vec();
    listed.sort();
    want.sort();
    assert_eq!(listed, want);
    // A prefix with special characters is encoded once too.
    let opts = ListBlobsOptions {
        prefix: Some("dir/sub dir/x%20".into()),
        ..Default::default()
    };
    assert_eq!(
        g.client
            .list_all_blobs(&g.name, &opts)
            .await
            .unwrap()
            .blobs
            .len(),
        1
    );
    for name in SPECIAL_NAMES {
        g.client
            .delete_blob(&g.path(name), true, None)
            .await
            .unwrap();
    }
}

// ---------------------------------------------------------------- Python SDK cross-check

const PY_READ: &str = r#"
import os, sys, hashlib
from azure.storage.blob import BlobClient
b = BlobClient.from_connection_string(os.environ["CS"], sys.argv[1], sys.argv[2])
p = b.get_blob_properties()
data = b.download_blob(offset=int(sys.argv[3]), length=int(sys.argv[4])).readall()
ranges = b.get_page_ranges()[0] if p.blob_type == "PageBlob" else []
print(p.size, hashlib.sha256(data).hexdigest(), ";".join("%d-%d" % (r["start"], r["end"]) for r in ranges), p.lease.state, p.metadata.get("who", ""))
"#;

const PY_WRITE: &str = r#"
import os, sys
from azure.storage.blob import BlobClient
b = BlobClient.from_connection_string(os.environ["CS"], sys.argv[1], sys.argv[2])
b.create_page_blob(size=1024 * 1024, metadata={"who": "python"})
b.upload_page(bytes((i * 7 + 5) % 256 for i in range(4096)), offset=8192, length=4096)
print("ok")
"#;

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test]
async fn python_sdk_reads_what_we_wrote_and_we_read_what_it_wrote() {
    let g = ContainerGuard::new("python").await;
    for name in ["plain.vhd", "dir/sp ace+%20#?ü.vhd"] {
        // Ours -> Python.
        let p = g.path(name);
        g.client.create_page_blob(&p, 2 * MIB).await.unwrap();
        let data = pattern(8192, 42);
        g.client
            .put_pages(&p, MIB, data.clone(), None)
            .await
            .unwrap();
        g.client
            .set_metadata(&p, &[("who".into(), "rust".into())], None)
            .await
            .unwrap();
        let id = lease_id();
        g.client.acquire_lease(&p, &id, None).await.unwrap();
        let out = python(PY_READ, &[&g.name, name, &MIB.to_string(), "8192"]);
        assert_eq!(
            out,
            format!(
                "{} {} {}-{} leased rust",
                2 * MIB,
                sha256_hex(&data),
                MIB,
                MIB + 8191
            )
        );
        g.client.release_lease(&p, &id).await.unwrap();

        // Python -> ours.
        let q = g.path(&format!("py/{name}"));
        assert_eq!(python(PY_WRITE, &[&g.name, &q.name]), "ok");
        let props = g.client.get_properties(&q).await.unwrap();
        assert_eq!(props.content_length, MIB);
        assert_eq!(
            props.metadata.get("who").map(String::as_str),
            Some("python")
        );
        let want: Vec<u8> = (0..4096u32).map(|i| ((i * 7 + 5) % 256) as u8).collect();
        assert_eq!(
            &g.client
                .get_blob_range(&q, ByteRange::new(8192, 12288))
                .await
                .unwrap()[..],
            &want[..]
        );
        assert_eq!(
            g.client.get_page_ranges(&q, None).await.unwrap().ranges,
            vec![ByteRange::new(8192, 12288)]
        );
    }
}

const PY_SAS: &str = r#"
import os, sys, datetime
from azure.storage.blob import generate_container_sas, ContainerSasPermissions
cs = dict(kv.split("=", 1) for kv in os.environ["CS"].split(";") if kv)
print(generate_container_sas(cs["AccountName"], sys.argv[1], account_key=cs["AccountKey"],
    permission=ContainerSasPermissions(read=True, write=True, create=True, list=True, delete=True),
    expiry=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)))
"#;

#[tokio::test]
async fn sas_token_authorizes_without_leaking_its_signature() {
    let g = ContainerGuard::new("sas").await;
    let token = python(PY_SAS, &[&g.name]);
    let sig = token
        .split('&')
        .find_map(|kv| kv.strip_prefix("sig="))
        .expect("token has a sig")
        .to_string();
    let mut account = common::account();
    account.credential = Credential::Sas(token);
    assert!(!format!("{account:?}").contains(&sig));
    let client = BlobClient::new(account).unwrap();
    let p = g.path("sas dir/disk.vhd");
    client.create_page_blob(&p, MIB).await.unwrap();
    client
        .put_pages(&p, 0, pattern(512, 8), None)
        .await
        .unwrap();
    assert_eq!(
        client
            .get_blob_range(&p, ByteRange::new(0, 512))
            .await
            .unwrap(),
        pattern(512, 8)
    );
    let listing = client
        .list_all_blobs(&g.name, &ListBlobsOptions::default())
        .await
        .unwrap();
    assert_eq!(listing.blobs.len(), 1);
    // A container the token does not cover: refused, and the signature is not in the error.
    let e = client
        .list_blobs("other-container", &ListBlobsOptions::default())
        .await
        .unwrap_err();
    assert!(e.is_auth_failure(), "{e}");
    assert!(!e.to_string().contains(&sig) && !format!("{e:?}").contains(&sig));
}

// ---------------------------------------------------------------- faults

fn quick_policy() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 6,
        base_delay: Duration::from_millis(20),
        max_delay: Duration::from_millis(200),
        max_total: Duration::from_secs(5),
        attempt_timeout: Duration::from_secs(5),
    }
}

async fn proxied(fault: Fault, faults: u64, policy: RetryPolicy) -> (FaultProxy, BlobClient) {
    let mut account = common::account();
    let proxy = FaultProxy::start(&account.endpoint, fault, faults).await;
    account.endpoint = proxy.endpoint.clone();
    let client = BlobClient::new(account).unwrap().with_retry(policy);
    (proxy, client)
}

#[tokio::test]
async fn transient_faults_are_retried_until_success() {
    let g = ContainerGuard::new("faults").await;
    let p = g.path("disk.vhd");
    g.client.create_page_blob(&p, MIB).await.unwrap();
    for fault in [Fault::ServerBusy, Fault::Drop] {
        let (proxy, client) = proxied(fault, 3, quick_policy()).await;
        client
            .put_pages(&p, 0, pattern(4096, 5), None)
            .await
            .unwrap();
        assert_eq!(proxy.faulted(), 3, "{fault:?}");
        assert_eq!(client.retries(), 3, "{fault:?}");
        let (proxy, client) = proxied(fault, 2, quick_policy()).await;
        assert_eq!(
            client
                .get_blob_range(&p, ByteRange::new(0, 4096))
                .await
                .unwrap(),
            pattern(4096, 5)
        );
        assert_eq!((proxy.faulted(), client.retries()), (2, 2));
    }
    // A body shorter than the range asked for is never a success.
    let (proxy, client) = proxied(Fault::ShortBody, 2, quick_policy()).await;
    assert_eq!(
        client
            .get_blob_range(&p, ByteRange::new(0, 4096))
            .await
            .unwrap(),
        pattern(4096, 5)
    );
    assert_eq!(proxy.faulted(), 2);
    // A create retried after its answer was lost does not report a conflict
    // with itself... and a lease acquire retried is idempotent.
    let (_proxy, client) = proxied(Fault::Drop, 1, quick_policy()).await;
    let q = g.path("retried.vhd");
    client.create_page_blob(&q, MIB).await.unwrap();
    let (_proxy, client) = proxied(Fault::ServerBusy, 1, quick_policy()).await;
    let id = lease_id();
    client.acquire_lease(&q, &id, None).await.unwrap();
    client.release_lease(&q, &id).await.unwrap();
}

/// A ranged read retried after 503s reports the time of the attempt that
/// answered only, not the back-off before it: what the drive measures its
/// link's round trip from, and the back-off is the service asking for less.
#[tokio::test]
async fn a_retried_read_reports_its_answering_attempt_time_without_the_back_off() {
    let g = ContainerGuard::new("timed").await;
    let p = g.path("disk.vhd");
    g.client.create_page_blob(&p, MIB).await.unwrap();
    let policy = RetryPolicy {
        base_delay: Duration::from_millis(400),
        max_delay: Duration::from_secs(2),
        ..quick_policy()
    };
    let (proxy, client) = proxied(Fault::ServerBusy, 2, policy).await;
    let got = std::sync::Mutex::new(0u64);
    let sink = |at: u64, bytes: &[u8]| {
        let mut g = got.lock().unwrap();
        *g = (*g).max(at + bytes.len() as u64);
    };
    let started = Instant::now();
    let took = client
        .get_blob_range_into_if(&p, ByteRange::new(0, 4096), &sink, None)
        .await
        .unwrap();
    let elapsed = started.elapsed();
    assert_eq!((proxy.faulted(), *got.lock().unwrap()), (2, 4096));
    // The two back-offs are at least 200 ms and 400 ms.
    assert!(took > Duration::ZERO);
    assert!(
        took + Duration::from_millis(600) <= elapsed,
        "{took:?} of {elapsed:?}"
    );
}

#[tokio::test]
async fn persistent_faults_give_up_within_bounded_time_with_a_clear_error() {
    let g = ContainerGuard::new("giveup").await;
    let p = g.path("disk.vhd");
    g.client.create_page_blob(&p, MIB).await.unwrap();

    let (proxy, client) = proxied(Fault::ServerBusy, u64::MAX, quick_policy()).await;
    let started = Instant::now();
    let e = client
        .put_pages(&p, 0, pattern(512, 1), None)
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(e.status, Some(503));
    assert_eq!(e.code(), Some("ServerBusy"));
    assert!(e.is_transient());
    assert!(e.to_string().contains("gave up after 6 attempts"), "{e}");
    assert!(
        e.to_string().contains("put page") && e.to_string().contains("disk.vhd"),
        "{e}"
    );
    assert_eq!(proxy.faulted(), 6);

    // The time bound holds even when attempts remain.
    let policy = RetryPolicy {
        max_attempts: 1000,
        max_total: Duration::from_secs(1),
        ..quick_policy()
    };
    let (_proxy, client) = proxied(Fault::Drop, u64::MAX, policy).await;
    let started = Instant::now();
    let e = client.get_properties(&p).await.unwrap_err();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_eq!(e.kind, ErrorKind::Transport, "{e}");

    // A server that never answers does not hang the caller.
    let policy = RetryPolicy {
        max_attempts: 3,
        attempt_timeout: Duration::from_millis(300),
        max_total: Duration::from_secs(3),
        ..quick_policy()
    };
    let (_proxy, client) = proxied(Fault::Hang, u64::MAX, policy).await;
    let started = Instant::now();
    let e = client
        .get_blob_range(&p, ByteRange::new(0, 512))
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(e.to_string().contains("timed out"), "{e}");

    // 4xx are never retried.
    let (proxy, client) = proxied(Fault::ServerBusy, 0, quick_policy()).await;
    let e = client.get_properties(&g.path("absent")).await.unwrap_err();
    assert!(e.is_not_found());
    assert_eq!((proxy.seen(), client.retries()), (1, 0));
}

// ---------------------------------------------------------------- bad input

/// A server on loopback that answers every request with `answer` (status
/// line, headers and body, as bytes) and closes the connection; returns
/// the development account pointed at it.
async fn canned_server(answer: Vec<u8>) -> Account {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                // Read the request's head; its body (none here) is ignored.
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = conn.write_all(&answer).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    let mut account = Account::development();
    account.endpoint = format!("http://127.0.0.1:{port}/devstoreaccount1")
        .parse()
        .unwrap();
    account
}

#[tokio::test]
async fn an_announced_content_length_of_a_petabyte_is_not_allocated() {
    // A server (or a proxy in between) announcing 1 PiB and sending a few
    // bytes: the body's buffer was sized by the announcement, and the
    // failed allocation aborted the whole process.
    let pib = 1u64 << 50;
    let policy = RetryPolicy {
        max_attempts: 2,
        ..quick_policy()
    };
    let path = BlobPath::new("canned", "disk.vhd").unwrap();
    let mut get =
        format!("HTTP/1.1 206 Partial Content\r\nContent-Length: {pib}\r\n\r\n").into_bytes();
    get.extend_from_slice(&[7u8; 4096]);
    let client = BlobClient::new(canned_server(get).await)
        .unwrap()
        .with_retry(policy);
    let err = client
        .get_blob_range(&path, ByteRange::new(0, 4096))
        .await
        .expect_err("the body ended long before its announced length");
    assert_eq!(err.kind, ErrorKind::Transport, "{err}");

    let mut list = format!("HTTP/1.1 200 OK\r\nContent-Length: {pib}\r\n\r\n").into_bytes();
    list.extend_from_slice(b"<EnumerationResults><Blobs/></EnumerationResults>");
    let client = BlobClient::new(canned_server(list).await)
        .unwrap()
        .with_retry(policy);
    client
        .list_blobs("canned", &ListBlobsOptions::default())
        .await
        .expect_err("the body ended long before its announced length");

    // A body longer than the range asked for is refused as it arrives.
    let mut long = b"HTTP/1.1 206 Partial Content\r\nContent-Length: 8192\r\n\r\n".to_vec();
    long.extend_from_slice(&[7u8; 8192]);
    let client = BlobClient::new(canned_server(long).await)
        .unwrap()
        .with_retry(policy);
    let err = client
        .get_blob_range(&path, ByteRange::new(0, 4096))
        .await
        .expect_err("twice the bytes asked for");
    assert!(
        err.to_string().contains("runs past the 4096 bytes"),
        "{err}"
    );
}

#[tokio::test]
async fn wrong_key_is_refused_with_a_message_naming_the_account_not_the_key() {
    use base64::Engine as _;
    let mut account = common::account();
    let key = b"this is not the right key for the account at all!!".to_vec();
    let key_b64 = base64::engine::general_purpose::STANDARD.encode(&key);
    account.credential = Credential::SharedKey { key };
    let client = BlobClient::new(account.clone()).unwrap();
    let e = client.list_containers().await.unwrap_err();
    assert_eq!(e.status, Some(403));
    assert!(e.is_auth_failure());
    assert!(!e.is_transient());
    let shown = format!("{e} {e:?} {client:?} {account:?}");
    assert!(shown.contains(&account.name), "{shown}");
    assert!(shown.contains("key or SAS"), "{shown}");
    assert!(!shown.contains(&key_b64), "{shown}");
    assert!(!shown.contains(&key_b64[..16]), "{shown}");
    // Also for a blob operation.
    let e = client
        .get_properties(&BlobPath::new("abc", "d").unwrap())
        .await
        .unwrap_err();
    assert!(e.is_auth_failure(), "{e}");
    assert_eq!(client.retries(), 0);
}

#[test]
fn malformed_connection_string_and_invalid_names_give_one_clear_error() {
    let e = Account::from_connection_string("AccountName=x;this is not a pair").unwrap_err();
    assert_eq!(e.kind, ErrorKind::Config);
    assert!(e.to_string().contains("malformed connection string"), "{e}");
    let e = Account::from_connection_string("AccountName=acct1;AccountKey=%%%").unwrap_err();
    assert!(
        e.to_string().contains("not valid base64") && !e.to_string().contains("%%%"),
        "{e}"
    );
    for bad in ["Bad_Container/x", "c/", "ab/x", "abc/a/../b"] {
        let e = BlobPath::parse(bad).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidInput, "{bad}");
        assert!(e.to_string().contains("invalid"), "{e}");
    }
}

#[tokio::test]
async fn invalid_names_are_refused_before_sending() {
    let client = common::client().await;
    let e = client.create_container("Not_Valid").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidInput);
    let e = client
        .list_blobs("x", &ListBlobsOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidInput);
}

/// Everything the client logs at debug level and every error it returns,
/// for SAS and Shared Key accounts, through service errors and transport
/// faults (whose reqwest errors carry the URL), holds no key and no SAS
/// signature.
#[test]
fn keys_and_sas_signatures_never_reach_logs_or_errors() {
    use std::sync::{Arc, Mutex};
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let sig = "c2VjcmV0LXNpZ25hdHVyZS1kby1ub3QtbG9n";
    let key_b64 = blobdrive::blob::account::DEV_ACCOUNT_KEY;
    let errors = tracing::subscriber::with_default(subscriber, || {
        rt.block_on(async {
            let mut shown = Vec::new();
            let g = ContainerGuard::new("secrets").await;
            let p = g.path("d.vhd");
            g.client.create_page_blob(&p, MIB).await.unwrap();
            // Shared Key, service errors and a fault.
            shown.push(
                g.client
                    .get_properties(&g.path("absent"))
                    .await
                    .unwrap_err(),
            );
            let (_proxy, client) = proxied(Fault::Drop, u64::MAX, quick_policy()).await;
            shown.push(client.get_properties(&p).await.unwrap_err());
            // A (bogus) SAS: refused by the service, then through a dropping proxy.
            let mut account = common::account();
            account.credential = Credential::Sas(format!("sv=2021-12-02&sp=r&sig={sig}"));
            let client = BlobClient::new(account.clone()).unwrap();
            shown.push(client.get_properties(&p).await.unwrap_err());
            let proxy = FaultProxy::start(&account.endpoint, Fault::Drop, u64::MAX).await;
            account.endpoint = proxy.endpoint.clone();
            let client = BlobClient::new(account).unwrap().with_retry(quick_policy());
            shown.push(
                client
                    .get_blob_range(&p, ByteRange::new(0, 512))
                    .await
                    .unwrap_err(),
            );
            shown
        })
    });
    let log = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    assert!(
        log.contains("operation=\"get properties\""),
        "debug logging is on: {log}"
    );
    // Each answered request's line names the service's request id.
    assert!(log.contains("request_id="), "{log}");
    assert!(log.contains("retrying"), "{log}");
    for e in &errors {
        let text = format!("{e} {e:?}");
        assert!(!text.contains(sig) && !text.contains(key_b64), "{text}");
    }
    assert!(errors[1].kind == ErrorKind::Transport && errors[3].kind == ErrorKind::Transport);
    for secret in [sig, key_b64, &key_b64[..20], "SharedKey devstoreaccount1:"] {
        assert!(!log.contains(secret), "{secret} in log:\n{log}");
    }
}
