//! The answers the model makes itself instead of the upstream: the
//! service's `503 ServerBusy` (status line, headers and error body as the
//! service sends them) and the model's own JSON pages.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use crate::pacing::Cap;

/// The service's answer to a request over `cap`: `503`, `x-ms-error-code:
/// ServerBusy`, the XML error body, `Connection: close` (the request's body,
/// if any, was not read). `version` echoes the request's `x-ms-version`.
pub fn server_busy(cap: Cap, version: Option<&str>) -> Vec<u8> {
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let request_id = format!("00000000-0000-4000-8000-{id:012x}");
    let now = SystemTime::now();
    let body = format!(
        "\u{feff}<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>ServerBusy</Code>\
<Message>{}\nRequestId:{request_id}\nTime:{}</Message></Error>",
        cap.message(),
        iso_time(now),
    );
    let mut head = format!(
        "HTTP/1.1 503 {}\r\nContent-Length: {}\r\nContent-Type: application/xml\r\n\
Server: Windows-Azure-Blob/1.0 Microsoft-HTTPAPI/2.0\r\nx-ms-request-id: {request_id}\r\n\
x-ms-error-code: ServerBusy\r\nDate: {}\r\nConnection: close\r\n",
        cap.message(),
        body.len(),
        httpdate::fmt_http_date(now),
    );
    if let Some(v) = version {
        head.push_str(&format!("x-ms-version: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

/// `200 OK` with a JSON body.
pub fn json(value: &serde_json::Value) -> Vec<u8> {
    let body = value.to_string();
    let mut out = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

/// `404 Not Found` for a model page that does not exist.
pub fn not_found() -> Vec<u8> {
    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec()
}

/// `2026-11-27T04:05:06.123456789Z`: the service's `Time:` line (RFC 3339).
fn iso_time(t: SystemTime) -> String {
    time::OffsetDateTime::from(t)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_answer_carries_the_code_in_header_and_body() {
        let text = String::from_utf8(server_busy(Cap::BlobBytes, Some("2021-08-06")))
            .expect("ASCII and UTF-8");
        let (head, body) = text.split_once("\r\n\r\n").expect("a head");
        assert!(
            head.starts_with("HTTP/1.1 503 The server is busy.\r\n"),
            "{head}"
        );
        assert!(head.contains("\r\nx-ms-error-code: ServerBusy\r\n"));
        assert!(head.contains("\r\nx-ms-version: 2021-08-06"));
        assert!(head.contains(&format!("Content-Length: {}\r\n", body.len())));
        assert!(body.contains("<Code>ServerBusy</Code><Message>The server is busy.\nRequestId:"));
        assert!(body.contains("\nTime:20"), "{body}");
    }
}
