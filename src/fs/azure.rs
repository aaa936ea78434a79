//! The real backend of the FUSE layer: [`AzureCatalog`] lists containers and
//! blobs through `blob::BlobClient` and opens drives as `drive::Drive`s.
//!
//! A page blob is a drive when its last 512 bytes are a valid fixed VHD footer;
//! that costs one small read per page blob, so the answer is cached per blob
//! version (ETag). Drives open through the drive engine (read-write takes the
//! lease); page blobs without a footer and block blobs are read-only files
//! served by ranged reads. Errors become [`FsError`]s here, with the errno the
//! drive engine chose, and nowhere else.
//!
//! Changes a namespace mount makes (containers, new drives, deletes) go
//! through `provision`, the code the `create` and `delete` commands run, and
//! keep its rules and refusals.
//!
//! Encrypted drives: an attach gives the catalog the one data key it serves;
//! a namespace mount may give a user key (key file or passphrase), which
//! opens the key slots of each encrypted drive at its open (once per data
//! key: unlocked keys are kept and recognised by their check value; a slot
//! set the key did not open is not tried again; see `super::unlocks`). A drive
//! the key does not open, or any encrypted drive without a key, is served as
//! its ciphertext, read-only: no page is ever read or written with a wrong key.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{self, StreamExt};

use super::backend::{
    Catalog, Device, DirEntry, DriveState, EntryKind, EntryPath, Extent, FsError, FsResult,
};
use super::rescue::{Rescuable, Rescue, Saved};
use super::unlocks::{Unlocked, Unlocker};
use crate::blob::path::validate_container_name;
use crate::blob::{self, BlobClient, BlobItem, BlobPath, BlobType, ListBlobsOptions};
use crate::crypt::{DataKey, KeySlots, UserKey};
use crate::drive::{
    BlobPageStore, Drive, DriveOptions, EncryptedStore, Mode, PageRange, PageStore,
};
use crate::provision::checks::{lease_text, snapshots_of, stored_bytes};
use crate::provision::create::{create_drive, CreateError};
use crate::provision::delete::{delete_drive, DeleteError, DeleteOptions};
use crate::units::{ByteRange, VHD_FOOTER_BYTES};
use crate::vhd::Footer;

/// Footer reads in flight while classifying a listing.
const CLASSIFY_PARALLELISM: usize = 16;

/// The account (through one client) as the FUSE layer sees it.
pub struct AzureCatalog {
    client: BlobClient,
    drive_options: DriveOptions,
    /// The data key of the one encrypted drive this catalog serves (an
    /// attach given --key-file or --passphrase-file).
    data_key: Option<Arc<DataKey>>,
    /// The user's key of a namespace mount given --key-file or
    /// --passphrase-file: it opens the slots of the drives it can, each
    /// slot set once at most (see `super::unlocks`).
    unlocker: Option<Unlocker>,
    /// Kind of each blob version seen: (container, name, snapshot) → (etag, kind).
    kinds: Mutex<HashMap<BlobKey, (Option<String>, EntryKind)>>,
}

type BlobKey = (String, String, Option<String>);

impl AzureCatalog {
    /// A catalog over `client`; drives open with `drive_options` (its `mode`
    /// and `target` are set per open).
    pub fn new(client: BlobClient, drive_options: DriveOptions) -> Self {
        AzureCatalog {
            client,
            drive_options,
            data_key: None,
            unlocker: None,
            kinds: Mutex::new(HashMap::new()),
        }
    }

    /// Open encrypted drives with `key` (checked against each drive's
    /// encryption header before use).
    pub fn with_data_key(mut self, key: Option<Arc<DataKey>>) -> Self {
        self.data_key = key;
        self
    }

    /// Open encrypted drives whose key slots `key` opens (a namespace
    /// mount's --key-file or --passphrase-file).
    pub fn with_user_key(mut self, key: Option<UserKey>) -> Self {
        self.unlocker = key.map(Unlocker::new);
        self
    }

    /// The data key to open `path` with: `Some` when the drive is encrypted
    /// and the catalog's data key is its own, or the user key opens one of
    /// its slots; `None` for a plain drive or one no key given opens
    /// (served as ciphertext, read-only). A data key that is not this
    /// drive's is refused.
    async fn drive_key(
        &self,
        metadata: &std::collections::BTreeMap<String, String>,
        path: &EntryPath,
    ) -> FsResult<Option<Arc<DataKey>>> {
        let slots = KeySlots::from_metadata(metadata)
            .map_err(|e| FsError::new(libc::EACCES, format!("{path}: {e}")))?;
        let Some(slots) = slots else {
            return Ok(None);
        };
        if let Some(key) = &self.data_key {
            return if slots.matches(key) {
                Ok(Some(key.clone()))
            } else {
                Err(FsError::new(
                    libc::EACCES,
                    format!("{path}: the key given is not this drive's data key"),
                ))
            };
        }
        let Some(unlocker) = &self.unlocker else {
            return Ok(None);
        };
        let unlocked = unlocker
            .unlock(slots)
            .await
            .map_err(|e| FsError::new(libc::EIO, format!("{path}: {e}")))?;
        match unlocked {
            Unlocked::Key { key, slot } => {
                if let Some(slot) = slot {
                    tracing::info!(drive = %path, slot, "unlocked");
                }
                Ok(Some(key))
            }
            Unlocked::NotOpened(reason) => {
                tracing::info!(drive = %path, reason = %reason, "the key given does not open this drive: its ciphertext is served read-only");
                Ok(None)
            }
        }
    }

    fn cached_kind(&self, key: &BlobKey, etag: &Option<String>) -> Option<EntryKind> {
        let kinds = self.kinds.lock().expect("kind cache poisoned");
        match kinds.get(key) {
            Some((seen, kind)) if seen == etag && etag.is_some() => Some(*kind),
            _ => None,
        }
    }

    /// Drive, raw page blob or block blob, reading the footer of page blobs.
    async fn classify(&self, container: &str, item: &BlobItem) -> FsResult<EntryKind> {
        let size = item.content_length;
        if item.blob_type != Some(BlobType::PageBlob) {
            return Ok(EntryKind::BlockBlob { size_bytes: size });
        }
        let key = (
            container.to_string(),
            item.name.clone(),
            item.snapshot.clone(),
        );
        if let Some(kind) = self.cached_kind(&key, &item.etag) {
            return Ok(kind);
        }
        let path = blob_path(container, &item.name, item.snapshot.as_deref())?;
        let kind = drive_kind(&self.client, &path, size).await?;
        self.kinds
            .lock()
            .expect("kind cache poisoned")
            .insert(key, (item.etag.clone(), kind));
        Ok(kind)
    }
}

impl AzureCatalog {
    async fn entry_of(&self, container: &str, prefix: &str, item: BlobItem) -> FsResult<DirEntry> {
        let kind = self.classify(container, &item).await?;
        Ok(DirEntry {
            name: item.name[prefix.len()..].to_string(),
            kind,
            modified: modified(&item),
            snapshot: item.snapshot,
        })
    }
}

/// Reads the footer of the page blob at `path` (of `size` bytes) to tell a
/// drive from a raw page blob.
async fn drive_kind(client: &BlobClient, path: &BlobPath, size: u64) -> FsResult<EntryKind> {
    if size < VHD_FOOTER_BYTES * 2 {
        return Ok(EntryKind::RawPageBlob { size_bytes: size });
    }
    let tail = client
        .get_blob_range(path, ByteRange::new(size - VHD_FOOTER_BYTES, size))
        .await
        .map_err(|e| blob_error(&e))?;
    let footer: &[u8; 512] = match tail.as_ref().try_into() {
        Ok(f) => f,
        Err(_) => return Ok(EntryKind::RawPageBlob { size_bytes: size }),
    };
    Ok(match Footer::parse(footer, size) {
        Ok(_) => EntryKind::Drive {
            size_bytes: size - VHD_FOOTER_BYTES,
        },
        // A grow interrupted after the blob grew: still the old drive.
        Err(_) if footer.iter().all(|b| *b == 0) => {
            let store = crate::drive::BlobPageStore::new(client.clone(), path.clone());
            match crate::drive::resize::locate_footer(&store, size).await {
                Ok(found) => EntryKind::Drive {
                    size_bytes: found.offset_bytes,
                },
                Err(_) => EntryKind::RawPageBlob { size_bytes: size },
            }
        }
        Err(_) => EntryKind::RawPageBlob { size_bytes: size },
    })
}

fn blob_path(container: &str, name: &str, snapshot: Option<&str>) -> FsResult<BlobPath> {
    BlobPath::new(container, name)
        .map(|p| p.with_snapshot(snapshot))
        .map_err(|e| FsError::new(libc::EINVAL, e.to_string()))
}

fn blob_error(e: &blob::Error) -> FsError {
    let errno = if e.is_not_found() {
        libc::ENOENT
    } else if e.is_auth_failure() {
        libc::EACCES
    } else if e.is_lease_conflict() {
        libc::EBUSY
    } else {
        libc::EIO
    };
    FsError::new(errno, e.to_string())
}

fn drive_error(e: crate::drive::Error) -> FsError {
    let mut err = FsError::new(e.errno(), e.to_string());
    err.fenced = matches!(e, crate::drive::Error::Fenced(_));
    err
}

fn modified(item: &BlobItem) -> Option<SystemTime> {
    item.last_modified
        .as_deref()
        .and_then(|t| httpdate::parse_http_date(t).ok())
}

#[async_trait]
impl Catalog for AzureCatalog {
    async fn list_containers(&self) -> FsResult<Vec<String>> {
        let containers = self
            .client
            .list_containers()
            .await
            .map_err(|e| blob_error(&e))?;
        Ok(containers.into_iter().map(|c| c.name).collect())
    }

    async fn list_dir(&self, container: &str, prefix: &str) -> FsResult<Vec<DirEntry>> {
        let opts = ListBlobsOptions {
            prefix: (!prefix.is_empty()).then(|| prefix.to_string()),
            delimiter: Some("/".into()),
            include_snapshots: true,
            ..Default::default()
        };
        let listing = self
            .client
            .list_all_blobs(container, &opts)
            .await
            .map_err(|e| blob_error(&e))?;
        let mut entries: Vec<DirEntry> = listing
            .prefixes
            .iter()
            .filter_map(|p| p.strip_prefix(prefix))
            .map(|p| p.trim_end_matches('/'))
            .filter(|p| !p.is_empty())
            .map(|name| DirEntry {
                name: name.to_string(),
                kind: EntryKind::Dir,
                snapshot: None,
                modified: None,
            })
            .collect();
        let items: Vec<BlobItem> = listing
            .blobs
            .into_iter()
            .filter(|item| item.name.starts_with(prefix))
            .collect();
        let classified: Vec<FsResult<DirEntry>> = stream::iter(items)
            .map(|item| self.entry_of(container, prefix, item))
            .buffered(CLASSIFY_PARALLELISM)
            .collect()
            .await;
        for entry in classified {
            entries.push(entry?);
        }
        Ok(entries)
    }

    async fn open(&self, path: &EntryPath, writable: bool) -> FsResult<Arc<dyn Device>> {
        let blob = blob_path(&path.container, &path.blob, path.snapshot.as_deref())?;
        let props = self
            .client
            .get_properties(&blob)
            .await
            .map_err(|e| blob_error(&e))?;
        let size = props.content_length;
        let kind = if props.blob_type == Some(BlobType::PageBlob) {
            drive_kind(&self.client, &blob, size).await?
        } else {
            EntryKind::BlockBlob { size_bytes: size }
        };
        match kind {
            EntryKind::Drive { .. } => {
                let mode = if blob.snapshot.is_some() {
                    Mode::Snapshot
                } else if writable {
                    Mode::ReadWrite
                } else {
                    Mode::ReadOnly
                };
                if writable && mode == Mode::Snapshot {
                    return Err(FsError::read_only(format!("{path} is a snapshot")));
                }
                let opts = DriveOptions {
                    mode,
                    target: blob.to_string(),
                    ..self.drive_options.clone()
                };
                let plain = BlobPageStore::new(self.client.clone(), blob);
                let store: Arc<dyn PageStore> = match self.drive_key(&props.metadata, path).await? {
                    Some(key) => Arc::new(EncryptedStore::new(Arc::new(plain), key)),
                    None if writable && KeySlots::is_encrypted(&props.metadata) => {
                        let why = if self.unlocker.is_some() {
                            "the key given does not open it"
                        } else {
                            "no key was given"
                        };
                        return Err(FsError::read_only(format!(
                            "{path} is encrypted and {why}: its ciphertext is read-only"
                        )));
                    }
                    None => Arc::new(plain),
                };
                let drive = Drive::open(store, opts).await.map_err(drive_error)?;
                // The key was chosen from properties read before the open
                // took its lease: a drive re-keyed or re-created in between
                // would be read (and written) under the wrong key.
                if !KeySlots::same_data_key(&props.metadata, drive.metadata_at_open()) {
                    let _ = drive.close().await;
                    return Err(FsError::new(
                        libc::EIO,
                        format!("{path}: its encryption changed while it opened; open it again"),
                    ));
                }
                let device = Arc::new(DriveDevice {
                    drive,
                    client: self.client.clone(),
                    rescue: Rescue::default(),
                });
                if mode == Mode::ReadWrite {
                    Rescue::watch(&device);
                }
                Ok(device)
            }
            _ if writable => Err(FsError::read_only(format!(
                "{path} is not a drive (no fixed VHD footer): it is read-only"
            ))),
            _ => Ok(Arc::new(BlobReadDevice {
                client: self.client.clone(),
                path: blob,
                size_bytes: size,
            })),
        }
    }

    async fn create_container(&self, name: &str) -> FsResult<()> {
        validate_container_name(name).map_err(|e| FsError::new(libc::EINVAL, e.message))?;
        match self.client.create_container(name).await {
            Ok(true) => {
                tracing::info!(container = name, "created container");
                Ok(())
            }
            Ok(false) => Err(FsError::new(
                libc::EEXIST,
                format!("container {name} exists"),
            )),
            Err(e) => Err(blob_error(&e)),
        }
    }

    async fn delete_container(&self, name: &str) -> FsResult<()> {
        validate_container_name(name).map_err(|e| FsError::new(libc::EINVAL, e.message))?;
        let opts = ListBlobsOptions {
            include_snapshots: true,
            max_results: Some(1),
            ..Default::default()
        };
        // Past every page the service answers empty with a marker: one
        // page of `max_results 1` may hold nothing while the container
        // holds blobs.
        let first = self
            .client
            .first_blob(name, &opts)
            .await
            .map_err(|e| blob_error(&e))?;
        if first.is_some() {
            return Err(FsError::new(
                libc::ENOTEMPTY,
                format!("rmdir {name} refused: the container holds blobs"),
            ));
        }
        self.client
            .delete_container(name)
            .await
            .map_err(|e| blob_error(&e))?;
        tracing::info!(container = name, "deleted container");
        Ok(())
    }

    async fn create_drive(&self, path: &EntryPath, size_bytes: u64) -> FsResult<()> {
        let blob = blob_path(&path.container, &path.blob, None)?;
        create_drive(&self.client, &blob, size_bytes, None)
            .await
            .map_err(|e| create_error(path, e))?;
        tracing::info!(drive = %path, size_bytes, "created drive");
        Ok(())
    }

    async fn delete(&self, path: &EntryPath) -> FsResult<()> {
        let blob = blob_path(&path.container, &path.blob, path.snapshot.as_deref())?;
        delete_drive(&self.client, &blob, DeleteOptions::default())
            .await
            .map_err(|e| delete_error(path, e))?;
        self.kinds.lock().expect("kind cache poisoned").remove(&(
            path.container.clone(),
            path.blob.clone(),
            path.snapshot.clone(),
        ));
        Ok(())
    }

    async fn drive_state(&self, path: &EntryPath) -> FsResult<DriveState> {
        let blob = blob_path(&path.container, &path.blob, path.snapshot.as_deref())?;
        let props = self
            .client
            .get_properties(&blob)
            .await
            .map_err(|e| blob_error(&e))?;
        let stored_bytes = stored_bytes(&self.client, &blob, props.content_length)
            .await
            .map_err(|e| blob_error(&e))?;
        if blob.snapshot.is_some() {
            return Ok(DriveState {
                lease: None,
                snapshots: None,
                stored_bytes,
            });
        }
        let snapshots = snapshots_of(&self.client, &blob)
            .await
            .map_err(|e| blob_error(&e))?;
        Ok(DriveState {
            lease: Some(lease_text(props.lease_state, props.lease_duration)),
            snapshots: Some(snapshots.len()),
            stored_bytes,
        })
    }
}

/// The one line (and errno) of a drive the namespace mount could not make.
fn create_error(path: &EntryPath, e: CreateError) -> FsError {
    match e {
        CreateError::Size(e) => FsError::new(libc::EINVAL, format!("{path} was not created: {e}")),
        CreateError::Blob(e) if e.is_already_exists() => FsError::new(
            libc::EEXIST,
            format!("{path} already exists; blobdrive never replaces a blob"),
        ),
        CreateError::Blob(e) => {
            let mut err = blob_error(&e);
            err.message = format!("{path} was not created: {}", err.message);
            err
        }
        e @ CreateError::Footer { .. } => FsError::io(format!("{path}: {e}")),
    }
}

/// The one line (and errno) of a drive `rm` did not delete, naming the
/// command that would.
fn delete_error(path: &EntryPath, e: DeleteError) -> FsError {
    match e {
        DeleteError::Leased => FsError::busy(format!(
            "rm {path} refused: the drive is mounted (leased), by this mount or another; unmount it first, or run 'blobdrive break-lease {path}' if the host that holds it is gone"
        )),
        DeleteError::HasSnapshots(n) => FsError::new(
            libc::ENOTEMPTY,
            format!(
                "rm {path} refused: it has {n} snapshot{}; 'blobdrive delete {path} --include-snapshots' deletes it with them (or rm each {}@TIME first)",
                if n == 1 { "" } else { "s" },
                path.blob.rsplit('/').next().unwrap_or(&path.blob)
            ),
        ),
        DeleteError::NotADrive(why) => FsError::new(
            libc::EPERM,
            format!(
                "rm {path} refused: {why}; a namespace mount deletes only drives: 'blobdrive delete --force {path}' deletes it"
            ),
        ),
        DeleteError::Blob(e) => {
            let mut err = blob_error(&e);
            err.message = format!("rm {path} failed: {}", err.message);
            err
        }
    }
}

/// A drive served by the drive engine.
pub struct DriveDevice {
    drive: Drive,
    client: BlobClient,
    /// Its unflushed pages saved to a recovery file once the lease is lost.
    rescue: Rescue,
}

impl Rescuable for DriveDevice {
    fn drive(&self) -> &Drive {
        &self.drive
    }

    fn rescue(&self) -> &Rescue {
        &self.rescue
    }

    fn account(&self) -> &str {
        self.client.account_name()
    }
}

#[async_trait]
impl Device for DriveDevice {
    fn size_bytes(&self) -> u64 {
        self.drive.size_bytes()
    }

    fn changed(&self) -> bool {
        self.drive.has_changed()
    }

    async fn grow(&self, new_size_bytes: u64) -> FsResult<()> {
        self.drive.grow(new_size_bytes).await.map_err(drive_error)
    }

    async fn read_at(&self, offset_bytes: u64, len: usize) -> FsResult<Bytes> {
        self.drive
            .read_at(offset_bytes, len)
            .await
            .map_err(drive_error)
    }

    async fn write_at(&self, offset_bytes: u64, data: &[u8]) -> FsResult<()> {
        self.drive
            .write_at(offset_bytes, data)
            .await
            .map_err(drive_error)
    }

    async fn discard(&self, offset_bytes: u64, len_bytes: u64) -> FsResult<()> {
        self.drive
            .discard(offset_bytes, len_bytes)
            .await
            .map_err(drive_error)
    }

    async fn write_zeroes_allocated(&self, offset_bytes: u64, len_bytes: u64) -> FsResult<()> {
        self.drive
            .write_zeroes_allocated(offset_bytes, len_bytes)
            .await
            .map_err(drive_error)
    }

    async fn flush(&self) -> FsResult<()> {
        self.drive.flush().await.map_err(drive_error)
    }

    /// A close whose flush fails saves the unflushed pages in a recovery
    /// file (`crate::recovery`) and names it in the error.
    async fn close(&self) -> FsResult<()> {
        let err = match self.drive.close().await {
            Ok(()) => {
                self.rescue.stop_watching();
                // A file saved when an earlier flush failed is obsolete.
                self.rescue.forget().await;
                return Ok(());
            }
            Err(e @ crate::drive::Error::ReleaseFailed { .. }) => {
                self.rescue.stop_watching();
                self.rescue.forget().await;
                let mut fs_err = drive_error(e);
                fs_err.data_durable = true;
                return Err(fs_err);
            }
            Err(e) => e,
        };
        let mut fs_err = drive_error(err.clone());
        let reason = err.to_string();
        // The file the lease watcher saved, if nothing was written since.
        let saved = self.rescue.save(self, &reason).await;
        match saved {
            Ok(None) => {}
            Ok(Some(Saved { file, .. })) => {
                fs_err.message = format!(
                    "{}; its {} unflushed bytes were saved to {}: run 'blobdrive recover {}'",
                    fs_err.message,
                    self.drive.unflushed_bytes(),
                    file.display(),
                    file.display()
                );
            }
            Err(e) => {
                fs_err.message = format!(
                    "{}; saving its {} unflushed bytes to a recovery file failed too ({e}): that data is lost",
                    fs_err.message,
                    self.drive.unflushed_bytes()
                );
            }
        }
        Err(fs_err)
    }

    fn storage_unanswered(&self) -> bool {
        self.drive.storage_unanswered()
    }

    async fn save_unflushed(&self, reason: &str) -> FsResult<Option<std::path::PathBuf>> {
        self.rescue
            .save(self, reason)
            .await
            .map(|saved| saved.map(|s| s.file))
            .map_err(|e| FsError::io(format!("saving a recovery file failed: {e}")))
    }

    fn allocation(&self, offset_bytes: u64, len_bytes: u64) -> Vec<Extent> {
        let end = offset_bytes
            .saturating_add(len_bytes)
            .min(self.drive.size_bytes());
        if offset_bytes >= end {
            return Vec::new();
        }
        let pages = PageRange::covering(ByteRange::new(offset_bytes, end));
        self.drive
            .allocation(pages)
            .into_iter()
            .map(|run| {
                let bytes = run.pages.bytes();
                let (start, stop) = (bytes.start.max(offset_bytes), bytes.end.min(end));
                Extent {
                    len_bytes: stop - start,
                    data: run.data,
                }
            })
            .collect()
    }

    fn stats(&self) -> serde_json::Value {
        let mut stats = serde_json::to_value(self.drive.counters()).unwrap_or_default();
        if let Some(map) = stats.as_object_mut() {
            map.insert("retries".into(), self.client.retries().into());
            map.insert("target".into(), self.drive.target().into());
        }
        stats
    }
}

/// A blob that is not a drive (block blob, page blob without a footer, or a
/// snapshot of one), read with ranged Get Blob; never written.
pub struct BlobReadDevice {
    client: BlobClient,
    path: BlobPath,
    size_bytes: u64,
}

#[async_trait]
impl Device for BlobReadDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    async fn read_at(&self, offset_bytes: u64, len: usize) -> FsResult<Bytes> {
        let end = (offset_bytes + len as u64).min(self.size_bytes);
        if offset_bytes >= end {
            return Ok(Bytes::new());
        }
        self.client
            .get_blob_range(&self.path, ByteRange::new(offset_bytes, end))
            .await
            .map_err(|e| blob_error(&e))
    }

    async fn write_at(&self, _offset_bytes: u64, _data: &[u8]) -> FsResult<()> {
        Err(FsError::read_only(format!("{} is read-only", self.path)))
    }

    async fn discard(&self, _offset_bytes: u64, _len_bytes: u64) -> FsResult<()> {
        Err(FsError::read_only(format!("{} is read-only", self.path)))
    }

    async fn flush(&self) -> FsResult<()> {
        Ok(())
    }

    async fn close(&self) -> FsResult<()> {
        Ok(())
    }

    fn stats(&self) -> serde_json::Value {
        serde_json::json!({ "target": self.path.to_string(), "retries": self.client.retries() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// One listing page: `blobs` names, then the marker if any.
    fn listing(blobs: &[&str], marker: Option<&str>) -> String {
        let blobs: String = blobs
            .iter()
            .map(|n| {
                format!(
                    "<Blob><Name>{n}</Name><Properties><Content-Length>512</Content-Length>\
                     <BlobType>PageBlob</BlobType></Properties></Blob>"
                )
            })
            .collect();
        let marker = marker.map_or(String::new(), |m| format!("<NextMarker>{m}</NextMarker>"));
        format!(
            "<?xml version=\"1.0\" encoding=\"utf-8\"?><EnumerationResults \
             ContainerName=\"box\"><MaxResults>1</MaxResults><Blobs>{blobs}</Blobs>{marker}\
             </EnumerationResults>"
        )
    }

    /// A stand-in for the service whose listing of container `box` is
    /// `pages` (the first without a marker, each next one at the marker
    /// `p<index>`), as the service may answer: pages with fewer entries
    /// than asked for, even none, and a marker. Counts Delete Container
    /// requests.
    async fn service(pages: Vec<String>) -> (BlobClient, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let deletes = Arc::new(AtomicUsize::new(0));
        let counted = deletes.clone();
        let pages = Arc::new(pages);
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let (pages, deletes) = (pages.clone(), counted.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&head);
                    let line = head.lines().next().unwrap_or("");
                    let (status, body) = if line.starts_with("DELETE ") {
                        deletes.fetch_add(1, Ordering::SeqCst);
                        ("202 Accepted", String::new())
                    } else {
                        let page = line
                            .split(['?', '&', ' '])
                            .find_map(|q| q.strip_prefix("marker=p"))
                            .map_or(0, |i| i.parse::<usize>().unwrap());
                        ("200 OK", pages[page].clone())
                    };
                    let answer = format!(
                        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nx-ms-request-id: 1\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = conn.write_all(answer.as_bytes()).await;
                    let _ = conn.shutdown().await;
                });
            }
        });
        let mut account = blob::Account::development();
        account.endpoint = format!("http://127.0.0.1:{port}/devstoreaccount1")
            .parse()
            .unwrap();
        (BlobClient::new(account).unwrap(), deletes)
    }

    #[tokio::test]
    async fn rmdir_follows_the_listing_marker_past_empty_pages() {
        // Two empty pages with markers, then the container's one blob.
        let (client, deletes) = service(vec![
            listing(&[], Some("p1")),
            listing(&[], Some("p2")),
            listing(&["d.vhd"], None),
        ])
        .await;
        let catalog = AzureCatalog::new(client, DriveOptions::default());
        let e = catalog.delete_container("box").await.unwrap_err();
        assert_eq!(e.errno, libc::ENOTEMPTY, "{}", e.message);
        assert_eq!(
            deletes.load(Ordering::SeqCst),
            0,
            "a container with a blob was deleted"
        );

        // Empty pages to the end: the container is empty and is deleted.
        let (client, deletes) = service(vec![listing(&[], Some("p1")), listing(&[], None)]).await;
        let catalog = AzureCatalog::new(client, DriveOptions::default());
        catalog.delete_container("box").await.unwrap();
        assert_eq!(deletes.load(Ordering::SeqCst), 1);
    }
}
