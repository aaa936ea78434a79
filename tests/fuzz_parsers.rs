//! Fuzz targets for the parsers of untrusted input, as property tests over
//! bytes: the VHD footer, the dynamic VHD header and block table, the MBR and
//! GPT partition tables, the service's listing and page-range XML, and the
//! key slots in a blob's metadata.
//!
//! Random bytes never get past a magic number or a checksum, so each target
//! starts from a valid structure (a table written by `sfdisk`, a footer and a
//! dynamic VHD built to the specification, XML as the service sends it, slots
//! sealed by the library) and mutates it: bit flips, bytes set, whole
//! integers set to edge values (0, 1, 2^55, u64::MAX, ...) where fields are,
//! bytes inserted and removed, and for checksummed structures the checksums
//! made to match again half the time, so the mutation reaches the fields
//! behind them. Each target asserts that nothing panics and what must hold
//! of anything accepted (a parsed GPT's partitions lie within the disk; a
//! page range is not empty; a tampered slot never opens to another key).
//!
//! Cases per target: `BLOBDRIVE_FUZZ_CASES`, else 300 to 5,000 by the
//! target's cost (seconds each, which is what CI runs); CONTRIBUTING.md
//! shows a longer run. A failure
//! prints the smallest input proptest found and records it in
//! `tests/fuzz_parsers.proptest-regressions`, which replays it first.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::ops::Range;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use blobdrive::blob::xml;
use blobdrive::crypt::{DataKey, KeySlots, Secret, UserKey};
use blobdrive::partition::{self, Layout, TableKind};
use blobdrive::units::MAX_DRIVE_BYTES;
use blobdrive::vhd::{self, dynamic, DiskType, Footer};
use proptest::prelude::*;
use proptest::test_runner::Config;

/// `BLOBDRIVE_FUZZ_CASES` cases, else the target's CI default (sized so
/// that each target runs a few seconds and finds the defects it was written
/// against: a cheap target runs more).
fn config(default_cases: u32) -> Config {
    let cases = std::env::var("BLOBDRIVE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_cases);
    Config {
        cases,
        // Inputs are mutations of a seed; shrinking a few of them is quick.
        max_shrink_iters: 2_000,
        ..Config::default()
    }
}

// ------------------------------------------------------------- mutations

/// Integers that sit on the edges parsers get wrong.
const EDGES: [u64; 16] = [
    0,
    1,
    2,
    0x7f,
    0x80,
    0xff,
    0xffff,
    0x7fff_ffff,
    0xffff_ffff,
    0x1_0000_0000,
    1 << 55,
    (1 << 55) - 1,
    1 << 63,
    u64::MAX - 1,
    u64::MAX,
    1023,
];

/// One change to a byte string. Positions are resolved against the seed's
/// hot spots (its fields), so a mutation lands where parsing decides.
#[derive(Debug, Clone)]
enum Mutation {
    /// XOR one byte with a mask.
    Flip { at: (usize, usize), mask: u8 },
    /// Set one byte.
    Set { at: (usize, usize), value: u8 },
    /// Write an edge integer of `width` bytes, little- or big-endian.
    Word {
        at: (usize, usize),
        value: u64,
        width: usize,
        big_endian: bool,
    },
    /// Insert bytes (only where the length may change).
    Insert { at: (usize, usize), bytes: Vec<u8> },
    /// Remove up to `len` bytes (only where the length may change).
    Remove { at: (usize, usize), len: usize },
}

fn mutation(tokens: &'static [&'static [u8]]) -> impl Strategy<Value = Mutation> {
    let at = (any::<usize>(), any::<usize>());
    prop_oneof![
        3 => (at, 1u8..).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        2 => (at, any::<u8>()).prop_map(|(at, value)| Mutation::Set { at, value }),
        3 => (
            at,
            prop_oneof![prop::sample::select(&EDGES[..]), any::<u64>()],
            prop::sample::select(&[1usize, 2, 4, 8][..]),
            any::<bool>()
        )
            .prop_map(|(at, value, width, big_endian)| Mutation::Word {
                at,
                value,
                width,
                big_endian
            }),
        2 => (
            at,
            prop_oneof![
                3 => prop::sample::select(tokens).prop_map(<[u8]>::to_vec),
                1 => prop::collection::vec(any::<u8>(), 1..16)
            ]
        )
            .prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        1 => (at, 1usize..64).prop_map(|(at, len)| Mutation::Remove { at, len }),
    ]
}

fn mutations(tokens: &'static [&'static [u8]]) -> impl Strategy<Value = Vec<Mutation>> {
    prop::collection::vec(mutation(tokens), 1..8)
}

/// A position in `buf` from a mutation's `(spot, offset)`: inside one of
/// `hot` (clipped to `buf`; one starting at its end is the end, where an
/// insert appends), or anywhere when there are none.
fn position(buf_len: usize, hot: &[Range<usize>], (spot, offset): (usize, usize)) -> usize {
    let live: Vec<&Range<usize>> = hot
        .iter()
        .filter(|r| r.start <= buf_len && !r.is_empty())
        .collect();
    match live.get(spot % live.len().max(1)) {
        Some(r) if r.start == buf_len => buf_len,
        Some(r) => r.start + offset % (r.end.min(buf_len) - r.start),
        None => offset % buf_len.max(1),
    }
}

/// Hot spots of a text: half the time just before one of `marks` (where a
/// whole element or word can go in) or at the end, else anywhere.
fn text_hot_spots(text: &[u8], marks: &[u8]) -> Vec<Range<usize>> {
    let mut spots: Vec<Range<usize>> = text
        .iter()
        .enumerate()
        .filter(|(_, b)| marks.contains(b))
        .map(|(i, _)| i..i + 1)
        .chain(std::iter::once(text.len()..text.len() + 1))
        .collect();
    let anywhere = vec![0..text.len(); spots.len()];
    spots.extend(anywhere);
    spots
}

/// Applies `muts` to `buf`; inserts and removals only when `resizable`.
fn mutate(buf: &mut Vec<u8>, hot: &[Range<usize>], muts: &[Mutation], resizable: bool) {
    for m in muts {
        if buf.is_empty() {
            return;
        }
        // Where a byte is changed: never past the last one.
        let inside = |at| position(buf.len(), hot, at).min(buf.len() - 1);
        match m {
            Mutation::Flip { at, mask } => {
                let i = inside(*at);
                buf[i] ^= mask;
            }
            Mutation::Set { at, value } => {
                let i = inside(*at);
                buf[i] = *value;
            }
            Mutation::Word {
                at,
                value,
                width,
                big_endian,
            } => {
                let i = inside(*at);
                let bytes = if *big_endian {
                    value.to_be_bytes()[8 - width..].to_vec()
                } else {
                    value.to_le_bytes()[..*width].to_vec()
                };
                let end = (i + width).min(buf.len());
                buf[i..end].copy_from_slice(&bytes[..end - i]);
            }
            Mutation::Insert { at, bytes } if resizable => {
                let i = position(buf.len(), hot, *at);
                buf.splice(i..i, bytes.iter().copied());
            }
            Mutation::Remove { at, len } if resizable => {
                let i = position(buf.len(), hot, *at);
                let end = (i + len).min(buf.len());
                buf.drain(i..end);
            }
            Mutation::Insert { .. } | Mutation::Remove { .. } => {}
        }
    }
}

/// Bytes to insert where lengths are fixed (never used there; a strategy
/// needs something to pick from).
const NO_TOKENS: &[&[u8]] = &[b"\0"];

// ------------------------------------------------------- partition tables

const SECTOR: usize = 512;
/// The seed disks: 1024 sectors.
const DISK_SECTORS: usize = 1024;

/// A disk of [`DISK_SECTORS`] partitioned by `sfdisk` with `script`.
fn sfdisk_image(script: &str) -> Vec<u8> {
    let file = tempfile::NamedTempFile::new().expect("temp file");
    file.as_file()
        .set_len((DISK_SECTORS * SECTOR) as u64)
        .expect("size the image");
    let mut child = Command::new("sfdisk")
        .args(["--quiet", "--no-reread", "--no-tell-kernel"])
        .arg(file.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("sfdisk runs (util-linux's fdisk package)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(script.as_bytes())
        .expect("script");
    assert!(child.wait().expect("sfdisk").success(), "sfdisk {script:?}");
    std::fs::read(file.path()).expect("read the image")
}

/// A GPT disk: three partitions, the second EFI, out of order on the disk.
fn gpt_seed() -> &'static Vec<u8> {
    static SEED: OnceLock<Vec<u8>> = OnceLock::new();
    SEED.get_or_init(|| {
        sfdisk_image(
            "label: gpt\nstart=256,size=128,type=L,name=root\nstart=64,size=64,type=U\nstart=512,type=L\n",
        )
    })
}

fn gpt_hot_spots() -> &'static [Range<usize>] {
    static SPOTS: OnceLock<Vec<Range<usize>>> = OnceLock::new();
    SPOTS.get_or_init(|| table_hot_spots(gpt_seed()))
}

fn mbr_hot_spots() -> &'static [Range<usize>] {
    static SPOTS: OnceLock<Vec<Range<usize>>> = OnceLock::new();
    SPOTS.get_or_init(|| table_hot_spots(mbr_seed()))
}

/// An MBR disk: a primary partition, an extended one holding two logical ones.
fn mbr_seed() -> &'static Vec<u8> {
    static SEED: OnceLock<Vec<u8>> = OnceLock::new();
    SEED.get_or_init(|| {
        sfdisk_image(
            "label: dos\nstart=64,size=128,type=83\nstart=256,size=512,type=5\n\
             start=320,size=128,type=83\nstart=512,size=64,type=82\n",
        )
    })
}

/// Where MBR and GPT parsing decides, found in the seed itself: the table
/// part of every sector with a boot signature (the MBR, each EBR), and the
/// written bytes of every other sector that holds any (the GPT headers and
/// their entry arrays).
fn table_hot_spots(img: &[u8]) -> Vec<Range<usize>> {
    img.chunks(SECTOR)
        .enumerate()
        .filter_map(|(i, s)| {
            let at = i * SECTOR;
            if s.len() == SECTOR && s[510..] == [0x55, 0xAA] {
                return Some(at + 440..at + SECTOR);
            }
            let first = s.iter().position(|&b| b != 0)?;
            let last = s.iter().rposition(|&b| b != 0)?;
            Some(at + first..at + last + 1)
        })
        .collect()
}

fn le(buf: &[u8], at: usize, n: usize) -> u64 {
    buf[at..at + n]
        .iter()
        .rev()
        .fold(0, |acc, &b| (acc << 8) | u64::from(b))
}

/// Makes the GPT header at `lba` and its entry array's checksums match
/// again, where the header says things that can be checked at all.
fn reseal_gpt_header(img: &mut [u8], lba: usize) {
    let at = lba * SECTOR;
    if at + SECTOR > img.len() || &img[at..at + 8] != b"EFI PART" {
        return;
    }
    let entries_lba = le(img, at + 72, 8);
    let count = le(img, at + 80, 4);
    let size = le(img, at + 84, 4);
    let array = entries_lba
        .checked_mul(SECTOR as u64)
        .zip(count.checked_mul(size))
        .and_then(|(start, len)| Some((start, start.checked_add(len)?)))
        .filter(|(_, end)| *end <= img.len() as u64);
    if let Some((start, end)) = array {
        let crc = crc32fast::hash(&img[start as usize..end as usize]);
        img[at + 88..at + 92].copy_from_slice(&crc.to_le_bytes());
    }
    let header_bytes = le(img, at + 12, 4) as usize;
    if (20..=SECTOR).contains(&header_bytes) {
        img[at + 16..at + 20].fill(0);
        let crc = crc32fast::hash(&img[at..at + header_bytes]);
        img[at + 16..at + 20].copy_from_slice(&crc.to_le_bytes());
    }
}

/// What must hold of any table a parser accepts.
fn check_table(img: &[u8]) -> Result<(), TestCaseError> {
    let disk = img.len() as u64;
    let table = match partition::read_table(&mut &img[..]) {
        Ok(Some(t)) => t,
        Ok(None) | Err(_) => return Ok(()),
    };
    for p in &table.partitions {
        let end = p.start_bytes.checked_add(p.size_bytes);
        prop_assert!(
            p.size_bytes > 0 && p.start_bytes > 0 && end.is_some_and(|e| e <= disk),
            "partition {} ({}+{}) outside a disk of {disk} bytes",
            p.number,
            p.start_bytes,
            p.size_bytes
        );
    }
    if table.kind == TableKind::Gpt {
        let mut spans: Vec<(u64, u64)> = table
            .partitions
            .iter()
            .map(|p| (p.start_bytes, p.end_bytes()))
            .collect();
        spans.sort_unstable();
        prop_assert!(
            spans.windows(2).all(|w| w[0].1 <= w[1].0),
            "overlapping GPT partitions {spans:?}"
        );
    }
    // What info and mount read next must not panic either.
    let _ = Layout::read(&mut &img[..]);
    Ok(())
}

// ------------------------------------------------------------------ VHD

const FOOTER: usize = 512;
const DYN_BLOCK: u64 = 4096;
const DYN_HEADER_AT: usize = 512;
const DYN_TABLE_AT: usize = DYN_HEADER_AT + 1024;

/// The footer of a fixed 16 MiB disk, as `create` writes it.
fn footer_seed() -> [u8; FOOTER] {
    Footer::new_fixed(16 << 20).to_bytes()
}

/// A dynamic VHD of 8 blocks of 4 KiB, blocks 1 and 5 allocated (bitmap
/// partly set), laid out as the specification says: footer copy, dynamic
/// header, block table, blocks, footer.
fn dynamic_seed() -> &'static Vec<u8> {
    static SEED: OnceLock<Vec<u8>> = OnceLock::new();
    SEED.get_or_init(|| {
        let size = 8 * DYN_BLOCK;
        let mut footer = Footer::new_fixed(size);
        footer.disk_type = DiskType::Dynamic;
        footer.data_offset = DYN_HEADER_AT as u64;
        let footer = footer.to_bytes();
        let mut header = [0u8; 1024];
        header[..8].copy_from_slice(&dynamic::HEADER_COOKIE);
        header[8..16].fill(0xff);
        header[16..24].copy_from_slice(&(DYN_TABLE_AT as u64).to_be_bytes());
        header[24..28].copy_from_slice(&0x0001_0000u32.to_be_bytes());
        header[28..32].copy_from_slice(&8u32.to_be_bytes());
        header[32..36].copy_from_slice(&(DYN_BLOCK as u32).to_be_bytes());
        let sum = dynamic::header_checksum(&header);
        header[36..40].copy_from_slice(&sum.to_be_bytes());
        let mut table = vec![0xffu8; SECTOR];
        let mut blocks = Vec::new();
        let first_block = DYN_TABLE_AT + SECTOR;
        for (n, (index, bitmap0)) in [(1usize, 0b1011_0000u8), (5, 0xff)].iter().enumerate() {
            let at = first_block + n * (SECTOR + DYN_BLOCK as usize);
            table[index * 4..index * 4 + 4].copy_from_slice(&((at / SECTOR) as u32).to_be_bytes());
            let mut bitmap = vec![0u8; SECTOR];
            bitmap[0] = *bitmap0;
            blocks.extend_from_slice(&bitmap);
            blocks.extend(std::iter::repeat_n(0xa0 + n as u8, DYN_BLOCK as usize));
        }
        [
            &footer[..],
            &header[..],
            &table[..],
            &blocks[..],
            &footer[..],
        ]
        .concat()
    })
}

/// Makes a footer's checksum match again.
fn reseal_footer(bytes: &mut [u8]) {
    if let Ok(mut f) = <[u8; FOOTER]>::try_from(&bytes[..]) {
        let sum = vhd::checksum(&f);
        f[64..68].copy_from_slice(&sum.to_be_bytes());
        bytes.copy_from_slice(&f);
    }
}

/// Makes the two footers and the dynamic header of a dynamic VHD sound
/// again (the header where the first footer now points, if inside).
fn reseal_dynamic(file: &mut [u8]) {
    if file.len() < 2 * FOOTER {
        return;
    }
    let tail = file.len() - FOOTER;
    reseal_footer(&mut file[..FOOTER]);
    reseal_footer(&mut file[tail..]);
    let header_at = u64::from_be_bytes(file[16..24].try_into().expect("8 bytes"));
    let Some(at) = usize::try_from(header_at)
        .ok()
        .filter(|at| at.checked_add(1024).is_some_and(|end| end <= file.len()))
    else {
        return;
    };
    let mut header: [u8; 1024] = file[at..at + 1024].try_into().expect("1024 bytes");
    let sum = dynamic::header_checksum(&header);
    header[36..40].copy_from_slice(&sum.to_be_bytes());
    file[at..at + 1024].copy_from_slice(&header);
}

/// What must hold of a dynamic VHD that opens: a sane size, and every
/// range of data it reports lies in the disk and reads.
fn check_dynamic(file: &[u8]) -> Result<(), TestCaseError> {
    let mut tmp = tempfile::tempfile().expect("temp file");
    tmp.write_all(file).expect("write");
    let Ok(vhd) = dynamic::DynamicVhd::open(tmp) else {
        return Ok(());
    };
    let size = vhd.size_bytes();
    prop_assert!(size > 0 && size % 512 == 0 && size <= MAX_DRIVE_BYTES);
    let _ = vhd.allocated_bytes();
    let mut at = 0;
    for _ in 0..64 {
        let Some(r) = vhd.next_data(at, size).expect("reads inside the file") else {
            break;
        };
        prop_assert!(r.start >= at && r.start < r.end && r.end <= size, "{r:?}");
        let start = r.start - r.start % 512;
        let len = (r.end - start).min(64 * 1024).div_ceil(512) * 512;
        let mut buf = vec![0u8; len as usize];
        vhd.read_at(&mut buf, start).expect("reads inside the file");
        at = r.end;
    }
    Ok(())
}

// ------------------------------------------------------------------ XML

const XML_TOKENS: &[&[u8]] = &[
    b"<Blob>",
    b"</Blob>",
    b"<Blobs>",
    b"<PageRange><Start>0</Start><End>18446744073709551615</End></PageRange>",
    b"<ClearRange><Start>512</Start><End>511</End></ClearRange>",
    b"<End>18446744073709551615</End>",
    b"<Start>18446744073709551615</Start>",
    b"<Content-Length>-1</Content-Length>",
    b"<Content-Length>18446744073709551616</Content-Length>",
    b"<Name Encoded=\"true\">%ff%fe%00</Name>",
    b"<![CDATA[<End>]]>",
    b"&amp;",
    b"&#0;",
    b"&#x110000;",
    b"&unknown;",
    b"\xEF\xBB\xBF",
    b"\xff\xfe",
    b"<a><a><a><a><a><a><a><a><a><a><a><a><a><a><a><a>",
    b"</a></a></a></a></a></a></a></a>",
    b"<Metadata><x-\xE2\x82\xAC>v</x-\xE2\x82\xAC><blobdrivecrypt>v1 check=\xE2\x82\xAC</blobdrivecrypt></Metadata>",
    b"<NextMarker>2!x</NextMarker>",
];

const LISTING: &str = "\u{feff}<?xml version=\"1.0\" encoding=\"utf-8\"?>\
<EnumerationResults ServiceEndpoint=\"http://x/\" ContainerName=\"c\"><MaxResults>2</MaxResults><Blobs>\
<Blob><Name>a &amp; b.vhd</Name><Snapshot>2026-01-01T00:00:00.0000000Z</Snapshot><Properties>\
<Content-Length>1049088</Content-Length><BlobType>PageBlob</BlobType><LeaseStatus>locked</LeaseStatus>\
<LeaseState>leased</LeaseState><LeaseDuration>infinite</LeaseDuration><Content-MD5 /></Properties>\
<Metadata><Owner>me</Owner><blobdrivecrypt>v1 cipher=aes-xts-plain64</blobdrivecrypt></Metadata></Blob>\
<Blob><Name Encoded=\"true\">x%01y</Name><Properties><Content-Length>0</Content-Length>\
<BlobType>BlockBlob</BlobType></Properties></Blob>\
<BlobPrefix><Name>dir/</Name></BlobPrefix></Blobs><NextMarker>2!abc</NextMarker></EnumerationResults>";

const CONTAINERS: &str = "<EnumerationResults><Containers><Container><Name>c1</Name><Properties>\
<Etag>\"0x1\"</Etag><LeaseState>available</LeaseState></Properties><Metadata><a>b</a></Metadata>\
</Container></Containers><NextMarker /></EnumerationResults>";

const PAGE_LIST: &str = "<?xml version=\"1.0\" encoding=\"utf-8\"?><PageList>\
<PageRange><Start>0</Start><End>511</End></PageRange>\
<ClearRange><Start>512</Start><End>1023</End></ClearRange>\
<PageRange><Start>1048576</Start><End>1049087</End></PageRange><NextMarker>m</NextMarker></PageList>";

const ERROR: &str =
    "<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>AuthenticationFailed</Code>\
<Message>Server failed to authenticate the request.\nRequestId:1</Message>\
<AuthenticationErrorDetail>Signature did not match.</AuthenticationErrorDetail></Error>";

fn xml_seed() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![LISTING, CONTAINERS, PAGE_LIST, ERROR])
}

/// Every XML parser over `body`; what each accepts must make sense.
fn check_xml(body: &[u8]) -> Result<(), TestCaseError> {
    let _ = xml::parse_containers(body);
    let _ = xml::parse_blobs(body);
    let _ = xml::parse_error(body);
    let _ = xml::parse_error_detail(body);
    if let Ok((ranges, _)) = xml::parse_page_list(body) {
        prop_assert!(ranges.iter().all(|r| r.start < r.end), "{ranges:?}");
    }
    if let Ok((written, cleared, _)) = xml::parse_page_diff(body) {
        prop_assert!(
            written.iter().chain(&cleared).all(|r| r.start < r.end),
            "{written:?} {cleared:?}"
        );
    }
    Ok(())
}

// ------------------------------------------------------------ key slots

const SLOT_TOKENS: &[&[u8]] = &[
    b" m=4294967295",
    b" t=0",
    b" p=0",
    b" p=65",
    b" salt=",
    b" nonce=AAAA",
    b" wrapped=",
    b" check=\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac00",
    b" check=+f00112233445566778899aabbccddee",
    b" kind=passphrase kdf=argon2id",
    b" kind=keyfile",
    b"v2 ",
    b"==",
];

/// A drive's header and two slots (a key file's, a passphrase's), and the
/// data key and key file they hold. Sealed once: Argon2 takes a while.
fn slots_seed() -> &'static (BTreeMap<String, String>, DataKey, [u8; 32]) {
    static SEED: OnceLock<(BTreeMap<String, String>, DataKey, [u8; 32])> = OnceLock::new();
    SEED.get_or_init(|| {
        let key_file = [0x5au8; 32];
        let data_key = DataKey::generate();
        let mut slots = KeySlots::new(&data_key, &UserKey::KeyFile(Secret::copy_of(&key_file)));
        slots
            .add(
                &data_key,
                &UserKey::Passphrase(Secret::copy_of(b"correct horse")),
            )
            .expect("a second slot");
        let mut metadata = BTreeMap::new();
        metadata.insert("owner".to_string(), "me".to_string());
        slots.apply_to(&mut metadata);
        (metadata, data_key, key_file)
    })
}

// --------------------------------------------------------------- targets

proptest! {
    #![proptest_config(config(5_000))]

    #[test]
    fn vhd_footer(
        muts in mutations(NO_TOKENS),
        reseal in any::<bool>(),
        blob in prop_oneof![Just(None), any::<u64>().prop_map(Some)],
    ) {
        let mut bytes = footer_seed().to_vec();
        mutate(&mut bytes, std::slice::from_ref(&(0..FOOTER)), &muts, false);
        if reseal {
            reseal_footer(&mut bytes);
        }
        let bytes: [u8; FOOTER] = bytes.try_into().expect("a footer keeps its length");
        let _ = Footer::parse_any(&bytes);
        let blob = blob.unwrap_or((16 << 20) + 512);
        if let Ok(f) = Footer::parse(&bytes, blob) {
            prop_assert_eq!(f.disk_type, DiskType::Fixed);
            prop_assert!(f.current_size_bytes % 512 == 0);
            prop_assert_eq!(f.current_size_bytes.checked_add(512), Some(blob));
            // What it would write back parses to the same footer.
            prop_assert_eq!(Footer::parse(&f.to_bytes(), blob), Ok(f));
        }
    }

}

proptest! {
    // Each case writes its image to a temporary file.
    #![proptest_config(config(2_000))]

    #[test]
    fn dynamic_vhd_header_and_block_table(
        muts in mutations(NO_TOKENS),
        reseal in any::<bool>(),
        cut in prop_oneof![4 => Just(0usize), 1 => 1usize..4096],
    ) {
        let mut file = dynamic_seed().clone();
        let tail = file.len() - FOOTER;
        let hot = [
            0..FOOTER,
            DYN_HEADER_AT..DYN_HEADER_AT + 40,
            DYN_TABLE_AT..DYN_TABLE_AT + 32,
            DYN_TABLE_AT + SECTOR..DYN_TABLE_AT + SECTOR + 1,
            tail..tail + 84,
        ];
        mutate(&mut file, &hot, &muts, false);
        file.truncate(file.len().saturating_sub(cut));
        if reseal {
            reseal_dynamic(&mut file);
        }
        check_dynamic(&file)?;
    }
}

proptest! {
    // A table target reads a 512 KiB disk and probes its partitions.
    #![proptest_config(config(300))]

    #[test]
    fn mbr_table(muts in mutations(NO_TOKENS), grow in any::<bool>()) {
        let mut img = mbr_seed().clone();
        mutate(&mut img, mbr_hot_spots(), &muts, false);
        if grow {
            img.resize(img.len() * 2, 0);
        }
        check_table(&img)?;
    }

    #[test]
    fn gpt_table(
        muts in mutations(NO_TOKENS),
        reseal in any::<bool>(),
        size in prop_oneof![4 => Just(DISK_SECTORS), 1 => 0usize..DISK_SECTORS],
    ) {
        let mut img = gpt_seed().clone();
        mutate(&mut img, gpt_hot_spots(), &muts, false);
        if reseal {
            reseal_gpt_header(&mut img, 1);
            reseal_gpt_header(&mut img, DISK_SECTORS - 1);
        }
        img.truncate(size * SECTOR);
        check_table(&img)?;
    }
}

proptest! {
    // A case is a parse of a few hundred bytes: many are cheap.
    #![proptest_config(config(50_000))]

    #[test]
    fn listing_and_page_range_xml(seed in xml_seed(), muts in mutations(XML_TOKENS)) {
        let mut body = seed.as_bytes().to_vec();
        mutate(&mut body, &text_hot_spots(seed.as_bytes(), b"<"), &muts, true);
        check_xml(&body)?;
    }
}

proptest! {
    #![proptest_config(config(15_000))]

    #[test]
    fn key_slots(
        which in 0usize..3,
        muts in mutations(SLOT_TOKENS),
        extra in prop_oneof![
            4 => Just(None),
            1 => (0u8..12).prop_map(|i| Some(format!("blobdrivekey{i}"))),
        ],
    ) {
        let (seed, data_key, key_file) = slots_seed();
        let mut metadata = seed.clone();
        let name = ["blobdrivecrypt", "blobdrivekey0", "blobdrivekey1"][which];
        let mut value = metadata[name].as_bytes().to_vec();
        let hot = text_hot_spots(&value, b" =");
        mutate(&mut value, &hot, &muts, true);
        let value = String::from_utf8_lossy(&value).into_owned();
        metadata.insert(name.to_string(), value.clone());
        if let Some(extra) = extra {
            metadata.insert(extra, value);
        }
        let Ok(Some(slots)) = KeySlots::from_metadata(&metadata) else {
            return Ok(());
        };
        prop_assert!(slots.list().iter().all(|(i, _)| *i < 8));
        // Only the key file is tried: a passphrase would run whatever Argon2
        // parameters the mutation left. A tampered slot opens to the drive's
        // own key or not at all.
        if let Ok((key, _)) = slots.unlock(&UserKey::KeyFile(Secret::copy_of(key_file))) {
            prop_assert_eq!(key.bytes(), data_key.bytes());
        }
    }
}
