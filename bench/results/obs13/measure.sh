#!/bin/bash
# Observability's cost: base (b08aa84, before metrics/access log/tracing) vs new (default: all on)
# vs new with access_log_sample 0; interleaved, two rounds.
cd "$(dirname "$0")"; mkdir -p out
CMP="--compare http://127.0.0.1:19590 --mock-stats http://127.0.0.1:19590 --duration 10s --warmup 1s"
for round in 1 2; do
  for v in base:gw.yaml new:gw.yaml new:gw-nolog.yaml; do
    b=${v%%:*}; c=${v##*:}; tag=$b-${c%.yaml}
    ./run.sh ./$b $c out/$tag-c1-r$round.txt -- $CMP --concurrency 1
    ./run.sh ./$b $c out/$tag-cpu64-r$round.txt -- --mock-stats http://127.0.0.1:19590 --duration 10s --warmup 0s --concurrency 64
  done
done
