//! What a local image is: a fixed VHD (its footer is checked and kept), a
//! raw image (a footer is made for it), a dynamic VHD (read through its block
//! table; a fixed footer with its size and unique id is made for it), or
//! something refused with the reason (a differencing or corrupt VHD, a
//! qcow2/VHDX/VMDK file, a size that is not a whole number of MiB unless
//! `--pad` rounds it up).
//!
//! Invariant: the data area (`data_len`) is always a whole number of MiB,
//! because Azure accepts only such disks, and the footer describes exactly it.
//! A dynamic VHD is checked whole (`vhd::dynamic`) here, before the upload
//! creates anything.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use super::scan::DiskReader;
use super::{io_error, Error, Result};
use crate::units::{exact_size, format_size, MAX_DRIVE_BYTES, MIB, VHD_FOOTER_BYTES};
use crate::vhd::dynamic::DynamicVhd;
use crate::vhd::{self, DiskType, Footer};

/// The kind of a local image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ImageKind {
    /// A raw disk image; a footer is added.
    Raw,
    /// A raw image rounded up to whole MiB with zeros (`--pad`).
    RawPadded,
    /// A fixed VHD; its footer is kept.
    FixedVhd,
    /// A dynamic VHD; written out as a fixed one (same size and unique id).
    DynamicVhd,
}

impl ImageKind {
    /// How it reads in messages.
    pub fn describe(self) -> &'static str {
        match self {
            ImageKind::Raw => "raw image",
            ImageKind::RawPadded => "raw image (padded)",
            ImageKind::FixedVhd => "fixed VHD",
            ImageKind::DynamicVhd => "dynamic VHD",
        }
    }
}

/// A local image ready to upload.
#[derive(Debug, Clone)]
pub struct SourceImage {
    /// What it is.
    pub kind: ImageKind,
    /// Size of the file.
    pub file_len: u64,
    /// Bytes of the file that are disk data (a VHD's footer excluded).
    pub file_data_len: u64,
    /// Bytes of the disk: `file_data_len` rounded up when padded.
    pub data_len: u64,
    /// The footer to write at `data_len`, last.
    pub footer: [u8; 512],
    /// The checked block table of a dynamic VHD.
    pub dynamic: Option<Arc<DynamicVhd>>,
}

impl SourceImage {
    /// Size of the page blob: the disk plus the footer.
    pub fn blob_size(&self) -> u64 {
        self.data_len + VHD_FOOTER_BYTES
    }

    /// A reader of the disk's bytes; `file` is the image it was inspected from.
    pub fn reader(&self, file: &File, path: &Path) -> Result<DiskReader> {
        Ok(match &self.dynamic {
            Some(vhd) => DiskReader::Dynamic(vhd.clone()),
            None => DiskReader::Flat {
                file: Arc::new(file.try_clone().map_err(io_error("open", path))?),
                file_data_len: self.file_data_len,
            },
        })
    }
}

/// Magic numbers of formats that must be converted first.
const OTHER_FORMATS: [(&[u8], &str); 3] = [
    (b"QFI\xfb", "qcow2"),
    (b"vhdxfile", "VHDX"),
    (b"KDMV", "VMDK"),
];

fn refuse(path: &Path, message: String) -> Error {
    Error::Image {
        path: path.to_path_buf(),
        message,
    }
}

/// Look at `file` (opened from `path`) and decide how to upload it.
pub fn inspect(path: &Path, file: &File, pad: bool) -> Result<SourceImage> {
    let meta = file.metadata().map_err(io_error("read", path))?;
    if !meta.is_file() {
        return Err(refuse(path, "not a regular file".into()));
    }
    let file_len = meta.len();
    if file_len == 0 {
        return Err(refuse(path, "the file is empty".into()));
    }
    let mut tail = [0u8; 512];
    if file_len >= VHD_FOOTER_BYTES && file_len % 512 == 0 {
        file.read_exact_at(&mut tail, file_len - VHD_FOOTER_BYTES)
            .map_err(io_error("read", path))?;
    }
    let mut head = [0u8; 8];
    let n = head.len().min(file_len as usize);
    file.read_exact_at(&mut head[..n], 0)
        .map_err(io_error("read", path))?;
    if tail[..8] == vhd::COOKIE {
        let kind = Footer::parse_any(&tail)
            .map_err(|e| refuse(path, format!("not an image blobdrive can upload: {e}")))?
            .disk_type;
        if matches!(kind, DiskType::Dynamic | DiskType::Differencing) {
            return dynamic_image(path, file, file_len, pad);
        }
        let footer = Footer::parse(&tail, file_len)
            .map_err(|e| refuse(path, format!("not an image blobdrive can upload: {e}")))?;
        let data_len = footer.current_size_bytes;
        if data_len % MIB != 0 || data_len == 0 {
            return Err(refuse(
                path,
                format!(
                    "fixed VHD of {data_len} bytes is not a whole number of MiB, which Azure refuses; \
                     convert it with 'qemu-img convert -O vpc -o subformat=fixed,force_size=on'"
                ),
            ));
        }
        return Ok(SourceImage {
            kind: ImageKind::FixedVhd,
            file_len,
            file_data_len: data_len,
            data_len,
            footer: tail,
            dynamic: None,
        });
    }
    if head == vhd::COOKIE {
        // A footer copy at the start but none at the end: a dynamic VHD
        // whose end is damaged, which the reader reports.
        return dynamic_image(path, file, file_len, pad);
    }
    for (magic, name) in OTHER_FORMATS {
        if head.starts_with(magic) {
            return Err(refuse(
                path,
                format!(
                    "is a {name} image; convert it to a fixed VHD or raw image first \
                     ('qemu-img convert -O vpc -o subformat=fixed,force_size=on')"
                ),
            ));
        }
    }
    let (kind, data_len) = if file_len % MIB == 0 {
        (ImageKind::Raw, file_len)
    } else if pad {
        (ImageKind::RawPadded, file_len.div_ceil(MIB) * MIB)
    } else {
        let up = file_len.div_ceil(MIB) * MIB;
        return Err(refuse(
            path,
            format!(
                "raw image of {file_len} bytes ({}) is not a whole number of MiB, which Azure \
                 requires of a disk; add --pad to round it up to {} with zeros",
                format_size(file_len),
                exact_size(up)
            ),
        ));
    };
    if data_len > MAX_DRIVE_BYTES {
        return Err(refuse(
            path,
            format!(
                "image of {} is larger than a page blob can hold (8 TiB with the footer)",
                format_size(data_len)
            ),
        ));
    }
    Ok(SourceImage {
        kind,
        file_len,
        file_data_len: file_len,
        data_len,
        footer: Footer::new_fixed(data_len).to_bytes(),
        dynamic: None,
    })
}

/// A dynamic VHD, checked whole: its disk is uploaded as a fixed VHD of the
/// same size (rounded up to whole MiB with `pad`) and the same unique id.
fn dynamic_image(path: &Path, file: &File, file_len: u64, pad: bool) -> Result<SourceImage> {
    let vhd = DynamicVhd::open(file.try_clone().map_err(io_error("open", path))?)
        .map_err(|e| refuse(path, e.to_string()))?;
    let size = vhd.size_bytes();
    let data_len = if size % MIB == 0 {
        size
    } else if pad {
        size.div_ceil(MIB) * MIB
    } else {
        return Err(refuse(
            path,
            format!(
                "dynamic VHD of {size} bytes is not a whole number of MiB, which Azure requires \
                 of a disk; add --pad to round it up to {} with zeros, or make it with \
                 'qemu-img convert -O vpc -o subformat=dynamic,force_size=on'",
                exact_size(size.div_ceil(MIB) * MIB)
            ),
        ));
    };
    if data_len > MAX_DRIVE_BYTES {
        return Err(refuse(
            path,
            format!(
                "image of {} is larger than a page blob can hold (8 TiB with the footer)",
                format_size(data_len)
            ),
        ));
    }
    let mut footer = Footer::new_fixed(data_len);
    footer.unique_id = vhd.footer().unique_id;
    Ok(SourceImage {
        kind: ImageKind::DynamicVhd,
        file_len,
        file_data_len: size,
        data_len,
        footer: footer.to_bytes(),
        dynamic: Some(Arc::new(vhd)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_with(len: u64, tail: Option<[u8; 512]>) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("img");
        let mut f = File::create(&path).expect("create");
        f.set_len(len).expect("set_len");
        if let Some(t) = tail {
            f.write_all_at(&t, len - 512).expect("write");
        }
        f.flush().expect("flush");
        (dir, path)
    }

    fn inspect_path(p: &Path, pad: bool) -> Result<SourceImage> {
        inspect(p, &File::open(p).expect("open"), pad)
    }

    #[test]
    fn raw_whole_mib_gets_a_new_footer() {
        let (_d, p) = file_with(16 * MIB, None);
        let img = inspect_path(&p, false).expect("accepted");
        assert_eq!(img.kind, ImageKind::Raw);
        assert_eq!(img.blob_size(), 16 * MIB + 512);
        let f = Footer::parse(&img.footer, img.blob_size()).expect("valid footer");
        assert_eq!(f.current_size_bytes, 16 * MIB);
    }

    #[test]
    fn raw_odd_size_is_refused_or_padded() {
        let (_d, p) = file_with(10 * MIB + 1000, None);
        let err = inspect_path(&p, false).expect_err("refused").to_string();
        assert!(
            err.contains("not a whole number of MiB") && err.contains("--pad"),
            "{err}"
        );
        assert!(err.contains("11M"), "{err}");
        let img = inspect_path(&p, true).expect("padded");
        assert_eq!((img.kind, img.data_len), (ImageKind::RawPadded, 11 * MIB));
    }

    #[test]
    fn fixed_vhd_footer_is_kept_and_a_bare_dynamic_footer_is_corrupt() {
        let footer = Footer::new_fixed(4 * MIB).to_bytes();
        let (_d, p) = file_with(4 * MIB + 512, Some(footer));
        let img = inspect_path(&p, false).expect("fixed VHD");
        assert_eq!(img.kind, ImageKind::FixedVhd);
        assert_eq!(img.footer, footer);
        assert_eq!(img.data_len, 4 * MIB);

        let mut dynamic = Footer::new_fixed(4 * MIB);
        dynamic.disk_type = vhd::DiskType::from_u32(3);
        let (_d2, p2) = file_with(4 * MIB + 512, Some(dynamic.to_bytes()));
        let err = inspect_path(&p2, false).expect_err("dynamic").to_string();
        assert!(err.contains("corrupt dynamic VHD"), "{err}");
    }
}
