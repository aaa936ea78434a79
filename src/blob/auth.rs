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
    // Canonicalized headers: x-ms-*, lower case, in the service's order,
    // trimmed values.
    let mut ms: Vec<(String, &str)> = r
        .headers
        .iter()
        .map(|(n, v)| (n.to_ascii_lowercase(), v.trim()))
        .filter(|(n, _)| n.starts_with("x-ms-"))
        .collect();
    ms.sort_by_cached_key(|(n, _)| header_sort_key(n));
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

/// The order the service sorts canonicalized header names in. It is a
/// collation, not byte order: `_` comes before digits and letters (it
/// matters for metadata names such as `x-ms-meta-_a` and `x-ms-meta-a1`).
/// Header names here hold only lower-case letters, digits, `-` and `_`, and
/// their hyphens sit at the same places, for which this key is exact.
fn header_sort_key(name: &str) -> Vec<u8> {
    name.bytes()
        .map(|b| if b == b'_' { 0x01 } else { b })
        .collect()
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

    /// The same requests signed by the official Python SDK
    /// (`azure-storage-blob`, its SharedKeyCredentialPolicy) give the same
    /// Authorization header. Requires python3 with the SDK (CI installs it).
    #[test]
    fn signatures_match_the_python_sdk() {
        let key_b64 = crate::blob::account::DEV_ACCOUNT_KEY;
        let key = base64::engine::general_purpose::STANDARD
            .decode(key_b64)
            .unwrap();
        // (method, URL path as sent, query as sent, headers, body length)
        type Case = (
            &'static str,
            &'static str,
            &'static str,
            Vec<(&'static str, &'static str)>,
            u64,
        );
        let cases: Vec<Case> = vec![
            (
                "PUT",
                "/devstoreaccount1/disks/a%20b%2Bc%25%23%3F%C3%BC.vhd",
                "comp=page&snapshot=2026-01-01T00%3A00%3A00.0000000Z",
                vec![
                    ("x-ms-range", "bytes=0-511"),
                    ("x-ms-page-write", "update"),
                    ("x-ms-lease-id", "6a3f0e36-8f7d-4a51-b1f4-4bb0a6a1d9a2"),
                ],
                512,
            ),
            (
                "PUT",
                "/devstoreaccount1/c/d.vhd",
                "comp=metadata",
                vec![
                    ("x-ms-meta-_a", "1"),
                    ("x-ms-meta-a1", "2"),
                    ("x-ms-meta-a_b", "3"),
                    ("x-ms-meta-ab", "4"),
                    ("x-ms-meta-b", "5"),
                ],
                0,
            ),
            (
                "PUT",
                "/devstoreaccount1/c/new.vhd",
                "",
                vec![
                    ("If-None-Match", "*"),
                    ("x-ms-blob-type", "PageBlob"),
                    ("x-ms-blob-content-length", "1048576"),
                ],
                0,
            ),
            (
                "GET",
                "/devstoreaccount1/c",
                "restype=container&comp=list&prefix=a%20b%2F&include=metadata%2Csnapshots&maxresults=7",
                vec![],
                0,
            ),
        ];
        let mut script = String::from(
            r#"import sys
from azure.storage.blob._shared.authentication import SharedKeyCredentialPolicy
from azure.core.pipeline import PipelineRequest, PipelineContext
from azure.core.pipeline.transport import HttpRequest
pol = SharedKeyCredentialPolicy('devstoreaccount1', sys.argv[1])
def sign(method, url, headers):
    r = HttpRequest(method, url, headers=headers)
    pol.on_request(PipelineRequest(r, PipelineContext(None)))
    print(r.headers['Authorization'])
"#,
        );
        let mut ours = Vec::new();
        for (method, path, query, extra, len) in &cases {
            let mut headers: Vec<(String, String)> = extra
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect();
            headers.push(("x-ms-version".into(), "2021-12-02".into()));
            headers.push(("x-ms-date".into(), "Sun, 22 Nov 2026 11:00:00 GMT".into()));
            let decoded: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect();
            ours.push(authorization(
                "devstoreaccount1",
                &key,
                &Signable {
                    method,
                    headers: &headers,
                    content_length: *len,
                    account: "devstoreaccount1",
                    url_path: path,
                    query: &decoded,
                },
            ));
            let mut py_headers: Vec<String> = headers
                .iter()
                .map(|(k, v)| format!("{k:?}: {v:?}"))
                .collect();
            py_headers.push(format!("'Content-Length': '{len}'"));
            let sep = if query.is_empty() { "" } else { "?" };
            script.push_str(&format!(
                "sign({method:?}, 'http://127.0.0.1:10000{path}{sep}{query}', {{{}}})\n",
                py_headers.join(", ")
            ));
        }
        let out = std::process::Command::new("python3")
            .arg("-c")
            .arg(&script)
            .arg(key_b64)
            .output()
            .expect("python3 with azure-storage-blob is required for this test");
        assert!(
            out.status.success(),
            "python failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let theirs: Vec<String> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect();
        assert_eq!(ours, theirs);
    }
}
