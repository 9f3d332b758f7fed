# Sourced by the test scripts that start a real `tidepool serve`.
# wait_ready NAME: bounded poll until $sock exists and accepts a connection;
# fails early when the server ($pid) exits. Uses $PYTHON, $sock, $pid and
# $READY_TIMEOUT_S from the caller; clears pid when the server died.

probe() {
	"$PYTHON" - "$sock" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(1.0)
try:
    s.connect(sys.argv[1])
except OSError:
    sys.exit(1)
finally:
    s.close()
PY
}

wait_ready() {
	local name=$1 st deadline=$((SECONDS + READY_TIMEOUT_S))
	until [[ -S "$sock" ]] && probe; do
		if ! kill -0 "$pid" 2>/dev/null; then
			wait "$pid" && st=0 || st=$?
			pid=
			echo "$name: server exited (status $st) before it was ready" >&2
			return 1
		fi
		if ((SECONDS >= deadline)); then
			echo "$name: server not ready after ${READY_TIMEOUT_S}s" >&2
			return 1
		fi
		sleep 0.1
	done
}
