#!/usr/bin/env bash
# bench/http_overhead.sh — what the admin HTTP listener costs the hot path: tern without it,
# tern with `--http` while a scraper reads /metrics every second, and optionally another tern
# binary (BASE_TERN, e.g. a build of the commit before the listener existed), interleaved
# REPEATS times per cell on the compare.sh config. Prints, per variant and cell, the median
# delivered msgs/s and the median broker CPU time per delivery (steadier than throughput on a
# shared machine), and the change against the first variant.
#
#   BASE_TERN=/path/to/old/tern REPEATS=5 CELLS="q0 q1w256" bench/http_overhead.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TERN=${TERN:-$ROOT/target/release/tern}
REPEATS=${REPEATS:-5}
CELLS=${CELLS:-"q0 q1w256 q2w256"}
HTTP_ADDR=127.0.0.1:18089
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

cell_args() {
  case $1 in
    q0) echo "--qos 0 -n 500000" ;;
    q1w256) echo "--qos 1 --window 256 -n 300000" ;;
    q2w256) echo "--qos 2 --window 256 -n 150000" ;;
    *) echo "unknown cell $1" >&2; exit 2 ;;
  esac
}

# The ports of compare.sh: one benchmark at a time on this machine (its lock).
exec 9>/tmp/tern-bench-compare.lock
flock -w 600 9 || { echo "another benchmark holds /tmp/tern-bench-compare.lock" >&2; exit 2; }

variants=()
if [ -n "${BASE_TERN:-}" ]; then variants+=(base); fi
variants+=(off on)

run() { # variant cell -> delivered/s
  local variant=$1 cell=$2 bin=$TERN extra=() scraper=
  if [ "$variant" = base ]; then bin=$BASE_TERN; fi
  if [ "$variant" = on ]; then extra=(--http "$HTTP_ADDR"); fi
  rm -rf "$WORK/data" "$WORK/out"
  "$bin" serve --config "$ROOT/bench/configs/tern.toml" --data-dir "$WORK/data" --log warn \
    "${extra[@]}" >"$WORK/out" 2>"$WORK/err" &
  local pid=$!
  for _ in $(seq 100); do grep -q "tern listening" "$WORK/out" 2>/dev/null && break; sleep 0.05; done
  if [ "$variant" = on ]; then
    (while true; do curl -s -o /dev/null "http://$HTTP_ADDR/metrics" || true; sleep 1; done) &
    scraper=$!
  fi
  # shellcheck disable=SC2046
  "$TERN" bench pubsub --port 18832 $(cell_args "$cell") --broker-pid "$pid" --json -q >"$WORK/r.json" 2>"$WORK/bench.err" || true
  if [ -n "$scraper" ]; then kill "$scraper" 2>/dev/null || true; fi
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  # delivered/s and the broker's CPU nanoseconds per delivery, as "rate/ns".
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("%d/%d" % (r["delivered_per_s"], r["cpu"]["broker_cpu_ms"] * 1e6 / r["deliveries"]))' "$WORK/r.json" 2>/dev/null ||
    { echo "$variant $cell could not run: $(head -c 300 "$WORK/bench.err" "$WORK/err")" >&2; echo -1/-1; }
}

declare -A results
for rep in $(seq "$REPEATS"); do
  for cell in $CELLS; do
    for v in "${variants[@]}"; do
      results[$v:$cell]+="$(run "$v" "$cell") "
    done
  done
  echo "repetition $rep/$REPEATS done" >&2
done

median() { tr ' ' '\n' | grep -v '^$' | grep -v '^-1$' | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
# field 1: delivered/s; field 2: broker CPU ns per delivery.
field() { tr ' ' '\n' | grep -v '^$' | cut -d/ -f"$1" | tr '\n' ' '; }
for f in 1 2; do
  [ "$f" = 1 ] && echo "median delivered/s (change against ${variants[0]})" || echo "median broker CPU ns per delivery (change against ${variants[0]})"
  printf '%-8s' cell; for v in "${variants[@]}"; do printf '%20s' "$v"; done; echo
  for cell in $CELLS; do
    printf '%-8s' "$cell"
    first=
    for v in "${variants[@]}"; do
      m=$(echo "${results[$v:$cell]}" | field "$f" | median)
      if [ -z "$first" ]; then first=$m; fi
      printf '%20s' "$m ($(awk -v a="$m" -v b="$first" 'BEGIN {printf "%+.1f%%", (a-b)/b*100}'))"
    done
    echo
  done
done
for cell in $CELLS; do for v in "${variants[@]}"; do echo "raw $v $cell: ${results[$v:$cell]}"; done; done
