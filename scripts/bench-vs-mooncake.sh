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
#   - a second master for Mooncake's embedded mode (the store inside the
#     engine process, `setup(...)`: vLLM's Mooncake connector's default);
#   - two clustered `tidepool serve` processes (gossip key and cluster
#     secret files written here, mode 0600; DRAM tier only, as Mooncake's
#     segments are memory only);
# and runs every workload of bench/mooncake/driver.py on tidepool and on
# Mooncake in both modes ("standalone": the driver's dummy client
# (setup_dummy) calls a real client, the sidecar shape; "embedded": the
# driver process holds the store; N callers are N threads sharing it),
# ROUNDS times, rotating which goes first. Each row's figure is the median
# over the rounds. Then the conversation trace is replayed through both with
# the same total capacity (tidepool: `tidepool replay --nodes 2 --scope
# cluster --policy lru,prefix`, which starts its own two clustered sidecars;
# Mooncake: the driver's replay against a third master, with the eviction
# watermark and lease TTL that let it fill its segments, and two real
# clients sized to the same capacity). Hits count blocks read back whole on
# both.
#
# Mooncake runs as its documentation recommends for sustained TCP traffic:
# MC_TCP_ENABLE_CONNECTION_POOL=1 (MC_LANES lanes per peer),
# MC_STORE_MEMCPY=1 (confirmed from its log, transfer_task verbose level 1),
# the real clients' --threads equal to CONC; every segment (real clients'
# and embedded stores') is written once whole and emptied before timing.
# One congestion control for both: the host's default is set to HOST_CC
# for the run and restored after, and tidepool's transfer connections
# follow the host (transfer_tcp_congestion system).
#
# Output: a Markdown table, or with --json one JSON object per line, one per
# row and Mooncake mode:
#   {"workload", "tidepool", "mooncake", "unit", "ratio", "mooncake_mode", ...}
# mooncake_mode is "standalone" or "embedded". ratio is tidepool's
# advantage, > 1 when tidepool is better whatever the unit (throughput:
# tidepool / mooncake; latency: mooncake / tidepool).
# --quick: one short round with 4 callers instead of 16 and 300 trace
# requests (a smoke test of the whole setup, a minute or two).
#
# Environment:
#   ROUNDS          rounds of every workload (default 5)
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
#   MC_THREADS      the Mooncake real client's service threads (default CONC)
#   MC_LANES        MC_TCP_LANES_PER_PEER (default 4, Mooncake's default)
#   MC_MODES        Mooncake modes to run (default "standalone embedded")
#   HOST_CC         congestion control set as the host's default for the run
#                   (default cubic; "keep" leaves the host as it is); needs
#                   a writable net.ipv4.tcp_congestion_control, else the
#                   host's stays and tidepool follows it all the same
#   TW_SAMPLE       1 (default) samples `ss -tan state time-wait` on each
#                   system's transfer ports during the remote passes (the
#                   most seen is in the output)
#   MC_MASTER_FLAGS flags of the timed rows' Mooncake masters (default
#                   "--eviction_high_watermark_ratio 0.8 --eviction_ratio 0.2")
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

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-3}
CONC=${CONC:-16}
NODE_CAPACITY=${NODE_CAPACITY:-1024}
REMOTE_PASSES=${REMOTE_PASSES:-4}
REPLAY_REQUESTS=${REPLAY_REQUESTS:-0}
REPLAY_CAPACITY=${REPLAY_CAPACITY:-3M}
ONLY=${ONLY:-}
KEEP_WORK=${KEEP_WORK:-0}
MC_LANES=${MC_LANES:-4}
MC_MODES=${MC_MODES:-standalone embedded}
HOST_CC=${HOST_CC:-cubic}
# The timed rows' masters: eviction from 80 % full, a fifth at a time. At
# the default (95 %, 5 %) an embedded store's puts outrun the master's
# eviction and fail with "insufficient space. Consider lowering
# eviction_high_watermark_ratio" (its own advice, taken here).
MC_MASTER_FLAGS=${MC_MASTER_FLAGS:---eviction_high_watermark_ratio 0.8 --eviction_ratio 0.2}
TW_SAMPLE=${TW_SAMPLE:-1}
# The shared traces sit beside the main checkout (a worktree's ROOT is
# elsewhere: then beside the repository's common git directory's checkout).
TRACE=${TRACE:-$ROOT/../shared/traces/conversation_trace.jsonl}
if [[ ! -e $TRACE ]] && common=$(git rev-parse --path-format=absolute --git-common-dir 2>/dev/null); then
	[[ -e ${common%/.git}/../shared/traces/conversation_trace.jsonl ]] && TRACE=${common%/.git}/../shared/traces/conversation_trace.jsonl
fi
if [[ $QUICK == 1 ]]; then
	ROUNDS=1 DURATION=1 CONC=4 REPLAY_REQUESTS=300 NODE_CAPACITY=256 REMOTE_PASSES=2
fi
MC_THREADS=${MC_THREADS:-$CONC}
# Mooncake's settings for sustained TCP traffic (docs: troubleshooting.md,
# transfer-engine/index.md, mooncake-store-deployment-guide.md), for every
# Mooncake process this script starts (master, real clients, drivers).
export MC_TCP_ENABLE_CONNECTION_POOL=${MC_POOL:-1} MC_TCP_LANES_PER_PEER=$MC_LANES MC_STORE_MEMCPY=1

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
# One congestion control for both: the host's default, set for this run.
CC_FILE=/proc/sys/net/ipv4/tcp_congestion_control
CC_WAS=$(cat "$CC_FILE")
CC_NOTE="host default $CC_WAS, left as it is"
if [[ $HOST_CC != keep && $HOST_CC != "$CC_WAS" ]]; then
	if echo "$HOST_CC" >"$CC_FILE" 2>/dev/null; then
		CC_NOTE="host default set to $HOST_CC for this run (was $CC_WAS, restored after)"
	else
		CC_NOTE="host default $CC_WAS (not writable here; tidepool follows it)"
	fi
fi
CC_NOW=$(cat "$CC_FILE")
log "congestion control: $CC_NOTE; both systems on $CC_NOW"
restore_cc() { [[ $(cat "$CC_FILE") == "$CC_WAS" ]] || echo "$CC_WAS" >"$CC_FILE" || log "could not restore $CC_FILE to $CC_WAS"; }
trap 'cleanup; restore_cc' EXIT
trap 'exit 130' INT TERM

TP=${TIDEPOOL_BIN:-}
if [[ -z $TP ]]; then
	TP=$WORK/tidepool
	log "building tidepool"
	go build -o "$TP" ./cmd/tidepool
fi

# shellcheck source=lib/free-port.sh
source scripts/lib/free-port.sh

# shellcheck source=lib/wait-for.sh
source scripts/lib/wait-for.sh
# shellcheck source=lib/tidepool-pair.sh
source scripts/lib/tidepool-pair.sh

# ---- Mooncake: master (+ HTTP metadata) and two real clients ---------------
# start_master NAME [MASTER FLAGS...]: a master with its HTTP metadata
# server; sets MC_<NAME>_MASTER (host:port) and MC_<NAME>_META (URL).
start_master() {
	local name=$1 d=$WORK/mc-$1 rpc http metrics
	shift
	mkdir -p "$d"
	rpc=$(free_port) http=$(free_port) metrics=$(free_port)
	"$MC_MASTER" --rpc_port "$rpc" --enable_http_metadata_server=true --http_metadata_server_host 127.0.0.1 \
		--http_metadata_server_port "$http" --metrics_port "$metrics" --logtostderr "$@" \
		>"$d/master.log" 2>&1 &
	pids+=($!)
	wait_for "$d/master.log" "HTTP metadata server started" 60
	printf -v "MC_${name}_MASTER" '%s' "127.0.0.1:$rpc"
	printf -v "MC_${name}_META" '%s' "http://127.0.0.1:$http/metadata"
}

# start_mooncake NAME SEGMENT_BYTES [MASTER FLAGS...]: starts a master and
# two real clients; sets MC_<NAME>_ADDR1/2 (the clients' service addresses)
# and MC_<NAME>_SEG1/2 (their segment names).
start_mooncake() {
	local name=$1 seg=$2 d=$WORK/mc-$1 rpc http i port seg_name deadline master meta
	shift 2
	start_master "$name" "$@"
	master=MC_${name}_MASTER meta=MC_${name}_META
	rpc=${!master##*:} http=${!meta}
	http=${http#http://127.0.0.1:} http=${http%/metadata}
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
		# Warm: the segment written once whole and emptied, untimed.
		"$PY" bench/mooncake/driver.py --system mooncake --workload warm --node1 "127.0.0.1:$port" \
			--seg1 "$seg_name" --mc-segment-mib $((seg >> 20)) >>"$d/warm.log" 2>&1 ||
			{ log "warming Mooncake client $i failed:"; tail -n 5 "$d/warm.log" >&2; exit 1; }
	done
}

# ---- tidepool: two clustered sidecars ---------------------------------------
start_pair tp "$TP" vs-mooncake
tp_xfer=([1]=${pair_xfer[1]} [2]=${pair_xfer[2]})
TP1=$WORK/tp1/tp.sock TP2=$WORK/tp2/tp.sock

# shellcheck disable=SC2086
start_mooncake RUN $((NODE_CAPACITY << 20)) $MC_MASTER_FLAGS
if [[ " $MC_MODES " == *" embedded "* ]]; then
	# shellcheck disable=SC2086
	start_master EMB $MC_MASTER_FLAGS
	# MC_STORE_MEMCPY as Mooncake takes it: one untimed embedded store with
	# transfer_task's verbose log on (level 1 also logs every transfer, so
	# the timed runs keep it off); the real clients read the same variable
	# through the same code (TransferSubmitter).
	GLOG_vmodule=transfer_task=1 "$PY" bench/mooncake/driver.py --system mooncake --mc-mode embedded --workload warm \
		--node1 - --mc-master "$MC_EMB_MASTER" --mc-metadata "$MC_EMB_META" --mc-segment-mib 16 >"$WORK/memcpy-probe.log" 2>&1 ||
		{ log "the embedded Mooncake probe failed:"; tail -n 5 "$WORK/memcpy-probe.log" >&2; exit 1; }
fi

# ---- the workloads ----------------------------------------------------------
# row LABEL MODES WORKLOAD CONC [driver args...]: MODES is the Mooncake
# modes the row runs against (comma-separated), of those in MC_MODES.
rows=()
row() { [[ -z $ONLY || $1 =~ $ONLY ]] && rows+=("$(printf '%s\t' "$@")") || true; }
both=standalone,embedded
row "put 1 MiB, zero-copy, 1 caller" $both put-zc 1
row "put 1 MiB, zero-copy, $CONC callers" $both put-zc "$CONC"
row "get 1 MiB, zero-copy, 1 caller" $both get-zc 1
row "get 1 MiB, zero-copy, $CONC callers" $both get-zc "$CONC"
row "put 1 MiB, inline, 1 caller" $both put 1
row "put 1 MiB, inline, $CONC callers" $both put "$CONC"
row "get 1 MiB, inline, 1 caller" $both get 1
row "get 1 MiB, inline, $CONC callers" $both get "$CONC"
row "remote get 1 MiB over TCP, 1 caller" $both remote-get 1 --keys $((NODE_CAPACITY * 3 / 8)) --passes "$REMOTE_PASSES"
row "remote get 1 MiB over TCP, $CONC callers" $both remote-get "$CONC" --keys $((CONC * 16)) --passes "$REMOTE_PASSES"
row "batch_put 64 x 64 KiB, 1 caller" $both batch-put 1 --size 65536 --batch 64
row "batch_get 64 x 64 KiB, 1 caller" $both batch-get 1 --size 65536 --batch 64
row "prefix lookup of 256 keys, 1 caller" $both lookup 1 --size 4096 --batch 256
# Keys written through node 2, looked up through node 1 (an embedded store
# has no second node in its process: standalone only).
row "prefix lookup of 256 keys written through the other node, 1 caller" standalone lookup 1 --size 4096 --batch 256 --lookup-via other
# Each system's own placement: tidepool pushes a put to its owner (half of
# them on node 2), Mooncake allocates at random among the segments.
row "put 1 MiB, zero-copy, $CONC callers, default placement" standalone put-zc "$CONC" --placement default
# Integrity on both: tidepool verify=True (CRC-32C of puts checked at
# commit, reads checked), Mooncake MOONCAKE_STORE_CHECKSUM=1 (CRC-64 at put,
# checked on a full get); the variable is read where the store is created,
# so the embedded store.
row "put 1 MiB, zero-copy, 1 caller, integrity on" embedded put-zc 1 --integrity
row "get 1 MiB, zero-copy, 1 caller, integrity on" embedded get-zc 1 --integrity

RESULTS=$WORK/results.jsonl
: >"$RESULTS"
# tw_sampler FILE SS-FILTER: writes the most TIME_WAIT sockets seen that
# match the filter, sampled every 0.1 s until killed. The machine is shared:
# the host-wide count (`ss -tan state time-wait | wc -l`) counts others'
# sockets too, so the count is of the system's own ports: tidepool's two
# transfer ports; Mooncake's transfer engine ports (its RPC and TCP
# transport listen within MC_MIN_RPC_PORT..MC_MAX_RPC_PORT, 15000..17000 by
# default; nothing else here binds there).
tw_sampler() {
	local max=0 n
	while :; do
		n=$(ss -Htan state time-wait "$2" | wc -l)
		# Written aside and renamed: the sampler is killed at any moment.
		((n > max)) && max=$n && echo "$max" >"$1.tmp" && mv "$1.tmp" "$1"
		sleep 0.1
	done
}

run_driver() { # SYSTEM ROUND LABEL WORKLOAD CONC ARGS... (SYSTEM: tidepool, standalone, embedded)
	local sys=$1 round=$2 label=$3 wl=$4 conc=$5 out name=$1 tw= twpid=
	shift 5
	local nodes
	case $sys in
	tidepool) nodes=(--system tidepool --node1 "$TP1" --node2 "$TP2") ;;
	standalone) nodes=(--system mooncake --mc-mode dummy --node1 "$MC_RUN_ADDR1" --node2 "$MC_RUN_ADDR2"
		--seg1 "$MC_RUN_SEG1" --seg2 "$MC_RUN_SEG2") ;;
	embedded) nodes=(--system mooncake --mc-mode embedded --node1 - --mc-master "$MC_EMB_MASTER"
		--mc-metadata "$MC_EMB_META" --mc-segment-mib "$NODE_CAPACITY") ;;
	esac
	if [[ $wl == remote-get && $TW_SAMPLE == 1 ]]; then
		tw=$WORK/tw.$sys.$round
		echo 0 >"$tw"
		if [[ $sys == tidepool ]]; then
			tw_sampler "$tw" "( sport = :${tp_xfer[1]} or dport = :${tp_xfer[1]} or sport = :${tp_xfer[2]} or dport = :${tp_xfer[2]} )" &
		else
			tw_sampler "$tw" "( sport >= :15000 and sport <= :17000 ) or ( dport >= :15000 and dport <= :17000 )" &
		fi
		twpid=$!
	fi
	if out=$("$PY" bench/mooncake/driver.py --workload "$wl" --conc "$conc" \
		--duration "$DURATION" "${nodes[@]}" "$@" 2>>"$WORK/driver-$name.log" | tail -n 1); then
		[[ -z $twpid ]] || { kill "$twpid"; wait "$twpid" 2>/dev/null || true; }
		"$PY" -c 'import json, sys; d = json.loads(sys.argv[1]); d.update(round=int(sys.argv[2]), label=sys.argv[3], mode=sys.argv[4], system=("tidepool" if sys.argv[4] == "tidepool" else "mooncake"))
if sys.argv[5]: d["time_wait_max"] = int(open(sys.argv[5]).read().strip() or 0)
print(json.dumps(d))' \
			"$out" "$round" "$label" "$sys" "$tw" >>"$RESULTS"
		log "round $round $sys $label: $(jq -r '"\(.value) \(.unit) (\(.ok) ok, \(.fail) failed\(if .owned_keys then ", \(.exhausted) of them not on owned keys" else "" end)\(if .passes then "; passes \(.pass_values | map(tostring) | join(", "))" else "" end)\(if .time_wait_max != null then "; TIME_WAIT max \(.time_wait_max)" else "" end))"' <<<"$(tail -n 1 "$RESULTS")" 2>/dev/null || echo "$out")"
	else
		[[ -z $twpid ]] || { kill "$twpid"; wait "$twpid" 2>/dev/null || true; }
		log "round $round $sys $label: driver failed: $(grep -v "^[IWE][0-9]" "$WORK/driver-$name.log" | tail -n 1)"
	fi
}

for ((round = 1; round <= ROUNDS; round++)); do
	for r in "${rows[@]}"; do
		IFS=$'\t' read -r -a f <<<"${r%$'\t'}"
		systems=(tidepool)
		for m in $MC_MODES; do [[ ,${f[1]}, == *",$m,"* ]] && systems+=("$m"); done
		# Rotate the order round by round: each goes first as often.
		for ((j = 0; j < ${#systems[@]}; j++)); do
			sys=${systems[$(((j + round - 1) % ${#systems[@]}))]}
			run_driver "$sys" "$round" "${f[0]}" "${f[@]:2}"
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
	# Both policies: lru is Mooncake's own (the same policy), prefix is
	# tidepool's. A hit is a block read back whole (read_blocks); the hits a
	# lookup counted that did not read back are in unread_blocks, by code.
	if out=$("$TP" replay --trace "$TRACE" --nodes 2 --scope cluster --route round-robin --policy lru,prefix \
		--capacity-tokens "$REPLAY_CAPACITY" --block-bytes 4KiB --json --progress none "${req_args[@]}" 2>"$WORK/replay-tp.log"); then
		"$PY" -c '
import json, sys
d = json.loads(sys.argv[1])
for r in d["runs"] if "runs" in d else [d]:
    hits = r["read_blocks"]
    print(json.dumps({"system": "tidepool", "mode": "tidepool", "workload": "replay", "round": 1,
                      "label": "%s, tidepool policy %s" % (sys.argv[2], r.get("policy", "?")),
                      "value": round(hits / r["blocks"], 4) if r["blocks"] else 0.0, "looked_up_hit_rate": round(r["hit_rate"], 4),
                      "unread_blocks": r.get("unread_blocks", {}),
                      "unit": "hit rate", "better": "higher", "failed_puts": r.get("failed_puts", 0), "seconds": r.get("seconds")}))' \
			"$out" "$replay_label" >>"$RESULTS"
		log "tidepool replay: $(tail -n 2 "$RESULTS")"
	else
		log "tidepool replay failed: $(tail -n 5 "$WORK/replay-tp.log")"
	fi
	if ((blocks * 4096 < 16 << 20)); then
		log "REPLAY_CAPACITY $REPLAY_CAPACITY is $((blocks * 4096)) bytes per node, below Mooncake's 16 MiB segment minimum"
		exit 1
	fi
	# Mooncake evicts from 95 % full and keeps a read object 5 s by default;
	# at these settings it fills its segments as tidepool fills its arenas.
	start_mooncake REPLAY "$((blocks * 4096))" --eviction_high_watermark_ratio 0.99 --eviction_ratio 0.02 \
		--default_kv_lease_ttl 100ms
	if out=$("$PY" bench/mooncake/driver.py --system mooncake --workload replay --node1 "$MC_REPLAY_ADDR1" \
		--node2 "$MC_REPLAY_ADDR2" --size 4096 --trace "$TRACE" "${req_args[@]}" 2>>"$WORK/driver-standalone.log" | tail -n 1); then
		for policy in lru prefix; do
			"$PY" -c 'import json, sys; d = json.loads(sys.argv[1]); d.update(round=1, label=sys.argv[2], mode="standalone"); print(json.dumps(d))' \
				"$out" "$replay_label, tidepool policy $policy" >>"$RESULTS"
		done
		log "mooncake replay: $(tail -n 1 "$RESULTS")"
	else
		log "mooncake replay failed: $(tail -n 3 "$WORK/driver-standalone.log")"
	fi
fi

# ---- the report ---------------------------------------------------------------
# MC_STORE_MEMCPY as Mooncake's processes took it (their transfer_task log).
memcpy_note=$(cat "$WORK/memcpy-probe.log" 2>/dev/null |
	grep -o 'memcpy_enabled=[0-9a-z]*' | sort | uniq -c | awk '{printf "%s%s x%s", (NR > 1 ? ", " : ""), $2, $1}' || true)
if [[ -n ${KEEP_RESULTS:-} ]]; then cp "$RESULTS" "$KEEP_RESULTS"; fi
"$PY" - "$RESULTS" "$JSON" "$MOONCAKE_VERSION" "$("$TP" version 2>/dev/null | head -n 1 || true)" "$ROUNDS" "$DURATION" \
	"$CC_NOTE; both on $CC_NOW" "MC_TCP_ENABLE_CONNECTION_POOL=1, MC_TCP_LANES_PER_PEER=$MC_LANES, MC_STORE_MEMCPY=1 (log: ${memcpy_note:-not seen}), real clients --threads $MC_THREADS" <<'EOF'
import json, statistics, sys
path, as_json, mc_version, tp_version, rounds, duration, cc_note, mc_note = sys.argv[1:9]
MODES = ("standalone", "embedded")
rows, order = {}, []
for line in open(path):
    d = json.loads(line)
    if d["label"] not in rows:
        rows[d["label"]] = {"unit": d["unit"], "better": d["better"], "vals": {}, "fails": {}, "tw": {}}
        order.append(d["label"])
    r = rows[d["label"]]
    mode = d.get("mode", d["system"])
    r["vals"].setdefault(mode, []).append(d["value"])
    r["fails"][mode] = r["fails"].get(mode, 0) + d.get("fail", d.get("failed_puts", 0))
    if "time_wait_max" in d:
        r["tw"].setdefault(mode, []).append(d["time_wait_max"])
med = lambda v: statistics.median(v) if v else None
out = []
for label in order:
    r = rows[label]
    t = med(r["vals"].get("tidepool", []))
    for mode in MODES:
        if mode not in r["vals"]:
            continue
        m = med(r["vals"][mode])
        ratio = (t / m if r["better"] == "higher" else m / t) if t and m else None
        o = {"workload": label, "tidepool": t, "mooncake": m, "unit": r["unit"],
             "ratio": round(ratio, 2) if ratio else None, "mooncake_mode": mode, "better": r["better"],
             "tidepool_rounds": r["vals"].get("tidepool", []), "mooncake_rounds": r["vals"][mode],
             "tidepool_failed": r["fails"].get("tidepool", 0), "mooncake_failed": r["fails"].get(mode, 0)}
        if r["tw"]:  # the most TIME_WAIT sockets on the host during the passes
            o["time_wait_max"] = max(r["tw"].get(mode, [0]))
            o["tidepool_time_wait_max"] = max(r["tw"].get("tidepool", [0]))
        out.append(o)
if as_json == "1":
    for o in out:
        print(json.dumps(o))
    sys.exit(0)
load = open("/proc/loadavg").read().split()[:3]
print("# tidepool (%s) vs Mooncake Store %s (TCP), median of %s rounds of %ss runs; load average %s" % (
    tp_version or "this tree", mc_version, rounds, duration, " ".join(load)))
print()
print("Mooncake standalone: dummy client (setup_dummy) calling a real client (mooncake_client), the sidecar shape; "
      "Mooncake embedded: the store in the driver process (setup), N callers = N threads sharing it.")
print("Congestion control: %s. Mooncake: %s." % (cc_note, mc_note))
print()
print("| workload | tidepool | Mooncake standalone | advantage | Mooncake embedded | advantage | unit | rounds (tidepool / standalone / embedded) | failed ops |")
print("| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |")
fmt = lambda v: "-" if v is None else ("%.4f" % v if v < 1 else "%.0f" % v)
for label in order:
    by = {o["mooncake_mode"]: o for o in out if o["workload"] == label}
    r = rows[label]
    t = med(r["vals"].get("tidepool", []))
    cells = []
    for mode in MODES:
        o = by.get(mode)
        cells += [fmt(o["mooncake"]) if o else "-", ("**%.2f**" % o["ratio"]) if o and o["ratio"] else "-"]
    rr = " / ".join(", ".join(fmt(v) for v in r["vals"].get(k, [])) or "-" for k in ("tidepool",) + MODES)
    fails = " / ".join(str(r["fails"].get(k, 0)) for k in ("tidepool",) + MODES)
    unit = r["unit"] + ("; TIME_WAIT max %s" % " / ".join(str(max(r["tw"].get(k, [0]))) for k in ("tidepool",) + MODES)
                        if r["tw"] else "")
    print("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (label, fmt(t), *cells, unit, rr, fails))
EOF
