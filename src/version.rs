//! The build's version and the format of the state an attach's serving
//! process hands to the next one, as tags in the binary.
//!
//! Each is a fixed-size tag in the binary's read-only data, read back at
//! run time, so a copy of the binary whose tag bytes were changed (same
//! length, NUL-padded) is a build of another version or format as far as
//! `stats` and an upgrade can tell: how the tests hand an attach over
//! between two "builds" without compiling twice.

/// `MARKER` then the value, NUL-padded to the tag's length.
const VERSION_MARKER: &[u8] = b"blobdrive-version-tag:";
const FORMAT_MARKER: &[u8] = b"blobdrive-state-format-tag:";
const TAG_BYTES: usize = 64;

const fn tag(marker: &[u8], value: &[u8]) -> [u8; TAG_BYTES] {
    let mut out = [0u8; TAG_BYTES];
    let mut i = 0;
    while i < marker.len() {
        out[i] = marker[i];
        i += 1;
    }
    let mut j = 0;
    while j < value.len() {
        out[marker.len() + j] = value[j];
        j += 1;
    }
    out
}

/// The version tag; a `#[used]` static so the bytes stay in the binary.
#[used]
static VERSION_TAG: [u8; TAG_BYTES] = tag(VERSION_MARKER, env!("CARGO_PKG_VERSION").as_bytes());

/// The state format tag (see `daemon/handover.rs`): the layout of the
/// attach's state and write log. Raise it with any change to either.
#[used]
static FORMAT_TAG: [u8; TAG_BYTES] = tag(FORMAT_MARKER, b"1");

/// The value after `marker` in `tag`, read through a volatile load so the
/// compiler does not fold the constant in.
fn read(tag: &'static [u8; TAG_BYTES], marker: &[u8]) -> String {
    // SAFETY: `tag` is a valid reference to a static array.
    let bytes: [u8; TAG_BYTES] = unsafe { std::ptr::read_volatile(tag) };
    let value = &bytes[marker.len()..];
    let end = value.iter().position(|b| *b == 0).unwrap_or(value.len());
    String::from_utf8_lossy(&value[..end]).into_owned()
}

/// This build's version (`0.1.0`).
pub fn version() -> String {
    read(&VERSION_TAG, VERSION_MARKER)
}

/// The state format this build reads and writes.
pub fn state_format() -> u64 {
    read(&FORMAT_TAG, FORMAT_MARKER).parse().unwrap_or(0)
}

/// The version and state format a blobdrive binary file carries (its tags),
/// read from the file without running it; None when it carries none.
pub fn of_binary(path: &std::path::Path) -> std::io::Result<Option<(String, u64)>> {
    let data = std::fs::read(path)?;
    let find = |marker: &[u8]| -> Option<String> {
        let at = data.windows(marker.len()).position(|w| w == marker)?;
        let value = data.get(at + marker.len()..at + TAG_BYTES)?;
        let end = value.iter().position(|b| *b == 0).unwrap_or(value.len());
        Some(String::from_utf8_lossy(&value[..end]).into_owned())
    };
    Ok(match (find(VERSION_MARKER), find(FORMAT_MARKER)) {
        (Some(v), Some(f)) => f.parse().ok().map(|f| (v, f)),
        _ => None,
    })
}

/// The tag bytes of the version `value`, as a copy of the binary would
/// carry them (for tests that make another "build").
pub fn version_tag(value: &str) -> Vec<u8> {
    tag(VERSION_MARKER, value.as_bytes()).to_vec()
}

/// The tag bytes of state format `value` (for tests).
pub fn state_format_tag(value: u64) -> Vec<u8> {
    tag(FORMAT_MARKER, value.to_string().as_bytes()).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tags_read_back_as_the_build_says() {
        assert_eq!(version(), env!("CARGO_PKG_VERSION"));
        assert_eq!(state_format(), 1);
        assert_eq!(version_tag(&version()), VERSION_TAG.to_vec());
        assert_eq!(state_format_tag(1), FORMAT_TAG.to_vec());
    }

    #[test]
    fn a_binary_file_tells_its_version_and_format() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bin");
        let mut bytes = b"ELF...".to_vec();
        bytes.extend(version_tag("2.0.0"));
        bytes.extend(b"...");
        bytes.extend(state_format_tag(7));
        std::fs::write(&file, &bytes).unwrap();
        assert_eq!(of_binary(&file).unwrap(), Some(("2.0.0".into(), 7)));
        std::fs::write(&file, b"no tags").unwrap();
        assert_eq!(of_binary(&file).unwrap(), None);
    }
}
