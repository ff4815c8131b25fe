#!/usr/bin/env bash
# bench/peers.sh: oncegate side by side with nginx and Bifrost, in front of the same mock backend,
# and the table of issue 16 (performance round 4) printed at the end. One command per round:
#
#   bench/peers.sh                      # every target found, 2 rounds, 10 s per measured run
#   ROUNDS=1 TARGETS="bifrost og-1s" bench/peers.sh
#
# Pinning (2 cores): the load tool (`oncegate bench`) runs on LOAD_CPU; the mock and the target
# under test share GW_CPU, so oncegate's embedded NATS server shares the gateway's core. One
# target runs at a time, each round starts every target afresh (a new data dir for oncegate).
# Run it on a quiet machine: nothing else building, testing or measuring.
#
# Targets (TARGETS, in this order within a round):
#   nginx       nginx as a plain reverse proxy (one worker, upstream keep-alive, no buffering)
#   bifrost     Bifrost (maximhq/bifrost), config bench/bifrost-config.json, log level warn
#   og-synced   oncegate, every write synced (the default)
#   og-1s       oncegate with nats.sync: 1s
#   og-bypass   og-synced, every request with X-Allow-Duplicate: true (deduplication off)
#   og-bypass-1s  og-1s, every request with X-Allow-Duplicate: true (not in the default TARGETS)
#   og-replay   og-synced, 100 completed intents requested again (the replay scenario)
# nginx and Bifrost are skipped when not installed: NGINX (default: nginx on PATH) and
# BIFROST (default: bifrost-http on PATH) name the binaries; Bifrost needs the config.schema.json
# of its source next to its binary or in BIFROST_SCHEMA (else it fetches it from the internet at
# start). How to build it here: bench/results/i16/bifrost-from-source.md.
#
# Measured per target and round (the mock: 16 tokens, no delays):
#   c1    non-stream, c=1, interleaved 1 s slices against the mock directly: added p50
#   st64  stream, c=64, interleaved against the mock: added time to first byte p50, req/s
#   cpu64 non-stream, c=64, the target alone, measured after WARM s (15) of the same load: its
#         CPU (utime+stime of its processes, /proc) per request, req/s, backend executions per
#         request, RSS at the end
#   rss   with RSS_SECS > 0, round 1 only: c=64 non-stream for RSS_SECS, then RSS
# "added" is the target's figure minus the mock's in the same run.
#
# Environment: OUT (raw outputs; default bench/out/<UTC time>), ROUNDS (2), DURATION (10s),
# LOAD_CPU (0), GW_CPU (1), TARGETS, ONCEGATE (a built oncegate binary; default: built here from
# this checkout), RSS_SECS (0).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$here/out/$(date -u +%Y%m%dT%H%M%SZ)}
ROUNDS=${ROUNDS:-2}
DURATION=${DURATION:-10s}
LOAD_CPU=${LOAD_CPU:-0}
GW_CPU=${GW_CPU:-1}
RSS_SECS=${RSS_SECS:-0}
WARM=${WARM:-15}
TARGETS=${TARGETS:-nginx bifrost og-synced og-1s og-bypass og-replay}
NGINX=${NGINX:-$(command -v nginx || true)}
BIFROST=${BIFROST:-$(command -v bifrost-http || true)}
BIFROST_SCHEMA=${BIFROST_SCHEMA:-${BIFROST:+$(dirname "$BIFROST")/config.schema.json}}

MOCK=http://127.0.0.1:19590
GW=http://127.0.0.1:18580

die() { echo "peers.sh: $*" >&2; exit 1; }
command -v taskset >/dev/null || die "taskset not found (util-linux)"
command -v curl >/dev/null || die "curl not found"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
RESULTS=$OUT/results.tsv
: >"$RESULTS"

# shellcheck source=bench/lib.sh
. "$here/lib.sh"
oncegate_binary "$OUT"

# Which targets can run here.
runnable=()
for t in $TARGETS; do
	case $t in
	nginx) [ -n "$NGINX" ] || { echo "skipping nginx: not installed (apt-get install nginx)"; continue; } ;;
	bifrost)
		[ -n "$BIFROST" ] && [ -x "$BIFROST" ] || { echo "skipping bifrost: no bifrost-http (BIFROST=...)"; continue; }
		[ -f "$BIFROST_SCHEMA" ] || { echo "skipping bifrost: no config.schema.json at '$BIFROST_SCHEMA' (BIFROST_SCHEMA=...)"; continue; }
		;;
	og-synced | og-1s | og-bypass | og-bypass-1s | og-replay) ;;
	*) die "unknown target $t" ;;
	esac
	runnable+=("$t")
done
[ ${#runnable[@]} -gt 0 ] || die "no target to run"

tree() { echo "$1" $(pgrep -P "$1" || true); } # a process and its children (nginx's workers)
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$RESULTS"; } # round target metric value
# field FILE ROW COL: a row of the bench table ("requests/s", "latency p50"), column A or B, ms
# and x suffixes removed.
field() {
	awk -v row="$2" -v col="$3" '
		{ name = $1; n = 1; if ($2 ~ /^p[0-9.]+$|^max$|^mean$/) { name = $1 " " $2; n = 2 } }
		name == row { v = $(n + (col == "A" ? 1 : 2)); sub(/ms$/, "", v); print v; exit }' "$1"
}

# The mock, pinned with the targets.
taskset -c "$GW_CPU" "$ONCEGATE" mock -listen 127.0.0.1:19590 >"$OUT/mock.log" 2>&1 &
mock_pid=$!
pids+=("$mock_pid")
wait_http "$MOCK/v1/models" "the mock"

nginx_conf() {
	mkdir -p "$OUT/nginx"
	cat >"$OUT/nginx/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $OUT/nginx/nginx.pid;
error_log $OUT/nginx/error.log warn;
events { worker_connections 4096; }
http {
	access_log off;
	client_body_temp_path $OUT/nginx/body;
	proxy_temp_path $OUT/nginx/proxy;
	fastcgi_temp_path $OUT/nginx/fastcgi;
	uwsgi_temp_path $OUT/nginx/uwsgi;
	scgi_temp_path $OUT/nginx/scgi;
	upstream mock { server 127.0.0.1:19590; keepalive 256; }
	server {
		listen 127.0.0.1:18580;
		client_max_body_size 8m;
		location / {
			proxy_pass http://mock;
			proxy_http_version 1.1;
			proxy_set_header Connection "";
			proxy_buffering off;
			proxy_read_timeout 120s;
		}
	}
}
EOF
}

# start TARGET: starts it pinned, waits until it serves; sets target_pid, extra_args and
# url_model (the model the target wants named; empty: the mock's own).
start() {
	url_model=
	extra_args=()
	case $1 in
	nginx)
		nginx_conf
		taskset -c "$GW_CPU" "$NGINX" -p "$OUT/nginx" -c "$OUT/nginx/nginx.conf" >"$OUT/nginx/stdout.log" 2>&1 &
		target_pid=$!
		pids+=("$target_pid")
		wait_http "$GW/v1/models" nginx
		;;
	bifrost)
		local app=$OUT/bifrost
		mkdir -p "$app"
		cp "$here/bifrost-config.json" "$app/config.json"
		cp "$BIFROST_SCHEMA" "$app/config.schema.json"
		# Its schema is read from the working directory; -log-level warn: no line per request.
		(cd "$app" && exec taskset -c "$GW_CPU" "$BIFROST" -host 127.0.0.1 -port 18580 -app-dir "$app" \
			-log-level warn -log-style json >>"$app/bifrost.log" 2>&1) &
		target_pid=$!
		pids+=("$target_pid")
		wait_http "$GW/health" bifrost
		url_model=openai/oncegate-mock # Bifrost's <provider>/<model>
		;;
	og-*)
		local cfg=$here/oncegate-synced.yaml
		case $1 in og-1s | og-bypass-1s) cfg=$here/oncegate-1s.yaml ;; esac
		case $1 in og-bypass*) extra_args=(--header "X-Allow-Duplicate: true") ;; esac
		[ "$1" = og-replay ] && extra_args=(--scenario replay --keys-pool 100)
		local dd=$OUT/data-$1
		rm -rf "$dd"
		taskset -c "$GW_CPU" "$ONCEGATE" serve --config "$cfg" --data-dir "$dd" >"$OUT/$1.log" 2>&1 &
		target_pid=$!
		pids+=("$target_pid")
		wait_http "$GW/readyz" "oncegate ($1)"
		;;
	esac
}

bench() { # out-file args...: the load tool on its own core
	local out=$1
	shift
	{
		echo "\$ oncegate bench $*"
		echo "uptime: $(uptime)"
		taskset -c "$LOAD_CPU" "$ONCEGATE" bench "$@" || echo "BENCH FAILED: exit $?"
	} >"$out" 2>&1
}

errors_of() { # file col
	local e
	e=$(field "$1" errors "$2")
	echo "${e:-?}"
}

echo "peers.sh: ${runnable[*]}; $ROUNDS round(s) of $DURATION runs; load on cpu $LOAD_CPU, targets and mock on cpu $GW_CPU"
echo "oncegate: $ONCEGATE ($built)"
echo "raw outputs: $OUT"
echo "uptime: $(uptime)"
for round in $(seq "$ROUNDS"); do
	for t in "${runnable[@]}"; do
		echo "round $round: $t"
		start "$t"
		base=$OUT/r$round-$t
		# Runs against the target alone name its model; runs interleaved with the mock name the
		# mock's to the mock.
		model_args=() cpu_model=()
		if [ -n "$url_model" ]; then
			cpu_model=(--model "$url_model")
			model_args=("${cpu_model[@]}" --compare-model oncegate-mock)
		fi
		cmp=(--compare "$MOCK" --mock-stats "$MOCK" --duration "$DURATION" --warmup 1s)

		bench "$base-c1.txt" --url "$GW" "${cmp[@]}" --concurrency 1 "${model_args[@]}" "${extra_args[@]}"
		a=$(field "$base-c1.txt" "latency p50" A)
		b=$(field "$base-c1.txt" "latency p50" B)
		record "$round" "$t" added_p50_c1 "$(awk -v a="$a" -v b="$b" 'BEGIN{printf "%+.2f", a-b}')"
		errs=$(errors_of "$base-c1.txt" A)

		bench "$base-st64.txt" --url "$GW" "${cmp[@]}" --stream --concurrency 64 "${model_args[@]}" "${extra_args[@]}"
		a=$(field "$base-st64.txt" "ttft p50" A)
		b=$(field "$base-st64.txt" "ttft p50" B)
		record "$round" "$t" added_ttfb_st64 "$(awk -v a="$a" -v b="$b" 'BEGIN{printf "%+.1f", a-b}')"
		record "$round" "$t" rps_st64 "$(field "$base-st64.txt" requests/s A | awk '{printf "%.0f", $1}')"
		errs="$errs+$(errors_of "$base-st64.txt" A)"

		# The CPU is read over the measured part only, after WARM seconds of the same load, so
		# work that follows each request by seconds (discarding its chunks) is at its steady rate.
		bench "$base-cpu64.txt" --url "$GW" --mock-stats "$MOCK" --duration "$DURATION" --warmup "${WARM}s" \
			--concurrency 64 "${cpu_model[@]}" "${extra_args[@]}" &
		load=$!
		sleep "$WARM"
		procs=$(tree "$target_pid")
		t0=$(ticks $procs)
		wait "$load"
		procs=$(tree "$target_pid")
		t1=$(ticks $procs)
		rss=$(rss_kb $procs)
		n=$(field "$base-cpu64.txt" requests A)
		echo "target pids $procs: cpu ticks $t0 -> $t1 (CLK_TCK $(getconf CLK_TCK)), VmRSS $rss kB" >>"$base-cpu64.txt"
		record "$round" "$t" cpu_us_c64 "$(awk -v d=$((t1 - t0)) -v n="${n:-0}" -v hz="$(getconf CLK_TCK)" 'BEGIN{ if (n > 0) printf "%.0f", d / hz * 1e6 / n; else print "?" }')"
		record "$round" "$t" rps_c64 "$(field "$base-cpu64.txt" requests/s A | awk '{printf "%.0f", $1}')"
		record "$round" "$t" exec_per_req_c64 "$(field "$base-cpu64.txt" executions/request A)"
		record "$round" "$t" rss_mb_c64 "$(awk -v k="$rss" 'BEGIN{printf "%.0f", k / 1024}')"
		errs="$errs+$(errors_of "$base-cpu64.txt" A)"

		if [ "$RSS_SECS" -gt 0 ] && [ "$round" = 1 ]; then
			bench "$base-rss.txt" --url "$GW" --mock-stats "$MOCK" --duration "${RSS_SECS}s" --warmup 0s \
				--concurrency 64 "${cpu_model[@]}" "${extra_args[@]}"
			record "$round" "$t" rss_mb_long "$(awk -v k="$(rss_kb $(tree "$target_pid"))" 'BEGIN{printf "%.0f", k / 1024}')"
			errs="$errs+$(errors_of "$base-rss.txt" A)"
		fi
		record "$round" "$t" errors "$errs"
		grep -l 'BENCH FAILED' "$base"-*.txt 2>/dev/null | sed 's/^/  failed: /' || true
		stop "$target_pid"
		[ "$t" = nginx ] && sleep 0.2 # its workers exit after the master's signal
		rm -rf "$OUT/data-$t"
	done
done
stop "$mock_pid"
echo "uptime: $(uptime)"

# The table: one row per figure, one column per target, rounds joined by "/".
{
	echo
	echo "| per request (round 1/round 2/…) | $(for t in "${runnable[@]}"; do printf '%s | ' "$t"; done)"
	echo "|---|$(for _ in "${runnable[@]}"; do printf -- '---|'; done)"
	for m in cpu_us_c64:"gateway CPU, non-stream c=64 (µs)" rps_c64:"req/s, non-stream c=64" \
		added_p50_c1:"added p50, non-stream c=1 (ms)" added_ttfb_st64:"added TTFB p50, stream c=64 (ms)" \
		rps_st64:"req/s, stream c=64" exec_per_req_c64:"backend executions per request, c=64" \
		rss_mb_c64:"RSS after the c=64 run (MB)" rss_mb_long:"RSS after ${RSS_SECS} s at c=64 (MB)" \
		errors:"errors (c1+st64+cpu64[+rss])"; do
		key=${m%%:*}
		grep -q "	$key	" "$RESULTS" || continue
		printf '| %s |' "${m#*:}"
		for t in "${runnable[@]}"; do
			printf ' %s |' "$(awk -F'\t' -v t="$t" -v k="$key" '$2 == t && $3 == k { v = v sep $4; sep = "/" } END { print v }' "$RESULTS")"
		done
		echo
	done
} | tee "$OUT/table.md"
