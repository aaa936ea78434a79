//! A CSI volume as a drive: its id, and what a request asks of it.
//!
//! The volume id is `CONTAINER/BLOB`, the drive's name in its account, so it
//! is stable across plugin restarts and parseable by any call without state
//! ([`VolumeId`]). CreateVolume's name becomes the blob's name; the
//! StorageClass parameter `container` picks the container
//! ([`DEFAULT_CONTAINER`] when absent).
//!
//! Capacities: the drive size rules are `units`' ([`units::drive_size_at_least`]
//! rounds a request up to a valid drive: whole MiB, at least 16 MiB); with no
//! capacity range a volume gets [`DEFAULT_CAPACITY_BYTES`].
//!
//! Access: this slice serves filesystem volumes (`mount`, with `ext4`, `xfs`,
//! `ext3` or `ext2`, `ext4` when unset) used from one node. Block volumes and
//! multi-node access are refused with one line saying so.

use tonic::Status;

use super::messages::{volume_capability, CapacityRange, VolumeCapability};
use crate::blob::BlobPath;
use crate::units::{self, format_size};

/// The container of volumes whose StorageClass names none.
pub const DEFAULT_CONTAINER: &str = "blobdrive-csi";
/// The StorageClass parameter naming the container.
pub const CONTAINER_PARAMETER: &str = "container";
/// The size of a volume asked for without a capacity range.
pub const DEFAULT_CAPACITY_BYTES: u64 = units::GIB;
/// The filesystem a mount volume gets when its capability names none.
pub const DEFAULT_FS_TYPE: &str = "ext4";
/// The filesystems a mount volume may ask for.
pub const FS_TYPES: [&str; 4] = ["ext4", "xfs", "ext3", "ext2"];

/// A volume id: the drive `CONTAINER/BLOB`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeId(pub BlobPath);

impl VolumeId {
    /// The id of drive `path`.
    pub fn of(path: &BlobPath) -> String {
        format!("{}/{}", path.container, path.name)
    }

    /// The drive an id names; `None` when no volume of this plugin could
    /// have that id (which callers treat as a volume that does not exist).
    pub fn parse(id: &str) -> Option<VolumeId> {
        let (container, name) = id.split_once('/')?;
        BlobPath::new(container, name).ok().map(VolumeId)
    }
}

/// The drive a CreateVolume of `name` in `container` makes.
pub fn path_for(container: &str, name: &str) -> Result<BlobPath, Status> {
    if name.is_empty() {
        return Err(Status::invalid_argument("the volume name is missing"));
    }
    BlobPath::new(container, name).map_err(|e| {
        Status::invalid_argument(format!(
            "volume {name} in container {container}: {}",
            e.message
        ))
    })
}

/// The drive size a capacity range asks for, and the range it must meet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// The size to create.
    pub size_bytes: u64,
    /// The smallest size an existing volume of the name may have.
    pub required_bytes: u64,
    /// The largest size it may have (`None`: no limit).
    pub limit_bytes: Option<u64>,
}

impl Capacity {
    /// Whether an existing drive of `size_bytes` meets the range.
    pub fn accepts(&self, size_bytes: u64) -> bool {
        size_bytes >= self.required_bytes && self.limit_bytes.is_none_or(|l| size_bytes <= l)
    }
}

/// The drive size for `range`: its required bytes (or the default) rounded
/// up to a valid drive, within its limit. `OUT_OF_RANGE` when no drive fits.
pub fn capacity(range: Option<&CapacityRange>) -> Result<Capacity, Status> {
    let (required, limit) = match range {
        Some(r) => {
            if r.required_bytes < 0 || r.limit_bytes < 0 {
                return Err(Status::invalid_argument(
                    "a capacity range cannot be negative",
                ));
            }
            (
                r.required_bytes as u64,
                (r.limit_bytes > 0).then_some(r.limit_bytes as u64),
            )
        }
        None => (0, None),
    };
    if let Some(l) = limit {
        if required > l {
            return Err(Status::invalid_argument(format!(
                "the capacity range asks for at least {required} bytes but at most {l}"
            )));
        }
    }
    let wanted = if required == 0 && limit.is_none() {
        DEFAULT_CAPACITY_BYTES
    } else {
        required
    };
    let size_bytes =
        units::drive_size_at_least(wanted).map_err(|e| Status::out_of_range(e.to_string()))?;
    if let Some(l) = limit {
        if size_bytes > l {
            return Err(Status::out_of_range(format!(
                "the smallest drive of at least {required} bytes is {} ({size_bytes} bytes: whole MiB, at least 16 MiB), above the limit of {l} bytes",
                format_size(size_bytes)
            )));
        }
    }
    Ok(Capacity {
        size_bytes,
        required_bytes: required,
        limit_bytes: limit,
    })
}

/// Why this slice cannot serve `cap`, or `None` when it can.
pub fn unsupported(cap: &VolumeCapability) -> Option<String> {
    use volume_capability::access_mode::Mode;
    match &cap.access_type {
        Some(volume_capability::AccessType::Mount(m)) => {
            if !m.fs_type.is_empty() && !FS_TYPES.contains(&m.fs_type.as_str()) {
                return Some(format!(
                    "filesystem {} is not supported; use one of {}",
                    m.fs_type,
                    FS_TYPES.join(", ")
                ));
            }
        }
        Some(volume_capability::AccessType::Block(_)) => {
            return Some("block volumes are not supported yet; use a filesystem volume".into())
        }
        None => return Some("the volume capability names neither block nor mount".into()),
    }
    let mode = cap
        .access_mode
        .map(|m| Mode::try_from(m.mode).unwrap_or(Mode::Unknown))
        .unwrap_or(Mode::Unknown);
    match mode {
        Mode::SingleNodeWriter
        | Mode::SingleNodeReaderOnly
        | Mode::SingleNodeSingleWriter
        | Mode::SingleNodeMultiWriter => None,
        Mode::Unknown => Some("the volume capability has no access mode".into()),
        other => Some(format!(
            "access mode {:?} is not supported: a drive is attached on one node at a time",
            other
        )),
    }
}

/// The first capability of `caps` this slice cannot serve, as
/// `INVALID_ARGUMENT`; also when there are none.
pub fn check_capabilities(caps: &[VolumeCapability]) -> Result<(), Status> {
    if caps.is_empty() {
        return Err(Status::invalid_argument("no volume capabilities given"));
    }
    match caps.iter().find_map(unsupported) {
        Some(why) => Err(Status::invalid_argument(why)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::{GIB, MIB};

    #[test]
    fn volume_ids_name_the_drive_and_parse_back() {
        let path = BlobPath::new("vols", "pvc-1/x").unwrap();
        let id = VolumeId::of(&path);
        assert_eq!(id, "vols/pvc-1/x");
        assert_eq!(VolumeId::parse(&id), Some(VolumeId(path)));
        assert_eq!(VolumeId::parse("no-slash"), None);
        assert_eq!(VolumeId::parse("Bad_Container/x"), None);
    }

    #[test]
    fn capacity_rounds_up_and_honours_the_limit() {
        let range = |r: i64, l: i64| CapacityRange {
            required_bytes: r,
            limit_bytes: l,
        };
        assert_eq!(capacity(None).unwrap().size_bytes, GIB);
        let c = capacity(Some(&range(GIB as i64 + 1, 0))).unwrap();
        assert_eq!(c.size_bytes, GIB + MIB);
        assert!(c.accepts(GIB + MIB) && !c.accepts(GIB));
        assert_eq!(capacity(Some(&range(1, 0))).unwrap().size_bytes, 16 * MIB);
        let e = capacity(Some(&range(1, MIB as i64))).unwrap_err();
        assert_eq!(e.code(), tonic::Code::OutOfRange);
        let e = capacity(Some(&range(2, 1))).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        let e = capacity(Some(&range(i64::MAX, 0))).unwrap_err();
        assert_eq!(e.code(), tonic::Code::OutOfRange);
    }
}
