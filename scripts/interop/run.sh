#!/usr/bin/env bash
# Interoperability check: drives a real `tern` broker with mosquitto-clients (Debian) and the
# Eclipse paho-mqtt 2.x Python client (PyPI, in a virtualenv), MQTT 3.1.1 and 5.0: QoS 0/1/2,
# retained set/clear, will on abnormal close, v5 properties.
#
# Usage: scripts/interop/run.sh [PATH_TO_TERN_BINARY]
#   Without an argument the binary is built with `cargo build -p tern` (honours
#   CARGO_TARGET_DIR). Installs mosquitto-clients with apt-get when `mosquitto_pub` is missing
#   and has scripts/pydeps.sh create the venv at $TERN_INTEROP_VENV (default:
#   <repo>/.venv/interop, gitignored) with paho-mqtt 2.x.
# Prints one PASS/FAIL line per check and `N passed, M failed`; exits non-zero on any failure.
# Every wait is bounded (`timeout`); the broker is killed on exit.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/scripts/interop"
VENV="${TERN_INTEROP_VENV:-$ROOT/.venv/interop}"
HOST=127.0.0.1
WAIT_S=10

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "PASS $1"; }
fail() { failed=$((failed + 1)); echo "FAIL $1${2:+: $2}"; }

# --- tools -------------------------------------------------------------------------------
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
if ! command -v mosquitto_pub >/dev/null || ! command -v mosquitto_sub >/dev/null; then
  echo "installing mosquitto-clients"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto-clients >/dev/null
fi
# The venv with paho-mqtt 2.x (shared with the crash test): scripts/pydeps.sh creates it.
PY="$(TERN_INTEROP_VENV="$VENV" bash "$ROOT/scripts/pydeps.sh" | tail -1)"

# --- broker ------------------------------------------------------------------------------
BIN="${1:-}"
if [ -z "$BIN" ]; then
  (cd "$ROOT" && cargo build -q -p tern)
  TARGET="${CARGO_TARGET_DIR:-target}"
  case "$TARGET" in /*) ;; *) TARGET="$ROOT/$TARGET" ;; esac
  BIN="$TARGET/debug/tern"
fi
[ -x "$BIN" ] || { echo "no tern binary at $BIN"; exit 1; }

WORK="$(mktemp -d)"
BROKER_PID=""
cleanup() {
  if [ -n "$BROKER_PID" ] && kill -0 "$BROKER_PID" 2>/dev/null; then
    kill "$BROKER_PID" 2>/dev/null || true
    timeout 10 tail --pid="$BROKER_PID" -f /dev/null 2>/dev/null || kill -9 "$BROKER_PID" 2>/dev/null || true
  fi
  # Background clients of a failed check.
  jobs -p | xargs -r kill 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

printf '[sys]\ninterval_s = 0\n' >"$WORK/tern.toml"
"$BIN" serve --bind "$HOST:0" --config "$WORK/tern.toml" --data-dir "$WORK/data" \
  >"$WORK/broker.out" 2>"$WORK/broker.err" &
BROKER_PID=$!
wait_for() { # FILE PATTERN SECONDS
  local i=0
  while ! grep -q -- "$2" "$1" 2>/dev/null; do
    i=$((i + 1))
    [ "$i" -le $(($3 * 10)) ] || return 1
    sleep 0.1
  done
}
if ! wait_for "$WORK/broker.out" "tern listening on" 30; then
  echo "broker did not start"; cat "$WORK/broker.err"; exit 1
fi
PORT="$(sed -n 's/^tern listening on .*:\([0-9]*\)$/\1/p' "$WORK/broker.out" | head -1)"
echo "tern on $HOST:$PORT ($BIN)"

# --- mosquitto-clients ---------------------------------------------------------------------
SUB_PID=""
# start_sub OUTFILE ARGS...: a mosquitto_sub in the background; returns once it has its SUBACK.
start_sub() {
  local out="$1"; shift
  # stdbuf: stdout is a file, and the SUBACK line must show up before the sub exits.
  timeout $((WAIT_S + 5)) stdbuf -oL mosquitto_sub -h "$HOST" -p "$PORT" -d -W "$WAIT_S" "$@" >"$out" 2>&1 &
  SUB_PID=$!
  wait_for "$out" "received SUBACK" "$WAIT_S"
}
end_sub() { wait "$SUB_PID" 2>/dev/null || true; }
mpub() { timeout "$WAIT_S" mosquitto_pub -h "$HOST" -p "$PORT" "$@"; }
# expect_line NAME FILE LINE
expect_line() {
  if grep -qxF -- "$3" "$2"; then pass "$1"; else fail "$1" "wanted '$3', got: $(grep '^MSG|' "$2" | tr '\n' ' ')"; fi
}

for V in 311 5; do
  # QoS 0/1/2 round trips; the subscriber asks for QoS 2 so the delivery keeps the publish QoS.
  for Q in 0 1 2; do
    T="interop/mq/v$V/q$Q"
    out="$WORK/sub-$V-$Q"
    if start_sub "$out" -V "$V" -q 2 -t "$T" -C 1 -F 'MSG|%t|%q|%r|%p'; then
      mpub -V "$V" -q "$Q" -t "$T" -m "hello-$V-$Q" || true
      end_sub
      expect_line "mosquitto v$V qos $Q" "$out" "MSG|$T|$Q|0|hello-$V-$Q"
    else
      end_sub; fail "mosquitto v$V qos $Q" "no SUBACK"
    fi
  done

  # Retained: set, read back with RETAIN 1, clear, read back nothing.
  T="interop/mq/v$V/retained"
  mpub -V "$V" -q 1 -r -t "$T" -m "kept-$V" || true
  out="$WORK/ret-$V"
  timeout $((WAIT_S + 5)) mosquitto_sub -h "$HOST" -p "$PORT" -V "$V" -q 1 -t "$T" -C 1 -W "$WAIT_S" \
    -F 'MSG|%t|%q|%r|%p' >"$out" 2>&1 || true
  expect_line "mosquitto v$V retained" "$out" "MSG|$T|1|1|kept-$V"
  mpub -V "$V" -q 1 -r -n -t "$T" || true
  out="$WORK/ret-clear-$V"
  timeout $((WAIT_S + 5)) mosquitto_sub -h "$HOST" -p "$PORT" -V "$V" -q 1 -t "$T" -C 1 -W 1 \
    -F 'MSG|%t|%q|%r|%p' >"$out" 2>&1 || true
  if grep -q '^MSG|' "$out"; then fail "mosquitto v$V retained cleared" "$(cat "$out")"; else pass "mosquitto v$V retained cleared"; fi

  # Will: a client with a will is killed (no DISCONNECT); the will reaches a subscriber.
  T="interop/mq/v$V/will"
  out="$WORK/will-$V"
  if start_sub "$out" -V "$V" -q 1 -t "$T" -C 1 -F 'MSG|%t|%q|%r|%p'; then
    wl="$WORK/willer-$V"
    # No `timeout` wrapper: $! must be mosquitto_sub itself (stdbuf execs it) for the kill -9;
    # -W bounds it if the kill never comes.
    stdbuf -oL mosquitto_sub -h "$HOST" -p "$PORT" -d -W $((WAIT_S * 3)) -V "$V" -t "interop/mq/idle" \
      --will-topic "$T" --will-payload "bye-$V" --will-qos 1 >"$wl" 2>&1 &
    WILLER=$!
    if wait_for "$wl" "received SUBACK" "$WAIT_S"; then
      kill -9 "$WILLER" 2>/dev/null || true
      wait "$WILLER" 2>/dev/null || true
    fi
    end_sub
    expect_line "mosquitto v$V will on abnormal close" "$out" "MSG|$T|1|0|bye-$V"
  else
    end_sub; fail "mosquitto v$V will on abnormal close" "no SUBACK"
  fi

  # No will after a normal DISCONNECT (mosquitto_pub disconnects cleanly).
  T="interop/mq/v$V/nowill"
  out="$WORK/nowill-$V"
  if start_sub "$out" -V "$V" -q 1 -t "$T" -C 1 -F 'MSG|%t|%q|%r|%p'; then
    mpub -V "$V" -t "interop/mq/other" -m x --will-topic "$T" --will-payload "bad" || true
    mpub -V "$V" -q 1 -t "$T" -m "marker" || true
    end_sub
    expect_line "mosquitto v$V no will after DISCONNECT" "$out" "MSG|$T|1|0|marker"
  else
    end_sub; fail "mosquitto v$V no will after DISCONNECT" "no SUBACK"
  fi
done

# v5 properties: user property, content type, response topic, correlation data, message
# expiry, payload format indicator; subscription identifier on the subscriber side.
T="interop/mq/v5/props"
out="$WORK/props"
if start_sub "$out" -V 5 -q 1 -t "$T" -C 1 -D subscribe subscription-identifier 7 \
  -F 'MSG|%t|%C|%R|%D|%P|%F|%S|%p'; then
  mpub -V 5 -q 1 -t "$T" -m '{"v":1}' \
    -D publish user-property color blue \
    -D publish content-type application/json \
    -D publish response-topic interop/reply \
    -D publish correlation-data corr-42 \
    -D publish message-expiry-interval 60 \
    -D publish payload-format-indicator 1 || true
  end_sub
  expect_line "mosquitto v5 properties forwarded" "$out" \
    'MSG|interop/mq/v5/props|application/json|interop/reply|corr-42|color:blue|1|7|{"v":1}'
else
  end_sub; fail "mosquitto v5 properties forwarded" "no SUBACK"
fi
T="interop/mq/v5/expiry"
out="$WORK/expiry"
if start_sub "$out" -V 5 -q 1 -t "$T" -C 1 -F 'MSG|%E'; then
  mpub -V 5 -q 1 -t "$T" -m x -D publish message-expiry-interval 60 || true
  end_sub
  e="$(sed -n 's/^MSG|//p' "$out" | head -1)"
  if [ -n "$e" ] && [ "$e" -gt 0 ] && [ "$e" -le 60 ]; then pass "mosquitto v5 message expiry forwarded"; else fail "mosquitto v5 message expiry forwarded" "got '$e'"; fi
else
  end_sub; fail "mosquitto v5 message expiry forwarded" "no SUBACK"
fi

# v5 will with will properties (content type, user property), the willing client killed.
T="interop/mq/v5/willprops"
out="$WORK/willprops"
if start_sub "$out" -V 5 -q 1 -t "$T" -C 1 -F 'MSG|%t|%C|%P|%p'; then
  wl="$WORK/willer-props"
  stdbuf -oL mosquitto_sub -h "$HOST" -p "$PORT" -d -W $((WAIT_S * 3)) -V 5 -t "interop/mq/idle" \
    --will-topic "$T" --will-payload "gone" --will-qos 1 \
    -D will content-type text/plain -D will user-property why crash >"$wl" 2>&1 &
  WILLER=$!
  if wait_for "$wl" "received SUBACK" "$WAIT_S"; then
    kill -9 "$WILLER" 2>/dev/null || true
    wait "$WILLER" 2>/dev/null || true
  fi
  end_sub
  expect_line "mosquitto v5 will properties forwarded" "$out" "MSG|$T|text/plain|why:crash|gone"
else
  end_sub; fail "mosquitto v5 will properties forwarded" "no SUBACK"
fi

# Cross-version: a v5 publisher with properties, a 3.1.1 subscriber.
T="interop/mq/cross"
out="$WORK/cross"
if start_sub "$out" -V 311 -q 2 -t "$T" -C 1 -F 'MSG|%t|%q|%r|%p'; then
  mpub -V 5 -q 2 -t "$T" -m cross -D publish user-property k v || true
  end_sub
  expect_line "mosquitto v5 publisher to v3.1.1 subscriber" "$out" "MSG|$T|2|0|cross"
else
  end_sub; fail "mosquitto v5 publisher to v3.1.1 subscriber" "no SUBACK"
fi

# --- paho-mqtt -----------------------------------------------------------------------------
paho_out="$WORK/paho"
timeout 180 "$PY" "$HERE/paho_check.py" "$HOST" "$PORT" >"$paho_out" 2>&1 || true
cat "$paho_out"
p_pass="$(grep -c '^PASS ' "$paho_out" || true)"
p_fail="$(grep -c '^FAIL ' "$paho_out" || true)"
passed=$((passed + p_pass))
failed=$((failed + p_fail))
if [ "$p_pass" -eq 0 ] && [ "$p_fail" -eq 0 ]; then
  fail "paho_check.py" "ran no check: $(tail -5 "$paho_out")"
fi

if ! kill -0 "$BROKER_PID" 2>/dev/null; then
  fail "broker still running after the checks" "$(tail -20 "$WORK/broker.err")"
fi

echo "interop: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
