//! Request authorization: Shared Key signing and SAS appending.
//!
//! Owns the Shared Key string-to-sign (Blob service, versions 2015-02-21 and
//! later) and nothing else. Invariants: the key is only ever fed to HMAC, and
//! the canonicalized resource uses the URL path exactly as sent (each segment
//! encoded once, as the service and the official SDKs do) with decoded query
//! values.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The parts of a request that Shared Key signs.
pub(crate) struct Signable<'a> {
    /// HTTP verb, upper case.
    pub method: &'a str,
    /// Every header sent, names in lower case.
    pub headers: &'a [(String, String)],
    /// Body length (signed as the empty string when 0).
    pub content_length: u64,
    /// Account name.
    pub account: &'a str,
    /// URL path as sent (percent-encoded), starting with `/`. For Azurite's
    /// path-style endpoint it starts with `/devstoreaccount1/`.
    pub url_path: &'a str,
    /// Query parameters, decoded.
    pub query: &'a [(String, String)],
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> &'a str {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
        .unwrap_or("")
}

/// The Shared Key string-to-sign for a Blob service request.
pub(crate) fn string_to_sign(r: &Signable<'_>) -> String {
    let mut s = String::with_capacity(256);
    s.push_str(r.method);
    s.push('\n');
    for name in ["content-encoding", "content-language"] {
        s.push_str(header(r.headers, name));
        s.push('\n');
    }
    if r.content_length > 0 {
        s.push_str(&r.content_length.to_string());
    }
    s.push('\n');
    for name in [
        "content-md5",
        "content-type",
        "date",
        "if-modified-since",
        "if-match",
        "if-none-match",
        "if-unmodified-since",
        "range",
    ] {
        s.push_str(header(r.headers, name));
        s.push('\n');
    }
    // Canonicalized headers: x-ms-*, lower case, sorted, trimmed values.
    let mut ms: Vec<(String, &str)> = r
        .headers
        .iter()
        .map(|(n, v)| (n.to_ascii_lowercase(), v.trim()))
        .filter(|(n, _)| n.starts_with("x-ms-"))
        .collect();
    ms.sort();
    for (n, v) in ms {
        s.push_str(&n);
        s.push(':');
        s.push_str(v);
        s.push('\n');
    }
    // Canonicalized resource.
    s.push('/');
    s.push_str(r.account);
    s.push_str(r.url_path);
    let mut q: Vec<(String, &str)> = r
        .query
        .iter()
        .map(|(n, v)| (n.to_ascii_lowercase(), v.as_str()))
        .collect();
    q.sort();
    let mut i = 0;
    while i < q.len() {
        let name = &q[i].0;
        let mut values: Vec<&str> = q[i..]
            .iter()
            .take_while(|(n, _)| n == name)
            .map(|(_, v)| *v)
            .collect();
        let n = values.len();
        values.sort_unstable();
        s.push('\n');
        s.push_str(name);
        s.push(':');
        s.push_str(&values.join(","));
        i += n;
    }
    s
}

/// `base64(HMAC-SHA256(key, string_to_sign))`.
pub(crate) fn sign(key: &[u8], string_to_sign: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC accepts keys of any length");
    mac.update(string_to_sign.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

/// The `Authorization` header value for a signed request.
pub(crate) fn authorization(account: &str, key: &[u8], r: &Signable<'_>) -> String {
    format!("SharedKey {account}:{}", sign(key, &string_to_sign(r)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    /// Hand-built from the REST documentation's rules: a Put Page on
    /// Azurite's path-style endpoint.
    #[test]
    fn put_page_string_to_sign_matches_hand_computed_vector() {
        let headers = h(&[
            ("x-ms-version", "2021-08-06"),
            ("x-ms-date", "Sun, 22 Nov 2026 11:00:00 GMT"),
            ("x-ms-range", "bytes=0-511"),
            ("x-ms-page-write", "update"),
            ("x-ms-lease-id", "0f0e0d0c-0000-4000-8000-000000000001"),
        ]);
        let query = h(&[("comp", "page")]);
        let s = string_to_sign(&Signable {
            method: "PUT",
            headers: &headers,
            content_length: 512,
            account: "devstoreaccount1",
            url_path: "/devstoreaccount1/disks/a%20b.vhd",
            query: &query,
        });
        let expected = "PUT\n\n\n512\n\n\n\n\n\n\n\n\n\
x-ms-date:Sun, 22 Nov 2026 11:00:00 GMT\n\
x-ms-lease-id:0f0e0d0c-0000-4000-8000-000000000001\n\
x-ms-page-write:update\n\
x-ms-range:bytes=0-511\n\
x-ms-version:2021-08-06\n\
/devstoreaccount1/devstoreaccount1/disks/a%20b.vhd\ncomp:page";
        assert_eq!(s, expected);
    }

    /// Zero Content-Length is signed as the empty string; If-None-Match is
    /// signed in its slot; query names are lower-cased, sorted, values decoded
    /// and repeated names joined by commas.
    #[test]
    fn create_and_list_string_to_sign() {
        let headers = h(&[
            ("If-None-Match", "*"),
            ("x-ms-blob-type", "PageBlob"),
            ("x-ms-date", "Sun, 22 Nov 2026 11:00:00 GMT"),
            ("x-ms-version", "2021-08-06"),
        ]);
        let s = string_to_sign(&Signable {
            method: "PUT",
            headers: &headers,
            content_length: 0,
            account: "acct",
            url_path: "/c/b",
            query: &[],
        });
        assert_eq!(
            s,
            "PUT\n\n\n\n\n\n\n\n\n*\n\n\nx-ms-blob-type:PageBlob\nx-ms-date:Sun, 22 Nov 2026 11:00:00 GMT\nx-ms-version:2021-08-06\n/acct/c/b"
        );
        let q = h(&[
            ("restype", "container"),
            ("comp", "list"),
            ("include", "snapshots"),
            ("prefix", "a b/"),
            ("Include", "metadata"),
        ]);
        let s = string_to_sign(&Signable {
            method: "GET",
            headers: &[],
            content_length: 0,
            account: "acct",
            url_path: "/c",
            query: &q,
        });
        assert!(s.ends_with(
            "/acct/c\ncomp:list\ninclude:metadata,snapshots\nprefix:a b/\nrestype:container"
        ));
    }

    /// HMAC-SHA256 known answer (RFC 4231 test case 2), base64-encoded.
    #[test]
    fn signature_is_base64_hmac_sha256() {
        assert_eq!(
            sign(b"Jefe", "what do ya want for nothing?"),
            "W9zBRr9gdU5qBCQmCJV1x1oAPwidJzmDnexYuWTsOEM="
        );
    }
}
