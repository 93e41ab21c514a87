# gpupack — one entry point. `make demo` runs the main job, `make test` all tests.
SHELL := /bin/bash
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/gpupack/gpupack/cmd/internal/version.Version=$(VERSION)
export CGO_CFLAGS := -Wno-deprecated-declarations
# Integration test packages each start a control plane; two at a time fits 2 cores.
TEST_P ?= 2
TEST_TIMEOUT ?= 60m

.PHONY: all build tools devicehook test unit integration bench demo lint codegen install-check clean

all: build

# gpupack-ckpt is copied into arbitrary images: built static, without libc.
build: devicehook
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/ ./cmd/gpupack ./cmd/gpupack-manager ./cmd/gpupack-node
	CGO_ENABLED=0 $(GO) build -ldflags "$(LDFLAGS)" -o bin/gpupack-ckpt ./cmd/gpupack-ckpt

# Real control-plane binaries (etcd, kube-apiserver, kube-scheduler,
# kube-controller-manager, Kueue, kwok, training-operator, and the JobSet and
# LWS controllers the jobkinds suite runs) built from the Go module proxy into
# _output/tools; skipped when the pinned versions are there.
tools:
	hack/build-tools.sh all jobset lws trainer
	hack/build-tools.sh mpi-operator kuberay

devicehook:
	@if [ -f devicehook/Makefile ]; then $(MAKE) -C devicehook; fi

test: tools devicehook
	hack/test.sh $(TEST_P) $(TEST_TIMEOUT)

unit:
	$(GO) test $$($(GO) list ./... | grep -v /test/integration)

integration: tools devicehook
	$(GO) test -p $(TEST_P) -timeout $(TEST_TIMEOUT) ./test/...

bench: devicehook
	$(GO) test -run '^$$' -bench . -benchtime 2s ./...

# Gang-fit check end to end through the real apiserver + Kueue (a load
# driver, prints a table; docs/bench/gangfit-e2e.md). BENCH_E2E_ARGS sizes it.
.PHONY: bench-e2e
bench-e2e: tools
	GPUPACK_SKIP_TOOLS_BUILD=1 $(GO) run ./admissioncheck/bench/e2e $(BENCH_E2E_ARGS)

demo: tools devicehook
	$(GO) run ./hack/demo

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# Renders manifests/ (kustomize overlays + Helm chart), server-side applies
# them to the embedded real apiserver and runs the built manager from them.
install-check: tools
	hack/install-check.sh

codegen:
	hack/codegen.sh

clean:
	rm -rf bin devicehook/build
