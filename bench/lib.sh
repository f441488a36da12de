# bench/lib.sh — broker plumbing shared by bench/compare.sh, durable.sh and fanout.sh. Sourced,
# not run. What differs between them stays in each script:
#
#   BENCH_NAME              set before sourcing: the log prefix and the /tmp/tern-NAME.XXXXXX dir
#   port_of NAME            each script's own ports, so that two scripts can run at the same time
#   launch_broker NAME PORT LOGF
#                           start NAME in the background (exactly one `&` job, its $! is taken
#                           as the broker's pid) with the script's configs and flags; return
#                           non-zero to give up without starting anything
#   cell_args CELL          the tern-bench arguments of a cell (used by run_cell)
#
# Sets ROOT, CONFIGS, CARGO_TARGET_DIR, PATH, TERN, TB; init_work sets WORK and the traps.
# shellcheck shell=bash

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CONFIGS="$ROOT/bench/configs"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
export PATH="$PATH:$HOME/.cargo/bin:/usr/sbin"
TERN="$CARGO_TARGET_DIR/release/tern"
TB="$CARGO_TARGET_DIR/release/tern-bench"
# A second Tern binary, measured as the broker `tern-base` with Tern's config and port: the
# before/after of a change from one run (e.g. TERN_BASE=/work/base/tern BROKERS="tern tern-base").
TERN_BASE=${TERN_BASE:-}

# tern_bin NAME: the binary behind the broker name `tern` or `tern-base`.
tern_bin() {
  if [ "$1" = tern-base ]; then
    [ -x "$TERN_BASE" ] || { log "tern-base needs TERN_BASE=/path/to/tern (got '$TERN_BASE')"; return 1; }
    echo "$TERN_BASE"
  else
    echo "$TERN"
  fi
}

log() { printf '[%s %s] %s\n' "$BENCH_NAME" "$(date -u +%H:%M:%S)" "$*" >&2; }

# need_nofile LIMIT: raise the descriptor limit to LIMIT (or the hard limit if that fails), and
# stop if it stays under 11,000: 10,000 idle connections need more than 10,000 descriptors in
# tern-bench and in the broker.
need_nofile() {
  ulimit -n "$1" 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
  if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt 11000 ]; then
    echo "$BENCH_NAME.sh: ulimit -n is $(ulimit -n); the conns cell needs at least 11000" >&2
    exit 2
  fi
}

# build_release PACKAGE...: release build of the given crates, skipped with NO_BUILD=1 (binaries
# already in $CARGO_TARGET_DIR).
build_release() {
  [ -n "${NO_BUILD:-}" ] && return 0
  local args=() p
  for p in "$@"; do args+=(-p "$p"); done
  log "building $* (release, CARGO_TARGET_DIR=$CARGO_TARGET_DIR)"
  cargo build --release -q "${args[@]}" --manifest-path "$ROOT/Cargo.toml"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

BROKER_PID=""
stop_broker() {
  if [ -n "$BROKER_PID" ] && kill -0 "$BROKER_PID" 2>/dev/null; then
    kill -TERM "$BROKER_PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$BROKER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$BROKER_PID" 2>/dev/null || true
  fi
  # Reap it also when it had already exited by itself.
  if [ -n "$BROKER_PID" ]; then wait "$BROKER_PID" 2>/dev/null || true; fi
  BROKER_PID=""
}

# The scratch dir (broker logs, data dirs, rewritten configs), removed on exit with the broker.
init_work() {
  WORK=$(mktemp -d "/tmp/tern-$BENCH_NAME.XXXXXX")
  trap cleanup EXIT
  trap 'exit 130' INT TERM
}
cleanup() { stop_broker; rm -rf "$WORK"; }

# start_broker NAME: launch it, then wait until its port answers.
start_broker() {
  local name=$1 port logf="$WORK/$1.log"
  port=$(port_of "$name")
  launch_broker "$name" "$port" "$logf" || return 1
  BROKER_PID=$!
  for _ in $(seq 100); do
    if port_open "$port"; then
      sleep 0.3
      # The listener must be ours: a broker that lost the race for the port has exited by now,
      # and we must not measure the other process that holds it.
      kill -0 "$BROKER_PID" 2>/dev/null && return 0
      break
    fi
    kill -0 "$BROKER_PID" 2>/dev/null || break
    sleep 0.1
  done
  log "$name did not start listening on $port; its log:"
  tail -20 "$logf" >&2
  stop_broker
  return 1
}

# run_cell NAME CELL TIMEOUT_S: one `tern-bench --json` run of the script's cell_args CELL against
# the running broker NAME. Sets report (its JSON, or null) and code (its exit status); its stderr
# is in $WORK/err.
run_cell() {
  set +e
  # shellcheck disable=SC2046
  report=$("$TB" $(cell_args "$2") --port "$(port_of "$1" "$2")" --broker-pid "$BROKER_PID" \
    --json --quiet --timeout-s "$3" 2>"$WORK/err")
  code=$?
  set -e
  [ -n "$report" ] || report=null
}
