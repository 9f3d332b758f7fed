#!/usr/bin/env bash
# Installs the Debian packages that building and testing tidepool needs, and
# only those that are missing. Idempotent: when everything is present it only
# queries dpkg and exits (no apt-get update, no network).
#
#   build-essential  gcc for cgo (grocksdb, race detector)
#   librocksdb-dev   RocksDB headers and library for grocksdb (cache/ssd)
#   thrift-compiler  `thrift --gen py` for the Python interop test
#   python3-thrift   Apache Thrift runtime for /usr/bin/python3
#   python3-zmq, python3-msgpack  the KV-event subscriber test (test_kv_events.py)
#   python3-venv     the venv `make tools` installs ruff into (Python lint)
#   fio              SSD baseline benchmarks
#   redis-server     comparison benchmarks
#   iproute2         network-namespace tests (`ip netns`)
#   libibverbs-dev   the optional `rdma` build tag
#   etcd-server      storage of the kube-apiserver of `make test-k8s`
#   mmdebstrap umoci crun skopeo
#                    `make image`: build the image from Debian packages,
#                    run it, inspect it (scripts/build-image.sh)
#
# Works as root or through sudo, without a TTY or stdin.
set -euo pipefail

packages=(
	build-essential
	librocksdb-dev
	thrift-compiler
	python3-thrift
	python3-zmq
	python3-msgpack
	python3-venv
	fio
	redis-server
	iproute2
	libibverbs-dev
	# SGLang compiles its page hash (C++, -lcrypto) at first use: scripts/test-sglang.sh
	libssl-dev
	ninja-build
	etcd-server
	mmdebstrap
	umoci
	crun
	skopeo
)

installed() {
	# `dpkg -s` also succeeds for removed packages whose config files remain,
	# so look at the status field itself.
	[[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == "install ok installed" ]]
}

missing=()
for p in "${packages[@]}"; do
	installed "$p" || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
	echo "install-deps: all ${#packages[@]} packages present"
	exit 0
fi

if [[ $(id -u) -eq 0 ]]; then
	sudo=()
elif command -v sudo >/dev/null 2>&1; then
	sudo=(sudo -n)
else
	echo "install-deps: missing ${missing[*]}; run as root or install sudo" >&2
	exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt_opts=(-y -q -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install "${apt_opts[@]}" \
	--no-install-recommends "${missing[@]}" </dev/null

still=()
for p in "${missing[@]}"; do
	installed "$p" || still+=("$p")
done
if ((${#still[@]} > 0)); then
	echo "install-deps: still missing after install: ${still[*]}" >&2
	exit 1
fi
echo "install-deps: done"
