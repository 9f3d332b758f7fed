#!/usr/bin/env bash
# The hand-written wire formats against the alternatives they could be
# (docs/architecture.md, "Hand-written wire formats"; figures in
# docs/PERFORMANCE.md): each benchmark's rows run in interleaved rounds,
# each round one invocation of its test binary with every row in it, and
# what is printed is the median per row and the median of the rounds'
# ratios to the first row (a shared machine's load moves both rows of a
# round alike).
#
#   scripts/bench-formats.sh [ROUNDS]   (default 10)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-10}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
benches=(
	"cluster BenchmarkMetaCodec 100ms"
	"cache/ssd BenchmarkRecordCodec 100ms"
	"proxy/engineapi BenchmarkBufCodec 100ms"
	"client BenchmarkSmallGetOp 2000x"
)
for b in "${benches[@]}"; do
	read -r pkg _ _ <<<"$b"
	go test -c -o "$tmp/${pkg//\//_}.test" "./$pkg/"
done
uptime
for ((r = 1; r <= rounds; r++)); do
	for b in "${benches[@]}"; do
		read -r pkg name bt <<<"$b"
		(cd "$pkg" && "$tmp/${pkg//\//_}.test" -test.run '^$' -test.bench "^$name\$" -test.benchtime "$bt") |
			sed -n "s/^\($name[^ \t]*\)-[0-9]*[ \t].*[ \t]\([0-9.]*\) ns\/op.*/$r \1 \2/p"
	done
done >"$tmp/rows"
uptime
python3 - "$tmp/rows" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(dict)  # bench -> row -> {round: ns}
for line in open(sys.argv[1]):
    r, name, ns = line.split()
    bench, _, row = name.partition("/")
    group, _, row = row.rpartition("/") if row.count("/") else ("", "", row)
    rows[bench + ("/" + group if group else "")].setdefault(row, {})[r] = float(ns)
for bench, by in rows.items():
    first = next(iter(by))
    print(bench)
    for row, ns in by.items():
        ratios = [ns[r] / by[first][r] for r in ns if r in by[first]]
        print(f"  {row:28s} median {statistics.median(ns.values()):10.1f} ns/op"
              f"  {statistics.median(ratios):5.2f}x {first} (rounds {min(ratios):.2f}-{max(ratios):.2f}, n={len(ratios)})")
PY
