#!/usr/bin/env bash
# The real-process cluster check of issue 23: three `tern serve` nodes on loopback (temp data
# dirs), paho-mqtt clients spread over all nodes (QoS 1 and QoS 2 publishers with numbers,
# persistent subscribers that count a QoS 2 message at its PUBREL, every client moving to the
# next node when its connection drops), SIGKILL of the leader, SIGSTOP pauses, optionally a
# partition; then lost / duplicated / reordered messages and the failover time.
# The logic is scripts/cluster_check.py (clients: cluster_clients.py, nodes: cluster_nodes.py).
#
# Usage: scripts/cluster-check.sh [--kills N] [--pauses N] [--partition] [--transfers N]
#                                 [--power-losses N] [--power-loss-all] [--membership]
#                                 [--snapshot-every N]
#                                 [--seconds S] [--keep]
#                                 [--broker tern|tern-single|nats] [--bin PATH] [--sync POLICY]
#                                 [--wipe-on-kill] [--receiver-at-publish] [--seed N]
#                                 [--rate MSGS_PER_S] [--window W] [--tls] [--tls-reloads N]
#   --kills N       SIGKILL the leader N times (found with GET /api/v1/cluster; a random live
#                   node when no node answers), restarted after --restart-after-s (1 s)
#   --pauses N      SIGSTOP a random node for 1-3 s, then SIGCONT, N times
#   --partition     once, cut the leader from the other two for --partition-s (10 s): every
#                   node in its own network namespace (root, `ip netns`), blackhole routes
#                   between the leader and the others; clients still reach the cut node, which
#                   must not acknowledge anything sent after the cut (minority_acks), and the
#                   other two must acknowledge something before the heal
#                   (partition_writes_after_s: from the cut to their first acknowledgement)
#   --transfers N   hand the leadership to the next node N times (POST /api/v1/cluster/leader
#                   on the leader, once the chosen node has the committed log); each must
#                   answer 200 and writes must resume (transfers: status, took_s, writes_after_s)
#   --power-losses N  cut the leader's power N times: every node's data dir is an ext4 file
#                   system on a loop device of its own (root); the node is stopped, its disk
#                   image copied as it is (what had reached the device: everything fsynced, some
#                   of the rest), killed, the copy mounted in place of its disk, restarted
#                   (scripts/cluster_power.py); power_losses: down_s, writes_after_s
#   --power-loss-all  once, the same for every node at the same instant
#   --membership    once: start a fourth, empty node and add it under the load (POST
#                   /api/v1/cluster/members: a learner, promoted once caught up), then remove a
#                   follower of the first three (DELETE) and stop it; both must answer 200
#                   and writes go on (membership: add_s, writes_after_s)
#   --snapshot-every N  [cluster] snapshot_every_entries = N, log_kept_behind_snapshot = N/10:
#                   a node back from a fault, or added, catches up by a snapshot install
#   --seconds S     length of the load phase; the faults are spread evenly over it (default 40)
#   --keep          keep the work directory (configs, data dirs, broker logs)
#   --tls           mutual TLS on the cluster port ([cluster] tls_cert/tls_key/tls_ca/tls_crl:
#                   a CA, a certificate per node and an empty CRL, made with openssl as
#                   docs/cluster.md says): Raft traffic and forwarded clients over TLS
#   --tls-reloads N  with --tls: SIGHUP every node N times under the load (each re-reads the
#                   files and checks every open cluster link against them); as the files
#                   revoke nothing, a link cut (reload_cuts) or a failed reload
#                   (reload_failures) fails the run
#   --broker B      tern (default: three nodes with [cluster]); tern-single (one node without
#                   [cluster], killed and restarted in place: the checker's test bed); nats
#                   (three routed nats-server with JetStream and MQTT, QoS 1 only)
#   --bin PATH      the broker binary; default: `cargo build --release -p tern` (tern) or
#                   nats-server from PATH
#   --sync POLICY   tern --sync (e.g. never; a SIGKILL leaves the page cache, so it loses nothing)
#   --wipe-on-kill  delete a killed node's data dir before its restart (a lost disk: since
#                   session 11 the node refuses to start, reported as unexpected exits), and
#   --receiver-at-publish  subscribers that count a QoS 2 message at its PUBLISH, not its
#                   PUBREL (the broker's DUP resends then count twice): both broken on purpose,
#                   to show that the checker reports lost and duplicated messages
#   --self-test     only the checker, on made-up records with one lost, one duplicated and one
#                   reordered message: it must count exactly those
# Environment: CLUSTER_CHECK_LOG replaces the nodes' log filter (`tern serve --log`; default
#   "warn,tern=info,tern_cluster=info"), e.g. with ",openraft=debug" to read elections in the
#   nodes' broker.log (with --keep).
# CI's short mode: --kills 3 --pauses 2 --partition --transfers 2 --power-losses 1
#   --power-loss-all --seconds 40 (about 80 s in all).
# The last line on stdout is one JSON object: {"lost":0,"duplicates":0,"reordered":0,
# "failover_max_s":1.2,"kills":3,"pauses":2,...}. Exit 1 when lost, duplicates, reordered or
# minority_acks is above 0, a publisher could not finish, a transfer failed, or failover_max_s > 3; 2 when the run
# could not be made.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BROKER=tern
BIN=""
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) sed -n '2,/^# could not be made/p' "$0"; exit 0 ;;
    --self-test) # the checker alone, on made-up records with known faults
      exec "$(bash "$ROOT/scripts/pydeps.sh" | tail -1)" "$ROOT/scripts/cluster_check.py" --self-test ;;
    --broker) BROKER="$2"; ARGS+=("$1" "$2"); shift 2 ;;
    --bin) BIN="$2"; shift 2 ;;
    --partition | --keep | --wipe-on-kill | --receiver-at-publish | --power-loss-all | \
      --membership | --tls) ARGS+=("$1"); shift ;;
    --kills | --pauses | --transfers | --power-losses | --snapshot-every | --seconds | --sync | --seed | --rate | --window | --netns | --tls-reloads | \
      --restart-after-s | --partition-s)
      ARGS+=("$1" "$2"); shift 2 ;;
    *) echo "cluster-check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

if [ -z "$BIN" ]; then
  case "$BROKER" in
    nats)
      BIN=$(command -v nats-server) || { echo "cluster-check.sh: nats-server not found (apt-get install nats-server)" >&2; exit 2; } ;;
    *)
      cargo build -q --release -p tern --manifest-path "$ROOT/Cargo.toml" >&2
      TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
      case "$TARGET" in /*) ;; *) TARGET="$ROOT/$TARGET" ;; esac
      BIN="$TARGET/release/tern" ;;
  esac
fi
case "$BIN" in /*) ;; *) BIN="$PWD/$BIN" ;; esac
[ -x "$BIN" ] || { echo "cluster-check.sh: no broker binary at $BIN" >&2; exit 2; }

PY=$(bash "$ROOT/scripts/pydeps.sh" | tail -1)
exec "$PY" "$ROOT/scripts/cluster_check.py" --bin "$BIN" "${ARGS[@]}"
