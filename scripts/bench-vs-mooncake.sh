#!/usr/bin/env bash
# bench-vs-mooncake.sh — tidepool against Mooncake Store, same machine, same
# workloads, same run, interleaved.
#
#   scripts/bench-vs-mooncake.sh [--json] [--quick]
#
# Installs the pinned Mooncake wheel (mooncake-transfer-engine-non-cuda,
# TCP transport) into .venv-mooncake/ when it is not there yet, then starts
#   - mooncake_master with its HTTP metadata server, and two Mooncake real
#     clients (`mooncake_client`: each owns a segment and a transfer engine,
#     the Mooncake counterpart of a sidecar), all on 127.0.0.1;
#   - two clustered `tidepool serve` processes (gossip key and cluster
#     secret files written here, mode 0600; DRAM tier only, as Mooncake's
#     segments are memory only);
# and runs every workload of bench/mooncake/driver.py on both, ROUNDS
# times, alternating which system goes first. Each row's figure is the
# median over the rounds. Then the conversation trace is replayed through
# both with the same total capacity (tidepool: `tidepool replay --nodes 2
# --scope cluster`, which starts its own two clustered sidecars; Mooncake:
# the driver's replay against a second master and two real clients sized to
# the same capacity).
#
# Output: a Markdown table, or with --json one JSON object per line and row:
#   {"workload", "tidepool", "mooncake", "unit", "ratio", ...}
# ratio is tidepool's advantage, > 1 when tidepool is better whatever the
# unit (throughput: tidepool / mooncake; latency: mooncake / tidepool).
# --quick: one short round with 4 callers instead of 16 and 300 trace
# requests (a smoke test of the whole setup, a minute or two).
#
# Environment:
#   ROUNDS          rounds of every workload (default 3)
#   DURATION        seconds per timed run (default 3)
#   CONC            the many-callers count (default 16)
#   NODE_CAPACITY   DRAM per node on both systems, MiB (default 1024)
#   REMOTE_PASSES   passes of each remote get run, each on freshly written
#                   keys (default 4): one pass reads only what fits in
#                   node 1, a tenth of a second or two
#   REPLAY_REQUESTS trace requests replayed (default 0: all)
#   REPLAY_CAPACITY per-node capacity of the replay, tokens (default 3M; at
#                   least 2M: a Mooncake segment is at least 16 MiB)
#   ONLY            run only the rows whose label matches this extended
#                   regular expression ("replay" matches the trace replay)
#   KEEP_WORK       1 keeps the scratch directory (logs) after the run
#   MC_THREADS      the Mooncake real client's service threads (default nproc)
#   TIDEPOOL_BIN    a prebuilt tidepool binary (default: built from this tree)
#   TP_VERIFY       0 passes verify=False to the tidepool Python client's
#                   zero-copy calls, 1 verify=True (default: the client's
#                   own default)
#   TP_CLIENT       another copy of clients/python to drive tidepool with
#                   (a before/after comparison; default: this tree's)
#   TP_OWNED_KEYS   0: tidepool's local put rows write fresh keys whatever
#                   their owner (half of them are then pushed to node 2 as
#                   well); default 1: keys node 1 owns, one copy, as
#                   Mooncake's preferred_segment (bench/mooncake/driver.py)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

MOONCAKE_PKG=mooncake-transfer-engine-non-cuda
MOONCAKE_VERSION=0.3.13.post1
VENV=$ROOT/.venv-mooncake

JSON=0
QUICK=0
for a in "$@"; do
	case $a in
	--json) JSON=1 ;;
	--quick) QUICK=1 ;;
	-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) echo "bench-vs-mooncake: unknown argument $a" >&2; exit 2 ;;
	esac
done

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-3}
CONC=${CONC:-16}
NODE_CAPACITY=${NODE_CAPACITY:-1024}
REMOTE_PASSES=${REMOTE_PASSES:-4}
REPLAY_REQUESTS=${REPLAY_REQUESTS:-0}
REPLAY_CAPACITY=${REPLAY_CAPACITY:-3M}
ONLY=${ONLY:-}
KEEP_WORK=${KEEP_WORK:-0}
MC_THREADS=${MC_THREADS:-$(nproc)}
TRACE=${TRACE:-$ROOT/../shared/traces/conversation_trace.jsonl}
if [[ $QUICK == 1 ]]; then
	ROUNDS=1 DURATION=1 CONC=4 REPLAY_REQUESTS=300 NODE_CAPACITY=256 REMOTE_PASSES=2
fi

log() { echo "bench-vs-mooncake: $*" >&2; }

# ---- the pinned Mooncake wheel, in its own venv (idempotent) -------------
PY=$VENV/bin/python
if ! "$PY" - "$MOONCAKE_PKG" "$MOONCAKE_VERSION" 2>/dev/null <<'EOF'; then
import importlib.metadata as m, sys
assert m.version(sys.argv[1]) == sys.argv[2]
import crc32c, thrift  # the tidepool Python client's dependencies
EOF
	log "installing $MOONCAKE_PKG==$MOONCAKE_VERSION into $VENV"
	[[ -x $PY ]] || python3 -m venv "$VENV"
	"$VENV/bin/pip" install -q "$MOONCAKE_PKG==$MOONCAKE_VERSION" crc32c thrift >&2
fi
MC_DIR=$("$PY" -c 'import mooncake, os; print(os.path.dirname(mooncake.__file__))')
MC_MASTER=$MC_DIR/mooncake_master
MC_CLIENT=$MC_DIR/mooncake_client

WORK=$(mktemp -d /tmp/tidepool-vs-mooncake.XXXXXX)
SHM=$(mktemp -d /dev/shm/tidepool-vs-mooncake.XXXXXX 2>/dev/null || mktemp -d "$WORK/arena.XXXXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	if [[ $KEEP_WORK == 1 ]]; then log "logs kept in $WORK"; else rm -rf "$WORK"; fi
	rm -rf "$SHM"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

TP=${TIDEPOOL_BIN:-}
if [[ -z $TP ]]; then
	TP=$WORK/tidepool
	log "building tidepool"
	go build -o "$TP" ./cmd/tidepool
fi

# shellcheck source=lib/free-port.sh
source scripts/lib/free-port.sh

# wait_for FILE PATTERN SECONDS: polls until FILE contains PATTERN.
wait_for() {
	local deadline=$((SECONDS + $3))
	while ((SECONDS < deadline)); do
		grep -q -- "$2" "$1" 2>/dev/null && return 0
		sleep 0.2
	done
	log "timed out waiting for '$2' in $1:"
	tail -n 20 "$1" >&2
	return 1
}

# ---- Mooncake: master (+ HTTP metadata) and two real clients ---------------
# start_mooncake NAME SEGMENT_BYTES: starts a master and two real clients;
# sets MC_<NAME>_ADDR1/2 (the clients' service addresses) and
# MC_<NAME>_SEG1/2 (their segment names).
start_mooncake() {
	local name=$1 seg=$2 d=$WORK/mc-$1 rpc http metrics i port seg_name deadline
	mkdir -p "$d"
	rpc=$(free_port) http=$(free_port) metrics=$(free_port)
	"$MC_MASTER" --rpc_port "$rpc" --enable_http_metadata_server=true --http_metadata_server_host 127.0.0.1 \
		--http_metadata_server_port "$http" --metrics_port "$metrics" --logtostderr \
		>"$d/master.log" 2>&1 &
	pids+=($!)
	wait_for "$d/master.log" "HTTP metadata server started" 60
	for i in 1 2; do
		port=$(free_port)
		"$MC_CLIENT" --host 127.0.0.1 --port "$port" --global_segment_size "$seg" \
			--local_buffer_size "64MB" --master_server_address "127.0.0.1:$rpc" \
			--metadata_server "http://127.0.0.1:$http/metadata" --protocol tcp --threads "$MC_THREADS" \
			--logtostderr >"$d/client$i.log" 2>&1 &
		pids+=($!)
		wait_for "$d/client$i.log" "Starting real client service" 60
		printf -v "MC_${name}_ADDR$i" '%s' "127.0.0.1:$port"
		# The master logs each mount; the clients start one after the other.
		deadline=$((SECONDS + 30)) seg_name=
		while [[ -z $seg_name ]] && ((SECONDS < deadline)); do
			seg_name=$(grep -o 'action=mount_segment, segment_name=[0-9.:]*' "$d/master.log" | sed -n "${i}p" | cut -d= -f3)
			[[ -n $seg_name ]] || sleep 0.2
		done
		[[ -n $seg_name ]] || { log "the Mooncake master logged no segment for client $i"; exit 1; }
		printf -v "MC_${name}_SEG$i" '%s' "$seg_name"
	done
}

# ---- tidepool: two clustered sidecars ---------------------------------------
# Base64: a key file may hold the raw bytes too (serve reads them whole when
# the trimmed contents are no key), but text is easier to look at.
head -c 32 /dev/urandom | base64 >"$WORK/gossip.key"
head -c 32 /dev/urandom | base64 >"$WORK/peer.secret"
chmod 0600 "$WORK/gossip.key" "$WORK/peer.secret"
g1=127.0.0.1:$(free_port)
for i in 1 2; do
	d=$WORK/tp$i
	mkdir -p "$d" "$SHM/tp$i"
	join=()
	gossip=$g1
	if [[ $i == 2 ]]; then join=(--join "$g1"); gossip=127.0.0.1:$(free_port); fi
	"$TP" serve --socket "$d/tp.sock" --data-dir "$d/data" --arena-dir "$SHM/tp$i" \
		--dram-capacity "${NODE_CAPACITY}MiB" --ssd-capacity 0 --max-value-size 8MiB \
		--metrics-addr "" --log-level warn --node-name "node-$i" \
		--gossip-addr "$gossip" --peer-addr "127.0.0.1:$(free_port)" --transfer-addr "127.0.0.1:$(free_port)" \
		--cluster-label vs-mooncake --replicas 1 \
		--gossip-key-file "$WORK/gossip.key" --peer-secret-file "$WORK/peer.secret" "${join[@]}" \
		>"$d/out.log" 2>"$d/err.log" &
	pids+=($!)
	wait_for "$d/out.log" "serving on socket" 120 || { cat "$d/err.log" >&2; exit 1; }
done
TP1=$WORK/tp1/tp.sock TP2=$WORK/tp2/tp.sock
deadline=$((SECONDS + 60))
until [[ $("$TP" members --socket "$TP2" --json --timeout 5s 2>/dev/null | "$PY" -c 'import json, sys; print(sum(1 for m in json.load(sys.stdin) if str(m.get("State", m.get("state"))).lower() == "alive"))' 2>/dev/null) == 2 ]]; do
	((SECONDS < deadline)) || { log "the two tidepool sidecars did not see each other"; cat "$WORK"/tp*/err.log >&2; exit 1; }
	sleep 0.5
done

start_mooncake RUN "${NODE_CAPACITY}MB"

# ---- the workloads ----------------------------------------------------------
# row LABEL WORKLOAD CONC [driver args...]
rows=()
row() { [[ -z $ONLY || $1 =~ $ONLY ]] && rows+=("$(printf '%s\t' "$@")") || true; }
row "put 1 MiB, zero-copy, 1 caller" put-zc 1
row "put 1 MiB, zero-copy, $CONC callers" put-zc "$CONC"
row "get 1 MiB, zero-copy, 1 caller" get-zc 1
row "get 1 MiB, zero-copy, $CONC callers" get-zc "$CONC"
row "put 1 MiB, inline, 1 caller" put 1
row "put 1 MiB, inline, $CONC callers" put "$CONC"
row "get 1 MiB, inline, 1 caller" get 1
row "get 1 MiB, inline, $CONC callers" get "$CONC"
row "remote get 1 MiB over TCP, 1 caller" remote-get 1 --keys $((NODE_CAPACITY * 3 / 8)) --passes "$REMOTE_PASSES"
row "remote get 1 MiB over TCP, $CONC callers" remote-get "$CONC" --keys $((CONC * 16)) --passes "$REMOTE_PASSES"
row "batch_put 64 x 64 KiB, 1 caller" batch-put 1 --size 65536 --batch 64
row "batch_get 64 x 64 KiB, 1 caller" batch-get 1 --size 65536 --batch 64
row "prefix lookup of 256 keys, 1 caller" lookup 1 --size 4096 --batch 256

RESULTS=$WORK/results.jsonl
: >"$RESULTS"
run_driver() { # SYSTEM ROUND LABEL WORKLOAD CONC ARGS...
	local sys=$1 round=$2 label=$3 wl=$4 conc=$5 out
	shift 5
	local nodes
	if [[ $sys == tidepool ]]; then
		nodes=(--node1 "$TP1" --node2 "$TP2")
	else
		nodes=(--node1 "$MC_RUN_ADDR1" --node2 "$MC_RUN_ADDR2" --seg1 "$MC_RUN_SEG1" --seg2 "$MC_RUN_SEG2")
	fi
	if out=$("$PY" bench/mooncake/driver.py --system "$sys" --workload "$wl" --conc "$conc" \
		--duration "$DURATION" "${nodes[@]}" "$@" 2>>"$WORK/driver-$sys.log" | tail -n 1); then
		"$PY" -c 'import json, sys; d = json.loads(sys.argv[1]); d.update(round=int(sys.argv[2]), label=sys.argv[3]); print(json.dumps(d))' \
			"$out" "$round" "$label" >>"$RESULTS"
		log "round $round $sys $label: $(jq -r '"\(.value) \(.unit) (\(.ok) ok, \(.fail) failed\(if .owned_keys then ", \(.exhausted) of them not on owned keys" else "" end)\(if .passes then "; passes \(.pass_values | map(tostring) | join(", "))" else "" end))"' <<<"$out" 2>/dev/null || echo "$out")"
	else
		log "round $round $sys $label: driver failed: $(grep -v "^[IWE][0-9]" "$WORK/driver-$sys.log" | tail -n 1)"
	fi
}

for ((round = 1; round <= ROUNDS; round++)); do
	if ((round % 2)); then order=(tidepool mooncake); else order=(mooncake tidepool); fi
	for r in "${rows[@]}"; do
		IFS=$'\t' read -r -a f <<<"${r%$'\t'}"
		for sys in "${order[@]}"; do
			run_driver "$sys" "$round" "${f[@]}"
		done
	done
done

# ---- the trace, same total capacity -----------------------------------------
# Capacity per node: REPLAY_CAPACITY tokens = blocks of 512 tokens, 4 KiB
# each (tidepool replay's scaled-down block); Mooncake's segments get the
# same bytes.
if [[ -z $ONLY || "trace replay" =~ $ONLY ]]; then
	blocks=$("$PY" -c 'import sys; s = sys.argv[1].lower(); m = {"k": 10**3, "m": 10**6, "g": 10**9}; print(int(float(s[:-1]) * m[s[-1]] if s[-1] in m else float(s)) // 512)' "$REPLAY_CAPACITY")
	replay_label="trace replay ($("$PY" -c 'import sys; print(sum(1 for _ in open(sys.argv[1])) if int(sys.argv[2]) == 0 else sys.argv[2])' "$TRACE" "$REPLAY_REQUESTS") requests), 2 nodes x $REPLAY_CAPACITY tokens"
	req_args=()
	((REPLAY_REQUESTS > 0)) && req_args=(--requests "$REPLAY_REQUESTS")
	if out=$("$TP" replay --trace "$TRACE" --nodes 2 --scope cluster --route round-robin --policy prefix \
		--capacity-tokens "$REPLAY_CAPACITY" --block-bytes 4KiB --json --progress none "${req_args[@]}" 2>"$WORK/replay-tp.log"); then
		"$PY" -c 'import json, sys; d = json.loads(sys.argv[1]); d = d["runs"][0] if "runs" in d else d; print(json.dumps({"system": "tidepool", "workload": "replay", "label": sys.argv[2], "round": 1, "value": round(d["hit_rate"], 4), "unit": "hit rate", "better": "higher", "failed_puts": d.get("failed_puts", 0), "seconds": d.get("seconds")}))' \
			"$out" "$replay_label" >>"$RESULTS"
		log "tidepool replay: $(tail -n 1 "$RESULTS")"
	else
		log "tidepool replay failed: $(tail -n 5 "$WORK/replay-tp.log")"
	fi
	if ((blocks * 4096 < 16 << 20)); then
		log "REPLAY_CAPACITY $REPLAY_CAPACITY is $((blocks * 4096)) bytes per node, below Mooncake's 16 MiB segment minimum"
		exit 1
	fi
	start_mooncake REPLAY "$((blocks * 4096))"
	if out=$("$PY" bench/mooncake/driver.py --system mooncake --workload replay --node1 "$MC_REPLAY_ADDR1" \
		--node2 "$MC_REPLAY_ADDR2" --size 4096 --trace "$TRACE" "${req_args[@]}" 2>>"$WORK/driver-mooncake.log" | tail -n 1); then
		"$PY" -c 'import json, sys; d = json.loads(sys.argv[1]); d.update(round=1, label=sys.argv[2]); print(json.dumps(d))' \
			"$out" "$replay_label" >>"$RESULTS"
		log "mooncake replay: $(tail -n 1 "$RESULTS")"
	else
		log "mooncake replay failed: $(tail -n 3 "$WORK/driver-mooncake.log")"
	fi
fi

# ---- the report ---------------------------------------------------------------
if [[ -n ${KEEP_RESULTS:-} ]]; then cp "$RESULTS" "$KEEP_RESULTS"; fi
"$PY" - "$RESULTS" "$JSON" "$MOONCAKE_VERSION" "$("$TP" version 2>/dev/null | head -n 1 || true)" "$ROUNDS" "$DURATION" <<'EOF'
import json, statistics, sys
path, as_json, mc_version, tp_version, rounds, duration = sys.argv[1:7]
rows, order = {}, []
for line in open(path):
    d = json.loads(line)
    if d["label"] not in rows:
        rows[d["label"]] = {"unit": d["unit"], "better": d["better"], "tidepool": [], "mooncake": [], "fails": {}}
        order.append(d["label"])
    r = rows[d["label"]]
    r[d["system"]].append(d["value"])
    r["fails"][d["system"]] = r["fails"].get(d["system"], 0) + d.get("fail", d.get("failed_puts", 0))
out = []
for label in order:
    r = rows[label]
    t = statistics.median(r["tidepool"]) if r["tidepool"] else None
    m = statistics.median(r["mooncake"]) if r["mooncake"] else None
    ratio = None
    if t and m:
        ratio = t / m if r["better"] == "higher" else m / t
    out.append({"workload": label, "tidepool": t, "mooncake": m, "unit": r["unit"],
                "ratio": round(ratio, 2) if ratio else None, "better": r["better"],
                "tidepool_rounds": r["tidepool"], "mooncake_rounds": r["mooncake"],
                "tidepool_failed": r["fails"].get("tidepool", 0), "mooncake_failed": r["fails"].get("mooncake", 0)})
if as_json == "1":
    for o in out:
        print(json.dumps(o))
    sys.exit(0)
load = open("/proc/loadavg").read().split()[:3]
print("# tidepool (%s) vs Mooncake Store %s (TCP), median of %s rounds of %ss runs; load average %s" % (
    tp_version or "this tree", mc_version, rounds, duration, " ".join(load)))
print()
print("| workload | tidepool | Mooncake | unit | tidepool advantage | rounds (tidepool / Mooncake) | failed ops (tidepool / Mooncake) |")
print("| --- | ---: | ---: | --- | ---: | --- | --- |")
fmt = lambda v: "-" if v is None else ("%.4f" % v if v < 1 else "%.0f" % v)
for o in out:
    print("| %s | %s | %s | %s | %s | %s / %s | %d / %d |" % (
        o["workload"], fmt(o["tidepool"]), fmt(o["mooncake"]), o["unit"],
        "-" if o["ratio"] is None else "**%.2f**" % o["ratio"],
        ", ".join(fmt(v) for v in o["tidepool_rounds"]), ", ".join(fmt(v) for v in o["mooncake_rounds"]),
        o["tidepool_failed"], o["mooncake_failed"]))
EOF
