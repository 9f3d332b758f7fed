#!/usr/bin/env bash
# Engine tests: a real vLLM (CPU build) with tidepool.vllm.TidepoolConnector
# against real `tidepool serve` processes (tests/engines). Installs the venv
# when needed (scripts/install-engines.sh: no download when present), builds
# bin/tidepool, runs the connector's unit tests (no model) and the
# end-to-end tests (engine processes with a tiny seeded Llama). A few
# minutes on 2 cores.
#
#   scripts/test-engines.sh                 all engine tests
#   scripts/test-engines.sh EngineTests.test_4a_sidecar_absent_at_start
#   scripts/test-engines.sh ServeTests
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv-engines}
scripts/install-engines.sh
echo "test-engines: building bin/tidepool"
mkdir -p bin
go build -o bin/tidepool ./cmd/tidepool

py=$VENV/bin/python
export PYTHONUNBUFFERED=1
rc=0
if (($# == 0)); then
	echo "test-engines: connector unit tests (real vLLM classes, no model)"
	"$py" tests/engines/test_vllm_units.py -v </dev/null || rc=1
	echo "test-engines: KV events, each payload re-encoded by vLLM's own classes"
	TIDEPOOL_BIN=bin/tidepool PYTHONPATH=clients/python "$py" tests/python/test_kv_events.py -v </dev/null || rc=1
	echo "test-engines: end-to-end tests (vLLM engine processes + tidepool serve)"
	"$py" tests/engines/test_vllm_connector.py -v </dev/null || rc=1
	echo "test-engines: vLLM's OpenAI server as a process, requests over HTTP"
	"$py" tests/engines/test_vllm_serve.py -v </dev/null || rc=1
elif [[ "$1" == ServeTests* ]]; then
	"$py" tests/engines/test_vllm_serve.py -v "$@" </dev/null || rc=1
else
	"$py" tests/engines/test_vllm_connector.py -v "$@" </dev/null || rc=1
fi
if ((rc != 0)); then
	echo "test-engines: FAILED"
	exit 1
fi
echo "test-engines: PASS"
