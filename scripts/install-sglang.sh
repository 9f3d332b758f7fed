#!/usr/bin/env bash
# Installs the SGLang test environment: a virtual environment (default
# .venv-sglang/) with the pinned sglang, WITHOUT its dependencies, on
# PyPI's torch, plus the few pure-Python packages that SGLang's HiCache
# storage code (hicache_storage, backend_factory, memory_pool_host,
# cache_controller) imports, and this repository's Python package
# (clients/python, tidepool-kv[sglang], editable).
#
# Why not `pip install sglang`: that is 11 GB (CUDA kernels, flashinfer,
# triton, ...) that cannot run on a CPU-only machine anyway; the storage
# interface needs none of it (docs/engines.md, "SGLang").
#
# torch is the version scripts/install-engines.sh installs, so pip takes
# it from its cache when the vLLM venv was installed first (make test runs
# test-engines before test-sglang). sglang 0.5.23 declares torch 2.14.1;
# the storage and host-pool code runs on 2.13.0 (tests/engines/test_sglang_*).
#
# Idempotent: when the venv holds exactly the pinned set (stamp file) and
# the imports work, it exits without touching the network.
#
#   VENV=path scripts/install-sglang.sh     (default .venv-sglang)
set -euo pipefail
cd "$(dirname "$0")/.."

SGLANG_VERSION=0.5.23
TORCH_VERSION=2.13.0 # = scripts/install-engines.sh's, so a warm pip cache serves both
VENV=${VENV:-.venv-sglang}
PYTHON=${PYTHON:-}
CONSTRAINTS=tests/engines/constraints.txt
# What `import sglang.srt.managers.cache_controller` and the storage modules
# need besides torch (found by iterating on ModuleNotFoundError).
DEPS=(numpy pyzmq msgspec pydantic orjson psutil pybase64 requests packaging pillow starlette tqdm
	IPython aiohttp "setuptools>=77" transformers torchvision apache-tvm-ffi dill sentencepiece
	compressed-tensors gguf)

if [[ -z "$PYTHON" ]]; then
	for p in python3.11 python3.12 python3; do
		if command -v "$p" >/dev/null 2>&1; then PYTHON=$p; break; fi
	done
fi
[[ -n "$PYTHON" ]] || { echo "install-sglang: no python3 found" >&2; exit 1; }

pkg_hash=$(cat clients/python/pyproject.toml "$CONSTRAINTS" "$0" | sha256sum | cut -c1-16)
stamp="sglang==$SGLANG_VERSION torch==$TORCH_VERSION tidepool-kv+constraints:$pkg_hash"
py=$VENV/bin/python
check='import torch, sglang.srt.mem_cache.hicache_storage, sglang.srt.mem_cache.storage.backend_factory, sglang.srt.mem_cache.memory_pool_host, sglang.srt.managers.cache_controller, tidepool.sglang'

if [[ -x "$py" && -f "$VENV/.tidepool-sglang-stamp" && "$(cat "$VENV/.tidepool-sglang-stamp")" == "$stamp" ]]; then
	if "$py" -c "$check" >/dev/null 2>&1; then
		echo "install-sglang: $VENV is up to date ($stamp)"
		exit 0
	fi
	echo "install-sglang: $VENV is stamped but does not import; reinstalling" >&2
fi

if [[ ! -x "$py" ]]; then
	echo "install-sglang: creating $VENV with $($PYTHON --version)"
	"$PYTHON" -m venv "$VENV"
fi
# --no-compile: pip would byte-compile all ~16,000 .py files it installs
# (torch, transformers, sglang, ...); the tests import about 4,000 of them,
# which Python compiles (and caches) at their first import.
install=("$py" -m pip --disable-pip-version-check install --no-compile)

echo "install-sglang: torch==$TORCH_VERSION and ${#DEPS[@]} packages SGLang's storage code imports"
"${install[@]}" -c "$CONSTRAINTS" "torch==$TORCH_VERSION" "${DEPS[@]}"
echo "install-sglang: sglang==$SGLANG_VERSION (no deps)"
"${install[@]}" --no-deps "sglang==$SGLANG_VERSION"
echo "install-sglang: clients/python[sglang] (editable)"
"${install[@]}" -c "$CONSTRAINTS" -e "./clients/python[sglang]"

"$py" -c "$check; print('install-sglang: sglang', sglang.__version__, 'torch', torch.__version__)" 2>&1 | grep -v 'dependency conflicts' || true
"$py" -c "$check"
echo "$stamp" >"$VENV/.tidepool-sglang-stamp"
echo "install-sglang: done"
