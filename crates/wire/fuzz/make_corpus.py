#!/usr/bin/env python3
"""Regenerates corpus/decode/ from the byte-exact captures and the malformed-input table.

Usage: python3 make_corpus.py   (from crates/wire/fuzz). Files are named by content hash, as
libFuzzer names its own finds, so re-running is idempotent and fuzzer finds can sit beside them.
"""
import hashlib
import pathlib
import re

HERE = pathlib.Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
OUT = HERE / "corpus" / "decode"


def varint(n):
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def packet(first, body_hex):
    body = bytes.fromhex(body_hex.replace(" ", ""))
    return bytes([first]) + varint(len(body)) + body


def connect(level, flags, rest):
    return packet(0x10, f"00044d515454{level:02x}{flags:02x}003c{rest}")


def strings_in(text):
    # Adjacent string literals joined by a trailing backslash form one hex string.
    text = re.sub(r'\\\n\s*', "", text)
    return text


def main():
    seeds = []
    captured = strings_in((TESTS / "captured.rs").read_text())
    for match in re.finditer(r'"([0-9a-f]{4,})"', captured):
        seeds.append(bytes.fromhex(match.group(1)))
    malformed = strings_in((TESTS / "malformed.rs").read_text())
    for match in re.finditer(r'hex\("([0-9a-f ]+)"\)', malformed):
        seeds.append(bytes.fromhex(match.group(1).replace(" ", "")))
    for match in re.finditer(r'packet\(0x([0-9A-Fa-f]{2}), "([0-9a-f ]*)"\)', malformed):
        seeds.append(packet(int(match.group(1), 16), match.group(2)))
    for match in re.finditer(r'connect\((\d), 0x([0-9A-Fa-f]{2}), "([0-9a-f ]*)"\)', malformed):
        seeds.append(connect(int(match.group(1)), int(match.group(2), 16), match.group(3).replace(" ", "")))
    # A few streams: several packets in one buffer, and one cut in the middle.
    seeds.append(bytes.fromhex("c000d000e000"))
    seeds.append(bytes.fromhex("3314000c73656e736f72732f74656d70000132312e35" * 3))
    seeds.append(bytes.fromhex("101400044d5154540502003c03210014000470756235332e000c73656e73"))
    OUT.mkdir(parents=True, exist_ok=True)
    written = 0
    for seed in seeds:
        name = hashlib.sha1(seed).hexdigest()
        path = OUT / name
        if not path.exists():
            path.write_bytes(seed)
            written += 1
    print(f"{len(seeds)} seeds, {written} new files, {len(list(OUT.iterdir()))} in corpus")


if __name__ == "__main__":
    main()
