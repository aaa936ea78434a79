//! Naming a blob: `CONTAINER/PATH/TO/BLOB` relative to the account, or a full
//! URL, optionally at a snapshot.
//!
//! Owns validation of container and blob names and the one place that turns
//! a name into URL path segments. Invariant: each path segment of a blob name
//! is percent-encoded exactly once, when the URL is built; a `BlobPath` always
//! holds the decoded name.

use std::fmt;

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use url::Url;

use super::error::{Error, ErrorKind, Result};

/// Everything but the RFC 3986 unreserved characters gets percent-encoded.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// Percent-encode one URL path segment or query value.
pub(crate) fn encode_component(s: &str) -> String {
    utf8_percent_encode(s, SEGMENT).to_string()
}

/// A blob (or a snapshot of one) within the account.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
pub struct BlobPath {
    /// Container name.
    pub container: String,
    /// Blob name, decoded (may contain `/`).
    pub name: String,
    /// Snapshot time (`2026-01-01T00:00:00.0000000Z`), if addressing a snapshot.
    pub snapshot: Option<String>,
}

fn invalid(target: &str, message: impl Into<String>) -> Error {
    Error::other(ErrorKind::InvalidInput, "parse blob path", target, message)
}

/// Check a container name: 3-63 characters of lowercase letters, digits and
/// single hyphens, starting and ending with a letter or digit (`$root`,
/// `$logs` and `$web` are also valid).
pub fn validate_container_name(name: &str) -> Result<()> {
    if matches!(name, "$root" | "$logs" | "$web") {
        return Ok(());
    }
    let ok = (3..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--");
    if ok {
        Ok(())
    } else {
        Err(invalid(
            name,
            format!(
                "invalid container name {name:?}: use 3-63 lowercase letters, digits and single hyphens, starting and ending with a letter or digit"
            ),
        ))
    }
}

/// Check a blob name: 1-1024 characters, no `.` or `..` path segment (URL
/// normalization would rewrite them), no control characters.
pub fn validate_blob_name(container: &str, name: &str) -> Result<()> {
    let target = format!("{container}/{name}");
    let len = name.chars().count();
    if len == 0 || len > 1024 {
        return Err(invalid(
            &target,
            format!("invalid blob name: it must be 1-1024 characters, not {len}"),
        ));
    }
    if name.split('/').any(|s| s == "." || s == "..") {
        return Err(invalid(
            &target,
            "invalid blob name: it must not contain a '.' or '..' path segment",
        ));
    }
    if name.chars().any(|c| c.is_control()) {
        return Err(invalid(
            &target,
            "invalid blob name: it must not contain control characters",
        ));
    }
    Ok(())
}

impl BlobPath {
    /// A validated path to a blob (no snapshot).
    pub fn new(container: &str, name: &str) -> Result<BlobPath> {
        validate_container_name(container)?;
        validate_blob_name(container, name)?;
        Ok(BlobPath {
            container: container.to_string(),
            name: name.to_string(),
            snapshot: None,
        })
    }

    /// The same blob at snapshot `time` (`None`: the base blob).
    pub fn with_snapshot(mut self, time: Option<&str>) -> BlobPath {
        self.snapshot = time.map(str::to_string);
        self
    }

    /// The base blob of this path (no snapshot).
    pub fn base(&self) -> BlobPath {
        self.clone().with_snapshot(None)
    }

    /// Parse `CONTAINER/PATH/TO/BLOB` (the name is taken literally: `?`, `#`,
    /// `%` are part of it) or a full `http(s)://` URL, whose path is
    /// percent-decoded and whose `?snapshot=T` selects a snapshot. For a
    /// path-style URL on an IP address or `localhost` (Azurite) the first path
    /// segment is the account and is skipped.
    pub fn parse(s: &str) -> Result<BlobPath> {
        if s.starts_with("http://") || s.starts_with("https://") {
            return Self::parse_url(s);
        }
        let Some((container, name)) = s.split_once('/') else {
            return Err(invalid(
                s,
                format!("{s:?} is not CONTAINER/BLOB: a blob name is missing"),
            ));
        };
        BlobPath::new(container, name)
    }

    fn parse_url(s: &str) -> Result<BlobPath> {
        let url = Url::parse(s).map_err(|e| invalid(s, format!("not a valid URL: {e}")))?;
        let host = url.host_str().unwrap_or_default();
        let path_style = host == "localhost"
            || host.starts_with('[')
            || host.parse::<std::net::IpAddr>().is_ok();
        let raw = url.path().trim_start_matches('/');
        let raw = if path_style {
            raw.split_once('/').map(|(_, rest)| rest).unwrap_or("")
        } else {
            raw
        };
        let Some((container, name)) = raw.split_once('/') else {
            return Err(invalid(s, "the URL does not name CONTAINER/BLOB"));
        };
        let decode = |p: &str| {
            percent_decode_str(p)
                .decode_utf8()
                .map(|c| c.into_owned())
                .map_err(|_| invalid(s, "the URL path is not valid UTF-8 once decoded"))
        };
        let name = name
            .split('/')
            .map(decode)
            .collect::<Result<Vec<_>>>()?
            .join("/");
        let snapshot = url
            .query_pairs()
            .find(|(k, _)| k == "snapshot")
            .map(|(_, v)| v.into_owned());
        Ok(BlobPath::new(&decode(container)?, &name)?.with_snapshot(snapshot.as_deref()))
    }

    /// The URL path of this blob below the account endpoint: container and
    /// each name segment percent-encoded once, joined by `/`.
    pub(crate) fn url_path(&self) -> String {
        let mut p = encode_component(&self.container);
        for seg in self.name.split('/') {
            p.push('/');
            p.push_str(&encode_component(seg));
        }
        p
    }
}

impl fmt::Display for BlobPath {
    /// `container/name`, or `container/name@snapshot`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.container, self.name)?;
        if let Some(s) = &self.snapshot {
            write!(f, "@{s}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_paths_keep_special_characters_literally() {
        let p = BlobPath::parse("disks/a b/c%20d+e#f?g/ünï.vhd").unwrap();
        assert_eq!(p.container, "disks");
        assert_eq!(p.name, "a b/c%20d+e#f?g/ünï.vhd");
        assert_eq!(p.snapshot, None);
        assert_eq!(
            p.url_path(),
            "disks/a%20b/c%2520d%2Be%23f%3Fg/%C3%BCn%C3%AF.vhd"
        );
        assert_eq!(p.to_string(), "disks/a b/c%20d+e#f?g/ünï.vhd");
    }

    #[test]
    fn urls_are_decoded_once_and_carry_the_snapshot() {
        let p = BlobPath::parse(
            "https://acct.blob.core.windows.net/disks/a%20b/c%2520d.vhd?snapshot=2026-01-01T00%3A00%3A00.0000000Z",
        )
        .unwrap();
        assert_eq!(p.container, "disks");
        assert_eq!(p.name, "a b/c%20d.vhd");
        assert_eq!(p.snapshot.as_deref(), Some("2026-01-01T00:00:00.0000000Z"));
        assert_eq!(
            p.to_string(),
            "disks/a b/c%20d.vhd@2026-01-01T00:00:00.0000000Z"
        );
        let p = BlobPath::parse("http://127.0.0.1:10000/devstoreaccount1/c1x/d.vhd").unwrap();
        assert_eq!((p.container.as_str(), p.name.as_str()), ("c1x", "d.vhd"));
    }

    #[test]
    fn bad_names_get_one_clear_error() {
        for bad in [
            "nocontainer",
            "ab/x",
            "Upper/x",
            "a--b/x",
            "-ab/x",
            "abc/",
            "abc/a/../b",
            &format!("abc/{}", "x".repeat(1025)),
        ] {
            let e = BlobPath::parse(bad).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidInput, "{bad}");
            assert!(
                e.to_string().contains("invalid") || e.to_string().contains("missing"),
                "{e}"
            );
        }
        assert!(BlobPath::parse(&format!("abc/{}", "x".repeat(1024))).is_ok());
        assert!(BlobPath::parse("$root/x").is_ok());
    }
}
