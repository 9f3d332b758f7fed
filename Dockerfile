# syntax=docker/dockerfile:1
#
# The tidepool image: one binary that is the sidecar (`tidepool serve`),
# the injector (`tidepool inject`) and the admission webhook
# (`tidepool webhook`). Not built in CI (there is no Docker engine there);
# see docs/kubernetes.md, "The image".
#
#   docker build -t ghcr.io/tidepool-kv/tidepool:0.1.0 --build-arg VERSION=0.1.0 .
#
# Both stages are Debian bookworm, so the RocksDB the binary is linked
# against (librocksdb-dev 7.8, cgo through grocksdb) is the one the
# runtime stage installs (librocksdb7.8).

FROM golang:1.26-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends librocksdb-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=0.1.0-dev
RUN CGO_ENABLED=1 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" \
      -o /out/tidepool ./cmd/tidepool

FROM debian:bookworm-slim
# The runtime packages are listed once, in image/runtime-packages, which
# scripts/build-image.sh (the same image from Debian packages alone,
# without Docker) reads too.
COPY image/runtime-packages /tmp/runtime-packages
RUN apt-get update \
 && sed 's/#.*//' /tmp/runtime-packages | xargs apt-get install -y --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages
COPY --from=build /out/tidepool /usr/local/bin/tidepool
# An unprivileged default user. An injected sidecar runs as its engine's
# user instead (it sets runAsUser; docs/kubernetes.md, "Users and
# directories"); the webhook runs as this one.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/tidepool"]
CMD ["serve"]
