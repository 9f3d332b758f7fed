#!/bin/bash
# The engine-API (§1) and zero-copy (§2) benchmarks of docs/PERFORMANCE.md for
# two commits side by side, interleaved round by round, one serve per round
# and commit (issue 39: "behaviour and speed stay as they are").
#
#   scripts/bench-house.sh BEFORE [AFTER] [ROUNDS] [DURATION]
#   scripts/bench-house.sh 2590397 HEAD 4 3s
#
# Builds `tidepool` and the client's test binary of each commit in a
# temporary worktree, then per round and commit: `tidepool serve` (1 GiB of
# DRAM, its own directories), `tidepool bench` over eleven rows, and the
# client benchmark `ZeroCopy` (an in-process sidecar). Prints one table:
# medians per row and the ratio AFTER ÷ BEFORE (> 1: faster after).
set -euo pipefail
before=${1:?usage: bench-house.sh BEFORE [AFTER] [ROUNDS] [DURATION]}
after=${2:-HEAD}; rounds=${3:-4}; dur=${4:-3s}
repo=$(git rev-parse --show-toplevel)
w=$(mktemp -d /tmp/bench-house.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; git -C "$repo" worktree remove --force "$w/src" 2>/dev/null || true; rm -rf "$w"' EXIT
for v in before after; do
  rev=$([ $v = before ] && echo "$before" || echo "$after")
  git -C "$repo" worktree add -q --detach "$w/src" "$rev"
  (cd "$w/src" && go build -o "$w/tp-$v" ./cmd/tidepool && go test -c -o "$w/client-$v.test" ./client/)
  git -C "$repo" worktree remove --force "$w/src"
done
rows=(
  "get 1MiB 16 -" "put 1MiB 16 -" "get 1MiB 1 -" "put 1MiB 1 -" "get 4KiB 16 -"
  "get 1MiB 16 --zero-copy" "put 1MiB 16 --zero-copy" "get 1MiB 1 --zero-copy" "put 1MiB 1 --zero-copy"
  "lookup 4KiB 1 -" "batch-get 64KiB 1 -"
)
out=$w/results.tsv; : > "$out"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$rounds"); do
  for v in before after; do
    d=$w/run; rm -rf "$d"; mkdir -p "$d"
    "$w/tp-$v" serve --socket "$d/s.sock" --dram-capacity 1GiB --data-dir "$d/data" --arena-dir "$d/arenas" \
      --metrics-addr '' > "$d/serve.log" 2>&1 &
    pid=$!
    for _ in $(seq 150); do [ -S "$d/s.sock" ] && break; sleep 0.2; done
    for row in "${rows[@]}"; do
      read -r op size conc zc <<< "$row"; [ "$zc" = - ] && zc=
      "$w/tp-$v" bench --socket "$d/s.sock" --op "$op" --size "$size" --concurrency "$conc" --duration "$dur" \
        --keys 256 $zc --json 2>/dev/null | head -1 |
        python3 -c "import sys,json; d=json.load(sys.stdin); u='ops/s' if '$size'=='4KiB' else 'MiB/s'; \
print('$v\t$op $size c=$conc ${zc:-inline} (%s)\t%f' % (u, d['ops_per_sec'] if u=='ops/s' else d['bytes_per_sec']/2**20))" >> "$out"
    done
    kill "$pid"; wait "$pid" 2>/dev/null || true
    (cd "$repo/client" && "$w/client-$v.test" -test.run '^$' -test.benchtime 300x \
      -test.bench 'ZeroCopy/callers=(1|16)/(memcpy|GetInto|PutFrom-pwrite|PutFrom-mapped)$' 2>/dev/null) |
      awk -v v=$v '/^Benchmark/ { for (i = 1; i < NF; i++) if ($(i+1) == "%memcpy") printf "%s\tclient %s (%% of memcpy)\t%s\n", v, $1, $i }' >> "$out"
  done
  echo "round $r done: load $(cut -d' ' -f1-3 /proc/loadavg)"
done
python3 - "$out" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    v, row, x = line.rstrip('\n').split('\t')
    d[row][v].append(float(x))
print('| row | before (median; rounds) | after | after ÷ before |')
print('| --- | --- | --- | ---: |')
for row, v in d.items():
    b, a = v['before'], v['after']
    if b and a:
        mb, ma = statistics.median(b), statistics.median(a)
        print(f"| {row} | {mb:.0f} ({', '.join(f'{x:.0f}' for x in b)}) | {ma:.0f} ({', '.join(f'{x:.0f}' for x in a)}) | {ma/mb:.2f} |")
PY
