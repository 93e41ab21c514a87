#!/usr/bin/env bash
# Builds the real control-plane binaries the tests run against, from the Go
# module proxy, into a git-ignored folder of the repo. Each binary is built
# only when its pinned version is not already there, so a second `make test`
# rebuilds nothing. Pins live in hack/tools/*/go.mod (with go.sum).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${GPUPACK_TOOLS_DIR:-$ROOT/_output/tools}
mkdir -p "$OUT"
export CGO_ENABLED=0
# Test processes call this script concurrently (framework.EnsureTools): one
# builds, the others wait and then find the pinned versions in place.
exec 9>"$OUT/.build.lock"
flock 9

K8S_VERSION=v1.37.2
ETCD_VERSION=v3.7.3
KUEUE_VERSION=v0.17.0
KWOK_VERSION=v0.8.0
TRAINING_OPERATOR_VERSION=v1.9.3
JOBSET_VERSION=v0.11.1
LWS_VERSION=v0.8.0

# shellcheck source=lib/build-tool.sh
source "$ROOT/hack/lib/build-tool.sh"
build() { build_tool hack/build-tools "$@"; }

kv="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37"
only=${1:-all}
want() { [[ $only == all || " $only " == *" $1 "* ]]; }
want etcd && build etcd "$ETCD_VERSION" etcd go.etcd.io/etcd/server/v3
want kube-apiserver && build kube-apiserver "$K8S_VERSION" kube k8s.io/kubernetes/cmd/kube-apiserver "$kv"
want kube-scheduler && build kube-scheduler "$K8S_VERSION" kube k8s.io/kubernetes/cmd/kube-scheduler "$kv"
want kube-controller-manager && build kube-controller-manager "$K8S_VERSION" kube k8s.io/kubernetes/cmd/kube-controller-manager "$kv"
want kueue && build kueue "$KUEUE_VERSION" kueue sigs.k8s.io/kueue/cmd/kueue "-X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION"
want kwok && build kwok "$KWOK_VERSION" kwok sigs.k8s.io/kwok/cmd/kwok
want training-operator && build training-operator "$TRAINING_OPERATOR_VERSION" training-operator github.com/kubeflow/training-operator/cmd/training-operator.v1
# The JobSet and LeaderWorkerSet controllers: no suite starts them yet (the
# jobkinds suite needs only their CRDs and Kueue), so they are built only
# when named: `hack/build-tools.sh jobset lws` (~13 min on 2 cores the first
# time), keeping `make test` on a clean machine well inside CI's budget.
wantnamed() { [[ " $only " == *" $1 "* ]]; }
wantnamed jobset && build jobset "$JOBSET_VERSION" jobset sigs.k8s.io/jobset
wantnamed lws && build lws "$LWS_VERSION" lws sigs.k8s.io/lws/cmd
# kwok's "fast" stages (nodes Ready at once, pods run, Job pods complete),
# copied from the pinned module so tests don't depend on its cache path.
if want kwok && [[ ! -f "$OUT/kwok-stages/.version" || "$(cat "$OUT/kwok-stages/.version")" != "$KWOK_VERSION" ]]; then
	kdir=$(cd "$ROOT/hack/tools/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
	mkdir -p "$OUT/kwok-stages"
	cp "$kdir"/kustomize/stage/node/fast/node-initialize.yaml "$kdir"/kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml "$kdir"/kustomize/stage/pod/fast/pod-*.yaml "$OUT/kwok-stages/"
	chmod u+w "$OUT"/kwok-stages/*.yaml
	echo "$KWOK_VERSION" >"$OUT/kwok-stages/.version"
fi
echo "$OUT"
