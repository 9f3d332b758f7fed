#!/usr/bin/env bash
# bench-ssd.sh — the SSD tier (cache/ssd) against fio, side by side, on the
# same filesystem and in the same run.
#
#   scripts/bench-ssd.sh [DIR]
#
# DIR (default: a new directory under /var/tmp) must be on the filesystem to
# measure; it must support O_DIRECT (tmpfs does not). Environment:
#   SIZE_MIB   data written and read by each side, in MiB (default 1024)
#   ROUNDS     how many times to run the whole comparison (default 1); the
#              table shows every round, so noise on a shared machine is seen
#
# fio: one job, 1 MiB blocks, ioengine=psync (one request in flight, like the
# tier's single caller), direct=1, sequential write with a final fsync, then
# sequential read of the same file. The tier: BenchmarkSSD (1 MiB blocks,
# -benchtime=${SIZE_MIB}x): write = puts + the final flush that syncs the blob
# files; read = gets with O_DIRECT reads (TIDEPOOL_SSD_BENCH_DIRECT=1).
# Targets: tier write >= 70% of fio write, tier read >= 60% of fio read.
# Row "wbuf" is a reference: fio's buffered write (direct=0, final fsync),
# which is how RocksDB writes blob files; its ratio is tier write / it.
# Before each measured step the script runs sync(1), so that the writeback
# and the discards (the root filesystem of the development VM is mounted
# with "discard": deleting 1 GiB costs the disk ~0.5 s) left by the previous
# step are not charged to the next one, whichever side it is.
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE_MIB=${SIZE_MIB:-1024}
ROUNDS=${ROUNDS:-1}
DIR=${1:-}
if [[ -z "$DIR" ]]; then
	DIR=$(mktemp -d /var/tmp/tidepool-bench-ssd.XXXXXX)
	trap 'rm -rf "$DIR"' EXIT
fi
mkdir -p "$DIR"

if ! command -v fio >/dev/null 2>&1; then
	if [[ $(id -u) -eq 0 ]]; then sudo=(); else sudo=(sudo -n); fi
	DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q fio >/dev/null
fi

# fio_mbps RW [DIRECT]: runs one fio job and prints its bandwidth in MB/s
# (10^6 bytes/s).
fio_mbps() {
	sync
	fio --name="tidepool-$1" --directory="$DIR" --filename=fio.dat \
		--rw="$1" --bs=1M --size="${SIZE_MIB}M" --direct="${2:-1}" --ioengine=psync \
		--numjobs=1 --end_fsync=1 --output-format=terse --terse-version=3 |
		awk -F';' -v rw="$1" '{ kib = (rw == "read") ? $7 : $48; printf "%.1f\n", kib * 1024 / 1e6 }'
}

echo "# building the benchmark binary"
go test -c -o "$DIR/ssd.test" ./cache/ssd/ >/dev/null

fs=$(df -T "$DIR" | awk 'NR == 2 { print $2 " on " $1 }')
echo "# dir $DIR ($fs), ${SIZE_MIB} MiB per run, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-6s %-6s %12s %12s %8s %8s\n' round op "fio MB/s" "tier MB/s" ratio target
for round in $(seq 1 "$ROUNDS"); do
	fw=$(fio_mbps write)
	fr=$(fio_mbps read)
	rm -f "$DIR/fio.dat"
	fb=$(fio_mbps write 0) # buffered write + fsync: what the tier's flush does
	rm -f "$DIR/fio.dat"
	sync
	out=$(cd "$DIR" && TIDEPOOL_SSD_BENCH_DIR="$DIR" TIDEPOOL_SSD_BENCH_DIRECT=1 \
		./ssd.test -test.run '^$' -test.bench '^BenchmarkSSD$' -test.benchtime "${SIZE_MIB}x" -test.count 1)
	tw=$(awk '/^BenchmarkSSD\/write/ { for (i = 1; i <= NF; i++) if ($(i+1) == "MB/s") print $i }' <<<"$out")
	tr=$(awk '/^BenchmarkSSD\/read/ { for (i = 1; i <= NF; i++) if ($(i+1) == "MB/s") print $i }' <<<"$out")
	if [[ -z "$tw" || -z "$tr" ]]; then
		echo "benchmark output not understood:" >&2
		echo "$out" >&2
		exit 1
	fi
	awk -v r="$round" -v fw="$fw" -v tw="$tw" -v fr="$fr" -v tr="$tr" -v fb="$fb" 'BEGIN {
		printf "%-6s %-6s %12.1f %12.1f %7.0f%% %7s\n", r, "write", fw, tw, 100 * tw / fw, ">=70%"
		printf "%-6s %-6s %12.1f %12.1f %7.0f%% %7s\n", r, "read", fr, tr, 100 * tr / fr, ">=60%"
		printf "%-6s %-6s %12.1f %12s %7.0f%% %7s\n", r, "wbuf", fb, "(ref)", 100 * tw / fb, "-"
	}'
done
