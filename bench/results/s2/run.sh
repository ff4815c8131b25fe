#!/bin/bash
# usage: run.sh BIN CONFIG OUT -- bench args...   (BENCH: the oncegate binary whose bench tool runs; /tmp/bm/new)
bin=$1; cfg=$2; out=$3; shift 4
pkill -f "oncegate-gw-under-test" 2>/dev/null; sleep 0.3
dd=$(mktemp -d)
exec -a oncegate-gw-under-test $bin serve --config $cfg --data-dir $dd --pprof 127.0.0.1:16160 > $dd/log 2>&1 &
gwpid=$!
for i in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:18580/readyz && break; sleep 0.1; done
rss0=$(grep VmRSS /proc/$gwpid/status | awk '{print $2}')
t0=$(awk '{print $14+$15}' /proc/$gwpid/stat)
{ echo "\$ oncegate bench --url http://127.0.0.1:18580 $*"; echo "uptime before: $(uptime)"; ${BENCH:-/tmp/bm/new} bench --url http://127.0.0.1:18580 "$@"; echo "uptime after: $(uptime)"; } > $out 2>&1
t1=$(awk '{print $14+$15}' /proc/$gwpid/stat)
rss1=$(grep VmRSS /proc/$gwpid/status | awk '{print $2}')
echo "gateway pid $gwpid ($bin): cpu ticks $t0 -> $t1 (delta $((t1-t0)), CLK_TCK 100), VmRSS kB $rss0 -> $rss1" >> $out
kill $gwpid; wait $gwpid 2>/dev/null; rm -rf $dd
