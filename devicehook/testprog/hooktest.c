/*
 * Test driver for devicehook. It resolves the driver API one of the ways
 * real programs do, then runs one scenario and prints key=value results
 * for the Go tests to check:
 *   direct    link-time symbols (bound by the dynamic linker: LD_PRELOAD)
 *   dlsym     dlopen("libcuda.so.1") + dlsym, as older runtimes do
 *   gpa       dlopen + dlsym("cuGetProcAddress_v2") + look-ups, as the
 *             CUDA 12/13 runtime does (version 12080, default stream)
 *   gpa-ptsz  the same with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
 *   gpa-v1    the legacy cuGetProcAddress (4 arguments), version 11030
 * Usage: hooktest MODE COMMAND [ARGS...]  (see main)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../src/cuda_types.h"

/* Link-time symbols (libcuda.so.1 and libnvidia-ml.so.1 from build/fake). */
#define DECL(ret, name, params) ret name params;
#include "api.def"
#undef DECL

#define DECL(ret, name, params) ret(*p_##name) params;
static struct {
#include "api.def"
} A;
#undef DECL

static uint64_t (*fake_used)(int);
static uint64_t (*fake_calls)(void);
static int (*fake_busy)(int, uint64_t *, uint64_t *, int);
static const char *mode;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what, int rc)
{
	fprintf(stderr, "hooktest: %s failed: %d\n", what, rc);
	exit(3);
}

/* Name a versioned symbol resolves to through cuGetProcAddress. */
static const char *base_of(const char *sym, char *buf, size_t n)
{
	snprintf(buf, n, "%s", sym);
	char *v = strstr(buf, "_v");
	if (v && v[2] >= '2' && v[2] <= '9' && v[3] == '\0')
		*v = '\0';
	return buf;
}

static void resolve(void)
{
	void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	void *nv = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!cu || !nv)
		die("dlopen", 0);
	fake_used = (uint64_t(*)(int))dlsym(cu, "fakecuda_used");
	fake_calls = (uint64_t(*)(void))dlsym(cu, "fakecuda_alloc_calls");
	fake_busy = (int (*)(int, uint64_t *, uint64_t *, int))dlsym(cu, "fakecuda_busy");
	if (!strcmp(mode, "direct")) {
#define DECL(ret, name, params) A.p_##name = name;
#include "api.def"
#undef DECL
		return;
	}
	/* NVML has no cuGetProcAddress: it is always found by dlsym. */
#define DECL(ret, name, params) \
	if (!strncmp(#name, "nvml", 4)) A.p_##name = (ret(*) params)dlsym(nv, #name);
#include "api.def"
#undef DECL
	if (!strcmp(mode, "dlsym")) {
#define DECL(ret, name, params) \
	if (strncmp(#name, "nvml", 4)) A.p_##name = (ret(*) params)dlsym(cu, #name);
#include "api.def"
#undef DECL
		return;
	}
	int ver = 12080;
	cuuint64_t flags = CU_GET_PROC_ADDRESS_DEFAULT;
	CUresult (*gpa2)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) = NULL;
	CUresult (*gpa1)(const char *, void **, int, cuuint64_t) = NULL;
	if (!strcmp(mode, "gpa-v1")) {
		gpa1 = (CUresult(*)(const char *, void **, int, cuuint64_t))dlsym(cu, "cuGetProcAddress");
		ver = 11030;
	} else {
		gpa2 = (CUresult(*)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *))dlsym(
			cu, "cuGetProcAddress_v2");
		if (!strcmp(mode, "gpa-ptsz"))
			flags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
	}
	if (!gpa1 && !gpa2)
		die("dlsym cuGetProcAddress", 0);
	char buf[128];
	void *fn;
	CUdriverProcAddressQueryResult st;
#define DECL(ret, name, params)                                                                    \
	if (strncmp(#name, "nvml", 4)) {                                                           \
		fn = NULL;                                                                         \
		const char *b = base_of(#name, buf, sizeof buf);                                   \
		/* Legacy (v1) ABIs are what an old cudaVersion gets. */                           \
		int v = ver;                                                                       \
		if (!strcmp(#name, "cuMemAlloc") || !strcmp(#name, "cuMemAllocPitch") ||          \
		    !strcmp(#name, "cuArrayCreate") || !strcmp(#name, "cuArray3DCreate") ||       \
		    !strcmp(#name, "cuMemFree") || !strcmp(#name, "cuMemGetInfo") ||              \
		    !strcmp(#name, "cuDeviceTotalMem"))                                            \
			v = 3000;                                                                  \
		if (!strcmp(#name, "cuCtxCreate_v2")) /* _v3 from 11040, _v4 from 12050 */          \
			v = 11000;                                                                 \
		if (gpa2)                                                                          \
			gpa2(b, &fn, v, flags, &st);                                               \
		else                                                                               \
			gpa1(b, &fn, v, flags);                                                    \
		A.p_##name = (ret(*) params)fn;                                                    \
	}
#include "api.def"
#undef DECL
}

/* HOOKTEST_DEVICE=n: the commands that work on device 0 use CUdevice n
 * (and launch measures its busy time there). */
static int ctx_dev;
static void ctx(int dev)
{
	CUcontext c;
	int rc;
	const char *hd = getenv("HOOKTEST_DEVICE");
	if (dev == 0 && hd != NULL)
		dev = atoi(hd);
	ctx_dev = dev;
	if ((rc = A.p_cuInit(0)) != 0)
		die("cuInit", rc);
	if ((rc = A.p_cuDevicePrimaryCtxRetain(&c, dev)) != 0)
		die("cuDevicePrimaryCtxRetain", rc);
	if ((rc = A.p_cuCtxSetCurrent(c)) != 0)
		die("cuCtxSetCurrent", rc);
}

/* ---- allocation families ----------------------------------------------- */

struct fam {
	const char *name;
	CUresult (*alloc)(uint64_t chunk, uint64_t *handle);
	CUresult (*release)(uint64_t handle);
};

static void *pool;
static CUresult a_mem(uint64_t n, uint64_t *h) { CUdeviceptr p; CUresult rc = A.p_cuMemAlloc_v2(&p, n); *h = p; return rc; }
static CUresult f_mem(uint64_t h) { return A.p_cuMemFree_v2(h); }
static CUresult a_mem1(uint64_t n, uint64_t *h) { CUdeviceptr_v1 p; CUresult rc = A.p_cuMemAlloc(&p, (unsigned)n); *h = p; return rc; }
static CUresult f_mem1(uint64_t h) { return A.p_cuMemFree((CUdeviceptr_v1)h); }
static CUresult a_pitch(uint64_t n, uint64_t *h) { CUdeviceptr p; size_t pitch; CUresult rc = A.p_cuMemAllocPitch_v2(&p, &pitch, 1000, n / 1024, 4); *h = p; return rc; }
static CUresult a_pitch1(uint64_t n, uint64_t *h) { CUdeviceptr_v1 p; unsigned pitch; CUresult rc = A.p_cuMemAllocPitch(&p, &pitch, 1000, (unsigned)(n / 1024), 4); *h = p; return rc; }
static CUresult a_managed(uint64_t n, uint64_t *h) { CUdeviceptr p; CUresult rc = A.p_cuMemAllocManaged(&p, n, 1); *h = p; return rc; }
static CUresult a_async(uint64_t n, uint64_t *h) { CUdeviceptr p; CUresult rc = A.p_cuMemAllocAsync(&p, n, NULL); *h = p; return rc; }
static CUresult f_async(uint64_t h) { return A.p_cuMemFreeAsync(h, NULL); }
static CUresult a_pool(uint64_t n, uint64_t *h) { CUdeviceptr p; CUresult rc = A.p_cuMemAllocFromPoolAsync(&p, n, pool, NULL); *h = p; return rc; }
static int vmm_dev;
static CUresult a_vmm(uint64_t n, uint64_t *h)
{
	CUmemAllocationProp prop;
	memset(&prop, 0, sizeof prop);
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = vmm_dev;
	CUmemGenericAllocationHandle g;
	CUresult rc = A.p_cuMemCreate(&g, n, &prop, 0);
	*h = g;
	return rc;
}
static CUresult f_vmm(uint64_t h) { return A.p_cuMemRelease(h); }
static CUresult a_array(uint64_t n, uint64_t *h) { CUarray a; CUDA_ARRAY_DESCRIPTOR d = {1024, n / 4096, CU_AD_FORMAT_FLOAT, 1}; CUresult rc = A.p_cuArrayCreate_v2(&a, &d); *h = (uint64_t)(uintptr_t)a; return rc; }
static CUresult a_array1(uint64_t n, uint64_t *h) { CUarray a; CUDA_ARRAY_DESCRIPTOR_v1 d = {1024, (unsigned)(n / 4096), CU_AD_FORMAT_FLOAT, 1}; CUresult rc = A.p_cuArrayCreate(&a, &d); *h = (uint64_t)(uintptr_t)a; return rc; }
static CUresult a_array3d(uint64_t n, uint64_t *h) { CUarray a; CUDA_ARRAY3D_DESCRIPTOR d = {512, 16, n / (16 * 4096), CU_AD_FORMAT_UNSIGNED_INT16, 4, 0}; CUresult rc = A.p_cuArray3DCreate_v2(&a, &d); *h = (uint64_t)(uintptr_t)a; return rc; }
static CUresult a_array3d1(uint64_t n, uint64_t *h) { CUarray a; CUDA_ARRAY3D_DESCRIPTOR_v1 d = {512, 16, (unsigned)(n / (16 * 4096)), CU_AD_FORMAT_UNSIGNED_INT16, 4, 0}; CUresult rc = A.p_cuArray3DCreate(&a, &d); *h = (uint64_t)(uintptr_t)a; return rc; }
static CUresult f_array(uint64_t h) { return A.p_cuArrayDestroy((CUarray)(uintptr_t)h); }
/* Mipmap: 2 levels of 1024x(n/4096/... ) floats: level 0 is 3/4 of chunk, level 1 a quarter... sized so the total is the chunk. */
static CUresult a_mipmap(uint64_t n, uint64_t *h)
{
	CUmipmappedArray a;
	/* Level 0: 1024 x H floats = 4096*H bytes; level 1: 512 x H/2 floats = 1024*H. Total 5120*H. */
	CUDA_ARRAY3D_DESCRIPTOR d = {1024, n / 5120, 0, CU_AD_FORMAT_FLOAT, 1, 0};
	CUresult rc = A.p_cuMipmappedArrayCreate(&a, &d, 2);
	*h = (uint64_t)(uintptr_t)a;
	return rc;
}
static CUresult f_mipmap(uint64_t h) { return A.p_cuMipmappedArrayDestroy((CUmipmappedArray)(uintptr_t)h); }

static const struct fam fams[] = {
	{"mem", a_mem, f_mem},         {"mem_v1", a_mem1, f_mem1},     {"pitch", a_pitch, f_mem},
	{"pitch_v1", a_pitch1, f_mem1}, {"managed", a_managed, f_mem}, {"async", a_async, f_async},
	{"pool", a_pool, f_async},     {"vmm", a_vmm, f_vmm},          {"array", a_array, f_array},
	{"array_v1", a_array1, f_array}, {"array3d", a_array3d, f_array}, {"array3d_v1", a_array3d1, f_array},
	{"mipmap", a_mipmap, f_mipmap},
};

static const struct fam *find_fam(const char *name)
{
	for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++)
		if (!strcmp(fams[i].name, name))
			return &fams[i];
	fprintf(stderr, "unknown family %s\n", name);
	exit(2);
}

#define MAXH 100000
static uint64_t handles[MAXH];

static int is_pool_family(const struct fam *f) { return !strcmp(f->name, "pool") || !strcmp(f->name, "async"); }

static uint64_t pool_attr(int attr)
{
	cuuint64_t v = 0;
	A.p_cuMemPoolGetAttribute((CUmemoryPool)pool, attr, &v);
	return v;
}

static void setup_family(const struct fam *f, int dev)
{
	ctx(dev);
	if (!strcmp(f->name, "async"))
		A.p_cuDeviceGetMemPool((CUmemoryPool *)&pool, dev);
	vmm_dev = getenv("HOOKTEST_VMM_DEV") ? atoi(getenv("HOOKTEST_VMM_DEV")) : dev;
	if (!strcmp(f->name, "pool")) {
		CUmemPoolProps p;
		memset(&p, 0, sizeof p);
		p.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
		p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		p.location.id = getenv("HOOKTEST_POOL_DEV") ? atoi(getenv("HOOKTEST_POOL_DEV")) : dev;
		int rc = A.p_cuMemPoolCreate((CUmemoryPool *)&pool, &p);
		if (rc)
			die("cuMemPoolCreate", rc);
	}
}

/* family NAME CHUNK: fill to the limit, be refused, free one, refill, free all. */
static int cmd_family(const char *name, uint64_t chunk)
{
	const struct fam *f = find_fam(name);
	int dev = 0;
	setup_family(f, dev);
	int udev = (!strcmp(name, "vmm")) ? vmm_dev : dev;
	if (!strcmp(name, "pool") && getenv("HOOKTEST_POOL_DEV"))
		udev = atoi(getenv("HOOKTEST_POOL_DEV"));
	uint64_t before = fake_used(udev);
	int n = 0, rc = 0;
	uint64_t unit = 0;
	while (n < MAXH) {
		rc = f->alloc(chunk, &handles[n]);
		if (rc != 0)
			break;
		if (n == 0) /* a pool reserves in big steps: ask it what it handed out */
			unit = is_pool_family(f) ? pool_attr(CU_MEMPOOL_ATTR_USED_MEM_CURRENT) : fake_used(udev) - before;
		n++;
	}
	uint64_t calls = fake_calls();
	int rc2 = f->alloc(chunk, &handles[n]);
	int reached = fake_calls() != calls; /* did the refused request reach the driver? */
	int refree = -1, realloc_rc = -1;
	if (n > 0) {
		refree = f->release(handles[n - 1]);
		realloc_rc = f->alloc(chunk, &handles[n - 1]);
	}
	int freed_bad = 0;
	for (int i = 0; i < n; i++)
		if (f->release(handles[i]) != 0)
			freed_bad++;
	if (is_pool_family(f))
		A.p_cuMemPoolTrimTo((CUmemoryPool)pool, 0); /* give the pool's reserve back */
	size_t fr = 0, tot = 0;
	A.p_cuMemGetInfo_v2(&fr, &tot);
	printf("n=%d err=%d err2=%d reached=%d unit=%llu refree=%d realloc=%d freebad=%d left=%llu free=%zu total=%zu\n",
	       n, rc, rc2, reached, (unsigned long long)unit, refree, realloc_rc, freed_bad,
	       (unsigned long long)(fake_used(udev) - before), fr, tot);
	return 0;
}

/* poolhold CHUNK K: memory a pool keeps after frees still counts, until trimmed. */
static int cmd_poolhold(uint64_t chunk, int k)
{
	ctx(0);
	A.p_cuDeviceGetMemPool((CUmemoryPool *)&pool, 0);
	for (int i = 0; i < k; i++)
		if (A.p_cuMemAllocAsync((CUdeviceptr *)&handles[i], chunk, NULL))
			die("cuMemAllocAsync", i);
	for (int i = 0; i < k; i++)
		A.p_cuMemFreeAsync(handles[i], NULL);
	uint64_t reserved = pool_attr(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
	int n1 = 0, n2 = 0;
	while (n1 < MAXH && a_mem(chunk, &handles[n1]) == 0)
		n1++;
	for (int i = 0; i < n1; i++)
		f_mem(handles[i]);
	A.p_cuMemPoolTrimTo((CUmemoryPool)pool, 0);
	while (n2 < MAXH && a_mem(chunk, &handles[n2]) == 0)
		n2++;
	printf("reserved=%llu before_trim=%d after_trim=%d\n", (unsigned long long)reserved, n1, n2);
	return 0;
}

/* exec CHUNK: hold 8 chunks, then exec `grab` in the same process. */
static int cmd_exec(uint64_t chunk, char *self)
{
	ctx(0);
	for (int i = 0; i < 8; i++)
		if (a_mem(chunk, &handles[i]))
			die("cuMemAlloc_v2", i);
	char n[32];
	snprintf(n, sizeof n, "%llu", (unsigned long long)chunk);
	char *argv[] = {self, (char *)mode, "grab", n, NULL};
	execv(self, argv);
	die("execv", errno);
	return 1;
}

/* fork CHUNK: the parent holds 8 chunks and forks; the child allocates
 * until refused and exits; then the parent does. */
static int cmd_fork(uint64_t chunk)
{
	ctx(0);
	for (int i = 0; i < 8; i++)
		if (a_mem(chunk, &handles[i]))
			die("cuMemAlloc_v2", i);
	fflush(stdout);
	pid_t pid = fork();
	if (pid < 0)
		die("fork", errno);
	if (pid == 0) {
		int n = 0;
		while (n < MAXH && a_mem(chunk, &handles[n]) == 0)
			n++;
		printf("child=%d\n", n);
		exit(0);
	}
	int st;
	waitpid(pid, &st, 0);
	int n = 8;
	while (n < MAXH && a_mem(chunk, &handles[n]) == 0)
		n++;
	printf("parent_extra=%d child_status=%d\n", n - 8, st);
	return 0;
}

/* threads N ITERS CHUNK: N threads allocate and free concurrently near the
 * limit; the driver must never hold more than the limit, and everything
 * must be uncharged at the end. */
static uint64_t th_chunk;
static long th_iters;
static _Atomic uint64_t th_max_seen, th_refused;
static CUcontext th_ctx;

static void *th_main(void *arg)
{
	(void)arg;
	A.p_cuCtxSetCurrent(th_ctx);
	CUdeviceptr held[8];
	for (long i = 0; i < th_iters; i++) {
		int n = 0;
		for (int k = 0; k < 8; k++) {
			if (A.p_cuMemAlloc_v2(&held[n], th_chunk) == 0)
				n++;
			else
				atomic_fetch_add(&th_refused, 1);
			uint64_t u = fake_used(0), m = atomic_load(&th_max_seen);
			while (u > m && !atomic_compare_exchange_weak(&th_max_seen, &m, u))
				;
		}
		while (n > 0)
			A.p_cuMemFree_v2(held[--n]);
	}
	return NULL;
}

static int cmd_threads(int n, long iters, uint64_t chunk)
{
	ctx(0);
	A.p_cuDevicePrimaryCtxRetain(&th_ctx, 0);
	th_chunk = chunk;
	th_iters = iters;
	pthread_t t[64];
	if (n > 64)
		n = 64;
	for (int i = 0; i < n; i++)
		pthread_create(&t[i], NULL, th_main, NULL);
	for (int i = 0; i < n; i++)
		pthread_join(t[i], NULL);
	size_t fr = 0, tot = 0;
	A.p_cuMemGetInfo_v2(&fr, &tot);
	printf("max_used=%llu refused=%llu free=%zu total=%zu left=%llu\n", (unsigned long long)atomic_load(&th_max_seen),
	       (unsigned long long)atomic_load(&th_refused), fr, tot, (unsigned long long)fake_used(0));
	return 0;
}

/* ctxgone CHUNK: blocks left in a destroyed context, or in a reset primary
 * context, are freed with it and must stop counting. */
/* wrap CHUNK MS: hold one chunk, then for MS ms two threads ask for
 * 2^64 - (what the container holds) while a third grabs chunks and keeps
 * them. A wrapping add-then-check lets the third pass the limit. */
static _Atomic int wr_stop;
static _Atomic uint64_t wr_held;

static void *wr_huge(void *arg)
{
	(void)arg;
	A.p_cuCtxSetCurrent(th_ctx);
	CUdeviceptr p;
	while (!atomic_load(&wr_stop)) {
		uint64_t h = atomic_load(&wr_held);
		if (A.p_cuMemAlloc_v2(&p, (size_t)(0 - h)) == 0)
			A.p_cuMemFree_v2(p);
	}
	return NULL;
}

static int cmd_wrap(uint64_t chunk, long ms)
{
	ctx(0);
	A.p_cuDevicePrimaryCtxRetain(&th_ctx, 0);
	CUdeviceptr p;
	if (A.p_cuMemAlloc_v2(&p, chunk) != 0)
		die("first chunk", 0);
	atomic_store(&wr_held, chunk);
	pthread_t t[2];
	for (int i = 0; i < 2; i++)
		pthread_create(&t[i], NULL, wr_huge, NULL);
	uint64_t end = now_ns() + (uint64_t)ms * 1000000ull, max = 0;
	while (now_ns() < end) {
		if (A.p_cuMemAlloc_v2(&p, chunk) == 0)
			atomic_fetch_add(&wr_held, chunk);
		uint64_t u = fake_used(0);
		if (u > max)
			max = u;
	}
	atomic_store(&wr_stop, 1);
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	printf("held=%llu max_used=%llu\n", (unsigned long long)atomic_load(&wr_held), (unsigned long long)max);
	return 0;
}

/* pooldead CHUNK: a pool with one live block is destroyed; fill with
 * cuMemAlloc_v2 until refused (the hook must not ask the driver about the
 * dead pool), free the pool's block, fill again. */
static int cmd_pooldead(uint64_t chunk)
{
	ctx(0);
	CUmemPoolProps pp;
	memset(&pp, 0, sizeof pp);
	pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	pp.location.id = 0;
	CUmemoryPool pl;
	CUdeviceptr b;
	if (A.p_cuMemPoolCreate(&pl, &pp) || A.p_cuMemAllocFromPoolAsync(&b, chunk, pl, NULL))
		die("pool", 0);
	A.p_cuMemPoolDestroy(pl);
	int n1 = 0, n2 = 0;
	while (n1 < MAXH && a_mem(chunk, &handles[n1]) == 0)
		n1++;
	int left = n1;
	while (left > 0)
		A.p_cuMemFree_v2(handles[--left]);
	A.p_cuMemFreeAsync(b, NULL);
	while (n2 < MAXH && a_mem(chunk, &handles[n2]) == 0)
		n2++;
	printf("with_dead_pool=%d after_free=%d\n", n1, n2);
	return 0;
}

/* ctxlimit CHUNK: grow the malloc heap to 32 MiB (from 8), then fill;
 * try a 2 KiB stack (264 MiB of device memory on the fake's H100 shape);
 * shrink the heap back and fill again. */
static int cmd_ctxlimit(uint64_t chunk)
{
	ctx(0);
	int heap = A.p_cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 32 << 20);
	int n1 = 0, n2 = 0;
	while (n1 < MAXH && a_mem(chunk, &handles[n1]) == 0)
		n1++;
	for (int i = n1; i > 0;)
		A.p_cuMemFree_v2(handles[--i]);
	int stack = A.p_cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 2048);
	A.p_cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 8 << 20);
	while (n2 < MAXH && a_mem(chunk, &handles[n2]) == 0)
		n2++;
	for (int i = n2; i > 0;)
		A.p_cuMemFree_v2(handles[--i]);
	/* The device runtime's limits (issue 15 M5): growth refused under a
	 * limit, shrinking passes; what the growth took on the device (MiB). */
	uint64_t u0 = fake_used(0);
	int pend = A.p_cuCtxSetLimit(CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT, 1 << 16);
	int sync = A.p_cuCtxSetLimit(CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH, 8);
	int64_t grew = (int64_t)fake_used(0) - (int64_t)u0;
	int same = A.p_cuCtxSetLimit(CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH, 2);
	int shrink = A.p_cuCtxSetLimit(CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT, 1024);
	printf("heap_rc=%d with_heap=%d stack_rc=%d after_shrink=%d pending_rc=%d sync_rc=%d same_rc=%d "
	       "shrink_rc=%d devrt_grew_mib=%lld\n", heap, n1, stack, n2, pend, sync, same, shrink,
	       (long long)(grew / (1 << 20)));
	return 0;
}

/* poolsync CHUNK: 3 blocks from the default pool, freed, then a context
 * synchronisation (the driver releases the pool's memory): what does the
 * container see as free? */
static int cmd_poolsync(uint64_t chunk)
{
	ctx(0);
	for (int i = 0; i < 3; i++)
		if (A.p_cuMemAllocAsync((CUdeviceptr *)&handles[i], chunk, NULL))
			die("cuMemAllocAsync", i);
	for (int i = 0; i < 3; i++)
		A.p_cuMemFreeAsync(handles[i], NULL);
	A.p_cuCtxSynchronize();
	size_t fr = 0, tot = 0;
	A.p_cuMemGetInfo_v2(&fr, &tot);
	printf("free=%zu total=%zu\n", fr, tot);
	return 0;
}

/* hostpool CHUNK: a pool located on the host: 32 chunks from it, then
 * how many device chunks still fit. */
static int cmd_hostpool(uint64_t chunk)
{
	ctx(0);
	CUmemPoolProps pp;
	memset(&pp, 0, sizeof pp);
	pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	pp.location.type = CU_MEM_LOCATION_TYPE_HOST;
	CUmemoryPool pl;
	if (A.p_cuMemPoolCreate(&pl, &pp))
		die("cuMemPoolCreate (host)", 0);
	int nh = 0, nd = 0;
	CUdeviceptr b[32];
	while (nh < 32 && A.p_cuMemAllocFromPoolAsync(&b[nh], chunk, pl, NULL) == 0)
		nh++;
	while (nd < MAXH && a_mem(chunk, &handles[nd]) == 0)
		nd++;
	printf("host=%d dev=%d\n", nh, nd);
	return 0;
}

/* gpanewer: cuGetProcAddress_v2("cuMemGetInfo", 13020), where the fake
 * driver answers with cuMemGetInfo_v3, an ABI the hook does not know: the
 * pointer must come back untouched (and work with its own ABI). */
static int cmd_gpanewer(void)
{
	ctx(0);
	void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	CUresult (*gpa2)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) =
		(CUresult(*)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *))dlsym(
			cu, "cuGetProcAddress_v2");
	void *v3 = NULL, *v2 = NULL;
	CUdriverProcAddressQueryResult st;
	gpa2("cuMemGetInfo", &v3, 13020, CU_GET_PROC_ADDRESS_DEFAULT, &st);
	gpa2("cuMemGetInfo", &v2, 12080, CU_GET_PROC_ADDRESS_DEFAULT, &st);
	size_t f = 0, t = 0;
	CUresult rc = ((CUresult(*)(size_t *, size_t *, unsigned))v3)(&f, &t, 0);
	/* dlsym on the driver: not a name the hook wraps, so the driver's own. */
	printf("v3_untouched=%d v3_rc=%d v3_total=%zu v2_found=%d\n", v3 == dlsym(cu, "cuMemGetInfo_v3"), (int)rc, t,
	       v2 != NULL);
	/* An allocation ABI the hook does not know (cuMemAlloc_v3 from
	 * 13020): refused under a memory limit, untouched without one. */
	void *a3 = (void *)1;
	CUresult arc = gpa2("cuMemAlloc", &a3, 13020, CU_GET_PROC_ADDRESS_DEFAULT, &st);
	CUdeviceptr p = 0;
	CUresult prc = a3 ? ((CUresult(*)(CUdeviceptr *, size_t, unsigned))a3)(&p, 1 << 20, 0) : (CUresult)-1;
	printf("alloc3_gpa_rc=%d alloc3_status=%d alloc3_null=%d alloc3_untouched=%d alloc3_rc=%d\n", (int)arc,
	       (int)st, a3 == NULL, a3 != NULL && a3 == dlsym(cu, "cuMemAlloc_v3"), (int)prc);
	/* A legacy launch ABI the hook does not know (cuLaunchGrid_v2 from
	 * 13020): refused under an SM limit, untouched without one. */
	void *g2 = (void *)1;
	CUresult grc = gpa2("cuLaunchGrid", &g2, 13020, CU_GET_PROC_ADDRESS_DEFAULT, &st);
	printf("grid2_gpa_rc=%d grid2_status=%d grid2_null=%d grid2_untouched=%d\n", (int)grc, (int)st, g2 == NULL,
	       g2 != NULL && g2 == dlsym(cu, "cuLaunchGrid_v2"));
	return 0;
}

/* freeasync CHUNK MS: a block of the default pool freed in stream order
 * on s1 behind MS ms of queued work, then the same size asked on another
 * stream s2 (the free has not run: the driver would grow the pool), on s1
 * (stream order: the driver reuses the block), and on s2 again once s1 is
 * synchronised. other/same/after: each answer; reached: whether the s2
 * request reached the driver; max_used: the most the device held. */
static int cmd_freeasync(uint64_t chunk, long ms)
{
	ctx(0);
	CUstream s1, s2;
	if (A.p_cuStreamCreate(&s1, 0) || A.p_cuStreamCreate(&s2, 0))
		die("cuStreamCreate", 0);
	CUmodule m;
	CUfunction f;
	A.p_cuModuleLoadData(&m, "");
	A.p_cuModuleGetFunction(&f, m, "k1000000"); /* 1 ms per block */
	CUdeviceptr a, b, c, d;
	if (A.p_cuMemAllocAsync(&a, chunk, s1))
		die("cuMemAllocAsync", 0);
	uint64_t max = fake_used(0);
#define SEEN() do { if (fake_used(0) > max) max = fake_used(0); } while (0)
	if (A.p_cuLaunchKernel(f, (unsigned)ms, 1, 1, 1, 1, 1, 0, s1, NULL, NULL))
		die("cuLaunchKernel", 0);
	if (A.p_cuMemFreeAsync(a, s1))
		die("cuMemFreeAsync", 0);
	uint64_t calls = fake_calls();
	int other = A.p_cuMemAllocAsync(&b, chunk, s2);
	int reached = fake_calls() != calls;
	SEEN();
	if (other == 0)
		A.p_cuMemFreeAsync(b, s2);
	int same = A.p_cuMemAllocAsync(&c, chunk, s1);
	SEEN();
	if (same == 0)
		A.p_cuMemFreeAsync(c, s1);
	A.p_cuStreamSynchronize(s1);
	int after = A.p_cuMemAllocAsync(&d, chunk, s2);
	SEEN();
#undef SEEN
	printf("other=%d reached=%d same=%d after=%d max_used=%llu\n", other, reached, same, after,
	       (unsigned long long)max);
	return 0;
}

/* streamdev CHUNK: a stream made in a context on device 1, used with
 * device 0's context current: cuMemAllocAsync on it until refused. */
static int cmd_streamdev(uint64_t chunk)
{
	A.p_cuInit(0);
	CUcontext c1;
	CUstream s;
	if (A.p_cuCtxCreate_v2(&c1, 0, 1) || A.p_cuStreamCreate(&s, 0))
		die("context and stream on device 1", 0);
	ctx(0);
	int n = 0;
	CUdeviceptr p;
	while (n < MAXH && A.p_cuMemAllocAsync(&p, chunk, s) == 0)
		handles[n++] = p;
	printf("n=%d used0=%llu used1=%llu\n", n, (unsigned long long)fake_used(0), (unsigned long long)fake_used(1));
	return 0;
}

static int cmd_ctxgone(uint64_t chunk)
{
	A.p_cuInit(0);
	CUcontext c;
	if (A.p_cuCtxCreate_v2(&c, 0, 0))
		die("cuCtxCreate_v2", 0);
	for (int i = 0; i < 8; i++)
		if (a_mem(chunk, &handles[i]))
			die("alloc in context", i);
	A.p_cuCtxDestroy_v2(c);
	ctx(0);
	int n1 = 0, n2 = 0;
	while (n1 < MAXH && a_mem(chunk, &handles[n1]) == 0)
		n1++;
	A.p_cuDevicePrimaryCtxReset_v2(0);
	while (n2 < MAXH && a_mem(chunk, &handles[n2]) == 0)
		n2++;
	printf("after_destroy=%d after_reset=%d\n", n1, n2);
	return 0;
}

/* ctxloop MAX CHUNK: retain the primary context (primary_rc), create up
 * to MAX more contexts until refused (created, create_rc: the refusal),
 * then allocate CHUNK bytes until refused in the last one (n). */
static int cmd_ctxloop(int max, uint64_t chunk)
{
	A.p_cuInit(0);
	CUcontext c, primary = NULL;
	int primary_rc = A.p_cuDevicePrimaryCtxRetain(&primary, 0), created = 0, create_rc = 0;
	while (created < max && (create_rc = A.p_cuCtxCreate_v2(&c, 0, 0)) == 0)
		created++;
	if (primary_rc == 0)
		A.p_cuCtxSetCurrent(primary);
	int n = 0;
	while (n < MAXH && a_mem(chunk, &handles[n]) == 0)
		n++;
	printf("primary_rc=%d created=%d create_rc=%d n=%d\n", primary_rc, created, create_rc, n);
	return 0;
}

/* vmmmap CHUNK: a VMM handle released while mapped (as NCCL does) keeps
 * its memory, and its charge, until unmapped. */
static int cmd_vmmmap(uint64_t chunk)
{
	ctx(0);
	vmm_dev = 0;
	uint64_t h;
	if (a_vmm(8 * chunk, &h))
		die("cuMemCreate", 0);
	const CUdeviceptr va = 0x700000000000ull;
	if (A.p_cuMemMap(va, 8 * chunk, 0, h, 0) || A.p_cuMemRelease(h))
		die("cuMemMap/cuMemRelease", 0);
	int n1 = 0, n2 = 0;
	while (n1 < MAXH && a_mem(chunk, &handles[n1]) == 0)
		n1++;
	for (int i = 0; i < n1; i++)
		f_mem(handles[i]);
	A.p_cuMemUnmap(va, 8 * chunk);
	while (n2 < MAXH && a_mem(chunk, &handles[n2]) == 0)
		n2++;
	printf("mapped=%d unmapped=%d\n", n1, n2);
	return 0;
}

/* query ALLOC: virtualised memory figures after allocating ALLOC bytes. */
static int cmd_query(uint64_t alloc)
{
	ctx(0);
	CUdeviceptr p = 0;
	if (alloc) {
		int rc = A.p_cuMemAlloc_v2(&p, alloc);
		if (rc)
			die("cuMemAlloc_v2", rc);
	}
	size_t fr = 0, tot = 0, dtot = 0;
	unsigned fr1 = 0, tot1 = 0, dtot1 = 0;
	A.p_cuMemGetInfo_v2(&fr, &tot);
	A.p_cuMemGetInfo(&fr1, &tot1);
	A.p_cuDeviceTotalMem_v2(&dtot, 0);
	A.p_cuDeviceTotalMem(&dtot1, 0);
	A.p_nvmlInit_v2();
	nvmlDevice_t d;
	/* HOOKTEST_NVML_DEVICE=n: NVML's device n (NVML numbers GPUs in PCI
	 * order, whatever CUDA_VISIBLE_DEVICES says). */
	const char *nd = getenv("HOOKTEST_NVML_DEVICE");
	A.p_nvmlDeviceGetHandleByIndex_v2(nd ? (unsigned)atoi(nd) : 0, &d);
	nvmlMemory_t m1;
	nvmlMemory_v2_t m2;
	memset(&m2, 0, sizeof m2);
	A.p_nvmlDeviceGetMemoryInfo(d, &m1);
	A.p_nvmlDeviceGetMemoryInfo_v2(d, &m2);
	printf("free=%zu total=%zu free_v1=%u total_v1=%u devtotal=%zu devtotal_v1=%u "
	       "nvml_total=%llu nvml_free=%llu nvml_used=%llu nvml2_total=%llu nvml2_free=%llu nvml2_used=%llu nvml2_reserved=%llu\n",
	       fr, tot, fr1, tot1, dtot, dtot1, m1.total, m1.free, m1.used, m2.total, m2.free, m2.used, m2.reserved);
	return 0;
}

/* hold CHUNK: allocate until refused, report, wait for stdin EOF, exit. */
static int hold_max = MAXH; /* hold CHUNK [N]: at most N chunks */

static int cmd_hold(uint64_t chunk)
{
	ctx(0);
	int n = 0;
	CUdeviceptr p;
	while (n < hold_max && A.p_cuMemAlloc_v2(&p, chunk) == 0)
		handles[n++] = p;
	printf("held=%d\n", n);
	fflush(stdout);
	char c;
	while (read(0, &c, 1) > 0)
		;
	return 0;
}

/* churn CHUNK: fill to the limit and empty, forever (to be SIGKILLed). */
static int cmd_churn(uint64_t chunk)
{
	ctx(0);
	printf("ready\n");
	fflush(stdout);
	for (;;) {
		int n = 0;
		CUdeviceptr p;
		while (n < MAXH && A.p_cuMemAlloc_v2(&p, chunk) == 0)
			handles[n++] = p;
		while (n > 0)
			A.p_cuMemFree_v2(handles[--n]);
	}
	return 0;
}

/* grab CHUNK: how many chunks fit now, and how long the first took. */
static int cmd_grab(uint64_t chunk)
{
	ctx(0);
	int n = 0;
	CUdeviceptr p;
	uint64_t t0 = now_ns(), first = 0;
	while (n < MAXH && A.p_cuMemAlloc_v2(&p, chunk) == 0) {
		if (n == 0)
			first = now_ns() - t0;
		handles[n++] = p;
	}
	printf("n=%d first_ns=%llu total_ns=%llu\n", n, (unsigned long long)first, (unsigned long long)(now_ns() - t0));
	return 0;
}

static uint64_t my_busy(void)
{
	uint64_t pids[256], busy[256];
	int n = fake_busy(ctx_dev, pids, busy, 256);
	for (int i = 0; i < n; i++)
		if (pids[i] == (uint64_t)getpid())
			return busy[i];
	return 0;
}

/* onekernel KN (review 15): one launch of kernel KN (100 blocks), wait
 * for it, print this process's device time and exit: a tenant that runs
 * every long kernel in a fresh process. */
static int cmd_onekernel(const char *name)
{
	ctx(0);
	CUmodule m;
	CUfunction f;
	A.p_cuModuleLoadData(&m, "");
	A.p_cuModuleGetFunction(&f, m, name);
	int rc = A.p_cuLaunchKernel(f, 100, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
	if (rc)
		die("launch", rc);
	/* HOOKTEST_SIGKILL_AFTER_MS=t: print the device time booked, hold the
	 * device t ms, then SIGKILL itself (no destructor runs: the hook's
	 * own settling at exit is skipped). */
	const char *k = getenv("HOOKTEST_SIGKILL_AFTER_MS");
	if (k != NULL) {
		printf("busy_ns=%llu\n", (unsigned long long)my_busy());
		fflush(stdout);
		struct timespec ts = {0, 0};
		ts.tv_sec = (time_t)(strtoull(k, NULL, 10) / 1000);
		ts.tv_nsec = (long)(strtoull(k, NULL, 10) % 1000 * 1000000);
		nanosleep(&ts, NULL);
		kill(getpid(), SIGKILL);
	}
	A.p_cuCtxSynchronize();
	printf("busy_ns=%llu\n", (unsigned long long)my_busy());
	return 0;
}

/* twoctx SECS (review 15): thread 1 launches empty kernels in the primary
 * context, thread 2 300 ms kernels in a second context of the same device,
 * for SECS; prints this process's share of the device. */
static CUcontext twoctx_b;
static uint64_t twoctx_end;
static long twoctx_heavy_n;
static void *twoctx_heavy(void *arg)
{
	(void)arg;
	A.p_cuCtxSetCurrent(twoctx_b);
	CUmodule m;
	CUfunction f;
	A.p_cuModuleLoadData(&m, "");
	A.p_cuModuleGetFunction(&f, m, "k3000000");
	while (now_ns() < twoctx_end)
		if (A.p_cuLaunchKernel(f, 100, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL))
			die("launch heavy", 1);
		else
			twoctx_heavy_n++;
	return NULL;
}
static int cmd_twoctx(double secs)
{
	ctx(0);
	CUcontext a;
	A.p_cuCtxGetCurrent(&a);
	if (A.p_cuCtxCreate_v2(&twoctx_b, 0, 0))
		die("cuCtxCreate_v2", 1);
	A.p_cuCtxSetCurrent(a);
	CUmodule m;
	CUfunction f;
	A.p_cuModuleLoadData(&m, "");
	A.p_cuModuleGetFunction(&f, m, "k0"); /* empty: on a GPU it runs at once in its context's time slice */
	uint64_t t0 = now_ns(), b0 = my_busy();
	twoctx_end = t0 + (uint64_t)(secs * 1e9);
	pthread_t t;
	pthread_create(&t, NULL, twoctx_heavy, NULL);
	while (now_ns() < twoctx_end)
		if (A.p_cuLaunchKernel(f, 100, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL))
			die("launch", 1);
	pthread_join(t, NULL);
	/* Count every kernel to its end: wait for both contexts' work. */
	A.p_cuCtxSetCurrent(twoctx_b);
	A.p_cuCtxSynchronize();
	A.p_cuCtxSetCurrent(a);
	A.p_cuCtxSynchronize();
	uint64_t t1 = now_ns();
	printf("util=%.2f heavy=%ld\n", 100.0 * (double)(my_busy() - b0) / (double)(t1 - t0), twoctx_heavy_n);
	return 0;
}

/* launch API SECONDS WARMUP: launch 100-block kernels of 1 us/block. */
static int cmd_launch(const char *api, double secs, double warm)
{
	ctx(0);
	CUmodule m;
	CUfunction f;
	A.p_cuModuleLoadData(&m, "");
	A.p_cuModuleGetFunction(&f, m, "k1000");
	CUgraph g;
	CUgraphExec ge;
	A.p_cuGraphCreate(&g, 0);
	A.p_cuGraphInstantiateWithFlags(&ge, g, 0);
	CUlaunchConfig cfg = {100, 1, 1, 128, 1, 1, 0, NULL, NULL, 0};
	/* HOOKTEST_HEAVY_AFTER_MS: from then on, kernels that take 3x the
	 * device time for the same grid (the limiter must learn it again). */
	CUfunction heavy;
	A.p_cuModuleGetFunction(&heavy, m, "k3000");
	const char *ha = getenv("HOOKTEST_HEAVY_AFTER_MS");
	uint64_t t0 = now_ns(), tw = t0 + (uint64_t)(warm * 1e9), te = t0 + (uint64_t)(secs * 1e9);
	uint64_t th = ha ? t0 + strtoull(ha, NULL, 10) * 1000000ull : UINT64_MAX;
	/* A launch mix (issue 15 H1/H2, the tenant who games the limiter):
	 * HOOKTEST_FIRST="kN:ms" runs kernel kN for the first ms, then
	 * HOOKTEST_CYCLE="kA:ms,kB:ms,..." repeats (kN: N ns per block, 100
	 * blocks a launch, so k10 is a 1 us kernel and k3000000 a 300 ms one). */
	struct { CUfunction f; uint64_t ns; } ph[9];
	int nph = 0;
	int has_first = 0;
	char spec[256];
	snprintf(spec, sizeof spec, "%s%s%s", getenv("HOOKTEST_FIRST") ? getenv("HOOKTEST_FIRST") : "",
		 getenv("HOOKTEST_FIRST") && getenv("HOOKTEST_CYCLE") ? "," : "",
		 getenv("HOOKTEST_CYCLE") ? getenv("HOOKTEST_CYCLE") : "");
	has_first = getenv("HOOKTEST_FIRST") != NULL;
	for (char *save = NULL, *tok = strtok_r(spec, ",", &save); tok && nph < 9; tok = strtok_r(NULL, ",", &save)) {
		char *colon = strchr(tok, ':');
		if (colon == NULL)
			die("HOOKTEST_FIRST/HOOKTEST_CYCLE entry without ':'", 1);
		*colon = 0;
		A.p_cuModuleGetFunction(&ph[nph].f, m, tok);
		ph[nph++].ns = strtoull(colon + 1, NULL, 10) * 1000000ull;
	}
	/* HOOKTEST_GAP_US: a pause after every launch (a light user: a
	 * server between requests); HOOKTEST_FIRST_GAP_US: only during
	 * HOOKTEST_FIRST's phase (a light start, then full demand). */
	const char *gv = getenv("HOOKTEST_GAP_US"), *fgv = getenv("HOOKTEST_FIRST_GAP_US");
	uint64_t gap_ns = gv ? strtoull(gv, NULL, 10) * 1000ull : 0, first_gap_ns = fgv ? strtoull(fgv, NULL, 10) * 1000ull : 0;
	int cyc0 = has_first ? 1 : 0; /* the first phase that repeats */
	uint64_t cyc_ns = 0;
	for (int i = cyc0; i < nph; i++)
		cyc_ns += ph[i].ns;
	uint64_t bw = 0, tws = 0;
	int marked = 0;
	long n = 0;
	for (;;) {
		uint64_t t = now_ns();
		if (!marked && t >= tw) {
			bw = my_busy();
			tws = t;
			marked = 1;
		}
		if (t >= te)
			break;
		if (t >= th)
			f = heavy;
		CUfunction fl = f;
		if (nph > 0) {
			uint64_t e = t - t0;
			if (has_first && e < ph[0].ns)
				fl = ph[0].f;
			else if (cyc_ns > 0) {
				e = (e - (has_first ? ph[0].ns : 0)) % cyc_ns;
				for (int i = cyc0; i < nph; e -= ph[i].ns, i++)
					if (e < ph[i].ns) {
						fl = ph[i].f;
						break;
					}
			}
		}
		int rc;
		if (!strcmp(api, "kernel"))
			rc = A.p_cuLaunchKernel(fl, 100, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
		else if (!strcmp(api, "ex"))
			rc = A.p_cuLaunchKernelEx(&cfg, fl, NULL, NULL);
		else if (!strcmp(api, "grid")) /* review 15: the legacy launch API */
			rc = A.p_cuFuncSetBlockShape(fl, 128, 1, 1) ?: A.p_cuLaunchGridAsync(fl, 100, 1, NULL);
		else if (!strcmp(api, "coop"))
			rc = A.p_cuLaunchCooperativeKernel(fl, 100, 1, 1, 128, 1, 1, 0, NULL, NULL);
		else
			rc = A.p_cuGraphLaunch(ge, NULL);
		if (rc)
			die("launch", rc);
		n++;
		uint64_t g = has_first && t - t0 < ph[0].ns && first_gap_ns ? first_gap_ns : gap_ns;
		if (g) {
			struct timespec ts = {(time_t)(g / 1000000000ull), (long)(g % 1000000000ull)};
			nanosleep(&ts, NULL);
		}
	}
	uint64_t t1 = now_ns();
	double util = 100.0 * (double)(my_busy() - bw) / (double)(t1 - tws);
	printf("util=%.2f launches=%ld\n", util, n);
	return 0;
}

/* bench-alloc ITERS SIZE / bench-launch ITERS: ns per operation. */
static int cmd_bench_alloc(long iters, uint64_t size)
{
	ctx(0);
	CUdeviceptr p;
	for (int i = 0; i < 1000; i++) { A.p_cuMemAlloc_v2(&p, size); A.p_cuMemFree_v2(p); }
	uint64_t t0 = now_ns();
	for (long i = 0; i < iters; i++) {
		if (A.p_cuMemAlloc_v2(&p, size))
			die("alloc", 0);
		A.p_cuMemFree_v2(p);
	}
	printf("ns_per_op=%.1f\n", (double)(now_ns() - t0) / (double)iters);
	return 0;
}

static int cmd_bench_launch(long iters)
{
	ctx(0);
	CUmodule m;
	CUfunction f;
	A.p_cuModuleLoadData(&m, "");
	A.p_cuModuleGetFunction(&f, m, "k0");
	uint64_t t0 = now_ns();
	for (long i = 0; i < iters; i++)
		A.p_cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
	printf("ns_per_op=%.1f\n", (double)(now_ns() - t0) / (double)iters);
	return 0;
}

/* init-time: the first driver calls of a process, hook initialisation included. */
static uint64_t cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Wall time, and CPU time (immune to preemption on a busy machine). */
static int cmd_init_time(void)
{
	uint64_t t0 = now_ns(), c0 = cpu_ns();
	ctx(0);
	CUdeviceptr p;
	A.p_cuMemAlloc_v2(&p, 4096);
	A.p_cuMemFree_v2(p);
	uint64_t c1 = cpu_ns(), t1 = now_ns();
	printf("init_ns=%llu init_cpu_ns=%llu\n", (unsigned long long)(t1 - t0), (unsigned long long)(c1 - c0));
	return 0;
}

/* rtld-next: dlsym(RTLD_NEXT) from the program must be relative to the program. */
static int cmd_rtld_next(void)
{
	void *next = dlsym(RTLD_NEXT, "cuMemAlloc_v2");
	void *def = dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
	void *direct = (void *)cuMemAlloc_v2;
	printf("next_is_default=%d default_is_direct=%d\n", next == def && next != NULL, def == direct);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: hooktest MODE COMMAND [ARGS]\n");
		return 2;
	}
	mode = argv[1];
	resolve();
	const char *c = argv[2];
	uint64_t a = argc > 3 ? strtoull(argv[3], NULL, 10) : 0;
	if (!strcmp(c, "family") && argc > 4)
		return cmd_family(argv[3], strtoull(argv[4], NULL, 10));
	if (!strcmp(c, "poolhold") && argc > 4)
		return cmd_poolhold(a, atoi(argv[4]));
	if (!strcmp(c, "threads") && argc > 5)
		return cmd_threads(atoi(argv[3]), atol(argv[4]), strtoull(argv[5], NULL, 10));
	if (!strcmp(c, "ctxloop") && argc > 4)
		return cmd_ctxloop(atoi(argv[3]), strtoull(argv[4], NULL, 10));
	if (!strcmp(c, "ctxgone"))
		return cmd_ctxgone(a);
	if (!strcmp(c, "pooldead"))
		return cmd_pooldead(a);
	if (!strcmp(c, "ctxlimit"))
		return cmd_ctxlimit(a);
	if (!strcmp(c, "freeasync") && argc > 4)
		return cmd_freeasync(a, atol(argv[4]));
	if (!strcmp(c, "streamdev"))
		return cmd_streamdev(a);
	if (!strcmp(c, "poolsync"))
		return cmd_poolsync(a);
	if (!strcmp(c, "hostpool"))
		return cmd_hostpool(a);
	if (!strcmp(c, "gpanewer"))
		return cmd_gpanewer();
	if (!strcmp(c, "wrap") && argc > 4)
		return cmd_wrap(a, atol(argv[4]));
	if (!strcmp(c, "vmmmap"))
		return cmd_vmmmap(a);
	if (!strcmp(c, "exec"))
		return cmd_exec(a, argv[0]);
	if (!strcmp(c, "fork"))
		return cmd_fork(a);
	if (!strcmp(c, "query"))
		return cmd_query(a);
	if (!strcmp(c, "hold")) {
		if (argc > 4 && atoi(argv[4]) > 0 && atoi(argv[4]) < MAXH)
			hold_max = atoi(argv[4]);
		return cmd_hold(a);
	}
	if (!strcmp(c, "churn"))
		return cmd_churn(a);
	if (!strcmp(c, "grab"))
		return cmd_grab(a);
	if (!strcmp(c, "twoctx") && argc > 3)
		return cmd_twoctx(atof(argv[3]));
	if (!strcmp(c, "onekernel") && argc > 3)
		return cmd_onekernel(argv[3]);
	if (!strcmp(c, "launch") && argc > 5)
		return cmd_launch(argv[3], atof(argv[4]), atof(argv[5]));
	if (!strcmp(c, "bench-alloc") && argc > 4)
		return cmd_bench_alloc(atol(argv[3]), strtoull(argv[4], NULL, 10));
	if (!strcmp(c, "bench-launch"))
		return cmd_bench_launch((long)a);
	if (!strcmp(c, "init-time"))
		return cmd_init_time();
	if (!strcmp(c, "rtld-next"))
		return cmd_rtld_next();
	fprintf(stderr, "unknown command %s\n", c);
	return 2;
}
