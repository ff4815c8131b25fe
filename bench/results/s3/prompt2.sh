#!/bin/bash
here=$(cd "$(dirname "$0")" && pwd)   # this directory (bench/results/s3)
# interleaved: base (5cd8a55) vs final, per prompt size, two rounds
export BENCH=/tmp/s3/new6
for round in 1 2; do
for pb in 0 16384 65536; do
  for tag in base final; do
    bin=/tmp/bm/cur; [ $tag = final ] && bin=/tmp/s3/new6
    "$here"/../s2/run.sh $bin /tmp/bm/b.yaml /tmp/s3/p2-$pb-$tag-$round.txt -- --compare http://127.0.0.1:19590 --mock-stats http://127.0.0.1:19590 --duration 8s --warmup 1s --concurrency 8 --prompt-bytes $pb
    "$here"/../s2/run.sh $bin /tmp/bm/b.yaml /tmp/s3/p2cpu-$pb-$tag-$round.txt -- --mock-stats http://127.0.0.1:19590 --duration 8s --warmup 0s --concurrency 8 --prompt-bytes $pb
  done
done
done
touch /tmp/s3/prompt2.done
