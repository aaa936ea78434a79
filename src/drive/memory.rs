//! `MemoryStore`: an in-memory page blob implementing [`PageStore`], the
//! reference model for the drive's tests (and other layers' tests).
//!
//! It behaves like the service where the drive can tell: pages written with
//! update are stored (even zero ones) and reported by `page_ranges`; clear
//! removes them; ranges must be 512-aligned (416 `InvalidPageRange`) and
//! updates at most 4 MiB (413); leases follow the service's rules and error
//! codes (409 `LeaseAlreadyPresent`, 412 `LeaseIdMissing`, ...); snapshots
//! are read-only copies that cannot be leased; reads pinned to an ETag fail
//! with 412 `ConditionNotMet` once the contents changed; metadata and a copy
//! status (set by the test) are kept. It counts requests by kind
//! and can fail the next writes on demand, or delay reads and writes, for
//! fault and concurrency tests.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use super::store::{BlobState, PageStore};
use crate::blob::error::{Error, Result};
use crate::blob::CopyStatus;
use crate::units::{ByteRange, MAX_PUT_PAGE_BYTES, PAGE_SIZE};

const PAGE: usize = PAGE_SIZE as usize;

#[derive(Debug, Clone, PartialEq, Eq)]
enum LeaseState {
    Available,
    Leased(String),
    Broken,
}

struct State {
    size_bytes: u64,
    pages: BTreeMap<u64, Box<[u8; PAGE]>>,
    lease: LeaseState,
    /// Fail this many of the next writes (update or clear) with `fail_with`.
    fail_writes: u32,
    fail_with: Option<Error>,
    /// Fail this many of the next reads with `fail_reads_with`.
    fail_reads: u32,
    fail_reads_with: Option<Error>,
    write_delay: Duration,
    read_delay: Duration,
    /// Bumped by every change of the contents or metadata: the ETag.
    version: u64,
    metadata: BTreeMap<String, String>,
    copy_status: Option<CopyStatus>,
    /// The ETag reads are pinned to ([`PageStore::pin_reads`]).
    pinned: Option<String>,
}

/// Requests a [`MemoryStore`] has served, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreCounts {
    /// `read` calls.
    pub reads: u64,
    /// `write_pages` calls.
    pub writes: u64,
    /// `clear_pages` calls.
    pub clears: u64,
    /// `page_ranges` calls.
    pub page_ranges: u64,
    /// Lease calls (acquire, release, break).
    pub leases: u64,
    /// Bytes returned by reads.
    pub bytes_read: u64,
    /// Bytes received by writes.
    pub bytes_written: u64,
}

#[derive(Default)]
struct Meters {
    reads: AtomicU64,
    writes: AtomicU64,
    clears: AtomicU64,
    page_ranges: AtomicU64,
    leases: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
}

/// An in-memory page blob (or a read-only snapshot of one).
pub struct MemoryStore {
    state: Mutex<State>,
    meters: Meters,
    snapshot: bool,
    target: String,
    /// Random, so no two stores share an identity or an ETag.
    nonce: String,
}

impl MemoryStore {
    /// A new, all-zero page blob of `size_bytes` (a multiple of 512).
    pub fn new(size_bytes: u64) -> Self {
        assert!(
            size_bytes % PAGE_SIZE == 0,
            "page blob size must be a multiple of 512"
        );
        MemoryStore {
            state: Mutex::new(State {
                size_bytes,
                pages: BTreeMap::new(),
                lease: LeaseState::Available,
                fail_writes: 0,
                fail_with: None,
                fail_reads: 0,
                fail_reads_with: None,
                write_delay: Duration::ZERO,
                read_delay: Duration::ZERO,
                version: 0,
                metadata: BTreeMap::new(),
                copy_status: None,
                pinned: None,
            }),
            meters: Meters::default(),
            snapshot: false,
            target: "memory/blob".into(),
            nonce: uuid::Uuid::new_v4().to_string(),
        }
    }

    fn locked(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("memory store mutex poisoned")
    }

    /// A read-only copy of the current contents, like a blob snapshot.
    pub fn snapshot(&self) -> MemoryStore {
        let st = self.locked();
        MemoryStore {
            state: Mutex::new(State {
                size_bytes: st.size_bytes,
                pages: st.pages.clone(),
                lease: LeaseState::Available,
                fail_writes: 0,
                fail_with: None,
                fail_reads: 0,
                fail_reads_with: None,
                write_delay: Duration::ZERO,
                read_delay: Duration::ZERO,
                version: 0,
                metadata: BTreeMap::new(),
                copy_status: None,
                pinned: None,
            }),
            meters: Meters::default(),
            snapshot: true,
            target: format!("{}?snapshot", self.target),
            nonce: uuid::Uuid::new_v4().to_string(),
        }
    }

    /// Bytes that hold data (what Get Page Ranges would report).
    pub fn stored_bytes(&self) -> u64 {
        self.locked().pages.len() as u64 * PAGE_SIZE
    }

    /// The bytes of `range`, read directly (not counted).
    pub fn contents(&self, range: ByteRange) -> Vec<u8> {
        read_pages(&self.locked(), range)
    }

    /// A page blob holding a drive of `size_bytes` (a whole number of
    /// pages): all zeros, with a fixed VHD footer after them.
    pub fn with_drive(size_bytes: u64) -> Self {
        let store = MemoryStore::new(size_bytes + crate::units::VHD_FOOTER_BYTES);
        store.poke(
            size_bytes,
            &crate::vhd::Footer::new_fixed(size_bytes).to_bytes(),
        );
        store
    }

    /// Write bytes directly, bypassing leases and counters (test setup).
    pub fn poke(&self, offset_bytes: u64, data: &[u8]) {
        assert!(offset_bytes % PAGE_SIZE == 0 && data.len() % PAGE == 0);
        let mut st = self.locked();
        store_pages(&mut st, offset_bytes, data);
        st.version += 1;
    }

    /// Show `status` as the copy status of the blob (as a copy or restore
    /// into it would leave it), for tests.
    pub fn set_copy_status(&self, status: Option<CopyStatus>) {
        self.locked().copy_status = status;
    }

    /// The blob's metadata now.
    pub fn metadata(&self) -> BTreeMap<String, String> {
        self.locked().metadata.clone()
    }

    fn etag_of(&self, st: &State) -> String {
        format!("{}-{}", self.nonce, st.version)
    }

    /// The refusal of a read pinned to an ETag the blob no longer has.
    fn check_pinned(&self, op: &'static str, st: &State) -> Result<()> {
        match &st.pinned {
            Some(etag) if *etag != self.etag_of(st) => Err(self.err(
                op,
                412,
                "ConditionNotMet",
                "the condition specified using HTTP conditional header(s) is not met",
            )),
            _ => Ok(()),
        }
    }

    /// Requests served so far.
    pub fn counts(&self) -> StoreCounts {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let m = &self.meters;
        StoreCounts {
            reads: g(&m.reads),
            writes: g(&m.writes),
            clears: g(&m.clears),
            page_ranges: g(&m.page_ranges),
            leases: g(&m.leases),
            bytes_read: g(&m.bytes_read),
            bytes_written: g(&m.bytes_written),
        }
    }

    /// Fail the next `n` writes (updates and clears) with `error`.
    pub fn fail_next_writes(&self, n: u32, error: Error) {
        let mut st = self.locked();
        st.fail_writes = n;
        st.fail_with = Some(error);
    }

    /// Fail the next `n` reads with `error`.
    pub fn fail_next_reads(&self, n: u32, error: Error) {
        let mut st = self.locked();
        st.fail_reads = n;
        st.fail_reads_with = Some(error);
    }

    /// Delay every write by `delay` before it is applied (to hold uploads in
    /// flight in concurrency tests).
    pub fn set_write_delay(&self, delay: Duration) {
        self.locked().write_delay = delay;
    }

    /// Delay every read by `delay` (to hold fetches in flight).
    pub fn set_read_delay(&self, delay: Duration) {
        self.locked().read_delay = delay;
    }

    /// The lease id held, if any.
    pub fn lease_holder(&self) -> Option<String> {
        match &self.locked().lease {
            LeaseState::Leased(id) => Some(id.clone()),
            _ => None,
        }
    }

    fn err(&self, op: &'static str, status: u16, code: &str, msg: &str) -> Error {
        Error::service(op, self.target.clone(), status, Some(code.to_string()), msg)
    }

    fn check_aligned(&self, op: &'static str, st: &State, range: ByteRange) -> Result<()> {
        if range.start % PAGE_SIZE != 0
            || range.end % PAGE_SIZE != 0
            || range.end > st.size_bytes
            || range.is_empty()
        {
            return Err(self.err(op, 416, "InvalidPageRange", "the page range is invalid"));
        }
        Ok(())
    }

    /// Checks every write makes, in the service's order.
    fn check_write(&self, op: &'static str, st: &mut State, lease_id: Option<&str>) -> Result<()> {
        if st.fail_writes > 0 && !self.snapshot {
            st.fail_writes -= 1;
            if let Some(e) = &st.fail_with {
                return Err(e.clone());
            }
        }
        self.check_writer(op, st, lease_id)
    }

    /// A write's checks but the injected failures (which count page writes).
    fn check_writer(&self, op: &'static str, st: &State, lease_id: Option<&str>) -> Result<()> {
        if self.snapshot {
            return Err(self.err(
                op,
                400,
                "InvalidQueryParameterValue",
                "snapshots are read-only",
            ));
        }
        match (&st.lease, lease_id) {
            (LeaseState::Leased(_), None) => Err(self.err(
                op,
                412,
                "LeaseIdMissing",
                "there is currently a lease on the blob and no lease ID was specified",
            )),
            (LeaseState::Leased(held), Some(id)) if held != id => Err(self.err(
                op,
                412,
                "LeaseIdMismatchWithBlobOperation",
                "the lease ID specified did not match the lease ID for the blob",
            )),
            (LeaseState::Available | LeaseState::Broken, Some(_)) => Err(self.err(
                op,
                412,
                "LeaseNotPresentWithBlobOperation",
                "there is currently no lease on the blob",
            )),
            _ => Ok(()),
        }
    }

    async fn delay(&self) {
        let d = self.locked().write_delay;
        if !d.is_zero() {
            tokio::time::sleep(d).await;
        }
    }
}

fn read_pages(st: &State, range: ByteRange) -> Vec<u8> {
    let mut out = vec![0u8; range.len() as usize];
    if range.is_empty() {
        return out;
    }
    let first = range.start / PAGE_SIZE;
    let last = (range.end - 1) / PAGE_SIZE;
    for (&p, page) in st.pages.range(first..=last) {
        let page_start = p * PAGE_SIZE;
        let from = range.start.max(page_start);
        let to = range.end.min(page_start + PAGE_SIZE);
        out[(from - range.start) as usize..(to - range.start) as usize]
            .copy_from_slice(&page[(from - page_start) as usize..(to - page_start) as usize]);
    }
    out
}

fn store_pages(st: &mut State, offset_bytes: u64, data: &[u8]) {
    for (i, src) in data.chunks(PAGE).enumerate() {
        let mut page = Box::new([0u8; PAGE]);
        page.copy_from_slice(src);
        st.pages.insert(offset_bytes / PAGE_SIZE + i as u64, page);
    }
}

#[async_trait]
impl PageStore for MemoryStore {
    async fn size_bytes(&self) -> Result<u64> {
        Ok(self.locked().size_bytes)
    }

    fn cache_identity(&self) -> Option<String> {
        Some(format!("memory:{}", self.nonce))
    }

    async fn etag(&self) -> Result<Option<String>> {
        Ok(Some(self.etag_of(&self.locked())))
    }

    async fn state(&self) -> Result<BlobState> {
        let st = self.locked();
        Ok(BlobState {
            size_bytes: st.size_bytes,
            etag: Some(self.etag_of(&st)),
            copy_status: st.copy_status.clone(),
            metadata: st.metadata.clone(),
        })
    }

    async fn set_metadata_entry(
        &self,
        name: &str,
        value: Option<&str>,
        lease_id: Option<&str>,
    ) -> Result<()> {
        let mut st = self.locked();
        self.check_write("set metadata", &mut st, lease_id)?;
        match value {
            Some(v) => st.metadata.insert(name.to_string(), v.to_string()),
            None => st.metadata.remove(name),
        };
        st.version += 1;
        Ok(())
    }

    fn pin_reads(&self, etag: Option<&str>) {
        self.locked().pinned = etag.map(str::to_string);
    }

    async fn page_ranges(&self, within: ByteRange) -> Result<Vec<ByteRange>> {
        self.meters.page_ranges.fetch_add(1, Ordering::Relaxed);
        let st = self.locked();
        self.check_pinned("get page ranges", &st)?;
        let mut out: Vec<ByteRange> = Vec::new();
        if within.is_empty() {
            return Ok(out);
        }
        let first = within.start / PAGE_SIZE;
        let last = (within.end - 1) / PAGE_SIZE;
        for &p in st.pages.range(first..=last).map(|(p, _)| p) {
            let r = ByteRange::new(
                (p * PAGE_SIZE).max(within.start),
                ((p + 1) * PAGE_SIZE).min(within.end),
            );
            match out.last_mut() {
                Some(last) if last.end == r.start => last.end = r.end,
                _ => out.push(r),
            }
        }
        Ok(out)
    }

    async fn read(&self, range: ByteRange) -> Result<Bytes> {
        self.meters.reads.fetch_add(1, Ordering::Relaxed);
        let delay = self.locked().read_delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let mut st = self.locked();
        self.check_pinned("get blob", &st)?;
        if st.fail_reads > 0 {
            st.fail_reads -= 1;
            if let Some(e) = &st.fail_reads_with {
                return Err(e.clone());
            }
        }
        if range.end > st.size_bytes {
            return Err(self.err(
                "get blob",
                416,
                "InvalidRange",
                "the range is not satisfiable",
            ));
        }
        self.meters
            .bytes_read
            .fetch_add(range.len(), Ordering::Relaxed);
        Ok(Bytes::from(read_pages(&st, range)))
    }

    async fn write_pages(
        &self,
        offset_bytes: u64,
        data: Bytes,
        lease_id: Option<&str>,
    ) -> Result<()> {
        const OP: &str = "put page";
        self.meters.writes.fetch_add(1, Ordering::Relaxed);
        self.delay().await;
        let mut st = self.locked();
        self.check_write(OP, &mut st, lease_id)?;
        let range = ByteRange::new(offset_bytes, offset_bytes + data.len() as u64);
        self.check_aligned(OP, &st, range)?;
        if data.len() as u64 > MAX_PUT_PAGE_BYTES {
            return Err(self.err(
                OP,
                413,
                "RequestBodyTooLarge",
                "the request body is too large",
            ));
        }
        self.meters
            .bytes_written
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        store_pages(&mut st, offset_bytes, &data);
        st.version += 1;
        Ok(())
    }

    async fn fence_earlier_writes(&self, lease_id: Option<&str>) -> Result<()> {
        // Writes here land when called or never: nothing is in flight.
        let st = self.locked();
        self.check_writer("fence writes", &st, lease_id)
    }

    async fn clear_pages(&self, range: ByteRange, lease_id: Option<&str>) -> Result<()> {
        const OP: &str = "clear pages";
        self.meters.clears.fetch_add(1, Ordering::Relaxed);
        self.delay().await;
        let mut st = self.locked();
        self.check_write(OP, &mut st, lease_id)?;
        self.check_aligned(OP, &st, range)?;
        let doomed: Vec<u64> = st
            .pages
            .range(range.start / PAGE_SIZE..range.end / PAGE_SIZE)
            .map(|(p, _)| *p)
            .collect();
        for p in doomed {
            st.pages.remove(&p);
        }
        st.version += 1;
        Ok(())
    }

    async fn resize(&self, blob_size_bytes: u64, lease_id: Option<&str>) -> Result<()> {
        const OP: &str = "resize";
        self.delay().await;
        let mut st = self.locked();
        self.check_write(OP, &mut st, lease_id)?;
        if blob_size_bytes % PAGE_SIZE != 0 {
            return Err(self.err(
                OP,
                400,
                "InvalidHeaderValue",
                "size must be a multiple of 512",
            ));
        }
        let end_page = blob_size_bytes / PAGE_SIZE;
        st.pages.retain(|p, _| *p < end_page);
        st.size_bytes = blob_size_bytes;
        st.version += 1;
        Ok(())
    }

    async fn acquire_lease(&self, proposed_id: &str) -> Result<()> {
        const OP: &str = "acquire lease";
        self.meters.leases.fetch_add(1, Ordering::Relaxed);
        if self.snapshot {
            return Err(self.err(
                OP,
                400,
                "InvalidQueryParameterValue",
                "snapshots cannot be leased",
            ));
        }
        let mut st = self.locked();
        match &st.lease {
            LeaseState::Leased(held) if held != proposed_id => Err(self.err(
                OP,
                409,
                "LeaseAlreadyPresent",
                "there is already a lease present",
            )),
            _ => {
                st.lease = LeaseState::Leased(proposed_id.to_string());
                Ok(())
            }
        }
    }

    async fn release_lease(&self, lease_id: &str) -> Result<()> {
        const OP: &str = "release lease";
        self.meters.leases.fetch_add(1, Ordering::Relaxed);
        let mut st = self.locked();
        match &st.lease {
            LeaseState::Leased(held) if held == lease_id => {
                st.lease = LeaseState::Available;
                Ok(())
            }
            LeaseState::Leased(_) => Err(self.err(
                OP,
                409,
                "LeaseIdMismatchWithLeaseOperation",
                "the lease ID specified did not match the lease ID for the blob",
            )),
            _ => Err(self.err(
                OP,
                409,
                "LeaseNotPresentWithLeaseOperation",
                "there is currently no lease on the blob",
            )),
        }
    }

    async fn break_lease(&self) -> Result<()> {
        const OP: &str = "break lease";
        self.meters.leases.fetch_add(1, Ordering::Relaxed);
        let mut st = self.locked();
        match st.lease {
            LeaseState::Available => Err(self.err(
                OP,
                409,
                "LeaseNotPresentWithLeaseOperation",
                "there is currently no lease on the blob",
            )),
            _ => {
                st.lease = LeaseState::Broken;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn leases_behave_like_the_service() {
        let s = MemoryStore::new(4096);
        s.acquire_lease("a").await.unwrap();
        s.acquire_lease("a").await.unwrap();
        let e = s.acquire_lease("b").await.unwrap_err();
        assert!(e.is_lease_conflict(), "{e}");
        let data = Bytes::from(vec![1u8; 512]);
        let e = s.write_pages(0, data.clone(), None).await.unwrap_err();
        assert!(e.is_lease_lost() && e.status == Some(412), "{e}");
        s.write_pages(0, data.clone(), Some("a")).await.unwrap();
        s.break_lease().await.unwrap();
        let e = s.write_pages(0, data.clone(), Some("a")).await.unwrap_err();
        assert_eq!(e.code(), Some("LeaseNotPresentWithBlobOperation"));
        s.acquire_lease("b").await.unwrap();
        s.release_lease("b").await.unwrap();
        s.write_pages(0, data, None).await.unwrap();
    }

    #[tokio::test]
    async fn ranges_must_be_aligned_and_page_ranges_merge() {
        let s = MemoryStore::new(8192);
        let e = s
            .write_pages(100, Bytes::from(vec![1u8; 512]), None)
            .await
            .unwrap_err();
        assert_eq!(e.status, Some(416));
        s.write_pages(512, Bytes::from(vec![0u8; 1024]), None)
            .await
            .unwrap();
        s.write_pages(2048, Bytes::from(vec![2u8; 512]), None)
            .await
            .unwrap();
        s.write_pages(1536, Bytes::from(vec![3u8; 512]), None)
            .await
            .unwrap();
        let r = s.page_ranges(ByteRange::new(0, 8192)).await.unwrap();
        assert_eq!(r, vec![ByteRange::new(512, 2560)]);
        s.clear_pages(ByteRange::new(1024, 2048), None)
            .await
            .unwrap();
        let r = s.page_ranges(ByteRange::new(0, 8192)).await.unwrap();
        assert_eq!(
            r,
            vec![ByteRange::new(512, 1024), ByteRange::new(2048, 2560)]
        );
        assert_eq!(s.stored_bytes(), 1024);
        assert_eq!(&s.contents(ByteRange::new(2047, 2049))[..], &[0, 2]);
    }
}
