# bench/lib.sh: what bench/peers.sh and bench/ab.sh share, sourced by both (bash): the processes
# a script started (stopped on exit), waiting for a server, and a process's CPU and memory.
# The sourcing script defines die MESSAGE.

pids=() # every process this script started and has not stopped
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
}
trap cleanup EXIT

# stop PID: stops one process this script started.
stop() {
	kill "$1" 2>/dev/null || true
	wait "$1" 2>/dev/null || true
	local keep=() p
	for p in "${pids[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
	pids=("${keep[@]}")
}

# wait_http URL WHAT: until URL answers 200, at most 10 s.
wait_http() {
	local code
	for _ in $(seq 200); do
		code=$(curl -s -o /dev/null -w '%{http_code}' "$1" || true)
		[ "$code" = 200 ] && return 0
		sleep 0.05
	done
	die "$2 did not answer 200 at $1 within 10 s"
}

# proc_sum FILE AWK PID...: the number AWK prints from /proc/PID/FILE, summed over the processes.
proc_sum() {
	local file=$1 prog=$2 s=0 p
	shift 2
	for p in "$@"; do
		[ -r "/proc/$p/$file" ] && s=$((s + $(awk "$prog" "/proc/$p/$file")))
	done
	echo "$s"
}

# ticks PID...: utime+stime of the processes, in clock ticks (getconf CLK_TCK).
ticks() { proc_sum stat '{print $14+$15}' "$@"; }

# rss_kb PID...: VmRSS of the processes summed, kB.
rss_kb() { proc_sum status '/^VmRSS/{print $2}' "$@"; }
