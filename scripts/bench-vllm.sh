#!/usr/bin/env bash
# TTFT of vLLM (CPU build) with a 2,048-token prefix in tidepool versus
# recomputed, same engine process, several rounds; plus the load and save
# paths' bytes per second (tests/engines/bench_vllm.py). Figures:
# docs/engines.md. BENCH_SAVE_MAPPED=1 saves every block through
# writable_slot (the connector's path for blocks not in host memory).
#
#   scripts/bench-vllm.sh [ROUNDS] [PREFIX_TOKENS]     (default 3 2048)
#   BENCH_LAYERS=8 BENCH_HIDDEN=1536 scripts/bench-vllm.sh   (the model: Llama-style, GQA 4 KV heads)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
prefix=${2:-2048}
scripts/install-engines.sh >/dev/null
mkdir -p bin
go build -o bin/tidepool ./cmd/tidepool
base=/tmp
[[ -d /dev/shm && -w /dev/shm ]] && base=/dev/shm
tmp=$(mktemp -d "$base/tp-bench-vllm.XXXXXX")
pid=
cleanup() {
	[[ -n "$pid" ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT
bin/tidepool serve --socket "$tmp/tp.sock" --data-dir "$tmp/data" --arena-dir "$tmp/arenas" \
	--dram-capacity 1GiB --max-value-size 16MiB --metrics-addr 127.0.0.1:0 --ssd-capacity 0 \
	--log-level warn </dev/null >"$tmp/serve.out" 2>"$tmp/serve.log" &
pid=$!
for _ in $(seq 600); do
	[[ -S "$tmp/tp.sock" ]] && break
	sleep 0.1
done
VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2} \
	.venv-engines/bin/python tests/engines/bench_vllm.py "$tmp/model" "$tmp/tp.sock" "$rounds" "$prefix" \
	>"$tmp/engine.out" 2>"$tmp/engine.log" </dev/null || { tail -40 "$tmp/engine.out" "$tmp/engine.log"; exit 1; }
grep -E '^(\{|SUMMARY)' "$tmp/engine.out"
