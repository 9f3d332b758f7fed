#!/usr/bin/env bash
# Prints the path of a Kubernetes binary (kube-apiserver, or kubectl)
# built from the Go module proxy at the release tests/k8s/go.mod pins,
# building it the first time.
#
# Binaries are kept outside the checkout (CI starts from a fresh clone):
# ${XDG_CACHE_HOME:-$HOME/.cache}/tidepool/<name>-<version>/<name>, so each
# is rebuilt only when the pinned version changes. kube-apiserver's first
# build compiles about 2,000 packages; the Go build cache keeps them too
# (-trimpath, as tests/k8s's `go test` uses, so they are shared).
#
#   scripts/k8s-bin.sh [kube-apiserver|kubectl]
#   NICE=0 scripts/k8s-bin.sh     # build at normal priority (default 15)
set -euo pipefail

name=${1:-kube-apiserver}
case $name in
kube-apiserver | kubectl) ;;
*) echo "k8s-bin: $name: want kube-apiserver or kubectl" >&2; exit 2 ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
mod=$root/tests/k8s
ver=$(cd "$mod" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
dir=${XDG_CACHE_HOME:-$HOME/.cache}/tidepool/$name-$ver
bin=$dir/$name

if [[ ! -x $bin ]]; then
	mkdir -p "$dir"
	major=${ver#v}; major=${major%%.*}
	minor=${ver#v*.}; minor=${minor%%.*}
	pkg=k8s.io/component-base/version
	echo "k8s-bin: building $name $ver into $dir" >&2
	t0=$SECONDS
	(cd "$mod" && nice -n "${NICE:-15}" go build -trimpath \
		-ldflags "-s -w -X $pkg.gitVersion=$ver -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean" \
		-o "$bin.partial" "k8s.io/kubernetes/cmd/$name")
	mv "$bin.partial" "$bin"
	echo "k8s-bin: built $name in $((SECONDS - t0)) s" >&2
fi
echo "$bin"
