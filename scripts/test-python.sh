#!/usr/bin/env bash
# Interop test: a plain Apache Thrift Python client (Debian's thrift compiler
# and python3-thrift, no Kitex) calls a real `tidepool serve` over its Unix
# socket, with both the buffered and the framed transport (binary protocol),
# and its Put calls on the put socket beside it (unframed).
#
# Builds bin/tidepool, starts it on a scratch directory, generates the Python
# bindings from idl/tidepool.thrift, runs tests/python/test_interop.py, and
# always stops the server. The server log is printed when anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/wait-ready.sh
source scripts/lib/wait-ready.sh

PYTHON=${PYTHON:-/usr/bin/python3}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-60}
MAX_VALUE_BYTES=$((2 * 1024 * 1024)) # must match --max-value-size below

tmp=$(mktemp -d /tmp/tp-py.XXXXXX)
sock=$tmp/tp.sock
log=$tmp/server.log
pid=

cleanup() {
	local rc=$?
	if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		# Bounded wait for a graceful shutdown, then force it.
		for _ in $(seq 100); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$pid" 2>/dev/null; then
			echo "test-python: server did not stop within 10s of SIGTERM; killing it" >&2
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

echo "test-python: building bin/tidepool"
mkdir -p bin
go build -o bin/tidepool ./cmd/tidepool

echo "test-python: generating Python bindings with $(thrift --version)"
mkdir -p "$tmp/gen"
thrift --gen py -out "$tmp/gen" idl/tidepool.thrift

echo "test-python: starting tidepool serve on $sock"
bin/tidepool serve \
	--socket "$sock" \
	--data-dir "$tmp/data" \
	--arena-dir "$tmp/arenas" \
	--dram-capacity 64MiB \
	--max-value-size 2MiB \
	--metrics-addr 127.0.0.1:0 \
	--log-level warn \
	</dev/null >"$log" 2>&1 &
pid=$!

wait_ready test-python || exit 1
echo "test-python: server ready (pid $pid)"

PYTHONPATH="$tmp/gen${PYTHONPATH:+:$PYTHONPATH}" \
	TIDEPOOL_SOCKET="$sock" \
	TIDEPOOL_MAX_VALUE_BYTES="$MAX_VALUE_BYTES" \
	"$PYTHON" tests/python/test_interop.py -v </dev/null

if ! kill -0 "$pid" 2>/dev/null; then
	echo "test-python: server died during the tests" >&2
	pid=
	exit 1
fi

# Graceful shutdown (DESIGN.md §8): SIGTERM drains and exits 0 within 15 s.
kill -TERM "$pid"
deadline=$((SECONDS + 15))
while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
	sleep 0.1
done
if kill -0 "$pid" 2>/dev/null; then
	echo "test-python: server still running 15s after SIGTERM" >&2
	exit 1 # cleanup kills it
fi
wait "$pid" && st=0 || st=$?
pid=
if ((st != 0)); then
	echo "test-python: server exited with status $st after SIGTERM (want 0)" >&2
	exit 1
fi
echo "test-python: PASS (buffered and framed transports; server shut down cleanly)"
