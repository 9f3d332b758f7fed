#!/usr/bin/env bash
# bench-spill.sh — reads of blocks evicted to SSD while a put flood spills
# DRAM, on one tidepool serve; prints one Markdown row.
#
#   scripts/bench-spill.sh LABEL [SERVE FLAGS...]
#   scripts/bench-spill.sh default
#   scripts/bench-spill.sh "demotion_wait 1s" --demotion-wait 1s
#
# The serve runs on its defaults (SSD tier on, under a fresh data directory
# in DATA_DIR) with a 768 MiB DRAM budget, plus the flags given. 900 fresh
# 1 MiB puts fill DRAM and start it spilling; once the demotion queue is
# empty, 16 callers read 128 hot 1 MiB keys for 4 s (alone), then a
# zero-copy put flood of 16 callers runs for 6 s and the same reads run
# for 4 s from its first second on: the hot keys, unread during that
# second, are evicted, so the reads find them in SSD, in the demotion
# queue, or not at all (misses) where their demotion was dropped.
#
# Row: LABEL | gets alone: MiB/s, p99 ms | gets during the flood: MiB/s,
# p99 ms, slowest ms, misses | flood: MiB/s, p99 ms | demotions dropped |
# evictions that waited for room | seconds waited (the last three from the
# serve's metrics, over the gets and the flood).
#
# Environment: TIDEPOOL_BIN (a prebuilt binary; default: built from this
# tree), DATA_DIR (default /var/tmp: on the disk to measure). Needs jq, curl.
set -euo pipefail
cd "$(dirname "$0")/.."
(($# >= 1)) || { sed -n '2,9p' "$0" >&2; exit 2; }
label=$1
shift
W=$(mktemp -d "${DATA_DIR:-/var/tmp}/bench-spill.XXXXXX")
SHM=$(mktemp -d /dev/shm/bench-spill.XXXXXX)
pid=
cleanup() {
	[[ -n $pid ]] && { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
	rm -rf "$W" "$SHM"
}
trap cleanup EXIT
TP=${TIDEPOOL_BIN:-}
if [[ -z $TP ]]; then
	TP=$W/tidepool
	go build -o "$TP" ./cmd/tidepool
fi
# shellcheck source=lib/free-port.sh
source scripts/lib/free-port.sh
M=127.0.0.1:$(free_port)
"$TP" serve --socket "$W/s.sock" --arena-dir "$SHM" --data-dir "$W/data" --dram-capacity 768MiB \
	--metrics-addr "$M" --log-level warn "$@" >"$W/out" 2>"$W/err" &
pid=$!
for _ in $(seq 300); do grep -q "serving on socket" "$W/out" 2>/dev/null && break; sleep 0.1; done
grep -q "serving on socket" "$W/out" || { cat "$W/err" >&2; exit 1; }

b() { "$TP" bench --socket "$W/s.sock" --size 1MiB --concurrency 16 --progress none --json "$@"; }
# met NAME: the serve's metric NAME now (0 when absent).
met() { curl -sf "http://$M/metrics" | awk -v n="$1" -v f="${2:-%d}" '$1 == n { v = $2 } END { printf f "\n", v }'; }

b --ns fill --op put --ops 900 >/dev/null
while [[ $(met tidepool_demotion_queue_blocks) != 0 ]]; do sleep 0.2; done
d0=$(met tidepool_demotions_dropped_total)
w0=$(met tidepool_demotion_waits_total)
s0=$(met tidepool_demotion_wait_seconds_total %.3f)
alone=$(b --ns hot --op get --keys 128 --duration 4s | jq -r '"\(.bytes_per_sec/1048576|floor), \(.p99_us/1000|floor)"')
b --ns flood --op put --zero-copy --duration 6s >"$W/flood" &
fp=$!
sleep 1
during=$(b --ns hot --op get --keys 128 --duration 4s --no-prefill |
	jq -r '"\(.bytes_per_sec/1048576|floor), \(.p99_us/1000|floor), \(.max_us/1000|floor), \(.misses)"')
wait "$fp"
flood=$(jq -r '"\(.bytes_per_sec/1048576|floor), \(.p99_us/1000|floor)"' "$W/flood")
d1=$(met tidepool_demotions_dropped_total)
w1=$(met tidepool_demotion_waits_total)
s1=$(met tidepool_demotion_wait_seconds_total %.3f)
printf '| %s | %s | %s | %s | %d | %d | %.1f |\n' "$label" "$alone" "$during" "$flood" \
	$((d1 - d0)) $((w1 - w0)) "$(awk -v a="$s0" -v b="$s1" 'BEGIN { print b - a }')"
