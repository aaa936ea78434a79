//! Units and sizes shared by every layer: the 512-byte page, the 4 MiB Put Page
//! limit, the VHD footer size, the one parser and formatter for human sizes
//! (`512M`, `10G`, `1.5 GiB`), and the size rules for new drives.
//!
//! Offsets in bytes and in pages are easy to mix up; a mix-up corrupts a disk.
//! Page quantities carry the `_pages` suffix or the `drive::PageRange` type.

/// Size of one page of a page blob, the unit of every write and clear.
pub const PAGE_SIZE: u64 = 512;
/// Largest body a single Put Page (update) may carry.
pub const MAX_PUT_PAGE_BYTES: u64 = 4 * 1024 * 1024;
/// Largest single Get Blob the drive issues. Our choice, not a service limit:
/// a fetch and a read-ahead step are cut to it, so one request's body stays
/// bounded in memory, and it matches a Put Page.
pub const MAX_GET_BYTES: u64 = 4 * 1024 * 1024;
/// Size of the fixed VHD footer at the end of a drive's blob.
pub const VHD_FOOTER_BYTES: u64 = 512;
/// Largest page blob the service accepts (8 TiB).
pub const MAX_PAGE_BLOB_BYTES: u64 = 8 * 1024 * 1024 * 1024 * 1024;

/// A half-open byte range `[start, end)` of a blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct ByteRange {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
}

impl ByteRange {
    /// A range from `start` (inclusive) to `end` (exclusive).
    pub fn new(start: u64, end: u64) -> Self {
        debug_assert!(start <= end, "range start {start} after end {end}");
        ByteRange { start, end }
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// True when the range holds no byte.
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }
}

/// One kibibyte.
pub const KIB: u64 = 1024;
/// One mebibyte.
pub const MIB: u64 = 1024 * KIB;
/// One gibibyte.
pub const GIB: u64 = 1024 * MIB;
/// One tebibyte.
pub const TIB: u64 = 1024 * GIB;
/// Smallest drive `create` makes.
pub const MIN_DRIVE_BYTES: u64 = 16 * MIB;
/// Largest drive: the blob (disk + footer) must fit in a page blob.
pub const MAX_DRIVE_BYTES: u64 = MAX_PAGE_BLOB_BYTES - VHD_FOOTER_BYTES;

/// A size given by a person that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// Nothing given.
    #[error("empty size; give a number with an optional unit, like 512M or 10G")]
    Empty,
    /// Not a number followed by a known unit.
    #[error("invalid size '{0}'; give a number with an optional unit K, M, G or T (binary, e.g. 512M, 10G, 1.5T)")]
    Invalid(String),
    /// A fraction that does not come to a whole number of bytes (`1.3K`).
    #[error("size '{0}' is not a whole number of bytes")]
    NotWholeBytes(String),
    /// More than 16 EiB.
    #[error("size '{0}' is too large")]
    Overflow(String),
    /// A drive size that is not a whole number of MiB (Azure refuses those).
    #[error("drive size {bytes} bytes ({}) is not a whole number of MiB; use {}", format_size(*.bytes), suggest_either(*.bytes))]
    NotWholeMib {
        /// The size asked for.
        bytes: u64,
    },
    /// Below [`MIN_DRIVE_BYTES`].
    #[error("drive size {} is too small; the smallest drive is 16M", format_size(*.bytes))]
    TooSmall {
        /// The size asked for.
        bytes: u64,
    },
    /// Above [`MAX_DRIVE_BYTES`].
    #[error("drive size {} is too large; a page blob holds at most 8 TiB including the 512-byte footer, so the largest drive is {}", format_size(*.bytes), exact_size(MAX_DRIVE_BYTES / MIB * MIB))]
    TooLarge {
        /// The size asked for.
        bytes: u64,
    },
}

/// Parse a size a person typed: a number with an optional binary unit.
///
/// Units are K, M, G, T (powers of 1024), case-insensitive, optionally followed
/// by `iB` or `B` (`10G`, `10GB`, `10GiB` are the same); no unit or `B` means
/// bytes. A decimal fraction is accepted when it comes to whole bytes
/// (`1.5G` is 1536 MiB; `1.3K` is refused). Spaces around the number and
/// between number and unit are allowed.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let text = s.trim();
    if text.is_empty() {
        return Err(SizeError::Empty);
    }
    let invalid = || SizeError::Invalid(text.to_string());
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = (&text[..split], text[split..].trim_start());
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => KIB,
        "m" | "mb" | "mib" => MIB,
        "g" | "gb" | "gib" => GIB,
        "t" | "tb" | "tib" => TIB,
        _ => return Err(invalid()),
    };
    let (whole, fraction) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number, ""),
    };
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
        return Err(invalid());
    }
    if fraction.len() > 18 {
        return Err(SizeError::NotWholeBytes(text.to_string()));
    }
    let overflow = || SizeError::Overflow(text.to_string());
    let whole_value: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| overflow())?
    };
    let fraction_value: u128 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().map_err(|_| invalid())?
    };
    let scale = 10u128.pow(fraction.len() as u32);
    let fraction_bytes = fraction_value * u128::from(multiplier);
    if fraction_bytes % scale != 0 {
        return Err(SizeError::NotWholeBytes(text.to_string()));
    }
    let total = whole_value
        .checked_mul(u128::from(multiplier))
        .and_then(|v| v.checked_add(fraction_bytes / scale))
        .ok_or_else(overflow)?;
    u64::try_from(total).map_err(|_| overflow())
}

/// A size for people: bytes below 1 KiB, otherwise KiB, MiB, GiB or TiB with
/// one decimal (`512 B`, `1.5 GiB`, `16.0 MiB`).
pub fn format_size(bytes: u64) -> String {
    if bytes < KIB {
        return format!("{bytes} B");
    }
    let units = [(TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")];
    // Pick the unit on the rounded value, so 1023.96 MiB prints as 1.0 GiB.
    let tenths = |unit: u64| (u128::from(bytes) * 10 + u128::from(unit) / 2) / u128::from(unit);
    let (unit, name) = units
        .iter()
        .copied()
        .find(|(unit, _)| tenths(*unit) >= 10)
        .unwrap_or((KIB, "KiB"));
    let t = tenths(unit);
    format!("{}.{} {name}", t / 10, t % 10)
}

/// A size written exactly in the largest unit that divides it (`10G`, `1025M`,
/// `512`): what a person can type back into `--size`.
pub fn exact_size(bytes: u64) -> String {
    for (unit, suffix) in [(TIB, "T"), (GIB, "G"), (MIB, "M"), (KIB, "K")] {
        if bytes >= unit && bytes % unit == 0 {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

/// The valid drive sizes on either side of an unaligned one, for error messages.
fn suggest_either(bytes: u64) -> String {
    let down = bytes / MIB * MIB;
    let up = down.saturating_add(MIB);
    let down_ok = down >= MIN_DRIVE_BYTES;
    let up_ok = up <= MAX_DRIVE_BYTES;
    match (down_ok, up_ok) {
        (true, true) => format!("{} or {}", exact_size(down), exact_size(up)),
        (true, false) => exact_size(down),
        (false, _) => exact_size(up.max(MIN_DRIVE_BYTES)),
    }
}

/// The rules for the size of a new drive: a whole number of MiB (Azure accepts
/// only such fixed VHDs), at least 16 MiB, and with its footer no larger than a
/// page blob can be (8 TiB). Errors name the nearest valid size.
pub fn check_drive_size(bytes: u64) -> Result<(), SizeError> {
    if bytes > MAX_DRIVE_BYTES {
        return Err(SizeError::TooLarge { bytes });
    }
    if bytes < MIN_DRIVE_BYTES {
        return Err(SizeError::TooSmall { bytes });
    }
    if bytes % MIB != 0 {
        return Err(SizeError::NotWholeMib { bytes });
    }
    Ok(())
}

/// The smallest size a new drive can have that holds at least `bytes`: up
/// to a whole number of MiB, and at least [`MIN_DRIVE_BYTES`], by the rules
/// of [`check_drive_size`] (for callers that round instead of refusing, like
/// a CSI `CreateVolume`'s capacity range). Fails when no drive is that large.
pub fn drive_size_at_least(bytes: u64) -> Result<u64, SizeError> {
    let rounded = bytes
        .max(MIN_DRIVE_BYTES)
        .div_ceil(MIB)
        .checked_mul(MIB)
        .ok_or(SizeError::TooLarge { bytes })?;
    check_drive_size(rounded).map(|()| rounded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn drive_size_at_least_rounds_up_to_a_valid_drive() {
        assert_eq!(drive_size_at_least(0), Ok(MIN_DRIVE_BYTES));
        assert_eq!(drive_size_at_least(MIB + 1), Ok(MIN_DRIVE_BYTES));
        assert_eq!(drive_size_at_least(GIB), Ok(GIB));
        assert_eq!(drive_size_at_least(GIB + 1), Ok(GIB + MIB));
        let largest = MAX_DRIVE_BYTES / MIB * MIB;
        assert_eq!(drive_size_at_least(largest - 1), Ok(largest));
        assert!(drive_size_at_least(largest + 1).is_err());
        assert!(drive_size_at_least(u64::MAX).is_err());
    }

    #[test]
    fn sizes_with_binary_units_parse() {
        assert_eq!(parse_size("512M"), Ok(512 * MIB));
        assert_eq!(parse_size("10G"), Ok(10 * GIB));
        assert_eq!(parse_size("1T"), Ok(TIB));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("10GiB"), Ok(10 * GIB));
        assert_eq!(parse_size("10gb"), Ok(10 * GIB));
        assert_eq!(parse_size(" 16 MiB "), Ok(16 * MIB));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4096B"), Ok(4096));
        assert_eq!(parse_size("0"), Ok(0));
    }

    #[test]
    fn fractions_are_accepted_when_they_are_whole_bytes() {
        assert_eq!(parse_size("1.5G"), Ok(1536 * MIB));
        assert_eq!(parse_size(".5M"), Ok(512 * KIB));
        assert_eq!(parse_size("2.M"), Ok(2 * MIB));
        assert_eq!(parse_size("0.25K"), Ok(256));
        assert_eq!(
            parse_size("1.3K"),
            Err(SizeError::NotWholeBytes("1.3K".into()))
        );
        assert_eq!(
            parse_size("1.5"),
            Err(SizeError::NotWholeBytes("1.5".into()))
        );
    }

    #[test]
    fn garbage_sizes_are_refused_with_a_hint() {
        assert_eq!(parse_size(""), Err(SizeError::Empty));
        assert_eq!(parse_size("   "), Err(SizeError::Empty));
        for bad in [
            "G", "10X", "ten", "-5M", "1.2.3G", "10 G B", "0x10", "1e9", ".", "M10",
        ] {
            assert!(
                matches!(parse_size(bad), Err(SizeError::Invalid(_))),
                "{bad} -> {:?}",
                parse_size(bad)
            );
        }
        let msg = parse_size("10X").unwrap_err().to_string();
        assert!(msg.contains("'10X'") && msg.contains("512M"), "{msg}");
    }

    #[test]
    fn sizes_beyond_u64_overflow() {
        assert!(matches!(
            parse_size("16777216T"),
            Err(SizeError::Overflow(_))
        ));
        assert!(matches!(
            parse_size("99999999999999999999999999999999999999999"),
            Err(SizeError::Overflow(_))
        ));
        assert_eq!(parse_size("16777215T"), Ok(16_777_215 * TIB));
    }

    #[test]
    fn sizes_format_with_one_decimal() {
        assert_eq!(format_size(0), "0 B");
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(1024), "1.0 KiB");
        assert_eq!(format_size(1536), "1.5 KiB");
        assert_eq!(format_size(16 * MIB), "16.0 MiB");
        assert_eq!(format_size(1536 * MIB), "1.5 GiB");
        assert_eq!(format_size(GIB - 1), "1.0 GiB");
        assert_eq!(format_size(8 * TIB - 512), "8.0 TiB");
        assert_eq!(format_size(2048 * TIB), "2048.0 TiB");
        assert_eq!(format_size(u64::MAX), "16777216.0 TiB");
    }

    #[test]
    fn exact_sizes_can_be_typed_back() {
        assert_eq!(exact_size(10 * GIB), "10G");
        assert_eq!(exact_size(1025 * MIB), "1025M");
        assert_eq!(exact_size(8 * TIB - MIB), "8388607M");
        assert_eq!(exact_size(512), "512");
        assert_eq!(exact_size(0), "0");
    }

    #[test]
    fn drive_sizes_must_be_whole_mib_between_16m_and_8t() {
        assert_eq!(check_drive_size(16 * MIB), Ok(()));
        assert_eq!(check_drive_size(8 * TIB - MIB), Ok(()));
        assert_eq!(check_drive_size(10 * GIB), Ok(()));
        assert_eq!(
            check_drive_size(15 * MIB),
            Err(SizeError::TooSmall { bytes: 15 * MIB })
        );
        assert_eq!(
            check_drive_size(8 * TIB),
            Err(SizeError::TooLarge { bytes: 8 * TIB })
        );
        assert_eq!(
            check_drive_size(8 * TIB - 512),
            Err(SizeError::NotWholeMib {
                bytes: 8 * TIB - 512
            })
        );
    }

    #[test]
    fn drive_size_errors_name_the_nearest_valid_size() {
        let msg = check_drive_size(GIB + 512).unwrap_err().to_string();
        assert!(msg.ends_with("use 1G or 1025M"), "{msg}");
        let msg = check_drive_size(8 * TIB - 512).unwrap_err().to_string();
        assert!(msg.ends_with("use 8388607M"), "{msg}");
        let msg = check_drive_size(8 * TIB).unwrap_err().to_string();
        assert!(msg.contains("largest drive is 8388607M"), "{msg}");
        let msg = check_drive_size(MIB).unwrap_err().to_string();
        assert!(msg.contains("smallest drive is 16M"), "{msg}");
    }

    proptest! {
        #[test]
        fn exact_size_parses_back(bytes in any::<u64>()) {
            prop_assert_eq!(parse_size(&exact_size(bytes)), Ok(bytes));
        }

        #[test]
        fn parse_size_never_panics(s in "\\PC{0,24}") {
            let _ = parse_size(&s);
        }
    }
}
