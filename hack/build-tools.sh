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
TRAINER_VERSION=v2.2.0
MPI_OPERATOR_VERSION=v0.8.0
KUBERAY_VERSION=v1.6.0

# shellcheck source=lib/build-tool.sh
source "$ROOT/hack/lib/build-tool.sh"
build() { build_tool hack/build-tools "$@"; }

kv="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37"
# Arguments: tool names; "all" (the default) is every tool not built only
# when named. `hack/build-tools.sh all jobset lws` is what `make tools` runs.
only=" ${*:-all} "
want() { [[ $only == *" all "* || $only == *" $1 "* ]]; }
want etcd && build etcd "$ETCD_VERSION" etcd go.etcd.io/etcd/server/v3
want kube-apiserver && build kube-apiserver "$K8S_VERSION" kube k8s.io/kubernetes/cmd/kube-apiserver "$kv"
want kube-scheduler && build kube-scheduler "$K8S_VERSION" kube k8s.io/kubernetes/cmd/kube-scheduler "$kv"
want kube-controller-manager && build kube-controller-manager "$K8S_VERSION" kube k8s.io/kubernetes/cmd/kube-controller-manager "$kv"
want kueue && build kueue "$KUEUE_VERSION" kueue sigs.k8s.io/kueue/cmd/kueue "-X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION"
want kwok && build kwok "$KWOK_VERSION" kwok sigs.k8s.io/kwok/cmd/kwok
want training-operator && build training-operator "$TRAINING_OPERATOR_VERSION" training-operator github.com/kubeflow/training-operator/cmd/training-operator.v1
# The JobSet and LeaderWorkerSet controllers (the jobkinds suite runs
# them): built only when named, `hack/build-tools.sh jobset lws`, as
# `make tools` (so `make test` and CI) does; a test process's own call
# (framework.EnsureTools, no arguments) does not build them, and their
# tests skip without them outside CI.
wantnamed() { [[ $only == *" $1 "* ]]; }
wantnamed jobset && build jobset "$JOBSET_VERSION" jobset sigs.k8s.io/jobset
wantnamed lws && build lws "$LWS_VERSION" lws sigs.k8s.io/lws/cmd
# The Kubeflow Trainer v2 controller manager (TrainJob -> JobSet; the
# trainjob suite runs it with the JobSet controller): named, like jobset.
wantnamed trainer && build trainer "$TRAINER_VERSION" trainer github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager
# The MPI operator and KubeRay's operator (the jobkinds suite's MPIJob and
# RayJob tests), the same way: `hack/build-tools.sh mpi-operator kuberay`.
wantnamed mpi-operator && build mpi-operator "$MPI_OPERATOR_VERSION" mpi-operator github.com/kubeflow/mpi-operator/cmd/mpi-operator
wantnamed kuberay && build kuberay "$KUBERAY_VERSION" kuberay github.com/ray-project/kuberay/ray-operator
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
