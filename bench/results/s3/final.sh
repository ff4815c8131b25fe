#!/bin/bash
here=$(cd "$(dirname "$0")" && pwd)   # this directory (bench/results/s3)
# Round-3 before/after: session-start binary (cur, 5cd8a55) vs new2 (3545395)
cd /tmp/s3
for b in cur new2; do
  bin=/tmp/bm/cur; [ $b = new2 ] && bin=/tmp/s3/new2
  /tmp/s3/rss.sh $bin /tmp/bm/a.yaml $b-a
done
for b in cur new2; do
  bin=/tmp/bm/cur; [ $b = new2 ] && bin=/tmp/s3/new2
  "$here"/../s2/run.sh $bin /tmp/bm/b.yaml /tmp/s3/ov-c64-b-$b.txt -- --compare http://127.0.0.1:19590 --mock-stats http://127.0.0.1:19590 --duration 10s --warmup 1s --concurrency 64
done
for b in cur new2; do
  bin=/tmp/bm/cur; [ $b = new2 ] && bin=/tmp/s3/new2
  "$here"/../s2/run.sh $bin /tmp/bm/b.yaml /tmp/s3/cpu-c64-b-$b.txt -- --mock-stats http://127.0.0.1:19590 --duration 10s --warmup 0s --concurrency 64
done
touch /tmp/s3/final.done
