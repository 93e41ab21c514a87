/*
 * The C half of devicehook/gpu-check.sh: driver-API probes for a real GPU.
 * Built with gcc against libcuda.so.1 (no CUDA toolkit, no nvcc): kernels
 * are PTX text loaded with cuModuleLoadData. Prototypes are declared here
 * with the driver's real ABI (types from ../src/cuda_types.h). Each command
 * prints key=value lines for the script to check:
 *
 *   gpucheck info               total/free after the context (cuMemGetInfo)
 *   gpucheck fill CHUNK_MIB     allocate until refused: n, bytes
 *   gpucheck refuse MIB         one cuMemAlloc_v2 of MIB: rc; NVML used before/after
 *   gpucheck vmm MIB            cuMemCreate of MIB on the device: rc
 *   gpucheck async MIB          cuMemAllocAsync of MIB: rc
 *   gpucheck hold CHUNK_MIB MAX_MIB  hold up to MAX_MIB, print held=, wait for stdin EOF
 *   gpucheck busy SECS WARM     launch a busy kernel for SECS, count after WARM: kernels/s
 *   gpucheck bench-alloc N      ns per cuMemAlloc_v2+cuMemFree_v2 (4 KiB)
 *   gpucheck bench-launch N     ns per cuLaunchKernel of an empty kernel
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../src/cuda_types.h"

CUresult cuInit(unsigned int);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
			void **, void **);
nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned, nvmlDevice_t *);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *);

#define MIB (1ull << 20)

/* busy(cycles): every thread spins on %clock64; empty(): returns. PTX ISA
 * 7.0 / sm_70, which every driver since CUDA 11 JIT-compiles for newer
 * GPUs (Hopper included). */
static const char ptx[] =
	".version 7.0\n"
	".target sm_70\n"
	".address_size 64\n"
	".visible .entry busy(.param .u64 cycles)\n"
	"{\n"
	"  .reg .pred p;\n"
	"  .reg .u64 r<4>;\n"
	"  ld.param.u64 r1, [cycles];\n"
	"  mov.u64 r2, %clock64;\n"
	"spin:\n"
	"  mov.u64 r3, %clock64;\n"
	"  sub.u64 r0, r3, r2;\n"
	"  setp.lt.u64 p, r0, r1;\n"
	"  @p bra spin;\n"
	"  ret;\n"
	"}\n"
	".visible .entry empty()\n"
	"{\n"
	"  ret;\n"
	"}\n";

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void check(const char *what, CUresult rc)
{
	if (rc != CUDA_SUCCESS) {
		fprintf(stderr, "gpucheck: %s: CUresult %d\n", what, (int)rc);
		exit(3);
	}
}

static void ctx0(void)
{
	CUdevice d;
	CUcontext c;
	check("cuInit", cuInit(0));
	check("cuDeviceGet", cuDeviceGet(&d, 0));
	check("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(&c, d));
	check("cuCtxSetCurrent", cuCtxSetCurrent(c));
}

static unsigned long long nvml_used(void)
{
	nvmlDevice_t h;
	nvmlMemory_t m;
	if (nvmlInit_v2() != NVML_SUCCESS || nvmlDeviceGetHandleByIndex_v2(0, &h) != NVML_SUCCESS ||
	    nvmlDeviceGetMemoryInfo(h, &m) != NVML_SUCCESS)
		return 0;
	return m.used;
}

#define MAXH 65536
static CUdeviceptr held[MAXH];

static int fill(uint64_t chunk)
{
	int n = 0;
	while (n < MAXH && cuMemAlloc_v2(&held[n], chunk) == CUDA_SUCCESS)
		n++;
	return n;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: gpucheck COMMAND [ARG]\n");
		return 2;
	}
	const char *c = argv[1];
	uint64_t a = argc > 2 ? strtoull(argv[2], NULL, 10) : 0;
	ctx0();
	if (!strcmp(c, "info")) {
		size_t f, t;
		check("cuMemGetInfo_v2", cuMemGetInfo_v2(&f, &t));
		printf("total=%zu free=%zu\n", t, f);
	} else if (!strcmp(c, "fill")) {
		int n = fill(a * MIB);
		printf("n=%d bytes=%llu\n", n, (unsigned long long)n * a * MIB);
	} else if (!strcmp(c, "refuse")) {
		unsigned long long before = nvml_used();
		CUdeviceptr p;
		CUresult rc = cuMemAlloc_v2(&p, a * MIB);
		unsigned long long after = nvml_used();
		if (rc == CUDA_SUCCESS)
			cuMemFree_v2(p);
		printf("rc=%d nvml_before=%llu nvml_after=%llu\n", (int)rc, before, after);
	} else if (!strcmp(c, "vmm")) {
		CUmemAllocationProp prop;
		memset(&prop, 0, sizeof prop);
		prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
		prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		prop.location.id = 0;
		CUmemGenericAllocationHandle h;
		CUresult rc = cuMemCreate(&h, a * MIB, &prop, 0);
		if (rc == CUDA_SUCCESS)
			cuMemRelease(h);
		printf("rc=%d\n", (int)rc);
	} else if (!strcmp(c, "async")) {
		CUdeviceptr p;
		CUresult rc = cuMemAllocAsync(&p, a * MIB, NULL);
		if (rc == CUDA_SUCCESS)
			cuMemFreeAsync(p, NULL);
		cuCtxSynchronize();
		printf("rc=%d\n", (int)rc);
	} else if (!strcmp(c, "hold")) {
		uint64_t max = argc > 3 ? strtoull(argv[3], NULL, 10) : UINT64_MAX / MIB;
		int n = 0;
		while (n < MAXH && (uint64_t)(n + 1) * a <= max && cuMemAlloc_v2(&held[n], a * MIB) == CUDA_SUCCESS)
			n++;
		printf("held=%llu\n", (unsigned long long)n * a * MIB);
		fflush(stdout);
		char buf[64];
		while (fread(buf, 1, sizeof buf, stdin) > 0)
			;
	} else if (!strcmp(c, "busy") || !strcmp(c, "bench-launch")) {
		CUmodule m;
		CUfunction busy, empty;
		check("cuModuleLoadData", cuModuleLoadData(&m, ptx));
		check("cuModuleGetFunction busy", cuModuleGetFunction(&busy, m, "busy"));
		check("cuModuleGetFunction empty", cuModuleGetFunction(&empty, m, "empty"));
		if (!strcmp(c, "busy")) {
			/* ~1 ms kernels over many blocks (every SM busy). */
			unsigned long long cycles = 1500000;
			void *args[] = {&cycles};
			double warm = argc > 3 ? atof(argv[3]) : 0;
			uint64_t t0 = now_ns(), tw = t0 + (uint64_t)(warm * 1e9), end = tw + a * 1000000000ull;
			long k = 0, kw = -1;
			for (uint64_t t; (t = now_ns()) < end;) {
				if (kw < 0 && t >= tw) {
					cuCtxSynchronize(); /* count from here: the limiter has calibrated */
					kw = k;
					tw = now_ns();
				}
				/* No sync: the launch queue fills and launches block,
				 * so the rate is the device's, not the CPU's. */
				check("cuLaunchKernel", cuLaunchKernel(busy, 1024, 1, 1, 128, 1, 1, 0, NULL, args, NULL));
				k++;
			}
			cuCtxSynchronize();
			printf("kernels_per_s=%.2f\n", (double)(k - kw) / ((double)(now_ns() - tw) / 1e9));
		} else {
			long n = (long)a;
			uint64_t t0 = now_ns();
			for (long i = 0; i < n; i++)
				cuLaunchKernel(empty, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
			uint64_t t1 = now_ns();
			cuCtxSynchronize();
			printf("ns_per_launch=%.1f\n", (double)(t1 - t0) / (double)n);
		}
	} else if (!strcmp(c, "bench-alloc")) {
		long n = (long)a;
		CUdeviceptr p;
		uint64_t t0 = now_ns();
		for (long i = 0; i < n; i++) {
			cuMemAlloc_v2(&p, 4096);
			cuMemFree_v2(p);
		}
		printf("ns_per_pair=%.1f\n", (double)(now_ns() - t0) / (double)n);
	} else {
		fprintf(stderr, "gpucheck: unknown command %s\n", c);
		return 2;
	}
	return 0;
}
