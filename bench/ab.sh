#!/usr/bin/env bash
# bench/ab.sh BIN PORT ARGS... : starts broker BIN on 127.0.0.1:PORT with a fresh data dir, runs
# `tern bench pubsub ARGS` against it (the generator: $TERN_BENCH_BIN, default the BIN itself),
# prints "delivered_per_s lost", and kills the broker. For before/after comparisons of two
# builds in alternating runs, e.g.:
#   for r in 1 2 3; do for b in /tmp/tern-old target/release/tern; do
#     echo "$b $(bench/ab.sh $b 18900 --qos 2 --window 256 -n 150000)"; done; done
set -u
BIN=$1; PORT=$2; shift 2
GEN=${TERN_BENCH_BIN:-$BIN}
D=$(mktemp -d)
$BIN serve --bind 127.0.0.1:$PORT --data-dir $D > $D/out 2>$D/err &
P=$!
for i in $(seq 50); do grep -q listening $D/out 2>/dev/null && break; sleep 0.1; done
"$GEN" bench pubsub -p $PORT -q --json "$@" 2>/dev/null | python3 -c "import sys,json; d=json.load(sys.stdin); print(int(d['delivered_per_s']), d['counts']['lost'])"
kill -9 $P 2>/dev/null; wait $P 2>/dev/null; rm -rf $D
