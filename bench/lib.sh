# bench/lib.sh: what bench/peers.sh, bench/ab.sh and bench/cluster-cost.sh share, sourced by them
# (bash): the processes a script started (stopped on exit), the oncegate binary, waiting for a
# server, and a process's CPU and memory.
# The sourcing script defines die MESSAGE.

# oncegate_binary DIR: unless ONCEGATE names a built binary, builds one into DIR from this checkout
# and sets ONCEGATE to it; sets built to what it is (the commit, or the given binary's hash).
oncegate_binary() {
	local repo
	repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
	if [ -z "${ONCEGATE:-}" ]; then
		ONCEGATE=$1/oncegate
		(cd "$repo" && go build -o "$ONCEGATE" ./cmd/oncegate) || die "go build failed"
		built="built from $(cd "$repo" && git describe --always --dirty 2>/dev/null || echo '?')"
	else
		built="given, sha256 $(sha256sum "$ONCEGATE" | cut -c1-12)"
	fi
	[ -x "$ONCEGATE" ] || die "ONCEGATE=$ONCEGATE is not an executable"
}

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

# wait_http URL WHAT [SECONDS]: until URL answers 200, at most SECONDS (default 10).
wait_http() {
	local code secs=${3:-10}
	for _ in $(seq $((secs * 20))); do
		code=$(curl -s -o /dev/null -w '%{http_code}' "$1" || true)
		[ "$code" = 200 ] && return 0
		sleep 0.05
	done
	die "$2 did not answer 200 at $1 within $secs s"
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

# cluster_run_setup: what bench/cluster-cost.sh and bench/partition-cost.sh do before their setups.
# Checks SYNC (auto | always | 1s), makes OUT absolute and tmp a fresh directory (removed on exit,
# with every process started), unsets the ONCEGATE_* and OPENAI_* variables (they would override
# the default configuration), builds or takes the binary, and writes cfg: the default
# configuration with nats.sync set.
cluster_run_setup() {
	local v
	case $SYNC in auto | always | 1s) ;; *) die "SYNC must be auto, always or 1s, got '$SYNC'" ;; esac
	command -v curl >/dev/null || die "curl not found"
	mkdir -p "$OUT"
	OUT=$(cd "$OUT" && pwd)
	tmp=$(mktemp -d)
	trap 'cleanup; rm -rf "$tmp"' EXIT
	trap 'exit 130' INT TERM
	for v in $(compgen -e); do
		case $v in ONCEGATE_* | OPENAI_BASE_URL | OPENAI_API_KEY) unset "$v" ;; esac
	done
	oncegate_binary "$tmp"
	cfg=$OUT/config.yaml
	echo "nats: {sync: $SYNC}" >"$cfg"
}

# stop_setup stops the setup's `oncegate serve` processes (serve_pids).
stop_setup() {
	local p
	for p in "${serve_pids[@]}"; do stop "$p"; done
	serve_pids=()
}

# alive WHEN: every node of the setup still runs (a node that died would drop out of the CPU sum).
alive() {
	local p
	for p in "${serve_pids[@]}"; do kill -0 "$p" 2>/dev/null || die "oncegate serve $p exited $1 (logs in $OUT)"; done
}
