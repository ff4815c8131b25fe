#!/usr/bin/env bash
# fresh 3-node cluster starts: time from launch to each node's /readyz 200 (readyz now includes the cold tier)
B=${B:?set B to an oncegate binary}; N=${N:-8}
for it in $(seq $N); do
  rm -rf /tmp/sl; mkdir -p /tmp/sl
  echo "nats: {sync: auto}" > /tmp/sl/cfg.yaml
  routes=nats://127.0.0.1:16222,nats://127.0.0.1:16223,nats://127.0.0.1:16224
  pids=(); t0=$(date +%s.%N)
  for i in 1 2 3; do
    $B serve --config /tmp/sl/cfg.yaml --listen 127.0.0.1:$((18580+i)) --data-dir /tmp/sl/n$i \
     --nats-listen 127.0.0.1:$((14221+i)) --nats-cluster oncegate --nats-cluster-listen 127.0.0.1:$((16221+i)) --nats-routes $routes > /tmp/sl/n$i.log 2>&1 &
    pids+=($!)
  done
  line="it $it:"
  for i in 1 2 3; do
    for k in $(seq 1200); do curl -sf http://127.0.0.1:$((18580+i))/readyz >/dev/null && break; sleep 0.05; done
    line="$line n$i $(echo "$(date +%s.%N) - $t0" | bc | cut -c1-5)s"
  done
  w=$(grep -l "cold tier is not ready" /tmp/sl/n*.log 2>/dev/null | tr '\n' ' ')
  echo "$line ${w:+not-ready-warn: $w}"
  if [ -n "$w" ]; then mkdir -p /tmp/sl-keep/$it; cp /tmp/sl/n*.log /tmp/sl-keep/$it/; fi
  kill ${pids[@]}; wait 2>/dev/null
done
