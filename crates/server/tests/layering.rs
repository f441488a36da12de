//! ARCHITECTURE §1: dependencies point one way, between crates and between the top-level
//! modules inside each crate.
//!
//! **Crates.** The codec, the topic trie and the store are leaves that know nothing of each
//! other; the bench tool stands on the codec alone. The first test reads each crate's manifest
//! and fails when a crate grows a dependency on a crate of ours it must not see.
//!
//! **Modules.** A top-level module is `src/x.rs` or `src/x/` of a crate. The module tests read
//! every `crate::` path (`use crate::{a, b::c}` groups item by item, `crate::x::y` in
//! expressions and types, `super::` chains that climb from a submodule to the crate root) and
//! resolve a name the crate root brings in with `use` (`pub use a::B` in lib.rs) to the module
//! it comes from. They fail on any cycle among the top-level modules of any crate, naming the
//! loop and, for each import in it, the file, line and path that make it.
//!
//! What counts is what the project's hook counts (`/work/shared/hooks/modcycles.py`), so the two
//! agree: comments never count; test modules do not count (inline `#[cfg(test)] mod x { .. }`,
//! and the files `tests.rs`, `*_tests.rs` and those under a `tests/` directory), since they do not
//! ship and a test may reach across layers to check one; everything else counts, code behind a
//! cargo feature included (the `sim` feature of tern-store is compiled in CI). Where the test
//! reads more exactly than the hook's regular expressions (string literals holding `crate::`,
//! nested `use` groups, `super::` paths, private `use` in lib.rs), both give the same verdict on
//! the tree; the hook prints only the biggest cycle of a crate, the test every one.
//!
//! **Written layers.** The leaf crates also carry their order, lowest layer first, in `LAYERS`,
//! and a module may import only its own layer and those below. A cycle alone says that one of
//! its imports is wrong, not which: with the order written down, the failure points at the one
//! upward import to remove, and the list doubles as the crate's map for a newcomer (each
//! `lib.rs` module map follows it). The price is that a new module must be placed in the list,
//! which is the decision we want made on purpose. `crates/broker` has no order yet: its cycle is
//! a named exception in `KNOWN_CYCLES` until it is untangled (issue 22), and it gets its layers
//! then.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// (crate directory, the crates of ours it may depend on)
const ALLOWED: &[(&str, &[&str])] = &[
    ("wire", &[]),
    ("topic", &[]),
    ("store", &[]),
    ("bench", &["tern-wire"]),
    ("broker", &["tern-wire", "tern-topic", "tern-store"]),
];

fn crates_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Names of `tern-*` dependencies in every dependency table of a manifest.
fn our_dependencies(manifest: &str) -> Vec<String> {
    let mut in_dependency_table = false;
    let mut found = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_dependency_table = line.contains("dependencies");
            if let Some(name) = line
                .trim_matches(|c| c == '[' || c == ']')
                .rsplit('.')
                .next()
                .filter(|name| in_dependency_table && name.starts_with("tern-"))
            {
                found.push(name.to_string());
            }
            continue;
        }
        if in_dependency_table {
            let key = line.split(['=', '.']).next().unwrap_or("").trim();
            if key.starts_with("tern-") || key == "tern" {
                found.push(key.to_string());
            }
        }
    }
    found
}

#[test]
fn leaf_crates_do_not_depend_on_other_crates_of_ours() {
    for (dir, allowed) in ALLOWED {
        let path = crates_dir().join(dir).join("Cargo.toml");
        let manifest = std::fs::read_to_string(&path)
            .unwrap_or_else(|error| panic!("reading {}: {error}", path.display()));
        // A crate may depend on itself: tern-store's tests turn its `sim` feature on that way.
        let own = format!("tern-{dir}");
        for dependency in our_dependencies(&manifest)
            .into_iter()
            .filter(|d| *d != own)
        {
            assert!(
                allowed.contains(&dependency.as_str()),
                "crates/{dir} depends on {dependency}, which ARCHITECTURE §1 forbids"
            );
        }
    }
}

#[test]
fn the_scanner_sees_dependencies_in_every_form() {
    let manifest = "[package]\nname = \"tern-x\"\n[dependencies]\ntern-wire.workspace = true\n\
                    bytes = \"1\"\n[dev-dependencies]\ntern-store = { path = \"../store\" }\n\
                    [target.'cfg(unix)'.dependencies.tern-topic]\npath = \"../topic\"\n";
    assert_eq!(
        our_dependencies(manifest),
        vec!["tern-wire", "tern-store", "tern-topic"]
    );
}

// ---------------------------------------------------------------------------------------------
// Module level: the top-level modules inside each crate.
// ---------------------------------------------------------------------------------------------

/// Import cycles that exist today and are being untangled (issue 22). Each entry is one crate's
/// cycle, spelled out member by member: the test fails if the cycle grows, changes or shrinks,
/// so whoever breaks an edge of it must shrink this list to what is left, and delete the entry
/// once the crate has no cycle. Nothing may be added here.
const KNOWN_CYCLES: &[(&str, &[&str])] = &[(
    "broker",
    &[
        "ack_pipeline",
        "admin",
        "broker",
        "checkpoint",
        "connection",
        "exposition",
        "keep_alive",
        "message",
        "outbound",
        "persist",
        "retained",
        "router",
        "session",
        "sys",
        "will",
    ],
)];

/// The written layers of the leaf crates, lowest first. A module may import modules of its own
/// layer and of the layers below it, never of a layer above; every top-level module of the
/// crate must be listed (a new module is placed on purpose, not by accident).
const LAYERS: &[(&str, &[&[&str]])] = &[
    (
        "wire",
        &[
            &["varint", "packet_type"],
            &["reason", "property_table"],
            &["error"],
            &["string"],
            &["properties"],
            &["packet"],
            &["decode", "encode"],
            &["fanout"],
        ],
    ),
    (
        "topic",
        &[
            &["error", "hybrid_map", "shared"],
            &["validate", "subscribers"],
            &["trie"],
        ],
    ),
    (
        "store",
        &[
            &["error", "filter", "histogram", "vfs"],
            &["config", "lockfile", "queue", "sim"],
            &["format"],
            &["record", "scan"],
            &["state"],
            &["recovery"],
            &["shared"],
            &["wake", "ticket"],
            &["writer"],
            &["stream"],
            &["read", "kv"],
            &["store"],
        ],
    ),
];

/// One `crate::` (or crate-root `super::`) path in a module: `from` imports `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Import {
    from: String,
    to: String,
    /// Relative to the crate's `src/`.
    file: String,
    line: usize,
    /// The path as written, shortened to its item (`crate::format::Entry`).
    path: String,
}

impl std::fmt::Display for Import {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} -> {}: src/{}:{} `{}`",
            self.from, self.to, self.file, self.line, self.path
        )
    }
}

/// A crate's top-level modules and every import between two different ones.
struct ModuleGraph {
    modules: BTreeSet<String>,
    imports: Vec<Import>,
}

impl ModuleGraph {
    /// One import per (from, to) pair, the first met in file order.
    fn edges(&self) -> BTreeMap<(&str, &str), &Import> {
        let mut edges = BTreeMap::new();
        for import in &self.imports {
            edges
                .entry((import.from.as_str(), import.to.as_str()))
                .or_insert(import);
        }
        edges
    }
}

/// Whether a file under `src/` is test code, by the same rule as the project's hook
/// (`/work/shared/hooks/modcycles.py`): `tests.rs`, `*_tests.rs`, anything under a `tests`
/// directory; `bin/` holds other crates (their own roots).
fn is_skipped_file(rel: &str) -> bool {
    let file = rel.rsplit('/').next().unwrap_or(rel);
    file == "tests.rs"
        || file.ends_with("_tests.rs")
        || rel.split('/').any(|part| part == "tests")
        || rel.starts_with("bin/")
}

/// The module path a file defines: `a.rs` and `a/mod.rs` are `[a]`, `a/b.rs` is `[a, b]`.
fn file_module_path(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel.split('/').map(str::to_string).collect();
    if let Some(last) = parts.pop() {
        let stem = last.trim_end_matches(".rs");
        if stem != "mod" {
            parts.push(stem.to_string());
        }
    }
    parts
}

fn rust_files(dir: &Path, src: &Path, out: &mut Vec<(PathBuf, String)>) {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|error| panic!("reading {}: {error}", dir.display()));
    for entry in entries {
        let path = entry
            .unwrap_or_else(|error| panic!("reading {}: {error}", dir.display()))
            .path();
        if path.is_dir() {
            rust_files(&path, src, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            let rel = path
                .strip_prefix(src)
                .unwrap_or(&path)
                .to_string_lossy()
                .replace('\\', "/");
            out.push((path, rel));
        }
    }
    out.sort();
}

/// Reads `crates/<name>/src` into its module graph.
fn crate_graph(src: &Path) -> ModuleGraph {
    let mut files = Vec::new();
    rust_files(src, src, &mut files);
    let files: Vec<(PathBuf, String)> = files
        .into_iter()
        .filter(|(_, rel)| !is_skipped_file(rel))
        .collect();
    let read = |path: &Path| {
        std::fs::read_to_string(path)
            .unwrap_or_else(|error| panic!("reading {}: {error}", path.display()))
    };
    let root = ["lib.rs", "main.rs"].map(|name| src.join(name));
    let root_names = root
        .iter()
        .find(|path| path.exists())
        .map(|path| root_reexports(&read(path)))
        .unwrap_or_default();
    let modules: BTreeSet<String> = files
        .iter()
        .map(|(_, rel)| file_module_path(rel))
        .filter_map(|path| path.into_iter().next())
        .filter(|top| top != "lib" && top != "main")
        .collect();
    let mut imports = Vec::new();
    for (path, rel) in &files {
        let module_path = file_module_path(rel);
        let Some(top) = module_path.first().filter(|top| modules.contains(*top)) else {
            continue;
        };
        for found in crate_paths(&read(path), module_path.len()) {
            let to = if modules.contains(&found.head) {
                Some(&found.head)
            } else {
                root_names.get(&found.head)
            };
            if let Some(to) = to.filter(|to| *to != top && modules.contains(*to)) {
                imports.push(Import {
                    from: top.clone(),
                    to: to.clone(),
                    file: rel.clone(),
                    line: found.line,
                    path: found.text,
                });
            }
        }
    }
    ModuleGraph { modules, imports }
}

// --- the scanner ---

/// `src` with comments and the insides of string and char literals replaced by spaces
/// (newlines kept, so lines still count): `crate::` in a doc comment or a message is no import.
fn blank_comments_and_literals(src: &str) -> String {
    let chars: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let ident_before = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                blank(&mut out, chars[i]);
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
            }
        } else if let Some(hashes) = raw_string_start(&chars, i).filter(|_| !ident_before) {
            // r"..", r#".."#, br"..", cr"..": no escapes, ends at `"` and as many `#`.
            let open = chars[i..].iter().position(|&c| c == '"').unwrap_or(0) + 1;
            out.extend(std::iter::repeat_n(' ', open));
            i += open;
            while i < chars.len() {
                let closes =
                    chars[i] == '"' && (1..=hashes).all(|k| chars.get(i + k) == Some(&'#'));
                if closes {
                    out.extend(std::iter::repeat_n(' ', hashes + 1));
                    i += hashes + 1;
                    break;
                }
                blank(&mut out, chars[i]);
                i += 1;
            }
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
                if let Some(&c) = chars.get(i) {
                    blank(&mut out, c);
                }
                i += 1;
            }
            if i < chars.len() {
                out.push(' ');
                i += 1;
            }
        } else if c == '\'' && (next == Some('\\') || chars.get(i + 2) == Some(&'\'')) {
            // A char literal ('x', '\n', '\''), not a lifetime or a label.
            let end = if next == Some('\\') {
                (i + 3..chars.len())
                    .find(|&k| chars[k] == '\'')
                    .unwrap_or(chars.len() - 1)
            } else {
                i + 2
            };
            out.extend(std::iter::repeat_n(' ', end + 1 - i));
            i = end + 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// At a raw string literal (`r`, `br` or `cr`, then `#`s and `"`): the number of `#`s.
fn raw_string_start(chars: &[char], i: usize) -> Option<usize> {
    let mut k = i;
    if matches!(chars.get(k), Some('b' | 'c')) {
        k += 1;
    }
    if chars.get(k) != Some(&'r') {
        return None;
    }
    k += 1;
    let hashes = chars[k..].iter().take_while(|&&c| c == '#').count();
    (chars.get(k + hashes) == Some(&'"')).then_some(hashes)
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    PathSep,
    Punct(char),
}

fn tokens(src: &str) -> Vec<(Tok, usize)> {
    let blanked = blank_comments_and_literals(src);
    let chars: Vec<char> = blanked.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push((Tok::Ident(chars[start..i].iter().collect()), line));
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push((Tok::PathSep, line));
            i += 2;
        } else {
            out.push((Tok::Punct(c), line));
            i += 1;
        }
    }
    out
}

fn is_ident(tok: Option<&(Tok, usize)>, name: &str) -> bool {
    matches!(tok, Some((Tok::Ident(n), _)) if n == name)
}

fn is_sep(tok: Option<&(Tok, usize)>) -> bool {
    matches!(tok, Some((Tok::PathSep, _)))
}

fn is_punct(tok: Option<&(Tok, usize)>, c: char) -> bool {
    matches!(tok, Some((Tok::Punct(p), _)) if *p == c)
}

/// Index just past the bracket group opening at `open` (`{`, `[` or `(`).
fn past_group(toks: &[(Tok, usize)], open: usize) -> usize {
    let mut depth = 0usize;
    for (k, (tok, _)) in toks.iter().enumerate().skip(open) {
        match tok {
            Tok::Punct('{' | '[' | '(') => depth += 1,
            Tok::Punct('}' | ']' | ')') => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return k + 1;
                }
            }
            _ => {}
        }
    }
    toks.len()
}

/// The tokens of a file without its inline test modules (`#[cfg(test)] mod x { .. }`, other
/// attributes and a visibility allowed in between). Test modules do not count, as in the hook:
/// they do not ship, and a test may reach across layers to check one. Other `#[cfg(test)]`
/// items count (the hook counts them too).
fn non_test_tokens(src: &str) -> Vec<(Tok, usize)> {
    let toks = tokens(src);
    let mut out = Vec::with_capacity(toks.len());
    let mut i = 0;
    while i < toks.len() {
        if let Some(end) = test_module_end(&toks, i) {
            i = end;
        } else {
            out.push(toks[i].clone());
            i += 1;
        }
    }
    out
}

/// At `#[cfg(test)]` heading an inline module: the index past the module's closing brace.
fn test_module_end(toks: &[(Tok, usize)], i: usize) -> Option<usize> {
    let cfg_test = [
        Tok::Punct('#'),
        Tok::Punct('['),
        Tok::Ident("cfg".into()),
        Tok::Punct('('),
        Tok::Ident("test".into()),
        Tok::Punct(')'),
        Tok::Punct(']'),
    ];
    let heads = toks.get(i..i + cfg_test.len())?;
    if !heads.iter().map(|(t, _)| t).eq(cfg_test.iter()) {
        return None;
    }
    let mut k = i + cfg_test.len();
    while is_punct(toks.get(k), '#') && is_punct(toks.get(k + 1), '[') {
        k = past_group(toks, k + 1);
    }
    if is_ident(toks.get(k), "pub") {
        k += 1;
        if is_punct(toks.get(k), '(') {
            k = past_group(toks, k);
        }
    }
    let named = matches!(toks.get(k + 1), Some((Tok::Ident(_), _)));
    (is_ident(toks.get(k), "mod") && named && is_punct(toks.get(k + 2), '{'))
        .then(|| past_group(toks, k + 2))
}

/// A path into another top-level module, as found: its first segment below the crate root.
#[derive(Debug, PartialEq, Eq)]
struct FoundPath {
    head: String,
    line: usize,
    text: String,
}

/// Every path from the crate root in a file whose module path has `depth` segments:
/// `crate::a::..`, each item of `crate::{a, b::{c, d}}`, and `super::` chains that climb to
/// the root (from `a.rs`, `super::b`; from `a/x.rs` or an inline `mod` in `a.rs`,
/// `super::super::b`).
fn crate_paths(src: &str, depth: usize) -> Vec<FoundPath> {
    let toks = non_test_tokens(src);
    let mut found = Vec::new();
    // Brace depths at which inline `mod x {` blocks opened: each adds a level for `super`.
    let mut inline_mods: Vec<usize> = Vec::new();
    let mut braces = 0usize;
    let mut i = 0;
    while i < toks.len() {
        let after_sep = i > 0 && toks[i - 1].0 == Tok::PathSep;
        match &toks[i].0 {
            Tok::Punct('{') => braces += 1,
            Tok::Punct('}') => {
                braces = braces.saturating_sub(1);
                if inline_mods.last() == Some(&braces) {
                    inline_mods.pop();
                }
            }
            Tok::Ident(word) if word == "mod" && is_punct(toks.get(i + 2), '{') => {
                inline_mods.push(braces);
            }
            Tok::Ident(word) if word == "crate" && !after_sep && is_sep(toks.get(i + 1)) => {
                found.extend(root_items(&toks, i + 2));
            }
            Tok::Ident(word) if word == "super" && !after_sep => {
                let mut k = i;
                let mut climbs = 0;
                while is_ident(toks.get(k), "super") && is_sep(toks.get(k + 1)) {
                    climbs += 1;
                    k += 2;
                }
                if climbs > 0 && climbs >= depth + inline_mods.len() {
                    found.extend(root_items(&toks, k));
                }
                i = k.max(i + 1);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    found
}

/// The items of a path that continues from the crate root at `at`: one for `a::b`, one per
/// item of a `{..}` group (`self` and `*` name the root itself and are skipped).
fn root_items(toks: &[(Tok, usize)], at: usize) -> Vec<FoundPath> {
    match toks.get(at) {
        Some((Tok::Ident(head), line)) if head != "self" => vec![FoundPath {
            head: head.clone(),
            line: *line,
            text: format!("crate::{}", path_text(toks, at)),
        }],
        Some((Tok::Punct('{'), _)) => {
            let end = past_group(toks, at).saturating_sub(1);
            let mut items = Vec::new();
            let mut k = at + 1;
            while k < end {
                items.extend(root_items(toks, k));
                // On to the next item at this level.
                while k < end && !is_punct(toks.get(k), ',') {
                    k = if is_punct(toks.get(k), '{') {
                        past_group(toks, k)
                    } else {
                        k + 1
                    };
                }
                k += 1;
            }
            items
        }
        _ => Vec::new(),
    }
}

/// `a::b::C` from `at` on, a trailing group shown as `{..}`.
fn path_text(toks: &[(Tok, usize)], at: usize) -> String {
    let mut text = String::new();
    for (tok, _) in &toks[at..] {
        match tok {
            Tok::Ident(name) if !text.ends_with(|c: char| c.is_alphanumeric() || c == '_') => {
                text.push_str(name)
            }
            Tok::PathSep => text.push_str("::"),
            Tok::Punct('{') if text.ends_with("::") => {
                text.push_str("{..}");
                break;
            }
            _ => break,
        }
    }
    text
}

/// Names the crate root brings in with `use` (public or not: `crate::Name` reaches both),
/// mapped to the top-level module they come from: `pub use a::{B, c::D as E}` gives B and E
/// from `a`. Names from other crates map to a module that does not exist and are dropped.
fn root_reexports(root_src: &str) -> BTreeMap<String, String> {
    let toks = non_test_tokens(root_src);
    let mut names = BTreeMap::new();
    let mut braces = 0usize;
    for (i, (tok, _)) in toks.iter().enumerate() {
        match tok {
            Tok::Punct('{') => braces += 1,
            Tok::Punct('}') => braces = braces.saturating_sub(1),
            Tok::Ident(word) if word == "use" && braces == 0 => {
                let mut k = i + 1;
                while is_ident(toks.get(k), "crate")
                    || is_ident(toks.get(k), "self")
                    || is_sep(toks.get(k))
                {
                    k += 1;
                }
                let Some((Tok::Ident(module), _)) = toks.get(k) else {
                    continue;
                };
                let mut bound = Vec::new();
                use_tree_names(&toks, k, &mut bound);
                for name in bound {
                    names.entry(name).or_insert_with(|| module.clone());
                }
            }
            _ => {}
        }
    }
    names
}

/// The names a use tree starting at `at` binds (the last segment, its `as` alias, each item of
/// a group; `self` in a group binds the segment before it). Returns the index past the tree.
fn use_tree_names(toks: &[(Tok, usize)], at: usize, bound: &mut Vec<String>) -> usize {
    let mut k = at;
    let mut last: Option<String> = None;
    loop {
        match toks.get(k).map(|t| &t.0) {
            Some(Tok::Ident(name)) if name == "as" => {
                if let Some((Tok::Ident(alias), _)) = toks.get(k + 1) {
                    last = Some(alias.clone());
                }
                k += 2;
            }
            Some(Tok::Ident(name)) if name == "self" => {
                k += 1;
            }
            Some(Tok::Ident(name)) => {
                last = Some(name.clone());
                k += 1;
            }
            Some(Tok::PathSep) => k += 1,
            Some(Tok::Punct('{')) => {
                k += 1;
                while k < toks.len() && !is_punct(toks.get(k), '}') {
                    if is_ident(toks.get(k), "self") {
                        bound.extend(last.clone());
                    }
                    k = use_tree_names(toks, k, bound);
                    if is_punct(toks.get(k), ',') {
                        k += 1;
                    }
                }
                return k + 1;
            }
            _ => {
                bound.extend(last);
                return k;
            }
        }
    }
}

// --- the checks ---

/// Strongly connected components with more than one module (Tarjan), members sorted.
fn cycles(graph: &ModuleGraph) -> Vec<BTreeSet<String>> {
    struct Tarjan<'a> {
        adjacent: BTreeMap<&'a str, BTreeSet<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<BTreeSet<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            let next: Vec<&str> = self
                .adjacent
                .get(v)
                .into_iter()
                .flatten()
                .copied()
                .collect();
            for w in next {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.stack.contains(&w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let at = self.stack.iter().rposition(|&m| m == v).unwrap_or(0);
                let members: BTreeSet<String> =
                    self.stack.drain(at..).map(str::to_string).collect();
                if members.len() > 1 {
                    self.found.push(members);
                }
            }
        }
    }
    let mut adjacent: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for &(from, to) in graph.edges().keys() {
        adjacent.entry(from).or_default().insert(to);
    }
    let mut tarjan = Tarjan {
        adjacent,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for module in &graph.modules {
        if !tarjan.index.contains_key(module.as_str()) {
            tarjan.visit(module);
        }
    }
    tarjan.found.sort();
    tarjan.found
}

/// The shortest loop through `members`, as the imports that make it.
fn shortest_loop<'a>(graph: &'a ModuleGraph, members: &BTreeSet<String>) -> Vec<&'a Import> {
    let edges = graph.edges();
    let inside = |m: &str| members.contains(m);
    let mut best: Vec<&Import> = Vec::new();
    for start in members {
        // Breadth-first from `start` back to it, inside the cycle only.
        let mut came_by: BTreeMap<&str, &Import> = BTreeMap::new();
        let mut frontier = vec![start.as_str()];
        'search: while !frontier.is_empty() {
            let mut next = Vec::new();
            for at in frontier {
                for (&(from, to), &import) in &edges {
                    if from != at || !inside(to) || came_by.contains_key(to) {
                        continue;
                    }
                    came_by.insert(to, import);
                    if to == start.as_str() {
                        break 'search;
                    }
                    next.push(to);
                }
            }
            frontier = next;
        }
        let mut chain = Vec::new();
        let mut at = start.as_str();
        while let Some(import) = came_by.get(at) {
            chain.push(*import);
            at = import.from.as_str();
            if at == start || chain.len() > members.len() {
                break;
            }
        }
        chain.reverse();
        if !chain.is_empty() && (best.is_empty() || chain.len() < best.len()) {
            best = chain;
        }
    }
    best
}

fn describe_cycle(krate: &str, graph: &ModuleGraph, members: &BTreeSet<String>) -> String {
    let names: Vec<&str> = members.iter().map(String::as_str).collect();
    let mut out = format!(
        "crates/{krate}: {} top-level modules import each other in a circle: {}\n  \
         shortest loop:\n",
        members.len(),
        names.join(", ")
    );
    for import in shortest_loop(graph, members) {
        out += &format!("    {import}\n");
    }
    out += "  every import inside the circle (one file:line per module pair):\n";
    for ((from, to), import) in graph.edges() {
        if members.contains(from) && members.contains(to) {
            out += &format!("    {import}\n");
        }
    }
    out += "  Break one edge: move the item the lower module needs down (or into a new leaf \
            module), or pass it a handle or trait instead of reaching up.\n";
    out
}

/// The crate's failures: cycles not in [`KNOWN_CYCLES`], known cycles that changed, imports
/// against [`LAYERS`].
fn module_failures(krate: &str, graph: &ModuleGraph) -> Vec<String> {
    let mut failures = Vec::new();
    let known: Vec<BTreeSet<String>> = KNOWN_CYCLES
        .iter()
        .filter(|(name, _)| *name == krate)
        .map(|(_, members)| members.iter().map(|m| m.to_string()).collect())
        .collect();
    let found = cycles(graph);
    for cycle in &found {
        if !known.contains(cycle) {
            let mut message = describe_cycle(krate, graph, cycle);
            if let Some(old) = known.iter().find(|old| !old.is_disjoint(cycle)) {
                let gone: Vec<&String> = old.difference(cycle).collect();
                let new: Vec<&String> = cycle.difference(old).collect();
                message += &format!(
                    "  This is the known cycle of KNOWN_CYCLES changed (left it: {gone:?}; \
                     joined it: {new:?}). A cycle may only shrink: if it did, write the \
                     members above into KNOWN_CYCLES.\n"
                );
            }
            failures.push(message);
        }
    }
    for old in &known {
        if !found.contains(old) && found.iter().all(|cycle| cycle.is_disjoint(old)) {
            failures.push(format!(
                "crates/{krate}: the known cycle {old:?} is gone. Delete its KNOWN_CYCLES entry \
                 so it cannot come back."
            ));
        }
    }
    failures.extend(layer_failures(krate, graph));
    failures
}

fn layer_failures(krate: &str, graph: &ModuleGraph) -> Vec<String> {
    let Some((_, layers)) = LAYERS.iter().find(|(name, _)| *name == krate) else {
        return Vec::new();
    };
    let layer_of = |module: &str| layers.iter().position(|layer| layer.contains(&module));
    let mut failures = Vec::new();
    for module in &graph.modules {
        if layer_of(module).is_none() {
            failures.push(format!(
                "crates/{krate}: module `{module}` is in no layer of LAYERS; place it in the \
                 lowest layer above everything it imports."
            ));
        }
    }
    for module in layers.iter().flat_map(|layer| layer.iter()) {
        if !graph.modules.contains(*module) {
            failures.push(format!(
                "crates/{krate}: LAYERS lists `{module}`, which is no top-level module; update \
                 the list."
            ));
        }
    }
    for import in graph.edges().values() {
        if let (Some(from), Some(to)) = (layer_of(&import.from), layer_of(&import.to))
            && to > from
        {
            failures.push(format!(
                "crates/{krate}: upward import {import}\n  `{}` is in layer {from} {:?}, `{}` in \
                 the higher layer {to} {:?} (LAYERS in crates/server/tests/layering.rs). Move \
                 what it needs down, or pass it in.",
                import.from, layers[from], import.to, layers[to]
            ));
        }
    }
    failures
}

#[test]
fn no_crate_has_a_cycle_among_its_top_level_modules() {
    let mut failures = Vec::new();
    let mut crate_dirs: Vec<PathBuf> = std::fs::read_dir(crates_dir())
        .expect("reading crates/")
        .filter_map(|entry| entry.ok().map(|entry| entry.path().join("src")))
        .filter(|src| src.is_dir())
        .collect();
    crate_dirs.sort();
    assert!(crate_dirs.len() >= 6, "found only {crate_dirs:?}");
    for src in crate_dirs {
        let krate = src
            .parent()
            .and_then(Path::file_name)
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        failures.extend(module_failures(&krate, &crate_graph(&src)));
    }
    let named = KNOWN_CYCLES.iter().map(|(k, _)| *k);
    for krate in named.chain(LAYERS.iter().map(|(k, _)| *k)) {
        assert!(
            crates_dir().join(krate).join("src").is_dir(),
            "KNOWN_CYCLES or LAYERS names crates/{krate}, which does not exist"
        );
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

// --- the scanner's own tests ---

fn heads(src: &str, depth: usize) -> Vec<String> {
    crate_paths(src, depth)
        .into_iter()
        .map(|p| p.head)
        .collect()
}

#[test]
fn the_scanner_reads_grouped_and_nested_uses() {
    let src =
        "use crate::{a, b::c};\nuse crate::{d::{E, f::G}, h, self};\nuse crate::i::{self, J};";
    assert_eq!(heads(src, 1), ["a", "b", "d", "h", "i"]);
    let found = crate_paths(src, 1);
    assert_eq!(found[1].text, "crate::b::c");
    assert_eq!(found[2].text, "crate::d::{..}");
    assert_eq!(found[4].line, 3);
}

#[test]
fn the_scanner_reads_paths_in_expressions_and_types() {
    let src = "fn f(x: Vec<crate::a::T>) -> crate::b::U { crate::c::make(x, crate::D) }\n\
               pub(crate) struct S; pub(in crate::e) struct V;";
    assert_eq!(heads(src, 1), ["a", "b", "c", "D", "e"]);
}

#[test]
fn comments_strings_and_chars_holding_crate_paths_do_not_count() {
    let src = r####"
        // crate::a
        /// [`crate::b`]
        //! crate::c
        /* crate::d /* nested crate::e */ still crate::f */
        const S: &str = "crate::g \" crate::h";
        const R: &str = r#"crate::i " crate::j"#;
        const B: &[u8] = br"crate::k";
        const Q: char = '"'; const P: char = '\''; fn l<'a>(x: &'a str) {}
        use crate::real;
    "####;
    assert_eq!(heads(src, 1), ["real"]);
    assert_eq!(crate_paths(src, 1)[0].line, 10);
}

#[test]
fn inline_test_modules_do_not_count_but_code_after_them_does() {
    let src = "#[cfg(test)]\nmod tests {\n    use crate::a;\n    mod deeper { use crate::b; }\n}\n\
               #[cfg(test)]\n#[allow(dead_code)]\npub(crate) mod more { use crate::c; }\n\
               #[cfg(test)]\nuse crate::d;\n#[cfg(feature = \"sim\")]\nuse crate::e;\n\
               #[cfg(test)]\nmod on_disk;\nuse crate::f;";
    assert_eq!(heads(src, 1), ["d", "e", "f"]);
    assert!(is_skipped_file("writer/tests.rs"));
    assert!(is_skipped_file("sim/disk_tests.rs"));
    assert!(is_skipped_file("state/tests/fixture.rs"));
    assert!(!is_skipped_file("writer/testsuite.rs"));
}

#[test]
fn super_counts_only_when_it_climbs_to_the_crate_root() {
    // From a top-level file (`a.rs`) one `super` is the root.
    assert_eq!(heads("use super::b::C;", 1), ["b"]);
    // From `a/x.rs` one `super` is still `a`; two reach the root.
    assert_eq!(
        heads("use super::y; use super::super::{b, c::D};", 2),
        ["b", "c"]
    );
    // An inline module adds a level.
    let src = "mod inner { use super::super::b; use super::sibling; }\nuse super::c;";
    assert_eq!(heads(src, 1), ["b", "c"]);
    assert_eq!(file_module_path("a.rs"), ["a"]);
    assert_eq!(file_module_path("a/mod.rs"), ["a"]);
    assert_eq!(file_module_path("a/x.rs"), ["a", "x"]);
    assert_eq!(file_module_path("a/x/mod.rs"), ["a", "x"]);
}

#[test]
fn the_crate_root_maps_reexported_names_to_their_modules() {
    let lib = "pub mod a;\nmod b;\npub use a::{X, y::{Z as W, self}};\npub(crate) use self::b::V;\n\
               use crate::c::U;\npub use bytes::Bytes;\nfn f() { use d::Inner; }";
    let names = root_reexports(lib);
    let pairs: Vec<(&str, &str)> = names
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        pairs,
        [
            ("Bytes", "bytes"),
            ("U", "c"),
            ("V", "b"),
            ("W", "a"),
            ("X", "a"),
            ("y", "a")
        ]
    );
}

fn graph_of(edges: &[(&str, &str)]) -> ModuleGraph {
    let imports: Vec<Import> = edges
        .iter()
        .enumerate()
        .map(|(line, (from, to))| Import {
            from: from.to_string(),
            to: to.to_string(),
            file: format!("{from}.rs"),
            line: line + 1,
            path: format!("crate::{to}::Item"),
        })
        .collect();
    let modules = edges
        .iter()
        .flat_map(|(from, to)| [from.to_string(), to.to_string()])
        .collect();
    ModuleGraph { modules, imports }
}

#[test]
fn a_cycle_is_reported_with_its_shortest_loop_and_every_edge() {
    let graph = graph_of(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "b"), ("d", "a")]);
    let found = cycles(&graph);
    assert_eq!(found.len(), 1);
    let members: Vec<&str> = found[0].iter().map(String::as_str).collect();
    assert_eq!(members, ["a", "b", "c"]);
    let shortest: Vec<String> = shortest_loop(&graph, &found[0])
        .iter()
        .map(|import| format!("{}->{}", import.from, import.to))
        .collect();
    assert_eq!(shortest, ["b->c", "c->b"]);
    let failures = module_failures("not-a-crate", &graph);
    assert_eq!(failures.len(), 1);
    assert!(
        failures[0].contains("c -> a: src/c.rs:3 `crate::a::Item`"),
        "{}",
        failures[0]
    );
}

#[test]
fn the_known_broker_cycle_must_stay_exactly_as_listed() {
    let ring = |members: &[&'static str]| -> Vec<(&'static str, &'static str)> {
        let next = members.iter().cycle().skip(1);
        members
            .iter()
            .zip(next)
            .map(|(from, to)| (*from, *to))
            .collect()
    };
    let (_, known) = KNOWN_CYCLES[0];
    assert!(module_failures("broker", &graph_of(&ring(known))).is_empty());
    // One module more in the circle fails, and so does one less (then shrink the list).
    let mut grown = ring(known);
    grown.extend([("will", "config"), ("config", "will")]);
    let failures = module_failures("broker", &graph_of(&grown));
    assert!(
        failures[0].contains("joined it: [\"config\"]"),
        "{failures:?}"
    );
    let shrunk = module_failures("broker", &graph_of(&ring(&known[1..])));
    assert!(
        shrunk[0].contains("left it: [\"ack_pipeline\"]"),
        "{shrunk:?}"
    );
    let gone = module_failures("broker", &graph_of(&[("a", "b")]));
    assert!(gone[0].contains("is gone"), "{gone:?}");
}
