#!/usr/bin/env python3
"""Minimal MQTT peer used once to capture what real clients put on the wire.

Usage: python3 capture.py PORT LOGFILE   (then point mosquitto_pub/mosquitto_sub at 127.0.0.1:PORT)

It answers just enough (CONNACK, PUBACK/PUBREC/PUBCOMP, SUBACK, UNSUBACK, PINGRESP) for the
client to go on, and appends one line per client packet to LOGFILE: "<connection> <hex>".
The captures in tests/captured.rs were made with it.
"""
import socket
import sys
import threading


def read_packet(sock, pending):
    def need(n):
        while len(pending) < n:
            chunk = sock.recv(65536)
            if not chunk:
                raise EOFError
            pending.extend(chunk)

    need(2)
    length, multiplier, index = 0, 1, 1
    while True:
        need(index + 1)
        byte = pending[index]
        length += (byte & 0x7F) * multiplier
        multiplier *= 128
        index += 1
        if byte & 0x80 == 0:
            break
    need(index + length)
    packet = bytes(pending[: index + length])
    del pending[: index + length]
    return packet, index


def serve(conn, number, log):
    pending = bytearray()
    v5 = False
    try:
        while True:
            packet, header_len = read_packet(conn, pending)
            with open(log, "a") as out:
                out.write(f"{number} {packet.hex()}\n")
            kind = packet[0] >> 4
            body = packet[header_len:]
            if kind == 1:
                name_len = int.from_bytes(body[0:2], "big")
                v5 = body[2 + name_len] == 5
                conn.sendall(bytes([0x20, 3, 0, 0, 0]) if v5 else bytes([0x20, 2, 0, 0]))
            elif kind == 3:
                qos = (packet[0] >> 1) & 3
                topic_len = int.from_bytes(body[0:2], "big")
                pid = body[2 + topic_len : 4 + topic_len]
                if qos == 1:
                    conn.sendall(bytes([0x40, 2]) + pid)
                elif qos == 2:
                    conn.sendall(bytes([0x50, 2]) + pid)
            elif kind == 6:
                conn.sendall(bytes([0x70, 2]) + body[0:2])
            elif kind in (8, 10):
                pid = body[0:2]
                rest = body[2:]
                if v5:
                    rest = rest[1 + rest[0] :]  # short property block only
                count = 0
                while rest:
                    flen = int.from_bytes(rest[0:2], "big")
                    rest = rest[2 + flen + (1 if kind == 8 else 0) :]
                    count += 1
                if kind == 8:
                    payload = (b"\x00" if v5 else b"") + bytes([1] * count)
                    conn.sendall(bytes([0x90, 2 + len(payload)]) + pid + payload)
                elif v5:
                    payload = b"\x00" + bytes(count)
                    conn.sendall(bytes([0xB0, 2 + len(payload)]) + pid + payload)
                else:
                    conn.sendall(bytes([0xB0, 2]) + pid)
            elif kind == 12:
                conn.sendall(bytes([0xD0, 0]))
            elif kind == 14:
                break
    except (EOFError, ConnectionError):
        pass
    finally:
        conn.close()


def main():
    port, log = int(sys.argv[1]), sys.argv[2]
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen()
    number = 0
    while True:
        conn, _ = server.accept()
        number += 1
        threading.Thread(target=serve, args=(conn, number, log), daemon=True).start()


if __name__ == "__main__":
    main()
