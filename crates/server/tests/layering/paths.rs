//! The paths of the layering test: which `crate::` (or crate-root `super::`) paths a file
//! holds, and which names the crate root brings in with `use`.

use std::collections::BTreeMap;

use crate::lex::{Tok, is_ident, is_punct, is_sep, non_test_tokens, past_group};

/// A path into another top-level module, as found: its first segment below the crate root.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct FoundPath {
    pub(crate) head: String,
    pub(crate) line: usize,
    pub(crate) text: String,
}

/// Every path from the crate root in a file whose module path has `depth` segments:
/// `crate::a::..`, each item of `crate::{a, b::{c, d}}`, and `super::` chains that climb to
/// the root (from `a.rs`, `super::b`; from `a/x.rs` or an inline `mod` in `a.rs`,
/// `super::super::b`).
pub(crate) fn crate_paths(src: &str, depth: usize) -> Vec<FoundPath> {
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

/// The path as written from `at` on, on one line: `a::b::C`, `a::{B, c::D as E}`.
fn path_text(toks: &[(Tok, usize)], at: usize) -> String {
    let mut text = String::new();
    let mut depth = 0usize;
    for (tok, _) in &toks[at..] {
        let after_ident = text.ends_with(|c: char| c.is_alphanumeric() || c == '_');
        match tok {
            Tok::Ident(name) if after_ident && depth == 0 => break,
            Tok::Ident(name) => {
                if after_ident {
                    text.push(' ');
                }
                text.push_str(name);
            }
            Tok::PathSep => text.push_str("::"),
            Tok::Punct('{') => {
                depth += 1;
                text.push('{');
            }
            Tok::Punct('}') if depth > 0 => {
                depth -= 1;
                text.push('}');
                if depth == 0 {
                    break;
                }
            }
            Tok::Punct(',') if depth > 0 => text.push_str(", "),
            Tok::Punct('*') => text.push('*'),
            _ => break,
        }
    }
    text
}

/// Names the crate root brings in with `use` (public or not: `crate::Name` reaches both),
/// mapped to the top-level module they come from: `pub use a::{B, c::D as E}` gives B and E
/// from `a`. Names from other crates map to a module that does not exist and are dropped.
pub(crate) fn root_reexports(root_src: &str) -> BTreeMap<String, String> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{file_module_path, is_skipped_file};

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
        assert_eq!(found[2].text, "crate::d::{E, f::G}");
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
        let src = "#[cfg(test)]\nmod tests {\n    use crate::a;\n\
                   mod deeper { use crate::b; }\n}\n\
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
        let lib = "pub mod a;\nmod b;\npub use a::{X, y::{Z as W, self}};\n\
                   pub(crate) use self::b::V;\n\
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
}
