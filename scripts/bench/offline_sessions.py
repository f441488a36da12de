#!/usr/bin/env python3
"""Load for the restart measurement of many offline persistent sessions (BENCHMARKS.md,
"Reclamation and restart"): SESSIONS MQTT 3.1.1 persistent sessions (clean session 0), each
subscribed to `q/#` at QoS 1, disconnect; then one publisher sends MESSAGES QoS 1 messages of
64 bytes to `q/x`, so every offline session holds MESSAGES queued messages.

usage: offline_sessions.py PORT [SESSIONS] [MESSAGES] [CONCURRENCY]
Connections use source addresses 127.0.0.2..127.0.0.201 so client ports do not run out.
"""
import asyncio
import struct
import sys


def enc_str(s: bytes) -> bytes:
    return struct.pack(">H", len(s)) + s


def enc_len(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n % 128
        n //= 128
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def packet(kind: int, body: bytes) -> bytes:
    return bytes([kind]) + enc_len(len(body)) + body


def connect(client_id: bytes, clean: bool) -> bytes:
    flags = 0x02 if clean else 0x00
    return packet(0x10, enc_str(b"MQTT") + bytes([4, flags]) + struct.pack(">H", 0) + enc_str(client_id))


async def read_packet(reader):
    head = await reader.readexactly(1)
    mult, n = 1, 0
    while True:
        b = (await reader.readexactly(1))[0]
        n += (b & 0x7F) * mult
        mult *= 128
        if not b & 0x80:
            break
    body = await reader.readexactly(n) if n else b""
    return head[0], body


async def session(port: int, i: int, sem: asyncio.Semaphore):
    async with sem:
        src = f"127.0.0.{2 + i % 200}"
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(src, 0))
        writer.write(connect(f"off-{i}".encode(), clean=False))
        kind, body = await read_packet(reader)
        assert kind == 0x20 and body[1] == 0, (kind, body)
        writer.write(packet(0x82, struct.pack(">H", 1) + enc_str(b"q/#") + bytes([1])))
        kind, body = await read_packet(reader)
        assert kind == 0x90 and body[2] == 1, (kind, body)
        writer.write(bytes([0xE0, 0]))
        await writer.drain()
        # Wait for the broker to close first (its side takes TIME_WAIT).
        try:
            await asyncio.wait_for(reader.read(), 10)
        except asyncio.TimeoutError:
            pass
        writer.close()


async def publisher(port: int, messages: int):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(connect(b"off-publisher", clean=True))
    await read_packet(reader)
    for m in range(messages):
        payload = f"{m:064d}".encode()
        writer.write(packet(0x32, enc_str(b"q/x") + struct.pack(">H", m + 1) + payload))
    for _ in range(messages):
        kind, _ = await read_packet(reader)
        assert kind == 0x40, kind
    writer.write(bytes([0xE0, 0]))
    await writer.drain()
    writer.close()


async def main():
    port = int(sys.argv[1])
    sessions = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
    messages = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    concurrency = int(sys.argv[4]) if len(sys.argv) > 4 else 256
    sem = asyncio.Semaphore(concurrency)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    tasks = [asyncio.create_task(session(port, i, sem)) for i in range(sessions)]
    for k, t in enumerate(asyncio.as_completed(tasks)):
        await t
        if (k + 1) % 10_000 == 0:
            print(f"{k + 1} sessions ({loop.time() - t0:.1f} s)", file=sys.stderr)
    await publisher(port, messages)
    print(f"{sessions} offline sessions with {messages} queued each ({loop.time() - t0:.1f} s)")


asyncio.run(main())
