//! Credentials out of the process's command line.
//!
//! `/proc/PID/cmdline` is readable by every local user, and a mount daemon
//! is a fork of the command that started it (no exec), so a SAS URL or a
//! `--connection-string` given as an argument would stay there for the life
//! of the mount. As `mount.nfs` and many daemons do, the command overwrites
//! those secrets in the original argument memory as soon as it starts
//! (after the arguments were copied for parsing), before any fork: the
//! command, its daemon and `mount.blobdrive` (which runs the mount in its
//! own process) all show the arguments without them.
//!
//! What is hidden: in a URL or SAS token, the SAS parameters (everything in
//! the query but `snapshot=`) become `<SAS>`; in a connection string,
//! `AccountKey=` and `SharedAccessSignature=` values become `<hidden>`.
//! The shortened argument is padded with NUL bytes, as `setproctitle`
//! does. The kernel's record of where the arguments live (`arg_start`,
//! `arg_end` in `/proc/self/stat`) locates them; they are rewritten through
//! `/proc/self/mem`, so no Rust reference to that memory is involved.
//!
//! The window between exec and this rewrite remains, so the environment
//! (`AZURE_STORAGE_CONNECTION_STRING`, `AZURE_STORAGE_SAS_TOKEN`) or a
//! `credentials=` file is the safe channel; `--help` says so.

use std::io::{Read, Seek, SeekFrom, Write};

/// Connection-string keys whose values are secrets (compared ignoring case).
const SECRET_SETTINGS: [&str; 2] = ["accountkey", "sharedaccesssignature"];

/// The argument with its credentials hidden, or `None` when it holds none.
/// Never longer than `arg`: when the marked version would be, it is empty
/// (the whole argument blanked).
pub fn redact(arg: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(arg).ok()?;
    let out = redact_connection_string(text).or_else(|| redact_sas(text))?;
    Some(if out.len() <= arg.len() {
        out.into_bytes()
    } else {
        Vec::new()
    })
}

/// `...;AccountKey=K;...` (also after `--connection-string=`) with each
/// secret value replaced.
fn redact_connection_string(text: &str) -> Option<String> {
    let mut hidden = false;
    let parts: Vec<String> = text
        .split(';')
        .map(|part| {
            // `--connection-string=AccountName=a` holds the setting after
            // the flag's `=`: the key is the word before the last `=` of
            // the part's head.
            let Some(eq) = SECRET_SETTINGS
                .iter()
                .filter_map(|k| setting_value_start(part, k))
                .min()
            else {
                return part.to_string();
            };
            hidden = true;
            format!("{}<hidden>", &part[..eq])
        })
        .collect();
    hidden.then(|| parts.join(";"))
}

/// Where the value of setting `key` starts in `part` (`Key=` at the start
/// of the part or after a flag's `=`), ignoring case and the whitespace
/// around the key that the connection-string parser ignores too
/// (`; AccountKey =K`, a part after a newline).
fn setting_value_start(part: &str, key: &str) -> Option<usize> {
    // ASCII lower-casing keeps every byte offset of `part`.
    let lower = part.to_ascii_lowercase();
    let mut from = 0;
    while let Some(rel) = lower[from..].find(key) {
        let at = from + rel;
        let before = lower[..at].trim_end();
        let after = &lower[at + key.len()..];
        let rest = after.trim_start();
        if (before.is_empty() || before.ends_with('=')) && rest.starts_with('=') {
            return Some(at + key.len() + (after.len() - rest.len()) + 1);
        }
        // `key` is ASCII, so this is a character boundary.
        from = at + key.len();
    }
    None
}

/// A URL or bare SAS token whose query holds `sig=`: the SAS parameters
/// become `<SAS>`, a `snapshot=` stays.
fn redact_sas(text: &str) -> Option<String> {
    let (base, query) = match text.split_once('?') {
        Some((base, query)) => (Some(base), query),
        None => (None, text),
    };
    let fields: Vec<&str> = query.split('&').collect();
    let is_sig = |kv: &&str| {
        kv.split_once('=')
            .is_some_and(|(k, _)| k.eq_ignore_ascii_case("sig"))
    };
    if !fields.iter().any(is_sig) {
        return None;
    }
    let mut kept: Vec<&str> = fields
        .iter()
        .copied()
        .filter(|kv| kv.starts_with("snapshot="))
        .collect();
    kept.push("<SAS>");
    let query = kept.join("&");
    Some(match base {
        Some(base) => format!("{base}?{query}"),
        None => query,
    })
}

/// Overwrites the credentials among this process's original arguments (see
/// the module head). `Ok(false)` when there were none; an error says why
/// they could not be hidden.
pub fn hide_credentials() -> std::io::Result<bool> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let (start, end) = arg_area(&stat).ok_or_else(|| {
        std::io::Error::other("/proc/self/stat does not say where the arguments are")
    })?;
    let mut mem = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/proc/self/mem")?;
    let len = usize::try_from(end.saturating_sub(start)).map_err(std::io::Error::other)?;
    let mut area = vec![0u8; len];
    mem.seek(SeekFrom::Start(start))?;
    mem.read_exact(&mut area)?;
    let mut hid = false;
    let mut offset = 0usize;
    for arg in area.split(|b| *b == 0) {
        if let Some(mut shown) = redact(arg) {
            shown.resize(arg.len(), 0);
            mem.seek(SeekFrom::Start(start + offset as u64))?;
            mem.write_all(&shown)?;
            hid = true;
        }
        offset += arg.len() + 1;
    }
    Ok(hid)
}

/// `arg_start` and `arg_end` (fields 48 and 49) of a `/proc/PID/stat` line.
fn arg_area(stat: &str) -> Option<(u64, u64)> {
    // The command name (field 2) may hold spaces and parentheses: the
    // fields after it start past its last ')', with field 3.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(48 - 3);
    let start = fields.next()?.parse().ok()?;
    let end = fields.next()?.parse().ok()?;
    (start > 0 && end > start).then_some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(arg: &str) -> Option<String> {
        redact(arg.as_bytes()).map(|b| String::from_utf8(b).unwrap())
    }

    #[test]
    fn sas_urls_and_tokens_lose_their_signature_and_keep_a_snapshot() {
        assert_eq!(
            shown("https://a.blob.core.windows.net/c/d.vhd?sv=2022-11-02&sp=rw&sig=abc%2Bdef")
                .as_deref(),
            Some("https://a.blob.core.windows.net/c/d.vhd?<SAS>")
        );
        assert_eq!(
            shown("http://127.0.0.1:10000/acct/c/d.vhd?snapshot=T1&sv=1&SIG=x").as_deref(),
            Some("http://127.0.0.1:10000/acct/c/d.vhd?snapshot=T1&<SAS>")
        );
        assert_eq!(shown("sv=1&sig=x&se=2").as_deref(), Some("<SAS>"));
        assert_eq!(shown("c/d.vhd"), None);
        assert_eq!(shown("https://a/c/d.vhd?snapshot=T1"), None);
        assert_eq!(shown("/mnt/signature=1"), None);
    }

    #[test]
    fn connection_strings_lose_their_key_and_sas() {
        assert_eq!(
            shown("DefaultEndpointsProtocol=http;AccountName=a;AccountKey=Zm9vYmFyYmF6cXV4;BlobEndpoint=http://h/a;")
                .as_deref(),
            Some("DefaultEndpointsProtocol=http;AccountName=a;AccountKey=<hidden>;BlobEndpoint=http://h/a;")
        );
        assert_eq!(
            shown("--connection-string=accountkey=Zm9vYmFyYmF6cXV4;AccountName=a").as_deref(),
            Some("--connection-string=accountkey=<hidden>;AccountName=a")
        );
        assert_eq!(
            shown("BlobEndpoint=http://h/a;SharedAccessSignature=sv=1&sig=abcdefgh").as_deref(),
            Some("BlobEndpoint=http://h/a;SharedAccessSignature=<hidden>")
        );
        assert_eq!(shown("AccountName=a;BlobEndpoint=http://h/a"), None);
    }

    #[test]
    fn keys_the_parser_accepts_with_whitespace_around_them_are_hidden_too() {
        // The connection-string parser trims each part and key, so these
        // all carry the key.
        for (arg, want) in [
            (
                "AccountName=a; AccountKey=Zm9vYmFyYmF6cXV4;BlobEndpoint=http://h/a",
                "AccountName=a; AccountKey=<hidden>;BlobEndpoint=http://h/a",
            ),
            (
                "AccountName=a;AccountKey =Zm9vYmFyYmF6cXV4",
                "AccountName=a;AccountKey =<hidden>",
            ),
            (
                "AccountName=a;\n\tAccountKey= Zm9vYmFyYmF6cXV4",
                "AccountName=a;\n\tAccountKey=<hidden>",
            ),
            (
                "--connection-string= AccountKey=Zm9vYmFyYmF6cXV4;AccountName=a",
                "--connection-string= AccountKey=<hidden>;AccountName=a",
            ),
        ] {
            assert_eq!(shown(arg).as_deref(), Some(want), "{arg:?}");
        }
        // A key name inside another word, or a value, is not a setting.
        assert_eq!(
            shown("AccountName=myaccountkey;BlobEndpoint=http://h/a"),
            None
        );
        assert_eq!(shown("/mnt/ünï-accountkey=1"), None);
    }

    #[test]
    fn an_argument_too_short_for_the_marker_is_blanked() {
        // Shorter than `<hidden>`: the argument cannot grow in place.
        assert_eq!(shown("AccountKey=k").as_deref(), Some(""));
    }

    #[test]
    fn the_argument_area_is_read_from_stat() {
        let mut line = String::from("12 (a) b) c) S");
        for i in 4..=52 {
            line.push_str(&format!(" {i}"));
        }
        assert_eq!(arg_area(&line), Some((48, 49)));
        let own = std::fs::read_to_string("/proc/self/stat").unwrap();
        let (start, end) = arg_area(&own).expect("this process's arguments");
        assert!(end > start);
    }
}
