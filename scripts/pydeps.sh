#!/usr/bin/env bash
# Python dependencies of the tests: a virtualenv with paho-mqtt 2.x, created when missing.
# Used by scripts/interop/run.sh, by the crash test (crates/server/tests/crash_exactly_once.rs)
# and by .ci/run, so that a fresh machine needs nothing but python3 (with venv) and a
# reachable package index.
#
# Usage: scripts/pydeps.sh
#   The venv is $TERN_INTEROP_VENV (default: <repo>/.venv/interop, gitignored). On success the
#   last line of stdout is the path of its python interpreter; exits non-zero, naming what is
#   missing, when it cannot provide paho-mqtt 2.x. Concurrent callers are serialised by a lock
#   file beside the venv, so two test processes never build it at the same time.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TERN_INTEROP_VENV:-$ROOT/.venv/interop}"
PY="$VENV/bin/python"

have_paho() {
  [ -x "$PY" ] && "$PY" -c 'import paho.mqtt, sys; sys.exit(0 if paho.mqtt.__version__.startswith("2.") else 1)' 2>/dev/null
}

if ! have_paho; then
  command -v python3 >/dev/null || { echo "pydeps: python3 not found (needed for paho-mqtt)" >&2; exit 1; }
  mkdir -p "$(dirname "$VENV")"
  exec 9>"$VENV.lock"
  # Bounded: a stuck holder must not hang the caller forever.
  flock -w 600 9 || { echo "pydeps: timed out waiting for $VENV.lock" >&2; exit 1; }
  if ! have_paho; then
    if [ ! -x "$PY" ]; then
      echo "pydeps: creating venv $VENV" >&2
      python3 -m venv "$VENV" >&2 || {
        echo "pydeps: 'python3 -m venv' failed (Debian/Ubuntu: apt-get install python3-venv)" >&2
        exit 1
      }
    fi
    echo "pydeps: installing paho-mqtt 2.x into $VENV" >&2
    timeout 300 "$VENV/bin/pip" install -q --disable-pip-version-check 'paho-mqtt>=2,<3' >&2 || {
      echo "pydeps: 'pip install paho-mqtt>=2,<3' failed (is a package index reachable?)" >&2
      exit 1
    }
    have_paho || { echo "pydeps: paho-mqtt 2.x still not importable from $PY" >&2; exit 1; }
  fi
fi
echo "$PY"
