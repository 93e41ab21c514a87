/*
 * The one state struct of the hook and the interfaces between its files:
 *   config.c   environment contract, parsed once; logging
 *   region.c   the shared accounting region (per-process slots)
 *   account.c  allocation tracking and limit checks per device
 *   limiter.c  the SM limiter (token bucket + utilisation feedback)
 *   dispatch.c exported cu* and nvml* wrappers, cuGetProcAddress, dlsym
 * Nothing outside `gp` is mutable global state, except the dispatch table
 * in dispatch.c (constant but for driver pointers filled in on first use)
 * and the log level in config.c (the logger works before `gp` exists, and
 * in the parser's test program, which has no `gp`).
 */
#ifndef GPUPACK_STATE_H
#define GPUPACK_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "cuda_types.h"

#define GP_MAX_DEV 16
#define GP_UNLIMITED UINT64_MAX

enum { GP_LOG_ERROR = 0, GP_LOG_WARN = 1, GP_LOG_INFO = 3, GP_LOG_DEBUG = 4 };

/* ---- config.c ---------------------------------------------------------- */

struct gp_config {
	uint64_t mem_limit[GP_MAX_DEV]; /* bytes; GP_UNLIMITED when unset */
	int sm_limit[GP_MAX_DEV];       /* percent 1..99; 0 = not throttled */
	uint64_t ctx_reserve;           /* bytes charged per CUDA context */
	unsigned sm_period_ms;          /* limiter control period */
	int log_level;
	int disabled;                   /* CUDA_DISABLE_CONTROL */
	int any_mem_limit;
	int any_sm_limit;
	char shared_cache[1024];        /* "" = private accounting */
	int from_file;                  /* limits came from the trusted file */
	int fail_closed;                /* the trusted file is unusable: refuse all */
	/* GPUPACK_DEVICE_UUID_<i> (trusted file only): the GPU limits index
	 * i names. Any set: CUdevices map to indices by UUID (gp_dev_index). */
	unsigned uuid_set;              /* bit i: uuid[i] given */
	unsigned char uuid[GP_MAX_DEV][16];
};

/* The trusted limits file, written and mounted read-only by gpupack-node's
 * device plugin. A compile-time constant on purpose: nothing a tenant
 * controls (no environment variable) may point the hook elsewhere. */
#define GP_LIMITS_PATH "/etc/gpupack/limits"
#define GP_LIMITS_MAX (64 * 1024)

/* Pure parsers (fuzzed). Return 0 on success, -1 on malformed input. */
int gp_parse_size(const char *s, uint64_t *out);
int gp_parse_percent(const char *s, int *out);
int gp_parse_bool(const char *s, int *out);
/* "GPU-"/"MIG-" and 8-4-4-4-12 hex digits into its 16 bytes. */
int gp_parse_uuid(const char *s, unsigned char out[16]);
/* Fills c from an environ-style array. Every malformed value is reported
 * through the log at ERROR level and replaced by its safe fallback. */
void gp_config_from_env(struct gp_config *c, char *const *envp);
/* Fills c from the text of a limits file (KEY=VALUE lines; see config.c).
 * 0 on success; -1 when the file is unparsable, with c set to refuse every
 * allocation and the reason (one line) in err. Pure: no I/O, no logging. */
int gp_config_from_file(struct gp_config *c, const char *buf, size_t len, char *err, size_t errlen);
/* The whole rule: limits from the file at path when it exists (env keys
 * ignored), fail closed when it exists but is unusable, the environment
 * when it does not exist — unless `node` (this library is the copy
 * gpupack-node installed, see gp_installed_by_node): then a missing file
 * fails closed too, since on a gpupack node every container the hook is
 * delivered to gets one, and only a mount that hides it makes it missing.
 * The file is opened without following symlinks, and with require_ro it
 * must be on a read-only mount (gpupack-node mounts it so); either fails
 * closed. The library passes GP_LIMITS_PATH and require_ro = 1 only; the
 * parameters exist for the parser's test program. */
void gp_config_load(struct gp_config *c, char *const *envp, const char *path, int node, int require_ro);

/* gpupack-node's installer writes this stamp next to the library in the
 * read-only hook folder it mounts into containers
 * (devicehook/node/installer: VersionFile). A library that finds it
 * beside itself is the node's copy: the trusted limits file must exist. */
#define GP_NODE_MARKER "VERSION"
/* 1 when the library at lib_path (as the loader named it) has
 * GP_NODE_MARKER in its folder. */
int gp_installed_by_node(const char *lib_path);
/* gpupack-node's default hook folder as containers see it
 * (v1alpha1.DefaultHookHostPath; the device plugin mounts it at the same
 * path). The stamp there also counts: any copy of this library in a
 * container that has the node's hook folder mounted is on a gpupack node,
 * so a tenant cannot preload its own copy from elsewhere to get the
 * environment fallback back. */
#define GP_NODE_HOOK_DIR "/usr/local/gpupack"
#define GP_NODE_HOOK_LIB GP_NODE_HOOK_DIR "/libgpupack-hook.so"
void gp_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* NULL when this process cannot change the file open at fd (read-only
 * mount, or another owner and no write permission or capability for us);
 * otherwise why it can. */
const char *gp_fd_writable_by_us(int fd);

/* ---- region.c ---------------------------------------------------------- */

struct gp_region; /* the mmap'd layout, private to region.c */

struct gp_region_handle {
	struct gp_region *r;
	int slot;        /* our slot index, -1 when detached */
	pid_t pid;       /* pid that owns `slot` (fork changes it) */
	uint64_t word;   /* the slot's owner word: pid-namespace tag and pid */
	int shared;      /* backed by CUDA_DEVICE_MEMORY_SHARED_CACHE */
	int sm;          /* the file has the container's SM state (region.c I10) */
	/* Set by the caller before gp_region_open (region.c reads no globals:
	 * the node agent's reader test builds it alone). */
	int sm_limited;          /* an SM limit is set: grow an older-layout file (review M2) */
	unsigned sm_period_ms;   /* the limiter's period: part of a reclaimed span's floor */
};

int gp_region_open(struct gp_region_handle *h, const char *path);
int gp_region_attach(struct gp_region_handle *h);
void gp_region_detach(struct gp_region_handle *h);
uint64_t gp_region_used(struct gp_region_handle *h, int dev);
int gp_region_reserve(struct gp_region_handle *h, int dev, uint64_t size, uint64_t limit);
void gp_region_add(struct gp_region_handle *h, int dev, uint64_t size);
void gp_region_release(struct gp_region_handle *h, int dev, uint64_t size);
int gp_region_reclaim_dead(struct gp_region_handle *h);
int gp_region_pids(struct gp_region_handle *h, pid_t *out, int max);
/* Host pids (as NVML reports them) of the container's processes that
 * resolved theirs; set our own once known. */
void gp_region_set_hostpid(struct gp_region_handle *h, unsigned hostpid);
int gp_region_hostpids(struct gp_region_handle *h, unsigned *out, int max);

/* The container's SM budget of one limits index (review 15: it was per
 * process, and a fresh process per long kernel never paid). In the shared
 * region (region.c I10), so every process of the container spends and
 * pays into the same one; lock-free (CAS and fetch-add only), so a
 * process SIGKILLed anywhere leaves it consistent, and its debt stays with
 * the container. Tenant-writable like the rest of the region (known gap
 * M1): accrual clamps it to its cap at every tick. Part of the file
 * format: 64 bytes. */
struct gp_sm_budget {
	_Atomic int64_t credit_ns;    /* device time the container may still use; < 0: no launch passes */
	_Atomic uint64_t accrued_ns;  /* CLOCK_MONOTONIC of the last accrual (0: never) */
	_Atomic uint64_t charged_ts;  /* newest NVML sample stamp charged (wall clock, us) */
	_Atomic uint64_t cadence_us;  /* NVML's sample cadence, as a process of the container last saw it */
	uint64_t pad[4];
};
/* Limits index i's budget (NULL when i is out of range). */
struct gp_sm_budget *gp_region_budget(struct gp_region_handle *h, int i);
/* What this process ran that NVML has not reported (region.c I10): its
 * control thread's tick, and since when it may have work on index i that
 * no sample covered (0: none). only_if_set: move it forward only when set
 * (a sample covered up to from_ns); else set it only when clear (a launch). */
void gp_region_sm_alive(struct gp_region_handle *h);
void gp_region_sm_from(struct gp_region_handle *h, int i, uint64_t from_ns, int only_if_set);

/* ---- account.c --------------------------------------------------------- */

enum gp_kind { GP_K_MEM = 1, GP_K_VMM, GP_K_ARRAY, GP_K_MIPMAP, GP_K_CTX };

struct gp_entry {
	_Atomic uint64_t key; /* 0 empty, 1 busy, 2 tombstone, else the handle */
	uint64_t size;
	int32_t dev;
	int32_t kind;
	uint64_t aux; /* GP_K_MEM: the pool it came from (0 = none) */
	uint64_t ctx; /* context current at allocation: destroying it frees the block */
};

struct gp_table {
	struct gp_entry *e;
	uint64_t mask;
	_Atomic uint64_t overflow; /* inserts that found no room (logged) */
};

int gp_table_init(struct gp_table *t, unsigned log2cap);
void gp_table_clear(struct gp_table *t);
int gp_table_put(struct gp_table *t, uint64_t key, int kind, int dev, uint64_t size, uint64_t aux, uint64_t ctx);
int gp_table_take(struct gp_table *t, uint64_t key, int kind, int *dev, uint64_t *size, uint64_t *aux, uint64_t *ctx);
int gp_table_get(struct gp_table *t, uint64_t key, int kind, int *dev, uint64_t *size);

/* Devices and limits indices. Every `dev` in the hook is a CUdevice (the
 * process's ordinal, which CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER, the
 * tenant's, choose); limits (gp.cfg) and the shared region are kept per
 * limits index. gp_dev_index maps one to the other: the identity without
 * GPUPACK_DEVICE_UUID_<i> in the trusted file; with them, the index whose
 * UUID is the device's (cuDeviceGetUuid, asked once per device and
 * cached), or GP_DEV_NONE (no such index, or the driver cannot say): no
 * memory for that device. */
#define GP_DEV_NONE (-1)
int gp_dev_resolve(int dev); /* the slow path: asks the driver, caches */
static inline int gp_dev_index(int dev);
/* The memory limit of CUdevice dev (0 for GP_DEV_NONE) and the SM limit
 * (the tightest in the file while the device cannot be mapped yet). */
static inline uint64_t gp_mem_limit(int dev);
int gp_sm_limit(int dev);
/* The limits index of an NVML device (by nvmlDeviceGetUUID in UUID
 * mode, by its NVML index otherwise), and a CUdevice this process mapped
 * to index i (-1 if none). */
int gp_nvml_index(nvmlDevice_t d);
int gp_index_dev(int i);
uint64_t gp_index_used(int i); /* what the container holds on index i */
/* Charge `size` bytes on dev against its limit: CUDA_SUCCESS or
 * CUDA_ERROR_OUT_OF_MEMORY. Uncharged devices (no limit) always succeed. */
CUresult gp_charge(int dev, uint64_t size);
void gp_uncharge(int dev, uint64_t size);
/* Charge without a limit check, for memory the driver already holds. */
void gp_charge_force(int dev, uint64_t size);
/* Track an allocation after the driver succeeded (charge already made). */
void gp_track(uint64_t key, int kind, int dev, uint64_t size, uint64_t pool);
/* Forget an allocation; uncharges it. Returns 1 if it was tracked. */
int gp_untrack(uint64_t key, int kind);
/* Forget (and uncharge) every block allocated while ctx was current. */
void gp_untrack_ctx(uint64_t ctx);

/* Memory pools (stream-ordered allocation). A pool keeps memory reserved
 * beyond its live allocations; the container is charged
 * max(reserved, live) per pool: live allocations by size, the rest as
 * "slack", reconciled with the driver's RESERVED_MEM_CURRENT whenever the
 * pool is used, trimmed, or a charge would fail. */
#define GP_RESERVED_UNKNOWN UINT64_MAX
/* VMM: a released handle stays charged while it is still mapped. */
void gp_vmm_mapped(uint64_t va, uint64_t size, uint64_t handle);
void gp_vmm_released(uint64_t handle, int dev, uint64_t size);
void gp_vmm_unmapped(uint64_t va, uint64_t size);
void gp_vmm_reset(void);

void gp_pool_register(uint64_t pool, int dev);
void gp_pool_forget(uint64_t pool);
void gp_pool_reset(void);
int gp_pool_dev(uint64_t pool);
/* Charge an allocation of size from pool on stream (0: a default stream),
 * given the driver's RESERVED_MEM_CURRENT and USED_MEM_CURRENT (either
 * GP_RESERVED_UNKNOWN). Memory the pool holds serves it uncharged only if
 * the driver can really reuse it: idle memory (reserved - used), or blocks
 * freed on this very stream whose free has not run yet (stream order lets
 * the driver reuse those). A block freed on another stream, not yet run,
 * is still in use: the pool would grow, so the request is charged. */
CUresult gp_pool_begin(uint64_t pool, int dev, uint64_t size, uint64_t stream, uint64_t reserved, uint64_t used,
		       uint64_t *taken);
/* A cuMemFreeAsync of size from pool on stream, which the driver runs
 * when the stream gets there. */
void gp_pool_pending(uint64_t pool, uint64_t stream, uint64_t size);
void gp_pool_end(uint64_t pool, int dev, uint64_t size, uint64_t taken, int ok, uint64_t reserved);
void gp_pool_freed(uint64_t pool, int dev, uint64_t size, uint64_t reserved);
void gp_pool_reconcile(uint64_t pool, int dev, uint64_t reserved);
uint64_t gp_pool_live(uint64_t pool);
int gp_pool_list(int dev, uint64_t *out, int max);
uint64_t gp_used(int dev);
static inline int gp_mem_limited(int dev);

/* Array byte sizes as the driver lays them out (estimate; see account.c). */
uint64_t gp_array_bytes(size_t w, size_t h, size_t d, int format, unsigned ch);
uint64_t gp_mipmap_bytes(size_t w, size_t h, size_t d, int format, unsigned ch, unsigned levels);

/* ---- limiter.c --------------------------------------------------------- */

#define GP_RING 512

struct gp_limiter {
	int target;            /* percent; 0 = off */
	pthread_mutex_t mu;
	double rate;           /* cost units per second; 0 = not calibrated */
	double tokens;
	uint64_t last_ns;
	_Atomic uint64_t launched; /* cost admitted since start (cumulative) */
	_Atomic int waited;        /* the rate held a launch back since the last sample */
	/* Control thread only: */
	unsigned long long last_sample_us; /* newest NVML sample seen (wall clock, NVML's stamp) */
	long long clock_off;               /* wall clock - monotonic at the last tick, us */
	int off_known;
	unsigned long long cadence_us;     /* smallest of the recent gaps between samples */
	unsigned long long gaps[8];        /* the last gaps between sample stamps */
	int ngaps;
	double k;                          /* util percent per cost/s; 0 = unknown */
	int k_bound;                       /* k is an upper bound from a 0 % sample (limiter.c learn_bound) */
	double floor;                      /* the rate is never set below this */
	int ring_n, ring_i;                /* (monotonic time, cumulative cost) per tick */
	struct {
		unsigned long long us;
		uint64_t cum;
	} ring[GP_RING];
	/* Duty-cycle mode (NVML not trusted, limits from the trusted file):
	 * launches pass for target % of each period, then wait until the
	 * device ran them and stay off for the rest (limiter.c). */
	int duty;
	uint64_t on_start, off_until;
	int in_duty; /* the duty cycle paced the last launch (its phase is current) */
	/* Issue 15 H3(b): until the first calibration, and while this
	 * process's utilisation cannot be told from its neighbours' (host pid
	 * unknown, device shared), the same duty cycle paces launches. */
	_Atomic int unknown;  /* the last sample could not be attributed */
	int said_uncal, said_unknown;
	/* Issue 15 H1/H2: the budget, in device time. It grows by target % of
	 * the wall time (each tick, up to a cap) and shrinks by what NVML says
	 * the container's processes ran; no launch passes while it is
	 * negative. The container's (review 15), in the shared region for the
	 * device's limits index; `local` only for a device with no index. */
	struct gp_sm_budget *_Atomic budget;
	struct gp_sm_budget local;
	_Atomic uint64_t last_launch_ns; /* the last launch admitted (monotonic) */
	double u_prev;        /* control thread: our utilisation in the last sample */
	unsigned long long poll_rt; /* control thread: wall clock of the last NVML poll, us */
};

void gp_limiter_setup(void);
/* 0, or CUDA_ERROR_NOT_PERMITTED: the launch is refused (limiter.c). */
int gp_limiter_admit(int dev, uint64_t cost);
/* The contexts this process holds per device, for the duty cycle's
 * synchronisation (review 15: it waited for the current context only). */
#define GP_MAX_CTX 64
void gp_ctx_register(int dev, CUcontext c);
void gp_ctx_forget(CUcontext c);
/* Host pid resolution around context creation (HAMi-core's method): the
 * NVML process list before and after; one new pid = ours. */
struct gp_pidsnap {
	int ok;
	unsigned n;
	nvmlProcessInfo_t *procs; /* malloc'd; gp_hostpid_after frees it */
};
void gp_hostpid_before(int dev, struct gp_pidsnap *s);
void gp_hostpid_after(int dev, struct gp_pidsnap *s, int created);
/* This process's device memory on dev as NVML reports it (contexts
 * included): 0 on success, -1 when it cannot be known. */
int gp_proc_mem(int dev, uint64_t *out);

/* ---- the state --------------------------------------------------------- */

#define GP_MAX_POOLS 256

struct gp_pools {
	pthread_mutex_t mu; /* pool calls are rare next to plain allocations */
	int n;
	struct {
		uint64_t pool;
		int dev;
		uint64_t live;  /* bytes of live allocations from the pool (ours) */
		uint64_t slack; /* charged beyond live: reserved - live, last we knew */
		/* Bytes freed in stream order whose free may not have run, per
		 * stream (a few streams; the rest pooled under UINT64_MAX, which
		 * no stream matches). Cleared when the driver's used figure
		 * shows no free pending. */
		struct {
			uint64_t stream, bytes;
		} pend[8];
		int npend;
	} e[GP_MAX_POOLS];
};

struct gp_vmm_map {
	uint64_t va, size, handle;
};
struct gp_vmm_deferred {
	uint64_t handle, size;
	int dev;
};
struct gp_vmm {
	pthread_mutex_t mu;
	struct gp_vmm_map *maps;        /* live cuMemMap ranges */
	size_t nmaps, capmaps;
	struct gp_vmm_deferred *deferred; /* released handles still mapped */
	size_t ndeferred, capdeferred;
};

typedef CUresult (*gp_fn_ctxgetdevice)(CUdevice *);
typedef CUresult (*gp_fn_ctxgetcurrent)(CUcontext *);
typedef nvmlReturn_t (*gp_fn_nvml_index)(nvmlDevice_t, unsigned int *);
typedef nvmlReturn_t (*gp_fn_nvml_procutil)(nvmlDevice_t, nvmlProcessUtilizationSample_t *,
					   unsigned int *, unsigned long long);
typedef nvmlReturn_t (*gp_fn_nvml_util)(nvmlDevice_t, nvmlUtilization_t *);
typedef nvmlReturn_t (*gp_fn_nvml_byuuid)(const char *, nvmlDevice_t *);
typedef nvmlReturn_t (*gp_fn_nvml_init)(void);
typedef nvmlReturn_t (*gp_fn_nvml_procs)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);
typedef nvmlReturn_t (*gp_fn_nvml_migmode)(nvmlDevice_t, unsigned int *, unsigned int *);
typedef CUresult (*gp_fn_pool_attr)(CUmemoryPool, int, void *);
typedef CUresult (*gp_fn_dev_pool)(CUmemoryPool *, CUdevice);
typedef CUresult (*gp_fn_pool_trim)(CUmemoryPool, size_t);

struct gp_state {
	pthread_once_t once;
	_Atomic int ready;
	struct gp_config cfg;
	void *(*real_dlsym)(void *, const char *);
	void *libcuda;
	void *libnvml;
	gp_fn_ctxgetdevice ctx_get_device;
	gp_fn_ctxgetcurrent ctx_get_current;
	_Atomic uint64_t primary_ctx[GP_MAX_DEV]; /* as returned by cuDevicePrimaryCtxRetain */
	gp_fn_pool_attr pool_get_attr;    /* cuMemPoolGetAttribute */
	gp_fn_dev_pool dev_get_mempool;   /* cuDeviceGetMemPool */
	gp_fn_pool_trim pool_trim;        /* cuMemPoolTrimTo (the driver's) */
	gp_fn_nvml_index nvml_index;
	gp_fn_nvml_procutil nvml_procutil;
	gp_fn_nvml_util nvml_util;
	gp_fn_nvml_byuuid nvml_byuuid;   /* nvmlDeviceGetHandleByUUID: the limiter's NVML device of a CUdevice */
	/* The limiter's NVML handle per CUdevice: 0 not looked up yet, 1 none
	 * (fail closed), else handle + 2 (handles are pointers). */
	_Atomic uintptr_t nvml_dev[GP_MAX_DEV];
	_Atomic int nvml_dev_mig[GP_MAX_DEV]; /* found by a MIG- UUID: a MIG instance */
	gp_fn_nvml_init nvml_init;
	gp_fn_nvml_procs nvml_procs;     /* nvmlDeviceGetComputeRunningProcesses_v3 */
	gp_fn_nvml_migmode nvml_migmode; /* nvmlDeviceGetMigMode */
	pthread_once_t nvml_sym_once;    /* the limiter's NVML symbols */
	int nvml_ok;
	int nvml_untrusted;              /* limits from the file, no trusted NVML: duty cycle */
	CUresult (*ctx_sync)(void);      /* cuCtxSynchronize (the driver's), for the duty cycle */
	CUresult (*stream_get_ctx)(CUstream, CUcontext *); /* a stream's device (issue 15 M3) */
	CUresult (*ctx_push)(CUcontext);
	CUresult (*ctx_pop)(CUcontext *);
	_Atomic unsigned host_pid;       /* this process as NVML numbers it; 0 = unknown */
	_Atomic int host_pid_tried;
	unsigned host_cands[8];          /* ambiguous resolution: one of these */
	_Atomic int host_ncands;
	_Atomic int host_probes;         /* memory probes tried */
	CUresult (*mem_alloc)(CUdeviceptr *, size_t); /* the driver's, for the probe */
	CUresult (*mem_free)(CUdeviceptr);
	CUresult (*ctx_destroy)(CUcontext);          /* undo a context over the limit */
	CUresult (*primary_release)(CUdevice);
	CUresult (*ctx_get_limit)(size_t *, CUlimit);
	CUresult (*dev_get_attr)(int *, int, CUdevice);
	CUresult (*dev_total_mem)(size_t *, CUdevice); /* cuDeviceTotalMem_v2 (the driver's): NVML's per-process figures' bound */
	struct gp_region_handle region;
	struct gp_table table;
	/* gp_dev_index's cache per CUdevice: 0 not asked yet, index + 1, or
	 * GP_DEV_NONE. Kept across fork (same driver, same environment). */
	_Atomic int dev_index[GP_MAX_DEV];
	CUresult (*dev_get_uuid)(CUuuid *, CUdevice); /* cuDeviceGetUuid_v2, else cuDeviceGetUuid */
	nvmlReturn_t (*nvml_uuid)(nvmlDevice_t, char *, unsigned int); /* nvmlDeviceGetUUID */
	_Atomic int primary_refs[GP_MAX_DEV];
	uint64_t primary_charge[GP_MAX_DEV]; /* what the primary context is charged */
	_Atomic int ctx_live[GP_MAX_DEV];    /* contexts this process holds on dev */
	_Atomic uint64_t ctxs[GP_MAX_DEV][GP_MAX_CTX]; /* which (0: free entry); gp_ctx_register */
	_Atomic int ctxs_full;                /* one was not recorded (logged once) */
	_Atomic int ctx_ever[GP_MAX_DEV];    /* it has created one on dev */
	_Atomic int sm_active; /* any device throttled: launches take the slow path */
	struct gp_limiter lim[GP_MAX_DEV];
	struct gp_pools pools;
	struct gp_vmm vmm;
	pthread_mutex_t primary_mu; /* primary-context refcounts and reserve */
	pthread_once_t nvml_once;
	pthread_t limiter_thread;
	_Atomic int limiter_started;
	_Atomic int exited; /* the destructor ran (the region is detached) */
};

extern struct gp_state gp;

void gp_init(void); /* idempotent; cheap after the first call */

static inline int gp_dev_index(int dev)
{
	if (!gp.cfg.uuid_set)
		return dev >= 0 && dev < GP_MAX_DEV ? dev : GP_DEV_NONE;
	if (dev < 0 || dev >= GP_MAX_DEV)
		return GP_DEV_NONE;
	int v = atomic_load_explicit(&gp.dev_index[dev], memory_order_relaxed);
	return v > 0 ? v - 1 : v < 0 ? GP_DEV_NONE : gp_dev_resolve(dev);
}

static inline uint64_t gp_mem_limit(int dev)
{
	int i = gp_dev_index(dev);
	return i < 0 ? 0 : gp.cfg.mem_limit[i];
}

/* Without UUIDs, a device beyond GP_MAX_DEV is not limited (as ever);
 * with them, every device that is not in the file is (to 0 bytes). */
static inline int gp_mem_limited(int dev)
{
	if (!gp.cfg.uuid_set && (dev < 0 || dev >= GP_MAX_DEV))
		return 0;
	if (dev < 0)
		return 0; /* no device (no context): the driver refuses it */
	return gp_mem_limit(dev) != GP_UNLIMITED;
}

static inline uint64_t gp_now_ns(void);
#include <time.h>
static inline uint64_t gp_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#endif
