#!/bin/bash
# usage: run.sh BIN CONFIG OUT -- bench args...  (the gateway's CPU ticks and RSS around one bench run)
bin=$1; cfg=$2; out=$3; shift 4
pkill -f "oncegate-gw-under-test" 2>/dev/null; sleep 0.3
dd=$(mktemp -d)
(exec -a oncegate-gw-under-test $bin serve --config $cfg --data-dir $dd > $dd/log 2>&1) &
gwpid=$!
sleep 0.2; gwpid=$(pgrep -f oncegate-gw-under-test | head -1)
for i in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:18580/readyz && break; sleep 0.1; done
t0=$(awk '{print $14+$15}' /proc/$gwpid/stat)
{ echo "\$ oncegate bench --url http://127.0.0.1:18580 $*"; echo "uptime before: $(uptime)"; ${BENCH:-./new} bench --url http://127.0.0.1:18580 "$@"; echo "uptime after: $(uptime)"; } > $out 2>&1
t1=$(awk '{print $14+$15}' /proc/$gwpid/stat)
echo "gateway pid $gwpid ($bin $cfg): cpu ticks $t0 -> $t1 (delta $((t1-t0)), CLK_TCK 100), log lines $(wc -l < $dd/log)" >> $out
kill $gwpid; wait $gwpid 2>/dev/null; rm -rf $dd
