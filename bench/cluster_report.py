#!/usr/bin/env python3
"""Turns a bench/cluster.sh results file into the "Cluster" table of BENCHMARKS.md.

Usage: cluster_report.py RESULTS.jsonl [--benchmarks BENCHMARKS.md]

Only the text between `<!-- cluster:begin -->` and `<!-- cluster:end -->` is replaced (the
markers are appended under a "## Cluster" heading when missing). Every figure is the median over
the repetitions of a cell; in parentheses, as in bench/compare.sh's table, a system's figure
divided by the three-node Tern's of the same run. Without arguments but the file, the table is
printed instead.
"""

import argparse
import json
import statistics
from pathlib import Path

BEGIN = "<!-- cluster:begin -->"
END = "<!-- cluster:end -->"
ORDER = ["tern3", "tern1", "nats3", "nats1"]
DISPLAY = {"tern3": "Tern, 3 nodes", "tern1": "Tern, 1 node",
           "nats3": "nats-server, 3 nodes (R3)", "nats1": "nats-server, 1 node"}
BASE = "tern3"


def load(path):
    systems, machine, runs = {}, {}, {}
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        if item["type"] == "broker":
            systems[item["broker"]] = item
        elif item["type"] in ("machine", "machine_end"):
            machine.update(item)
        elif item["type"] == "run":
            runs.setdefault((item["broker"], item["cell"]), []).append(item)
    return systems, machine, runs


def value_of(run, getter):
    try:
        value = getter(run["report"]) if run.get("report") else None
    except (KeyError, TypeError):
        value = None
    return None if value is None else float(value)


def median(runs, getter, best=max):
    """The median over repetitions; of several placements in one repetition (nats3's q1w256)
    the best one."""
    per_rep = {}
    for run in runs or []:
        value = value_of(run, getter)
        if value is not None:
            per_rep.setdefault(run.get("rep"), []).append(value)
    values = [best(v) for v in per_rep.values()]
    return statistics.median(values) if values else None


def placements(runs, getter):
    return ", ".join(f"{r['placement'].replace(' ', '→')}: "
                     + ("—" if value_of(r, getter) is None else f"{value_of(r, getter):,.0f}")
                     for r in runs or [])


def mark(runs):
    """Runs that did not pass: a failover run's losses, else the exit status."""
    notes = []
    for r in runs or []:
        report = r.get("report") or {}
        found = [f"{k} {report[k]}" for k in ("lost", "duplicates", "reordered") if report.get(k)]
        if found:
            notes += found
        elif r["exit"] not in (0, 1) or (r["exit"] == 1 and r["cell"] != "failover"):
            notes.append(f"exit {r['exit']}")
    return f" ({', '.join(notes)})" if notes else ""


def workers_note(machine):
    """How many runtime workers each of Tern's cluster nodes ran (bench/cluster.sh's
    TERN3_WORKER_THREADS; runs before session 22 did not record it: one per core)."""
    n = machine.get("tern3_worker_threads")
    if n is None or n == "":
        return "Tern's cluster nodes ran one runtime worker per core."
    return f"Tern's cluster nodes ran {n} runtime worker thread(s) each (`[runtime] worker_threads`)."


def build(systems, machine, runs, command):
    present = [s for s in ORDER if s in systems]

    def row(label, cell, getter, fmt, higher_is_better=True):
        base = median(runs.get((BASE, cell)), getter)
        cells = []
        for s in present:
            rs = runs.get((s, cell))
            if rs is None:
                cells.append("n/a")
                continue
            value = median(rs, getter, max if higher_is_better else min)
            text = ("—" if value is None else fmt(value)) + mark(rs)
            if s != BASE and base and value:
                ratio = value / base
                text += f" ({ratio:.3f}×)" if ratio < 0.1 else f" ({ratio:.2f}×)"
            cells.append(text)
        suffix = "" if higher_is_better else " (lower is better)"
        return f"| {label}{suffix} | " + " | ".join(cells) + " |"

    def rate(r):
        return r["delivered_per_s"]

    def failover(r):
        return r["failover_max_s"]

    ints = lambda v: f"{v:,.0f}"  # noqa: E731
    # scripts/cluster_check.py stops waiting for a kill's first acknowledgement after 60 s.
    secs = lambda v: "≥ 60 s (no write within 60 s)" if v >= 60 else f"{v:.2f} s"  # noqa: E731
    header = "| | " + " | ".join(DISPLAY[s] for s in present) + " |"
    rule = "|---" * (len(present) + 1) + "|"
    leaders = sorted({r.get("placement", "") for k, rs in runs.items() if k[0] == BASE
                      for r in rs if r.get("placement")})
    lines = [
        f"Run `{command}` (started {machine.get('started', '?')}, commit "
        f"{machine.get('commit', '?')}, {machine.get('cpus', '?')} CPUs, kernel "
        f"{machine.get('kernel', '?')}); every figure is the median of "
        f"{machine.get('repeats', '?')} repetition(s), each cell against freshly started nodes "
        "with empty data dirs. All nodes and tern-bench share the machine's cores; MQTT 3.1.1, "
        "64-byte payloads, loopback. " + workers_note(machine) + " Load average (1/5/15 min) "
        f"{machine.get('loadavg_start', '?')} at the start, {machine.get('loadavg_end', '?')} at "
        "the end.",
        "",
        "Versions: " + ", ".join(f"{DISPLAY[s]}: {systems[s]['version']}" for s in present) + ".",
        "",
        "Placement: in a cluster the publisher is on one node and the subscriber on another "
        "(Tern: two followers of the leader"
        + (f", publisher/subscriber nodes {', '.join(leaders)}" if leaders else "")
        + "; nats-server: each node in turn, see below); fan-out subscribers round-robin over "
        "the nodes, the publisher as for QoS 1. "
        "Durability: Tern acknowledges after fdatasync on a majority (cluster) or on its disk "
        "(single node); nats-server acknowledges after its JetStream (R3: a quorum of "
        "replicas) has the message in memory, syncing every 2 minutes by default.",
        "",
        "In parentheses: the system's figure divided by the three-node Tern's. A failover "
        "cell's notes are scripts/cluster_check.py's findings in that run: lost (acknowledged, "
        "never delivered to a persistent subscriber), duplicates (QoS 2 delivered twice), "
        "reordered (first deliveries out of a publisher's order).",
        "",
        header, rule,
        row("QoS 1, window 256 (msgs/s)", "q1w256", rate, ints),
        row("QoS 2, window 256 (msgs/s)", "q2w256", rate, ints),
        row("fan-out 1 → 1,000 QoS 1 subs over the nodes (deliveries/s)", "fanout", rate, ints),
        row("failover: kill -9 of the leader → first new PUBACK, max over kills", "failover",
            failover, secs, higher_is_better=False),
    ]
    nats_q1 = runs.get(("nats3", "q1w256")) or []
    if len(nats_q1) > 1:
        lines += ["", "nats-server 3 nodes, QoS 1 window 256 by placement (publisher→subscriber "
                  "node: msgs/s; the table has the best): " + placements(nats_q1, rate) + "."]
    q1 = {s: median(runs.get((s, "q1w256")), rate) for s in present}
    targets = []
    if q1.get("tern3") and q1.get("tern1"):
        targets.append(f"Tern 3 nodes / Tern 1 node at QoS 1 window 256: "
                       f"{q1['tern3'] / q1['tern1']:.2f}× (target ≥ 0.5×)")
    if q1.get("tern3") and q1.get("nats3"):
        targets.append(f"Tern 3 nodes / nats-server 3 nodes: {q1['tern3'] / q1['nats3']:.1f}× "
                       "(target ≥ 30×)")
    fo = median(runs.get(("tern3", "failover")), failover)
    if fo is not None:
        targets.append(f"Tern failover {fo:.2f} s (target < 3 s)")
    if targets:
        lines += ["", "Targets (issue 23): " + "; ".join(targets) + "."]
    return "\n".join(lines) + "\n"


def write(path, table):
    path = Path(path)
    text = path.read_text()
    if BEGIN not in text or END not in text:
        text = text.rstrip("\n") + f"\n\n## Cluster (`bench/cluster.sh`)\n\n{BEGIN}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{table}{END}{tail}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("results")
    p.add_argument("--benchmarks")
    p.add_argument("--command", default="bench/cluster.sh")
    a = p.parse_args()
    table = build(*load(a.results), a.command)
    if a.benchmarks:
        write(a.benchmarks, table)
    else:
        print(table)


if __name__ == "__main__":
    main()
