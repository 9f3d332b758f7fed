# Sourced by the benchmark scripts that compare two clustered tidepool
# serves with something else (bench-vs-mooncake.sh, bench-ab.sh). Needs, from
# the caller: WORK and SHM (scratch and arena directories), NODE_CAPACITY
# (MiB of DRAM per node), PY (a python3), the array pids, and the functions
# log, free_port (lib/free-port.sh) and wait_for (lib/wait-for.sh).

# start_pair NAME BIN LABEL: two clustered serves of BIN, node-1 and node-2,
# DRAM only, R = 1, with a fresh gossip key and peer secret, cluster label
# LABEL; returns once node 2 sees both alive. Their sockets are
# $WORK/NAME1/tp.sock and $WORK/NAME2/tp.sock, their transfer ports
# ${pair_xfer[1]} and ${pair_xfer[2]}. The key files are base64: a key file
# may hold the raw bytes too (serve reads them whole when the trimmed
# contents are no key), but text is easier to look at.
start_pair() {
	local name=$1 bin=$2 label=$3 g1 gossip i d join
	head -c 32 /dev/urandom | base64 >"$WORK/$name.gossip.key"
	head -c 32 /dev/urandom | base64 >"$WORK/$name.peer.secret"
	chmod 0600 "$WORK/$name.gossip.key" "$WORK/$name.peer.secret"
	g1=127.0.0.1:$(free_port)
	pair_xfer=([1]=$(free_port) [2]=$(free_port))
	for i in 1 2; do
		d=$WORK/$name$i
		mkdir -p "$d" "$SHM/$name$i"
		join=()
		gossip=$g1
		if [[ $i == 2 ]]; then join=(--join "$g1"); gossip=127.0.0.1:$(free_port); fi
		"$bin" serve --socket "$d/tp.sock" --data-dir "$d/data" --arena-dir "$SHM/$name$i" \
			--dram-capacity "${NODE_CAPACITY}MiB" --ssd-capacity 0 --max-value-size 8MiB \
			--metrics-addr "" --log-level warn --node-name "node-$i" \
			--gossip-addr "$gossip" --peer-addr "127.0.0.1:$(free_port)" --transfer-addr "127.0.0.1:${pair_xfer[$i]}" \
			--cluster-label "$label" --replicas 1 --transfer-tcp-congestion system \
			--gossip-key-file "$WORK/$name.gossip.key" --peer-secret-file "$WORK/$name.peer.secret" "${join[@]}" \
			>"$d/out.log" 2>"$d/err.log" &
		pids+=($!)
		wait_for "$d/out.log" "serving on socket" 120 || { cat "$d/err.log" >&2; exit 1; }
	done
	local deadline=$((SECONDS + 60))
	until [[ $("$bin" members --socket "$WORK/${name}2/tp.sock" --json --timeout 5s 2>/dev/null | "$PY" -c 'import json, sys; print(sum(1 for m in json.load(sys.stdin) if str(m.get("State", m.get("state"))).lower() == "alive"))' 2>/dev/null) == 2 ]]; do
		((SECONDS < deadline)) || { log "the two tidepool sidecars of $name did not see each other"; cat "$WORK/$name"*/err.log >&2; exit 1; }
		sleep 0.5
	done
}
