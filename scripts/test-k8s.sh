#!/usr/bin/env bash
# tidepool against Kubernetes itself (tests/k8s, a Go module of its own
# pinned to one Kubernetes release):
#   - every injected golden pod and pod template through that release's
#     defaulting and create-time validation (TestGoldensValidate);
#   - a real kube-apiserver on etcd, on loopback: cert-manager's and the
#     Prometheus Operator's CRDs, `kubectl apply -k deploy/` and
#     deploy/examples/, pods injected by the API server calling a real
#     `tidepool webhook`, read back and compared with `tidepool inject`
#     (TestAgainstAPIServer).
#
# kube-apiserver is built from the Go module proxy the first time and kept
# in ${XDG_CACHE_HOME:-$HOME/.cache}/tidepool/ (scripts/k8s-bin.sh);
# etcd-server comes from Debian (scripts/install-deps.sh); kubectl is the
# one on PATH, else one built from the same module. docs/kubernetes.md.
#
#   scripts/test-k8s.sh                      everything
#   scripts/test-k8s.sh -run TestGoldens     go test flags for tests/k8s
set -euo pipefail
cd "$(dirname "$0")/.."

# The CRDs deploy/ needs, from the releases pinned here (their Go modules
# carry the CRD YAML). The Go module proxy serves no prometheus-operator
# root module after v0.85.0 ("403 This module version is not available"),
# so PodMonitor's CRD is v0.85.0's; deploy/ uses only fields it has.
# LeaderWorkerSet's CRD is there so that an injected LeaderWorkerSet meets
# its schema.
CERT_MANAGER_VERSION=v1.21.2
PROMETHEUS_OPERATOR_VERSION=v0.85.0
LWS_VERSION=v0.8.0

t0=$SECONDS
moddir() {
	go mod download -json "$1" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'
}
cm=$(moddir "github.com/cert-manager/cert-manager@$CERT_MANAGER_VERSION")
po=$(moddir "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION")
lws=$(moddir "sigs.k8s.io/lws@$LWS_VERSION")
crds=("$cm/deploy/crds/cert-manager.io_issuers.yaml" "$cm/deploy/crds/cert-manager.io_certificates.yaml"
	"$po/example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml"
	"$lws/config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml")
for f in "${crds[@]}"; do
	[[ -f $f ]] || { echo "test-k8s: CRD file missing: $f" >&2; exit 1; }
done

command -v etcd >/dev/null || { echo "test-k8s: etcd not found (scripts/install-deps.sh installs etcd-server)" >&2; exit 1; }
apiserver=$(scripts/k8s-bin.sh kube-apiserver)
kubectl=$(command -v kubectl || true)
if [[ -z $kubectl ]]; then
	kubectl=$(scripts/k8s-bin.sh kubectl)
fi
echo "test-k8s: building bin/tidepool"
mkdir -p bin
go build -o bin/tidepool ./cmd/tidepool
echo "test-k8s: ready in $((SECONDS - t0)) s: $apiserver, $("$kubectl" version --client 2>/dev/null | head -1), $(etcd --version | head -1)"

cd tests/k8s
# The module's own checks, as `make test` does them for the main module.
go mod tidy -diff
go vet -trimpath .
TIDEPOOL_KUBE_APISERVER=$apiserver TIDEPOOL_BIN=$PWD/../../bin/tidepool KUBECTL=$kubectl \
	TIDEPOOL_CRDS="${crds[*]}" \
	go test -trimpath -count=1 -timeout 9m -v "$@" .
echo "test-k8s: PASS in $((SECONDS - t0)) s"
