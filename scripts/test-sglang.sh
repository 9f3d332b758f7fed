#!/usr/bin/env bash
# SGLang tests: tidepool.sglang.TidepoolStorage (a HiCache storage backend)
# with the pinned SGLang against real `tidepool serve` processes
# (tests/engines/test_sglang_backend.py). Installs the venv when needed
# (scripts/install-sglang.sh: no download when present), builds
# bin/tidepool and runs the tests: SGLang's storage factory, host KV pool
# and HiCacheController on host tensors, in this process and in "engine
# processes" (no GPU, no model: docs/engines.md, "SGLang"). About a minute
# or two on 2 cores once installed.
#
#   scripts/test-sglang.sh                       all SGLang tests
#   scripts/test-sglang.sh EngineProcesses.test_3_altered_page
set -euo pipefail
cd "$(dirname "$0")/.."

export VENV=${VENV:-.venv-sglang}
scripts/install-sglang.sh
echo "test-sglang: building bin/tidepool"
mkdir -p bin
go build -o bin/tidepool ./cmd/tidepool

export PYTHONUNBUFFERED=1
if "$VENV/bin/python" tests/engines/test_sglang_backend.py -v "$@" </dev/null; then
	echo "test-sglang: PASS"
else
	echo "test-sglang: FAILED"
	exit 1
fi
