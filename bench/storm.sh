#!/usr/bin/env bash
# bench/storm.sh — persistent connects and reconnect storms, tern against mosquitto, and tern's
# idle CPU with 100,000 offline persistent sessions (issue 24 items 4 and 5; BENCHMARKS.md
# "Session 8"). Needs a release build (cargo build --release -p tern) and Debian's mosquitto.
# Each run connects from fresh 127.0.X.1 source addresses: TIME_WAIT sockets of an earlier run
# on the same address slow a new one down by an order of magnitude.
#   ROUNDS="2 3 4"   the rounds (each one's number picks its source addresses)
#   IDLE=1           also measure the idle CPU with 100,000 offline sessions (~2 min)
#   ROUNDS=" " IDLE=1  that measurement alone
#   TERN=path        the tern binary to measure (default: the workspace's release build)
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
T="${TERN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/tern}"
ulimit -n 20000
cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }
wait_listening() { for _ in $(seq 50); do grep -q listening "$1" 2>/dev/null && return; sleep 0.1; done; }
run() { # port pid tag concurrency first-source
  "$T" bench conns -p "$1" -n 10000 --per-source 5000 --first-source "$5" --hold-s 1 \
    --connect-concurrency "$4" --persistent --tag "$3" --broker-pid "$2" --json 2>/dev/null |
    python3 -c 'import sys,json; d=json.load(sys.stdin); print("established",d["established"],"failed",d["failed"],"connect_ms",round(d["connect_elapsed_ms"]),"per_s",round(d["connects_per_s"]))'
}
for round in ${ROUNDS:-2 3 4}; do
  D=$(mktemp -d)
  "$T" serve --bind 127.0.0.1:18902 --data-dir "$D" >"$D/out" 2>"$D/err" &
  P=$!; wait_listening "$D/out"
  echo "tern r$round new-sessions c128: $(run 18902 $P s$round 128 127.0.$((round*10)).1)"
  sleep 1
  echo "tern r$round reconnect-storm c1024: $(run 18902 $P s$round 1024 127.0.$((round*10+3)).1)"
  kill -9 $P; wait $P 2>/dev/null; rm -rf "$D"
  M=$(mktemp -d)
  printf 'listener 18903 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location %s/\n' "$M" >"$M/m.conf"
  mosquitto -c "$M/m.conf" >"$M/log" 2>&1 &
  Q=$!; sleep 0.5
  echo "mosquitto r$round new-sessions c128: $(run 18903 $Q s$round 128 127.0.$((round*10+5)).1)"
  sleep 1
  echo "mosquitto r$round reconnect-storm c1024: $(run 18903 $Q s$round 1024 127.0.$((round*10+7)).1)"
  kill -9 $Q; wait $Q 2>/dev/null; rm -rf "$M"
done
[ "${IDLE:-0}" = 1 ] || exit 0
D=$(mktemp -d)
"$T" serve --bind 127.0.0.1:18904 --data-dir "$D" >"$D/out" 2>"$D/err" &
P=$!; wait_listening "$D/out"
a=$(cpu $P); sleep 10; b=$(cpu $P); echo "tern idle, 0 sessions: $((b-a)) ticks in 10 s"
for k in $(seq 10); do run 18904 $P idle$k 256 127.0.$((k+100)).1 >/dev/null; done
sleep 3
a=$(cpu $P); sleep 10; b=$(cpu $P)
echo "tern idle, 100000 offline sessions: $((b-a)) ticks in 10 s ($(getconf CLK_TCK) ticks = 1 core-second)"
kill -9 $P; wait $P 2>/dev/null; rm -rf "$D"
