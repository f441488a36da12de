//! ARCHITECTURE §1: dependencies point one way. The codec, the topic trie and the store are leaves
//! that know nothing of each other; the bench tool stands on the codec alone. This test reads each
//! crate's manifest and fails when a crate grows a dependency on a crate of ours it must not see.

use std::path::PathBuf;

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
