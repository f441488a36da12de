#!/usr/bin/env python3
"""A stand-in for `tern serve` that runs mosquitto instead, to check the end-to-end suite itself
against a reference broker: `TERN_E2E_BIN=$PWD/scripts/interop/mosquitto_shim.py cargo test -p tern` (absolute path).

Accepts `serve --bind HOST:PORT --config FILE --data-dir DIR`, maps the config keys mosquitto
has an equivalent for, starts mosquitto on a free port, prints `tern listening on HOST:PORT`
and forwards SIGTERM/SIGINT. mosquitto dies with this process (PR_SET_PDEATHSIG), so a
SIGKILL of the shim leaks nothing. Keys without a mosquitto equivalent are ignored, so tests of
those limits are expected to fail under the shim.
"""

import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib

MAP = {
    ("limits", "max_packet_size_bytes"): "max_packet_size",
    ("limits", "max_keep_alive_s"): "max_keepalive",
    ("limits", "topic_alias_maximum"): "max_topic_alias",
    ("limits", "max_queued_messages"): "max_queued_messages",
    ("limits", "max_inflight_messages"): "max_inflight_messages",
    ("sys", "interval_s"): "sys_interval",
}


def main():
    args = sys.argv[1:]
    if not args or args[0] != "serve":
        print("shim: only `serve` is supported", file=sys.stderr)
        sys.exit(2)
    opts = dict(zip(args[1::2], args[2::2]))
    host = opts.get("--bind", "127.0.0.1:0").rsplit(":", 1)[0]
    cfg = {}
    if "--config" in opts:
        with open(opts["--config"], "rb") as f:
            cfg = tomllib.load(f)
    with socket.socket() as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    # `user root`: mosquitto would otherwise drop privileges, which clears PR_SET_PDEATHSIG.
    lines = [f"listener {port} {host}", "allow_anonymous true", "persistence false", "log_dest stderr", "user root"]
    for (section, key), mkey in MAP.items():
        if key in cfg.get(section, {}):
            lines.append(f"{mkey} {cfg[section][key]}")
    conf = tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False)
    conf.write("\n".join(lines) + "\n")
    conf.close()
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    child = subprocess.Popen(
        ["mosquitto", "-c", conf.name],
        preexec_fn=lambda: libc.prctl(1, signal.SIGKILL),  # PR_SET_PDEATHSIG
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda n, _f: child.send_signal(n))
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection((host, port), timeout=0.2).close()
            break
        except OSError:
            if time.monotonic() > deadline or child.poll() is not None:
                print("shim: mosquitto did not start", file=sys.stderr)
                sys.exit(1)
            time.sleep(0.05)
    print(f"tern listening on {host}:{port}", flush=True)
    code = child.wait()
    os.unlink(conf.name)
    sys.exit(0 if code in (0, -signal.SIGTERM, -signal.SIGINT) else code)


if __name__ == "__main__":
    main()
