#!/usr/bin/env bash
# bench/durable.sh — the durable broker's throughput (issue "a durable broker"): QoS 1 and QoS 2
# of one connection at windows 1, 16 and 256 and of 16 publishing connections, Tern at sync
# `always` and at `never`, against mosquitto (no persistence, no fsync), nats-server (MQTT on
# JetStream, file store, single node; no QoS 2) and rumqttd (keeps nothing on disk), in one run.
# Brokers from bench/configs/ (owned by bench/compare.sh); a fresh broker and data dir per cell.
#
#   REPEATS=3  BROKERS="tern-always tern-never mosquitto nats rumqttd"  CELLS="..."  NO_BUILD=1
# Output: bench/results/durable-STAMP.jsonl (one tern-bench --json report per run) and a
# markdown table of medians on stdout (bench/durable_report.py).
set -euo pipefail

BENCH_NAME=durable
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
RESULTS="$ROOT/bench/results"
REPEATS=${REPEATS:-3}
BROKERS=${BROKERS:-"tern-always tern-never mosquitto nats rumqttd"}
CELLS=${CELLS:-"q1w1 q1w16 q1w256 q1c16 q2w1 q2w16 q2w256 q2c16"}

build_release tern tern-bench

init_work

# Ports of our own (the configs' ports + 10000): bench/compare.sh may run at the same time on
# the configs' ports, and a broker that cannot bind must not let us measure another one.
port_of() {
  case $1 in
    tern-*) echo 28832 ;; mosquitto) echo 28831 ;; rumqttd) echo 28833 ;; nats) echo 28835 ;;
  esac
}

launch_broker() {
  local name=$1 port=$2 logf=$3
  case $name in
    tern-always|tern-never)
      rm -rf "$WORK/tern-data"
      "$TERN" serve --config "$CONFIGS/tern.toml" --bind "127.0.0.1:$port" \
        --data-dir "$WORK/tern-data" --sync "${name#tern-}" --log warn >"$logf" 2>&1 &
      ;;
    mosquitto)
      sed "s/18831/$port/" "$CONFIGS/mosquitto.conf" >"$WORK/mosquitto.conf"
      mosquitto -c "$WORK/mosquitto.conf" >"$logf" 2>&1 &
      ;;
    nats)
      rm -rf "$WORK/nats-store" && mkdir -p "$WORK/nats-store"
      sed -e "s#STORE_DIR#$WORK/nats-store#" -e "s/18835/$port/" -e "s/14222/24222/" \
        "$CONFIGS/nats-server.conf" >"$WORK/nats.conf"
      nats-server -c "$WORK/nats.conf" >"$logf" 2>&1 &
      ;;
    rumqttd)
      sed -e "s/18833/$port/g" -e "s/1883[4-9]/2${port:1:3}9/g" "$CONFIGS/rumqttd.toml" >"$WORK/rumqttd.toml"
      rumqttd -c "$WORK/rumqttd.toml" >"$logf" 2>&1 &
      ;;
  esac
}

# MQTT 3.1.1, 64-byte payloads, one topic per publisher, one subscriber.
cell_args() {
  case $1 in
    q1w1) echo "pubsub --qos 1 --window 1 -n 2000" ;;
    q1w16) echo "pubsub --qos 1 --window 16 -n 40000" ;;
    q1w256) echo "pubsub --qos 1 --window 256 -n 200000" ;;
    q1c16) echo "pubsub --qos 1 --window 256 --publishers 16 --topics per-publisher -n 20000" ;;
    q2w1) echo "pubsub --qos 2 --window 1 -n 1000" ;;
    q2w16) echo "pubsub --qos 2 --window 16 -n 30000" ;;
    q2w256) echo "pubsub --qos 2 --window 256 -n 100000" ;;
    q2c16) echo "pubsub --qos 2 --window 256 --publishers 16 --topics per-publisher -n 10000" ;;
  esac
}
supports() { case "$1:$2" in nats:q2*) return 1 ;; esac; return 0; }

mkdir -p "$RESULTS"
OUT="$RESULTS/durable-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
: >"$OUT"
printf '{"type":"machine","cpus":%s,"kernel":"%s","repeats":%s,"loadavg_start":"%s"}\n' \
  "$(nproc)" "$(uname -r)" "$REPEATS" "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT"
# The disk's fdatasync latency after a 128-byte append, right now (shared machine: it swings
# from 0.1 ms to several ms),
# since it bounds every `sync = always` figure: window / (sync latency) per connection.
fsync_probe() {
  python3 - "$WORK" <<'PY'
import os, sys, time, json
fd = os.open(os.path.join(sys.argv[1], "fsync.probe"), os.O_WRONLY | os.O_CREAT)
ts = []
for _ in range(200):
    os.write(fd, b"x" * 128)
    t = time.perf_counter(); os.fdatasync(fd); ts.append(time.perf_counter() - t)
ts.sort()
print(json.dumps({"type": "fsync", "p50_ms": ts[100] * 1e3, "p90_ms": ts[180] * 1e3}))
PY
}

for rep in $(seq "$REPEATS"); do
  fsync_probe >>"$OUT"
  for name in $BROKERS; do
    for cell in $CELLS; do
      supports "$name" "$cell" || continue
      start_broker "$name" || continue
      run_cell "$name" "$cell" 120
      printf '{"type":"run","broker":"%s","cell":"%s","rep":%s,"exit":%s,"report":%s}\n' \
        "$name" "$cell" "$rep" "$code" "$report" >>"$OUT"
      log "rep $rep $name $cell: exit $code $(head -c 200 "$WORK/err" | tr '\n' ' ')"
      stop_broker
    done
  done
done
fsync_probe >>"$OUT"
printf '{"type":"machine_end","loadavg_end":"%s"}\n' "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT"
log "results: $OUT"
python3 "$ROOT/bench/durable_report.py" "$OUT"
