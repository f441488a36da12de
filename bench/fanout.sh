#!/usr/bin/env bash
# bench/fanout.sh — fan-out, idle memory and open-loop latency: Tern against mosquitto, nats-server
# and rumqttd, on this machine, in one run.
#
# For each repetition, each broker is started fresh for every cell (loopback, configs from
# bench/configs/ with the ports moved to 1983x so that a concurrent compare.sh run does not
# collide), one tern-bench run is made against it, and it is stopped. Then the median of each
# cell goes into a markdown table (absolute figures and ratios to Tern) at $OUT_MD
# (default bench/results/fanout.md, ignored by git; copy the tables into BENCHMARKS.md); the raw reports stay in $OUT_JSONL.
#
# Cells (MQTT 3.1.1, 64-byte payloads, one publisher):
#   f<S>q<Q>   fan-out to S = 1, 100, 1000, 5000 subscribers at QoS Q = 0, 1 (closed loop; the
#              publisher sends D / S messages so every cell makes about D deliveries)
#   conns      10,000 idle connections: broker RSS growth / connections
#   lat1       open loop, 1 pub -> 1 sub, QoS 1, $LAT1_RATE msg/s
#   lat100     open loop, 1 pub -> 100 subs, QoS 0, $LAT100_RATE msg/s
#   lat1000    open loop, 1 pub -> 1,000 subs, QoS 0, $LAT1000_RATE msg/s (issue 15's latency cell)
#
# Knobs: REPEATS=3  BROKERS="tern mosquitto nats rumqttd"  CELLS="..."  Q0_DELIVERIES=1000000
#        Q1_DELIVERIES=300000  LAT1_RATE=10000  LAT100_RATE=1000  LAT1000_RATE=200  LAT_S=5
#        CONNS_REPEATS=1  CONNS_N=10000 (idle connections of the conns cell, 5,000 per source address)
#        TERN_BASE=/path/to/tern with `tern-base` in BROKERS: a second Tern binary (before/after)
#        CARGO_TARGET_DIR (default target/ of the repository)  NO_BUILD=1
#        REPORT_ONLY="a.jsonl b.jsonl"  only rebuild the table from earlier raw reports (runs of
#                                       other latency rates add rows)
# Whole run with the defaults: about 12-15 minutes on the 2-core VM.
set -euo pipefail

BENCH_NAME=fanout
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
REPEATS=${REPEATS:-3}
CONNS_REPEATS=${CONNS_REPEATS:-1}
BROKERS=${BROKERS:-"tern mosquitto nats rumqttd"}
CELLS=${CELLS:-"f1q0 f100q0 f1000q0 f5000q0 f1q1 f100q1 f1000q1 f5000q1 lat1 lat100 conns"}
Q0_DELIVERIES=${Q0_DELIVERIES:-1000000}
Q1_DELIVERIES=${Q1_DELIVERIES:-300000}
LAT1_RATE=${LAT1_RATE:-10000}
LAT100_RATE=${LAT100_RATE:-1000}
LAT1000_RATE=${LAT1000_RATE:-200}
CONNS_N=${CONNS_N:-10000}
LAT_S=${LAT_S:-5}
OUT_MD=${OUT_MD:-$ROOT/bench/results/fanout.md}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT_JSONL=${OUT_JSONL:-$ROOT/bench/results/fanout-$STAMP.jsonl}

# 10,000 idle connections and 5,000 subscribers: 20,000 descriptors are enough.
need_nofile 20000

for name in $BROKERS; do
  case $name in nats) tool=nats-server ;; tern | tern-base) continue ;; *) tool=$name ;; esac
  command -v "$tool" >/dev/null || { log "missing $tool (bench/compare.sh installs it)"; exit 2; }
done
command -v python3 >/dev/null || { log "missing python3"; exit 2; }

if [ -n "${REPORT_ONLY:-}" ]; then
  NO_BUILD=1
fi
build_release tern tern-bench

# ---- brokers ---------------------------------------------------------------------------------
init_work

port_of() {
  case $1 in
    tern | tern-base) echo 19832 ;; mosquitto) echo 19831 ;; rumqttd) echo 19833 ;; nats) echo 19835 ;;
  esac
}

# The shared configs with every port moved from 1883x/14222 to 1983x/24222.
for f in tern.toml mosquitto.conf nats-server.conf rumqttd.toml; do
  sed -e 's/1883\([0-9]\)/1983\1/g' -e 's/14222/24222/g' "$CONFIGS/$f" >"$WORK/$f"
done

launch_broker() {
  local name=$1 logf=$3
  case $name in
    tern | tern-base)
      local bin
      bin=$(tern_bin "$name") || return 1
      rm -rf "$WORK/tern-data"
      "$bin" serve --config "$WORK/tern.toml" --data-dir "$WORK/tern-data" --log warn >"$logf" 2>&1 &
      ;;
    mosquitto) mosquitto -c "$WORK/mosquitto.conf" >"$logf" 2>&1 & ;;
    nats)
      rm -rf "$WORK/nats-store" && mkdir -p "$WORK/nats-store"
      sed -i "s#STORE_DIR#$WORK/nats-store#" "$WORK/nats-server.conf"
      nats-server -c "$WORK/nats-server.conf" >"$logf" 2>&1 &
      ;;
    rumqttd) rumqttd -c "$WORK/rumqttd.toml" >"$logf" 2>&1 & ;;
  esac
}

# ---- the matrix ------------------------------------------------------------------------------
cell_args() {
  case $1 in
    f*q*)
      local subs=${1#f} qos
      qos=${subs#*q}
      subs=${subs%q*}
      local deliveries=$Q0_DELIVERIES
      [ "$qos" = 0 ] || deliveries=$Q1_DELIVERIES
      local n=$((deliveries / subs))
      [ "$n" -ge 20 ] || n=20
      echo "fanout --qos $qos --subscribers $subs -n $n --connect-concurrency 128 --drain-ms 2000"
      ;;
    lat1) echo "latency --qos 1 --rate $LAT1_RATE --duration-s $LAT_S --subscribers 1" ;;
    lat100) echo "latency --qos 0 --rate $LAT100_RATE --duration-s $LAT_S --subscribers 100" ;;
    lat1000) echo "latency --qos 0 --rate $LAT1000_RATE --duration-s $LAT_S --subscribers 1000 --connect-concurrency 128" ;;
    conns) echo "conns -n $CONNS_N --per-source 5000 --hold-s 2 --connect-concurrency 128" ;;
  esac
}

if [ -n "${REPORT_ONLY:-}" ]; then
  REPEATS=0
  OUT_JSONL=$REPORT_ONLY
else
  mkdir -p "$(dirname "$OUT_JSONL")" "$(dirname "$OUT_MD")"
  : >"$OUT_JSONL"
  log "raw reports: $OUT_JSONL"
fi
run_matrix() {
printf '{"type":"machine","cpus":%s,"kernel":"%s","repeats":%s,"started":"%s","loadavg_start":"%s"}\n' \
  "$(nproc)" "$(uname -r)" "$REPEATS" "$STAMP" "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT_JSONL"
for rep in $(seq "$REPEATS"); do
  for name in $BROKERS; do
    log "repetition $rep/$REPEATS: $name"
    for cell in $CELLS; do
      [ "$cell" = conns ] && [ "$rep" -gt "$CONNS_REPEATS" ] && continue
      if ! start_broker "$name"; then
        printf '{"type":"run","broker":"%s","cell":"%s","rep":%s,"exit":2,"report":null}\n' "$name" "$cell" "$rep" >>"$OUT_JSONL"
        continue
      fi
      run_cell "$name" "$cell" 90
      printf '{"type":"run","broker":"%s","cell":"%s","rep":%s,"exit":%s,"report":%s}\n' \
        "$name" "$cell" "$rep" "$code" "$report" >>"$OUT_JSONL"
      [ "$code" = 0 ] && log "  $cell: ok" || log "  $cell: exit $code $(tr '\n' ' ' <"$WORK/err" | cut -c1-200)"
      stop_broker
    done
  done
done
printf '{"type":"machine_end","loadavg_end":"%s","ended":"%s"}\n' \
  "$(cut -d' ' -f1-3 /proc/loadavg)" "$(date -u +%Y%m%dT%H%M%SZ)" >>"$OUT_JSONL"
}
[ -n "${REPORT_ONLY:-}" ] || run_matrix

# ---- report ----------------------------------------------------------------------------------
# shellcheck disable=SC2086
python3 - "$OUT_MD" "$BROKERS" $OUT_JSONL <<'PY'
import json, statistics, sys

dst, brokers, srcs = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
runs, machine, end = {}, {}, {}
for src in srcs:
    for line in open(src):
        r = json.loads(line)
        if r["type"] == "machine": machine = machine or r
        elif r["type"] == "machine_end": end = r
        elif r["type"] == "run":
            cell = r["cell"]
            rate = (r["report"] or {}).get("offered_rate_per_s")
            if cell.startswith("lat") and rate:
                cell = f"{cell}@{int(round(rate))}"
            runs.setdefault((r["broker"], cell), []).append(r)

def med(broker, cell, get):
    vals = []
    for r in runs.get((broker, cell), []):
        try:
            v = get(r["report"])
        except (TypeError, KeyError):
            v = None
        if v is not None: vals.append(v)
    return statistics.median(vals) if vals else None

def lost(broker, cell):
    return max((r["report"] or {}).get("counts", {}).get("lost", 0) if r["report"] else 0
               for r in runs.get((broker, cell), [{"report": None}]))

def fails(broker, cell):
    return sum(1 for r in runs.get((broker, cell), []) if r["exit"] != 0)

def fmt(v, unit):
    if v is None: return "n/a"
    if unit == "rate": return f"{v/1e6:.2f} M/s" if v >= 1e6 else f"{v/1e3:.0f} k/s"
    if unit == "us":
        if v >= 1e6: return f"{v/1e6:.2f} s"
        return f"{v/1000:.2f} ms" if v >= 1000 else f"{v:.0f} µs"
    if unit == "bytes": return f"{v/1024:.1f} KiB"
    return str(v)

def row(label, cell, get, unit, higher_better):
    t = med("tern", cell, get)
    cells = []
    for b in brokers:
        v = med(b, cell, get)
        s = fmt(v, unit)
        notes = []
        if fails(b, cell): notes.append(f"{fails(b, cell)} failed")
        if unit == "rate" and lost(b, cell): notes.append(f"lost {lost(b, cell)}")
        if b != "tern" and v and t:
            ratio = (v / t)
            s += f" ({ratio:.2f}×)" if ratio < 100 else f" ({ratio:.0f}×)"
        if notes: s += " [" + ", ".join(notes) + "]"
        cells.append(s)
    return f"| {label} | " + " | ".join(cells) + " |"

names = {"tern": "Tern", "tern-base": "Tern (base)", "mosquitto": "mosquitto", "nats": "nats-server", "rumqttd": "rumqttd"}
out = []
out.append("# Fan-out, idle memory and latency: Tern vs mosquitto, nats-server, rumqttd\n")
out.append(f"`bench/fanout.sh` run {machine.get('started')} on {machine.get('cpus')} CPUs, kernel "
           f"{machine.get('kernel')}, load average {machine.get('loadavg_start')} at start, "
           f"{end.get('loadavg_end')} at end (shared VM). MQTT 3.1.1, 64-byte payloads, loopback, "
           f"a fresh broker per cell, median of {machine.get('repeats')} runs. Ratios in "
           f"parentheses are the broker's figure divided by Tern's.\n")
head = "| cell | " + " | ".join(names.get(b, b) for b in brokers) + " |"
sep = "|---|" + "---:|" * len(brokers)
out.append("## Deliveries per second, 1 publisher → N subscribers (closed loop)\n")
out += [head, sep]
for q in (0, 1):
    for s in (1, 100, 1000, 5000):
        out.append(row(f"QoS {q}, {s} sub", f"f{s}q{q}", lambda r: r["delivered_per_s"], "rate", True))
out.append("\n## p99 end-to-end latency in the same runs (saturated: queueing, not a latency test)\n")
out += [head, sep]
for q in (0, 1):
    for s in (1, 100, 1000, 5000):
        out.append(row(f"QoS {q}, {s} sub", f"f{s}q{q}", lambda r: r["e2e_latency"]["p99_us"], "us", False))
out.append("\n## Open-loop latency at a fixed offered rate (p50 / p99)\n")
out += [head, sep]
lat_cells = sorted({c for (_, c) in runs if c.startswith("lat")},
                   key=lambda c: (c.split("@")[0], int(c.split("@")[1]) if "@" in c else 0))
labels = {"lat1": "1 → 1, QoS 1", "lat100": "1 → 100, QoS 0", "lat1000": "1 → 1,000, QoS 0"}
for cell in lat_cells:
    base, _, rate = cell.partition("@")
    label = f"{labels.get(base, base)}, {rate or '?'} msg/s"
    out.append(row(f"{label}, p50", cell, lambda r: r["e2e_latency"]["p50_us"], "us", False))
    out.append(row(f"{label}, p99", cell, lambda r: r["e2e_latency"]["p99_us"], "us", False))
    out.append(row(f"{label}, delivered (kept up?)", cell, lambda r: r["delivered_per_s"], "rate", True))
out.append("\n## Memory per idle connection (10,000 connections, RSS growth / connections)\n")
out += [head, sep]
out.append(row("bytes per idle connection", "conns", lambda r: r["broker_bytes_per_connection"], "bytes", False))
out.append("")
open(dst, "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
log "table: $OUT_MD"
