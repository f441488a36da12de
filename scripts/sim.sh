#!/usr/bin/env bash
# The broker simulator of issue 12 (crates/broker/tests/sim.rs, docs/simulation.md): the
# whole broker in process on the simulated disk, with seeded workloads (persistent sessions,
# stalled and leaving clients, retained messages; share groups, retention limits), power
# losses and process crashes, and a checker of at-least-once / exactly-once / order / open
# exchanges / retained values. Release, or with --debug the dev profile.
#
# Usage: scripts/sim.sh [--debug] [--cluster|--cluster-broker] [--seeds N] [--base B] [--seed S] [--inject BUG] [--crash-only] [--linger] [--groups] [--no-eio] [--no-bounds] [--all] [--writer-threads[-raw]] [--jobs J] [--first] [--verbose]
#   --debug       run the dev profile's test binaries as `cargo test --workspace` builds them
#                 (the same features, so nothing is built again after it; .ci/run): debug
#                 assertions on, several times slower per seed; without it, release
#   --seeds N     run N seeds (default 100), from --base (default 0)
#   --seed S      run seed S alone: a seed is one execution, so this replays it exactly
#                 (the same digest on the seed's line, the same violations)
#   --inject BUG  run with a known bug injected, to see the simulator find it:
#     into the store (tern-store feature `sim`):
#       ack-before-fsync                   tickets complete (the broker acks) before the fdatasync
#       skip-dir-sync-on-roll              a new block file's directory entry is never fsynced
#       skip-sync-on-roll                  a block is sealed unsynced (sync = interval only)
#     into the broker (tern-broker feature `inject`, src/inject.rs):
#       ignore-received-set-after-restart  restored sessions forget their QoS 2 received set
#       random-pubrel-order                a PUBREL jumps ahead of PUBRELs queued before it
#       retention-removes-open-qos2        retention limits ignore open QoS 2 state
#       drop-share-queue-on-leave          a leaving share-group member drops the group's messages
#       ignore-queued-bytes-total          the memory cap (max_queued_bytes_total) is not checked
#       ignore-disk-budget                 the disk budget ([store] max_disk_bytes) is not checked
#       replay-ignores-inflight            recovery queues a restored in-flight message again (fresh id)
#   --crash-only  every fault a process crash (kill -9: the page cache survives), no power
#                 loss: what the crash tests can see (the store bugs go unnoticed)
#   --linger      let clients reconnect to a broker whose disk just died (power loss inside
#                 a call) until it is killed: a disk that fails under a running broker
#   On by default (their flags are accepted so that old replay lines still parse): share
#   groups whose members leave and come back (`--groups`, `--all`), retention limits (a
#   small max_msgs in 3 seeds of 10; `--retention`), publisher drops at packet boundaries
#   (`--pub-drops`), disk errors (`--eio`):
#   --no-eio      leave out the disk errors (EIO on a write or fdatasync under a running
#                 broker, then a power loss)
#   --no-bounds   leave out the resource bounds (a memory cap in 1 seed of 3, a disk budget
#                 in half the seeds with a retention limit, checked every step)
#   --writer-threads  the store runs its writer threads instead of stepped writers (every
#                 stream flushed each disk tick): tickets complete while tasks run, as in
#                 production; a seed is no longer one execution (finding 9)
#   --writer-threads-raw  the same without the flush: virtual time may outrun the threads
#                 (interval-sync seeds stall, the harness's); finding 9 showed here
#   --jobs J      seeds run at once (default: one per core; a seed is CPU-bound, virtual time)
#   --first       stop at the first failing seed (how many seeds a bug takes to find)
#   --stress H    keep H busy processes spinning beside the seeds, for CPU contention: the
#                 cluster broker seeds run real threads in real time, and a race there may
#                 need a loaded machine to open (session 17's snapshot bug, seed 12944:
#                 1 run in 3 under three such processes, never on an idle machine)
#   --verbose     print every seed's plan and fault log, not only the failing ones'
#   --cluster     run the cluster seeds instead (issue 23; crates/raft/tests/sim, docs/simulation.md
#                 "Cluster seeds"): 3 or 5 tern-raft nodes on simulated disks and a simulated
#                 network, with node crashes, per-node and whole-cluster power losses,
#                 partitions, paused nodes, lost, delayed and reordered messages. Takes
#                 --seeds, --base, --seed, --inject, --jobs, --first, --verbose; cluster bugs
#                 (tern-raft feature `inject`, crates/raft/src/inject.rs):
#       ack-before-commit                  propose answers once the leader's own log has the entry
#       vote-not-synced                    the Raft vote is written but never fsynced
#       deliver-uncommitted                entries reach the Applier as they are appended, before commit
#       flush-before-sync                  the log reports an append flushed before its fsync
#       purge-before-record                a log purge is durable past the applied point recorded
#                                          (openraft's purge during a snapshot install)
#                 A cluster seed's plan (faults, workload) is the seed's, but its execution is
#                 not replayed exactly (openraft's election timeouts use a random source of its own).
#   --cluster-broker  run the cluster broker seeds instead (issue 23; crates/cluster/tests/broker_sim,
#                 docs/simulation.md "Cluster broker seeds"): 3 tern-raft nodes on simulated
#                 disks and the simulated network, each with its replica and the real lifecycle
#                 (the broker on a ReplicatedDisk on the leader), raw MQTT clients connected to
#                 any node (forwarded to the leader), leader and follower crashes, power losses
#                 of one node and of all, partitions of the leader, paused nodes; checks
#                 at-least-once, QoS 2 exactly-once, order, persistent sessions, one owner per
#                 session. Real threads and real time (a seed is ~10 s): a seed's plan is the
#                 seed's, its execution is not. Takes --seeds, --base, --seed, --inject, --jobs,
#                 --first, --verbose; bugs:
#       dedupe-on-leader-only              every engine a leader starts has an empty QoS 2 received
#                                          set, as if it had lived only in the old leader's memory
#       lose-ownership-on-takeover         a deposed leader's engine keeps serving its connections
#       random-pubrel-order                a PUBREL jumps ahead of PUBRELs queued before it (the
#                                          broker's bug above, seen through the cluster's checker)
#       ack-at-sync-start                  the broker's store completes a pipelined commit's tickets
#                                          when its sync starts on the replicated disk, not once a
#                                          majority committed it (PUBACK before the commit)
# Prints each seed's line with its digest (the disk's trace and every client packet: equal
# digests, the same run), each failing seed (violations, replay command, plan, faults, the disk's events),
# then the first failing seed, and ends with the line `sim: seeds=N violations=V` (V: seeds
# that violated a guarantee). Exits 0 iff V is 0.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SEEDS=100
BASE=0
SEED=""
INJECT=""
VERBOSE=0
CRASH_ONLY=0
LINGER=0
FIRST=0
JOBS="$(nproc 2>/dev/null || echo 2)"
NO_EIO=0
NO_BOUNDS=0
SHARE_GROUPS=0  # not GROUPS: bash ignores assignments to its own $GROUPS (the user's group ids)
RETENTION=0
ALL=0
WRITER_THREADS=0
CLUSTER=0
DEBUG=0
STRESS=0
while [ $# -gt 0 ]; do
  case "$1" in
    --debug) DEBUG=1; shift ;;
    --seeds) SEEDS="${2:-}"; shift 2 ;;
    --base) BASE="${2:-}"; shift 2 ;;
    --seed) SEED="${2:-}"; shift 2 ;;
    --inject) INJECT="${2:-}"; shift 2 ;;
    --verbose) VERBOSE=1; shift ;;
    --crash-only) CRASH_ONLY=1; shift ;;
    --linger) LINGER=1; shift ;;
    --pub-drops) shift ;; # on by default since finding 3's fix; accepted for old replay lines
    --first) FIRST=1; shift ;;
    --eio) shift ;;
    --no-eio) NO_EIO=1; shift ;;
    --no-bounds) NO_BOUNDS=1; shift ;;
    --groups) SHARE_GROUPS=1; shift ;;
    --retention) RETENTION=1; shift ;;
    --all) ALL=1; shift ;;
    --writer-threads) WRITER_THREADS=1; shift ;;
    --writer-threads-raw) WRITER_THREADS=raw; shift ;;
    --cluster) CLUSTER=1; shift ;;
    --cluster-broker) CLUSTER=broker; shift ;;
    --jobs) JOBS="${2:-}"; shift 2 ;;
    --stress) STRESS="${2:-}"; shift 2 ;;
    -h|--help) sed -n '2,85p' "$0"; exit 0 ;;
    *) echo "sim.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
for n in "$SEEDS" "$BASE" "$JOBS" "$STRESS" ${SEED:+"$SEED"}; do
  case "$n" in ''|*[!0-9]*) echo "sim.sh: --seeds, --base, --jobs, --stress and --seed want a number" >&2; exit 2 ;; esac
done
# What the script leaves behind goes at its exit: the test's log, the --stress processes.
LOG=""
HOGS=()
cleanup() {
  if [ -n "$LOG" ]; then rm -f "$LOG"; fi
  if [ "${#HOGS[@]}" -gt 0 ]; then kill "${HOGS[@]}" 2>/dev/null || true; fi
}
trap cleanup EXIT
# start_stress: the --stress processes, once the test binary is built (a build under load
# only takes longer).
start_stress() {
  local i
  for ((i = 0; i < STRESS; i++)); do
    (while :; do :; done) &
    HOGS+=($!)
  done
}
# sim_selection PACKAGE: cargo's package and profile arguments. Release builds the one package;
# --debug selects the whole workspace, whose features `cargo test --workspace` built with
# (one package alone unifies other features and rebuilds most dependencies). Other packages'
# test targets of the same name run too, and their filter matches nothing.
sim_selection() {
  if [ "$DEBUG" = 1 ]; then SEL=(--workspace); else SEL=(--release -p "$1"); fi
}
# run_cluster_seeds PACKAGE TEST FN PREFIX NAME DETAIL: one cluster simulator's campaign (both
# run their seeds with tern_raft::sim_seeds, configured by PREFIX_* variables): prints each
# failing seed's lines (DETAIL: what its log lines start with after four spaces) and the
# summary; fails unless it ran and found no violation.
run_cluster_seeds() {
  local package=$1 test=$2 fn=$3 prefix=$4 name=$5 detail=$6 status summary
  cd "$ROOT"
  sim_selection "$package"
  cargo test -q "${SEL[@]}" --test "$test" --no-run 2>/dev/null \
    || cargo test "${SEL[@]}" --test "$test" --no-run
  export "${prefix}_SEEDS=$SEEDS" "${prefix}_SEED_BASE=$BASE" "${prefix}_INJECT=$INJECT" \
    "${prefix}_VERBOSE=$VERBOSE" "${prefix}_STOP_AT_FIRST=$FIRST" "${prefix}_JOBS=$JOBS"
  if [ -n "$SEED" ]; then export "${prefix}_SEED=$SEED"; else unset "${prefix}_SEED"; fi
  LOG="$(mktemp)"
  start_stress
  set +e
  cargo test -q "${SEL[@]}" --test "$test" -- --exact "$fn" --nocapture >"$LOG" 2>&1
  status=$?
  set -e
  grep -e '^seed ' -e "^    $detail" -e '^  VIOLATION' -e '^  replay' -e '^  \.\.\.' \
    -e '^sim: first failing' -e "^$name: " "$LOG" || true
  summary="$(grep '^sim: seeds=' "$LOG" | tail -n 1 || true)"
  if [ -z "$summary" ]; then
    echo "sim.sh: the $name test did not finish (status $status); its output:" >&2
    cat "$LOG" >&2
    echo "sim: seeds=$SEEDS violations=unknown"
    return 1
  fi
  echo "$summary"
  [ "${summary##*violations=}" = 0 ]
}

if [ "$CLUSTER" = broker ]; then
  case "$INJECT" in
    ''|dedupe-on-leader-only|lose-ownership-on-takeover|random-pubrel-order|ack-at-sync-start) ;;
    *) echo "sim.sh: unknown cluster broker bug '$INJECT' (see --help)" >&2; exit 2 ;;
  esac
  run_cluster_seeds tern-cluster broker_sim cluster_broker_seeds TERN_CBSIM cluster-broker '\['
  exit $?
fi
if [ "$CLUSTER" = 1 ]; then
  case "$INJECT" in
    ''|ack-before-commit|vote-not-synced|deliver-uncommitted|flush-before-sync|purge-before-record) ;;
    *) echo "sim.sh: unknown cluster bug '$INJECT' (see --help)" >&2; exit 2 ;;
  esac
  run_cluster_seeds tern-raft sim cluster_seeds TERN_CSIM cluster ''
  exit $?
fi
case "$INJECT" in
  ''|ack-before-fsync|skip-dir-sync-on-roll|skip-sync-on-roll) ;;
  ignore-received-set-after-restart|random-pubrel-order|retention-removes-open-qos2|drop-share-queue-on-leave) ;;
  ignore-queued-bytes-total|ignore-disk-budget|replay-ignores-inflight) ;;
  *) echo "sim.sh: unknown bug '$INJECT' (see --help)" >&2; exit 2 ;;
esac

cd "$ROOT"
sim_selection tern-broker
cargo test -q "${SEL[@]}" --test sim --no-run 2>/dev/null \
  || cargo test "${SEL[@]}" --test sim --no-run
export TERN_SIM_SEEDS="$SEEDS" TERN_SIM_SEED_BASE="$BASE" TERN_SIM_INJECT="$INJECT" TERN_SIM_VERBOSE="$VERBOSE" TERN_SIM_CRASH_ONLY="$CRASH_ONLY" TERN_SIM_LINGER="$LINGER" TERN_SIM_STOP_AT_FIRST="$FIRST" TERN_SIM_JOBS="$JOBS" TERN_SIM_NO_EIO="$NO_EIO" TERN_SIM_NO_BOUNDS="$NO_BOUNDS" TERN_SIM_GROUPS="$SHARE_GROUPS" TERN_SIM_RETENTION="$RETENTION" TERN_SIM_ALL="$ALL" TERN_SIM_WRITER_THREADS="$WRITER_THREADS"
if [ -n "$SEED" ]; then export TERN_SIM_SEED="$SEED"; else unset TERN_SIM_SEED; fi
LOG="$(mktemp)"
start_stress
set +e
cargo test -q "${SEL[@]}" --test sim -- --exact sim_seeds --nocapture >"$LOG" 2>&1
STATUS=$?
set -e
# The test's own lines, its summary last.
grep -v -e '^sim: seeds=' -e '^running ' -e '^test ' -e '^$' -e '^failures:' -e '^---- ' \
  -e '^thread ' -e '^note: ' -e '^error: test failed' -e '^    sim_seeds$' -e '^[.F]*$' -e ' --- FAILED$' \
  -e '^stack backtrace' -e '^ *[0-9]*: ' -e '^ *at ' -e '^  left: ' -e '^ right: ' -e '^assertion ' "$LOG" || true
SUMMARY="$(grep '^sim: seeds=' "$LOG" | tail -n 1 || true)"
if [ -z "$SUMMARY" ]; then
  echo "sim.sh: the test did not finish (status $STATUS); its output:" >&2
  cat "$LOG" >&2
  echo "sim: seeds=$SEEDS violations=unknown"
  exit 1
fi
echo "$SUMMARY"
V="${SUMMARY##*violations=}"
[ "$V" = 0 ]
