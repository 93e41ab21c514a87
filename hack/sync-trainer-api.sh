#!/usr/bin/env bash
# Copies Kubeflow Trainer's v1alpha1 API types (without the generated OpenAPI
# and defaulters, which do not compile against k8s.io/api v0.37) into
# webhooks/mutation/trainerapi/v1alpha1. See that package's doc.go.
set -euo pipefail
version="${1:-v2.2.0}"
cd "$(dirname "$0")/.."
dst=webhooks/mutation/trainerapi/v1alpha1
src="$(go mod download -json "github.com/kubeflow/trainer/v2@${version}" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')/pkg/apis/trainer/v1alpha1"
for f in groupversion_info.go trainingruntime_types.go trainjob_types.go zz_generated.deepcopy.go; do
	install -m 0644 "$src/$f" "$dst/$f"
done
go build "./$dst"
