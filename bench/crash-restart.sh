#!/usr/bin/env bash
# bench/crash-restart.sh: how long a gateway takes to serve again after a crash with KEYS
# retained keys (issue 43 item 0). bench/retention's TestCrashImage writes KEYS completed keys
# the gateway's way into a data directory and SIGKILLs its own process (the store's crash
# image: above a million keys nats-server keeps no index current, so the restart rebuilds
# KV_IDEM from its blocks); then `oncegate serve` starts on that directory, /readyz is polled
# until 200 (its 503 "recovering" answers are counted), and the oldest key's status is read
# through the API (COMPLETED, job id of key 0).
#
#   bench/crash-restart.sh BIN [KEYS]       # KEYS: default 6000000 (a day of 70 intents/s)
#
# Environment: DIR (default a new directory under /tmp; about 1.5 KB of disk per key), PORT
# (18480), HOT (idempotency.hot_ttl, e.g. 30s: the keys are written with a cold tier and the
# image is taken once every key has left the hot tier; serve runs with the same hot_ttl), RATE
# (keys written per second at most; 0: as fast as the writers go), SETTLE (with HOT: how long after
# every key left the hot tier the writer's memory growth per key is measured, as bench/retention's
# TestRetention does, before the kill; default 30s), HEAPPROFILE (with HOT: a heap profile written
# then). Prints the write rate, the memory per key and
# the oldest and newest key read back from the cold tier (with HOT), the time to /readyz 200, and
# the oldest and newest key's status read through the API.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
die() { echo "crash-restart: $*" >&2; exit 1; }
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
[ $# -ge 1 ] || { echo "usage: bench/crash-restart.sh BIN [KEYS]" >&2; exit 2; }
BIN=$(realpath "$1")
KEYS=${2:-6000000}
DIR=${DIR:-$(mktemp -d /tmp/crash-restart.XXXXXX)}
PORT=${PORT:-18480}

echo "== writing $KEYS keys into $DIR, then SIGKILL"
HOT=${HOT:-}
out=$(cd "$here/.." && go test -count=1 -timeout 2h -run '^TestCrashImage$' ./bench/retention/ \
	-args -retention.keys "$KEYS" -retention.crashdir "$DIR" ${HOT:+-retention.hot "$HOT"} ${RATE:+-retention.rate "$RATE"} \
	${SETTLE:+-retention.settle "$SETTLE"} ${HEAPPROFILE:+-retention.heapprofile "$HEAPPROFILE"} 2>&1 || true)
echo "$out" | grep -E 'keys written|left the hot tier|MOVER BEHIND|^before|^after|per retained key|replays|REPLAY|SIGKILL|signal: killed' || die "the crash image was not written: $out"
echo "$out" | grep -q 'signal: killed' || die "the writer was not killed: $out"
du -sh "$DIR/jetstream" | sed 's/^/store: /'
ls "$DIR/jetstream/jetstream/\$G/streams/KV_IDEM/msgs/" | grep -c '\.blk$' | sed 's/^/KV_IDEM blocks: /'
[ -e "$DIR/jetstream/jetstream/\$G/streams/KV_IDEM/msgs/index.db" ] && echo "KV_IDEM index.db present (written before the crash)" || echo "KV_IDEM index.db absent"

echo "== oncegate serve --data-dir $DIR"
start=$(date +%s.%N)
conf=()
if [ -n "$HOT" ]; then
	printf 'idempotency:\n  hot_ttl: %s\n' "$HOT" >"$DIR/hot.yaml"
	conf=(--config "$DIR/hot.yaml")
fi
"$BIN" serve "${conf[@]}" --data-dir "$DIR" --listen "127.0.0.1:$PORT" >"$DIR/serve.log" 2>&1 &
pids+=($!)
recovering=0 refused=0
while :; do
	kill -0 "${pids[0]}" 2>/dev/null || die "serve exited: $(tail -3 "$DIR/serve.log")"
	body=$(curl -s -w ' %{http_code}' "http://127.0.0.1:$PORT/readyz" || true)
	case "$body" in
	*' 200') break ;;
	*recovering*) recovering=$((recovering + 1)) ;;
	*' 000') refused=$((refused + 1)) ;;
	esac
	sleep 0.1
done
ready=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
printf 'ready after %.1f s (polls: %d answered recovering, %d refused or not listening)\n' "$ready" "$recovering" "$refused"
grep -E 'restor|recover' "$DIR/serve.log" | head -5
echo "== the oldest and the newest key"
curl -s "http://127.0.0.1:$PORT/v1/idempotency/0"; echo
curl -s "http://127.0.0.1:$PORT/v1/idempotency/$((KEYS - 1))"; echo
