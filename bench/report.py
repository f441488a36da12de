#!/usr/bin/env python3
"""Turns a bench/compare.sh results file into the BENCHMARKS.md comparison table and a chart.

Usage: report.py RESULTS.jsonl [--benchmarks BENCHMARKS.md] [--chart bench/chart.svg]

Only the text between `<!-- compare:begin -->` and `<!-- compare:end -->` of BENCHMARKS.md is
replaced (the file is created with a heading and the markers if missing). Every figure is the
median over the repetitions of a cell; ratios are to Tern's median in the same results file.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

BEGIN = "<!-- compare:begin -->"
END = "<!-- compare:end -->"
ORDER = ["tern", "tern-base", "mosquitto", "nats", "rumqttd"]
DISPLAY = {"tern": "Tern", "tern-base": "Tern (base)", "mosquitto": "mosquitto", "nats": "nats-server", "rumqttd": "rumqttd"}
CELLS = {
    "q0": "QoS 0, 1 pub → 1 sub",
    "q1w1": "QoS 1, window 1",
    "q1w256": "QoS 1, window 256",
    "q2w1": "QoS 2, window 1",
    "q2w256": "QoS 2, window 256",
    "fanout": "fan-out 1 → 1,000 subs, QoS 0",
    "conns": "10,000 idle connections",
    "tls_q1w256": "TLS, QoS 1, window 256",
    "tls_conns": "TLS, 5,000 idle connections",
    "tls_mconns": "mutual TLS, 5,000 idle connections",
}
TRAFFIC = ["q0", "q1w1", "q1w256", "q2w1", "q2w256", "fanout"]


def load(path):
    brokers, machine, runs = {}, {"attempts": 0}, {}
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        if item["type"] == "broker":
            brokers[item["broker"]] = item
        elif item["type"] in ("machine", "machine_end"):
            machine.update(item)
        elif item["type"] == "attempt":
            machine["attempts"] += 1
        elif item["type"] == "run":
            runs.setdefault((item["broker"], item["cell"]), []).append(item)
    return brokers, machine, runs


def median_of(runs, getter):
    values = []
    for run in runs:
        report = run.get("report")
        if not report:
            continue
        try:
            value = getter(report)
        except (KeyError, TypeError):
            continue
        if value is not None:
            values.append(float(value))
    return statistics.median(values) if values else None


def fmt_int(value):
    return "—" if value is None else f"{value:,.0f}"


def fmt_us(value):
    if value is None:
        return "—"
    return f"{value / 1000:.1f} ms" if value >= 10_000 else f"{value:.0f} µs"


def status_mark(runs):
    """'' when every repetition passed; otherwise a note of what went wrong."""
    failed = sum(1 for r in runs if r["exit"] == 1)
    errors = sum(1 for r in runs if r["exit"] not in (0, 1))
    notes = []
    if failed:
        notes.append(f"check failed {failed}/{len(runs)}")
    if errors:
        notes.append(f"error {errors}/{len(runs)}")
    return f" ({', '.join(notes)})" if notes else ""


def build(brokers, machine, runs):
    present = [b for b in ORDER if b in brokers]
    has_tern = "tern" in present and any(k[0] == "tern" and k[1] != "start" for k in runs)
    repeats = machine.get("repeats", "?")

    def cell_value(broker, cell, getter):
        rs = runs.get((broker, cell))
        if rs is None:
            return None, "n/a"
        return median_of(rs, getter), status_mark(rs)

    def row(label, cell, getter, formatter, higher_is_better=True):
        tern_value, _ = cell_value("tern", cell, getter) if has_tern else (None, "")
        cells = []
        for broker in present:
            value, mark = cell_value(broker, cell, getter)
            if mark == "n/a":
                cells.append("n/a")
                continue
            text = formatter(value) + mark
            if broker != "tern" and tern_value and value:
                text += f" ({value / tern_value:.2f}×)"
            cells.append(text)
        direction = "" if higher_is_better else " (lower is better)"
        return f"| {label}{direction} | " + " | ".join(cells) + " |"

    header = "| | " + " | ".join(DISPLAY[b] for b in present) + " |"
    rule = "|---" * (len(present) + 1) + "|"
    load = ""
    if machine.get("loadavg_start"):
        load = (f" Load average (1/5/15 min) {machine['loadavg_start']} at the start and "
                f"{machine.get('loadavg_end', '?')} at the end: other work shared the machine.")
    lines = [
        f"Run `bench/compare.sh` (started {machine.get('started', '?')}, {machine.get('cpus', '?')} CPUs, "
        f"kernel {machine.get('kernel', '?')}); every figure is the median of {repeats} repetitions, "
        "each cell against a freshly started broker. Brokers and tern-bench share the machine's cores; "
        "MQTT 3.1.1, 64-byte payloads, loopback; method and configs in `bench/README.md`." + load,
        "",
        "Versions: " + ", ".join(brokers[b]["version"] or b for b in present) + ".",
        "",
        "Durability differs: Tern runs with its defaults, so every QoS 1 and QoS 2 message is "
        "written and fdatasync'ed before its PUBACK/PUBREC (and QoS 2's release before PUBCOMP); "
        "mosquitto (`persistence false`) and rumqttd keep nothing on disk; nats-server stores "
        "QoS 1 in JetStream. The window-1 rows are therefore one disk sync per message for Tern.",
        "",
    ]
    if machine.get("attempts"):
        lines += [f"{machine['attempts']} attempt(s) could not run (connection reset or closed mid-run) and "
                  "were retried with a fresh broker; they are listed in the raw results.", ""]
    if not has_tern:
        lines += ["**Tern was not part of this run** (no ratios).", ""]
    else:
        lines += ["In parentheses after a peer's figure: the peer's median divided by Tern's.", ""]

    lines += ["**Throughput** (distinct messages delivered per second, all subscribers together)", "", header, rule]
    for cell in TRAFFIC:
        lines.append(row(CELLS[cell], cell, lambda r: r["delivered_per_s"], fmt_int))
    lines.append(row("QoS 0 messages dropped by the broker, %", "q0",
                     lambda r: 100.0 * r["counts"]["lost"] / max(r["counts"]["expected"], 1),
                     lambda v: "—" if v is None else f"{v:.1f}", False))
    lines += ["", "**10,000 idle connections** (2,500 from each of 127.0.1.1–127.0.1.4)", "", header, rule]
    lines.append(row("connections established", "conns", lambda r: r["established"], fmt_int))
    lines.append(row("connects per second", "conns", lambda r: r["connects_per_s"], fmt_int))
    lines.append(row("broker memory per connection, bytes", "conns", lambda r: r["broker_bytes_per_connection"], fmt_int, False))
    lines.append(row("broker RSS with 10,000 connections, MiB", "conns",
                     lambda r: r["broker_rss_after_bytes"] / 1048576, lambda v: "—" if v is None else f"{v:.1f}", False))
    if any(cell.startswith("tls_") for (_, cell) in runs):
        lines += ["", "**TLS** (Tern and mosquitto; TLS 1.3, ECDSA P-256 server certificate made for the run; "
                  "the other brokers are n/a)", "", header, rule]
        lines.append(row(CELLS["tls_q1w256"], "tls_q1w256", lambda r: r["delivered_per_s"], fmt_int))
        lines.append(row("TLS connects per second", "tls_conns", lambda r: r["connects_per_s"], fmt_int))
        lines.append(row("broker memory per idle TLS connection, bytes", "tls_conns",
                         lambda r: r["broker_bytes_per_connection"], fmt_int, False))
        if any(cell == "tls_mconns" for (_, cell) in runs):
            lines.append(row("mutual TLS connects per second (client certificate)", "tls_mconns",
                             lambda r: r["connects_per_s"], fmt_int))
            lines.append(row("broker memory per idle mutual-TLS connection, bytes", "tls_mconns",
                             lambda r: r["broker_bytes_per_connection"], fmt_int, False))
    lines += ["", "**End-to-end latency at window 1** (p50 / p99; closed loop, one message in flight)", "", header, rule]
    for cell in ["q1w1", "q2w1"]:
        def latency_text(broker, cell=cell):
            rs = runs.get((broker, cell))
            if rs is None:
                return "n/a"
            p50 = median_of(rs, lambda r: r["e2e_latency"]["p50_us"])
            p99 = median_of(rs, lambda r: r["e2e_latency"]["p99_us"])
            return f"{fmt_us(p50)} / {fmt_us(p99)}"
        lines.append(f"| {CELLS[cell]} | " + " | ".join(latency_text(b) for b in present) + " |")
    lines += ["", "**CPU: load generator vs broker** (cores busy during the cell, tern-bench / broker, "
              "from /proc/PID/task/*/schedstat). On loopback the kernel's TCP work for a segment is "
              "largely charged to the process that sends it, so each side carries part of the other's "
              "network cost. Where the broker batches its writes and tern-bench does too (window 256, "
              "QoS 0) the generator stays well below the broker; at window 1 every message is a "
              "round trip and both sides pay the same system calls per message; in the connection "
              "cell the client side pays for the TCP handshakes.", "", header, rule]
    for cell in TRAFFIC + ["conns"]:
        def cpu_text(broker, cell=cell):
            rs = runs.get((broker, cell))
            if rs is None:
                return "n/a"
            bench = median_of(rs, lambda r: r["cpu"]["bench_cores"])
            broker_cores = median_of(rs, lambda r: r["cpu"]["broker_cores"])
            if bench is None or broker_cores is None:
                return "—"
            return f"{bench:.2f} / {broker_cores:.2f}"
        lines.append(f"| {CELLS[cell]} | " + " | ".join(cpu_text(b) for b in present) + " |")
    lines += ["", "![throughput and memory per connection](bench/chart.svg)", ""]
    return "\n".join(lines)


def write_benchmarks(path, table):
    path = Path(path)
    text = path.read_text() if path.exists() else f"# Tern benchmarks\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text or END not in text:
        text = text.rstrip("\n") + f"\n\n{BEGIN}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")


def draw(chart, brokers, runs):
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "tern-bench"
    import matplotlib.pyplot as plt

    present = [b for b in ORDER if b in brokers]
    colors = {"tern": "#d1495b", "tern-base": "#8a8a8a", "mosquitto": "#00798c", "nats": "#edae49", "rumqttd": "#66a182"}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [4, 1]})
    width = 0.8 / max(len(present), 1)
    for i, broker in enumerate(present):
        values = []
        for cell in TRAFFIC:
            rs = runs.get((broker, cell))
            values.append((median_of(rs, lambda r: r["delivered_per_s"]) if rs else None) or 0)
        xs = [x + (i - (len(present) - 1) / 2) * width for x in range(len(TRAFFIC))]
        ax1.bar(xs, values, width, label=DISPLAY[broker], color=colors[broker])
        for x, value, cell in zip(xs, values, TRAFFIC):
            if (broker, cell) not in runs:
                ax1.annotate("n/a", (x, 0), xycoords=("data", "axes fraction"), xytext=(0, 2),
                             textcoords="offset points", ha="center", va="bottom", fontsize=7)
    ax1.set_xticks(range(len(TRAFFIC)))
    ax1.set_xticklabels([CELLS[c].replace(", ", "\n", 1) for c in TRAFFIC], fontsize=8)
    ax1.set_yscale("log")
    ax1.set_ylim(bottom=1000)
    ax1.set_ylabel("messages delivered per second (log)")
    ax1.set_title("Throughput (median; missing bar = not supported)")
    ax1.legend(fontsize=8)
    ax1.grid(axis="y", alpha=0.3)
    mem = []
    for broker in present:
        rs = runs.get((broker, "conns"))
        mem.append((median_of(rs, lambda r: r["broker_bytes_per_connection"]) if rs else None) or 0)
    ax2.bar([DISPLAY[b] for b in present], [m / 1024 for m in mem], color=[colors[b] for b in present])
    ax2.set_ylabel("KiB per idle connection")
    ax2.set_title("Memory, 10,000 conns")
    ax2.tick_params(axis="x", labelrotation=30, labelsize=8)
    ax2.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(chart, metadata={"Date": None})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("--benchmarks")
    parser.add_argument("--chart")
    args = parser.parse_args()
    brokers, machine, runs = load(args.results)
    table = build(brokers, machine, runs)
    if args.benchmarks:
        write_benchmarks(args.benchmarks, table)
    else:
        print(table)
    if args.chart:
        draw(args.chart, brokers, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
