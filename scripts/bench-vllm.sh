#!/usr/bin/env bash
# Time to first token of a prefix hit in vLLM (CPU build), every way side
# by side in one invocation, interleaved rounds (tests/engines/bench_vllm.py):
# recompute, vLLM's own prefix cache (same process), tidepool (local hit, a
# hit fetched from a peer sidecar, a hit from the SSD tier), vLLM's
# ExampleConnector, vLLM's OffloadingConnector (a row saying why when it
# cannot run here), and with BENCH_BEFORE=REV the connector of git
# revision REV. Then `tidepool bench` zero-copy GETs of the same block size
# against a sidecar of its own, for the load path's yardstick. Figures:
# docs/PERFORMANCE.md.
#
#   scripts/bench-vllm.sh [ROUNDS] [PREFIX_TOKENS] [BLOCK_SIZE]   (default 3 2048 32)
#   BENCH_LAYERS=8 BENCH_HIDDEN=512     the model (Llama-style, 4 KV heads of 64, float32)
#   BENCH_BEFORE=main                   add main's connector as a row
#   BENCH_WARM=0                        time each request without the untimed two-token
#                                       request that runs just before it (every row alike)
#   BENCH_PROFILE=/tmp/prof             cProfile of the tidepool engines' hits (.T, .B)
#   BENCH_RT=1                          run everything (sidecars, engines, the yardstick) at
#                                       real-time priority (chrt -f 10, root): a shared machine's
#                                       other work then waits, and every row the same; the
#                                       sidecars' gossip then competes with the engines at one
#                                       priority (docs/PERFORMANCE.md §18)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
prefix=${2:-2048}
bs=${3:-32}
VENV=${VENV:-.venv-engines}
VENV=$VENV scripts/install-engines.sh >/dev/null
mkdir -p bin
go build -o bin/tidepool ./cmd/tidepool
# Files (the SSD tier, ExampleConnector's safetensors, logs) on disk; the
# sidecars' DRAM arenas in shared memory, as in a pod.
tmp=$(mktemp -d /tmp/tp-bench-vllm.XXXXXX)
shm=$tmp
[[ -d /dev/shm && -w /dev/shm ]] && shm=$(mktemp -d /dev/shm/tp-bench-vllm.XXXXXX)
trap 'rm -rf "$tmp" "$shm"' EXIT
export BENCH_SHM=$shm
export PYTHONPATH=$PWD/clients/python${PYTHONPATH:+:$PYTHONPATH}
if [[ -n "${BENCH_BEFORE:-}" ]]; then
	mkdir -p "$tmp/before"
	git archive "$BENCH_BEFORE" clients/python/tidepool | tar -x -C "$tmp/before" -f -
	mv "$tmp/before/clients/python/tidepool" "$tmp/before/tidepool_before"
	export BENCH_BEFORE_PKG=$tmp/before
fi
rt=()
[[ -n "${BENCH_RT:-}" ]] && rt=(chrt -f 10)
echo "bench-vllm: $(date -u +%FT%TZ) load: $(uptime | sed 's/.*load average: //')${rt:+ (real-time priority)}"
VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} \
	"${rt[@]}" "$VENV/bin/python" tests/engines/bench_vllm.py "$tmp" "$PWD/bin/tidepool" "$rounds" "$prefix" "$bs" \
	</dev/null 2>"$tmp/bench.log" || { tail -n 40 "$tmp/bench.log" "$tmp"/engine-*.log; exit 1; }
# The yardstick: zero-copy GETs of the same block size (docs/bench.md).
layers=${BENCH_LAYERS:-8}
size=$((bs * layers * 4 * 64 * 2 * 4 + 64))
"${rt[@]}" bin/tidepool serve --socket "$tmp/y.sock" --data-dir "$tmp/ydata" --arena-dir "$shm/yarenas" \
	--dram-capacity 2GiB --max-value-size 64MiB --metrics-addr 127.0.0.1:0 --ssd-capacity 0 \
	--log-level warn </dev/null >"$tmp/y.out" 2>"$tmp/y.log" &
ypid=$!
for _ in $(seq 600); do [[ -S "$tmp/y.sock" ]] && break; sleep 0.1; done
"${rt[@]}" bin/tidepool bench --socket "$tmp/y.sock" --op get --zero-copy --size "$size" --keys 200 --concurrency 1 \
	--duration 5s --progress none 2>&1 | tail -4 || true
kill "$ypid"; wait "$ypid" 2>/dev/null || true
echo "bench-vllm: done $(date -u +%FT%TZ) load: $(uptime | sed 's/.*load average: //')"
