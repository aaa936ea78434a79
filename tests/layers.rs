//! The module structure holds: no two modules of `src/` import each other
//! (directly or round a longer loop), and no layer imports one above it
//! (`blob` importing `drive`, `drive` importing `fs`, anything importing
//! `cli`). ARCHITECTURE.md describes the layers; [`FLOORS`] is their order.
//!
//! How imports are read: every `src/**/*.rs` file is a module; its source is
//! tokenized (comments and string literals skipped) and every path that starts
//! at `crate::`, `super::` or `self::`, at a child module, or at a name a `use`
//! bound to a module, is resolved to the deepest module it names. A name
//! re-exported by a `use` in that module is followed to the module that
//! defines it, so `super::Name` counts as an import of the sibling that holds
//! `Name`. Imports between a module and its own parent folder (`mod.rs`) do
//! not count toward loops: a folder's face re-exports its parts and its parts
//! use what it defines. Glob imports (`use x::*`) are not followed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The top-level modules of `src/`, from the ground up. A module may import
/// only modules on a lower floor (and its own parts); two modules on one
/// floor know nothing of each other.
const FLOORS: &[&[&str]] = &[
    &[
        "units",
        "metrics",
        "buffers",
        "private_dir",
        "shared_memory",
        "version",
        "open_files",
    ],
    &["partition", "crypt"],
    &["attach", "vhd", "blob"],
    &["drive"],
    &["recovery", "transfer", "provision"],
    &["fs"],
    &["daemon", "nbd"],
    &["lifecycle"],
    &["csi"],
    &["cli"],
];

/// A module path below the crate root, `["daemon", "attach"]`.
type ModPath = Vec<String>;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    PathSep,
    Open,
    Close,
    Semi,
    Comma,
    Star,
    Other,
}

/// Splits Rust source into the tokens paths are made of; comments, string,
/// char and byte literals and lifetimes are dropped.
fn tokenize(src: &str) -> Vec<Tok> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let ident_start = |c: u8| c == b'_' || c.is_ascii_alphabetic();
    let ident_char = |c: u8| c == b'_' || c.is_ascii_alphanumeric();
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied().unwrap_or(0);
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b'/' && next == b'/' {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && next == b'*' {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == b'"' {
            i = skip_string(b, i + 1);
        } else if let Some((body, hashes)) = string_prefix(b, i) {
            // r"..", r#".."#, b"..", br".."
            i = match hashes {
                None => skip_string(b, body),
                Some(n) => {
                    let end = format!("\"{}", "#".repeat(n));
                    let rest = &src[body..];
                    body + rest.find(&end).map_or(rest.len(), |p| p + end.len())
                }
            };
        } else if c == b'b' && next == b'\'' {
            i = skip_char(b, i + 1).unwrap_or(i + 2);
        } else if c == b'\'' {
            // A char literal, or a lifetime / label (skip only the quote).
            i = skip_char(b, i).unwrap_or(i + 1);
        } else if ident_start(c) {
            let start = i;
            while i < b.len() && ident_char(b[i]) {
                i += 1;
            }
            out.push(Tok::Ident(src[start..i].to_string()));
        } else if c == b':' && next == b':' {
            out.push(Tok::PathSep);
            i += 2;
        } else {
            out.push(match c {
                b'{' => Tok::Open,
                b'}' => Tok::Close,
                b';' => Tok::Semi,
                b',' => Tok::Comma,
                b'*' => Tok::Star,
                _ => Tok::Other,
            });
            i += 1;
        }
    }
    out
}

/// When a byte, raw or raw byte string starts at `i` (`b"`, `r"`, `r#"`,
/// `br"`): where its body starts, and for a raw string its number of `#`.
fn string_prefix(b: &[u8], i: usize) -> Option<(usize, Option<usize>)> {
    if i > 0 && (b[i - 1] == b'_' || b[i - 1].is_ascii_alphanumeric()) {
        return None;
    }
    let mut j = i;
    if b[j] == b'b' {
        j += 1;
    }
    let raw = b.get(j) == Some(&b'r');
    if raw {
        j += 1;
    }
    if j == i {
        return None;
    }
    let mut hashes = 0;
    while raw && b.get(j) == Some(&b'#') {
        hashes += 1;
        j += 1;
    }
    (b.get(j) == Some(&b'"')).then_some((j + 1, raw.then_some(hashes)))
}

/// Index just past the closing quote of a string whose body starts at `i`.
fn skip_string(b: &[u8], mut i: usize) -> usize {
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// Index just past a char literal whose opening quote is at `i`, or `None`
/// when the quote opens a lifetime or label.
fn skip_char(b: &[u8], i: usize) -> Option<usize> {
    if b.get(i + 1) == Some(&b'\\') {
        let close = b[i + 2..].iter().position(|&c| c == b'\'')?;
        return Some(i + 2 + close + 1);
    }
    // One UTF-8 character, then the closing quote.
    let len = match b.get(i + 1)? {
        c if *c < 0x80 => 1,
        c if *c >= 0xF0 => 4,
        c if *c >= 0xE0 => 3,
        _ => 2,
    };
    (b.get(i + 1 + len) == Some(&b'\'')).then_some(i + 2 + len)
}

/// One file of `src/` as the checker sees it.
struct Module {
    file: PathBuf,
    /// The paths it names (as written, segments), with the module it is in
    /// (its own path, or that of an inline module inside it).
    refs: Vec<(ModPath, Vec<String>)>,
    /// What its `use` items bind: name -> the path written (absolute after
    /// resolution), at the file's top level only.
    uses: Vec<(ModPath, String, Vec<String>)>,
}

/// Parses one `use` tree starting at `toks[i]`, pushing every leaf path with
/// the name it binds. Returns the index after the tree.
fn parse_use_tree(
    toks: &[Tok],
    mut i: usize,
    prefix: &[String],
    leaves: &mut Vec<(Option<String>, Vec<String>)>,
) -> usize {
    let mut path = prefix.to_vec();
    loop {
        match toks.get(i) {
            Some(Tok::PathSep) => i += 1,
            Some(Tok::Ident(id)) if id == "as" => {
                let alias = match toks.get(i + 1) {
                    Some(Tok::Ident(a)) if a != "_" => Some(a.clone()),
                    _ => None,
                };
                leaves.push((alias, path));
                return i + 2;
            }
            Some(Tok::Ident(id)) => {
                if id == "self" && !path.is_empty() {
                    // `use a::b::{self}` binds `b` to `a::b`.
                } else {
                    path.push(id.clone());
                }
                i += 1;
            }
            Some(Tok::Open) => {
                i += 1;
                loop {
                    match toks.get(i) {
                        Some(Tok::Close) => return i + 1,
                        Some(Tok::Comma) => i += 1,
                        None => return i,
                        _ => i = parse_use_tree(toks, i, &path, leaves),
                    }
                }
            }
            Some(Tok::Star) => {
                leaves.push((None, path));
                return i + 1;
            }
            _ => {
                let name = path.last().cloned();
                leaves.push((name, path));
                return i;
            }
        }
    }
}

fn read_module(file: &Path, own: &ModPath) -> Module {
    let src = std::fs::read_to_string(file).expect("source file is readable");
    let toks = tokenize(&src);
    let mut refs = Vec::new();
    let mut uses = Vec::new();
    // Inline modules (`mod tests { .. }`): (name, brace depth inside it).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        let here = || {
            let mut m = own.clone();
            m.extend(inline.iter().map(|(n, _)| n.clone()));
            m
        };
        match &toks[i] {
            Tok::Open => {
                depth += 1;
                i += 1;
            }
            Tok::Close => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
            }
            Tok::Ident(kw) if kw == "mod" => {
                if let (Some(Tok::Ident(name)), Some(Tok::Open)) =
                    (toks.get(i + 1), toks.get(i + 2))
                {
                    depth += 1;
                    inline.push((name.clone(), depth));
                    i += 3;
                } else {
                    i += 1;
                }
            }
            Tok::Ident(kw) if kw == "use" => {
                let mut leaves = Vec::new();
                let end = parse_use_tree(&toks, i + 1, &[], &mut leaves);
                let module = here();
                let top_level = depth == inline.len();
                for (name, path) in leaves {
                    if let (Some(name), true) = (name, top_level) {
                        uses.push((module.clone(), name, path.clone()));
                    }
                    refs.push((module.clone(), path));
                }
                i = end;
            }
            Tok::Ident(first)
                if toks.get(i + 1) == Some(&Tok::PathSep)
                    && !matches!(i.checked_sub(1).map(|p| &toks[p]), Some(Tok::PathSep)) =>
            {
                let mut path = vec![first.clone()];
                let mut j = i + 1;
                while toks.get(j) == Some(&Tok::PathSep) {
                    match toks.get(j + 1) {
                        Some(Tok::Ident(seg)) => {
                            path.push(seg.clone());
                            j += 2;
                        }
                        _ => break,
                    }
                }
                refs.push((here(), path));
                i = j;
            }
            _ => i += 1,
        }
    }
    Module {
        file: file.to_path_buf(),
        refs,
        uses,
    }
}

/// Every module file of `src/` (the binary's `main.rs` aside), by module path.
fn modules(src: &Path) -> BTreeMap<ModPath, Module> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("src/ is readable") {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).expect("under src/");
            let mut segs: ModPath = rel
                .with_extension("")
                .iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect();
            match segs.last().map(String::as_str) {
                Some("main") if segs.len() == 1 => continue,
                Some("lib") if segs.len() == 1 => segs.clear(),
                Some("mod") => {
                    segs.pop();
                }
                _ => {}
            }
            let mut module = read_module(&path, &segs);
            module.file = Path::new("src").join(rel);
            out.insert(segs, module);
        }
    }
    out
}

struct Graph {
    modules: BTreeMap<ModPath, Module>,
    /// Names bound by `use` at each module's top level: module -> name -> path.
    bindings: BTreeMap<ModPath, BTreeMap<String, ModPath>>,
}

impl Graph {
    fn new(modules: BTreeMap<ModPath, Module>) -> Self {
        let mut graph = Graph {
            modules,
            bindings: BTreeMap::new(),
        };
        let mut bindings: BTreeMap<ModPath, BTreeMap<String, ModPath>> = BTreeMap::new();
        for module in graph.modules.values() {
            for (at, name, path) in &module.uses {
                if let Some(abs) = graph.absolute(at, path, false) {
                    bindings
                        .entry(at.clone())
                        .or_default()
                        .insert(name.clone(), abs);
                }
            }
        }
        graph.bindings = bindings;
        graph
    }

    /// The absolute path a written path names from module `at`, if it is one
    /// of this crate's (`crate::`, `super::`, `self::`, a child module, or a
    /// name bound by `use`).
    fn absolute(&self, at: &ModPath, path: &[String], with_bindings: bool) -> Option<ModPath> {
        let (first, rest) = path.split_first()?;
        let mut base: ModPath = match first.as_str() {
            "crate" => Vec::new(),
            "self" => at.clone(),
            "super" => {
                let mut base = at.clone();
                base.pop()?;
                let mut rest = rest;
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
                base.extend(rest.iter().cloned());
                return Some(base);
            }
            name => {
                let mut child = at.clone();
                child.push(name.to_string());
                if self.is_module(&child) {
                    child
                } else if with_bindings {
                    self.binding_in_scope(at, name)?
                } else {
                    return None;
                }
            }
        };
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// A name bound by a `use` in `at` or in the file module around it.
    fn binding_in_scope(&self, at: &ModPath, name: &str) -> Option<ModPath> {
        let mut scope = at.clone();
        loop {
            if let Some(path) = self.bindings.get(&scope).and_then(|b| b.get(name)) {
                return Some(path.clone());
            }
            if self.modules.contains_key(&scope) {
                return None;
            }
            scope.pop()?;
        }
    }

    fn is_module(&self, path: &ModPath) -> bool {
        self.modules.contains_key(path)
    }

    /// The module file that defines what `path` names, following re-exports.
    fn target(&self, path: &ModPath) -> Option<ModPath> {
        let mut path = path.clone();
        for _ in 0..8 {
            let module = (0..=path.len())
                .rev()
                .map(|n| path[..n].to_vec())
                .find(|p| self.is_module(p))?;
            let Some(item) = path.get(module.len()) else {
                return Some(module);
            };
            match self.bindings.get(&module).and_then(|b| b.get(item)) {
                Some(next) if !next.starts_with(&path[..module.len() + 1]) => {
                    let mut next = next.clone();
                    next.extend(path[module.len() + 1..].iter().cloned());
                    path = next;
                }
                _ => return Some(module),
            }
        }
        None
    }

    /// Module -> modules it imports, each with one path that shows it.
    fn edges(&self) -> BTreeMap<ModPath, BTreeMap<ModPath, String>> {
        let mut edges: BTreeMap<ModPath, BTreeMap<ModPath, String>> = BTreeMap::new();
        for (own, module) in &self.modules {
            for (at, path) in &module.refs {
                let Some(target) = self
                    .absolute(at, path, true)
                    .and_then(|abs| self.target(&abs))
                else {
                    continue;
                };
                if target.is_empty() || &target == own {
                    continue;
                }
                edges
                    .entry(own.clone())
                    .or_default()
                    .entry(target)
                    .or_insert_with(|| {
                        format!("{} names {}", module.file.display(), path.join("::"))
                    });
            }
        }
        edges
    }
}

fn name(path: &ModPath) -> String {
    if path.is_empty() {
        "crate".into()
    } else {
        path.join("::")
    }
}

fn graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    Graph::new(modules(&src))
}

/// The loops of a graph (its strongly connected components of two or more).
fn loops(edges: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<Vec<ModPath>> {
    // Tarjan's algorithm; the graph has a few hundred nodes at most.
    struct State<'a> {
        edges: &'a BTreeMap<ModPath, BTreeSet<ModPath>>,
        index: BTreeMap<&'a ModPath, usize>,
        low: BTreeMap<&'a ModPath, usize>,
        stack: Vec<&'a ModPath>,
        on_stack: BTreeSet<&'a ModPath>,
        found: Vec<Vec<ModPath>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a ModPath) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.edges.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.clone());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.found
}

/// The loops among `graph`'s modules, each with the imports that close it;
/// empty when there are none.
fn loop_report(graph: &Graph) -> String {
    let edges = graph.edges();
    // A folder's face and its parts may use each other.
    let counted: BTreeMap<ModPath, BTreeSet<ModPath>> = edges
        .iter()
        .map(|(from, to)| {
            let to = to
                .keys()
                .filter(|t| !t.starts_with(from) && !from.starts_with(t))
                .cloned()
                .collect();
            (from.clone(), to)
        })
        .collect();
    let mut report = String::new();
    for component in loops(&counted) {
        report.push_str(&format!(
            "\nthese modules import each other: {}",
            component.iter().map(name).collect::<Vec<_>>().join(", ")
        ));
        for from in &component {
            for (to, why) in &edges[from] {
                if component.contains(to) {
                    report.push_str(&format!("\n  {} -> {}: {why}", name(from), name(to)));
                }
            }
        }
    }
    report
}

/// Imports of `graph` that do not go down `floors`, one line each.
fn layer_violations(graph: &Graph, floors: &[&[&str]]) -> Vec<String> {
    let floor_of = |top: &str| floors.iter().position(|floor| floor.contains(&top));
    let mut wrong = BTreeSet::new();
    for (from, to) in graph.edges() {
        let Some(top) = from.first() else { continue };
        let Some(from_floor) = floor_of(top) else {
            wrong.insert(format!(
                "src/{top} is on no floor: add it to FLOORS in tests/layers.rs and to ARCHITECTURE.md"
            ));
            continue;
        };
        for (target, why) in to {
            let Some(other) = target.first().filter(|t| *t != top) else {
                continue;
            };
            match floor_of(other) {
                Some(floor) if floor < from_floor => {}
                _ => {
                    wrong.insert(format!("{} imports {}: {why}", name(&from), name(&target)));
                }
            }
        }
    }
    wrong.into_iter().collect()
}

#[test]
fn no_two_modules_import_each_other() {
    let report = loop_report(&graph());
    assert!(
        report.is_empty(),
        "move the shared piece down to where both sides can use it:{report}"
    );
}

#[test]
fn no_layer_imports_one_above_it() {
    let wrong = layer_violations(&graph(), FLOORS);
    assert!(
        wrong.is_empty(),
        "a layer imports one on its own floor or above (see ARCHITECTURE.md):\n  {}",
        wrong.join("\n  ")
    );
}

/// The checker itself sees what it must, on a small crate: the loop
/// `drive/fetch.rs` <-> `drive/io.rs` this crate once had, closed through a
/// re-export in `drive/mod.rs`, and a layer importing one above it; and
/// nothing in comments, strings, lifetimes or test modules.
#[test]
fn the_checker_finds_a_loop_through_a_re_export_and_a_layer_break() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    let write = |rel: &str, text: &str| {
        let path = src.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write("lib.rs", "pub mod drive;\npub mod units;\n");
    write(
        "units.rs",
        "//! `crate::drive` in a comment is no import.\npub const P: u64 = 512;\n",
    );
    write(
        "drive/mod.rs",
        "mod fetch;\nmod io;\npub use fetch::Job;\npub(crate) struct Inner;\n",
    );
    write(
        "drive/io.rs",
        "use super::Job;\nuse super::Inner;\nconst S: &str = \"super::fetch::X\";\nfn f<'a>(_: &'a u8) -> char { 'x' }\npub(crate) fn chunks() {}\n",
    );
    write(
        "drive/fetch.rs",
        "use crate::units::P;\npub struct Job;\nfn g() { super::io::chunks(); }\n#[cfg(test)]\nmod tests { use super::*; }\n",
    );
    let graph = Graph::new(modules(src));
    let edges = graph.edges();
    let m = |s: &str| -> ModPath { s.split("::").map(String::from).collect() };
    let of = |s: &str| {
        edges
            .get(&m(s))
            .map(|t| t.keys().cloned().collect::<Vec<_>>())
    };
    assert_eq!(of("drive::io"), Some(vec![m("drive"), m("drive::fetch")]));
    assert_eq!(of("drive::fetch"), Some(vec![m("drive::io"), m("units")]));
    assert_eq!(of("units"), None, "comments and strings are not imports");
    let report = loop_report(&graph);
    assert!(report.contains("these modules import each other: drive::fetch, drive::io"));
    assert!(report.contains("drive::io -> drive::fetch: src/drive/io.rs names super::Job"));

    // `units` on the ground importing `drive` above it.
    write("units.rs", "pub const P: u64 = crate::drive::SIZE;\n");
    let graph = Graph::new(modules(src));
    assert_eq!(
        layer_violations(&graph, &[&["units"], &["drive"]]),
        vec!["units imports drive: src/units.rs names crate::drive::SIZE".to_string()]
    );
}
