#!/bin/bash
# usage: rss.sh BIN CONFIG TAG [extra env...]
bin=$1; cfg=$2; tag=$3
pkill -f oncegate-gw-under-test 2>/dev/null; sleep 0.3
dd=$(mktemp -d)
exec -a oncegate-gw-under-test $bin serve --config $cfg --data-dir $dd --pprof 127.0.0.1:16160 > $dd/log 2>&1 &
gwpid=$!
for i in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:18580/readyz && break; sleep 0.1; done
/tmp/bm/cur bench --url http://127.0.0.1:18580 --mock-stats http://127.0.0.1:19590 --duration 60s --warmup 1s --concurrency 64 > /tmp/s3/rss-$tag.txt 2>&1
grep VmRSS /proc/$gwpid/status >> /tmp/s3/rss-$tag.txt
curl -s -o /tmp/s3/heap-$tag.prof http://127.0.0.1:16160/debug/pprof/heap
curl -s 'http://127.0.0.1:16160/debug/pprof/heap?debug=1' | grep -E '^# (HeapAlloc|HeapSys|HeapInuse|HeapIdle|HeapReleased|Sys|NextGC|Stack|MSpan|GCSys|OtherSys)' >> /tmp/s3/rss-$tag.txt
sleep 5; echo "after 5 s idle:" >> /tmp/s3/rss-$tag.txt; grep VmRSS /proc/$gwpid/status >> /tmp/s3/rss-$tag.txt
kill $gwpid; wait $gwpid 2>/dev/null; rm -rf $dd
