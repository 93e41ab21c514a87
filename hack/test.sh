#!/usr/bin/env bash
# Runs every test: unit tests, fuzz seeds (as regression tests) and the
# integration suites against the real control plane. Prints one summary line.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
P=${1:-2}
TIMEOUT=${2:-60m}
export CGO_CFLAGS=-Wno-deprecated-declarations
start=$SECONDS
log=$(mktemp)
go test -p "$P" -timeout "$TIMEOUT" -json ./... >"$log"
rc=$?
# Human-readable per-package results plus failures' output.
go run ./hack/testsummary <"$log"
src=$?
rm -f "$log"
echo "make test: $((SECONDS - start))s"
[[ $rc -eq 0 && $src -eq 0 ]]
