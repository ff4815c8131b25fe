#!/bin/bash
# heapprof.sh BIN CFG TAG SECS [bench args...]: c=64 load for SECS, then a heap profile (in use), memstats and RSS
bin=$1; cfg=$2; tag=$3; secs=$4; shift 4
dd=$(mktemp -d)
taskset -c 1 $bin mock -listen 127.0.0.1:19590 > /dev/null 2>&1 & mp=$!
taskset -c 1 $bin serve --config $cfg --data-dir $dd --pprof 127.0.0.1:16160 > $dd/log 2>&1 & gp=$!
for i in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:18580/readyz && break; sleep 0.1; done
taskset -c 0 $bin bench --url http://127.0.0.1:18580 --mock-stats http://127.0.0.1:19590 --duration $((secs+5))s --warmup 0s --concurrency 64 "$@" > /work/scratch/heap-$tag-bench.txt 2>&1 &
bp=$!
sleep $secs
curl -s -o /work/scratch/heap-$tag.pprof "http://127.0.0.1:16160/debug/pprof/heap?gc=1"
curl -s "http://127.0.0.1:16160/debug/pprof/heap?debug=1" | grep -E "^# (HeapAlloc|HeapSys|HeapInuse|HeapIdle|HeapReleased|Sys|NumGC|StackInuse|GCSys|OtherSys|MSpanInuse)" > /work/scratch/heap-$tag-memstats.txt
grep -E "VmHWM|VmRSS|RssAnon|RssFile" /proc/$gp/status >> /work/scratch/heap-$tag-memstats.txt
du -sh $dd >> /work/scratch/heap-$tag-memstats.txt
wait $bp
kill $gp $mp; wait $gp $mp 2>/dev/null; rm -rf $dd
go tool pprof -sample_index=inuse_space -top -nodecount=40 /work/scratch/heap-$tag.pprof 2>/dev/null > /work/scratch/heap-$tag-top.txt
go tool pprof -sample_index=inuse_space -top -cum -nodecount=80 /work/scratch/heap-$tag.pprof 2>/dev/null > /work/scratch/heap-$tag-cum.txt
grep requests/s /work/scratch/heap-$tag-bench.txt
