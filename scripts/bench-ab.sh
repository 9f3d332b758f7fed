#!/usr/bin/env bash
# bench-ab.sh — two tidepool binaries side by side, one run, interleaved.
#
#   BIN_A=/tmp/tp-before BIN_B=/tmp/tp-after scripts/bench-ab.sh ROW...
#
# Starts two clusters of two `tidepool serve` processes each (cluster A
# from BIN_A, cluster B from BIN_B; the settings of
# scripts/bench-vs-mooncake.sh: DRAM only, gossip key and peer secret, one
# replica, all on 127.0.0.1), then runs each ROW of bench/mooncake/driver.py
# against A and B in turn, ROUNDS times, alternating which goes first. A ROW
# is the driver's arguments after --system/--node1/--node2, quoted as one
# word, for example
#   "--workload lookup --batch 256 --size 4096 --lookup-via other"
#   "--workload batch-put --batch 64 --size 65536"
# Prints one JSON object per (round, row, binary) and then, per row, the
# median of the rounds' figures for A and B and their ratio (B's advantage:
# > 1 when B is better, whatever the unit).
#
# Environment: BIN_A, BIN_B (required); ROUNDS (default 5); DURATION
# seconds per run (default 2); NODE_CAPACITY MiB of DRAM per node (default
# 512); SETTLE seconds to wait once the clusters are up (default 0; 130
# lets a node's view drop the rings from before the cluster formed, whose
# owners it otherwise asks too for clusterview's 2-minute grace, as a
# cluster long formed has: scripts/bench-vs-mooncake.sh's lookup rows run
# minutes after its start); PY, a Python with the tidepool client's
# dependencies (crc32c, thrift; default .venv-mooncake/bin/python, else
# python3); KEEP_WORK=1 keeps the scratch directory (the serves' logs).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${BIN_A:?BIN_A: the first tidepool binary}" "${BIN_B:?BIN_B: the second tidepool binary}"
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-2}
NODE_CAPACITY=${NODE_CAPACITY:-512}
SETTLE=${SETTLE:-0}
KEEP_WORK=${KEEP_WORK:-0}
PY=${PY:-}
if [[ -z $PY ]]; then
	PY=python3
	[[ -x .venv-mooncake/bin/python ]] && PY=.venv-mooncake/bin/python
fi
(($# > 0)) || { echo "bench-ab: no rows (see the header of $0)" >&2; exit 2; }

log() { echo "bench-ab: $*" >&2; }
# shellcheck source=lib/free-port.sh
source scripts/lib/free-port.sh

WORK=$(mktemp -d /tmp/tidepool-ab.XXXXXX)
SHM=$(mktemp -d /dev/shm/tidepool-ab.XXXXXX 2>/dev/null || mktemp -d "$WORK/arena.XXXXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	if [[ $KEEP_WORK == 1 ]]; then log "logs kept in $WORK"; else rm -rf "$WORK"; fi
	rm -rf "$SHM"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck source=lib/wait-for.sh
source scripts/lib/wait-for.sh

# shellcheck source=lib/tidepool-pair.sh
source scripts/lib/tidepool-pair.sh
start_pair a "$BIN_A" ab-a
start_pair b "$BIN_B" ab-b
log "clusters up: a from $BIN_A, b from $BIN_B; load $(cut -d' ' -f1-3 /proc/loadavg)"
if ((SETTLE > 0)); then
	log "settling for $SETTLE s"
	sleep "$SETTLE"
fi

RESULTS=$WORK/results.jsonl
: >"$RESULTS"
for ((round = 1; round <= ROUNDS; round++)); do
	for r in "$@"; do
		order=(a b)
		((round % 2 == 0)) && order=(b a)
		for s in "${order[@]}"; do
			# shellcheck disable=SC2086
			out=$("$PY" bench/mooncake/driver.py --system tidepool --node1 "$WORK/${s}1/tp.sock" \
				--node2 "$WORK/${s}2/tp.sock" --duration "$DURATION" --prefix "ab$round$s$RANDOM" $r 2>>"$WORK/driver.log" |
				tail -n 1) || { log "round $round $s '$r': driver failed: $(tail -n 3 "$WORK/driver.log")"; exit 1; }
			"$PY" -c 'import json, sys; d = json.loads(sys.argv[1]); d.update(round=int(sys.argv[2]), bin=sys.argv[3], row=sys.argv[4]); print(json.dumps(d))' \
				"$out" "$round" "$s" "$r" | tee -a "$RESULTS"
		done
	done
done
"$PY" - "$RESULTS" "$BIN_A" "$BIN_B" <<'EOF'
import json, statistics, sys
path, a, b = sys.argv[1:4]
rows = {}
for line in open(path):
    d = json.loads(line)
    r = rows.setdefault(d["row"], {"a": [], "b": [], "p99a": [], "p99b": [], "unit": d["unit"], "better": d["better"]})
    r[d["bin"]].append(d["value"])
    if "p99_us" in d:
        r["p99" + d["bin"]].append(d["p99_us"])
load = open("/proc/loadavg").read().split()[:3]
print("# A = %s, B = %s; load average at the end %s" % (a, b, " ".join(load)))
for row, r in rows.items():
    ma, mb = statistics.median(r["a"]), statistics.median(r["b"])
    ratio = mb / ma if r["better"] == "higher" else ma / mb
    extra = ""
    if r["p99a"] and r["p99b"]:
        extra = "; p99 (median of rounds) A %.1f, B %.1f" % (statistics.median(r["p99a"]), statistics.median(r["p99b"]))
    print("%s: A %s, B %s %s, B's advantage %.2f (rounds A %s, B %s%s)" % (
        row, ma, mb, r["unit"], ratio, r["a"], r["b"], extra))
EOF
