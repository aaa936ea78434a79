//! A drive's size: growing an open drive in place, the footer moves of a
//! resize, and finding the footer of a drive whose resize was interrupted.
//!
//! The fixed VHD footer must be the blob's last 512 bytes, and the blob's
//! size and its last page cannot change in one request. So a grow goes:
//! resize the blob, write the new footer at the new end, then clear the old
//! footer page; a shrink writes the new footer inside the data area first,
//! then cuts the blob. Invariant: an interruption between any two steps
//! leaves a valid drive of the old or the new size. The one state whose last
//! page is not a footer (just after the blob grew) is recognised by
//! [`locate_footer`] from the intent the grow records before its first
//! change (metadata [`GROW_METADATA`], cleared once the new footer is in
//! place): the old footer is then at the recorded old size. Without a
//! record that fits the blob (another tool replaced the metadata, or grew
//! the blob), the old footer is the blob's last written page: nothing is
//! written past it until the new footer lands. A zero last page with
//! neither is not a drive.

use std::sync::atomic::Ordering;

use super::error::{Error, Result};
use super::extents::PageRange;
use super::store::PageStore;
use super::{Inner, Mode};
use crate::units::{ByteRange, MAX_PAGE_BLOB_BYTES, PAGE_SIZE, VHD_FOOTER_BYTES};
use crate::vhd::{chs_geometry, Footer};

/// Metadata name of a grow's recorded intent: `v1 from=OLD to=NEW` (sizes
/// of the data area in bytes), set before the blob grows and removed once
/// the new footer is written and the old one cleared.
pub const GROW_METADATA: &str = "blobdrivegrow";

/// A grow recorded in the blob's metadata: from a data area of `from_bytes`
/// to one of `to_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrowIntent {
    /// The data area before the grow: where the old footer is.
    pub from_bytes: u64,
    /// The data area the grow makes.
    pub to_bytes: u64,
}

impl GrowIntent {
    /// The metadata value.
    pub fn to_metadata(self) -> String {
        format!("v1 from={} to={}", self.from_bytes, self.to_bytes)
    }

    /// Parses a metadata value; `None` for anything but a `v1` intent.
    pub fn parse(value: &str) -> Option<GrowIntent> {
        let mut words = value.split_ascii_whitespace();
        if words.next() != Some("v1") {
            return None;
        }
        let (mut from, mut to) = (None, None);
        for w in words {
            match w.split_once('=') {
                Some(("from", v)) => from = v.parse().ok(),
                Some(("to", v)) => to = v.parse().ok(),
                _ => {}
            }
        }
        Some(GrowIntent {
            from_bytes: from?,
            to_bytes: to?,
        })
    }

    /// The intent recorded in `metadata`, if any.
    pub fn of(metadata: &std::collections::BTreeMap<String, String>) -> Option<GrowIntent> {
        metadata.get(GROW_METADATA).and_then(|v| Self::parse(v))
    }
}

/// Where a drive's footer was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocatedFooter {
    /// The footer.
    pub footer: Footer,
    /// Its offset: the size of the data area.
    pub offset_bytes: u64,
    /// True when it is not at the end of the blob: a grow was interrupted
    /// after the blob grew; the drive is the old size until a resize ends it.
    pub interrupted_grow: bool,
    /// True (with `interrupted_grow`) when no grow intent of ours explains
    /// the larger blob (another tool replaced the metadata, or grew the
    /// blob): the footer was found as the blob's last written page.
    pub intent_lost: bool,
}

impl LocatedFooter {
    /// The one line saying what a drive found inside a larger blob is and
    /// what finishes it; `None` for a footer at the end.
    pub fn unfinished_grow_line(&self, drive: &str) -> Option<String> {
        if !self.interrupted_grow {
            return None;
        }
        let why = if self.intent_lost {
            "its grow record is gone (another tool replaced the metadata, or grew the blob)"
        } else {
            "a resize was interrupted"
        };
        Some(format!(
            "the blob of {drive} is larger than the drive ({why}): it is the drive of {} bytes; \
             'blobdrive resize {drive} --size {}' or a larger resize finishes it",
            self.offset_bytes, self.offset_bytes
        ))
    }
}

fn footer_at(raw: &[u8], blob_bytes: u64) -> std::result::Result<Footer, crate::vhd::Error> {
    let mut page = [0u8; 512];
    page.copy_from_slice(&raw[..512]);
    Footer::parse(&page, blob_bytes)
}

/// Reads the footer of the drive in `store` (a blob of `blob_bytes`): at the
/// end or, when the last page is all zeros (a grow interrupted before its
/// new footer), at the old size: the one a grow intent ([`GROW_METADATA`])
/// recorded, if it matches this blob, else the blob's last written page
/// (Get Page Ranges) when that page is a footer of its own offset. A zero
/// last page with neither is not a drive.
pub async fn locate_footer(store: &dyn PageStore, blob_bytes: u64) -> Result<LocatedFooter> {
    if blob_bytes % PAGE_SIZE != 0
        || blob_bytes <= VHD_FOOTER_BYTES
        || blob_bytes > MAX_PAGE_BLOB_BYTES
    {
        return Err(Error::NotADrive {
            reason: format!("blob size {blob_bytes} is not a page blob holding a VHD"),
        });
    }
    let tail = store
        .read_stored(ByteRange::new(blob_bytes - VHD_FOOTER_BYTES, blob_bytes))
        .await?;
    let err = match footer_at(&tail, blob_bytes) {
        Ok(footer) => {
            return Ok(LocatedFooter {
                footer,
                offset_bytes: blob_bytes - VHD_FOOTER_BYTES,
                interrupted_grow: false,
                intent_lost: false,
            })
        }
        Err(e) => e,
    };
    let not_a_drive = || Error::NotADrive {
        reason: err.to_string(),
    };
    if tail.iter().any(|b| *b != 0) {
        return Err(not_a_drive());
    }
    // The recorded intent, when it is of this blob: grown to its `to`.
    let intent = GrowIntent::of(&store.state().await?.metadata)
        .filter(|i| i.to_bytes.checked_add(VHD_FOOTER_BYTES) == Some(blob_bytes));
    if let Some(intent) = intent {
        if let Some(footer) = old_footer(store, intent.from_bytes, blob_bytes).await? {
            return Ok(LocatedFooter {
                footer,
                offset_bytes: intent.from_bytes,
                interrupted_grow: true,
                intent_lost: false,
            });
        }
    }
    // No usable record: the old footer is the last page anyone wrote (a
    // grow leaves nothing written past it until its new footer lands).
    let written = store
        .page_ranges(ByteRange::new(0, blob_bytes - VHD_FOOTER_BYTES))
        .await?;
    let Some(last_end) = written.last().map(|r| r.end) else {
        return Err(not_a_drive());
    };
    let Some(from) = last_end.checked_sub(VHD_FOOTER_BYTES) else {
        return Err(not_a_drive());
    };
    match old_footer(store, from, blob_bytes).await? {
        Some(footer) => Ok(LocatedFooter {
            footer,
            offset_bytes: from,
            interrupted_grow: true,
            intent_lost: intent.is_none(),
        }),
        None => Err(not_a_drive()),
    }
}

/// The footer of a drive of `from` bytes inside a larger blob of
/// `blob_bytes`, if the page at `from` holds one (its current size `from`).
async fn old_footer(store: &dyn PageStore, from: u64, blob_bytes: u64) -> Result<Option<Footer>> {
    let Some(end) = from.checked_add(VHD_FOOTER_BYTES) else {
        return Ok(None);
    };
    if from % PAGE_SIZE != 0 || from == 0 || end >= blob_bytes {
        return Ok(None);
    }
    // As stored: on an encrypted drive this page lies in the (encrypted)
    // data area of the grown blob, but a footer is plaintext.
    let raw = store.read_stored(ByteRange::new(from, end)).await?;
    Ok(footer_at(&raw, end).ok())
}

/// `footer` for a disk of `size_bytes`: the same identity (unique id,
/// creator, original size), the new current size and geometry.
pub fn resized_footer(footer: &Footer, size_bytes: u64) -> Footer {
    let mut out = footer.clone();
    out.current_size_bytes = size_bytes;
    out.geometry = chs_geometry(size_bytes);
    out
}

/// Test hook: a process that sets this variable to a step name
/// (`after-resize`, `after-footer`) exits right after that step of a
/// resize, as a kill would stop it. For the interruption tests only.
pub const STOP_AFTER_ENV: &str = "BLOBDRIVE_TEST_RESIZE_STOP_AFTER";

fn stop_point(step: &str) {
    if std::env::var(STOP_AFTER_ENV).is_ok_and(|s| s == step) {
        tracing::warn!(step, "stopping the resize here ({STOP_AFTER_ENV})");
        std::process::exit(9);
    }
}

/// Moves the drive in `store` from a data area of `old_size_bytes` (footer
/// `footer` at that offset) to `new_size_bytes`, in the order that keeps a
/// valid drive after any interruption (see the module doc). The caller
/// holds the lease `lease_id` (or knows the blob is not leased) and has
/// checked that nothing needed lies past a smaller new end. The blob may
/// already be larger than `old_size_bytes + 512` (an interrupted grow).
pub async fn move_footer(
    store: &dyn PageStore,
    footer: &Footer,
    old_size_bytes: u64,
    new_size_bytes: u64,
    lease_id: Option<&str>,
) -> crate::blob::Result<()> {
    let new_footer =
        bytes::Bytes::copy_from_slice(&resized_footer(footer, new_size_bytes).to_bytes());
    let new_blob_bytes = new_size_bytes + VHD_FOOTER_BYTES;
    if new_size_bytes >= old_size_bytes {
        // The intent first: once the blob grew, its last page is zero
        // until the new footer lands, and only this record says where the
        // old one is.
        let intent = GrowIntent {
            from_bytes: old_size_bytes,
            to_bytes: new_size_bytes,
        };
        store
            .set_metadata_entry(GROW_METADATA, Some(&intent.to_metadata()), lease_id)
            .await?;
        store.resize(new_blob_bytes, lease_id).await?;
        stop_point("after-resize");
        store
            .write_pages(new_size_bytes, new_footer, lease_id)
            .await?;
        stop_point("after-footer");
        if new_size_bytes > old_size_bytes {
            let old = ByteRange::new(old_size_bytes, old_size_bytes + VHD_FOOTER_BYTES);
            store.clear_pages(old, lease_id).await?;
        }
        store
            .set_metadata_entry(GROW_METADATA, None, lease_id)
            .await?;
    } else {
        store
            .write_pages(new_size_bytes, new_footer, lease_id)
            .await?;
        stop_point("after-footer");
        store.resize(new_blob_bytes, lease_id).await?;
    }
    Ok(())
}

/// Finishes a grow interrupted after its new footer landed (the footer is
/// at the end, `located`, but the intent is still recorded): clears the old
/// footer page if it still holds the old footer, then removes the intent.
/// Returns whether there was such a grow. The caller holds the lease
/// `lease_id` (or knows the blob is not leased).
pub async fn finish_recorded_grow(
    store: &dyn PageStore,
    located: &LocatedFooter,
    lease_id: Option<&str>,
) -> crate::blob::Result<bool> {
    let Some(intent) = GrowIntent::of(&store.state().await?.metadata) else {
        return Ok(false);
    };
    if located.interrupted_grow || intent.to_bytes != located.offset_bytes {
        return Ok(false);
    }
    if let Some(old_end) = intent.from_bytes.checked_add(VHD_FOOTER_BYTES) {
        let old = ByteRange::new(intent.from_bytes, old_end);
        // Only the old footer itself: a page written since (the drive
        // opened at its new size) is data.
        if intent.from_bytes % PAGE_SIZE == 0 && old_end <= located.offset_bytes {
            let raw = store.read_stored(old).await?;
            if footer_at(&raw, old_end).is_ok() {
                store.clear_pages(old, lease_id).await?;
            }
        }
    }
    store
        .set_metadata_entry(GROW_METADATA, None, lease_id)
        .await?;
    Ok(true)
}

impl Inner {
    /// Grows the data area to `new_size_bytes` under the drive's lease:
    /// blob and footer as [`move_footer`] does, then the size the drive
    /// serves. Writes go on meanwhile (below the old end). One grow at a time
    /// (it holds the flush lock, which also keeps flushes out of the old
    /// footer page while it changes).
    pub(crate) async fn grow(&self, new_size_bytes: u64) -> Result<()> {
        self.check_writable()?;
        if self.mode != Mode::ReadWrite {
            return Err(Error::ReadOnly);
        }
        let _one = self.flush_lock.lock().await;
        let old_size_bytes = self.size_bytes.load(Ordering::Acquire);
        if new_size_bytes < old_size_bytes {
            return Err(Error::OutOfRange {
                offset_bytes: new_size_bytes,
                len_bytes: 0,
                size_bytes: old_size_bytes,
            });
        }
        if new_size_bytes == old_size_bytes {
            return Ok(());
        }
        let blob_bytes = self.store.size_bytes().await?;
        let located = locate_footer(self.store.as_ref(), blob_bytes).await?;
        if located.offset_bytes != old_size_bytes {
            return Err(Error::NotADrive {
                reason: format!(
                    "the footer is at {} but the drive is {old_size_bytes} bytes: someone else resized it",
                    located.offset_bytes
                ),
            });
        }
        let lease_id = self.lease.id();
        move_footer(
            self.store.as_ref(),
            &located.footer,
            old_size_bytes,
            new_size_bytes,
            lease_id,
        )
        .await
        .map_err(|e| self.write_error(e))?;
        // The old footer page is cleared and the new area holds no data: the
        // sparse map needs no new entry, only the guard against stale ones.
        self.extents().remove(PageRange::covering(ByteRange::new(
            old_size_bytes,
            old_size_bytes + VHD_FOOTER_BYTES,
        )));
        self.size_bytes.store(new_size_bytes, Ordering::Release);
        tracing::info!(target = %self.target, old_size_bytes, new_size_bytes, "drive grown");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::drive::{Drive, DriveOptions, MemoryStore};

    const MIB: u64 = 1 << 20;

    fn drive_store(size_bytes: u64) -> Arc<MemoryStore> {
        Arc::new(MemoryStore::with_drive(size_bytes))
    }

    #[tokio::test]
    async fn an_open_drive_grows_and_keeps_its_data() {
        let store = drive_store(MIB);
        let drive = Drive::open(store.clone(), DriveOptions::default())
            .await
            .unwrap();
        drive.write_at(MIB - 512, &[5u8; 512]).await.unwrap();
        assert!(
            drive.write_at(MIB, &[1u8; 512]).await.is_err(),
            "past the end"
        );
        drive.grow(3 * MIB).await.unwrap();
        assert_eq!(drive.size_bytes(), 3 * MIB);
        // The old footer page is data area now, and reads as zeros.
        assert_eq!(&drive.read_at(MIB, 512).await.unwrap()[..], &[0u8; 512][..]);
        drive.write_at(3 * MIB - 512, &[9u8; 512]).await.unwrap();
        assert!(
            drive.grow(2 * MIB).await.is_err(),
            "never shrinks while open"
        );
        drive.close().await.unwrap();
        let again = Drive::open(store.clone(), DriveOptions::default())
            .await
            .unwrap();
        assert_eq!(again.size_bytes(), 3 * MIB);
        assert_eq!(
            &again.read_at(MIB - 512, 512).await.unwrap()[..],
            &[5u8; 512][..]
        );
        assert_eq!(
            &again.read_at(3 * MIB - 512, 512).await.unwrap()[..],
            &[9u8; 512][..]
        );
        again.close().await.unwrap();
    }

    /// The first step of a grow only, as a process killed right after it
    /// leaves the blob: the intent recorded, the blob grown, its last page
    /// empty.
    async fn first_step_of_a_grow(store: &MemoryStore, from: u64, to: u64) {
        let intent = GrowIntent {
            from_bytes: from,
            to_bytes: to,
        };
        store
            .set_metadata_entry(GROW_METADATA, Some(&intent.to_metadata()), None)
            .await
            .unwrap();
        store.resize(to + VHD_FOOTER_BYTES, None).await.unwrap();
    }

    #[tokio::test]
    async fn a_grow_cut_after_the_blob_grew_is_the_old_drive() {
        let store = drive_store(MIB);
        store.poke(0, &[3u8; 512]);
        first_step_of_a_grow(&store, MIB, 4 * MIB).await;
        let found = locate_footer(store.as_ref(), 4 * MIB + VHD_FOOTER_BYTES)
            .await
            .unwrap();
        assert!(found.interrupted_grow);
        assert_eq!(found.offset_bytes, MIB);
        let drive = Drive::open(store.clone(), DriveOptions::default())
            .await
            .unwrap();
        assert_eq!(drive.size_bytes(), MIB);
        // Growing it from there finishes the move, and clears the record.
        drive.grow(4 * MIB).await.unwrap();
        drive.close().await.unwrap();
        let found = locate_footer(store.as_ref(), 4 * MIB + VHD_FOOTER_BYTES)
            .await
            .unwrap();
        assert!(!found.interrupted_grow);
        assert_eq!(found.footer.current_size_bytes, 4 * MIB);
        assert_eq!(store.contents(ByteRange::new(0, 512)), vec![3u8; 512]);
        assert_eq!(store.metadata().get(GROW_METADATA), None);
    }

    #[tokio::test]
    async fn a_grow_whose_record_was_wiped_is_the_old_drive() {
        // The blob grew (our grow cut after its first step, its record then
        // replaced by another tool's Set Blob Metadata, or another tool grew
        // it): the old footer is the last page written.
        let store = drive_store(MIB);
        store.poke(0, &[3u8; 512]);
        first_step_of_a_grow(&store, MIB, 4 * MIB).await;
        store
            .set_metadata_entry(GROW_METADATA, None, None)
            .await
            .unwrap();
        let found = locate_footer(store.as_ref(), 4 * MIB + VHD_FOOTER_BYTES)
            .await
            .unwrap();
        assert_eq!(found.offset_bytes, MIB);
        assert!(found.interrupted_grow && found.intent_lost);
        let line = found.unfinished_grow_line("c/d").unwrap();
        assert!(
            line.contains("'blobdrive resize c/d --size 1048576'"),
            "{line}"
        );
        let drive = Drive::open(store.clone(), DriveOptions::default())
            .await
            .unwrap();
        assert_eq!(drive.size_bytes(), MIB);
        assert_eq!(&drive.read_at(0, 512).await.unwrap()[..], &[3u8; 512][..]);
        // A grow from there finishes it.
        drive.grow(2 * MIB).await.unwrap();
        drive.close().await.unwrap();
        let found = locate_footer(store.as_ref(), 2 * MIB + VHD_FOOTER_BYTES)
            .await
            .unwrap();
        assert!(!found.interrupted_grow);
        assert_eq!(found.offset_bytes, 2 * MIB);
    }

    #[tokio::test]
    async fn a_zero_last_page_without_a_footer_at_the_last_write_is_not_a_drive() {
        let store = drive_store(MIB);
        store
            .resize(4 * MIB + VHD_FOOTER_BYTES, None)
            .await
            .unwrap();
        // Data written past the old footer: the last written page is no
        // footer, so nothing says where the drive ends.
        store.poke(2 * MIB, &[3u8; 512]);
        let e = locate_footer(store.as_ref(), 4 * MIB + VHD_FOOTER_BYTES)
            .await
            .unwrap_err();
        assert!(matches!(e, Error::NotADrive { .. }), "{e}");
        let e = Drive::open(store.clone(), DriveOptions::default())
            .await
            .err()
            .expect("not a drive");
        assert!(matches!(e, Error::NotADrive { .. }), "{e}");
        assert_eq!(
            store.lease_holder(),
            None,
            "the failed open let go of its lease"
        );
        // Nothing written at all: not a drive either.
        let empty = MemoryStore::new(4 * MIB + VHD_FOOTER_BYTES);
        let e = locate_footer(&empty, 4 * MIB + VHD_FOOTER_BYTES)
            .await
            .unwrap_err();
        assert!(matches!(e, Error::NotADrive { .. }), "{e}");
    }

    #[tokio::test]
    async fn an_intent_that_does_not_fit_the_blob_is_not_trusted() {
        // A crafted record whose old end overflows: one error, no panic.
        let store = MemoryStore::new(4 * MIB + VHD_FOOTER_BYTES);
        store
            .set_metadata_entry(
                GROW_METADATA,
                Some("v1 from=18446744073709551104 to=1"),
                None,
            )
            .await
            .unwrap();
        let e = locate_footer(&store, 4 * MIB + VHD_FOOTER_BYTES)
            .await
            .unwrap_err();
        assert!(matches!(e, Error::NotADrive { .. }), "{e}");
        // A record of another size than the blob's is not used; the last
        // written page still finds the drive.
        let store = drive_store(MIB);
        first_step_of_a_grow(&store, MIB, 4 * MIB).await;
        let wrong = GrowIntent {
            from_bytes: 2 * MIB,
            to_bytes: 8 * MIB,
        };
        store
            .set_metadata_entry(GROW_METADATA, Some(&wrong.to_metadata()), None)
            .await
            .unwrap();
        let found = locate_footer(store.as_ref(), 4 * MIB + VHD_FOOTER_BYTES)
            .await
            .unwrap();
        assert_eq!(found.offset_bytes, MIB);
    }

    #[tokio::test]
    async fn a_grow_cut_after_its_new_footer_is_finished_at_the_same_size() {
        let store = drive_store(MIB);
        first_step_of_a_grow(&store, MIB, 2 * MIB).await;
        let new_footer = resized_footer(&Footer::new_fixed(MIB), 2 * MIB);
        store
            .write_pages(
                2 * MIB,
                bytes::Bytes::copy_from_slice(&new_footer.to_bytes()),
                None,
            )
            .await
            .unwrap();
        let found = locate_footer(store.as_ref(), 2 * MIB + VHD_FOOTER_BYTES)
            .await
            .unwrap();
        assert!(!found.interrupted_grow);
        assert!(finish_recorded_grow(store.as_ref(), &found, None)
            .await
            .unwrap());
        assert_eq!(store.metadata().get(GROW_METADATA), None);
        assert_eq!(
            store.contents(ByteRange::new(MIB, MIB + 512)),
            vec![0u8; 512]
        );
        assert!(!finish_recorded_grow(store.as_ref(), &found, None)
            .await
            .unwrap());
    }

    #[tokio::test]
    async fn a_grow_records_its_intent_only_while_it_runs() {
        let store = drive_store(MIB);
        store.poke(0, &[7u8; 512]);
        let footer = Footer::new_fixed(MIB);
        move_footer(store.as_ref(), &footer, MIB, 2 * MIB, None)
            .await
            .unwrap();
        assert_eq!(store.metadata().get(GROW_METADATA), None, "cleared after");
        let found = locate_footer(store.as_ref(), 2 * MIB + VHD_FOOTER_BYTES)
            .await
            .unwrap();
        assert_eq!(found.offset_bytes, 2 * MIB);
        assert!(!found.interrupted_grow);
        assert_eq!(
            GrowIntent::parse("v1 from=1048576 to=2097152"),
            Some(GrowIntent {
                from_bytes: MIB,
                to_bytes: 2 * MIB
            })
        );
        assert_eq!(GrowIntent::parse("v2 from=1 to=2"), None);
        assert_eq!(GrowIntent::parse("v1 from=x to=2"), None);
    }
}
