# tidepool build and test entry points. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := build
.ONESHELL:

GO ?= go
BIN := bin/tidepool
# Per test binary; the whole `make test` should stay well under 30 min on 2 cores.
TEST_TIMEOUT ?= 10m
# Extra flags for every `go test` (e.g. GO_TEST_FLAGS=-count=1 or -v).
GO_TEST_FLAGS ?=

# Packages tested WITHOUT the race detector: cgo-heavy (grocksdb) or long
# multi-process integration tests where -race costs too much on 2 cores.
# Paths are relative to the module; each entry also covers its subpackages.
# Every other package (new ones included) is tested with -race.
NORACE := cache/ssd cmd/tidepool

# Linters, pinned: `make deps` installs each once into bin/tools/<name>-<version>/
# (go install through the module proxy; go.sum-style checks via sum.golang.org).
# staticcheck v0.8.x (2026.1) is the first release that supports Go 1.26.
STATICCHECK_VERSION := v0.8.2
STATICCHECK := bin/tools/staticcheck-$(STATICCHECK_VERSION)/staticcheck
# ruff (Python lint, ruff.toml) from PyPI into a venv of its own.
RUFF_VERSION := 0.17.5
RUFF := bin/tools/ruff-$(RUFF_VERSION)/bin/ruff
# mypy (Python types, clients/python/pyproject.toml) likewise.
MYPY_VERSION := 2.4.1
MYPY := bin/tools/mypy-$(MYPY_VERSION)/bin/mypy

# Deferred (=) so that only targets that use them run `go list`.
MODULE = $(shell $(GO) list -m)
ALL_PKGS = $(shell $(GO) list -e ./...)
NORACE_PATTERNS = $(foreach n,$(NORACE),$(MODULE)/$(n) $(MODULE)/$(n)/%)
NORACE_PKGS = $(filter $(NORACE_PATTERNS),$(ALL_PKGS))
RACE_PKGS = $(filter-out $(NORACE_PATTERNS),$(ALL_PKGS))

.PHONY: deps sysdeps tools build run check test test-go test-python bench fmt-check lint tidy-check list-pkgs clean

deps: sysdeps
	$(GO) mod download
	$(MAKE) --no-print-directory tools

# The Debian packages (librocksdb-dev for cgo, ...): only queries dpkg when
# they are all present, so `make build` on a fresh machine works first.
sysdeps:
	scripts/install-deps.sh

tools: $(STATICCHECK) $(RUFF) $(MYPY)

$(STATICCHECK):
	GOBIN="$(CURDIR)/$(@D)" $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

$(RUFF):
	rm -rf bin/tools/ruff-$(RUFF_VERSION)
	python3 -m venv bin/tools/ruff-$(RUFF_VERSION)
	bin/tools/ruff-$(RUFF_VERSION)/bin/pip install -q --disable-pip-version-check ruff==$(RUFF_VERSION)

$(MYPY):
	rm -rf bin/tools/mypy-$(MYPY_VERSION)
	python3 -m venv bin/tools/mypy-$(MYPY_VERSION)
	bin/tools/mypy-$(MYPY_VERSION)/bin/pip install -q --disable-pip-version-check mypy==$(MYPY_VERSION)

# The version `tidepool version` and Hello report: `git describe` of the
# checkout; without git, the binary falls back to its build information.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null)

build: sysdeps
	mkdir -p bin
	$(GO) build -ldflags '$(if $(VERSION),-X main.version=$(VERSION))' -o $(BIN) ./cmd/tidepool

# Single node on the embedded defaults (socket path printed at start).
run: deps build
	./$(BIN) serve

# Every step runs even when an earlier one fails, so one CI run reports all
# failures; the target fails if any step did. Each step's output also goes
# to .cache/test-logs/<step>.log, and the last lines printed name the steps
# that failed with their failure lines (CI may show only the tail).
TEST_LOGS := .cache/test-logs

test: deps
	rc=0
	failed=()
	took=()
	mkdir -p $(TEST_LOGS)
	step() {
		local name=$$1 t0=$$SECONDS; shift
		if ! "$$@" 2>&1 | tee $(TEST_LOGS)/$$name.log; then rc=1; failed+=("$$name"); fi
		took+=("$$name $$((SECONDS - t0))s")
	}
	step gen-idl scripts/gen-idl.sh --check
	step fmt-check $(MAKE) --no-print-directory fmt-check
	step tidy-check $(MAKE) --no-print-directory tidy-check
	step vet $(GO) vet ./...
	step lint $(MAKE) --no-print-directory lint
	step test-go $(MAKE) --no-print-directory test-go
	step test-python scripts/test-python.sh
	step test-python-client scripts/test-python-client.sh
	step test-llmd scripts/test-llmd.sh
	step test-engines scripts/test-engines.sh
	step test-sglang scripts/test-sglang.sh
	step test-rdma $(MAKE) --no-print-directory test-rdma
	step test-k8s $(MAKE) --no-print-directory test-k8s
	(IFS=,; echo "make test: seconds per step: $${took[*]}")
	if ((rc == 0)); then echo "make test: all passed"; exit 0; fi
	echo "make test: FAILED: $${failed[*]} (whole logs in $(TEST_LOGS)/)"
	for name in "$${failed[@]}"; do
		echo "== $$name, its failure lines:"
		grep -E -e '--- FAIL|^FAIL|_test\.go:[0-9]+:|^(ERROR|FAIL):|FAILED|panic:|Error|error:|RDMA-STEP .* rc=[1-9]' $(TEST_LOGS)/$$name.log | grep -v -e '^=== ' -e "pip's dependency resolver" | head -n 10 || true
	done
	exit 1

# The verbs transport on Soft-RoCE (rdma_rxe) in a QEMU TCG guest: fetches
# Debian packages into .cache/rdma, builds the initramfs, boots, runs the
# tests inside and fails on any failure there (docs/rdma.md).
.PHONY: test-rdma
test-rdma:
	scripts/test-rdma.sh

# Kubernetes 1.37 itself (tests/k8s, a module of its own): the injected
# goldens through its validation, and a real kube-apiserver + etcd on
# loopback calling `tidepool webhook`, with `kubectl apply -k deploy/`.
# kube-apiserver is built from the Go module proxy once and cached in
# ${XDG_CACHE_HOME:-$HOME/.cache}/tidepool/ (docs/kubernetes.md).
.PHONY: test-k8s
test-k8s:
	scripts/test-k8s.sh

# The image from Debian packages (mmdebstrap, umoci; no Docker), run with
# crun and spoken to through its socket. Not part of `make test`: it
# downloads Debian packages and needs a privileged (root) machine.
.PHONY: image
image:
	scripts/test-image.sh

# vLLM with the tidepool connector against real sidecars (installs its venv).
.PHONY: test-engines
test-engines:
	scripts/test-engines.sh

# SGLang's HiCache storage code with tidepool.sglang against real sidecars
# (installs its venv; no GPU: docs/engines.md, "SGLang").
.PHONY: test-sglang
test-sglang:
	scripts/test-sglang.sh

# Both lists run even when the first fails, so one report shows every failure.
test-go:
	@rc=0
	race="$(RACE_PKGS)"
	norace="$(NORACE_PKGS)"
	if [[ -n "$$race" ]]; then
		echo "== go test -race ($$(wc -w <<<"$$race") packages)"
		$(GO) test -race -timeout $(TEST_TIMEOUT) $(GO_TEST_FLAGS) $$race || rc=1
	fi
	if [[ -n "$$norace" ]]; then
		echo "== go test, no race detector: $$norace"
		$(GO) test -timeout $(TEST_TIMEOUT) $(GO_TEST_FLAGS) $$norace || rc=1
	fi
	exit $$rc

test-python:
	scripts/test-python.sh

# Placeholder: Go benchmarks of the real-socket path.
bench:
	$(GO) test -run '^$$' -bench . -benchtime 2x ./proxy/... ./client/...

# The inner loop (under two minutes on 2 cores): formatting, vet, the
# Python lint and type check, and the unit tests; `-short` leaves out every test that
# starts a real `tidepool serve`, a memberlist cluster or a long
# simulation. `make test` runs all.
check: $(RUFF) $(MYPY)
	@$(MAKE) --no-print-directory fmt-check
	$(RUFF) check
	(cd clients/python && $(CURDIR)/$(MYPY))
	$(GO) vet ./...
	$(GO) test -short -count=1 ./...

fmt-check:
	@files=$$(find . \( -path ./.git -o -path ./.cache -o -path ./bin \) -prune -o -name '*.go' -print)
	bad=$$(gofmt -l $$files)
	if [[ -n "$$bad" ]]; then
		echo "gofmt: these files need formatting:"; echo "$$bad"; exit 1
	fi
	echo "gofmt: ok"

# staticcheck's default checks over the whole tree (generated code
# included) in both builds, without and with the verbs tag (rdma/verbs; it
# needs libibverbs-dev), merged so that code used by one build only is not
# reported unused; vet of the verbs build and of the research code, which
# builds only with its tag (research/issue5: experiments on cache/evict and
# its simulator); ruff over the Python client and tests (ruff.toml); mypy
# over the Python client (clients/python/pyproject.toml).
lint: $(STATICCHECK) $(RUFF) $(MYPY)
	@rc=0
	echo "== staticcheck $(STATICCHECK_VERSION), default and verbs builds"
	printf 'default:\nverbs: -tags=verbs\n' | $(STATICCHECK) -matrix ./... || rc=1
	echo "== go vet -tags verbs"
	$(GO) vet -tags verbs ./... || rc=1
	echo "== go vet -tags research"
	$(GO) vet -tags research ./... || rc=1
	echo "== ruff $(RUFF_VERSION)"
	$(RUFF) check || rc=1
	echo "== mypy $(MYPY_VERSION)"
	(cd clients/python && $(CURDIR)/$(MYPY)) || rc=1
	exit $$rc

# go.mod and go.sum are exactly what `go mod tidy` writes (prints the diff).
tidy-check:
	@if $(GO) mod tidy -diff; then echo "go mod tidy: ok"; else echo "go mod tidy: go.mod/go.sum are not tidy (run go mod tidy)"; exit 1; fi

list-pkgs:
	@echo "race:   $(RACE_PKGS)"
	@echo "norace: $(NORACE_PKGS)"

clean:
	rm -rf bin protocol/.gen-check protocol/.gen-work
