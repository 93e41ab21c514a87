#!/usr/bin/env bash
# Builds the tools `make install-check` renders and checks manifests/ with —
# kustomize and helm, pinned in hack/tools/{kustomize,helm}/go.mod — into
# _output/tools, and copies the third-party CRDs the optional overlays need
# (cert-manager, prometheus-operator's ServiceMonitor) from their Go modules
# into _output/tools/install-crds. Everything is skipped when the pinned
# version is already there, so a second run does nothing.
# (Kept apart from hack/build-tools.sh, which builds the control plane.)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${GPUPACK_TOOLS_DIR:-$ROOT/_output/tools}
mkdir -p "$OUT"
export CGO_ENABLED=0

KUSTOMIZE_VERSION=v5.8.1
HELM_VERSION=v3.22.0
CERT_MANAGER_VERSION=v1.20.0
PROMETHEUS_OPERATOR_VERSION=v0.85.0

# shellcheck source=lib/build-tool.sh
source "$ROOT/hack/lib/build-tool.sh"
build() { build_tool hack/build-install-tools "$@"; }

# crds NAME MODULE VERSION SUBDIR FILE... — copy CRD files out of a module.
crds() {
	local name=$1 mod=$2 version=$3 sub=$4
	shift 4
	local dst="$OUT/install-crds/$name"
	if [[ -f "$dst/.version" && "$(cat "$dst/.version")" == "$version" ]]; then
		return 0
	fi
	local dir tmp
	# Outside any module, so no go.mod or go.sum is touched.
	tmp=$(mktemp -d)
	dir=$(cd "$tmp" && GO111MODULE=on GOFLAGS= go mod download -json "$mod@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	rmdir "$tmp"
	if [[ -z $dir ]]; then
		echo "hack/build-install-tools: could not download $mod@$version" >&2
		return 1
	fi
	rm -rf "$dst.tmp" && mkdir -p "$dst.tmp"
	for f in "$@"; do cp "$dir/$sub/$f" "$dst.tmp/"; done
	chmod u+w "$dst.tmp"/*
	echo "$version" >"$dst.tmp/.version"
	rm -rf "$dst" && mv "$dst.tmp" "$dst"
}

only=${1:-all}
want() { [[ $only == all || " $only " == *" $1 "* ]]; }
want kustomize && build kustomize "$KUSTOMIZE_VERSION" kustomize sigs.k8s.io/kustomize/kustomize/v5 \
	"-X sigs.k8s.io/kustomize/api/provenance.version=$KUSTOMIZE_VERSION"
# helm's default Kubernetes version (for kubeVersion checks in `helm
# template`) comes from ldflags, as in helm's own Makefile: client-go v0.37 → 1.37.
hk="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
for p in pkg/lint/rules pkg/chartutil; do
	hk+=" -X helm.sh/helm/v3/$p.k8sVersionMajor=1 -X helm.sh/helm/v3/$p.k8sVersionMinor=37"
done
want helm && build helm "$HELM_VERSION+k8s1.37" helm helm.sh/helm/v3/cmd/helm "$hk"
want crds && {
	crds cert-manager github.com/cert-manager/cert-manager "$CERT_MANAGER_VERSION" deploy/crds \
		cert-manager.io_certificates.yaml cert-manager.io_issuers.yaml cert-manager.io_clusterissuers.yaml cert-manager.io_certificaterequests.yaml
	crds prometheus-operator github.com/prometheus-operator/prometheus-operator "$PROMETHEUS_OPERATOR_VERSION" example/prometheus-operator-crd \
		monitoring.coreos.com_servicemonitors.yaml
}
echo "$OUT"
