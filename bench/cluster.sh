#!/usr/bin/env bash
# bench/cluster.sh — a three-node Tern cluster against a three-node nats-server JetStream cluster
# with MQTT (streams R3 once three servers are routed), with Tern and nats-server single-node in
# the same run, on this machine (issue 23 section 8).
#
# Systems: tern3 (three `tern serve` with [cluster] on loopback), tern1 (one `tern serve`),
# nats3 (three routed nats-server, JetStream, MQTT), nats1 (one nats-server, as bench/compare.sh).
# tern3tls (not in the default SYSTEMS): tern3 with mutual TLS on the cluster port ([cluster]
# tls_*, certificates made with openssl at the start), for the cost of the cluster's TLS.
# Every cell gets freshly started nodes with empty data dirs. Throughput cells run tern-bench:
#   q1w256   pubsub QoS 1, window 256, publisher on one node, subscriber on another
#   q2w256   the same at QoS 2 (nats-server has no QoS 2: n/a)
#   fanout   fanout QoS 1 to 1,000 subscribers spread over the three nodes (--sub-ports),
#            publisher on one node
# Tern's cluster: the publisher on a follower and the subscriber on the other follower (the
# leader from GET /api/v1/cluster, or the nodes' logs): the forwarding path the clients of 2 of
# 3 nodes take. nats-server's cluster: its figure depends on where the publisher is relative to
# the stream leader (2,000 vs 150-300 msgs/s seen), so q1w256 runs three times, publisher on
# node 1, 2, 3 and subscriber on the next node; the table takes the best (the one most
# favourable to nats-server), the raw results keep all three. Single node: both on the one node.
#   failover scripts/cluster_check.py --kills K --pauses 0: paho QoS 1/2 load spread over the
#            nodes, SIGKILL of the leader (tern: /api/v1/cluster; nats: the leader of the
#            $MQTT_msgs stream) K times, restarted after 1 s; the time from each kill to the
#            first new PUBACK; the figure is the largest. tern1: the one node killed and
#            restarted after 1 s (so at least 1 s: a single node has nobody to fail over to).
# Results: bench/results/cluster-STAMP.jsonl (records as bench/compare.sh's), then
# bench/cluster_report.py writes the table between the cluster markers of BENCHMARKS.md: every
# figure the median of REPEATS, ratios to tern3's figure in the same run, as compare.sh does.
#
# Environment knobs:
#   REPEATS=1  SYSTEMS="tern3 tern1 nats3 nats1"  CELLS="q1w256 q2w256 fanout failover"
#   KILLS=3 (failover cell)  NO_BUILD=1 (use the binaries in CARGO_TARGET_DIR)  NO_REPORT=1
#   TERN3_WORKER_THREADS=1: [runtime] worker_threads on each cluster node. 1 by default: the
#   three nodes share this machine, where docs/cluster.md recommends one worker each (+7-9%
#   here, BENCHMARKS.md "Session 21"); empty for one per core, as tern1 always runs (and the
#   cluster nodes did before session 22).
#   Messages per cell (64-byte payloads, MQTT 3.1.1): N_NATS=5000 for nats3's pubsub cells
#   (it runs ~100x slower than the others; throughput is a rate, the count only sets the
#   length), N_TERN=200000 for everyone else's; FANOUT_N=1000 messages to 1,000 subscribers,
#   FANOUT_N_NATS=200 for nats3 (1.5-2.7 k deliveries/s there).
set -euo pipefail

BENCH_NAME=cluster
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
RESULTS="$ROOT/bench/results"
REPEATS=${REPEATS:-1}
SYSTEMS=${SYSTEMS:-"tern3 tern1 nats3 nats1"}
CELLS=${CELLS:-"q1w256 q2w256 fanout failover"}
KILLS=${KILLS:-3}
N_TERN=${N_TERN:-200000}
N_NATS=${N_NATS:-5000}
FANOUT_N=${FANOUT_N:-1000}
FANOUT_N_NATS=${FANOUT_N_NATS:-200}

need_nofile "$(ulimit -Hn)"
command -v nats-server >/dev/null || {
  [ -n "${NO_INSTALL:-}" ] && { log "missing: nats-server"; exit 2; }
  log "installing nats-server from Debian"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nats-server
}
build_release tern tern-bench
PY=$(bash "$ROOT/scripts/pydeps.sh" | tail -1)

exec 9>/tmp/tern-bench-compare.lock
if ! flock -n 9; then
  log "another benchmark holds /tmp/tern-bench-compare.lock; waiting for it (up to 30 min)"
  flock -w 1800 9 || { log "gave up waiting for the lock"; exit 2; }
fi

init_work
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill -CONT "$pid" 2>/dev/null || true; kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  PIDS=()
  rm -rf "$WORK"
}
stop_nodes() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  PIDS=()
}

# Ports: MQTT, cluster links, HTTP/monitoring (and nats' client port), node i = base + i.
TERN_MQTT=19830 TERN_CLUSTER=19840 TERN_HTTP=19850
NATS_MQTT=19860 NATS_CLUSTER=19870 NATS_HTTP=19880 NATS_CLIENT=19890
nodes_of() { case $1 in tern3 | tern3tls | nats3) echo "1 2 3" ;; *) echo "1" ;; esac; }
is_tern3() { case $1 in tern3 | tern3tls) return 0 ;; esac; return 1; }

# cluster_pki: a cluster CA and one node certificate (serverAuth and clientAuth) in $WORK/pki.
cluster_pki() {
  local d="$WORK/pki"
  [ -f "$d/node.pem" ] && return 0
  mkdir -p "$d"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
    -subj "/CN=bench cluster CA" -keyout "$d/ca-key.pem" -out "$d/ca.pem" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=node" \
    -keyout "$d/node-key.pem" -out "$d/node.csr" 2>/dev/null
  printf 'subjectAltName=DNS:node\nextendedKeyUsage=serverAuth,clientAuth\n' >"$d/ext"
  openssl x509 -req -in "$d/node.csr" -CA "$d/ca.pem" -CAkey "$d/ca-key.pem" -CAcreateserial \
    -days 30 -extfile "$d/ext" -out "$d/node.pem" 2>/dev/null
}
mqtt_port() { case $1 in tern*) echo $((TERN_MQTT + $2)) ;; nats*) echo $((NATS_MQTT + $2)) ;; esac; }

launch_tern() { # SYSTEM
  local sys=$1 i peers="" cfg
  for i in 1 2 3; do peers+="\"$i=127.0.0.1:$((TERN_CLUSTER + i))\", "; done
  for i in $(nodes_of "$sys"); do
    cfg="$WORK/$sys-$i.toml"
    cat "$CONFIGS/tern.toml" | grep -v '^\[\[listener\]\]\|^bind' >"$cfg"
    if is_tern3 "$sys"; then
      printf '\n[cluster]\nnode_id = %s\nbind = "127.0.0.1:%s"\npeers = [%s]\n' \
        "$i" "$((TERN_CLUSTER + i))" "${peers%, }" >>"$cfg"
    fi
    if is_tern3 "$sys" && [ -n "${TERN3_WORKER_THREADS-1}" ]; then
      printf '\n[runtime]\nworker_threads = %s\n' "${TERN3_WORKER_THREADS-1}" >>"$cfg"
    fi
    if [ "$sys" = tern3tls ]; then
      cluster_pki
      printf 'tls_cert = "%s"\ntls_key = "%s"\ntls_ca = "%s"\n' \
        "$WORK/pki/node.pem" "$WORK/pki/node-key.pem" "$WORK/pki/ca.pem" >>"$cfg"
    fi
    rm -rf "$WORK/$sys-$i-data"
    "$TERN" serve --config "$cfg" --data-dir "$WORK/$sys-$i-data" --bind "127.0.0.1:$(mqtt_port "$sys" "$i")" \
      --http "127.0.0.1:$((TERN_HTTP + i))" --log warn,tern_cluster=info,tern::cluster=info >"$WORK/$sys-$i.log" 2>&1 &
    PIDS+=($!)
  done
}

launch_nats() { # SYSTEM
  local sys=$1 i j routes cfg
  for i in $(nodes_of "$sys"); do
    routes=""
    if [ "$sys" = nats3 ]; then
      for j in 1 2 3; do [ "$j" = "$i" ] || routes+="\"nats-route://127.0.0.1:$((NATS_CLUSTER + j))\", "; done
    fi
    cfg="$WORK/$sys-$i.conf"
    rm -rf "$WORK/$sys-$i-store" && mkdir -p "$WORK/$sys-$i-store"
    {
      echo "server_name: n$i"
      echo "listen: 127.0.0.1:$((NATS_CLIENT + i))"
      echo "http: 127.0.0.1:$((NATS_HTTP + i))"
      echo "max_connections: 100000"
      echo "jetstream { store_dir: \"$WORK/$sys-$i-store\" }"
      [ "$sys" = nats3 ] && echo "cluster { name: bench, listen: 127.0.0.1:$((NATS_CLUSTER + i)), routes: [${routes%, }] }"
      echo "mqtt { listen: 127.0.0.1:$(mqtt_port "$sys" "$i"), max_ack_pending: 10000 }"
    } >"$cfg"
    nats-server -c "$cfg" >"$WORK/$sys-$i.log" 2>&1 &
    PIDS+=($!)
  done
}

# leads_by_log LOG I: {"role":"leader","node_id":I} when LOG's last engine line is "leading"
# (for a build without /api/v1/cluster; crates/server/tests/cluster.rs reads the log so too).
leads_by_log() {
  local last
  last=$(grep -o 'cluster: leading\|cluster: engine stopped\|cluster: node starting' "$1" 2>/dev/null | tail -1)
  [ "$last" = "cluster: leading" ] && printf '{"role":"leader","node_id":%s}' "$2"
  return 0
}

# leader_of SYSTEM: the leader's node number as the nodes report it, or nothing.
leader_of() {
  local i
  for i in $(nodes_of "$1"); do
    case $1 in
      tern*) curl -sf -m 1 "http://127.0.0.1:$((TERN_HTTP + i))/api/v1/cluster" ||
        leads_by_log "$WORK/$1-$i.log" "$i" ;;
      nats*) curl -sf -m 1 "http://127.0.0.1:$((NATS_HTTP + i))/jsz" ;;
    esac
    echo "@@"
  done 2>/dev/null | "$PY" -c '
import json, sys
for part in sys.stdin.read().split("@@"):
    try:
        v = json.loads(part)
    except ValueError:
        continue
    if "meta_cluster" in v:
        lead = (v.get("meta_cluster") or {}).get("leader") or ""
        if lead.startswith("n"): print(lead[1:]); break
    elif v.get("role") == "leader":
        print(v.get("node_id")); break
    elif isinstance(v.get("leader_id"), int):
        print(v["leader_id"]); break
' || true
}

# start_system SYSTEM: every node listening, and a leader when the nodes can name one (up to 20 s).
start_system() {
  local sys=$1 i port
  case $sys in tern*) launch_tern "$sys" ;; nats*) launch_nats "$sys" ;; esac
  for i in $(nodes_of "$sys"); do
    port=$(mqtt_port "$sys" "$i")
    for _ in $(seq 200); do port_open "$port" && break; sleep 0.1; done
    port_open "$port" || { log "$sys node $i is not listening on $port"; tail -5 "$WORK/$sys-$i.log" >&2; return 1; }
  done
  if [ "$sys" = tern3tls ]; then
    for i in $(nodes_of "$sys"); do
      grep -q 'cluster port: mutual TLS' "$WORK/$sys-$i.log" || { log "$sys node $i: no TLS on its cluster port"; return 1; }
    done
  fi
  LEADER=""
  case $sys in
    tern3 | tern3tls | nats3)
      for _ in $(seq 100); do LEADER=$(leader_of "$sys"); [ -n "$LEADER" ] && break; sleep 0.2; done
      [ -n "$LEADER" ] || log "$sys: no node names a leader (no /api/v1/cluster?); going on"
      # A leader names itself before its engine serves (barrier, replica copy, recovery); a
      # client forwarded to it meanwhile is closed ("broker closed the connection", seen).
      if is_tern3 "$sys" && [ -n "$LEADER" ]; then
        for _ in $(seq 100); do
          curl -sf -m 1 -o /dev/null "http://127.0.0.1:$((TERN_HTTP + LEADER))/api/v1/clients" && break
          sleep 0.1
        done
      fi
      ;;
  esac
  # Until JetStream has its MQTT streams, nats-server closes MQTT connections (seen on a fresh
  # cluster with 64 concurrent connects): one CONNECT per node must succeed first.
  case $sys in nats*)
    for i in $(nodes_of "$sys"); do
      for _ in $(seq 60); do
        "$TB" conns -n 1 --hold-s 0 --first-source 127.0.0.1 --port "$(mqtt_port "$sys" "$i")" \
          --quiet --json --timeout-s 5 >/dev/null 2>&1 && break
        sleep 0.5
      done
    done ;;
  esac
  return 0
}

# placement SYSTEM [ROTATION]: the publisher's and the subscriber's node: two followers of a
# known leader (tern3), node ROTATION and the next (nats3), else nodes 1 and 2.
placement() {
  local sys=$1 a b i
  case $sys in tern1 | nats1) echo "1 1"; return ;; esac
  if [ "$sys" = nats3 ] && [ "${2:-0}" != 0 ]; then
    echo "$2 $(($2 % 3 + 1))"
    return
  fi
  a="" b=""
  if is_tern3 "$sys" && [ -n "$LEADER" ]; then
    for i in 1 2 3; do
      [ "$i" = "$LEADER" ] && continue
      if [ -z "$a" ]; then a=$i; else b=$i; fi
    done
    echo "$a $b"
  else
    echo "1 2"
  fi
}

cell_cmd() { # SYSTEM CELL [ROTATION] -> tern-bench arguments
  local sys=$1 cell=$2 n pub sub fan_n=$FANOUT_N
  case $sys in nats3) n=$N_NATS fan_n=$FANOUT_N_NATS ;; *) n=$N_TERN ;; esac
  read -r pub sub <<<"$(placement "$sys" "${3:-0}")"
  case $cell in
    q1w256) echo "pubsub --qos 1 --window 256 -n $n --port $(mqtt_port "$sys" "$pub") --sub-ports $(mqtt_port "$sys" "$sub")" ;;
    q2w256) echo "pubsub --qos 2 --window 256 -n $n --port $(mqtt_port "$sys" "$pub") --sub-ports $(mqtt_port "$sys" "$sub")" ;;
    fanout)
      local ports="" i
      for i in $(nodes_of "$sys"); do ports+="$(mqtt_port "$sys" "$i"),"; done
      echo "fanout --qos 1 --subscribers 1000 -n $fan_n --port $(mqtt_port "$sys" "$pub") --sub-ports ${ports%,}" ;;
  esac
}

supports() { case "$1:$2" in nats*:q2*) return 1 ;; esac; return 0; }

run_failover() { # SYSTEM -> sets report, code
  local broker bin
  case $1 in tern3) broker=tern bin=$TERN ;; tern1) broker=tern-single bin=$TERN ;;
    nats3) broker=nats bin=$(command -v nats-server) ;; *) report=null code=3; return ;; esac
  set +e
  report=$("$PY" "$ROOT/scripts/cluster_check.py" --bin "$bin" --broker "$broker" --kills "$KILLS" \
    --pauses 0 --seconds $((KILLS * 8)) 2>"$WORK/err" | tail -1)
  code=$?
  set -e
  [ -n "$report" ] || report=null
}

mkdir -p "$RESULTS"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT="$RESULTS/cluster-$STAMP.jsonl"
: >"$OUT"
log "results: $OUT"
for sys in $SYSTEMS; do
  case $sys in tern*) v=$("$TERN" --version | head -1) ;; nats*) v=$(nats-server --version | head -1) ;; esac
  printf '{"type":"broker","broker":"%s","version":"%s","nodes":%s}\n' "$sys" "$v" "$(nodes_of "$sys" | wc -w)" >>"$OUT"
done
printf '{"type":"machine","cpus":%s,"kernel":"%s","repeats":%s,"started":"%s","loadavg_start":"%s","commit":"%s","tern3_worker_threads":"%s"}\n' \
  "$(nproc)" "$(uname -r)" "$REPEATS" "$STAMP" "$(cut -d' ' -f1-3 /proc/loadavg)" \
  "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')" "${TERN3_WORKER_THREADS-1}" >>"$OUT"

for rep in $(seq "$REPEATS"); do
  for sys in $SYSTEMS; do
    log "repetition $rep/$REPEATS: $sys"
    for cell in $CELLS; do
      supports "$sys" "$cell" || continue
      [ "$cell" = failover ] && [ "$sys" = nats1 ] && continue
      rotations=0 # 0: the one default placement
      [ "$sys:$cell" = nats3:q1w256 ] && rotations="1 2 3"
      for rot in $rotations; do
        placed=""
        if [ "$cell" = failover ]; then
          run_failover "$sys"
        else
          if ! start_system "$sys"; then
            report=null code=2
          else
            placed=$(placement "$sys" "$rot")
            set +e
            # shellcheck disable=SC2046
            report=$("$TB" $(cell_cmd "$sys" "$cell" "$rot") --json --quiet --timeout-s 300 2>"$WORK/err")
            code=$?
            set -e
            [ -n "$report" ] || report=null
          fi
          stop_nodes
        fi
        printf '{"type":"run","broker":"%s","cell":"%s","rep":%s,"exit":%s,"leader":"%s","placement":"%s","report":%s}\n' \
          "$sys" "$cell" "$rep" "$code" "${LEADER:-}" "$placed" "$report" >>"$OUT"
        if [ "$code" != 0 ]; then
          log "  $cell ${placed:+(pub/sub nodes $placed)}: exit $code $(tail -c 400 "$WORK/err" | tr '\n' ' ')"
        else
          log "  $cell ${placed:+(pub/sub nodes $placed)}: ok"
        fi
        LEADER=""
      done
    done
  done
done
printf '{"type":"machine_end","loadavg_end":"%s","ended":"%s"}\n' \
  "$(cut -d' ' -f1-3 /proc/loadavg)" "$(date -u +%Y%m%dT%H%M%SZ)" >>"$OUT"

[ -n "${NO_REPORT:-}" ] && exit 0
python3 "$ROOT/bench/cluster_report.py" "$OUT" --benchmarks "$ROOT/BENCHMARKS.md"
log "done: BENCHMARKS.md (cluster section) updated"
