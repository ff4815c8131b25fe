#!/bin/bash
# Interleaved measurements of two gateway binaries (round 2: base = session start cff81e9 in
# /tmp/bm/base, new = HEAD in /tmp/bm/new). BASE_BIN, NEW_BIN, OUT and RUN override the paths.
BASE_BIN=${BASE_BIN:-/tmp/bm/base} NEW_BIN=${NEW_BIN:-/tmp/bm/new} OUT=${OUT:-/tmp/bm/out} RUN=${RUN:-$(dirname "$0")/run.sh}
bin() { if [ "$1" = base ]; then echo "$BASE_BIN"; else echo "$NEW_BIN"; fi; }
M="--mock-stats http://127.0.0.1:19590"
CMP="--compare http://127.0.0.1:19590 $M --duration 10s --warmup 1s"
run() { # name cfg args...
  local name=$1 cfg=$2; shift 2
  for b in base new; do
    $RUN $(bin $b) /tmp/bm/$cfg.yaml $OUT/$name-$cfg-$b.txt -- "$@"
  done
}
for cfg in a b; do
  run ov-c1 $cfg $CMP --concurrency 1
  run ov-c64 $cfg $CMP --concurrency 64
  run cpu-c1 $cfg $M --duration 10s --warmup 0s --concurrency 1
  run cpu-c64 $cfg $M --duration 10s --warmup 0s --concurrency 64
  run stream-paced-c64 $cfg $CMP --stream --concurrency 64 --mock-itl 10 --mock-tokens 16
done
run replay-c64 a $CMP --scenario replay --keys-pool 100 --concurrency 64
run dup-k50 a $CMP --scenario duplicates --copies 50
run retry-storm a $CMP --scenario retry-storm --mock-ttft 300 --client-timeout 100ms --concurrency 16
run fanout-1000 a $M --duration 10s --warmup 1s --scenario fanout --subscribers 1000 --concurrency 1
run rss-60s-c64 a $M --duration 60s --warmup 1s --concurrency 64
echo ALLDONE
