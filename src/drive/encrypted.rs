//! `EncryptedStore`: a [`PageStore`] that encrypts every page written to the
//! store below it and decrypts every page read, for client-side encrypted
//! drives (AES-256-XTS, page number as the tweak; see `crate::crypt`).
//!
//! Clear Pages, page ranges, leases and the ETag pass through unchanged, so
//! the sparse map and discard work as on a plain drive: a page never written
//! or cleared reads as zeros without a request (the engine does not ask) and
//! without decryption (an all-zero page of ciphertext is a hole, so one read
//! along with data by a coalesced Get stays zero). The VHD footer, the last
//! 512 bytes of the blob, stays plaintext so the blob remains a valid VHD:
//! only pages below the data area's end are encrypted or decrypted.
//! Invariant: the engine must send all-zero plaintext pages it writes
//! (`writes_zero_pages`), since only their ciphertext reads back as zeros.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use super::store::PageStore;
use crate::blob::error::Result;
use crate::blob::BodySink;
use crate::buffers;
use crate::crypt::DataKey;
use crate::units::{ByteRange, PAGE_SIZE, VHD_FOOTER_BYTES};

/// Data area end not yet known (set by the first `size_bytes`).
const UNKNOWN: u64 = u64::MAX;

/// Ciphertext gathered from a streamed body before it is decrypted and
/// passed on: enough pages that one cipher context serves many.
const STAGING_BYTES: usize = 64 * 1024;

/// A streamed body's pages on their way to the engine's sink: whole pages
/// are decrypted in `buf` and passed on; `next` is the body offset of
/// `buf`'s first byte.
struct Staging {
    buf: Vec<u8>,
    next: u64,
}

/// Encrypts the pages of the store below it.
pub struct EncryptedStore<S: PageStore + ?Sized> {
    inner: Arc<S>,
    key: Arc<DataKey>,
    /// End of the data area in bytes (blob size minus the footer).
    data_end_bytes: AtomicU64,
}

impl<S: PageStore + ?Sized> EncryptedStore<S> {
    /// `inner`'s pages encrypted with `key`.
    pub fn new(inner: Arc<S>, key: Arc<DataKey>) -> Self {
        EncryptedStore {
            inner,
            key,
            data_end_bytes: AtomicU64::new(UNKNOWN),
        }
    }

    /// The store below.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// `data` (whole pages from `offset_bytes`) as stored: the pages below
    /// `data_end` encrypted into a pooled buffer in one pass, the rest (the
    /// footer) copied as it is.
    fn encrypted(&self, offset_bytes: u64, data: &[u8], data_end: u64) -> Bytes {
        let n = (data_end.saturating_sub(offset_bytes) as usize).min(data.len());
        let mut buf = buffers::take(data.len());
        buf.resize(data.len(), 0);
        self.key
            .encrypt_pages_into(offset_bytes / PAGE_SIZE, &data[..n], &mut buf[..n]);
        buf[n..].copy_from_slice(&data[n..]);
        buffers::freeze(buf)
    }

    async fn data_end(&self) -> Result<u64> {
        match self.data_end_bytes.load(Ordering::Acquire) {
            UNKNOWN => self.size_bytes().await.map(|b| b - VHD_FOOTER_BYTES),
            end => Ok(end),
        }
    }
}

#[async_trait]
impl<S: PageStore + ?Sized> PageStore for EncryptedStore<S> {
    async fn size_bytes(&self) -> Result<u64> {
        let b = self.inner.size_bytes().await?;
        self.data_end_bytes
            .store(b.saturating_sub(VHD_FOOTER_BYTES), Ordering::Release);
        Ok(b)
    }

    fn cache_identity(&self) -> Option<String> {
        self.inner.cache_identity()
    }

    fn read_limit(&self) -> Option<usize> {
        self.inner.read_limit()
    }

    fn writes_zero_pages(&self) -> bool {
        true
    }

    fn as_stored(&self, offset_bytes: u64, data: Bytes) -> Bytes {
        let data_end = self.data_end_bytes.load(Ordering::Acquire);
        self.encrypted(offset_bytes, &data, data_end)
    }

    fn seals_pages(&self) -> bool {
        true
    }

    fn seal_pages(&self, pages: &[u64], buf: &mut [u8]) {
        // Data pages only: the engine's chunks never hold the footer.
        debug_assert!(pages
            .iter()
            .all(|&p| p < self.data_end_bytes.load(Ordering::Acquire) / PAGE_SIZE));
        self.key.encrypt_scattered(pages, buf);
    }

    fn open_pages(&self, pages: &[u64], buf: &mut [u8]) {
        self.key.decrypt_scattered(pages, buf);
    }

    async fn etag(&self) -> Result<Option<String>> {
        self.inner.etag().await
    }

    fn lineage_mark(&self) -> Option<crate::blob::Mark> {
        self.inner.lineage_mark()
    }

    fn record_lineage(&self, recorder: crate::blob::fence::MarkRecorder) {
        self.inner.record_lineage(recorder)
    }

    async fn resume_lineage(
        &self,
        lease_id: &str,
        mark: &crate::blob::Mark,
    ) -> std::result::Result<crate::blob::Standing, crate::blob::ResumeError> {
        self.inner.resume_lineage(lease_id, mark).await
    }

    async fn state_under_lease(&self, lease_id: &str) -> Result<crate::blob::Mark> {
        self.inner.state_under_lease(lease_id).await
    }

    async fn settle_lineage(&self, lease_id: &str) {
        self.inner.settle_lineage(lease_id).await
    }

    async fn state(&self) -> Result<super::store::BlobState> {
        let st = self.inner.state().await?;
        self.data_end_bytes.store(
            st.size_bytes.saturating_sub(VHD_FOOTER_BYTES),
            Ordering::Release,
        );
        Ok(st)
    }

    async fn set_metadata_entry(
        &self,
        name: &str,
        value: Option<&str>,
        lease_id: Option<&str>,
    ) -> Result<()> {
        self.inner.set_metadata_entry(name, value, lease_id).await
    }

    fn pin_reads(&self, etag: Option<&str>) {
        self.inner.pin_reads(etag)
    }

    async fn page_ranges(&self, within: ByteRange) -> Result<Vec<ByteRange>> {
        self.inner.page_ranges(within).await
    }

    async fn read(&self, range: ByteRange) -> Result<Bytes> {
        let data_end = self.data_end().await?;
        if range.start >= data_end {
            return self.inner.read(range).await; // the footer: plaintext
        }
        // Whole pages of the data area, decrypted, then cut to `range`.
        let start = range.start - range.start % PAGE_SIZE;
        let end = range.end.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let crypt_end = end.min(data_end);
        let raw = self.inner.read(ByteRange::new(start, end)).await?;
        // Into a pooled buffer (warm memory), then decrypted in place.
        let mut buf = buffers::take(raw.len());
        buf.extend_from_slice(&raw);
        drop(raw);
        let n = (crypt_end - start) as usize;
        self.key.decrypt_pages(start / PAGE_SIZE, &mut buf[..n]);
        let buf = buffers::freeze(buf);
        Ok(buf.slice((range.start - start) as usize..(range.end - start) as usize))
    }

    async fn read_into(&self, range: ByteRange, sink: BodySink<'_>) -> Result<Option<Duration>> {
        let data_end = self.data_end().await?;
        let aligned = range.start % PAGE_SIZE == 0 && range.end % PAGE_SIZE == 0;
        if range.start >= data_end {
            return self.inner.read_into(range, sink).await; // the footer: plaintext
        }
        if !aligned || range.end > data_end {
            // Not the engine's page-aligned fills: whole body, then decrypt.
            let body = self.read(range).await?;
            sink(0, &body);
            return Ok(None);
        }
        // Streamed: the ciphertext is gathered a few pages at a time, each
        // batch decrypted in place and passed on, so the bytes are copied
        // once on their way to the cache (as for a plain drive) instead of
        // through whole-body buffers.
        let len = range.len();
        let first_page = range.start / PAGE_SIZE;
        let staging = Mutex::new(Staging {
            buf: Vec::with_capacity(STAGING_BYTES),
            next: 0,
        });
        let pass_on = |st: &mut Staging, all: bool| {
            let whole = if all {
                st.buf.len()
            } else {
                st.buf.len() / PAGE_SIZE as usize * PAGE_SIZE as usize
            };
            if whole == 0 {
                return;
            }
            let page = first_page + st.next / PAGE_SIZE;
            self.key.decrypt_pages(page, &mut st.buf[..whole]);
            sink(st.next, &st.buf[..whole]);
            st.next += whole as u64;
            st.buf.drain(..whole);
        };
        let decrypting = |at: u64, part: &[u8]| {
            let mut st = staging.lock().expect("staging mutex poisoned");
            if at == 0 && (st.next > 0 || !st.buf.is_empty()) {
                // A retried request sends the body again from the start.
                st.buf.clear();
                st.next = 0;
            }
            // Parts come in order; skip what was already taken and what
            // lies past the range (a failed answer, retried).
            let have = st.next + st.buf.len() as u64;
            let skip = have.saturating_sub(at).min(part.len() as u64) as usize;
            let take = (len.saturating_sub(at + skip as u64) as usize).min(part.len() - skip);
            st.buf.extend_from_slice(&part[skip..skip + take]);
            if st.buf.len() >= STAGING_BYTES {
                pass_on(&mut st, false);
            }
        };
        let took = self.inner.read_into(range, &decrypting).await?;
        let mut st = staging.lock().expect("staging mutex poisoned");
        pass_on(&mut st, true);
        Ok(took)
    }

    async fn read_stored(&self, range: ByteRange) -> Result<Bytes> {
        self.inner.read_stored(range).await
    }

    async fn resize(&self, blob_size_bytes: u64, lease_id: Option<&str>) -> Result<()> {
        self.inner.resize(blob_size_bytes, lease_id).await?;
        // Pages up to the new footer are data now, encrypted like the rest
        // (the footer a grow writes next lies at or past this end: plaintext).
        self.data_end_bytes.store(
            blob_size_bytes.saturating_sub(VHD_FOOTER_BYTES),
            Ordering::Release,
        );
        Ok(())
    }

    async fn write_pages(
        &self,
        offset_bytes: u64,
        data: Bytes,
        lease_id: Option<&str>,
    ) -> Result<()> {
        let data_end = self.data_end().await?;
        let sealed = self.encrypted(offset_bytes, &data, data_end);
        drop(data);
        self.inner.write_pages(offset_bytes, sealed, lease_id).await
    }

    async fn clear_pages(&self, range: ByteRange, lease_id: Option<&str>) -> Result<()> {
        self.inner.clear_pages(range, lease_id).await
    }

    async fn fence_earlier_writes(&self, lease_id: Option<&str>) -> Result<()> {
        self.inner.fence_earlier_writes(lease_id).await
    }

    async fn acquire_lease(&self, proposed_id: &str) -> Result<()> {
        self.inner.acquire_lease(proposed_id).await
    }

    async fn release_lease(&self, lease_id: &str) -> Result<()> {
        self.inner.release_lease(lease_id).await
    }

    fn retry_budget(&self) -> std::time::Duration {
        self.inner.retry_budget()
    }

    async fn break_lease(&self) -> Result<()> {
        self.inner.break_lease().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drive::{Drive, DriveOptions, MemoryStore};
    use crate::vhd::Footer;

    const DATA: u64 = 4 << 20;

    async fn open() -> (Arc<MemoryStore>, Arc<DataKey>, Drive) {
        let mem = Arc::new(MemoryStore::with_drive(DATA));
        let key = Arc::new(DataKey::generate());
        let store = Arc::new(EncryptedStore::new(mem.clone(), key.clone()));
        let drive = Drive::open(store, DriveOptions::default()).await.unwrap();
        (mem, key, drive)
    }

    #[tokio::test]
    async fn written_zero_pages_are_sent_as_ciphertext_and_discards_read_as_zeros_without_a_get() {
        let (mem, key, drive) = open().await;
        let mut data = vec![0u8; 4096];
        data[..7].copy_from_slice(b"MARKER!");
        drive.write_at(0, &data).await.unwrap();
        drive.write_at(8192, &[0u8; 1024]).await.unwrap();
        drive.flush().await.unwrap();
        // Every written page is stored, the zero ones included, as ciphertext.
        assert_eq!(mem.stored_bytes(), 4096 + 1024 + VHD_FOOTER_BYTES);
        let raw = mem.contents(ByteRange::new(0, 9216));
        assert!(!raw.windows(7).any(|w| w == b"MARKER!"));
        assert!(
            raw[8192..].iter().any(|&b| b != 0),
            "a zero page is encrypted, not elided"
        );
        let mut plain = raw.clone();
        key.decrypt_pages(0, &mut plain);
        assert_eq!(&plain[..4096], &data[..]);
        assert!(plain[4096..].iter().all(|&b| b == 0));
        // The footer stays plaintext.
        assert_eq!(
            &mem.contents(ByteRange::new(DATA, DATA + 8))[..],
            b"conectix"
        );

        // Unflushed pages (for a recovery file) come out as ciphertext.
        drive.write_at(0, &data).await.unwrap();
        let unflushed = drive.unflushed_data();
        assert_eq!(unflushed.len(), 1);
        let (at, bytes) = &unflushed[0];
        assert!(!bytes.windows(7).any(|w| w == b"MARKER!"));
        let mut back = bytes.to_vec();
        key.decrypt_pages(at / PAGE_SIZE, &mut back);
        assert_eq!(&back[..7], b"MARKER!");

        // A discard clears; the pages read back as zeros with no Get.
        drive.discard(0, 4096).await.unwrap();
        drive.close().await.unwrap();
        let store = Arc::new(EncryptedStore::new(mem.clone(), key.clone()));
        let drive = Drive::open(store, DriveOptions::default()).await.unwrap();
        let gets = drive.counters().get;
        assert_eq!(&drive.read_at(0, 4096).await.unwrap()[..], &[0u8; 4096][..]);
        assert_eq!(
            drive.counters().get,
            gets,
            "a cleared range needs no request"
        );
        let back = drive.read_at(8192, 1024).await.unwrap();
        assert!(back.iter().all(|&b| b == 0));
        drive.close().await.unwrap();
    }

    #[tokio::test]
    async fn an_encrypted_drive_grows_with_a_plaintext_footer_and_encrypted_new_pages() {
        let (mem, key, drive) = open().await;
        // A grow cut after the blob grew (its intent recorded first): the
        // old footer (plaintext) is found inside what is now the data area.
        drive.close().await.unwrap();
        let intent = crate::drive::resize::GrowIntent {
            from_bytes: DATA,
            to_bytes: 2 * DATA,
        };
        mem.set_metadata_entry(
            crate::drive::resize::GROW_METADATA,
            Some(&intent.to_metadata()),
            None,
        )
        .await
        .unwrap();
        mem.resize(2 * DATA + VHD_FOOTER_BYTES, None).await.unwrap();
        let store = Arc::new(EncryptedStore::new(mem.clone(), key.clone()));
        let drive = Drive::open(store, DriveOptions::default()).await.unwrap();
        assert_eq!(drive.size_bytes(), DATA, "opens at its old size");
        drive.grow(2 * DATA).await.unwrap();
        drive.write_at(DATA, b"NEWAREA!").await.unwrap();
        drive.close().await.unwrap();
        let footer = mem.contents(ByteRange::new(2 * DATA, 2 * DATA + VHD_FOOTER_BYTES));
        let footer: [u8; 512] = footer.try_into().unwrap();
        assert!(Footer::parse(&footer, 2 * DATA + VHD_FOOTER_BYTES).is_ok());
        let raw = mem.contents(ByteRange::new(DATA, DATA + 512));
        assert!(
            !raw.windows(8).any(|w| w == b"NEWAREA!"),
            "new pages are encrypted"
        );
        let store = Arc::new(EncryptedStore::new(mem.clone(), key.clone()));
        let again = Drive::open(store, DriveOptions::default()).await.unwrap();
        assert_eq!(again.size_bytes(), 2 * DATA);
        assert_eq!(&again.read_at(DATA, 8).await.unwrap()[..], b"NEWAREA!");
        again.close().await.unwrap();
    }

    /// A store that streams bodies in odd-sized parts and, once, starts a
    /// body over from offset 0 after 84,000 bytes, some already passed on
    /// (as a retried Get does).
    struct Streaming {
        mem: MemoryStore,
        restarted: std::sync::atomic::AtomicBool,
    }

    #[async_trait]
    impl PageStore for Streaming {
        async fn size_bytes(&self) -> Result<u64> {
            self.mem.size_bytes().await
        }
        async fn page_ranges(&self, within: ByteRange) -> Result<Vec<ByteRange>> {
            self.mem.page_ranges(within).await
        }
        async fn read(&self, range: ByteRange) -> Result<Bytes> {
            self.mem.read(range).await
        }
        async fn read_into(
            &self,
            range: ByteRange,
            sink: BodySink<'_>,
        ) -> Result<Option<Duration>> {
            let body = self.mem.read(range).await?;
            if !self.restarted.swap(true, Ordering::SeqCst) {
                for (i, part) in body.chunks(700).take(120).enumerate() {
                    sink(i as u64 * 700, part);
                }
            }
            for (i, part) in body.chunks(700).enumerate() {
                sink(i as u64 * 700, part);
            }
            Ok(None)
        }
        async fn write_pages(&self, at: u64, data: Bytes, lease: Option<&str>) -> Result<()> {
            self.mem.write_pages(at, data, lease).await
        }
        async fn clear_pages(&self, range: ByteRange, lease: Option<&str>) -> Result<()> {
            self.mem.clear_pages(range, lease).await
        }
        async fn fence_earlier_writes(&self, lease: Option<&str>) -> Result<()> {
            self.mem.fence_earlier_writes(lease).await
        }
        async fn resize(&self, size: u64, lease: Option<&str>) -> Result<()> {
            self.mem.resize(size, lease).await
        }
        async fn acquire_lease(&self, id: &str) -> Result<()> {
            self.mem.acquire_lease(id).await
        }
        async fn release_lease(&self, id: &str) -> Result<()> {
            self.mem.release_lease(id).await
        }
        async fn break_lease(&self) -> Result<()> {
            self.mem.break_lease().await
        }
    }

    #[tokio::test]
    async fn a_body_streamed_in_odd_parts_and_restarted_decrypts_to_what_was_written() {
        let key = Arc::new(DataKey::generate());
        let mem = MemoryStore::with_drive(DATA);
        let data: Vec<u8> = (0..300 * 1024u32).map(|i| (i % 251) as u8).collect();
        let mut sealed = data.clone();
        key.encrypt_pages(8, &mut sealed);
        mem.poke(8 * PAGE_SIZE, &sealed);
        let store = EncryptedStore::new(
            Arc::new(Streaming {
                mem,
                restarted: Default::default(),
            }),
            key,
        );
        let range = ByteRange::new(8 * PAGE_SIZE, 8 * PAGE_SIZE + data.len() as u64);
        let got = Mutex::new(vec![0u8; data.len()]);
        let parts = AtomicU64::new(0);
        let sink = |at: u64, part: &[u8]| {
            assert_eq!(at % PAGE_SIZE, 0, "whole pages reach the engine");
            parts.fetch_add(1, Ordering::SeqCst);
            got.lock().unwrap()[at as usize..at as usize + part.len()].copy_from_slice(part);
        };
        store.read_into(range, &sink).await.unwrap();
        assert!(*got.lock().unwrap() == data);
        assert!(parts.load(Ordering::SeqCst) > 1, "passed on in batches");
    }
    #[test]
    fn the_keyed_and_the_ciphertext_view_keep_separate_disk_tiers() {
        // The keyed view keeps holes as sealed zero pages: shown through the
        // ciphertext view of the same blob, they would read as noise where
        // the blob holds zeros.
        let mem = Arc::new(MemoryStore::new(DATA + VHD_FOOTER_BYTES));
        let keyed = EncryptedStore::new(mem.clone(), Arc::new(DataKey::generate()));
        use crate::drive::tier::tier_identity;
        let keyed_id = tier_identity(&keyed, true).unwrap();
        let ciphertext_id = tier_identity(mem.as_ref(), true).unwrap();
        let plain_id = tier_identity(mem.as_ref(), false).unwrap();
        assert_ne!(keyed_id, ciphertext_id);
        // Neither is the name an older version kept both views under.
        assert_ne!(keyed_id, plain_id);
        assert_ne!(ciphertext_id, plain_id);
        assert!(keyed_id.starts_with(&plain_id), "same blob, another view");
    }
}
