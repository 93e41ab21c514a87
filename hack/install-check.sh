#!/usr/bin/env bash
# make install-check: render manifests/ (kustomize overlays, examples, Helm
# chart), check the renderings agree with each other and with the Go code,
# server-side apply them to the embedded real kube-apiserver + Kueue, and run
# the built gpupack-manager under the manifests' RBAC until it is ready.
# The same test runs inside `make test`.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export CGO_CFLAGS=${CGO_CFLAGS:--Wno-deprecated-declarations}
# Control-plane binaries come from hack/build-tools.sh (make tools).
hack/build-install-tools.sh >/dev/null
exec go test -count=1 -timeout "${INSTALL_CHECK_TIMEOUT:-20m}" -v ./test/integration/install/ "$@"
