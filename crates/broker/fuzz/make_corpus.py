#!/usr/bin/env python3
"""Regenerates corpus/connection/: valid packet sequences of whole sessions (3.1, 3.1.1, 5.0;
QoS 0/1/2 flows, wills, logins, aliases, shared and denied topics, malformed tails) and
deterministic mutations of each (bit flips, truncation, a corrupted length, spliced copies).

Usage: python3 make_corpus.py   (from crates/broker/fuzz). Files are named by content hash, as
libFuzzer names its own finds, so re-running is idempotent and fuzzer finds can sit beside them.
"""
import hashlib
import pathlib
import random

OUT = pathlib.Path(__file__).resolve().parent / "corpus" / "connection"


def varint(n):
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def s(text):
    data = text.encode() if isinstance(text, str) else text
    return len(data).to_bytes(2, "big") + data


def packet(first, body):
    return bytes([first]) + varint(len(body)) + body


def props(*items):
    body = b"".join(items)
    return varint(len(body)) + body


def connect(level, client_id, flags=0x02, keep_alive=60, properties=b"", tail=b"", name="MQTT"):
    body = s(name) + bytes([level, flags]) + keep_alive.to_bytes(2, "big")
    if level == 5:
        body += properties or props()
    return packet(0x10, body + s(client_id) + tail)


def publish(topic, payload, qos=0, pid=1, retain=False, v5=False, properties=b"", dup=False):
    first = 0x30 | (qos << 1) | (1 if retain else 0) | (0x08 if dup else 0)
    body = s(topic) + (pid.to_bytes(2, "big") if qos else b"")
    if v5:
        body += properties or props()
    return packet(first, body + payload)


def subscribe(pid, filters, v5=False, properties=b""):
    body = pid.to_bytes(2, "big") + ((properties or props()) if v5 else b"")
    for f, opts in filters:
        body += s(f) + bytes([opts])
    return packet(0x82, body)


def unsubscribe(pid, filters, v5=False):
    body = pid.to_bytes(2, "big") + (props() if v5 else b"")
    return packet(0xA2, body + b"".join(s(f) for f in filters))


def ack(kind, pid):
    return packet(kind, pid.to_bytes(2, "big"))


PINGREQ = packet(0xC0, b"")
DISCONNECT = packet(0xE0, b"")


def sessions():
    v4 = [
        connect(4, "c4") + subscribe(1, [("a/#", 1)]) + publish("a/x", b"hello", 1, 2)
        + ack(0x40, 1) + PINGREQ + unsubscribe(3, ["a/#"]) + DISCONNECT,
        connect(4, "q2") + publish("a/q2", b"two", 2, 7) + publish("a/q2", b"two", 2, 7, dup=True)
        + ack(0x62, 7) + ack(0x62, 99) + DISCONNECT,
        connect(4, "will", flags=0x2E, tail=s("a/will") + s("gone")) + publish("a/r", b"keep", 1, 1, retain=True)
        + publish("a/r", b"", 0, retain=True),
        connect(4, "login", flags=0xC2, tail=s("user") + s("pass")) + publish("b/denied", b"x", 1, 1)
        + subscribe(2, [("$SYS/#", 0), ("b/#", 1), ("c/login/#", 2)]) + publish("c/login/t", b"mine", 2, 3),
        connect(4, "persist", flags=0x00) + subscribe(1, [("a/#", 2)]) + publish("a/p", b"q" * 300, 2, 1)
        + publish("$SYS/x", b"no", 0) + publish("$tern/rx/x", b"no", 1, 4),
        connect(3, "old31", name="MQIsdp") + subscribe(1, [("a/+", 0)]) + publish("a/31", b"v31", 1, 1),
        connect(4, "share") + subscribe(1, [("$share/g/a/#", 1), ("", 0), ("a/\x01", 0)]),
    ]
    alias = props(b"\x23\x00\x05")
    v5 = [
        connect(5, "c5", properties=props(b"\x11\x00\x00\x00\x3c", b"\x21\x00\x10", b"\x22\x00\x08"))
        + subscribe(1, [("a/#", 0x15)], v5=True, properties=props(b"\x0b\x07"))
        + publish("a/al", b"first", 1, 2, v5=True, properties=alias)
        + publish("", b"again", 1, 3, v5=True, properties=alias)
        + publish("a/rt", b"req", 0, v5=True, properties=props(b"\x08" + s("a/reply"), b"\x09" + s(b"\x01\x02")))
        + packet(0xE0, b"\x00\x00"),
        connect(5, "w5", flags=0x0E, properties=props(),
                tail=props(b"\x18\x00\x00\x00\x02", b"\x01\x01") + s("a/w5") + s("bye"))
        + publish("a/q2", b"x", 2, 9, v5=True) + packet(0x62, b"\x00\x09\x00\x00")
        + packet(0xE0, b"\x04\x00"),
        connect(5, "bad5") + publish("a/x", b"x", 1, 1, v5=True, properties=props(b"\x0b\x01"))
        + publish("a/x", b"\xff\xfe", 1, 2, v5=True, properties=props(b"\x01\x01")),
        connect(5, "flood", properties=props(b"\x21\x00\x02"))
        + b"".join(publish("a/f", bytes([i]) * 20, 1, i + 1, v5=True) for i in range(40)),
        connect(5, "auth5", properties=props(b"\x15" + s("SCRAM"))) + PINGREQ,
        connect(5, "resp") + publish("a/x", b"x", 0, v5=True, properties=props(b"\x08" + s("a/#"))),
    ]
    return v4 + v5


def mutations(seed, data):
    rng = random.Random(seed)
    out = []
    flipped = bytearray(data)
    for _ in range(3):
        i = rng.randrange(len(flipped))
        flipped[i] ^= 1 << rng.randrange(8)
    out.append(bytes(flipped))
    out.append(data[: rng.randrange(1, len(data))])
    lengthy = bytearray(data)
    # The first packet's remaining length (byte 1), made wrong.
    lengthy[1] = rng.choice([0x00, 0x7F, 0xFF, lengthy[1] + 1 & 0xFF])
    out.append(bytes(lengthy))
    cut = rng.randrange(len(data))
    out.append(data[:cut] + data[rng.randrange(len(data)):] + data[cut:])
    return out


def main():
    seeds = []
    for i, session in enumerate(sessions()):
        seeds.append(session)
        seeds.extend(mutations(i, session))
    seeds.append(b"")
    seeds.append(bytes(range(256)))
    seeds.append(b"\x10\xff\xff\xff\xff\x7f")
    OUT.mkdir(parents=True, exist_ok=True)
    written = 0
    for seed in seeds:
        path = OUT / hashlib.sha1(seed).hexdigest()
        if not path.exists():
            path.write_bytes(seed)
            written += 1
    print(f"{len(seeds)} seeds, {written} new files in {OUT}")


if __name__ == "__main__":
    main()
