#!/usr/bin/env bash
# bench/ab.sh: two oncegate binaries, interleaved, under the same steady load: the gateway's CPU
# per request and its req/s, measured over a window that starts once the load has run WARM
# (default 15 s, longer than workers.discard_chunks_after, so work that follows a request by
# seconds, such as discarding its chunks, is counted at its steady rate).
#
#   bench/ab.sh BIN_A BIN_B [CONFIG]        # CONFIG: default bench/oncegate-1s.yaml
#
# Environment: ROUNDS (3), WARM (15), WINDOW (10, seconds), CONCURRENCY (64), STREAM (0|1),
# HEADER (one more request header, e.g. "X-Allow-Duplicate: true" to measure bypassed requests),
# LOAD_CPU (0), GW_CPU (1), OUT (default bench/out/ab-<UTC time>). Pinning as bench/peers.sh:
# the load tool (BIN_A's `oncegate bench`) on LOAD_CPU; the mock and the gateway on GW_CPU.
# Prints one line per run and a summary; run it on a quiet machine.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 2 ] || { echo "usage: bench/ab.sh BIN_A BIN_B [CONFIG]" >&2; exit 2; }
A=$(realpath "$1")
B=$(realpath "$2")
CFG=$(realpath "${3:-$here/oncegate-1s.yaml}")
ROUNDS=${ROUNDS:-3}
WARM=${WARM:-15}
WINDOW=${WINDOW:-10}
CONCURRENCY=${CONCURRENCY:-64}
STREAM=${STREAM:-0}
LOAD_CPU=${LOAD_CPU:-0}
GW_CPU=${GW_CPU:-1}
OUT=${OUT:-$here/out/ab-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
MOCK=http://127.0.0.1:19590
GW=http://127.0.0.1:18580
HZ=$(getconf CLK_TCK)

die() { echo "ab.sh: $*" >&2; exit 1; }
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
executions() { curl -s "$MOCK/stats" | sed -n 's/.*"requests":\([0-9]*\).*/\1/p'; }

taskset -c "$GW_CPU" "$A" mock -listen 127.0.0.1:19590 >"$OUT/mock.log" 2>&1 &
pids+=($!)
wait_http "$MOCK/v1/models" "the mock"
stream_args=()
[ "$STREAM" = 1 ] && stream_args=(--stream)
[ -n "${HEADER:-}" ] && stream_args+=(--header "$HEADER")

echo "A $A"
echo "B $B"
echo "config $CFG; c=$CONCURRENCY stream=$STREAM header=${HEADER:-}; warm ${WARM}s, window ${WINDOW}s; uptime: $(uptime)"
for round in $(seq "$ROUNDS"); do
	# A then B in odd rounds, B then A in even ones: a drift of the VM's speed across a round then
	# tilts half the pairs each way instead of all of them against the same side.
	order="A B"
	[ $((round % 2)) = 0 ] && order="B A"
	for side in $order; do
		bin=$A
		[ "$side" = B ] && bin=$B
		dd=$(mktemp -d)
		taskset -c "$GW_CPU" "$bin" serve --config "$CFG" --data-dir "$dd" >"$OUT/r$round-$side.log" 2>&1 &
		gw=$!
		pids+=("$gw")
		wait_http "$GW/readyz" "oncegate ($side)"
		taskset -c "$LOAD_CPU" "$A" bench --url "$GW" --duration "$((WARM + WINDOW + 2))s" --warmup 0s \
			--concurrency "$CONCURRENCY" "${stream_args[@]}" >"$OUT/r$round-$side-bench.txt" 2>&1 &
		load=$!
		sleep "$WARM"
		t0=$(ticks "$gw")
		n0=$(executions)
		sleep "$WINDOW"
		t1=$(ticks "$gw")
		n1=$(executions)
		rss=$(rss_kb "$gw")
		wait "$load" || true
		stop "$gw"
		rm -rf "$dd"
		awk -v r="$round" -v s="$side" -v d=$((t1 - t0)) -v n=$((n1 - n0)) -v hz="$HZ" -v w="$WINDOW" -v rss="$rss" \
			'BEGIN { printf "round %s %s %6.0f us/request  %7.1f req/s  RSS %d kB  (%d requests, %d ticks)\n", r, s, d / hz * 1e6 / n, n / w, rss, n, d }' |
			tee -a "$OUT/ab.txt"
	done
done
awk '{ us[$3] = us[$3] sep[$3] $4; rps[$3] = rps[$3] sep[$3] $6; sep[$3] = " / " }
	END { for (s in us) printf "%s us/request %s; req/s %s\n", s, us[s], rps[s] }' "$OUT/ab.txt" | sort
# Each round's B/A ratio of CPU per request, and their median. This VM's speed moves by up to 1.7x
# between runs minutes apart, so one side's figures across rounds spread wider than most changes;
# the pair measured back to back within a round is what compares them.
awk '$1 == "round" { v[$2, $3] = $4; if ($2 > n) n = $2 }
	END {
		for (r = 1; r <= n; r++) if (v[r, "A"] > 0 && v[r, "B"] != "") { k++; q[k] = v[r, "B"] / v[r, "A"] }
		if (k == 0) exit
		for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (q[j] < q[i]) { t = q[i]; q[i] = q[j]; q[j] = t }
		med = (k % 2) ? q[(k + 1) / 2] : (q[k / 2] + q[k / 2 + 1]) / 2
		printf "B/A us/request per round, sorted:"
		for (i = 1; i <= k; i++) printf " %.2f", q[i]
		printf "; median %.2f\n", med
	}' "$OUT/ab.txt"
