#!/bin/bash
# c1.sh BIN CONFIG TAG: c=1 non-stream compare run
bin=$1; cfg=$2; tag=$3
pkill -f oncegate-gw-under-test 2>/dev/null; sleep 0.3
dd=$(mktemp -d)
exec -a oncegate-gw-under-test $bin serve --config $cfg --data-dir $dd > $dd/log 2>&1 &
gwpid=$!
for i in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:18580/readyz && break; sleep 0.1; done
/tmp/bm/cur bench --url http://127.0.0.1:18580 --compare http://127.0.0.1:19590 --mock-stats http://127.0.0.1:19590 --duration 8s --warmup 1s --concurrency 1 $EXTRA > /tmp/s3/$tag.txt 2>&1
kill $gwpid; wait $gwpid 2>/dev/null; rm -rf $dd
grep -E '^latency p50|^latency p99 |^requests/s' /tmp/s3/$tag.txt | sed "s/^/$tag /"
