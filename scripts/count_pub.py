#!/usr/bin/env python3
"""Counts the `pub` items of a crate's src (issue 22 item 3, ARCHITECTURE §1.1 "Visibility").

A `pub` item is a line holding the keyword `pub` not followed by `(`: item declarations
(`pub fn`, `pub struct`, `pub use`, ...), struct fields and enum-free `pub` in impls alike;
`pub(crate)`, `pub(super)` and `pub(in ..)` are counted apart. Comments, string literals and
test code (`tests.rs`, `*_tests.rs`, files under a `tests/` directory, inline
`#[cfg(test)] mod x { .. }`) do not count. Usage: scripts/count_pub.py [crates/broker/src]
"""
import pathlib, re, sys

PUB = re.compile(r"\bpub\b(?!\s*\()")
RESTRICTED = re.compile(r"\bpub\s*\(")


def is_test_file(rel):
    parts = rel.parts
    return "tests" in parts[:-1] or parts[-1] == "tests.rs" or parts[-1].endswith("_tests.rs")


def strip(src):
    """Source without comments, literals and `#[cfg(test)] mod x { .. }` blocks, line by line."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            while i < n and src[i] != "\n":
                i += 1
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * src.count("\n", i, j))
            i = j
        elif c == '"' :
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append('""' + "\n" * src.count("\n", i, j))
            i = j + 1
        elif src.startswith("#[cfg(test)]", i):
            m = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{").match(src, i)
            if not m:
                out.append(c)
                i += 1
                continue
            depth, j = 1, m.end()
            while j < n and depth:
                depth += {"{": 1, "}": -1}.get(src[j], 0)
                j += 1
            out.append("\n" * src.count("\n", i, j))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def main():
    src = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "crates/broker/src")
    plain = restricted = 0
    for path in sorted(src.rglob("*.rs")):
        if is_test_file(path.relative_to(src)):
            continue
        for line in strip(path.read_text()).splitlines():
            plain += len(PUB.findall(line))
            restricted += len(RESTRICTED.findall(line))
    print(f"pub {plain}  pub(restricted) {restricted}")


main()
