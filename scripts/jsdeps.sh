#!/usr/bin/env bash
# JavaScript dependencies of the browser test (crates/server/tests/browser.rs): npm's `mqtt`
# (MQTT.js) in a directory of its own, installed when missing.
#
# Usage: scripts/jsdeps.sh
#   The directory is $TERN_JS_DEPS (default: <repo>/.venv/js, gitignored). On success the last
#   line of stdout is the path of mqtt.min.js (the browser bundle); exits non-zero, naming what
#   is missing, otherwise. Concurrent callers are serialised by a lock file.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${TERN_JS_DEPS:-$ROOT/.venv/js}"
BUNDLE="$DIR/node_modules/mqtt/dist/mqtt.min.js"

if [ ! -f "$BUNDLE" ]; then
  command -v npm >/dev/null || { echo "jsdeps: npm not found (apt-get install npm)" >&2; exit 1; }
  mkdir -p "$DIR"
  exec 9>"$DIR.lock"
  flock -w 600 9 || { echo "jsdeps: timed out waiting for $DIR.lock" >&2; exit 1; }
  if [ ! -f "$BUNDLE" ]; then
    echo "jsdeps: installing mqtt (MQTT.js) into $DIR" >&2
    npm install --prefix "$DIR" --no-audit --no-fund --loglevel=error mqtt@5 >&2
  fi
fi
[ -f "$BUNDLE" ] || { echo "jsdeps: $BUNDLE missing after npm install" >&2; exit 1; }
echo "$BUNDLE"
