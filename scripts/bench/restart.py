#!/usr/bin/env python3
"""Restart measurement (BENCHMARKS.md, "Reclamation and restart").

usage: restart.py TERN DATA_DIR PORT [--kill PID] [--config FILE]
With --kill PID: reads that broker's VmRSS, kills it with SIGKILL and waits for it to go.
Then starts `TERN serve --bind 127.0.0.1:PORT --data-dir DATA_DIR`, times it from spawn to
its `tern listening on` line, and reads its VmRSS then and 2 s later. Prints one line; leaves
the new broker running and prints its pid (stop it with kill PID).
"""
import fcntl
import os
import signal
import subprocess
import sys
import time


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    tern, data_dir, port = sys.argv[1], sys.argv[2], sys.argv[3]
    before = None
    opts = dict(zip(sys.argv[4::2], sys.argv[5::2]))
    config = ["--config", opts["--config"]] if "--config" in opts else []
    if "--kill" in opts:
        old = int(opts["--kill"])
        before = rss_mib(old)
        os.kill(old, signal.SIGKILL)
        for _ in range(500):
            try:
                os.kill(old, 0)
                with open(f"/proc/{old}/stat") as f:
                    if f.read().split()[2] == "Z":
                        break
            except (ProcessLookupError, FileNotFoundError):
                break
            time.sleep(0.01)
        # The store's lock is released once the process is fully gone.
        with open(os.path.join(data_dir, "LOCK"), "a") as lock:
            for _ in range(1000):
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(lock, fcntl.LOCK_UN)
                    break
                except BlockingIOError:
                    time.sleep(0.01)
    t0 = time.monotonic()
    p = subprocess.Popen(
        [tern, "serve", "--bind", f"127.0.0.1:{port}", "--data-dir", data_dir, *config],
        stdout=subprocess.PIPE,
        stderr=open(os.path.join(os.path.dirname(os.path.abspath(data_dir)), "restart.log"), "a"),
        text=True,
    )
    for line in p.stdout:
        if line.startswith("tern listening on"):
            break
    listen_s = time.monotonic() - t0
    at_listen = rss_mib(p.pid)
    cpu = cpu_s(p.pid)
    load = os.getloadavg()[0]
    time.sleep(2)
    later = rss_mib(p.pid)
    before_txt = f"RSS before kill {before:.0f} MiB; " if before is not None else ""
    print(
        f"{before_txt}listening after {listen_s * 1000:.0f} ms "
        f"({cpu * 1000:.0f} ms CPU, load average {load:.1f}); "
        f"RSS at listen {at_listen:.0f} MiB, 2 s later {later:.0f} MiB; pid {p.pid}"
    )


main()
