#!/bin/bash
# growth.sh BIN CONFIG TAG SECONDS: live heap (after a forced GC) and RSS every 30 s under c=64 load
bin=$1; cfg=$2; tag=$3; secs=$4
pkill -f oncegate-gw-under-test 2>/dev/null; sleep 0.3
dd=$(mktemp -d)
exec -a oncegate-gw-under-test $bin serve --config $cfg --data-dir $dd --pprof 127.0.0.1:16160 > $dd/log 2>&1 &
gwpid=$!
for i in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:18580/readyz && break; sleep 0.1; done
out=/tmp/s3/growth-$tag.txt; : > $out
/tmp/bm/cur bench --url http://127.0.0.1:18580 --duration ${secs}s --warmup 0s --concurrency 64 --max-requests 10000000 > /tmp/s3/growth-$tag-bench.txt 2>&1 &
bp=$!
for i in $(seq $((secs/30))); do
  sleep 30
  live=$(curl -s 'http://127.0.0.1:16160/debug/pprof/heap?gc=1&debug=1' | grep -E '^# HeapAlloc' | awk '{print $4}')
  rss=$(grep VmRSS /proc/$gwpid/status | awk '{print $2}')
  reqs=$(curl -s http://127.0.0.1:19590/stats)
  echo "t=$((i*30))s live_heap=$live rss_kB=$rss mock=$reqs" >> $out
done
wait $bp
curl -s -o /tmp/s3/growth-$tag-heap.prof 'http://127.0.0.1:16160/debug/pprof/heap?gc=1'
kill $gwpid; wait $gwpid 2>/dev/null; rm -rf $dd
