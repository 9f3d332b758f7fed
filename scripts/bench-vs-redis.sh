#!/usr/bin/env bash
# bench-vs-redis.sh — tidepool's engine API against Redis, side by side, in
# one run on one machine, comparing like with like.
#
#   scripts/bench-vs-redis.sh
#
# Two modes, each a table (MODES selects them):
#
#   memory    both in memory only. tidepool with the SSD tier off
#             (--ssd-capacity 0) and a DRAM budget of DRAM; Redis without
#             persistence (--save "" --appendonly no) with --maxmemory DRAM
#             and --maxmemory-policy allkeys-lru. Writes go to fresh keys on
#             both sides: tidepool put stores a new key per call, and
#             redis-benchmark SET draws its keys from 10^11 (-r), so both
#             fill their budget and then evict, least recently used first.
#             One more table: the gets of resident keys alone and during a
#             zero-copy put flood, as in mode defaults but with nothing to
#             spill (evicted blocks are dropped): what the flood alone costs
#             the reads on these CPUs, the control for mode defaults' row.
#   defaults  tidepool serve on its defaults (SSD tier on, 16 GiB under a
#             data directory on disk, demotion queue, watermarks) except the
#             DRAM budget, which stays DRAM so that the put runs fill it and
#             every further put spills a block to SSD; DRAM is filled before
#             the first put run. Redis is the same in-memory Redis as above
#             (its figures are repeated). Two more rows: the SSD tier's
#             sustained write bandwidth measured in the same run
#             (BenchmarkSSD/write of cache/ssd: 1 MiB puts of distinct keys
#             then a flush that syncs them, SSD_MIB MiB, on the data
#             directory's filesystem), and 1 MiB inline gets of resident
#             keys while a zero-copy put flood spills DRAM to SSD (the gets'
#             throughput, p99 and slowest call against the same gets alone).
#             Both tables show how many evicted blocks were spilled to SSD
#             and how many dropped (the demotion queue was full), read from
#             the sidecar's metrics over the put runs and over the flood.
#
# GETs read random keys of a prefilled set of KEYS on both sides (Redis:
# keys key:000000000000 … written by one EVAL, as redis-benchmark -r KEYS
# names them). tidepool runs inline (value in the Thrift message) and
# zero-copy (--zero-copy: value through the shared arena) and from/into
# registered buffers (--registered: memory of the bench's own, registered
# with the sidecar through its buffer socket; the sidecar copies, and
# checksums a put as it copies). Redis serves from
# one thread and redis-benchmark drives it from one thread; tidepool bench
# drives CONC callers from one process.
#
# Environment:
#   MODES       "memory defaults" (default) or one of them
#   SIZES       value sizes in bytes (default "4096 65536 1048576")
#   CONC        concurrent callers on both sides (default 16)
#   KEYS        keys that GETs read on both sides (default 256)
#   DRAM        tidepool's DRAM budget and Redis's maxmemory, in MiB
#               (default KEYS × largest size × 2 + 256)
#   DURATION    length of each tidepool run (default 5s)
#   REQUESTS    redis-benchmark requests per test (default: 4 GiB worth of
#               values, at least 4000 and at most 200000: a few seconds each)
#   ROUNDS      how many times to run everything (default 1): every round is
#               printed, so the noise of a shared machine shows
#   SSD_MIB     MiB written by the SSD bandwidth run (default 1024)
#   DATA_DIR    parent of tidepool's data directory in mode defaults
#               (default /var/tmp; must be on the disk to measure)
#   TIDEPOOL_BIN  a prebuilt tidepool binary (default: built from this tree)
#   TP_FLAGS    more flags for tidepool serve, in both modes (for example
#               "--demotion-wait 1s"; default none)
#   TP_ZC_FLAGS more flags for tidepool bench's zero-copy runs (for example
#               "--write-mode mapped"; default none)
#
# Needs: redis-server and redis-benchmark (Debian's redis-server and
# redis-tools, installed when missing), jq, and Go for the tree's builds.
set -euo pipefail
cd "$(dirname "$0")/.."

MODES=${MODES:-"memory defaults"}
SIZES=${SIZES:-"4096 65536 1048576"}
CONC=${CONC:-16}
KEYS=${KEYS:-256}
DURATION=${DURATION:-5s}
REQUESTS=${REQUESTS:-}
ROUNDS=${ROUNDS:-1}
SSD_MIB=${SSD_MIB:-1024}
DATA_DIR=${DATA_DIR:-/var/tmp}

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-benchmark >/dev/null 2>&1 || need+=(redis-tools)
command -v jq >/dev/null 2>&1 || need+=(jq)
if ((${#need[@]})); then
	if [[ $(id -u) -eq 0 ]]; then sudo=(); else sudo=(sudo -n); fi
	"${sudo[@]}" apt-get update -q >/dev/null
	DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q "${need[@]}" >/dev/null
fi

WORK=$(mktemp -d /tmp/tidepool-vs-redis.XXXXXX)
DATA=$(mktemp -d "$DATA_DIR/tidepool-vs-redis.XXXXXX")
SHM=$(mktemp -d /dev/shm/tidepool-vs-redis.XXXXXX 2>/dev/null || mktemp -d "$WORK/arena.XXXXXX")
pids=()
tp_pid=
cleanup() {
	for p in "${pids[@]}" $tp_pid; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}" $tp_pid; do wait "$p" 2>/dev/null || true; done
	rm -rf "$WORK" "$SHM" "$DATA"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP PIPE # so that cleanup runs on these too

TP=${TIDEPOOL_BIN:-}
if [[ -z "$TP" ]]; then
	TP=$WORK/tidepool
	go build -o "$TP" ./cmd/tidepool
fi
if [[ " $MODES " == *" defaults "* ]]; then
	go test -c -o "$WORK/ssd.test" ./cache/ssd/ >/dev/null
fi

max_size=0
for s in $SIZES; do ((s > max_size)) && max_size=$s; done
DRAM=${DRAM:-$((KEYS * max_size * 2 / 1048576 + 256))}
max_value=$((max_size > 1048576 ? max_size : 1048576))
read -ra zc_flags <<<"${TP_ZC_FLAGS:-}"

# Redis on a Unix socket only: no persistence, maxmemory = tidepool's DRAM
# budget, least recently used keys evicted.
RSOCK=$WORK/redis.sock
redis-server --port 0 --unixsocket "$RSOCK" --unixsocketperm 700 --save "" --appendonly no \
	--maxmemory "$((DRAM * 1048576))" --maxmemory-policy allkeys-lru \
	--dir "$WORK" --daemonize no --loglevel warning >"$WORK/redis.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do redis-cli -s "$RSOCK" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-cli -s "$RSOCK" ping >/dev/null

TSOCK=$WORK/tp.sock
# Metrics on a free loopback port, read for the demotion counters of mode
# defaults.
# shellcheck source=lib/free-port.sh
source scripts/lib/free-port.sh
METRICS=127.0.0.1:$(free_port)
# demotions: prints "WRITTEN DROPPED", the sidecar's demotion counters so far.
demotions() {
	curl -sf "http://$METRICS/metrics" | awk '
		$1 == "tidepool_demotions_total" { w = $2 }
		$1 == "tidepool_demotions_dropped_total" { d = $2 }
		END { printf "%d %d\n", w, d }'
}
# tp_start MODE: starts tidepool serve for MODE on a fresh arena and data
# directory.
tp_start() {
	rm -rf "$SHM"/* "$DATA"/* "$TSOCK" "$WORK/tp.out"
	local ssd=() tp_flags=()
	[[ $1 == memory ]] && ssd=(--ssd-capacity 0)
	read -ra tp_flags <<<"${TP_FLAGS:-}"
	"$TP" serve --socket "$TSOCK" --arena-dir "$SHM" --data-dir "$DATA/data" --dram-capacity "${DRAM}MiB" "${ssd[@]}" \
		--max-value-size "$max_value" --metrics-addr "$METRICS" --log-level warn "${tp_flags[@]}" >"$WORK/tp.out" 2>"$WORK/tp.err" &
	tp_pid=$!
	for _ in $(seq 300); do grep -q "serving on socket" "$WORK/tp.out" 2>/dev/null && break; sleep 0.1; done
	grep -q "serving on socket" "$WORK/tp.out" || { cat "$WORK/tp.err" >&2; exit 1; }
}
tp_stop() {
	kill "$tp_pid" 2>/dev/null || true
	wait "$tp_pid" 2>/dev/null || true
	tp_pid=
}

# tp_bench ARGS...: prints "OPS_PER_SEC BYTES_PER_SEC P99_US MAX_US MISSES"
# of one run, or "- - - - -".
tp_bench() {
	local out
	if out=$("$TP" bench --socket "$TSOCK" --ns vsredis --concurrency "$CONC" --keys "$KEYS" \
		--duration "$DURATION" --json --progress none "$@" 2>"$WORK/bench.err"); then
		jq -r 'if .errors > 0 then "- - - - -" else "\(.ops_per_sec) \(.bytes_per_sec) \(.p99_us) \(.max_us) \(.misses)" end' <<<"$out"
	else
		echo "tidepool bench $*: $(tail -1 "$WORK/bench.err")" >&2
		kill -0 "$tp_pid" 2>/dev/null || { echo "tidepool serve exited:" >&2; tail -5 "$WORK/tp.err" >&2; }
		echo "- - - - -"
	fi
}

# redis_csv ARGS...: runs redis-benchmark, prints "RPS P99_MS" of its one test.
redis_csv() {
	redis-benchmark -s "$RSOCK" -c "$CONC" --csv "$@" 2>/dev/null |
		awk -F, '{for (i = 1; i <= NF; i++) gsub(/"/, "", $i)} $1=="SET"||$1=="GET"{r=$2; p=$7} END{print r, p}'
}

# redis_bench SIZE N: prints "SET_RPS SET_P99_MS GET_RPS GET_P99_MS": SET to
# fresh keys from an empty database, then GET of KEYS prefilled keys.
redis_bench() {
	local set get
	redis-cli -s "$RSOCK" flushall >/dev/null
	set=$(redis_csv -t set -d "$1" -r 100000000000 -n "$2")
	redis-cli -s "$RSOCK" flushall >/dev/null
	redis-cli -s "$RSOCK" eval "local v = string.rep('x', tonumber(ARGV[2])) for i = 0, tonumber(ARGV[1]) - 1 do redis.call('SET', string.format('key:%012d', i), v) end return 1" 0 "$KEYS" "$1" >/dev/null
	get=$(redis_csv -t get -d "$1" -r "$KEYS" -n "$2")
	echo "$set $get"
}

# ssd_write: prints the SSD tier's sustained write bandwidth in bytes/s,
# with the blocks where the serve keeps them: in RocksDB's blob files when
# TP_FLAGS turns the value log off (--ssd-value-log-min 0), else in the
# value log.
ssd_write() {
	local out store=
	[[ " ${TP_FLAGS:-} " == *" --ssd-value-log-min 0 "* ]] && store=rocksdb
	out=$(cd "$WORK" && TIDEPOOL_SSD_BENCH_STORE=$store TIDEPOOL_SSD_BENCH_DIR=$DATA ./ssd.test -test.run '^$' -test.bench '^BenchmarkSSD$/write' \
		-test.benchtime "${SSD_MIB}x" -test.count 1 2>&1) || { echo -; return; }
	awk '/^BenchmarkSSD\/write/ { for (i = 1; i <= NF; i++) if ($(i+1) == "MB/s") print $i * 1e6 }' <<<"$out"
}

mib() { [[ $1 == - ]] && echo - || awk -v b="$1" 'BEGIN{printf "%.0f", b/1048576}'; }
ratio() { [[ $1 == - || $2 == - ]] && echo - || awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }
num() { [[ $1 == - ]] && echo - || awk -v a="$1" 'BEGIN{printf "%.0f", a}'; }
ms_us() { [[ -z $1 || $1 == - ]] && echo - || awk -v m="$1" 'BEGIN{printf "%.0f", m*1000}'; }

echo "# tidepool vs Redis $(redis-server --version | sed -n 's/.*v=\([0-9.]*\).*/\1/p'), $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "# machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# concurrency $CONC, $KEYS keys read, DRAM budget = Redis maxmemory = $DRAM MiB, tidepool runs of $DURATION"
[[ -n ${TP_FLAGS:-}${TP_ZC_FLAGS:-} ]] && echo "# tidepool serve flags: ${TP_FLAGS:-none}; zero-copy bench flags: ${TP_ZC_FLAGS:-none}"

# flood_reads: gets of resident keys of the largest size alone (g_*), then
# under a zero-copy put flood of fresh keys (f_*; fl: the flood's bytes per
# second), with the demotion counters before and after the flood (dw0 dd0,
# dw1 dd1).
flood_reads() {
	read -r g_ops g_bps g_p99 g_max g_miss < <(tp_bench --op get --size "$max_size")
	read -r dw0 dd0 < <(demotions)
	"$TP" bench --socket "$TSOCK" --ns flood --op put --zero-copy --size "$max_size" --concurrency "$CONC" \
		--duration "$(($(sed 's/s$//' <<<"$DURATION") + 3))s" --json --progress none >"$WORK/flood.json" 2>&1 &
	local flood=$!
	sleep 1
	read -r f_ops f_bps f_p99 f_max f_miss < <(tp_bench --op get --size "$max_size")
	wait "$flood" || true
	fl=$(jq -r '.bytes_per_sec' "$WORK/flood.json" 2>/dev/null || echo -)
	read -r dw1 dd1 < <(demotions)
}

declare -A R # Redis figures of this round, by size
for round in $(seq "$ROUNDS"); do
	for size in $SIZES; do
		n=${REQUESTS:-$(((4096 * 1048576 / size) < 4000 ? 4000 : ((4096 * 1048576 / size) > 200000 ? 200000 : (4096 * 1048576 / size))))}
		R[$size]=$(redis_bench "$size" "$n")
	done
	for mode in $MODES; do
		echo
		if [[ $mode == memory ]]; then
			echo "## round $round, (a) both in memory only, fresh keys (load average $(cut -d' ' -f1 /proc/loadavg))"
		else
			echo "## round $round, (b) tidepool on its defaults, SSD tier on, DRAM spilling (load average $(cut -d' ' -f1 /proc/loadavg))"
		fi
		echo
		echo "| value | op | Redis MiB/s | inline MiB/s | inline ÷ Redis | zero-copy MiB/s | zero-copy ÷ Redis | registered MiB/s | registered ÷ Redis | Redis p99 µs | inline p99 µs | zero-copy p99 µs | registered p99 µs |"
		echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
		tp_start "$mode"
		filled=0 t_last_put=- z_last_put=-
		for size in $SIZES; do
			read -r r_set r_setp99 r_get r_getp99 <<<"${R[$size]}"
			if [[ $mode == defaults && $filled == 0 ]]; then
				# Fill DRAM (and start the spill) before the first put run.
				"$TP" bench --socket "$TSOCK" --ns fill --op put --zero-copy --size "$max_size" --concurrency "$CONC" \
					--ops "$((DRAM * 1048576 / max_size + CONC))" --json --progress none >/dev/null 2>&1 || true
				filled=1
				read -r pw0 pd0 < <(demotions)
			fi
			for op in put get; do
				read -r t_ops t_bps t_p99 _ < <(tp_bench --op "$op" --size "$size")
				read -r z_ops z_bps z_p99 _ < <(tp_bench --op "$op" --size "$size" --zero-copy "${zc_flags[@]}")
				read -r g_ops g_bps g_p99 _ < <(tp_bench --op "$op" --size "$size" --registered)
				if [[ $op == put ]]; then r_ops=${r_set:--} r_p99=$r_setp99 label="SET / put"; else r_ops=${r_get:--} r_p99=$r_getp99 label="GET / get"; fi
				r_bps=$([[ $r_ops == - ]] && echo - || awk -v o="$r_ops" -v s="$size" 'BEGIN{print o*s}')
				if [[ $op == put && $size == "$max_size" ]]; then t_last_put=$t_bps z_last_put=$z_bps; fi
				echo "| $(numfmt --to=iec-i --suffix=B "$size") | $label | $(mib "$r_bps") | $(mib "$t_bps") | $(ratio "$t_bps" "$r_bps") | $(mib "$z_bps") | $(ratio "$z_bps" "$r_bps") | $(mib "$g_bps") | $(ratio "$g_bps" "$r_bps") | $(ms_us "$r_p99") | $(num "$t_p99") | $(num "$z_p99") | $(num "$g_p99") |"
			done
		done
		if [[ $mode == defaults ]]; then
			read -r pw1 pd1 < <(demotions)
			flood_reads
			tp_stop
			rm -rf "${DATA:?}"/*
			sync
			ssd_bps=$(ssd_write)
			echo
			echo "| SSD tier sustained write (BenchmarkSSD/write, $SSD_MIB MiB) | tidepool SET $(numfmt --to=iec-i --suffix=B "$max_size"), zero-copy ÷ it | inline ÷ it | blocks spilled / dropped during the put runs |"
			echo "| ---: | ---: | ---: | --- |"
			echo "| $(mib "$ssd_bps") MiB/s | $(ratio "$z_last_put" "$ssd_bps") | $(ratio "$t_last_put" "$ssd_bps") | $((pw1 - pw0)) / $((pd1 - pd0)) |"
			echo
			echo "| $(numfmt --to=iec-i --suffix=B "$max_size") inline get, $CONC callers | MiB/s | p99 µs | slowest µs | misses | blocks spilled / dropped meanwhile |"
			echo "| --- | ---: | ---: | ---: | ---: | --- |"
			echo "| alone | $(mib "$g_bps") | $(num "$g_p99") | $(num "$g_max") | $g_miss | |"
			echo "| during a zero-copy put flood ($(mib "$fl") MiB/s of puts, spilling) | $(mib "$f_bps") | $(num "$f_p99") | $(num "$f_max") | $f_miss | $((dw1 - dw0)) / $((dd1 - dd0)) |"
		else
			# The same reads and flood with nothing to spill to: what the
			# flood alone costs the reads on these CPUs, the control for (b).
			flood_reads
			tp_stop
			echo
			echo "| $(numfmt --to=iec-i --suffix=B "$max_size") inline get, $CONC callers | MiB/s | p99 µs | slowest µs | misses |"
			echo "| --- | ---: | ---: | ---: | ---: |"
			echo "| alone | $(mib "$g_bps") | $(num "$g_p99") | $(num "$g_max") | $g_miss |"
			echo "| during a zero-copy put flood ($(mib "$fl") MiB/s of puts, evicting, no SSD tier) | $(mib "$f_bps") | $(num "$f_p99") | $(num "$f_max") | $f_miss |"
		fi
	done
done
