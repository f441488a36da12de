#!/usr/bin/env bash
# Debian packages the tests use, installed when missing: mosquitto-clients (mosquitto_pub,
# mosquitto_sub) and mosquitto (mosquitto_passwd, which makes the `$6$` / `$7$` password files
# of crates/server/tests/auth.rs and acl.rs), chromium and npm (crates/server/tests/browser.rs,
# dashboard.rs and src/http/cluster_tests/browser.rs;
# with MQTT.js from scripts/jsdeps.sh), and make (jemalloc, the `tern` binary's allocator, is
# built from C by tikv-jemalloc-sys with cc and make). Run by .ci/run before any cargo build.
set -euo pipefail
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
missing=()
command -v mosquitto_pub >/dev/null && command -v mosquitto_sub >/dev/null || missing+=(mosquitto-clients)
command -v mosquitto_passwd >/dev/null || missing+=(mosquitto)
command -v chromium >/dev/null || missing+=(chromium)
command -v npm >/dev/null || missing+=(npm)
command -v make >/dev/null || missing+=(make)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "debdeps: installing ${missing[*]}" >&2
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
