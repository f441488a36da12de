#!/usr/bin/env python3
"""Sends client packets (captured from mosquitto_pub/sub) to a real mosquitto broker and logs
what the broker sends back, one packet per line as hex. Usage: broker_replies.py PORT."""
import socket
import sys
import time

SCRIPTS = {
    "v311": [
        "101200044d5154540402003c0006737562333131",  # CONNECT sub311
        "820e00010003612f2b020003622f2302",  # SUBSCRIBE a/+ q2, b/# q2
        "3314000c73656e736f72732f74656d70000132312e35",  # irrelevant publish (no subscriber)
        "340a0003612f62000274776f",  # PUBLISH a/b q2 id 2
        "62020002",  # PUBREL 2
        "a20700030003612f2b",  # UNSUBSCRIBE a/+
        "c000",  # PINGREQ
        "e000",
    ],
    "v5": [
        "101b00044d5154540500003c0811ffffffff2100140006756e73756235",  # CONNECT unsub5, session expiry ffffffff
        "82180001090b072600016b0001760003612f2b010003632f2301",  # SUBSCRIBE sub id 7
        "340b0003612f6200020074776f",  # PUBLISH a/b q2 id 2
        "62020002",  # PUBREL 2
        "a2080003000003612f2b",  # UNSUBSCRIBE a/+
        "c000",
        "e000",
    ],
}


def main():
    port = int(sys.argv[1])
    for name, script in SCRIPTS.items():
        sock = socket.create_connection(("127.0.0.1", port))
        sock.settimeout(0.3)
        for packet in script:
            sock.sendall(bytes.fromhex(packet))
            time.sleep(0.15)
            try:
                data = sock.recv(65536)
            except socket.timeout:
                data = b""
            print(name, packet, "->", data.hex())
        sock.close()


if __name__ == "__main__":
    main()
