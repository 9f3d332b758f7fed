#!/usr/bin/env bash
# The GPU end on a GPU machine (H100/H200, CUDA driver, PyTorch; no network,
# no RocksDB): one run, under 8 minutes, nothing downloaded. NOT RUN YET:
# no GPU was lent while it was written (docs/gpu.md).
#
#   scripts/device-check.sh --prepare   here: builds .device/ (carry it)
#   scripts/device-check.sh             there: runs the checks, prints a summary
#
# With the device tool: run(command="scripts/device-check.sh", carry=[".device"]).
#
# .device/ holds: the tidepool binary (gzipped) with librocksdb and its
# libraries (the binary links them dynamically; the script sets
# LD_LIBRARY_PATH), the cache/gpu test binary (go test -c; no cgo library),
# and Apache Thrift's Python package for the client, which is the
# repository's own clients/python.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.device
if [[ "${1:-}" == --prepare ]]; then
	rm -rf "$out"
	mkdir -p "$out/lib"
	# Stripped, and the binary gzipped: what is carried must stay under 64 MiB.
	go build -trimpath -ldflags '-s -w' -o "$out/tidepool" ./cmd/tidepool
	go test -c -trimpath -ldflags '-s -w' -o "$out/gpu.test" ./cache/gpu/
	for l in $(ldd "$out/tidepool" | awk '/=> \//{print $3}' | grep -v -e libc.so -e libm.so -e ld-linux -e libpthread); do
		cp -L "$l" "$out/lib/"
	done
	gzip -1 "$out/tidepool"
	# The Python client's one dependency (Apache Thrift, pure Python; its
	# optional C extension is left behind).
	mkdir -p "$out/py"
	thrift_dir=$(/usr/bin/python3 -c 'import os, thrift; print(os.path.dirname(thrift.__file__))')
	cp -r "$thrift_dir" "$out/py/thrift"
	find "$out/py" -name '*.so' -delete
	find "$out/py" -name __pycache__ -type d -exec rm -rf {} +
	du -sh "$out"
	exit 0
fi
[[ -x "$out/tidepool" ]] || gunzip -k "$out/tidepool.gz"
export LD_LIBRARY_PATH="$PWD/$out/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
echo "== layer 2, the Go package against libcuda.so.1: loading, no-GPU states, batched copies vs cuMemcpy"
# (The tests that need a second process's memory check bytes through the
# stand-in and skip here; the sidecar run below does that with PyTorch.)
TIDEPOOL_GPU_LIBRARY=libcuda.so.1 TIDEPOOL_GPU_BENCH=1 timeout 120 "$out/gpu.test" -test.v -test.count=1 2>&1 |
	grep -E -e '^(--- |ok|FAIL|PASS)' -e 'GB/s' || echo "device-check: the cache/gpu tests failed (above)"
echo "== layer 2 through a real sidecar, and layer 1, with PyTorch buffers"
# The arenas on tmpfs (shmem): the kernel refuses long-term pins
# (cuMemHostRegister) of writable shared mappings of files on other
# filesystems (Linux >= 6.5).
base=/tmp
[[ -d /dev/shm && -w /dev/shm ]] && base=/dev/shm
dir=$(mktemp -d "$base/tp-device-check.XXXXXX")
trap 'kill $(cat "$dir/pid" 2>/dev/null) 2>/dev/null || true; rm -rf "$dir"' EXIT
"$out/tidepool" serve --socket "$dir/tp.sock" --arena-dir "$dir/arenas" --data-dir "$dir/data" \
	--dram-capacity 8GiB --max-value-size 64MiB --metrics-addr "" --gpu-library libcuda.so.1 >"$dir/serve.log" 2>&1 &
echo $! >"$dir/pid"
for _ in $(seq 100); do [[ -S "$dir/tp.sock" ]] && break; sleep 0.1; done
PYTHONPATH="clients/python:$out/py" timeout 360 python3 scripts/device-check.py "$dir/tp.sock" || {
	echo "device-check: FAILED; the sidecar's log:"
	tail -50 "$dir/serve.log"
	exit 1
}
