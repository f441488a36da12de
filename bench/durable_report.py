#!/usr/bin/env python3
"""Median delivered msg/s per (broker, cell) of a bench/durable.sh results file, as markdown."""
import json
import statistics
import sys

BROKERS = ["tern-always", "tern-never", "mosquitto", "nats", "rumqttd"]
CELLS = {
    "q1w1": "QoS 1, 1 conn, window 1",
    "q1w16": "QoS 1, 1 conn, window 16",
    "q1w256": "QoS 1, 1 conn, window 256",
    "q1c16": "QoS 1, 16 conns, window 256",
    "q2w1": "QoS 2, 1 conn, window 1",
    "q2w16": "QoS 2, 1 conn, window 16",
    "q2w256": "QoS 2, 1 conn, window 256",
    "q2c16": "QoS 2, 16 conns, window 256",
}


def main(path):
    runs, machine, fsyncs = {}, {}, []
    for line in open(path):
        item = json.loads(line)
        if item["type"] == "run":
            runs.setdefault((item["broker"], item["cell"]), []).append(item)
        elif item["type"] == "fsync":
            fsyncs.append(item)
        else:
            machine.update(item)
    present = [b for b in BROKERS if any(k[0] == b for k in runs)]
    print(f"machine: {machine.get('cpus')} CPUs, kernel {machine.get('kernel')}, "
          f"load {machine.get('loadavg_start')} -> {machine.get('loadavg_end')}, "
          f"median of {machine.get('repeats')}")
    probes = ", ".join(f"{p['p50_ms']:.2f}/{p['p90_ms']:.2f}" for p in fsyncs)
    print(f"fdatasync after a 128-byte append, p50/p90 ms, per repetition and at the end: {probes}\n")
    print("| delivered msg/s | " + " | ".join(present) + " | tern-always / mosquitto |")
    print("|---" * (len(present) + 2) + "|")
    for cell, label in CELLS.items():
        values = {}
        cells = []
        for b in present:
            rs = runs.get((b, cell))
            if not rs:
                cells.append("n/a")
                continue
            # Delivered rate; for the 16-connection cells (one subscriber behind 16 publishers,
            # where brokers shed load differently) the acknowledged publish rate.
            key = "published_per_s" if cell.endswith("c16") else "delivered_per_s"
            ok = [r["report"][key] for r in rs if r["report"] and (r["exit"] == 0 or cell.endswith("c16"))]
            bad = sum(1 for r in rs if r["exit"] != 0)
            v = statistics.median(ok) if ok else None
            values[b] = v
            text = "—" if v is None else f"{v:,.0f}"
            if bad:
                text += f" ({bad} lost msgs)" if cell.endswith("c16") else f" ({bad} failed)"
            cells.append(text)
        ratio = ""
        if values.get("tern-always") and values.get("mosquitto"):
            ratio = f"{values['tern-always'] / values['mosquitto']:.2f}×"
        print(f"| {label} | " + " | ".join(cells) + f" | {ratio} |")


if __name__ == "__main__":
    main(sys.argv[1])
