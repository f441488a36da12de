//! ARCHITECTURE §1: dependencies point one way, between crates and between the top-level
//! modules inside each crate.
//!
//! **Crates.** The codec and the topic rules are leaves that know nothing of each other; the
//! store stands on the topic rules alone (their one matcher serves its reads by filter), and the
//! bench tool on the codec alone. The first test reads each crate's manifest
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
//! cargo feature included (tern-store's `sim`, which its own tests turn on). The test reads more
//! exactly than the hook's regular expressions (string literals holding `crate::`, nested `use`
//! groups, `super::` paths, private `use` in lib.rs), yet both find the same edges on the tree
//! as it stands (checked when this was written); the hook prints only the biggest cycle of a
//! crate, the test every one. The reading is in `layering/`: `lex` (tokens without comments,
//! literals and test modules), `paths` (the paths in a file, the root's re-exports) and `graph`
//! (the module graph and its cycles).
//!
//! **Written layers.** The crates also carry their order, lowest layer first, in `LAYERS`,
//! and a module may import only its own layer and those below. A cycle alone says that one of
//! its imports is wrong, not which: with the order written down, the failure points at the one
//! upward import to remove, and the list doubles as the crate's map for a newcomer (each
//! `lib.rs` module map follows it). The price is that a new module must be placed in the list,
//! which is the decision we want made on purpose. No crate has an exception: the broker's
//! 15-module cycle was untangled into the layers of ARCHITECTURE §1.1 (issue 22).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

// The crate root of a test is read like a `mod.rs`: its modules' directory is named here.
#[path = "layering/graph.rs"]
mod graph;
#[path = "layering/lex.rs"]
mod lex;
#[path = "layering/paths.rs"]
mod paths;

use graph::{Import, ModuleGraph, crate_graph, cycles, shortest_loop};

/// (crate directory, the crates of ours it may depend on)
const ALLOWED: &[(&str, &[&str])] = &[
    ("wire", &[]),
    ("topic", &[]),
    ("store", &["tern-topic"]),
    ("bench", &["tern-wire"]),
    ("broker", &["tern-wire", "tern-topic", "tern-store"]),
    // Consensus sits on the store and below the broker (issue 23).
    ("raft", &["tern-store"]),
    // The cluster replicates the broker's store through consensus and runs the broker; its
    // simulator's MQTT clients (a dev-dependency) speak tern-wire, below the broker.
    (
        "cluster",
        &["tern-store", "tern-raft", "tern-broker", "tern-wire"],
    ),
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

// --- Module level: the top-level modules inside each crate (read by `graph`, `paths`, `lex`) ---

/// The written layers of each crate, lowest first. A module may import modules of its own
/// layer and of the layers below it, never of a layer above; every top-level module of the
/// crate must be listed (a new module is placed on purpose, not by accident).
const LAYERS: &[(&str, &[&[&str]])] = &[
    (
        // ARCHITECTURE §1.1: leaves, model, durable, state, engine, driver, assembly.
        "broker",
        &[
            &[
                "auth",
                "config",
                "connect_rate",
                "hash",
                "inject",
                "read_order",
                "transport",
            ],
            &["metrics"],
            &["model"],
            &["durable"],
            &["state"],
            &["engine"],
            &["connection"],
            &["broker", "exposition"],
            &["admin", "fuzz"],
        ],
    ),
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
            &["error", "filter", "histogram", "vfs", "wakers"],
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
    (
        "raft",
        &[
            &[
                "error",
                "types",
                "inject",
                "tls",
                "sim_seeds",
                "applied_point",
            ],
            &["log_store", "state_machine", "network", "sim_net"],
            &["incarnation"],
            &["node"],
            &["consensus"],
        ],
    ),
    (
        "cluster",
        &[
            &["error", "ops", "inject", "limits"],
            &["disk", "replica", "forward"],
            &["node"],
        ],
    ),
];

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

/// The crate's failures: any import cycle among its top-level modules, and imports against
/// [`LAYERS`].
fn module_failures(krate: &str, graph: &ModuleGraph) -> Vec<String> {
    let mut failures: Vec<String> = cycles(graph)
        .iter()
        .map(|cycle| describe_cycle(krate, graph, cycle))
        .collect();
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
    for (krate, _) in LAYERS {
        assert!(
            crates_dir().join(krate).join("src").is_dir(),
            "LAYERS names crates/{krate}, which does not exist"
        );
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

// --- the checks' own tests ---

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
