#!/usr/bin/env bash
# Put latency with KV events off, on with no subscriber, and on with a
# subscriber that never reads (its queue fills, the rest is dropped and
# counted): three sidecars side by side, rounds interleaved, same load.
# docs/PERFORMANCE.md, "KV events".
#
#   scripts/bench-kv-events.sh [ROUNDS] [DURATION]     (default 3 rounds of 5s)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
DUR=${2:-5s}
PY=${PYTHON:-/usr/bin/python3}
go build -o bin/tidepool ./cmd/tidepool
base=/tmp
[[ -d /dev/shm && -w /dev/shm ]] && base=/dev/shm
tmp=$(mktemp -d "$base/tp-kvbench.XXXXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start() { # name metrics-port extra...
	local name=$1 mport=$2
	shift 2
	mkdir -p "$tmp/$name"
	bin/tidepool serve --socket "$tmp/$name/tp.sock" --data-dir "$tmp/$name/data" --arena-dir "$tmp/$name/arenas" \
		--dram-capacity 256MiB --ssd-capacity 0 --metrics-addr "127.0.0.1:$mport" --log-level warn "$@" \
		</dev/null >"$tmp/$name/log" 2>&1 &
	pids+=($!)
}
m_off=$(port) m_on=$(port) m_slow=$(port) p_on=$(port) p_slow=$(port)
start off "$m_off"
start on "$m_on" --kv-events-endpoint "tcp://127.0.0.1:$p_on"
start slow "$m_slow" --kv-events-endpoint "tcp://127.0.0.1:$p_slow"
for n in off on slow; do
	for _ in $(seq 100); do [[ -S $tmp/$n/tp.sock ]] && break; sleep 0.1; done
done
# The stalled subscriber: ZMTP handshake, subscribe to everything, then
# never read a byte.
"$PY" - "$p_slow" <<'PY' &
import socket, struct, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
s.connect(("127.0.0.1", int(sys.argv[1])))
g = bytearray(64); g[0] = 0xff; g[9] = 0x7f; g[10] = 3; g[12:16] = b"NULL"
s.sendall(bytes(g))
ready = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 3) + b"SUB"
s.sendall(bytes([4, len(ready)]) + ready)
s.sendall(bytes([0, 1, 1]))  # subscribe to "" (every topic)
time.sleep(3600)
PY
pids+=($!)
sleep 1
echo "bench-kv-events: $(nproc) cores, load: $(uptime | sed 's/.*load average: //')"
for r in $(seq "$ROUNDS"); do
	for n in off on slow; do
		bin/tidepool bench --socket "$tmp/$n/tp.sock" --op put --size 4KiB --concurrency 4 --duration "$DUR" --json 2>/dev/null \
			| head -n 1 | "$PY" -c 'import json,sys; r=json.loads(sys.stdin.read().split("}")[0]+"}"); print("round %s %-4s ops/s %8.0f  p50 %6.1f us  p99 %7.1f us  p99.9 %8.1f us" % (sys.argv[1], sys.argv[2], r["ops_per_sec"], r["p50_us"], r["p99_us"], r["p999_us"]))' "$r" "$n"
	done
done
for n in on slow; do
	mp=$m_on; [[ $n == slow ]] && mp=$m_slow
	echo "$n: $("$PY" -c 'import sys,urllib.request; b=urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1]).read().decode(); print("; ".join(l for l in b.splitlines() if l.startswith("tidepool_kv_events_") and not l.startswith("#")))' "$mp")"
done
