/*
 * Symbol dispatch: how every CUDA/NVML entry point an application can reach
 * ends up in our wrapper, and the wrappers themselves.
 *
 * Three roads lead to the driver and all three are covered:
 *  1. Direct linking / LD_PRELOAD / /etc/ld.so.preload: we export every
 *     wrapped symbol (hooks.def); the dynamic linker binds to ours first.
 *  2. dlopen("libcuda.so.1") + dlsym(handle, name): dlsym on a handle
 *     searches that library, not the preload, so we export dlsym too and
 *     substitute our wrapper when the driver's own symbol was found.
 *  3. cuGetProcAddress[_v2] (how the CUDA 12/13 runtime finds nearly
 *     everything): we ask the real driver first, so the caller gets exactly
 *     the ABI for the version and flags it asked for, then hand back a
 *     wrapper *instance* bound to that very pointer. Instances are keyed by
 *     the driver pointer, so legacy and per-thread-stream variants each get
 *     their own, and nothing depends on guessing which one the driver chose.
 * Symbols not in hooks.def pass through untouched on every road.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "state.h"

struct gp_state gp = {
	.once = PTHREAD_ONCE_INIT,
	.nvml_once = PTHREAD_ONCE_INIT,
	.nvml_sym_once = PTHREAD_ONCE_INIT,
	.primary_mu = PTHREAD_MUTEX_INITIALIZER,
	.pools = {.mu = PTHREAD_MUTEX_INITIALIZER},
	.vmm = {.mu = PTHREAD_MUTEX_INITIALIZER},
};

#define UNPAREN(...) __VA_ARGS__
#define GP_INST 3
#define GRAPH_COST 256
enum { LIB_CUDA, LIB_NVML };

struct gp_hook {
	const char *sym;
	const char *gpa_name;
	int min_version;
	int lib;
	void *wrapper;
	_Atomic(void *) exported_real; /* NULL until first use; MISSING if absent */
	void *inst_wrapper[GP_INST];
	_Atomic(void *) inst_real[GP_INST];
};

#define X(sym, impl, gname, minv, lib, P, A) typedef int (*fn_##sym) P;
#include "hooks.def"
#undef X

#define X(sym, ...) IDX_##sym,
enum {
#include "hooks.def"
	IDX_COUNT
};
#undef X

static struct gp_hook hooks[IDX_COUNT];

/* The driver's own symbol behind an exported wrapper, looked up on first
 * use: resolving all of them at init would cost every process ~50 dlsym
 * calls it mostly never needs. */
#define MISSING ((void *)1)
static void *real_of(int i);

#define X(sym, impl, gname, minv, lib, P, A) static int h_##impl(fn_##impl real, UNPAREN P);
#include "hooks.def"
#undef X

static void nvml_load(void);

/* Exported wrappers: bound to the symbol of the same name in the driver. */
#define X(sym, impl, gname, minv, lib, P, A)                                              \
	__attribute__((visibility("default"))) int sym P                                  \
	{                                                                                 \
		gp_init();                                                                \
		if (lib == LIB_NVML)                                                      \
			pthread_once(&gp.nvml_once, nvml_load);                              \
		void *r = atomic_load_explicit(&hooks[IDX_##sym].exported_real, memory_order_acquire); \
		if (__builtin_expect(r == NULL, 0))                                       \
			r = real_of(IDX_##sym);                                           \
		if (r == MISSING)                                                         \
			return lib == LIB_CUDA ? CUDA_ERROR_NOT_FOUND : 13 /* NVML_ERROR_FUNCTION_NOT_FOUND */; \
		return h_##impl((fn_##impl)r, UNPAREN A);                                 \
	}
#include "hooks.def"
#undef X

/* cuGetProcAddress instances: bound to whatever pointer the driver returned. */
#define INST(sym, impl, P, A, i)                                                          \
	static int sym##__i##i P                                                          \
	{                                                                                 \
		return h_##impl((fn_##impl)atomic_load_explicit(&hooks[IDX_##sym].inst_real[i], \
								memory_order_acquire),    \
				UNPAREN A);                                               \
	}
#define X(sym, impl, gname, minv, lib, P, A) INST(sym, impl, P, A, 0) INST(sym, impl, P, A, 1) INST(sym, impl, P, A, 2)
#include "hooks.def"
#undef X

static struct gp_hook hooks[IDX_COUNT] = {
#define X(sym, impl, gname, minv, lib, P, A) \
	[IDX_##sym] = {#sym, gname, minv, lib, (void *)sym, NULL, {(void *)sym##__i0, (void *)sym##__i1, (void *)sym##__i2}, {0}},
#include "hooks.def"
#undef X
};

/* ---- initialisation ---------------------------------------------------- */

extern char **environ;

__attribute__((no_sanitize("address", "undefined"))) static void resolve_real_dlsym(void)
{
	/* glibc >= 2.34 moved dlsym into libc (GLIBC_2.34); before, its only
	 * version is the architecture's base one: GLIBC_2.2.5 on x86_64,
	 * GLIBC_2.17 on aarch64 (without it the hook called a NULL dlsym
	 * there and segfaulted). */
	void *f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
	if (f == NULL)
		f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
	if (f == NULL)
		f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17");
	if (f == NULL)
		gp_log(GP_LOG_ERROR, "cannot find glibc's dlsym (no known symbol version); dlsym look-ups will fail");
	gp.real_dlsym = (void *(*)(void *, const char *))f;
}

static void nvml_load(void)
{
	gp.libnvml = gp.real_dlsym ? dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL) : NULL;
	if (gp.libnvml == NULL)
		return;
	gp.nvml_index = (gp_fn_nvml_index)gp.real_dlsym(gp.libnvml, "nvmlDeviceGetIndex");
	gp.nvml_uuid = (nvmlReturn_t(*)(nvmlDevice_t, char *, unsigned int))gp.real_dlsym(gp.libnvml, "nvmlDeviceGetUUID");
}

static void *real_of(int i)
{
	struct gp_hook *h = &hooks[i];
	void *r = atomic_load_explicit(&h->exported_real, memory_order_acquire);
	if (r != NULL)
		return r;
	void *lib = h->lib == LIB_CUDA ? gp.libcuda : gp.libnvml;
	r = lib ? gp.real_dlsym(lib, h->sym) : NULL;
	if (r == NULL)
		r = MISSING;
	atomic_store_explicit(&h->exported_real, r, memory_order_release);
	return r;
}

static void atfork_child(void)
{
	/* The child owns none of the parent's allocations, contexts or threads. */
	gp_table_clear(&gp.table);
	gp_pool_reset();
	gp_vmm_reset();
	for (int d = 0; d < GP_MAX_DEV; d++) {
		atomic_store(&gp.primary_refs[d], 0);
		atomic_store(&gp.ctx_live[d], 0);
		atomic_store(&gp.ctx_ever[d], 0);
		gp.primary_charge[d] = 0;
	}
	atomic_store(&gp.limiter_started, 0);
	atomic_store(&gp.host_pid, 0); /* the child is another process to NVML */
	atomic_store(&gp.host_pid_tried, 0);
	atomic_store(&gp.host_ncands, 0);
	atomic_store(&gp.host_probes, 0);
	/* Locks another thread held at fork() stay locked in the child. */
	for (int d = 0; d < GP_MAX_DEV; d++)
		pthread_mutex_init(&gp.lim[d].mu, NULL);
	pthread_mutex_init(&gp.primary_mu, NULL);
	if (gp.region.shared) {
		gp.region.slot = -1;
		gp_region_attach(&gp.region);
	} else {
		gp_region_open(&gp.region, NULL);
		gp_region_attach(&gp.region);
	}
}

static void init_once(void)
{
	if (gp.real_dlsym == NULL)
		resolve_real_dlsym();
	/* Where the loader found this library: gpupack-node's read-only
	 * hook folder (its stamp beside us), or the node's hook folder mounted
	 * at its default path, means the limits file must exist. */
	Dl_info self;
	int node = (dladdr((void *)gp_init, &self) != 0 && gp_installed_by_node(self.dli_fname)) ||
		   gp_installed_by_node(GP_NODE_HOOK_LIB);
	gp_config_load(&gp.cfg, environ, GP_LIMITS_PATH, node, 1);
	/* Without glibc's dlsym nothing of the driver can be found: every
	 * wrapped call then answers CUDA_ERROR_NOT_FOUND (fail closed). */
	gp.libcuda = gp.real_dlsym ? dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL) : NULL;
	if (gp.libcuda == NULL)
		gp_log(GP_LOG_WARN, "libcuda.so.1 not found: %s", dlerror());
	else {
		gp.ctx_get_device = (gp_fn_ctxgetdevice)gp.real_dlsym(gp.libcuda, "cuCtxGetDevice");
		gp.ctx_get_current = (gp_fn_ctxgetcurrent)gp.real_dlsym(gp.libcuda, "cuCtxGetCurrent");
		gp.pool_get_attr = (gp_fn_pool_attr)gp.real_dlsym(gp.libcuda, "cuMemPoolGetAttribute");
		gp.dev_get_mempool = (gp_fn_dev_pool)gp.real_dlsym(gp.libcuda, "cuDeviceGetMemPool");
		gp.pool_trim = (gp_fn_pool_trim)gp.real_dlsym(gp.libcuda, "cuMemPoolTrimTo");
		gp.mem_alloc = (CUresult(*)(CUdeviceptr *, size_t))gp.real_dlsym(gp.libcuda, "cuMemAlloc_v2");
		gp.mem_free = (CUresult(*)(CUdeviceptr))gp.real_dlsym(gp.libcuda, "cuMemFree_v2");
		gp.ctx_destroy = (CUresult(*)(CUcontext))gp.real_dlsym(gp.libcuda, "cuCtxDestroy_v2");
		gp.primary_release = (CUresult(*)(CUdevice))gp.real_dlsym(gp.libcuda, "cuDevicePrimaryCtxRelease_v2");
		gp.ctx_get_limit = (CUresult(*)(size_t *, CUlimit))gp.real_dlsym(gp.libcuda, "cuCtxGetLimit");
		gp.dev_get_attr = (CUresult(*)(int *, int, CUdevice))gp.real_dlsym(gp.libcuda, "cuDeviceGetAttribute");
		gp.dev_total_mem = (CUresult(*)(size_t *, CUdevice))gp.real_dlsym(gp.libcuda, "cuDeviceTotalMem_v2");
		gp.ctx_sync = (CUresult(*)(void))gp.real_dlsym(gp.libcuda, "cuCtxSynchronize");
		gp.stream_get_ctx = (CUresult(*)(CUstream, CUcontext *))gp.real_dlsym(gp.libcuda, "cuStreamGetCtx");
		gp.ctx_push = (CUresult(*)(CUcontext))gp.real_dlsym(gp.libcuda, "cuCtxPushCurrent_v2");
		gp.ctx_pop = (CUresult(*)(CUcontext *))gp.real_dlsym(gp.libcuda, "cuCtxPopCurrent_v2");
		/* The driver's own (never through cuGetProcAddress, which a
		 * tenant's code may have reached first): _v2 where the driver
		 * has it (CUDA 11.4+; a MIG instance's own UUID), else v1. */
		gp.dev_get_uuid = (CUresult(*)(CUuuid *, CUdevice))gp.real_dlsym(gp.libcuda, "cuDeviceGetUuid_v2");
		if (gp.dev_get_uuid == NULL)
			gp.dev_get_uuid = (CUresult(*)(CUuuid *, CUdevice))gp.real_dlsym(gp.libcuda, "cuDeviceGetUuid");
	}
	if (gp_table_init(&gp.table, 17) != 0)
		gp_log(GP_LOG_ERROR, "cannot map the allocation table");
	gp.region.sm_limited = gp.cfg.any_sm_limit;
	gp.region.sm_period_ms = gp.cfg.sm_period_ms;
	int ro = gp_region_open(&gp.region, gp.cfg.shared_cache);
	if (ro == -1 || (ro == 0 && gp_region_attach(&gp.region) != 0))
		gp_log(GP_LOG_ERROR, "no accounting region: every GPU memory allocation is refused");
	if (ro != 0 || gp.region.slot < 0)
		/* Fail closed (region_open logged why, once). */
		for (int d = 0; d < GP_MAX_DEV; d++)
			if (gp.cfg.mem_limit[d] != GP_UNLIMITED)
				gp.cfg.mem_limit[d] = 0;
	gp_limiter_setup();
	pthread_atfork(NULL, NULL, atfork_child);
	atomic_store(&gp.ready, 1);
	gp_log(GP_LOG_INFO, "initialised (memory limits %s, SM limits %s, shared cache %s)",
	       gp.cfg.any_mem_limit ? "on" : "off", gp.cfg.any_sm_limit ? "on" : "off",
	       gp.region.shared ? gp.cfg.shared_cache : "none");
}

void gp_init(void)
{
	pthread_once(&gp.once, init_once);
}

__attribute__((constructor)) static void gp_ctor(void)
{
	if (gp.real_dlsym == NULL)
		resolve_real_dlsym();
}

__attribute__((destructor)) static void gp_dtor(void)
{
	atomic_store(&gp.exited, 1);
	if (atomic_load(&gp.ready) && gp.region.r && gp.region.pid == getpid())
		gp_region_detach(&gp.region);
}

/* ---- helpers ------------------------------------------------------------ */

static inline int mem_on(void)
{
	return gp.cfg.any_mem_limit && !gp.cfg.disabled;
}

static inline int cur_dev(void)
{
	CUdevice d;
	if (gp.ctx_get_device && gp.ctx_get_device(&d) == CUDA_SUCCESS)
		return d;
	return -1;
}

/* The device of a stream: that of the context it was created in (issue 15
 * M3: cuMemAllocAsync allocates on the stream's device, whatever context
 * is current). The default streams (NULL, CU_STREAM_LEGACY,
 * CU_STREAM_PER_THREAD) are the current context's. The driver is asked
 * (cuStreamGetCtx, then the context's device with it pushed current for
 * the moment), so nothing depends on our bookkeeping of streams. */
static int stream_dev(CUstream s)
{
	CUcontext c = NULL, now = NULL, popped;
	if ((uintptr_t)s <= 2 || gp.stream_get_ctx == NULL || gp.stream_get_ctx(s, &c) != CUDA_SUCCESS || c == NULL)
		return cur_dev();
	if (gp.ctx_get_current && gp.ctx_get_current(&now) == CUDA_SUCCESS && now == c)
		return cur_dev();
	if (gp.ctx_push == NULL || gp.ctx_pop == NULL || gp.ctx_push(c) != CUDA_SUCCESS)
		return -1; /* cannot tell: refused if the current device is limited */
	int d = cur_dev();
	gp.ctx_pop(&popped);
	return d;
}

/* Stream identity for stream-ordered reuse: the default streams are one. */
static inline uint64_t stream_key(CUstream s)
{
	return (uintptr_t)s <= 2 ? 0 : (uint64_t)(uintptr_t)s;
}

/* After the driver answered an allocation we had charged: keep the charge
 * and remember the handle, or give the charge back. */
static CUresult settle(CUresult rc, uint64_t key, int kind, int dev, uint64_t size)
{
	if (rc == CUDA_SUCCESS)
		gp_track(key, kind, dev, size, 0);
	else
		gp_uncharge(dev, size);
	return rc;
}

static uint64_t pool_reserved(uint64_t pool)
{
	cuuint64_t v;
	if (pool && gp.pool_get_attr &&
	    gp.pool_get_attr((CUmemoryPool)(uintptr_t)pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v) == CUDA_SUCCESS)
		return v;
	return GP_RESERVED_UNKNOWN;
}

/* Pools may have released memory since we last looked (a stream sync
 * trims them): ask the driver before refusing anything. */
static void refresh_pools(int dev)
{
	uint64_t ps[64];
	int n = gp_pool_list(dev, ps, 64);
	for (int i = 0; i < n && i < 64; i++)
		gp_pool_reconcile(ps[i], dev, pool_reserved(ps[i]));
}

static CUresult charge(int dev, uint64_t size)
{
	CUresult rc = gp_charge(dev, size);
	if (rc == CUDA_ERROR_OUT_OF_MEMORY && gp_pool_list(dev, NULL, 0) > 0) {
		refresh_pools(dev);
		rc = gp_charge(dev, size);
	}
	return rc;
}

/* A free: forget the handle first (so a reused handle cannot collide),
 * uncharge only once the driver agreed, otherwise put it back. A block
 * from a pool returns to the pool's slack instead. */
#define FREE_WITH(key, kind, call)                                            \
	do {                                                                  \
		int dev_;                                                     \
		uint64_t size_, pool_, ctx_;                                  \
		int had_ = mem_on() && gp_table_take(&gp.table, (key), (kind), &dev_, &size_, &pool_, &ctx_); \
		CUresult rc_ = (call);                                        \
		if (had_) {                                                   \
			if (rc_ != CUDA_SUCCESS)                              \
				gp_table_put(&gp.table, (key), (kind), dev_, size_, pool_, ctx_); \
			else if (pool_) /* a destroyed pool's handle is dead */ \
				gp_pool_freed(pool_, dev_, size_, gp_pool_dev(pool_) >= 0 ? pool_reserved(pool_) : GP_RESERVED_UNKNOWN); \
			else                                                  \
				gp_uncharge(dev_, size_);                     \
		}                                                             \
		return rc_;                                                   \
	} while (0)

/* What a container sees of limits index idx (dev: a CUdevice of it whose
 * pools to ask, or -1). */
static void virtualize_index(int dev, int idx, uint64_t *freep, uint64_t *totalp)
{
	/* Dead processes' charges are not memory anyone holds: reclaim them
	 * before reporting (before, free read 0 until someone was refused). */
	if (gp.region.shared)
		gp_region_reclaim_dead(&gp.region);
	/* Pools give memory back at synchronisation (release threshold): ask
	 * the driver what they still hold before reporting it as used. */
	if (dev >= 0 && gp_pool_list(dev, NULL, 0) > 0)
		refresh_pools(dev);
	uint64_t lim = idx < 0 ? 0 : gp.cfg.mem_limit[idx];
	uint64_t t = lim < *totalp ? lim : *totalp;
	uint64_t used = gp_index_used(idx);
	uint64_t f = used >= t ? 0 : t - used;
	if (f > *freep)
		f = *freep; /* never report more than is physically free */
	*totalp = t;
	*freep = f;
}

static void virtualize(int dev, uint64_t *freep, uint64_t *totalp)
{
	virtualize_index(dev, gp_dev_index(dev), freep, totalp);
}

/* ---- memory: allocations ------------------------------------------------ */

static int h_cuMemAlloc_v2(fn_cuMemAlloc_v2 real, CUdeviceptr *dptr, size_t size)
{
	int dev;
	if (!mem_on() || !gp_mem_limited(dev = cur_dev()))
		return real(dptr, size);
	CUresult rc = charge(dev, size);
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = real(dptr, size);
	return settle(rc, rc == CUDA_SUCCESS ? *dptr : 0, GP_K_MEM, dev, size);
}

static int h_cuMemAlloc(fn_cuMemAlloc real, CUdeviceptr_v1 *dptr, unsigned int size)
{
	int dev;
	if (!mem_on() || !gp_mem_limited(dev = cur_dev()))
		return real(dptr, size);
	CUresult rc = charge(dev, size);
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = real(dptr, size);
	return settle(rc, rc == CUDA_SUCCESS ? *dptr : 0, GP_K_MEM, dev, size);
}

/* Pitch is chosen by the driver: charge a 512-byte-aligned estimate first
 * (so an over-limit request never reaches the driver), then settle on the
 * real pitch. */
static CUresult pitch_settle(CUresult rc, CUdeviceptr p, uint64_t pitch, uint64_t h, int dev, uint64_t est,
			     CUresult (*undo)(CUdeviceptr))
{
	if (rc != CUDA_SUCCESS) {
		gp_uncharge(dev, est);
		return rc;
	}
	uint64_t actual = pitch * (h ? h : 1);
	if (actual > est && charge(dev, actual - est) != CUDA_SUCCESS) {
		gp_uncharge(dev, est);
		undo(p);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (actual < est)
		gp_uncharge(dev, est - actual);
	gp_track(p, GP_K_MEM, dev, actual, 0);
	return rc;
}

static CUresult undo_free_v2(CUdeviceptr p)
{
	void *f = real_of(IDX_cuMemFree_v2);
	return f != MISSING ? ((fn_cuMemFree_v2)f)(p) : CUDA_ERROR_NOT_FOUND;
}

static CUresult undo_free_v1(CUdeviceptr p)
{
	void *f = real_of(IDX_cuMemFree);
	return f != MISSING ? ((fn_cuMemFree)f)((CUdeviceptr_v1)p) : undo_free_v2(p);
}

static uint64_t pitch_estimate(uint64_t w, uint64_t h)
{
	return gp_array_bytes(w, h, 1, CU_AD_FORMAT_UNSIGNED_INT8, 1);
}

static int h_cuMemAllocPitch_v2(fn_cuMemAllocPitch_v2 real, CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h,
				unsigned int elem)
{
	int dev;
	if (!mem_on() || !gp_mem_limited(dev = cur_dev()))
		return real(dptr, pitch, w, h, elem);
	uint64_t est = pitch_estimate(w, h);
	CUresult rc = charge(dev, est);
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = real(dptr, pitch, w, h, elem);
	return pitch_settle(rc, rc ? 0 : *dptr, rc ? 0 : *pitch, h, dev, est, undo_free_v2);
}

static int h_cuMemAllocPitch(fn_cuMemAllocPitch real, CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int w,
			     unsigned int h, unsigned int elem)
{
	int dev;
	if (!mem_on() || !gp_mem_limited(dev = cur_dev()))
		return real(dptr, pitch, w, h, elem);
	uint64_t est = pitch_estimate(w, h);
	CUresult rc = charge(dev, est);
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = real(dptr, pitch, w, h, elem);
	return pitch_settle(rc, rc ? 0 : *dptr, rc ? 0 : *pitch, h, dev, est, undo_free_v1);
}

static int h_cuMemAllocManaged(fn_cuMemAllocManaged real, CUdeviceptr *dptr, size_t size, unsigned int flags)
{
	/* Managed memory can live on the device; charge the current one. */
	int dev;
	if (!mem_on() || !gp_mem_limited(dev = cur_dev()))
		return real(dptr, size, flags);
	CUresult rc = charge(dev, size);
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = real(dptr, size, flags);
	return settle(rc, rc == CUDA_SUCCESS ? *dptr : 0, GP_K_MEM, dev, size);
}

/* Stream-ordered allocations come from a pool, which may grow by more
 * than the request (and keep memory after frees): charge the request up
 * front, then settle with the pool's reserved size, and refuse (giving the
 * block back) if growth pushed the container over its limit. */
static CUresult pool_alloc_post(CUresult rc, CUdeviceptr *dptr, uint64_t pool, int dev, uint64_t size,
				uint64_t taken, CUstream s)
{
	gp_pool_end(pool, dev, size, taken, rc == CUDA_SUCCESS, pool_reserved(pool));
	if (rc != CUDA_SUCCESS)
		return rc;
	if (gp_used(dev) > gp_mem_limit(dev)) {
		void *f = real_of(IDX_cuMemFreeAsync);
		if (f != MISSING)
			((fn_cuMemFreeAsync)f)(*dptr, s);
		uint64_t keep = gp_pool_live(pool) - size;
		if (gp.pool_trim)
			gp.pool_trim((CUmemoryPool)(uintptr_t)pool, keep);
		gp_pool_freed(pool, dev, size, pool_reserved(pool));
		gp_log(GP_LOG_INFO, "device %d: pool growth for %llu bytes would pass the limit; refused", dev,
		       (unsigned long long)size);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	gp_track(*dptr, GP_K_MEM, dev, size, pool);
	return rc;
}

static uint64_t pool_used(uint64_t pool)
{
	cuuint64_t v;
	if (pool && gp.pool_get_attr &&
	    gp.pool_get_attr((CUmemoryPool)(uintptr_t)pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v) == CUDA_SUCCESS)
		return v;
	return GP_RESERVED_UNKNOWN;
}

static CUresult pool_alloc_pre(uint64_t pool, int dev, uint64_t size, CUstream s, uint64_t *taken)
{
	CUresult rc = gp_pool_begin(pool, dev, size, stream_key(s), pool_reserved(pool), pool_used(pool), taken);
	if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
		refresh_pools(dev);
		rc = gp_pool_begin(pool, dev, size, stream_key(s), pool_reserved(pool), pool_used(pool), taken);
	}
	return rc;
}

static int h_cuMemAllocAsync(fn_cuMemAllocAsync real, CUdeviceptr *dptr, size_t size, CUstream s)
{
	int dev;
	if (!mem_on())
		return real(dptr, size, s);
	if ((dev = stream_dev(s)) < 0 && gp_mem_limited(cur_dev()))
		return CUDA_ERROR_OUT_OF_MEMORY; /* a stream whose device cannot be told, under a limit */
	if (!gp_mem_limited(dev))
		return real(dptr, size, s);
	/* The device's current pool serves cuMemAllocAsync. */
	CUmemoryPool p = NULL;
	if (gp.dev_get_mempool == NULL || gp.dev_get_mempool(&p, dev) != CUDA_SUCCESS || p == NULL) {
		CUresult rc = charge(dev, size);
		if (rc != CUDA_SUCCESS)
			return rc;
		rc = real(dptr, size, s);
		return settle(rc, rc == CUDA_SUCCESS ? *dptr : 0, GP_K_MEM, dev, size);
	}
	uint64_t pool = (uint64_t)(uintptr_t)p, taken;
	gp_pool_register(pool, dev);
	CUresult rc = pool_alloc_pre(pool, dev, size, s, &taken);
	if (rc != CUDA_SUCCESS)
		return rc;
	return pool_alloc_post(real(dptr, size, s), dptr, pool, dev, size, taken, s);
}

static int h_cuMemAllocFromPoolAsync(fn_cuMemAllocFromPoolAsync real, CUdeviceptr *dptr, size_t size,
				     CUmemoryPool p, CUstream s)
{
	if (!mem_on() || p == NULL)
		return real(dptr, size, p, s);
	/* The pool's own device (it may differ from the current context's). */
	uint64_t pool = (uint64_t)(uintptr_t)p, taken;
	int dev = gp_pool_dev(pool);
	if (dev < 0)
		dev = cur_dev();
	if (!gp_mem_limited(dev))
		return real(dptr, size, p, s);
	CUresult rc = pool_alloc_pre(pool, dev, size, s, &taken);
	if (rc != CUDA_SUCCESS)
		return rc;
	return pool_alloc_post(real(dptr, size, p, s), dptr, pool, dev, size, taken, s);
}

static int h_cuMemCreate(fn_cuMemCreate real, CUmemGenericAllocationHandle *handle, size_t size,
			 const CUmemAllocationProp *prop, unsigned long long flags)
{
	/* VMM: the device is the one named in prop, not the current context's
	 * (HAMi-core charged the wrong device for off-device creates). Host
	 * locations are not device memory. */
	if (!mem_on() || prop == NULL || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
	    !gp_mem_limited(prop->location.id))
		return real(handle, size, prop, flags);
	int dev = prop->location.id;
	CUresult rc = charge(dev, size);
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = real(handle, size, prop, flags);
	return settle(rc, rc == CUDA_SUCCESS ? *handle : 0, GP_K_VMM, dev, size);
}

static int h_cuArrayCreate_v2(fn_cuArrayCreate_v2 real, CUarray *arr, const CUDA_ARRAY_DESCRIPTOR *d)
{
	int dev;
	if (!mem_on() || d == NULL || !gp_mem_limited(dev = cur_dev()))
		return real(arr, d);
	uint64_t size = gp_array_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels);
	CUresult rc = charge(dev, size);
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = real(arr, d);
	return settle(rc, rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*arr : 0, GP_K_ARRAY, dev, size);
}

static int h_cuArrayCreate(fn_cuArrayCreate real, CUarray *arr, const CUDA_ARRAY_DESCRIPTOR_v1 *d)
{
	int dev;
	if (!mem_on() || d == NULL || !gp_mem_limited(dev = cur_dev()))
		return real(arr, d);
	uint64_t size = gp_array_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels);
	CUresult rc = charge(dev, size);
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = real(arr, d);
	return settle(rc, rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*arr : 0, GP_K_ARRAY, dev, size);
}

static int h_cuArray3DCreate_v2(fn_cuArray3DCreate_v2 real, CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
	int dev;
	if (!mem_on() || d == NULL || !gp_mem_limited(dev = cur_dev()))
		return real(arr, d);
	uint64_t size = gp_array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels);
	CUresult rc = charge(dev, size);
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = real(arr, d);
	return settle(rc, rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*arr : 0, GP_K_ARRAY, dev, size);
}

static int h_cuArray3DCreate(fn_cuArray3DCreate real, CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d)
{
	int dev;
	if (!mem_on() || d == NULL || !gp_mem_limited(dev = cur_dev()))
		return real(arr, d);
	uint64_t size = gp_array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels);
	CUresult rc = charge(dev, size);
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = real(arr, d);
	return settle(rc, rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*arr : 0, GP_K_ARRAY, dev, size);
}

static int h_cuMipmappedArrayCreate(fn_cuMipmappedArrayCreate real, CUmipmappedArray *arr,
				    const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
	int dev;
	if (!mem_on() || d == NULL || !gp_mem_limited(dev = cur_dev()))
		return real(arr, d, levels);
	uint64_t size = gp_mipmap_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, levels);
	CUresult rc = charge(dev, size);
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = real(arr, d, levels);
	return settle(rc, rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*arr : 0, GP_K_MIPMAP, dev, size);
}

static int h_cuMemPoolCreate(fn_cuMemPoolCreate real, CUmemoryPool *pool, const CUmemPoolProps *props)
{
	CUresult rc = real(pool, props);
	/* A host-located pool holds host memory: registered under a device
	 * index no limit has (GP_MAX_DEV), so its allocations are never
	 * charged to the current device (which is what happened to a pool the
	 * hook did not know). */
	if (rc == CUDA_SUCCESS && mem_on() && props)
		gp_pool_register((uint64_t)(uintptr_t)*pool,
				 props->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? props->location.id : GP_MAX_DEV);
	return rc;
}

static int h_cuMemPoolTrimTo(fn_cuMemPoolTrimTo real, CUmemoryPool pool, size_t keep)
{
	CUresult rc = real(pool, keep);
	int dev;
	if (rc == CUDA_SUCCESS && mem_on() && (dev = gp_pool_dev((uint64_t)(uintptr_t)pool)) >= 0)
		gp_pool_reconcile((uint64_t)(uintptr_t)pool, dev, pool_reserved((uint64_t)(uintptr_t)pool));
	return rc;
}

/* ---- memory: frees ------------------------------------------------------ */

static int h_cuMemFree_v2(fn_cuMemFree_v2 real, CUdeviceptr p) { FREE_WITH(p, GP_K_MEM, real(p)); }
static int h_cuMemFree(fn_cuMemFree real, CUdeviceptr_v1 p) { FREE_WITH(p, GP_K_MEM, real(p)); }
/* A stream-ordered free: a pool block goes back to its pool's slack, as
 * with cuMemFree, but stays in use until the stream reaches the free:
 * recorded as pending on its stream (gp_pool_begin), so that only an
 * allocation on the same stream may reuse it before the driver says it
 * ran (issue 15 M7). */
static int h_cuMemFreeAsync(fn_cuMemFreeAsync real, CUdeviceptr p, CUstream s)
{
	int dev;
	uint64_t size, pool, ctx;
	int had = mem_on() && gp_table_take(&gp.table, p, GP_K_MEM, &dev, &size, &pool, &ctx);
	CUresult rc = real(p, s);
	if (!had)
		return rc;
	if (rc != CUDA_SUCCESS)
		gp_table_put(&gp.table, p, GP_K_MEM, dev, size, pool, ctx);
	else if (pool && gp_pool_dev(pool) >= 0) {
		gp_pool_pending(pool, stream_key(s), size);
		gp_pool_freed(pool, dev, size, pool_reserved(pool));
	} else if (pool)
		gp_pool_freed(pool, dev, size, GP_RESERVED_UNKNOWN);
	else
		gp_uncharge(dev, size);
	return rc;
}
static int h_cuMemRelease(fn_cuMemRelease real, CUmemGenericAllocationHandle h)
{
	int dev;
	uint64_t size, pool, ctx;
	int had = mem_on() && gp_table_take(&gp.table, h, GP_K_VMM, &dev, &size, &pool, &ctx);
	CUresult rc = real(h);
	if (had) {
		if (rc == CUDA_SUCCESS)
			gp_vmm_released(h, dev, size); /* now, or at the last unmap */
		else
			gp_table_put(&gp.table, h, GP_K_VMM, dev, size, pool, ctx);
	}
	return rc;
}

static int h_cuMemMap(fn_cuMemMap real, CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle h,
		      unsigned long long flags)
{
	CUresult rc = real(va, size, offset, h, flags);
	if (rc == CUDA_SUCCESS && mem_on())
		gp_vmm_mapped(va, size, h);
	return rc;
}

static int h_cuMemUnmap(fn_cuMemUnmap real, CUdeviceptr va, size_t size)
{
	CUresult rc = real(va, size);
	if (rc == CUDA_SUCCESS && mem_on())
		gp_vmm_unmapped(va, size);
	return rc;
}
static int h_cuArrayDestroy(fn_cuArrayDestroy real, CUarray a)
{
	FREE_WITH((uint64_t)(uintptr_t)a, GP_K_ARRAY, real(a));
}
static int h_cuMipmappedArrayDestroy(fn_cuMipmappedArrayDestroy real, CUmipmappedArray a)
{
	FREE_WITH((uint64_t)(uintptr_t)a, GP_K_MIPMAP, real(a));
}
static int h_cuMemPoolDestroy(fn_cuMemPoolDestroy real, CUmemoryPool pool)
{
	CUresult rc = real(pool);
	/* The pool's reserve goes with it, and its handle is dead from now on;
	 * live blocks stay charged until freed. */
	if (rc == CUDA_SUCCESS && mem_on())
		gp_pool_forget((uint64_t)(uintptr_t)pool);
	return rc;
}

/* ---- contexts: what a context costs ------------------------------------- */

/* A context costs device memory (300-600 MiB on an H100). It is charged
 * per context: GPUPACK_CONTEXT_RESERVE (the device plugin writes a
 * per-model default into the limits file) before the driver is asked, so
 * an over-limit context is refused without reaching it; then settled on
 * what the context really took where the driver lets us measure it: this
 * process's usedGpuMemory in NVML before and after the creation (the host
 * pid is resolved around it, limiter.c). The measurement includes anything
 * another thread of this process allocated in that instant (charged
 * twice, which can only refuse early). */
struct ctx_meas {
	int ok;
	uint64_t before;
};

static void ctx_measure_begin(int dev, struct ctx_meas *m)
{
	m->ok = 0;
	if (!mem_on() || !gp_mem_limited(dev))
		return;
	/* "Not listed" means "holds nothing" only while no context of ours
	 * lives on dev (device memory needs one); with one alive, trust only
	 * a listed figure. Counting only "never had one" left every context
	 * after a destroyed one (e.g. one refused over the limit) unmeasured,
	 * charged the reserve: 0 by default. */
	int never = !atomic_load(&gp.ctx_ever[dev]) || atomic_load(&gp.ctx_live[dev]) == 0;
	if (gp_proc_mem(dev, &m->before) == 0 && (m->before > 0 || never))
		m->ok = 1;
	else if (atomic_load(&gp.host_pid) == 0 && never) {
		m->before = 0; /* no context of ours on dev yet: NVML cannot list us */
		m->ok = 1;
	}
}

/* The bytes to charge for a context just created: measured, else the reserve. */
static uint64_t ctx_measure_end(int dev, struct ctx_meas *m)
{
	uint64_t after;
	atomic_store(&gp.ctx_ever[dev], 1);
	/* The device plugin's per-model reserve is the floor: a context grows
	 * after creation (modules, lazy loading), which no delta sees. */
	if (m->ok && gp_proc_mem(dev, &after) == 0 && after >= m->before && after - m->before > gp.cfg.ctx_reserve)
		return after - m->before;
	return gp.cfg.ctx_reserve;
}

/* A context creation through the driver, with this process's host pid
 * resolved around it (limiter.c). */
#define CREATE_CTX(dev, call)                                           \
	({                                                              \
		struct gp_pidsnap snap_;                                \
		gp_hostpid_before((dev), &snap_);                       \
		CUresult crc_ = (call);                                 \
		gp_hostpid_after((dev), &snap_, crc_ == CUDA_SUCCESS);  \
		if (crc_ == CUDA_SUCCESS && ctx != NULL)                \
			gp_ctx_register((dev), *ctx);                   \
		crc_;                                                   \
	})

/* Moves a charge of `from` bytes (already made) to `to` bytes for a
 * context the driver just created. Growth is charged against the limit:
 * CUDA_ERROR_OUT_OF_MEMORY when it does not fit (the caller destroys the
 * context). Charging it unchecked let a container with no reserve
 * configured (the environment's and HAMi's default) exceed its limit by
 * one context at a time without bound (200 x 300 MiB). */
static CUresult recharge(int dev, uint64_t from, uint64_t to)
{
	if (to > from)
		return gp_charge(dev, to - from);
	if (from > to)
		gp_uncharge(dev, from - to);
	return CUDA_SUCCESS;
}

/* The trusted limits file is unusable (or missing on a gpupack node):
 * every allocation is refused, and so is every context, which holds
 * device memory of its own and is what any kernel launch needs. */
static inline int ctx_refused(void)
{
	static _Atomic int logged;
	if (!gp.cfg.fail_closed)
		return 0;
	if (!atomic_exchange(&logged, 1))
		gp_log(GP_LOG_ERROR, "every CUDA context is refused too: the limits file is unusable");
	return 1;
}

#define CTX_CREATE(call)                                                                      \
	do {                                                                                  \
		if (ctx_refused())                                                            \
			return CUDA_ERROR_OUT_OF_MEMORY;                                      \
		int lim_ = mem_on() && gp_mem_limited(dev);                                   \
		if (lim_ && gp.cfg.ctx_reserve && gp_charge(dev, gp.cfg.ctx_reserve) != CUDA_SUCCESS) \
			return CUDA_ERROR_OUT_OF_MEMORY;                                      \
		struct ctx_meas m_;                                                           \
		ctx_measure_begin(dev, &m_);                                                  \
		CUresult rc_ = CREATE_CTX(dev, call);                                         \
		if (!lim_) {                                                                  \
			if (rc_ == CUDA_SUCCESS && dev >= 0 && dev < GP_MAX_DEV)              \
				atomic_fetch_add(&gp.ctx_live[dev], 1);                       \
			return rc_;                                                           \
		}                                                                             \
		if (rc_ != CUDA_SUCCESS) {                                                    \
			gp_uncharge(dev, gp.cfg.ctx_reserve);                                 \
			return rc_;                                                           \
		}                                                                             \
		uint64_t cost_ = ctx_measure_end(dev, &m_);                                   \
		if (recharge(dev, gp.cfg.ctx_reserve, cost_) != CUDA_SUCCESS) {               \
			gp_uncharge(dev, gp.cfg.ctx_reserve);                                 \
			gp_ctx_forget(*ctx);                                                  \
			if (gp.ctx_destroy)                                                   \
				gp.ctx_destroy(*ctx);                                         \
			*ctx = NULL;                                                          \
			gp_log(GP_LOG_INFO, "context of %llu bytes on device %d is over the limit; destroyed", \
			       (unsigned long long)cost_, dev);                               \
			return CUDA_ERROR_OUT_OF_MEMORY;                                      \
		}                                                                             \
		atomic_fetch_add(&gp.ctx_live[dev], 1);                                       \
		if (cost_)                                                                    \
			gp_track((uint64_t)(uintptr_t)*ctx, GP_K_CTX, dev, cost_, 0);         \
		return rc_;                                                                   \
	} while (0)

static int h_cuCtxCreate_v2(fn_cuCtxCreate_v2 real, CUcontext *ctx, unsigned int flags, CUdevice dev)
{
	CTX_CREATE(real(ctx, flags, dev));
}
static int h_cuCtxCreate_v3(fn_cuCtxCreate_v3 real, CUcontext *ctx, void *params, int n, unsigned int flags, CUdevice dev)
{
	CTX_CREATE(real(ctx, params, n, flags, dev));
}
static int h_cuCtxCreate_v4(fn_cuCtxCreate_v4 real, CUcontext *ctx, void *params, unsigned int flags, CUdevice dev)
{
	CTX_CREATE(real(ctx, params, flags, dev));
}
static int h_cuCtxDestroy_v2(fn_cuCtxDestroy_v2 real, CUcontext ctx)
{
	int dev = -1;
	uint64_t sz;
	gp_table_get(&gp.table, (uint64_t)(uintptr_t)ctx, GP_K_CTX, &dev, &sz);
	CUresult rc = real(ctx);
	if (rc == CUDA_SUCCESS)
		gp_ctx_forget(ctx);
	if (rc == CUDA_SUCCESS && dev >= 0 && dev < GP_MAX_DEV && atomic_load(&gp.ctx_live[dev]) > 0)
		atomic_fetch_sub(&gp.ctx_live[dev], 1);
	if (rc == CUDA_SUCCESS && mem_on()) {
		gp_untrack((uint64_t)(uintptr_t)ctx, GP_K_CTX); /* its charge */
		gp_untrack_ctx((uint64_t)(uintptr_t)ctx);      /* blocks it freed with it */
	}
	return rc;
}

/* cuCtxSetLimit: the driver reserves device memory for the stack of every
 * resident thread (stack size x SMs x threads per SM: ~17 GiB at 64 KiB on
 * an H100), the device malloc heap and the printf FIFO. Growth past the
 * value the context had is charged (refused when over the limit, before
 * the driver is asked); shrinking gives it back. Charged to the current
 * context as a block of kind GP_K_CTX keyed by context + 1 + limit, so
 * destroying the context uncharges it. */
static uint64_t limit_bytes(int dev, CUlimit limit, uint64_t v)
{
	if (limit != CU_LIMIT_STACK_SIZE)
		return v;
	int sms = 0, threads = 0;
	if (!gp.dev_get_attr || gp.dev_get_attr(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) != CUDA_SUCCESS ||
	    gp.dev_get_attr(&threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev) != CUDA_SUCCESS)
		return v * 2048 * 132; /* unknown: an H100's worth, the safe side */
	return v * (uint64_t)sms * (uint64_t)threads;
}

/* Issue 15 M5: the device runtime's limits (CUDA dynamic parallelism)
 * also reserve device memory — per nesting level of cudaDeviceSynchronize
 * state for every resident thread, and a buffer per pending launch — at a
 * cost NVIDIA does not document and the hook cannot measure. Under a
 * memory limit, growth past the context's current value is refused
 * (CUDA_ERROR_OUT_OF_MEMORY, one ERROR line per limit) rather than
 * guessed; shrinking and setting the same value pass. Before, both passed
 * uncharged. */
static int devrt_limit_refused(CUlimit limit, size_t value)
{
	static _Atomic int said[2];
	size_t old = 0;
	if (gp.ctx_get_limit && gp.ctx_get_limit(&old, limit) == CUDA_SUCCESS && value <= old)
		return 0;
	if (!atomic_exchange(&said[limit == CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH ? 0 : 1], 1))
		gp_log(GP_LOG_ERROR, "cuCtxSetLimit(%s, %zu) refused: it reserves device memory the hook cannot "
		       "charge (its cost is not known) under a memory limit",
		       limit == CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH ? "CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH"
							   : "CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT",
		       value);
	return 1;
}

static int h_cuCtxSetLimit(fn_cuCtxSetLimit real, CUlimit limit, size_t value)
{
	int dev;
	size_t old = 0;
	CUcontext c = NULL;
	if ((limit == CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH || limit == CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT) &&
	    mem_on() && gp_mem_limited(cur_dev()) && devrt_limit_refused(limit, value))
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (!mem_on() || (limit != CU_LIMIT_STACK_SIZE && limit != CU_LIMIT_MALLOC_HEAP_SIZE &&
			  limit != CU_LIMIT_PRINTF_FIFO_SIZE) ||
	    !gp_mem_limited(dev = cur_dev()) || !gp.ctx_get_limit || gp.ctx_get_limit(&old, limit) != CUDA_SUCCESS ||
	    !gp.ctx_get_current || gp.ctx_get_current(&c) != CUDA_SUCCESS || c == NULL)
		return real(limit, value);
	uint64_t key = (uint64_t)(uintptr_t)c + 1 + (uint64_t)limit;
	int d;
	uint64_t charged = 0, pool, cx;
	/* What this limit is charged now (growth already past the context's
	 * own value), and what the new value would add. */
	if (!gp_table_take(&gp.table, key, GP_K_CTX, &d, &charged, &pool, &cx))
		charged = 0;
	uint64_t o = limit_bytes(dev, limit, old), n = limit_bytes(dev, limit, value);
	uint64_t base = o >= charged ? o - charged : 0; /* the context's own, in its measured cost */
	uint64_t want = n > base ? n - base : 0;
	if (want > charged && gp_charge(dev, want - charged) != CUDA_SUCCESS) {
		if (charged)
			gp_table_put(&gp.table, key, GP_K_CTX, dev, charged, 0, (uint64_t)(uintptr_t)c);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	CUresult rc = real(limit, value);
	if (rc != CUDA_SUCCESS) {
		if (want > charged)
			gp_uncharge(dev, want - charged);
		want = charged;
	} else if (want < charged)
		gp_uncharge(dev, charged - want);
	if (want)
		gp_table_put(&gp.table, key, GP_K_CTX, dev, want, 0, (uint64_t)(uintptr_t)c);
	return rc;
}

static int h_cuDevicePrimaryCtxRetain(fn_cuDevicePrimaryCtxRetain real, CUcontext *ctx, CUdevice dev)
{
	if (ctx_refused())
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (!mem_on() || !gp_mem_limited(dev)) {
		CUresult rc = CREATE_CTX(dev, real(ctx, dev));
		if (rc == CUDA_SUCCESS && dev >= 0 && dev < GP_MAX_DEV && atomic_fetch_add(&gp.primary_refs[dev], 1) == 0)
			atomic_fetch_add(&gp.ctx_live[dev], 1);
		return rc;
	}
	/* The primary context exists once per device and process: charged at
	 * the first retain, released at the last release. */
	pthread_mutex_lock(&gp.primary_mu);
	CUresult rc = CUDA_SUCCESS;
	int first = atomic_load(&gp.primary_refs[dev]) == 0;
	struct ctx_meas m;
	if (first && gp.cfg.ctx_reserve)
		rc = gp_charge(dev, gp.cfg.ctx_reserve);
	if (rc == CUDA_SUCCESS) {
		if (first)
			ctx_measure_begin(dev, &m);
		rc = CREATE_CTX(dev, real(ctx, dev));
		if (rc == CUDA_SUCCESS) {
			uint64_t cost = first ? ctx_measure_end(dev, &m) : 0;
			if (first && recharge(dev, gp.cfg.ctx_reserve, cost) != CUDA_SUCCESS) {
				/* Over the limit once measured: give it back. */
				gp_uncharge(dev, gp.cfg.ctx_reserve);
				gp_ctx_forget(*ctx);
				if (gp.primary_release)
					gp.primary_release(dev);
				*ctx = NULL;
				gp_log(GP_LOG_INFO, "primary context of %llu bytes on device %d is over the limit; released",
				       (unsigned long long)cost, dev);
				rc = CUDA_ERROR_OUT_OF_MEMORY;
			} else {
				atomic_fetch_add(&gp.primary_refs[dev], 1);
				atomic_store(&gp.primary_ctx[dev], (uint64_t)(uintptr_t)*ctx);
				if (first) {
					atomic_fetch_add(&gp.ctx_live[dev], 1);
					gp.primary_charge[dev] = cost;
				}
			}
		} else if (first)
			gp_uncharge(dev, gp.cfg.ctx_reserve);
	}
	pthread_mutex_unlock(&gp.primary_mu);
	return rc;
}

static int h_cuDevicePrimaryCtxRelease_v2(fn_cuDevicePrimaryCtxRelease_v2 real, CUdevice dev)
{
	CUresult rc = real(dev);
	if (rc != CUDA_SUCCESS || dev < 0 || dev >= GP_MAX_DEV)
		return rc;
	pthread_mutex_lock(&gp.primary_mu);
	if (atomic_load(&gp.primary_refs[dev]) > 0 && atomic_fetch_sub(&gp.primary_refs[dev], 1) == 1) {
		gp_ctx_forget((CUcontext)(uintptr_t)atomic_load(&gp.primary_ctx[dev]));
		if (atomic_load(&gp.ctx_live[dev]) > 0)
			atomic_fetch_sub(&gp.ctx_live[dev], 1);
		if (mem_on() && gp_mem_limited(dev))
			gp_uncharge(dev, gp.primary_charge[dev]);
		gp.primary_charge[dev] = 0;
	}
	pthread_mutex_unlock(&gp.primary_mu);
	return rc;
}

static int h_cuDevicePrimaryCtxReset_v2(fn_cuDevicePrimaryCtxReset_v2 real, CUdevice dev)
{
	CUresult rc = real(dev);
	if (rc != CUDA_SUCCESS || !mem_on() || !gp_mem_limited(dev))
		return rc;
	/* Reset frees every allocation made in the primary context. */
	gp_untrack_ctx(atomic_load(&gp.primary_ctx[dev]));
	return rc;
}

/* ---- virtualised queries ------------------------------------------------ */

static int h_cuMemGetInfo_v2(fn_cuMemGetInfo_v2 real, size_t *freep, size_t *totalp)
{
	CUresult rc = real(freep, totalp);
	int dev;
	if (rc != CUDA_SUCCESS || !mem_on() || !freep || !totalp || !gp_mem_limited(dev = cur_dev()))
		return rc;
	uint64_t f = *freep, t = *totalp;
	virtualize(dev, &f, &t);
	*freep = f;
	*totalp = t;
	return rc;
}

static int h_cuMemGetInfo(fn_cuMemGetInfo real, unsigned int *freep, unsigned int *totalp)
{
	CUresult rc = real(freep, totalp);
	int dev;
	if (rc != CUDA_SUCCESS || !mem_on() || !freep || !totalp || !gp_mem_limited(dev = cur_dev()))
		return rc;
	uint64_t f = *freep, t = *totalp;
	virtualize(dev, &f, &t);
	*freep = (unsigned int)f;
	*totalp = (unsigned int)t;
	return rc;
}

static int h_cuDeviceTotalMem_v2(fn_cuDeviceTotalMem_v2 real, size_t *bytes, CUdevice dev)
{
	CUresult rc = real(bytes, dev);
	if (rc == CUDA_SUCCESS && mem_on() && bytes && gp_mem_limited(dev) && gp_mem_limit(dev) < *bytes)
		*bytes = gp_mem_limit(dev);
	return rc;
}

static int h_cuDeviceTotalMem(fn_cuDeviceTotalMem real, unsigned int *bytes, CUdevice dev)
{
	CUresult rc = real(bytes, dev);
	if (rc == CUDA_SUCCESS && mem_on() && bytes && gp_mem_limited(dev) && gp_mem_limit(dev) < *bytes)
		*bytes = (unsigned int)gp_mem_limit(dev);
	return rc;
}

/* The limits index of an NVML device, when it is limited (else -2). With
 * UUIDs in the limits file an NVML device is matched by its UUID (NVML
 * numbers devices in PCI order whatever CUDA_VISIBLE_DEVICES says); one
 * that matches none is limited to 0 bytes, as its CUDA device is. */
static int nvml_limited(nvmlDevice_t d)
{
	int idx = gp_nvml_index(d);
	if (idx < 0)
		return gp.cfg.uuid_set ? GP_DEV_NONE : -2;
	return gp.cfg.mem_limit[idx] != GP_UNLIMITED ? idx : -2;
}

static void nvml_virtualize(int idx, unsigned long long *total, unsigned long long *freep, unsigned long long *used)
{
	uint64_t f = *freep, t = *total;
	virtualize_index(idx < 0 ? -1 : gp_index_dev(idx), idx, &f, &t);
	uint64_t u = gp_index_used(idx);
	*total = t;
	*freep = f;
	*used = u > t ? t : u;
}

static int h_nvmlDeviceGetMemoryInfo(fn_nvmlDeviceGetMemoryInfo real, nvmlDevice_t d, nvmlMemory_t *m)
{
	int rc = real(d, m);
	int idx;
	if (rc == NVML_SUCCESS && mem_on() && m && (idx = nvml_limited(d)) != -2)
		nvml_virtualize(idx, &m->total, &m->free, &m->used);
	return rc;
}

static int h_nvmlDeviceGetMemoryInfo_v2(fn_nvmlDeviceGetMemoryInfo_v2 real, nvmlDevice_t d, nvmlMemory_v2_t *m)
{
	int rc = real(d, m);
	int idx;
	if (rc == NVML_SUCCESS && mem_on() && m && (idx = nvml_limited(d)) != -2) {
		nvml_virtualize(idx, &m->total, &m->free, &m->used);
		m->reserved = 0; /* total = used + free inside the container */
	}
	return rc;
}

/* ---- launches: the SM limiter ------------------------------------------ */

static inline uint64_t blocks(unsigned gx, unsigned gy, unsigned gz)
{
	return (uint64_t)gx * gy * gz;
}

/* The fast path is the relaxed load; everything else is off the hot path. */
#define THROTTLE(cost)                                                                 \
	do {                                                                           \
		if (__builtin_expect(atomic_load_explicit(&gp.sm_active, memory_order_relaxed), 0)) { \
			int refused_ = gp_limiter_admit(cur_dev(), (cost));            \
			if (refused_ != 0)                                             \
				return (CUresult)refused_;                             \
		}                                                              \
	} while (0)

static int h_cuLaunchKernel(fn_cuLaunchKernel real, CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
			    unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem, CUstream s,
			    void **params, void **extra)
{
	THROTTLE(blocks(gx, gy, gz));
	return real(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}

static int h_cuLaunchKernelEx(fn_cuLaunchKernelEx real, const CUlaunchConfig *cfg, CUfunction f, void **params,
			      void **extra)
{
	THROTTLE(cfg ? blocks(cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ) : 1);
	return real(cfg, f, params, extra);
}

static int h_cuLaunchCooperativeKernel(fn_cuLaunchCooperativeKernel real, CUfunction f, unsigned int gx,
				       unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
				       unsigned int bz, unsigned int shmem, CUstream s, void **params)
{
	THROTTLE(blocks(gx, gy, gz));
	return real(f, gx, gy, gz, bx, by, bz, shmem, s, params);
}

/* A legacy grid of w x h blocks; cuLaunch runs a 1 x 1 grid. */
static inline uint64_t grid(int w, int h)
{
	return w > 0 && h > 0 ? (uint64_t)w * (uint64_t)h : 1;
}

static int h_cuLaunch(fn_cuLaunch real, CUfunction f)
{
	THROTTLE(1);
	return real(f);
}

static int h_cuLaunchGrid(fn_cuLaunchGrid real, CUfunction f, int w, int h)
{
	THROTTLE(grid(w, h));
	return real(f, w, h);
}

static int h_cuLaunchGridAsync(fn_cuLaunchGridAsync real, CUfunction f, int w, int h, CUstream s)
{
	THROTTLE(grid(w, h));
	return real(f, w, h, s);
}

static int h_cuGraphLaunch(fn_cuGraphLaunch real, CUgraphExec g, CUstream s)
{
	THROTTLE(GRAPH_COST);
	return real(g, s);
}

/* ---- cuGetProcAddress ---------------------------------------------------- */

static struct gp_hook *by_symbol(const char *name);

static struct gp_hook *gpa_entry(const char *symbol, int ver)
{
	struct gp_hook *best = NULL;
	for (int i = 0; i < IDX_COUNT; i++) {
		struct gp_hook *h = &hooks[i];
		if (h->gpa_name && h->min_version <= ver && !strcmp(h->gpa_name, symbol) &&
		    (best == NULL || h->min_version > best->min_version))
			best = h;
	}
	return best;
}

static void *gpa_instance(struct gp_hook *h, void *realfn)
{
	for (int i = 0; i < GP_INST; i++) {
		void *cur = atomic_load(&h->inst_real[i]);
		if (cur == realfn)
			return h->inst_wrapper[i];
		if (cur == NULL) {
			if (atomic_compare_exchange_strong(&h->inst_real[i], &cur, realfn) || cur == realfn)
				return h->inst_wrapper[i];
		}
	}
	gp_log(GP_LOG_ERROR, "%s: more than %d driver variants; sharing instance 0", h->sym, GP_INST);
	return h->inst_wrapper[0];
}

/* The ABI of the pointer the driver returned, checked against the
 * driver's own exports rather than assumed from our table: the entry of
 * `symbol` whose exported function (or its _ptsz twin) is that pointer.
 * If none is, but the driver exports a newer version of the name (say
 * cuMemGetInfo_v3) at that very address, the ABI is one we do not know:
 * NULL, and the caller keeps the driver's pointer (wrapping it with an
 * older ABI would corrupt the call; the NVML watcher enforces instead).
 * If nothing matches (a driver whose table points elsewhere), the
 * version-based guess stands. */
static _Thread_local char gpa_unknown[128]; /* the unknown ABI's name, for the log */

static struct gp_hook *gpa_abi(struct gp_hook *guess, const char *symbol, void *fn)
{
	char name[128];
	for (int i = 0; i < IDX_COUNT; i++) {
		struct gp_hook *e = &hooks[i];
		if (e->gpa_name == NULL || strcmp(e->gpa_name, symbol))
			continue;
		if (real_of(i) == fn)
			return e;
		void *lib = e->lib == LIB_CUDA ? gp.libcuda : gp.libnvml;
		snprintf(name, sizeof name, "%s_ptsz", e->sym);
		if (lib && gp.real_dlsym(lib, name) == fn)
			return e;
	}
	for (int v = 2; v <= 9 && gp.libcuda; v++) {
		snprintf(name, sizeof name, "%s_v%d", symbol, v);
		if (by_symbol(name) != NULL || gp.real_dlsym(gp.libcuda, name) != fn)
			continue;
		snprintf(gpa_unknown, sizeof gpa_unknown, "%s", name);
		return NULL;
	}
	return guess;
}

/* Issue 15 M6: what an unknown ABI of a name would bypass. The names that
 * charge device memory (allocations, contexts, context limits) while a
 * memory limit is set, and the launches while an SM limit is set, fail
 * closed: handed out, they would take memory or SM time the hook never
 * sees. The rest (queries, frees, releases) pass through: a query then
 * shows physical figures, a free unseen leaves its charge (refusing early,
 * never over the limit). */
static int gpa_fails_closed(const char *symbol)
{
	static const char *const mem[] = {"cuMemAlloc", "cuMemAllocPitch", "cuMemAllocManaged", "cuMemAllocAsync",
					  "cuMemAllocFromPoolAsync", "cuMemCreate", "cuArrayCreate", "cuArray3DCreate",
					  "cuMipmappedArrayCreate", "cuCtxCreate", "cuDevicePrimaryCtxRetain",
					  "cuCtxSetLimit", NULL};
	static const char *const sm[] = {"cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel",
					 "cuGraphLaunch", "cuLaunch", "cuLaunchGrid", "cuLaunchGridAsync", NULL};
	for (int i = 0; gp.cfg.any_mem_limit && mem[i]; i++)
		if (!strcmp(symbol, mem[i]))
			return 1;
	for (int i = 0; gp.cfg.any_sm_limit && sm[i]; i++)
		if (!strcmp(symbol, sm[i]))
			return 1;
	return 0;
}

static CUresult gpa_wrap(CUresult rc, const char *symbol, void **pfn, int ver, CUdriverProcAddressQueryResult *status)
{
	if (rc != CUDA_SUCCESS || pfn == NULL || *pfn == NULL || symbol == NULL || gp.cfg.disabled)
		return rc;
	struct gp_hook *h = gpa_entry(symbol, ver);
	if (h == NULL)
		return rc; /* not ours: the driver's pointer, untouched */
	for (int i = 0; i < IDX_COUNT; i++)
		if (*pfn == hooks[i].wrapper)
			return rc; /* the driver's table resolved to our export already */
	if (h == &hooks[IDX_cuGetProcAddress_v2] || h == &hooks[IDX_cuGetProcAddress]) {
		*pfn = h->wrapper; /* our own resolver, so later look-ups stay covered */
		return rc;
	}
	if ((h = gpa_abi(h, symbol, *pfn)) == NULL) {
		if (!gpa_fails_closed(symbol)) {
			gp_log(GP_LOG_ERROR, "cuGetProcAddress(%s) returned %s, an ABI this hook does not know: "
			       "passed through (not a call that takes memory or SM time under a limit)", symbol, gpa_unknown);
			return rc; /* the driver's pointer, untouched */
		}
		gp_log(GP_LOG_ERROR, "cuGetProcAddress(%s) returned %s, an ABI this hook does not know: refused "
		       "(CUDA_ERROR_NOT_FOUND), so that it cannot bypass the limit; ask for an older cudaVersion or "
		       "update gpupack's hook", symbol, gpa_unknown);
		*pfn = NULL;
		if (status)
			*status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
		return CUDA_ERROR_NOT_FOUND;
	}
	*pfn = gpa_instance(h, *pfn);
	return rc;
}

static int h_cuGetProcAddress_v2(fn_cuGetProcAddress_v2 real, const char *symbol, void **pfn, int ver,
				 cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
	return gpa_wrap(real(symbol, pfn, ver, flags, status), symbol, pfn, ver, status);
}

static int h_cuGetProcAddress(fn_cuGetProcAddress real, const char *symbol, void **pfn, int ver, cuuint64_t flags)
{
	return gpa_wrap(real(symbol, pfn, ver, flags), symbol, pfn, ver, NULL);
}

/* ---- dlsym ------------------------------------------------------------- */

static struct gp_hook *by_symbol(const char *name)
{
	for (int i = 0; i < IDX_COUNT; i++)
		if (!strcmp(hooks[i].sym, name))
			return &hooks[i];
	return NULL;
}

/* dlsym may be called before any constructor ran, even while a sanitizer
 * runtime is initialising (the ASan build): the pass-through path is not
 * instrumented and calls nothing but the real dlsym. */
#define GP_NO_SAN __attribute__((no_sanitize("address", "undefined")))

GP_NO_SAN static inline int maybe_ours(const char *n)
{
	return (n[0] == 'c' && n[1] == 'u') || (n[0] == 'n' && n[1] == 'v' && n[2] == 'm' && n[3] == 'l');
}

GP_NO_SAN __attribute__((visibility("default"))) void *dlsym(void *handle, const char *name)
{
	if (gp.real_dlsym == NULL)
		resolve_real_dlsym();
	if (gp.real_dlsym == NULL)
		return NULL; /* no glibc dlsym found (logged): fail the look-up, never crash */
	/* RTLD_NEXT is relative to the caller: a tail call keeps the caller's
	 * return address, which is how glibc finds it. Names that are not
	 * ours take the same road. */
	if (handle == RTLD_NEXT || !maybe_ours(name))
		return gp.real_dlsym(handle, name);
	void *r = gp.real_dlsym(handle, name);
	struct gp_hook *h;
	if (r == NULL || (h = by_symbol(name)) == NULL)
		return r;
	gp_init();
	if (h->lib == LIB_NVML)
		pthread_once(&gp.nvml_once, nvml_load);
	if (gp.cfg.disabled)
		return r;
	return (r == real_of((int)(h - hooks)) || r == h->wrapper) ? h->wrapper : r;
}
