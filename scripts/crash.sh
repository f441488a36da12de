#!/usr/bin/env bash
# The crash test of issue 10 ("exactly once and in order under crash",
# crates/server/tests/crash_exactly_once.rs) at length: N kill -9 / restart cycles (default 100)
# against a release build of `tern`, or against the binary given with --bin.
#
# Subscribers include two paho ones that DISCONNECT shortly before most kills and come back
# after the restart (issue 25), so every run also checks sessions that were offline at a crash.
#
# Usage: scripts/crash.sh [--cycles N] [--bin PATH] [--seed N] [--pub-waits]
#   --cycles N  kill/restart cycles (TERN_CRASH_CYCLES; the test's default inside
#               `cargo test` is 10)
#   --bin PATH  the broker binary to test (TERN_E2E_BIN); default: `cargo build --release -p
#               tern` and target/release/tern (honours CARGO_TARGET_DIR)
#   --seed N    replay a kill schedule (TERN_CRASH_SEED, printed by every run)
#   --pub-waits the paho publishers do not dial while the broker is down
#               (TERN_CRASH_PUB_WAITS=1): paho's re-PUBLISH after PUBREL, which follows a
#               failed reconnect attempt, becomes rare (a kill during a reconnect still
#               triggers it); its copies are told apart either way
# The harness itself is built in release too (it must keep up with a release broker).
# Python: scripts/pydeps.sh provides paho-mqtt 2.x in .venv/interop (the test calls it).
# Exits with the test's status; the report (seed, counts, first examples) is on stderr.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CYCLES=100
BIN=""
SEED=""
PUB_WAITS=0
while [ $# -gt 0 ]; do
  case "$1" in
    --cycles) CYCLES="$2"; shift 2 ;;
    --bin) BIN="$2"; shift 2 ;;
    --seed) SEED="$2"; shift 2 ;;
    --pub-waits) PUB_WAITS=1; shift ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "crash.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$CYCLES" in ''|*[!0-9]*) echo "crash.sh: --cycles wants a number" >&2; exit 2 ;; esac

cd "$ROOT"
if [ -z "$BIN" ]; then
  cargo build -q --release -p tern
  TARGET="${CARGO_TARGET_DIR:-target}"
  case "$TARGET" in /*) ;; *) TARGET="$ROOT/$TARGET" ;; esac
  BIN="$TARGET/release/tern"
fi
case "$BIN" in /*) ;; *) BIN="$PWD/$BIN" ;; esac
[ -x "$BIN" ] || { echo "crash.sh: no tern binary at $BIN" >&2; exit 1; }
# Fail here, with pydeps' own message, rather than inside the test.
bash "$ROOT/scripts/pydeps.sh" >/dev/null

echo "crash.sh: $CYCLES cycles against $BIN" >&2
export TERN_E2E_BIN="$BIN" TERN_CRASH_CYCLES="$CYCLES" TERN_CRASH_PUB_WAITS="$PUB_WAITS"
[ -n "$SEED" ] && export TERN_CRASH_SEED="$SEED"
exec cargo test -q --release -p tern --test crash_exactly_once -- --nocapture
