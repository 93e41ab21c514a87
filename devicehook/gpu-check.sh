#!/usr/bin/env bash
# gpu-check.sh: checks libgpupack-hook.so on a machine with a real NVIDIA
# GPU, nvcc (CUDA 12/13) and PyTorch. Not run by `go test` (which uses the
# fake driver); run it by hand or on a GPU CI runner:
#
#   devicehook/gpu-check.sh            # uses GPU 0, a 4 GiB limit
#
# It checks, with CUDA_DEVICE_MEMORY_LIMIT=4g:
#   1. PyTorch: torch.cuda.mem_get_info() reports a 4 GiB total; a 5 GiB
#      tensor fails with OutOfMemoryError; a 3 GiB tensor succeeds.
#   2. A CUDA C program (runtime API, statically linked cudart, so it
#      reaches the driver through dlopen + cuGetProcAddress): cudaMemGetInfo
#      reports 4 GiB; cudaMalloc / cudaMallocAsync / cudaMallocManaged of
#      5 GiB fail and of 3 GiB succeed; the remainder is enforced.
#   3. Overhead, same binary with and without LD_PRELOAD: cuMemAlloc +
#      cuMemFree per pair, cudaLaunchKernel of an empty kernel, and the SM
#      limiter's effect at CUDA_DEVICE_SM_LIMIT=30 on a busy kernel.
# Exit status 0 only if every check passed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
dev=${GPU_CHECK_DEVICE:-0}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

command -v nvidia-smi >/dev/null || { echo "FAIL: nvidia-smi not found: not a GPU machine"; exit 2; }
command -v nvcc >/dev/null || { echo "FAIL: nvcc not found"; exit 2; }
nvidia-smi -i "$dev" --query-gpu=name,memory.total,driver_version --format=csv,noheader

make -s -C "$here" build/libgpupack-hook.so
hook="$here/build/libgpupack-hook.so"
# The fake driver lives in build/fake: keep it off the library path so the
# real libcuda.so.1 is the one loaded.
if [ -n "${LD_LIBRARY_PATH:-}" ]; then
	LD_LIBRARY_PATH=$(printf '%s' "$LD_LIBRARY_PATH" | tr ':' '\n' | { grep -v "/build/fake" || true; } | paste -sd: -)
	export LD_LIBRARY_PATH
fi
unset FAKECUDA_STATE FAKECUDA_MEM

fails=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

hooked() {
	env CUDA_VISIBLE_DEVICES="$dev" LD_PRELOAD="$hook" \
		CUDA_DEVICE_MEMORY_LIMIT=4g \
		CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/cache" \
		LIBCUDA_LOG_LEVEL="${LIBCUDA_LOG_LEVEL:-1}" "$@"
}

# ---- 1. PyTorch -------------------------------------------------------------
cat >"$work/torch_check.py" <<'EOF'
import sys
import torch

GiB = 1 << 30
ok = True
free, total = torch.cuda.mem_get_info()
print(f"torch.cuda.mem_get_info: free={free} total={total}")
if total != 4 * GiB:
    print(f"FAIL: mem_get_info total {total}, want {4 * GiB}")
    ok = False
if not (0 < free <= total):
    print(f"FAIL: mem_get_info free {free} not in (0, total]")
    ok = False
try:
    x = torch.empty(5 * GiB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    print("FAIL: a 5 GiB tensor was allocated under a 4 GiB limit")
    ok = False
    del x
except torch.cuda.OutOfMemoryError as e:
    print("ok: 5 GiB refused:", str(e).splitlines()[0][:120])
torch.cuda.empty_cache()
try:
    y = torch.empty(3 * GiB, dtype=torch.uint8, device="cuda")
    y.fill_(1)
    torch.cuda.synchronize()
    free2, total2 = torch.cuda.mem_get_info()
    print(f"ok: 3 GiB allocated; mem_get_info now free={free2} total={total2}")
    if total2 != 4 * GiB or free2 > 1 * GiB:
        print("FAIL: after 3 GiB, free should be at most 1 GiB of a 4 GiB total")
        ok = False
except torch.cuda.OutOfMemoryError as e:
    print("FAIL: 3 GiB refused under a 4 GiB limit:", e)
    ok = False
sys.exit(0 if ok else 1)
EOF
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
	if hooked python3 "$work/torch_check.py"; then pass "PyTorch under a 4 GiB limit"; else fail "PyTorch under a 4 GiB limit"; fi
else
	fail "PyTorch with CUDA is not installed"
fi

# ---- 2. CUDA C program ------------------------------------------------------
cat >"$work/memcheck.cu" <<'EOF'
#include <cstdio>
#include <cuda_runtime.h>
static const size_t GiB = 1ull << 30;
static int bad = 0;
#define EXPECT(cond, ...) do { if (!(cond)) { printf("FAIL: " __VA_ARGS__); printf("\n"); bad = 1; } } while (0)
int main() {
	size_t fr = 0, tot = 0;
	cudaMemGetInfo(&fr, &tot);
	printf("cudaMemGetInfo: free=%zu total=%zu\n", fr, tot);
	EXPECT(tot == 4 * GiB, "cudaMemGetInfo total %zu, want 4 GiB", tot);
	void *p = nullptr, *q = nullptr;
	EXPECT(cudaMalloc(&p, 5 * GiB) == cudaErrorMemoryAllocation, "cudaMalloc 5 GiB was not refused");
	cudaGetLastError();
	EXPECT(cudaMalloc(&p, 3 * GiB) == cudaSuccess, "cudaMalloc 3 GiB failed");
	EXPECT(cudaMalloc(&q, 2 * GiB) == cudaErrorMemoryAllocation, "cudaMalloc 2 GiB on top of 3 GiB was not refused");
	cudaGetLastError();
	cudaFree(p);
	cudaStream_t s;
	cudaStreamCreate(&s);
	EXPECT(cudaMallocAsync(&p, 5 * GiB, s) != cudaSuccess, "cudaMallocAsync 5 GiB was not refused");
	cudaGetLastError();
	EXPECT(cudaMallocAsync(&p, 3 * GiB, s) == cudaSuccess, "cudaMallocAsync 3 GiB failed");
	cudaFreeAsync(p, s);
	cudaStreamSynchronize(s);
	EXPECT(cudaMallocManaged(&p, 5 * GiB) != cudaSuccess, "cudaMallocManaged 5 GiB was not refused");
	cudaGetLastError();
	EXPECT(cudaMallocManaged(&p, 3 * GiB) == cudaSuccess, "cudaMallocManaged 3 GiB failed");
	cudaFree(p);
	cudaMemGetInfo(&fr, &tot);
	EXPECT(tot == 4 * GiB && fr <= tot, "after frees: free=%zu total=%zu", fr, tot);
	printf(bad ? "memcheck: FAILED\n" : "memcheck: ok\n");
	return bad;
}
EOF
nvcc -O2 -o "$work/memcheck" "$work/memcheck.cu"
if hooked "$work/memcheck"; then pass "CUDA C program under a 4 GiB limit"; else fail "CUDA C program under a 4 GiB limit"; fi

# ---- 3. overhead ------------------------------------------------------------
cat >"$work/bench.cu" <<'EOF'
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda.h>
#include <cuda_runtime.h>
__global__ void empty() {}
__global__ void busy(long long cycles) {
	long long t0 = clock64();
	while (clock64() - t0 < cycles) {}
}
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main(int argc, char **argv) {
	const char *what = argv[1];
	cudaFree(0); // create the primary context
	if (!strcmp(what, "alloc")) {
		const int n = 100000;
		CUdeviceptr p;
		for (int i = 0; i < 1000; i++) { cuMemAlloc(&p, 4096); cuMemFree(p); }
		double t = now();
		for (int i = 0; i < n; i++) { cuMemAlloc(&p, 4096); cuMemFree(p); }
		printf("%.1f\n", (now() - t) / n * 1e9);
	} else if (!strcmp(what, "launch")) {
		const int n = 200000;
		for (int i = 0; i < 1000; i++) empty<<<1, 1>>>();
		cudaDeviceSynchronize();
		double t = now();
		for (int i = 0; i < n; i++) empty<<<1, 1>>>();
		double d = now() - t;
		cudaDeviceSynchronize();
		printf("%.1f\n", d / n * 1e9);
	} else { // busy: seconds to run 2000 kernels of ~1 ms each on all SMs
		int sms;
		cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
		double t = now();
		// ~1 ms per kernel at ~2 GHz; the ratio limited/unlimited is what counts.
		for (int i = 0; i < 2000; i++) busy<<<sms * 4, 128>>>(2000000LL);
		cudaDeviceSynchronize();
		printf("%.3f\n", now() - t);
	}
	return 0;
}
EOF
nvcc -O2 -o "$work/bench" "$work/bench.cu" -lcuda
plain_env() { env CUDA_VISIBLE_DEVICES="$dev" "$@"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
for what in alloc launch; do
	p=$(plain_env "$work/bench" "$what")
	h=$(hooked "$work/bench" "$what")
	echo "overhead $what: plain ${p} ns/op, hooked ${h} ns/op, +$(awk -v a="$h" -v b="$p" 'BEGIN{printf "%.1f", a-b}') ns, ratio $(ratio "$h" "$p")"
done
p=$(plain_env "$work/bench" busy)
h=$(hooked env CUDA_DEVICE_SM_LIMIT=30 "$work/bench" busy)
echo "SM limit 30: busy loop ${p} s unthrottled, ${h} s limited; share $(awk -v a="$p" -v b="$h" 'BEGIN{printf "%.1f", 100*a/b}') % (goal 30 +- 5)"

if [ "$fails" -ne 0 ]; then
	echo "gpu-check: $fails check(s) FAILED"
	exit 1
fi
echo "gpu-check: all checks passed"
