#!/usr/bin/env bash
# Builds the tidepool image without Docker, from Debian packages alone: the
# runtime the Dockerfile describes (bookworm, the packages of
# image/runtime-packages, /usr/local/bin/tidepool, user 65532, entrypoint
# tidepool, command serve), as an OCI image layout.
#
#   mmdebstrap  the base layer: a minbase bookworm root with the runtime
#               packages (apt lists, docs and man pages left out, like
#               debian:bookworm-slim); cached by the package list's hash
#   go build    the binary, on this bookworm machine as the Dockerfile's
#               golang:1.26-bookworm build stage does
#   umoci       the layout: the base layer, the binary as a second layer
#               (the Dockerfile's COPY), the image config
#
#   scripts/build-image.sh                 -> .cache/image/oci:<version>
#   VERSION=0.1.0 scripts/build-image.sh
#
# Needs root (mmdebstrap's root mode), mmdebstrap and umoci (Debian), and
# deb.debian.org (or MIRROR). Prints the image reference (layout:tag).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo 0.1.0-dev)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
out=.cache/image
mkdir -p "$out"

packages=$(sed 's/#.*//' image/runtime-packages | xargs)
[[ -n $packages ]] || { echo "build-image: image/runtime-packages lists no package" >&2; exit 1; }
base=$out/base-$(sha256sum image/runtime-packages | cut -c1-16).tar
if [[ ! -f $base ]]; then
	echo "build-image: base layer: bookworm minbase + $packages" >&2
	# The Debian security suite too, as debian:bookworm-slim has it.
	mmdebstrap --variant=minbase --include="${packages// /,}" \
		--skip=output/dev \
		--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
		--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
		--dpkgopt='path-exclude=/usr/share/info/*' \
		--customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
		bookworm "${base%.tar}.partial.tar" \
		"deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main" \
		"deb ${MIRROR%/debian}/debian-security bookworm-security main" >&2
	mv "${base%.tar}.partial.tar" "$base"
fi

echo "build-image: tidepool $VERSION" >&2
rm -rf "$out/bin"
mkdir -p "$out/bin/usr/local/bin"
CGO_ENABLED=1 go build -trimpath -ldflags "-s -w -X main.version=$VERSION" \
	-o "$out/bin/usr/local/bin/tidepool" ./cmd/tidepool

# umoci tags cannot hold every character git describe may print.
tag=${VERSION//[^A-Za-z0-9._-]/_}
layout=$out/oci
rm -rf "$layout"
umoci init --layout "$layout"
umoci new --image "$layout:$tag"
umoci raw add-layer --image "$layout:$tag" "$base"
umoci insert --image "$layout:$tag" "$out/bin/usr/local/bin/tidepool" /usr/local/bin/tidepool
umoci config --image "$layout:$tag" \
	--os linux --architecture amd64 \
	--config.user 65532:65532 \
	--config.entrypoint /usr/local/bin/tidepool --config.cmd serve \
	--config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	--config.label org.opencontainers.image.version="$VERSION" \
	--config.label org.opencontainers.image.source=https://github.com/tidepool-kv/tidepool
umoci gc --layout "$layout"
echo "$layout:$tag"
