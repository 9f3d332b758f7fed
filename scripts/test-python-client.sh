#!/usr/bin/env bash
# Tests of the Python engine client (clients/python) against a real
# `tidepool serve`: checks that the committed Thrift bindings match
# idl/tidepool.thrift, runs the offline tests (block keys, CRC-32C), builds
# bin/tidepool, starts it on a scratch directory (socket and arenas on
# /dev/shm when present, as an emptyDir with medium: Memory would be), runs
# clients/python/tests/test_client.py, and always stops the server. The
# server log is printed when anything fails. Same approach as
# scripts/test-python.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/wait-ready.sh
source scripts/lib/wait-ready.sh

PYTHON=${PYTHON:-/usr/bin/python3}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-60}
MAX_VALUE_BYTES=$((2 * 1024 * 1024))  # must match --max-value-size below
DRAM_CAPACITY=$((64 * 1024 * 1024))   # must match --dram-capacity below

base=/tmp
[[ -d /dev/shm && -w /dev/shm ]] && base=/dev/shm
tmp=$(mktemp -d "$base/tp-pyc.XXXXXX")
sock=$tmp/tp.sock
log=$tmp/server.log
pid=

cleanup() {
	local rc=$?
	if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		for _ in $(seq 100); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$pid" 2>/dev/null; then
			echo "test-python-client: server did not stop within 10s of SIGTERM; killing it" >&2
			kill -KILL "$pid" 2>/dev/null || true
		fi
		wait "$pid" 2>/dev/null || true
	fi
	if ((rc != 0)) && [[ -f "$log" ]]; then
		echo "---- tidepool server log ($log) ----" >&2
		cat "$log" >&2
		echo "---- end of server log ----" >&2
	fi
	rm -rf "$tmp"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "test-python-client: checking the committed bindings"
clients/python/gen.sh --check

echo "test-python-client: offline tests"
"$PYTHON" clients/python/tests/test_keys.py </dev/null
"$PYTHON" clients/python/tests/test_transport.py </dev/null
"$PYTHON" clients/python/tests/test_vectors.py </dev/null

echo "test-python-client: building bin/tidepool"
mkdir -p bin
go build -o bin/tidepool ./cmd/tidepool

echo "test-python-client: the GPU calls against a sidecar on the CUDA stand-in"
TIDEPOOL_BIN=bin/tidepool "$PYTHON" clients/python/tests/test_gpu.py </dev/null

echo "test-python-client: starting tidepool serve on $sock"
# --scrub-rate 0: test_damaged_arena_bytes_are_refused_when_verifying damages
# a committed block and expects the client's own check to refuse it; the
# scrubber would remove the block first at random (cmd/tidepool tests cover
# the scrubber against a real serve).
bin/tidepool serve \
	--socket "$sock" \
	--scrub-rate 0 \
	--data-dir "$tmp/data" \
	--arena-dir "$tmp/arenas" \
	--dram-capacity 64MiB \
	--max-value-size 2MiB \
	--metrics-addr 127.0.0.1:0 \
	--log-level warn \
	</dev/null >"$log" 2>&1 &
pid=$!

wait_ready test-python-client || exit 1
echo "test-python-client: server ready (pid $pid)"

TIDEPOOL_SOCKET="$sock" \
	TIDEPOOL_MAX_VALUE_BYTES="$MAX_VALUE_BYTES" \
	TIDEPOOL_DRAM_CAPACITY="$DRAM_CAPACITY" \
	"$PYTHON" clients/python/tests/test_client.py -v </dev/null

echo "test-python-client: KV events (a pyzmq + msgpack subscriber against servers of its own)"
TIDEPOOL_BIN=bin/tidepool PYTHONPATH=clients/python \
	"$PYTHON" tests/python/test_kv_events.py -v </dev/null

if ! kill -0 "$pid" 2>/dev/null; then
	echo "test-python-client: server died during the tests" >&2
	pid=
	exit 1
fi
kill -TERM "$pid"
deadline=$((SECONDS + 15))
while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
	sleep 0.1
done
if kill -0 "$pid" 2>/dev/null; then
	echo "test-python-client: server still running 15s after SIGTERM" >&2
	exit 1
fi
wait "$pid" && st=0 || st=$?
pid=
if ((st != 0)); then
	echo "test-python-client: server exited with status $st after SIGTERM (want 0)" >&2
	exit 1
fi
echo "test-python-client: PASS"
