#!/usr/bin/env bash
# bench/compare.sh — Tern against mosquitto, nats-server and rumqttd, on this machine, in one run.
#
# Installs what is missing (mosquitto and nats-server from Debian, rumqttd from crates.io), builds
# tern and tern-bench in release mode, then for each repetition starts every broker in turn on
# loopback with its config from bench/configs/ (a fresh start for every cell), runs the fixed
# matrix against it with `tern-bench --json`, and stops it. Finally bench/report.py takes the median of each cell, writes
# the table between the compare markers of BENCHMARKS.md and draws bench/chart.svg.
#
# Environment knobs (defaults are the published method):
#   REPEATS=3                          repetitions of the whole matrix (median is reported)
#   RETRIES=2                          extra attempts for a cell that could not run (exit 2)
#   BROKERS="tern mosquitto nats rumqttd"
#   CELLS="q0 q1w1 q1w256 q2w1 q2w256 fanout conns tls_q1w256 tls_conns tls_mconns"
#                                      tls_*: tern and mosquitto over TLS (certificates made by
#                                      openssl for the run, in the work directory); tls_mconns:
#                                      mutual TLS, every client presenting a certificate
#   NO_INSTALL=1                       fail instead of installing missing brokers
#   NO_REPORT=1                        only collect bench/results/*.jsonl
#   NO_BUILD=1                         use the tern and tern-bench already in CARGO_TARGET_DIR
#   TERN_ARGS="--http 127.0.0.1:18080"  extra arguments of `tern serve` (e.g. the HTTP listener on)
#   TERN_BASE=/path/to/tern            a second Tern binary, listed in BROKERS as `tern-base`
#                                      (before/after of a change in one run, ratios to `tern`)
set -euo pipefail

BENCH_NAME=compare
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
BENCH="$ROOT/bench"
RESULTS="$BENCH/results"
REPEATS=${REPEATS:-3}
RETRIES=${RETRIES:-2}
BROKERS=${BROKERS:-"tern mosquitto nats rumqttd"}
CELLS=${CELLS:-"q0 q1w1 q1w256 q2w1 q2w256 fanout conns tls_q1w256 tls_conns tls_mconns"}
RUMQTTD_VERSION=0.20.0

need_nofile "$(ulimit -Hn)"

# ---- install ---------------------------------------------------------------------------------
# Only the brokers this run compares (BROKERS).
wants() { case " $BROKERS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
need_apt=()
wants mosquitto && ! command -v mosquitto >/dev/null && need_apt+=(mosquitto)
wants nats && ! command -v nats-server >/dev/null && need_apt+=(nats-server)
if [ ${#need_apt[@]} -gt 0 ]; then
  [ -n "${NO_INSTALL:-}" ] && { log "missing: ${need_apt[*]}"; exit 2; }
  log "installing ${need_apt[*]} from Debian"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi
if wants rumqttd && ! command -v rumqttd >/dev/null; then
  [ -n "${NO_INSTALL:-}" ] && { log "missing: rumqttd"; exit 2; }
  log "installing rumqttd $RUMQTTD_VERSION from crates.io"
  # rumqttd 0.20.0's own lockfile pins metrics 0.22.1, which current rustc refuses (E0521);
  # without the lockfile cargo takes a later 0.22.x that builds.
  cargo install --locked rumqttd --version "$RUMQTTD_VERSION" ||
    { log "the locked build failed; installing with newer compatible dependencies";
      cargo install rumqttd --version "$RUMQTTD_VERSION"; }
fi

# tern itself only when it is among the brokers measured.
case " $BROKERS " in
  *" tern "*) build_release tern tern-bench ;;
  *) build_release tern-bench ;;
esac

# One comparison at a time on this machine (runs from other worktrees included): two would share
# the ports and the cores, and each would measure the other.
exec 9>/tmp/tern-bench-compare.lock
if ! flock -n 9; then
  log "another compare.sh holds /tmp/tern-bench-compare.lock; waiting for it (up to 30 min)"
  flock -w 1800 9 || { log "gave up waiting for the lock"; exit 2; }
fi

# ---- brokers ---------------------------------------------------------------------------------
init_work

# port_of NAME [CELL]: the broker's plain port, or its TLS port for a tls_* cell (its mutual-TLS
# port for tls_mconns).
port_of() {
  case "$1:${2:-}" in
    tern:tls_mconns | tern-base:tls_mconns) echo 18843 ;; mosquitto:tls_mconns) echo 18844 ;;
    tern:tls_* | tern-base:tls_*) echo 18842 ;; mosquitto:tls_*) echo 18841 ;;
    tern:* | tern-base:*) echo 18832 ;; mosquitto:*) echo 18831 ;; rumqttd:*) echo 18833 ;; nats:*) echo 18835 ;;
  esac
}

# A throwaway CA and server certificate for 127.0.0.1, made for this run (never committed).
# The key is world-readable because mosquitto, started as root, drops to its own user.
make_tls() {
  local d="$WORK/tls"
  mkdir -p "$d" && chmod 755 "$WORK" "$d"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -keyout "$d/ca.key" -out "$d/ca.pem" -subj "/CN=tern bench CA" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$d/server.key" -out "$d/server.csr" -subj "/CN=localhost" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$d/ext.cnf"
  openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
    -out "$d/server.pem" -days 2 -extfile "$d/ext.cnf" 2>/dev/null
  # A client certificate for the mutual-TLS listeners (tls_mconns).
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$d/client.key" -out "$d/client.csr" -subj "/CN=tern-bench" 2>/dev/null
  printf 'extendedKeyUsage=clientAuth\n' >"$d/client-ext.cnf"
  openssl x509 -req -in "$d/client.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
    -out "$d/client.pem" -days 2 -extfile "$d/client-ext.cnf" 2>/dev/null
  chmod 644 "$d/server.key"
  # The brokers' configs plus a TLS listener each.
  { cat "$CONFIGS/tern.toml"
    printf '\n[[listener]]\nbind = "127.0.0.1:%s"\ntls_cert = "%s"\ntls_key = "%s"\n' \
      "$(port_of tern tls_)" "$d/server.pem" "$d/server.key"
    printf '\n[[listener]]\nbind = "127.0.0.1:%s"\ntls_cert = "%s"\ntls_key = "%s"\ntls_client_ca = "%s"\nrequire_client_cert = true\n' \
      "$(port_of tern tls_mconns)" "$d/server.pem" "$d/server.key" "$d/ca.pem"
  } >"$WORK/tern.toml"
  { cat "$CONFIGS/mosquitto.conf"
    printf '\nlistener %s 127.0.0.1\ncafile %s\ncertfile %s\nkeyfile %s\n' \
      "$(port_of mosquitto tls_)" "$d/ca.pem" "$d/server.pem" "$d/server.key"
    printf '\nlistener %s 127.0.0.1\ncafile %s\ncertfile %s\nkeyfile %s\nrequire_certificate true\n' \
      "$(port_of mosquitto tls_mconns)" "$d/ca.pem" "$d/server.pem" "$d/server.key"
  } >"$WORK/mosquitto.conf"
}
make_tls

version_of() {
  case $1 in
    tern | tern-base) "$(tern_bin "$1")" --version 2>/dev/null | head -1 ;;
    mosquitto) mosquitto -h 2>/dev/null | head -1 | sed 's/^mosquitto version /mosquitto /' ;;
    nats) nats-server --version 2>/dev/null | head -1 ;;
    rumqttd) echo "rumqttd $(rumqttd --version 2>/dev/null | awk '{print $2}')" ;;
  esac
}

launch_broker() {
  local name=$1 port=$2 logf=$3
  # Someone else's broker on our port would answer the readiness probe and take our load
  # (copies of this script in other worktrees use the same ports): wait for the port to be free.
  for _ in $(seq 600); do port_open "$port" || break; sleep 0.1; done
  if port_open "$port"; then
    log "port $port is held by another process for 60 s; is another compare.sh running?"
    return 1
  fi
  case $name in
    tern | tern-base)
      local bin
      bin=$(tern_bin "$name") || return 1
      rm -rf "$WORK/tern-data"
      "$bin" serve --config "$WORK/tern.toml" --data-dir "$WORK/tern-data" --log warn ${TERN_ARGS:-} >"$logf" 2>&1 &
      ;;
    mosquitto)
      mosquitto -c "$WORK/mosquitto.conf" >"$logf" 2>&1 &
      ;;
    nats)
      rm -rf "$WORK/nats-store" && mkdir -p "$WORK/nats-store"
      sed "s#STORE_DIR#$WORK/nats-store#" "$CONFIGS/nats-server.conf" >"$WORK/nats.conf"
      nats-server -c "$WORK/nats.conf" >"$logf" 2>&1 &
      ;;
    rumqttd)
      rumqttd -c "$CONFIGS/rumqttd.toml" >"$logf" 2>&1 &
      ;;
  esac
}

# ---- the matrix ------------------------------------------------------------------------------
# MQTT 3.1.1 everywhere (the one version all four speak), 64-byte payloads, one publisher and one
# subscriber on one topic unless the cell says otherwise.
cell_args() {
  case $1 in
    q0) echo "pubsub --qos 0 -n 500000" ;;
    q1w1) echo "pubsub --qos 1 --window 1 -n 30000" ;;
    q1w256) echo "pubsub --qos 1 --window 256 -n 300000" ;;
    q2w1) echo "pubsub --qos 2 --window 1 -n 15000" ;;
    q2w256) echo "pubsub --qos 2 --window 256 -n 150000" ;;
    fanout) echo "fanout --qos 0 --subscribers 1000 -n 500" ;;
    conns) echo "conns -n 10000 --first-source 127.0.1.1 --per-source 2500 --hold-s 2 --connect-concurrency 128" ;;
    # TLS (tern and mosquitto): QoS 1 window 256; connect rate and memory per idle connection.
    tls_q1w256) echo "pubsub --qos 1 --window 256 -n 300000 --tls-ca $WORK/tls/ca.pem" ;;
    tls_conns) echo "conns -n 5000 --first-source 127.0.1.1 --per-source 2500 --hold-s 2 --connect-concurrency 128 --tls-ca $WORK/tls/ca.pem" ;;
    tls_mconns) echo "conns -n 5000 --first-source 127.0.1.1 --per-source 2500 --hold-s 2 --connect-concurrency 128 --tls-ca $WORK/tls/ca.pem --tls-cert $WORK/tls/client.pem --tls-key $WORK/tls/client.key" ;;
  esac
}

supports() {
  # nats-server's MQTT has no QoS 2; the TLS cells compare tern and mosquitto only.
  case "$1:$2" in nats:q2* | nats:tls_* | rumqttd:tls_*) return 1 ;; esac
  return 0
}

mkdir -p "$RESULTS"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT="$RESULTS/compare-$STAMP.jsonl"
: >"$OUT"
log "results: $OUT"
for name in $BROKERS; do
  printf '{"type":"broker","broker":"%s","version":"%s","port":%s}\n' \
    "$name" "$(version_of "$name")" "$(port_of "$name")" >>"$OUT"
done
printf '{"type":"machine","cpus":%s,"kernel":"%s","repeats":%s,"started":"%s","loadavg_start":"%s"}\n' \
  "$(nproc)" "$(uname -r)" "$REPEATS" "$STAMP" "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT"

# Every cell gets a freshly started broker: no cell inherits another's memory or connection
# backlog (rumqttd 0.20 stopped accepting after the 1,000-subscriber fan-out in one trial run),
# and repetitions interleave the brokers so that load drifting on a shared machine hits all alike.
for rep in $(seq "$REPEATS"); do
  for name in $BROKERS; do
    log "repetition $rep/$REPEATS: $name"
    for cell in $CELLS; do
      supports "$name" "$cell" || continue
      # A cell that could not run (exit 2: connection reset or closed mid-run, seen a few times
      # while other heavy socket work shared the VM) is retried with a fresh broker, at most
      # RETRIES times; the failed attempts stay in the results as type "attempt".
      for attempt in $(seq 0 "$RETRIES"); do
        if ! start_broker "$name"; then
          report=null code=2
        else
          run_cell "$name" "$cell" 180
          stop_broker
        fi
        [ -n "$report" ] || report=null
        if [ "$code" = 2 ] && [ "$attempt" -lt "$RETRIES" ]; then
          log "  $cell: attempt $((attempt + 1)) could not run: $(tr '\n' ' ' <"$WORK/err" | cut -c1-200); retrying"
          tail -5 "$WORK/$name.log" 2>/dev/null | sed 's/^/    broker log: /' >&2 || true
          printf '{"type":"attempt","broker":"%s","cell":"%s","rep":%s,"exit":%s,"error":"%s"}\n' \
            "$name" "$cell" "$rep" "$code" "$(tr '\n"\\' '   ' <"$WORK/err" | cut -c1-300)" >>"$OUT"
          continue
        fi
        printf '{"type":"run","broker":"%s","cell":"%s","rep":%s,"exit":%s,"report":%s}\n' \
          "$name" "$cell" "$rep" "$code" "$report" >>"$OUT"
        if [ "$code" != 0 ]; then
          log "  $cell: exit $code $(tr '\n' ' ' <"$WORK/err" | cut -c1-300)"
        else
          log "  $cell: ok"
        fi
        break
      done
    done
  done
done

printf '{"type":"machine_end","loadavg_end":"%s","ended":"%s"}\n' \
  "$(cut -d' ' -f1-3 /proc/loadavg)" "$(date -u +%Y%m%dT%H%M%SZ)" >>"$OUT"

[ -n "${NO_REPORT:-}" ] && exit 0

# ---- report and chart ------------------------------------------------------------------------
PY="$BENCH/.venv/bin/python"
if [ ! -x "$PY" ] || ! "$PY" -c 'import matplotlib' 2>/dev/null; then
  log "creating bench/.venv with matplotlib"
  python3 -m venv "$BENCH/.venv"
  "$BENCH/.venv/bin/pip" install -q matplotlib
fi
"$PY" "$BENCH/report.py" "$OUT" --benchmarks "$ROOT/BENCHMARKS.md" --chart "$BENCH/chart.svg"
log "done: BENCHMARKS.md and bench/chart.svg updated"
