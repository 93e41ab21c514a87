#!/usr/bin/env bash
# Regenerates deepcopy functions and CRDs from gpupack's Go types.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CG=$ROOT/_output/tools/controller-gen
if [[ ! -x $CG ]]; then
	(cd "$ROOT/hack/tools/controller-gen" && go build -o "$CG" sigs.k8s.io/controller-tools/cmd/controller-gen)
fi
cd "$ROOT"
"$CG" object paths=./admissioncheck/api/...
"$CG" crd paths=./admissioncheck/api/... output:crd:artifacts:config=manifests/base/crds
# Volcano publishes Go types but no CRD files in volcano.sh/apis: generate
# the ones tests install (PodGroup, Queue, HyperNode) from those types.
"$CG" crd:allowDangerousTypes=true paths=volcano.sh/apis/pkg/apis/scheduling/v1beta1 \
	paths=volcano.sh/apis/pkg/apis/topology/v1alpha1 output:crd:artifacts:config=test/framework/crds/volcano
