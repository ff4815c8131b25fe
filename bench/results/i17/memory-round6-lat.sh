#!/usr/bin/env bash
# two gateways (A, B) in front of one mock; 4 MiB prompts at c=1, interleaved.
set -euo pipefail
A=$1; B=$2; PB=${PB:-4194304}; C=${C:-1}; D=${D:-20s}
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null' EXIT
$A mock -listen 127.0.0.1:19591 >mock.log 2>&1 & pids+=($!)
for s in A:18581 B:18582; do
  n=${s%%:*}; p=${s##*:}; bin=$A; [ $n = B ] && bin=$B
  d=$(mktemp -d)
  cat >$d/cfg.yaml <<C
listen: 127.0.0.1:$p
log_level: warn
http: {max_body_bytes: 8388608}
nats: {sync: 1s, max_payload: 16777216}
backends:
  - {name: direct, type: openai, base_url: "http://127.0.0.1:19591/v1", models: [oncegate-mock], timeout: 60s}
routes:
  - {model: oncegate-mock, backends: [direct]}
C
  $bin serve --config $d/cfg.yaml --data-dir $d/data >$n.log 2>&1 & pids+=($!)
done
for i in $(seq 50); do curl -sf http://127.0.0.1:18581/readyz >/dev/null && curl -sf http://127.0.0.1:18582/readyz >/dev/null && break; sleep 0.2; done
$A bench --url http://127.0.0.1:18581 --compare http://127.0.0.1:18582 --prompt-bytes $PB --concurrency $C --duration $D --timeout 60s
