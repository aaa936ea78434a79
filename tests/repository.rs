//! The repository explains itself: every file path ARCHITECTURE.md,
//! CONTRIBUTING.md and docs/ name exists, and nothing in the repository points at documents
//! outside it.
//!
//! A path of the repository is written in a code span or as a link target;
//! files of other projects (a kernel source file, say) are named in plain
//! text, so this check leaves them alone.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every file and directory of the repository, relative to its root, with
/// `/` separators (build output, VCS data and installed tools left out).
fn repository_paths() -> Vec<String> {
    const SKIP: [&str; 4] = ["target", ".git", ".azurite", "node_modules"];
    let root = root();
    let mut out = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("repository directory is readable") {
            let path = entry.expect("directory entry").path();
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if SKIP.contains(&name.as_ref()) {
                continue;
            }
            let rel = path
                .strip_prefix(&root)
                .expect("under the root")
                .to_string_lossy()
                .into_owned();
            if path.is_dir() {
                stack.push(path);
            }
            out.push(rel);
        }
    }
    out
}

/// The file paths a Markdown text names: code spans and link targets that
/// look like a path of the repository (a `/` inside, or a `.rs`, `.md`, `.sh`
/// or `.toml` name), leaving out absolute paths, URLs and patterns.
fn named_paths(text: &str) -> Vec<String> {
    let mut candidates = Vec::new();
    for (i, part) in text.split('`').enumerate() {
        if i % 2 == 1 {
            candidates.push(part.to_string());
        }
    }
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        if let Some(end) = rest.find(')') {
            candidates.push(rest[..end].split('#').next().unwrap_or("").to_string());
        }
    }
    let is_path = |c: &str| {
        !c.is_empty()
            && !c.contains(char::is_whitespace)
            && !c.starts_with(['/', '$', '~'])
            && !c.contains(['<', '>', '*', '{', '$', ':', '?', '=', '@', '|'])
            && (c.contains('/')
                || [".rs", ".md", ".sh", ".toml"]
                    .iter()
                    .any(|ext| c.ends_with(ext)))
    };
    candidates.into_iter().filter(|c| is_path(c)).collect()
}

/// True when `named` is a repository path, whole or as the tail of one
/// (`fs/fuse.rs` for `src/fs/fuse.rs`, `create.rs` for `src/cli/create.rs`).
fn exists(named: &str, paths: &[String]) -> bool {
    let named = named.trim_end_matches('/');
    paths
        .iter()
        .any(|p| p == named || p.ends_with(&format!("/{named}")))
}

#[test]
fn every_path_the_guides_and_docs_name_exists() {
    let root = root();
    let paths = repository_paths();
    let mut documents = vec![root.join("ARCHITECTURE.md"), root.join("CONTRIBUTING.md")];
    for entry in std::fs::read_dir(root.join("docs")).expect("docs/ exists") {
        let path = entry.expect("directory entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            documents.push(path);
        }
    }
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in &documents {
        let text = std::fs::read_to_string(doc).expect("document is readable");
        for named in named_paths(&text) {
            checked += 1;
            if !exists(&named, &paths) {
                let doc = doc.strip_prefix(&root).unwrap_or(doc);
                missing.push(format!("{} names {named}", doc.display()));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} paths found: is the parser broken?"
    );
    assert!(
        missing.is_empty(),
        "paths that do not exist (moved? update the document):\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn the_path_check_reads_code_spans_and_links() {
    let text = "See `src/fs/fuse.rs`, [docs](docs/vhd.md#layout) and \
                `flush.rs`; not `/run/blobdrive`, `x-ms-range: bytes=0-511`, \
                `<cache dir>/v1`, `*.bdrec` or [a site](https://example.com/a.md).";
    assert_eq!(
        named_paths(text),
        vec!["src/fs/fuse.rs", "flush.rs", "docs/vhd.md"]
    );
    let paths = vec!["src".to_string(), "src/fs".into(), "src/fs/fuse.rs".into()];
    assert!(exists("fs/fuse.rs", &paths));
    assert!(exists("src/fs/", &paths));
    assert!(!exists("fs/fuse", &paths));
    assert!(!exists("use.rs", &paths));
}

#[test]
fn nothing_points_at_documents_outside_the_repository() {
    // Spelled in parts, so this file does not find itself.
    let outside = [
        concat!("DESIGN", ".md"),
        concat!("REFERENCE", ".md"),
        concat!("shared", " folder"),
    ];
    let root = root();
    let mut found = Vec::new();
    for rel in repository_paths() {
        let path = root.join(&rel);
        let text_file = ["rs", "md", "sh", "toml", "service"]
            .iter()
            .any(|ext| path.extension().is_some_and(|e| e == *ext))
            || Path::new(&rel).starts_with(".ci");
        if !path.is_file() || !text_file {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            if outside.iter().any(|o| line.contains(o)) {
                found.push(format!("{rel}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "point at ARCHITECTURE.md or a file in docs/ instead:\n  {}",
        found.join("\n  ")
    );
}
