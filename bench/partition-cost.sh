#!/usr/bin/env bash
# bench/partition-cost.sh: issue 45's table. What a new intent costs each node of three embedded
# nodes with one partition (docs/operations/cluster.md's cluster) and of six embedded nodes with two
# partitions, each placed on its own three nodes (cluster.md's partitions section), under the same
# load spread over the nodes, on this machine:
#
#   bench/partition-cost.sh [CONCURRENCIES [DURATION [OUT]]]
#   bench/partition-cost.sh                  # "12 24", 20s, bench/results/i45/partition-cost-<UTC time>
#
# It builds the oncegate binary once (or takes ONCEGATE), then runs, one after the other:
#   p1  three nodes, nats.partitions 1 (R3, as the page starts them)
#   p2  six nodes, nats.partitions 2, nats.place_partitions, nodes 1-3 tagged og-p0 and 4-6 og-p1
# For every total concurrency C it runs one `oncegate bench` per node at once (C / nodes each: a
# load balancer's spread), WARMUP unmeasured, then DURATION measured. CPU is utime+stime of each
# `oncegate serve` process before and after the measured run; per intent, it is divided by the
# intents all benches had answered. The table gives the busiest node's CPU per intent and the sum
# over the nodes, and p2's over p1's at the same C (issue 45's targets: busiest ≤ 0.6×, sum ≤ 1.1×).
#
# With RATE set (intents/s in all), the load is an open loop instead: RATE / nodes intents/s to each
# node (CONCURRENCIES are then each bench's in-flight cap times the nodes), so both setups serve the
# same intents per second and neither saturates the machine; CPU per intent then also carries the
# nodes' idle cost, measured first (IDLE, 10s) and printed per node.
#
# Environment: SYNC (auto | always | 1s; default auto: 1s on a cluster), WARMUP (3s), ONCEGATE (a
# built binary), RATE (unset: closed loop), IDLE (10s), SETUPS ("p1 p2": which to run), PROFILE (a
# number of seconds: a CPU profile of every node taken during each measured run, to OUT).
# Nothing is pinned: on a 2-core machine the six nodes and the benches share the
# cores, so a node's CPU per intent is a proxy for its share of the work, not a capacity. Run it on
# a quiet machine. Raw outputs, node logs and table.md go to OUT.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
CONCURRENCIES=${1:-12 24}
DURATION=${2:-20s}
OUT=${3:-$here/results/i45/partition-cost-$(date -u +%Y%m%dT%H%M%SZ)}
SYNC=${SYNC:-auto}
WARMUP=${WARMUP:-3s}
RATE=${RATE:-}
IDLE=${IDLE:-10s}
SETUPS=${SETUPS:-p1 p2}
PROFILE=${PROFILE:-}
HZ=$(getconf CLK_TCK)

# Node i's HTTP, NATS client and route ports are BASE + i.
HTTP_BASE=18680
NATS_BASE=14321
ROUTE_BASE=16321
PPROF_BASE=16980

die() { echo "partition-cost.sh: $*" >&2; exit 1; }
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
cluster_run_setup # OUT, tmp, the binary, cfg: the default configuration with nats.sync set

serve_pids=() # the `oncegate serve` processes of the setup under test, node 1 first
nodes=0

# start_setup NAME N PARTITIONS: N nodes routed to each other, PARTITIONS partitions (placed by tag
# when more than one: nodes 3k+1..3k+3 hold partition k).
start_setup() {
	local name=$1 n=$2 parts=$3 i routes="" extra
	for i in $(seq "$n"); do routes+="${routes:+,}nats://127.0.0.1:$((ROUTE_BASE + i))"; done
	serve_pids=()
	nodes=$n
	for i in $(seq "$n"); do
		extra=()
		[ -z "$PROFILE" ] || extra+=(--pprof "127.0.0.1:$((PPROF_BASE + i))")
		if [ "$parts" -gt 1 ]; then
			extra+=(--nats-partitions "$parts" --nats-place-partitions --nats-tags "og-p$(((i - 1) / 3))")
		fi
		"$ONCEGATE" serve --config "$cfg" --listen "127.0.0.1:$((HTTP_BASE + i))" --data-dir "$tmp/$name-n$i" \
			--nats-listen "127.0.0.1:$((NATS_BASE + i))" \
			--nats-cluster oncegate --nats-cluster-listen "127.0.0.1:$((ROUTE_BASE + i))" \
			--nats-routes "$routes" "${extra[@]}" >"$OUT/$name-n$i.log" 2>&1 &
		pids+=($!)
		serve_pids+=($!)
	done
	for i in $(seq "$n"); do wait_http "http://127.0.0.1:$((HTTP_BASE + i))/readyz" "$name node $i" 120; done
}

# load C DURATION PREFIX: one bench per node, C / nodes concurrency each, all at once.
load() {
	local c=$1 d=$2 prefix=$3 i bpids=() open=()
	[ -z "$RATE" ] || open=(--rate "$(awk -v r="$RATE" -v n="$nodes" 'BEGIN { print r / n }')")
	for i in $(seq "$nodes"); do
		"$ONCEGATE" bench --url "http://127.0.0.1:$((HTTP_BASE + i))" --concurrency $((c / nodes)) \
			--duration "$d" --warmup 0s "${open[@]}" >"$prefix-b$i.txt" 2>&1 &
		bpids+=($!)
	done
	for i in "${bpids[@]}"; do wait "$i" || echo "(a bench exited non-zero: $prefix-b*.txt)"; done
}

# measure SETUP C: warm-up, then the measured run; appends a line per node to results.tsv:
# setup C node intents/s(all) cpu-µs-per-intent(node) p50(node 1's bench) p99 errors(all).
measure() {
	local setup=$1 c=$2 raw=$OUT/$1-c$2 before=() after=() i p ok
	load "$c" "$WARMUP" "$raw-warmup"
	alive "before $setup c=$c"
	for p in "${serve_pids[@]}"; do before+=("$(ticks "$p")"); done
	local profiling=()
	if [ -n "$PROFILE" ]; then
		for i in $(seq "$nodes"); do
			curl -s -o "$raw-n$i.pprof" "http://127.0.0.1:$((PPROF_BASE + i))/debug/pprof/profile?seconds=$PROFILE" &
			profiling+=($!)
		done
	fi
	load "$c" "$DURATION" "$raw"
	for p in "${profiling[@]}"; do wait "$p" || echo "(a profile failed: $raw-n*.pprof)"; done
	for p in "${serve_pids[@]}"; do after+=("$(ticks "$p")"); done
	alive "during $setup c=$c"
	ok=$(awk '$1 == "successes" { s += $2 } END { print s + 0 }' "$raw"-b*.txt)
	[ "$ok" -gt 0 ] || die "$setup c=$c: no intent answered (see $raw-b*.txt)"
	for i in $(seq "$nodes"); do
		awk -v setup="$setup" -v c="$c" -v node="$i" -v d=$((after[i - 1] - before[i - 1])) -v hz="$HZ" -v ok="$ok" '
			FNR == 1 { f++ }
			$1 == "requests/s" { rps += $2 }
			$1 == "errors" { err += $2 }
			f == 1 && $1 == "latency" && $2 == "p50" { p50 = $3 }
			f == 1 && $1 == "latency" && $2 == "p99" { p99 = $3 }
			END { printf "%s\t%s\t%s\t%.0f\t%.0f\t%s\t%s\t%d\n", setup, c, node, rps, d / hz * 1e6 / ok, p50, p99, err }' \
			"$raw"-b*.txt >>"$OUT/results.tsv"
	done
	grep -P "^$setup\t$c\t" "$OUT/results.tsv" | cut -f3,5 | tr '\n' ' '
	echo
}

# idle SETUP: each node's CPU over IDLE with no load, µs per second, to idle.tsv.
idle() {
	local before=() i p secs
	secs=$(awk -v d="$IDLE" 'BEGIN { sub(/s$/, "", d); print d }')
	sleep 2 # past the start's own work
	for p in "${serve_pids[@]}"; do before+=("$(ticks "$p")"); done
	sleep "$secs"
	i=0
	for p in "${serve_pids[@]}"; do
		printf '%s\t%s\t%.0f\n' "$1" $((i + 1)) "$(awk -v d=$(($(ticks "$p") - before[i])) -v hz="$HZ" -v s="$secs" 'BEGIN { print d / hz * 1e6 / s }')" >>"$OUT/idle.tsv"
		i=$((i + 1))
	done
	echo "idle CPU µs/s per node: $(grep -P "^$1\t" "$OUT/idle.tsv" | cut -f3 | tr '\n' ' ')"
}

{
	echo "oncegate: $built"
	echo "nats.sync: $SYNC; concurrencies: $CONCURRENCIES; duration $DURATION, warm-up $WARMUP each; load: $([ -n "$RATE" ] && echo "open loop, $RATE intents/s in all" || echo "closed loop")"
	echo "machine: $(nproc) CPUs; $(uptime)"
} | tee "$OUT/info.txt"
: >"$OUT/results.tsv"
: >"$OUT/idle.tsv"
for setup in $SETUPS; do
	echo "== $setup"
	if [ "$setup" = p1 ]; then start_setup p1 3 1; else start_setup p2 6 2; fi
	idle "$setup"
	for c in $CONCURRENCIES; do measure "$setup" "$c"; done
	stop_setup
done

awk -F '\t' '
	{
		k = $1 SUBSEP $2
		if (!(k in sum)) { order[++n] = k; rps[k] = $4; p50[k] = $6; p99[k] = $7; err[k] = $8 }
		sum[k] += $5
		if ($5 > top[k]) { top[k] = $5; topNode[k] = $3 }
		per[k] = per[k] (per[k] == "" ? "" : " ") $5
	}
	END {
		print "| setup | C | intents/s | CPU µs per intent, each node | busiest node | sum over nodes | busiest / p1 | sum / p1 | p50 | p99 | errors |"
		print "|---|---|---|---|---|---|---|---|---|---|---|"
		for (i = 1; i <= n; i++) {
			k = order[i]; split(k, f, SUBSEP)
			b = ""; s = ""
			if (f[1] == "p2" && (("p1" SUBSEP f[2]) in sum)) {
				b = sprintf("%.2f×", top[k] / top["p1" SUBSEP f[2]]); s = sprintf("%.2f×", sum[k] / sum["p1" SUBSEP f[2]])
			}
			printf "| %s | %s | %s | %s | %d (node %s) | %d | %s | %s | %s | %s | %s |\n", f[1], f[2], rps[k], per[k], top[k], topNode[k], sum[k], b, s, p50[k], p99[k], err[k]
		}
	}' "$OUT/results.tsv" | tee "$OUT/table.md"
echo "raw: $OUT"
