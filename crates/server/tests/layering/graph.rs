//! The module graph of the layering test: a crate's top-level modules, the imports between
//! them, and the cycles they form.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::paths::{crate_paths, root_reexports};

/// One `crate::` (or crate-root `super::`) path in a module: `from` imports `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Import {
    pub(crate) from: String,
    pub(crate) to: String,
    /// Relative to the crate's `src/`.
    pub(crate) file: String,
    pub(crate) line: usize,
    /// The path as written (`crate::format::Entry`, each item of a group on its own).
    pub(crate) path: String,
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
pub(crate) struct ModuleGraph {
    pub(crate) modules: BTreeSet<String>,
    pub(crate) imports: Vec<Import>,
}

impl ModuleGraph {
    /// One import per (from, to) pair, the first met in file order.
    pub(crate) fn edges(&self) -> BTreeMap<(&str, &str), &Import> {
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
pub(crate) fn is_skipped_file(rel: &str) -> bool {
    let file = rel.rsplit('/').next().unwrap_or(rel);
    file == "tests.rs"
        || file.ends_with("_tests.rs")
        || rel.split('/').any(|part| part == "tests")
        || rel.starts_with("bin/")
}

/// The module path a file defines: `a.rs` and `a/mod.rs` are `[a]`, `a/b.rs` is `[a, b]`.
pub(crate) fn file_module_path(rel: &str) -> Vec<String> {
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
pub(crate) fn crate_graph(src: &Path) -> ModuleGraph {
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

/// Strongly connected components with more than one module (Tarjan), members sorted.
pub(crate) fn cycles(graph: &ModuleGraph) -> Vec<BTreeSet<String>> {
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
pub(crate) fn shortest_loop<'a>(
    graph: &'a ModuleGraph,
    members: &BTreeSet<String>,
) -> Vec<&'a Import> {
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
