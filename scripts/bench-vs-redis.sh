#!/usr/bin/env bash
# bench-vs-redis.sh — tidepool's engine API against Redis, side by side, in
# one run on one machine, with the raw limits measured in the same run.
#
#   scripts/bench-vs-redis.sh
#
# Starts redis-server (Debian's package; installed when missing) on a Unix
# socket with persistence off, and `tidepool serve` on another Unix socket
# (DRAM tier on /dev/shm), then for each value size runs
#   redis-benchmark -s SOCK -t set,get -d SIZE -c CONC -r KEYS -n N
#   tidepool bench --op put|get --size SIZE --concurrency CONC --keys KEYS
#   tidepool bench --op put|get ... --zero-copy      (shared-memory path)
#   tidepool bench --op socket-copy|memcpy ...       (raw limits)
# and prints a Markdown table: both throughputs and their ratio.
#
# Environment:
#   SIZES       value sizes in bytes (default "4096 65536 1048576")
#   CONC        concurrent callers on both sides (default 16)
#   KEYS        key count on both sides (default 256)
#   DURATION    length of each tidepool run (default 5s)
#   REQUESTS    redis-benchmark requests per test, per size in the order of
#               SIZES (default "200000 40000 4000": a few seconds each)
#   TIDEPOOL_BIN  a prebuilt tidepool binary (default: built from this tree)
#   ZERO_COPY   0 skips the zero-copy rows (default 1)
#
# Fairness notes: redis-benchmark SET overwrites one of KEYS keys; tidepool
# put stores a new key per call (a put of an existing key is a no-op), so
# the DRAM tier also evicts as it fills. GETs read random keys of a
# prefilled set of KEYS on both sides. Redis serves from one thread;
# redis-benchmark drives it from one thread.
set -euo pipefail
cd "$(dirname "$0")/.."

SIZES=${SIZES:-"4096 65536 1048576"}
CONC=${CONC:-16}
KEYS=${KEYS:-256}
DURATION=${DURATION:-5s}
REQUESTS=${REQUESTS:-"200000 40000 4000"}
ZERO_COPY=${ZERO_COPY:-1}

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-benchmark >/dev/null 2>&1; then
	if [[ $(id -u) -eq 0 ]]; then sudo=(); else sudo=(sudo -n); fi
	DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q redis-server redis-tools >/dev/null
fi

WORK=$(mktemp -d /tmp/tidepool-vs-redis.XXXXXX)
SHM=$(mktemp -d /dev/shm/tidepool-vs-redis.XXXXXX 2>/dev/null || mktemp -d "$WORK/arena.XXXXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$WORK" "$SHM"
}
trap cleanup EXIT

TP=${TIDEPOOL_BIN:-}
if [[ -z "$TP" ]]; then
	TP=$WORK/tidepool
	go build -o "$TP" ./cmd/tidepool
fi

max_size=0
for s in $SIZES; do ((s > max_size)) && max_size=$s; done

# Redis on a Unix socket only, no persistence.
RSOCK=$WORK/redis.sock
redis-server --port 0 --unixsocket "$RSOCK" --unixsocketperm 700 --save "" --appendonly no \
	--dir "$WORK" --daemonize no --loglevel warning >"$WORK/redis.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do redis-cli -s "$RSOCK" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-cli -s "$RSOCK" ping >/dev/null

# tidepool: DRAM tier only (Redis keeps everything in memory too), large enough for KEYS of the largest value plus room
# for the put runs (which evict once it is full).
TSOCK=$WORK/tp.sock
dram=$(( (KEYS * max_size * 2 / 1048576 + 256) ))MiB
"$TP" serve --socket "$TSOCK" --arena-dir "$SHM" --data-dir "$WORK/data" --dram-capacity "$dram" --ssd-capacity 0 \
	--max-value-size "$(( max_size > 1048576 ? max_size : 1048576 ))" --metrics-addr "" --log-level warn \
	>"$WORK/tp.out" 2>"$WORK/tp.err" &
pids+=($!)
for _ in $(seq 300); do grep -q "serving on socket" "$WORK/tp.out" 2>/dev/null && break; sleep 0.1; done
grep -q "serving on socket" "$WORK/tp.out" || { cat "$WORK/tp.err" >&2; exit 1; }

# tp_bench ARGS...: prints "OPS_PER_SEC BYTES_PER_SEC P99_US" of one run, or "- - -".
tp_bench() {
	local out
	if out=$("$TP" bench --socket "$TSOCK" --ns vsredis --concurrency "$CONC" --keys "$KEYS" \
		--duration "$DURATION" --json --progress none "$@" 2>"$WORK/bench.err"); then
		jq -r '"\(.ops_per_sec) \(.bytes_per_sec) \(.p99_us)"' <<<"$out"
	else
		echo "tidepool bench $*: $(tail -1 "$WORK/bench.err")" >&2
		echo "- - -"
	fi
}

# redis_bench SIZE N: prints "SET_RPS GET_RPS SET_P99_MS GET_P99_MS".
redis_bench() {
	redis-cli -s "$RSOCK" flushall >/dev/null
	redis-benchmark -s "$RSOCK" -t set,get -d "$1" -c "$CONC" -r "$KEYS" -n "$2" --csv 2>/dev/null |
		awk -F, '{for (i = 1; i <= NF; i++) gsub(/"/, "", $i)} $1=="SET"{s=$2; sp=$7} $1=="GET"{g=$2; gp=$7} END{print s, g, sp, gp}'
}

mib() { [[ $1 == - ]] && echo - || awk -v b="$1" 'BEGIN{printf "%.0f", b/1048576}'; }
ratio() { [[ $1 == - || $2 == - ]] && echo - || awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }
ops() { [[ $1 == - ]] && echo - || awk -v a="$1" 'BEGIN{printf "%.0f", a}'; }

echo "# tidepool vs Redis $(redis-server --version | sed -n 's/.*v=\([0-9.]*\).*/\1/p'), $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "# machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# concurrency $CONC, $KEYS keys, tidepool runs of $DURATION"
echo
echo "| value | op | Redis ops/s | Redis MiB/s | Redis p99 µs | tidepool ops/s | tidepool MiB/s | tidepool p99 µs | tidepool / Redis | zero-copy MiB/s | zero-copy / Redis | socket-copy MiB/s | memcpy MiB/s |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
reqs=($REQUESTS)
i=0
for size in $SIZES; do
	n=${reqs[$i]:-${reqs[-1]}}
	i=$((i + 1))
	read -r r_set r_get r_setp99 r_getp99 < <(redis_bench "$size" "$n")
	read -r sc_ops sc_bps _ < <("$TP" bench --op socket-copy --size "$size" --concurrency "$CONC" --duration "$DURATION" --json --progress none | jq -r '"\(.ops_per_sec) \(.bytes_per_sec) \(.p99_us)"')
	read -r mc_ops mc_bps _ < <("$TP" bench --op memcpy --size "$size" --concurrency "$CONC" --duration "$DURATION" --json --progress none | jq -r '"\(.ops_per_sec) \(.bytes_per_sec) \(.p99_us)"')
	for op in put get; do
		read -r t_ops t_bps t_p99 < <(tp_bench --op "$op" --size "$size")
		z_bps=-
		if [[ $ZERO_COPY == 1 ]]; then
			read -r _ z_bps _ < <(tp_bench --op "$op" --size "$size" --zero-copy)
		fi
		if [[ $op == put ]]; then r_ops=$r_set r_p99=$r_setp99 label="SET / put"; else r_ops=$r_get r_p99=$r_getp99 label="GET / get"; fi
		r_bps=$(awk -v o="$r_ops" -v s="$size" 'BEGIN{print o*s}')
		r_p99us=$(awk -v m="$r_p99" 'BEGIN{printf "%.0f", m*1000}')
		z_ratio=-
		[[ $z_bps != - ]] && z_ratio=$(ratio "$z_bps" "$r_bps")
		echo "| $(numfmt --to=iec-i --suffix=B "$size") | $label | $(ops "$r_ops") | $(mib "$r_bps") | $r_p99us | $(ops "$t_ops") | $(mib "$t_bps") | $(ops "$t_p99") | $(ratio "$t_bps" "$r_bps") | $(mib "$z_bps") | $z_ratio | $(mib "$sc_bps") | $(mib "$mc_bps") |"
	done
done
