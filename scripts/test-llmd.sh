#!/usr/bin/env bash
# llm-d's kv-cache indexer (github.com/llm-d/llm-d-kv-cache, pinned in
# tests/llmd/go.mod, a module of its own so that the sidecar's module does
# not take on its dependencies) against a real `tidepool serve` publishing
# KV events: its ZMQ subscriber, vLLM adapter, index and scorer score the
# pod for a prompt whose blocks were put the vLLM connector's way, and stop
# once the blocks are evicted; after a restart of the sidecar that kept its
# SSD tier, a fresh indexer scores it for the blocks kept; in a cluster of
# two sidecars, a pod that read another's prompt scores for it (its copy's
# events carry the token ids fetched with the blocks) (docs/events.md).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bin
go build -o bin/tidepool ./cmd/tidepool
cd tests/llmd
go vet ./...
TIDEPOOL_BIN=$PWD/../../bin/tidepool go test -count=1 -v ./...
