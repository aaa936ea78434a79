//! Parsing the service's XML: container and blob listings
//! (`EnumerationResults`), page lists (`PageList`) and error bodies
//! (`<Error><Code/><Message/></Error>`). Public so that the fuzz tests
//! (`tests/fuzz_parsers.rs`) can feed the parsers arbitrary bytes; the
//! client is their only caller.
//!
//! The document is first read into a small element tree (bodies are at most
//! a few MiB), then the typed results are picked out of it. Unknown elements
//! are ignored, so newer service versions do not break parsing.
//!
//! Invariants: no body makes a parser panic, overflow or recurse without
//! bound. Elements nest at most [`MAX_DEPTH`] deep (the service's documents
//! nest five), so a hostile or broken body of nested elements is refused
//! instead of building a tree whose drop would exhaust the stack; numbers are
//! checked before any arithmetic (an inclusive `End` of `u64::MAX` has no
//! half-open end).

use std::collections::BTreeMap;

use percent_encoding::percent_decode_str;
use quick_xml::events::Event;
use quick_xml::Reader;

use super::types::{
    BlobItem, BlobListPage, BlobType, ContainerItem, LeaseDuration, LeaseState, LeaseStatus,
};
use crate::units::ByteRange;

/// Deepest nesting of elements accepted. The service's documents nest five
/// deep (`EnumerationResults/Blobs/Blob/Metadata/Key`); anything near this
/// is not one of them.
pub const MAX_DEPTH: usize = 32;

/// One XML element: name, attributes, text and child elements.
#[derive(Debug, Default)]
pub(crate) struct Node {
    pub name: String,
    pub attrs: Vec<(String, String)>,
    pub text: String,
    pub children: Vec<Node>,
}

impl Node {
    fn child(&self, name: &str) -> Option<&Node> {
        self.children.iter().find(|c| c.name == name)
    }

    fn children<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Node> + 'a {
        self.children.iter().filter(move |c| c.name == name)
    }

    fn text_of(&self, name: &str) -> Option<String> {
        self.child(name).map(|c| c.text.clone())
    }

    fn nonempty_text_of(&self, name: &str) -> Option<String> {
        self.text_of(name).filter(|t| !t.is_empty())
    }

    fn attr(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Parse a whole document into its root element.
pub(crate) fn parse_tree(body: &[u8]) -> Result<Node, String> {
    let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    let text = std::str::from_utf8(body).map_err(|_| "response body is not UTF-8".to_string())?;
    let mut reader = Reader::from_str(text);
    let mut stack: Vec<Node> = vec![Node::default()];
    loop {
        let ev = reader
            .read_event()
            .map_err(|e| format!("malformed XML: {e}"))?;
        match ev {
            Event::Start(e) => {
                // The stack holds the document node too.
                if stack.len() > MAX_DEPTH {
                    return Err(format!(
                        "malformed XML: elements nested more than {MAX_DEPTH} deep"
                    ));
                }
                stack.push(start_node(&e)?)
            }
            Event::Empty(e) => {
                let node = start_node(&e)?;
                stack
                    .last_mut()
                    .expect("stack holds the document")
                    .children
                    .push(node);
            }
            Event::End(_) => {
                let node = stack.pop().expect("stack holds the document");
                let parent = stack
                    .last_mut()
                    .ok_or_else(|| "malformed XML: unbalanced end tag".to_string())?;
                parent.children.push(node);
            }
            Event::Text(t) => {
                let s = t
                    .xml_content()
                    .map_err(|e| format!("malformed XML text: {e}"))?;
                stack
                    .last_mut()
                    .expect("stack holds the document")
                    .text
                    .push_str(&s);
            }
            Event::CData(t) => {
                let s = t.decode().map_err(|e| format!("malformed XML text: {e}"))?;
                stack
                    .last_mut()
                    .expect("stack holds the document")
                    .text
                    .push_str(&s);
            }
            Event::GeneralRef(r) => {
                let resolved = if let Some(c) = r
                    .resolve_char_ref()
                    .map_err(|e| format!("malformed XML reference: {e}"))?
                {
                    c.to_string()
                } else {
                    let name = r.decode().map_err(|e| format!("malformed XML: {e}"))?;
                    quick_xml::escape::resolve_xml_entity(&name)
                        .ok_or_else(|| format!("unknown XML entity &{name};"))?
                        .to_string()
                };
                stack
                    .last_mut()
                    .expect("stack holds the document")
                    .text
                    .push_str(&resolved);
            }
            Event::Eof => break,
            _ => {}
        }
    }
    if stack.len() != 1 {
        return Err("malformed XML: unclosed element".into());
    }
    let doc = stack.pop().expect("stack holds the document");
    doc.children
        .into_iter()
        .next()
        .ok_or_else(|| "empty XML document".to_string())
}

fn start_node(e: &quick_xml::events::BytesStart<'_>) -> Result<Node, String> {
    let name = String::from_utf8_lossy(e.local_name().as_ref()).into_owned();
    let mut attrs = Vec::new();
    for a in e.attributes() {
        let a = a.map_err(|e| format!("malformed XML attribute: {e}"))?;
        let k = String::from_utf8_lossy(a.key.local_name().as_ref()).into_owned();
        let v = a
            .unescape_value()
            .map_err(|e| format!("malformed XML attribute: {e}"))?
            .into_owned();
        attrs.push((k, v));
    }
    Ok(Node {
        name,
        attrs,
        ..Node::default()
    })
}

/// A `<Name>`, percent-decoded when the service marked it `Encoded="true"`
/// (names holding characters XML cannot carry).
fn name_of(node: &Node) -> Option<String> {
    let n = node.child("Name")?;
    if n.attr("Encoded") == Some("true") {
        Some(percent_decode_str(&n.text).decode_utf8_lossy().into_owned())
    } else {
        Some(n.text.clone())
    }
}

fn metadata_of(node: &Node) -> BTreeMap<String, String> {
    node.child("Metadata")
        .map(|m| {
            m.children
                .iter()
                .map(|c| (c.name.to_ascii_lowercase(), c.text.clone()))
                .collect()
        })
        .unwrap_or_default()
}

fn next_marker(root: &Node) -> Option<String> {
    root.nonempty_text_of("NextMarker")
}

/// A container listing page: the containers and the next marker.
pub fn parse_containers(body: &[u8]) -> Result<(Vec<ContainerItem>, Option<String>), String> {
    let root = parse_tree(body)?;
    let mut out = Vec::new();
    if let Some(cs) = root.child("Containers") {
        for c in cs.children("Container") {
            let props = c.child("Properties");
            let p = |n: &str| props.and_then(|p| p.nonempty_text_of(n));
            out.push(ContainerItem {
                name: name_of(c).ok_or("a Container has no Name")?,
                last_modified: p("Last-Modified"),
                etag: p("Etag"),
                lease_state: p("LeaseState").and_then(|s| LeaseState::parse(&s)),
                metadata: metadata_of(c),
            });
        }
    }
    Ok((out, next_marker(&root)))
}

/// A blob listing page.
pub fn parse_blobs(body: &[u8]) -> Result<BlobListPage, String> {
    let root = parse_tree(body)?;
    let mut page = BlobListPage {
        next_marker: next_marker(&root),
        ..BlobListPage::default()
    };
    let Some(blobs) = root.child("Blobs") else {
        return Ok(page);
    };
    for item in &blobs.children {
        match item.name.as_str() {
            "Blob" => {
                let props = item.child("Properties");
                let p = |n: &str| props.and_then(|p| p.nonempty_text_of(n));
                let content_length = match p("Content-Length") {
                    Some(s) => s
                        .parse()
                        .map_err(|_| format!("bad Content-Length {s:?} in listing"))?,
                    None => 0,
                };
                page.blobs.push(BlobItem {
                    name: name_of(item).ok_or("a Blob has no Name")?,
                    snapshot: item.nonempty_text_of("Snapshot"),
                    blob_type: p("BlobType").and_then(|s| BlobType::parse(&s)),
                    content_length,
                    lease_state: p("LeaseState").and_then(|s| LeaseState::parse(&s)),
                    lease_status: p("LeaseStatus").and_then(|s| LeaseStatus::parse(&s)),
                    lease_duration: p("LeaseDuration").and_then(|s| LeaseDuration::parse(&s)),
                    etag: p("Etag"),
                    last_modified: p("Last-Modified"),
                    content_md5: p("Content-MD5"),
                    metadata: metadata_of(item),
                });
            }
            "BlobPrefix" => page
                .prefixes
                .push(name_of(item).ok_or("a BlobPrefix has no Name")?),
            _ => {}
        }
    }
    Ok(page)
}

/// A page list: the ranges holding data (inclusive offsets in the XML,
/// half-open here) and the next marker, if the service paginated.
pub fn parse_page_list(body: &[u8]) -> Result<(Vec<ByteRange>, Option<String>), String> {
    let root = parse_tree(body)?;
    let mut ranges = Vec::new();
    for r in root.children("PageRange") {
        let num = |n: &str| -> Result<u64, String> {
            r.text_of(n)
                .ok_or_else(|| format!("a PageRange has no {n}"))?
                .trim()
                .parse()
                .map_err(|_| format!("a PageRange has a bad {n}"))
        };
        ranges.push(half_open("PageRange", num("Start")?, num("End")?)?);
    }
    Ok((ranges, next_marker(&root)))
}

/// The half-open range of an element's inclusive `Start` and `End`.
fn half_open(what: &str, start: u64, end: u64) -> Result<ByteRange, String> {
    if end < start {
        return Err(format!("a {what} ends ({end}) before it starts ({start})"));
    }
    let end = end
        .checked_add(1)
        .ok_or_else(|| format!("a {what} ends at {end}, past any blob"))?;
    Ok(ByteRange::new(start, end))
}

/// A page-range diff (`prevsnapshot`): the ranges written and the ranges
/// cleared (half-open, in the order the service gave them), and the marker
/// of the next page.
pub type PageDiffPage = (Vec<ByteRange>, Vec<ByteRange>, Option<String>);

/// Parses the answer of Get Page Ranges with `prevsnapshot`: `PageRange` and
/// `ClearRange` elements, interleaved.
pub fn parse_page_diff(body: &[u8]) -> Result<PageDiffPage, String> {
    let root = parse_tree(body)?;
    let (mut written, mut cleared) = (Vec::new(), Vec::new());
    for r in &root.children {
        let out = match r.name.as_str() {
            "PageRange" => &mut written,
            "ClearRange" => &mut cleared,
            _ => continue,
        };
        let num = |n: &str| -> Result<u64, String> {
            r.text_of(n)
                .ok_or_else(|| format!("a {} has no {n}", r.name))?
                .trim()
                .parse()
                .map_err(|_| format!("a {} has a bad {n}", r.name))
        };
        out.push(half_open(&r.name, num("Start")?, num("End")?)?);
    }
    Ok((written, cleared, next_marker(&root)))
}

/// The code and message of an error body, if it is one.
pub fn parse_error(body: &[u8]) -> Option<(Option<String>, String)> {
    let root = parse_tree(body).ok()?;
    if root.name != "Error" {
        return None;
    }
    Some((
        root.nonempty_text_of("Code"),
        root.text_of("Message").unwrap_or_default(),
    ))
}

/// The `AuthenticationErrorDetail` of an error body (why a token or
/// signature was refused, e.g. "Lifetime validation failed. The token is expired.").
pub fn parse_error_detail(body: &[u8]) -> Option<String> {
    let root = parse_tree(body).ok()?;
    if root.name != "Error" {
        return None;
    }
    root.nonempty_text_of("AuthenticationErrorDetail")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_listing_with_snapshots_metadata_prefixes_and_marker() {
        let xml = "\u{feff}<?xml version=\"1.0\" encoding=\"utf-8\"?>\
<EnumerationResults ServiceEndpoint=\"http://x/\" ContainerName=\"c\"><MaxResults>2</MaxResults><Blobs>\
<Blob><Name>a &amp; b.vhd</Name><Snapshot>2026-01-01T00:00:00.0000000Z</Snapshot><Properties>\
<Content-Length>1049088</Content-Length><BlobType>PageBlob</BlobType><LeaseStatus>locked</LeaseStatus>\
<LeaseState>leased</LeaseState><LeaseDuration>infinite</LeaseDuration><Content-MD5 /></Properties>\
<Metadata><Owner>me</Owner></Metadata></Blob>\
<Blob><Name Encoded=\"true\">x%01y</Name><Properties><Content-Length>0</Content-Length>\
<BlobType>BlockBlob</BlobType></Properties></Blob>\
<BlobPrefix><Name>dir/</Name></BlobPrefix></Blobs><NextMarker>2!abc</NextMarker></EnumerationResults>";
        let page = parse_blobs(xml.as_bytes()).unwrap();
        assert_eq!(page.blobs.len(), 2);
        let b = &page.blobs[0];
        assert_eq!(b.name, "a & b.vhd");
        assert_eq!(b.snapshot.as_deref(), Some("2026-01-01T00:00:00.0000000Z"));
        assert_eq!(b.content_length, 1049088);
        assert_eq!(b.blob_type, Some(BlobType::PageBlob));
        assert_eq!(b.lease_state, Some(LeaseState::Leased));
        assert_eq!(b.lease_duration, Some(LeaseDuration::Infinite));
        assert_eq!(b.content_md5, None);
        assert_eq!(b.metadata.get("owner").map(String::as_str), Some("me"));
        assert_eq!(page.blobs[1].name, "x\u{1}y");
        assert_eq!(page.prefixes, vec!["dir/".to_string()]);
        assert_eq!(page.next_marker.as_deref(), Some("2!abc"));
    }

    #[test]
    fn page_list_is_half_open() {
        let xml = b"<PageList><PageRange><Start>0</Start><End>511</End></PageRange>\
<PageRange><Start>1048576</Start><End>1049087</End></PageRange><NextMarker/></PageList>";
        let (r, m) = parse_page_list(xml).unwrap();
        assert_eq!(
            r,
            vec![ByteRange::new(0, 512), ByteRange::new(1048576, 1049088)]
        );
        assert_eq!(m, None);
        assert!(
            parse_page_list(b"<PageList><PageRange><Start>9</Start></PageRange></PageList>")
                .is_err()
        );
    }

    #[test]
    fn page_diff_separates_written_and_cleared_ranges() {
        let xml = b"<PageList><PageRange><Start>0</Start><End>511</End></PageRange>\
<ClearRange><Start>512</Start><End>1023</End></ClearRange>\
<PageRange><Start>4096</Start><End>8191</End></PageRange></PageList>";
        let (w, c, m) = parse_page_diff(xml).unwrap();
        assert_eq!(w, vec![ByteRange::new(0, 512), ByteRange::new(4096, 8192)]);
        assert_eq!(c, vec![ByteRange::new(512, 1024)]);
        assert_eq!(m, None);
    }

    #[test]
    fn a_range_ending_at_the_largest_number_is_refused_not_wrapped() {
        // `End` is inclusive: u64::MAX + 1 overflowed (a panic in debug
        // builds, a range ending at 0 in release ones).
        let max = u64::MAX;
        let list =
            format!("<PageList><PageRange><Start>0</Start><End>{max}</End></PageRange></PageList>");
        let e = parse_page_list(list.as_bytes()).unwrap_err();
        assert!(e.contains("past any blob"), "{e}");
        let diff = format!(
            "<PageList><ClearRange><Start>512</Start><End>{max}</End></ClearRange></PageList>"
        );
        let e = parse_page_diff(diff.as_bytes()).unwrap_err();
        assert!(e.contains("ClearRange ends at"), "{e}");
    }

    #[test]
    fn deeply_nested_elements_are_refused_without_exhausting_the_stack() {
        // 200,000 nested elements (1.4 MB): the tree of them overflowed the
        // stack when it was dropped, aborting the process.
        let depth = 200_000;
        let body = format!("{}{}", "<a>".repeat(depth), "</a>".repeat(depth));
        for parse in [
            |b: &[u8]| parse_page_list(b).map(|_| ()),
            |b: &[u8]| parse_blobs(b).map(|_| ()),
        ] {
            let e = parse(body.as_bytes()).unwrap_err();
            assert!(e.contains("nested more than"), "{e}");
        }
        assert!(parse_error(body.as_bytes()).is_none());
        // The service's own depth is well inside the bound.
        let nested = format!("{}{}", "<a>".repeat(MAX_DEPTH), "</a>".repeat(MAX_DEPTH));
        assert!(parse_tree(nested.as_bytes()).is_ok());
    }

    #[test]
    fn container_listing_and_error_body() {
        let xml = b"<EnumerationResults><Containers><Container><Name>c1</Name><Properties>\
<Etag>\"0x1\"</Etag><LeaseState>available</LeaseState></Properties></Container></Containers>\
<NextMarker /></EnumerationResults>";
        let (cs, m) = parse_containers(xml).unwrap();
        assert_eq!(cs[0].name, "c1");
        assert_eq!(cs[0].etag.as_deref(), Some("\"0x1\""));
        assert_eq!(m, None);
        let (code, msg) = parse_error(
            b"<?xml version=\"1.0\"?><Error><Code>LeaseIdMissing</Code><Message>There is a lease.\nRequestId:1</Message></Error>",
        )
        .unwrap();
        assert_eq!(code.as_deref(), Some("LeaseIdMissing"));
        assert!(msg.starts_with("There is a lease."));
        assert!(parse_error(b"not xml <").is_none());
    }
}
