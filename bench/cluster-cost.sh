#!/usr/bin/env bash
# bench/cluster-cost.sh: issue 44's table. What a new intent costs oncegate on one node and on the
# three embedded nodes of docs/operations/cluster.md (R3, chosen by default), on this machine, under
# the same load sent to node 1:
#
#   bench/cluster-cost.sh [CONCURRENCIES [DURATION [OUT]]]
#   bench/cluster-cost.sh                       # "1 4 16", 20s, bench/results/i44/cluster-cost-<UTC time>
#   SYNC=1s bench/cluster-cost.sh "4 16" 20s /tmp/cc-1s
#
# It builds the oncegate binary once (or takes ONCEGATE), then runs, one after the other:
#   one-node  `oncegate serve` with the default configuration (embedded NATS, the built-in mock)
#   cluster   cluster.md's three nodes on 127.0.0.1 (their own HTTP, NATS and route ports and data
#             directories), the same configuration
# Each setup starts once with empty data directories. For every concurrency C it runs
# `oncegate bench --url <node 1> --concurrency C` (new intents, non-stream) for WARMUP unmeasured,
# then for DURATION measured: CPU is utime+stime of every `oncegate serve` process of the setup
# (/proc/PID/stat) before and after the measured run, divided by the intents answered; latency and
# intents/s are the bench's. The table gives the cluster's CPU per intent (summed over its nodes)
# over the one node's at the same C.
#
# Environment: SYNC (auto | always | 1s: nats.sync of every node in both setups; default auto, the
# default configuration's: always on the one node, 1s on the cluster's), WARMUP (3s), ONCEGATE (a built binary; default: built here from this
# checkout), PROFILE (a number of seconds: a CPU profile of every node of both setups taken during
# each measured run, to OUT; it costs CPU of its own, so compare profiled runs with each other). The ONCEGATE_* and OPENAI_* variables are unset (they would override the default
# configuration), ROUTES (1: the cluster's route ports captured with tcpdump during each measured
# run, and what crossed per intent and kind written to OUT/cluster-cC-routes.txt by
# bench/route-traffic.py; tcpdump shares the CPUs too, so compare captured runs with each other). Nothing is pinned: the load tool and the nodes share the machine, as the issue
# measured. Run it on a quiet machine. Raw outputs, node logs, table.md and leaders.txt (which cluster
# node led each stream after each measured run: bench/leaders) go to OUT.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
CONCURRENCIES=${1:-1 4 16}
DURATION=${2:-20s}
OUT=${3:-$here/results/i44/cluster-cost-$(date -u +%Y%m%dT%H%M%SZ)}
SYNC=${SYNC:-auto}
WARMUP=${WARMUP:-3s}
PROFILE=${PROFILE:-}
ROUTES=${ROUTES:-}
PPROF_BASE=16380
HZ=$(getconf CLK_TCK)

# Ports: the one node's HTTP; the cluster's HTTP, NATS client and route ports are BASE + 1..3.
ONE_HTTP=18580
HTTP_BASE=18580
NATS_BASE=14221
ROUTE_BASE=16221

die() { echo "cluster-cost.sh: $*" >&2; exit 1; }
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
cluster_run_setup # OUT, tmp, the binary, cfg: the default configuration with nats.sync set
# Which node leads each stream, recorded per cluster run (leaders.txt): the load goes to node 1.
(cd "$here/.." && go build -o "$tmp/leaders" ./bench/leaders) || die "building bench/leaders failed"
if [ -n "$ROUTES" ]; then
	command -v tcpdump >/dev/null || die "ROUTES=1 needs tcpdump (apt-get install tcpdump)"
	command -v python3 >/dev/null || die "ROUTES=1 needs python3"
fi

serve_pids=() # the `oncegate serve` processes of the setup under test
url=          # node 1 of the setup under test

start_one() {
	"$ONCEGATE" serve --config "$cfg" --listen "127.0.0.1:$ONE_HTTP" --data-dir "$tmp/one" \
		${PROFILE:+--pprof "127.0.0.1:$((PPROF_BASE + 1))"} >"$OUT/one-node.log" 2>&1 &
	pids+=($!)
	serve_pids=($!)
	url=http://127.0.0.1:$ONE_HTTP
	wait_http "$url/readyz" "the one node" 60
}

# start_cluster: docs/operations/cluster.md's three nodes, its flags, other ports.
start_cluster() {
	local i routes=nats://127.0.0.1:$((ROUTE_BASE + 1)),nats://127.0.0.1:$((ROUTE_BASE + 2)),nats://127.0.0.1:$((ROUTE_BASE + 3))
	serve_pids=()
	for i in 1 2 3; do
		"$ONCEGATE" serve --config "$cfg" --listen "127.0.0.1:$((HTTP_BASE + i))" --data-dir "$tmp/n$i" \
			--nats-listen "127.0.0.1:$((NATS_BASE + i))" \
			--nats-cluster oncegate --nats-cluster-listen "127.0.0.1:$((ROUTE_BASE + i))" \
			--nats-routes "$routes" ${PROFILE:+--pprof "127.0.0.1:$((PPROF_BASE + i))"} >"$OUT/cluster-n$i.log" 2>&1 &
		pids+=($!)
		serve_pids+=($!)
	done
	url=http://127.0.0.1:$((HTTP_BASE + 1))
	for i in 1 2 3; do wait_http "http://127.0.0.1:$((HTTP_BASE + i))/readyz" "cluster node $i" 90; done
}

# measure SETUP C: warm-up, then the measured run; appends a line to results.tsv.
measure() {
	local setup=$1 c=$2 raw=$OUT/$1-c$2 t0 t1
	"$ONCEGATE" bench --url "$url" --concurrency "$c" --duration "$WARMUP" --warmup 0s >"$raw-warmup.txt" 2>&1 ||
		echo "($setup c=$c: the warm-up's bench exited non-zero, see $raw-warmup.txt)"
	alive "before $setup c=$c"
	t0=$(ticks "${serve_pids[@]}")
	local profiling=() i p
	if [ -n "$PROFILE" ]; then
		for i in $(seq "${#serve_pids[@]}"); do
			curl -s -o "$raw-n$i.pprof" "http://127.0.0.1:$((PPROF_BASE + i))/debug/pprof/profile?seconds=$PROFILE" &
			profiling+=($!)
		done
	fi
	local capture=
	if [ -n "$ROUTES" ] && [ "$setup" = cluster ]; then
		tcpdump -i lo -s0 -w "$raw-routes.pcap" "tcp portrange $((ROUTE_BASE + 1))-$((ROUTE_BASE + 3))" 2>"$raw-tcpdump.txt" &
		capture=$!
		sleep 1 # tcpdump's start
	fi
	"$ONCEGATE" bench --url "$url" --concurrency "$c" --duration "$DURATION" --warmup 0s >"$raw.txt" 2>&1 ||
		echo "($setup c=$c: bench exited non-zero, see $raw.txt)"
	if [ -n "$capture" ]; then
		kill -INT "$capture"
		wait "$capture" || true
		"$here/route-traffic.py" "$raw-routes.pcap" --per "$(awk '$1 == "successes" { print $2 }' "$raw.txt")" \
			--nats "127.0.0.1:$((NATS_BASE + 1))" >"$raw-routes.txt" || echo "(route-traffic.py failed: $raw-routes.pcap)"
		rm -f "$raw-routes.pcap"
		tail -2 "$raw-routes.txt"
	fi
	for p in "${profiling[@]}"; do wait "$p" || echo "(a profile failed: $raw-n*.pprof)"; done
	t1=$(ticks "${serve_pids[@]}")
	alive "during $setup c=$c"
	if [ "$setup" = cluster ]; then
		echo "c=$c after: $("$tmp/leaders" nats://127.0.0.1:$((NATS_BASE + 1)) nats://127.0.0.1:$((NATS_BASE + 2)) nats://127.0.0.1:$((NATS_BASE + 3)) 2>&1)" >>"$OUT/leaders.txt"
	fi
	awk -v setup="$setup" -v c="$c" -v d=$((t1 - t0)) -v hz="$HZ" '
		$1 == "successes" { ok = $2 }
		$1 == "errors" { err = $2 }
		$1 == "requests/s" { rps = $2 }
		$1 == "latency" && $2 == "p50" { p50 = $3 }
		$1 == "latency" && $2 == "p99" { p99 = $3 }
		END {
			if (ok + 0 == 0) exit 1
			printf "%s\t%s\t%s\t%.0f\t%s\t%s\t%s\t%d\n", setup, c, rps, d / hz * 1e6 / ok, p50, p99, err, ok
		}' "$raw.txt" >>"$OUT/results.tsv" || die "$setup c=$c: no intent answered (see $raw.txt)"
	tail -1 "$OUT/results.tsv"
}

{
	echo "oncegate: $built"
	echo "nats.sync: $SYNC; concurrencies: $CONCURRENCIES; duration $DURATION, warm-up $WARMUP each"
	echo "machine: $(nproc) CPUs; $(uptime)"
} | tee "$OUT/info.txt"
: >"$OUT/results.tsv"
for setup in one-node cluster; do
	echo "== $setup"
	if [ "$setup" = one-node ]; then start_one; else start_cluster; fi
	# The replicas each node chose, from its start line (the cluster's should be 3).
	echo "$setup replicas: $(grep -ho '"replicas":[0-9]*' "$OUT/$setup"*.log | sed 's/.*://' | tr '\n' ' ')" | tee -a "$OUT/info.txt"
	for c in $CONCURRENCIES; do measure "$setup" "$c"; done
	stop_setup
done

awk -F '\t' -v sync="$SYNC" '
	{ row[NR] = $0; if ($1 == "one-node") one[$2] = $4 }
	END {
		printf "\nnats.sync: %s\n\n", sync
		print "| setup | C | intents/s | CPU µs per intent (all nodes) | cluster / one node | p50 | p99 | errors |"
		print "|---|---|---|---|---|---|---|---|"
		for (i = 1; i <= NR; i++) {
			split(row[i], f, "\t")
			ratio = (f[1] == "cluster" && one[f[2]] > 0) ? sprintf("%.1f×", f[4] / one[f[2]]) : ""
			printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", f[1], f[2], f[3], f[4], ratio, f[5], f[6], f[7]
		}
	}' "$OUT/results.tsv" | tee "$OUT/table.md"
echo "raw: $OUT"
