OG=/tmp/og
routes="nats://127.0.0.1:16221,nats://127.0.0.1:16222,nats://127.0.0.1:16223"
pids=()
for i in 1 2 3; do
  $OG serve --listen 127.0.0.1:1858$i --data-dir /tmp/prof/n$i --nats-listen 127.0.0.1:1422$i --nats-cluster oncegate --nats-cluster-listen 127.0.0.1:1622$i --nats-routes $routes > /tmp/prof/n$i.log 2>&1 &
  pids+=($!)
done
for i in 1 2 3; do until curl -sf http://127.0.0.1:1858$i/readyz >/dev/null; do sleep 0.5; done; done
$OG bench --url http://127.0.0.1:18581 --concurrency 4 --duration 3s --warmup 0s > /dev/null 2>&1
sleep 45
ticks() { local t=0; for p in "${pids[@]}"; do set -- $(cut -d' ' -f14,15 /proc/$p/stat); t=$((t + $1 + $2)); done; echo $t; }
t0=$(ticks); sleep 60; t1=$(ticks)
echo "idle CPU of three nodes over 60 s: $((t1 - t0)) ticks = $(( (t1 - t0) * 10 )) ms, $(( (t1 - t0) * 10 / 60 )) ms per second"
kill "${pids[@]}"; wait
