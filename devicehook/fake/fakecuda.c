/*
 * A fake libcuda.so.1 for tests on machines without a GPU. It is a real
 * shared library loaded by the real dynamic linker, so LD_PRELOAD,
 * /etc/ld.so.preload, dlsym and cuGetProcAddress behave as with the driver.
 *
 *  - Memory is host memory (malloc, or mmap MAP_NORESERVE for big blocks;
 *    MAP_32BIT for the legacy 32-bit entry points). Every device has
 *    FAKECUDA_MEM bytes (default 16 GiB) of "physical" memory.
 *  - Memory pools (cuMemAllocAsync, cuMemAllocFromPoolAsync) reserve device
 *    memory in POOL_GRANULE steps and keep it after frees until
 *    cuMemPoolTrimTo, like a pool with an unbounded release threshold.
 *  - Kernels run on a simulated device clock: a device is a serial queue
 *    whose busy-until time lives in FAKECUDA_STATE (a file shared by the
 *    processes of a test, or private). A launch of g blocks of function
 *    "k<N>" occupies the device for g*N ns. The launch queue holds
 *    QUEUE_NS of work; a launch beyond it blocks, as the real driver does.
 *    Each process's device time is also kept in BUCKET_NS buckets (a ring
 *    of NBUCKET), so the fake NVML can report what ran in any past window
 *    of the last second or two, as the real one samples it.
 *  - Processes are numbered as a host would: FAKECUDA_PID_OFFSET (per
 *    process, default 0) is added to getpid() wherever NVML reports a pid,
 *    as for a container in its own pid namespace.
 *  - A context costs FAKECUDA_CTX_MEM bytes of device memory (default 0,
 *    the idealised driver older tests assume; real ones cost 300-600 MiB),
 *    taken at creation (a primary context: at its first retain) and given
 *    back at destruction.
 *  - Live contexts per process and device are counted in the shared state
 *    (nvmlDeviceGetComputeRunningProcesses lists them).
 *  - FAKECUDA_CTX_TWINS=n: when this process creates its first context on
 *    a device, n other processes (host pids 900000 + 16*slot + i) create
 *    theirs at the same instant, as on a node where several containers
 *    start at once, so NVML's process list names n+1 new pids. With
 *    FAKECUDA_TWIN_ECHO=k the twins' memory also moves with each of this
 *    process's first k allocations (and their frees), so a probe by memory
 *    is ambiguous k times.
 *  - Streams (cuStreamCreate) belong to the context current at creation,
 *    and so to its device: cuMemAllocAsync serves a stream from its own
 *    device's pool, whatever context is current.
 *  - Stream-ordered frees (cuMemFreeAsync of a pool block) happen when the
 *    device reaches them, as with the real driver: when everything queued
 *    on the device before the call has run (the simulated clock). Until
 *    then the block stays in use by the pool (USED_MEM_CURRENT), so an
 *    allocation on another stream makes the pool grow; one on the same
 *    stream reuses it, in stream order. A synchronisation (cuStreamSynchronize,
 *    cuCtxSynchronize) waits for the device and so for the frees.
 *    FAKECUDA_QUEUE_NS sets how much work the launch queue holds (default
 *    50 ms) before a launch blocks.
 *  - cuGetProcAddress hands out versioned ABIs like the driver, and
 *    distinct functions for per-thread-default-stream (_ptsz) requests.
 *  - CUDA_VISIBLE_DEVICES picks and orders the FAKECUDA_DEVICES physical
 *    devices as the driver does: a comma list of physical indices or
 *    UUIDs, cut at the first entry that is not one (or repeats one);
 *    CUdevice i is then the i-th of the list. cuDeviceGetUuid[_v2] gives
 *    physical device p the UUID GPU-fa4e0000-0000-4000-8000-0000000000<p,
 *    two hex digits>, or the p-th of FAKECUDA_UUIDS (comma-separated; the
 *    GPUs a container runtime exposed, as integration tests model them).
 *    The simulated clock, each process's device time, its contexts and
 *    its NVML-visible memory are kept per physical device (PH), and the
 *    fake NVML numbers physical devices in their own order, as the real
 *    one numbers GPUs in PCI order: under a reordered CUDA_VISIBLE_DEVICES
 *    a CUDA ordinal is not an NVML index (review 15). The driver-side
 *    memory counters (fakecuda_used) stay per CUdevice of the process.
 *  - fakecuda_* functions expose counters to tests.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "../src/cuda_types.h"

#define EXPORT __attribute__((visibility("default")))
#define MAXDEV 8
#define MAXPROC 256
#define QUEUE_NS 50000000ull
#define HDR 64

struct fake_ctx {
	int dev;
	int primary;
	uint64_t limit[5]; /* CUlimit stack (per thread), printf FIFO, malloc heap, sync depth, pending launches */
	_Atomic uint64_t done_at; /* when the last work queued from this context ends (FAKECUDA_CTX_SYNC) */
};

/* An H100's worth of resident threads: the stack limit is reserved for each. */
#define FAKE_SMS 132
#define FAKE_THREADS_PER_SM 2048
static const uint64_t limit_default[5] = {1024, 1 << 20, 8 << 20, 2, 2048};

#define POOL_GRANULE (32ull << 20)

struct fake_pending {
	void *q;          /* the block */
	uint64_t exec_at; /* device time at which the stream reaches the free */
	uint64_t stream;  /* 0: the default stream */
};
#define MAXPEND 256

struct fake_pool {
	int dev;
	pthread_mutex_t mu;
	uint64_t reserved, live; /* live includes blocks whose free has not run yet */
	struct fake_pending pend[MAXPEND];
	int npend;
	int destroyed; /* cuMemPoolDestroy with blocks outstanding: released at the last free */
	int host;      /* a host-located pool: pinned host memory, no device bytes */
};
static struct fake_pool default_pool[MAXDEV];


#define BUCKET_NS 1000000ull
#define NBUCKET 2048

struct bucket {
	_Atomic uint64_t epoch; /* absolute bucket number; stale when != expected */
	_Atomic uint64_t ns;
};

struct clock_state {
	_Atomic uint64_t busy_until[MAXDEV];
	struct {
		_Atomic uint64_t pid;
		_Atomic uint64_t busy[MAXDEV];
		_Atomic uint64_t hostpid;
		_Atomic int64_t ctxs[MAXDEV]; /* live contexts on each device */
		_Atomic int64_t mem[MAXDEV];  /* device bytes this process holds */
	} proc[MAXPROC];
	struct bucket buckets[MAXPROC][MAXDEV][NBUCKET];
};

static struct {
	pthread_once_t once;
	int ndev;
	uint64_t mem;
	_Atomic uint64_t used[MAXDEV];
	_Atomic uint64_t alloc_calls;
	struct fake_ctx primary[MAXDEV];
	_Atomic int primary_refs[MAXDEV];
	struct clock_state *clk;
	int myproc;
	int phys[MAXDEV]; /* CUdevice -> physical device (CUDA_VISIBLE_DEVICES) */
	int nphys;        /* physical devices (FAKECUDA_DEVICES) */
	char uuid[MAXDEV][48]; /* of each physical device */
} F = {.once = PTHREAD_ONCE_INIT};

/* The shared clock state (busy_until, per-process busy, contexts, memory,
 * buckets) is kept per physical device, as a real device is one whatever
 * each process's CUDA_VISIBLE_DEVICES calls it; the fake NVML numbers
 * devices physically too (PCI order), so a CUDA ordinal is not an NVML
 * index under a reordered CUDA_VISIBLE_DEVICES. */
#define PH(d) ((d) >= 0 && (d) < MAXDEV ? F.phys[(d)] : (d))

static __thread struct fake_ctx *cur;
static __thread struct fake_ctx *ctx_stack[16];
static __thread int ctx_depth;

struct fake_stream {
	int dev;
	struct fake_ctx *ctx;
};

static uint64_t queue_ns(void)
{
	const char *v = getenv("FAKECUDA_QUEUE_NS");
	return v ? strtoull(v, NULL, 10) : QUEUE_NS;
}

/* NULL, CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2) are the current
 * context's default streams. */
static struct fake_stream *stream_of(CUstream s)
{
	return (uintptr_t)s <= 2 ? NULL : (struct fake_stream *)s;
}
static uint64_t stream_id(CUstream s) { return stream_of(s) ? (uint64_t)(uintptr_t)s : 0; }

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void fake_init(void)
{
	const char *v = getenv("FAKECUDA_DEVICES");
	F.ndev = v ? atoi(v) : 2;
	if (F.ndev < 1 || F.ndev > MAXDEV)
		F.ndev = 2;
	F.nphys = F.ndev;
	for (int i = 0; i < MAXDEV; i++) {
		F.phys[i] = i;
		snprintf(F.uuid[i], sizeof F.uuid[i], "GPU-fa4e0000-0000-4000-8000-0000000000%02x", i);
	}
	if ((v = getenv("FAKECUDA_UUIDS")) != NULL) {
		char buf[512];
		snprintf(buf, sizeof buf, "%s", v);
		int i = 0;
		for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && i < MAXDEV; t = strtok_r(NULL, ",", &save))
			snprintf(F.uuid[i++], sizeof F.uuid[0], "%s", t);
	}
	if ((v = getenv("CUDA_VISIBLE_DEVICES")) != NULL) {
		int n = 0, nphys = F.ndev, seen = 0;
		char buf[512];
		snprintf(buf, sizeof buf, "%s", v);
		for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && n < MAXDEV; t = strtok_r(NULL, ",", &save)) {
			char *end;
			long p = strtol(t, &end, 10);
			if (end == t || *end != '\0') {
				p = -1;
				for (int q = 0; q < nphys; q++)
					if (!strcasecmp(t, F.uuid[q]))
						p = q;
			}
			if (p < 0 || p >= nphys || (seen & (1 << p)))
				break;
			seen |= 1 << p;
			F.phys[n++] = (int)p;
		}
		F.ndev = n;
	}
	v = getenv("FAKECUDA_MEM");
	F.mem = v ? strtoull(v, NULL, 10) : (16ull << 30);
	for (int i = 0; i < MAXDEV; i++) {
		F.primary[i] = (struct fake_ctx){i, 1, {limit_default[0], limit_default[1], limit_default[2], limit_default[3], limit_default[4]}, 0};
		default_pool[i].dev = i;
		pthread_mutex_init(&default_pool[i].mu, NULL);
	}
	void *m = MAP_FAILED;
	v = getenv("FAKECUDA_STATE");
	if (v && *v) {
		int fd = open(v, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
		if (fd >= 0 && ftruncate(fd, sizeof(struct clock_state)) == 0)
			m = mmap(NULL, sizeof(struct clock_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (fd >= 0)
			close(fd);
	}
	if (m == MAP_FAILED)
		m = mmap(NULL, sizeof(struct clock_state), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	F.clk = m;
	F.myproc = -1;
}

static void init(void) { pthread_once(&F.once, fake_init); }

static int proc_slot(void)
{
	uint64_t pid = (uint64_t)getpid();
	if (F.myproc >= 0 && atomic_load(&F.clk->proc[F.myproc].pid) == pid)
		return F.myproc;
	const char *off = getenv("FAKECUDA_PID_OFFSET");
	uint64_t host = pid + (off ? strtoull(off, NULL, 10) : 0);
	for (int i = 0; i < MAXPROC; i++) {
		uint64_t z = 0;
		if (atomic_load(&F.clk->proc[i].pid) == pid ||
		    atomic_compare_exchange_strong(&F.clk->proc[i].pid, &z, pid)) {
			atomic_store(&F.clk->proc[i].hostpid, host);
			F.myproc = i;
			return i;
		}
	}
	return -1;
}

#define MAXTWIN 8
static int twin_slot[MAXDEV][MAXTWIN], ntwin[MAXDEV];
static _Atomic int twin_echoed;

static long env_long(const char *k)
{
	const char *v = getenv(k);
	return v ? atol(v) : 0;
}

/* FAKECUDA_CTX_TWINS: other processes that created a context together
 * with our first one on dev. They stay for this process's lifetime. */
static void twins_start(int dev)
{
	long n = env_long("FAKECUDA_CTX_TWINS");
	int me = proc_slot();
	for (long t = 0; t < n && t < MAXTWIN && me >= 0 && ntwin[dev] < MAXTWIN; t++)
		for (int i = 0; i < MAXPROC; i++) {
			/* The twin's "pid" is our parent's (alive, never a fake user). */
			uint64_t z = 0, pp = (uint64_t)getppid();
			if (!atomic_compare_exchange_strong(&F.clk->proc[i].pid, &z, pp))
				continue;
			atomic_store(&F.clk->proc[i].hostpid, 900000 + 16 * (uint64_t)me + (uint64_t)t);
			atomic_store(&F.clk->proc[i].ctxs[PH(dev)], 1);
			twin_slot[dev][ntwin[dev]++] = i;
			break;
		}
}

static void proc_mem(int dev, int64_t delta)
{
	int s = proc_slot();
	if (s < 0 || dev < 0 || dev >= MAXDEV)
		return;
	/* The twins first: a reader that sees our growth sees theirs. */
	if (ntwin[dev] > 0) {
		long k = env_long("FAKECUDA_TWIN_ECHO");
		int echo = delta > 0 ? atomic_fetch_add(&twin_echoed, 1) < k : 1;
		for (int t = 0; t < ntwin[dev] && echo; t++) {
			_Atomic int64_t *m = &F.clk->proc[twin_slot[dev][t]].mem[PH(dev)];
			if (delta > 0 || atomic_load(m) >= -delta)
				atomic_fetch_add(m, delta);
		}
	}
	atomic_fetch_add(&F.clk->proc[s].mem[PH(dev)], delta);
}

static int dev_take(int dev, uint64_t size);

static uint64_t ctx_mem(void)
{
	const char *v = getenv("FAKECUDA_CTX_MEM");
	return v ? strtoull(v, NULL, 10) : 0;
}

static void ctx_count(int dev, int delta)
{
	int s = proc_slot();
	if (s >= 0 && dev >= 0 && dev < MAXDEV && atomic_fetch_add(&F.clk->proc[s].ctxs[PH(dev)], delta) == 0 && delta > 0 &&
	    ntwin[dev] == 0)
		twins_start(dev);
}

/* Adds [start, end) of device time to this process's buckets. */
static void bucket_add(int s, int dev, uint64_t start, uint64_t end)
{
	for (uint64_t b = start / BUCKET_NS; b * BUCKET_NS < end; b++) {
		uint64_t lo = b * BUCKET_NS > start ? b * BUCKET_NS : start;
		uint64_t hi = (b + 1) * BUCKET_NS < end ? (b + 1) * BUCKET_NS : end;
		struct bucket *k = &F.clk->buckets[s][PH(dev)][b % NBUCKET];
		uint64_t e = atomic_load(&k->epoch);
		if (e != b && atomic_compare_exchange_strong(&k->epoch, &e, b))
			atomic_store(&k->ns, 0);
		atomic_fetch_add(&k->ns, hi - lo);
	}
}

/* ---- test introspection -------------------------------------------------- */

EXPORT uint64_t fakecuda_used(int dev) { init(); return dev >= 0 && dev < MAXDEV ? atomic_load(&F.used[dev]) : 0; }
EXPORT uint64_t fakecuda_alloc_calls(void) { return atomic_load(&F.alloc_calls); }
EXPORT uint64_t fakecuda_mem(void) { init(); return F.mem; }
EXPORT int fakecuda_ndev(void) { init(); return F.ndev; }
/* The UUID string of CUdevice ord (the fake NVML's device ord). */
EXPORT int fakecuda_uuid(int ord, char *out, unsigned n)
{
	init();
	if (ord < 0 || ord >= F.ndev || n == 0)
		return -1;
	snprintf(out, n, "%s", F.uuid[F.phys[ord]]);
	return 0;
}

/* Device time each process had on dev in [from, to) (monotonic ns, within
 * the last NBUCKET buckets), with its host pid; only live processes that
 * had some. For the fake NVML. */
EXPORT int fakecuda_window(int dev, uint64_t from, uint64_t to, uint64_t *hostpids, uint64_t *busy, int max)
{
	init();
	int n = 0;
	for (int i = 0; i < MAXPROC && n < max; i++) {
		uint64_t p = atomic_load(&F.clk->proc[i].pid);
		if (p == 0 || (kill((pid_t)p, 0) != 0 && errno == ESRCH))
			continue;
		uint64_t sum = 0;
		for (uint64_t b = from / BUCKET_NS; b < to / BUCKET_NS; b++) {
			struct bucket *k = &F.clk->buckets[i][dev][b % NBUCKET];
			if (atomic_load(&k->epoch) == b)
				sum += atomic_load(&k->ns);
		}
		if (sum == 0)
			continue;
		hostpids[n] = atomic_load(&F.clk->proc[i].hostpid);
		busy[n] = sum;
		n++;
	}
	return n;
}

/* Live processes with a context on dev, by host pid, with the device
 * memory each holds. */
EXPORT int fakecuda_ctx_procs(int dev, uint64_t *hostpids, uint64_t *mem, int max)
{
	init();
	int n = 0;
	for (int i = 0; i < MAXPROC && n < max; i++) {
		uint64_t p = atomic_load(&F.clk->proc[i].pid);
		if (p == 0 || atomic_load(&F.clk->proc[i].ctxs[dev]) <= 0 || (kill((pid_t)p, 0) != 0 && errno == ESRCH))
			continue;
		int64_t m = atomic_load(&F.clk->proc[i].mem[dev]);
		mem[n] = m > 0 ? (uint64_t)m : 0;
		hostpids[n++] = atomic_load(&F.clk->proc[i].hostpid);
	}
	return n;
}
/* Cumulative simulated busy ns of every process that launched on dev. */
static int busy_of(int p, uint64_t *pids, uint64_t *busy, int max)
{
	int n = 0;
	for (int i = 0; i < MAXPROC && n < max && p >= 0 && p < MAXDEV; i++) {
		uint64_t pid = atomic_load(&F.clk->proc[i].pid);
		if (pid == 0)
			continue;
		pids[n] = pid;
		busy[n] = atomic_load(&F.clk->proc[i].busy[p]);
		n++;
	}
	return n;
}
/* Of CUdevice dev (tests), and of physical device p (the fake NVML). */
EXPORT int fakecuda_busy(int dev, uint64_t *pids, uint64_t *busy, int max)
{
	init();
	return busy_of(PH(dev), pids, busy, max);
}
EXPORT int fakecuda_busy_phys(int p, uint64_t *pids, uint64_t *busy, int max)
{
	init();
	return busy_of(p, pids, busy, max);
}

/* For the fake NVML, which numbers the FAKECUDA_DEVICES physical devices
 * in their own order: how many, each one's UUID, what this process holds
 * on it (0 when it does not see it). */
EXPORT int fakecuda_nphys(void) { init(); return F.nphys; }
EXPORT int fakecuda_uuid_phys(int p, char *out, unsigned n)
{
	init();
	if (p < 0 || p >= F.nphys || n == 0)
		return -1;
	snprintf(out, n, "%s", F.uuid[p]);
	return 0;
}
EXPORT uint64_t fakecuda_used_phys(int p)
{
	init();
	for (int c = 0; c < F.ndev; c++)
		if (F.phys[c] == p)
			return atomic_load(&F.used[c]);
	return 0;
}

/* ---- device, context ------------------------------------------------------ */

EXPORT CUresult cuInit(unsigned int flags) { (void)flags; init(); return CUDA_SUCCESS; }
EXPORT CUresult cuDriverGetVersion(int *v) { *v = 13000; return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGetCount(int *n) { init(); *n = F.ndev; return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGet(CUdevice *d, int ord)
{
	init();
	if (ord < 0 || ord >= F.ndev)
		return CUDA_ERROR_INVALID_VALUE;
	*d = ord;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d)
{
	init();
	if (F.ndev == 0)
		return 100; /* CUDA_ERROR_NO_DEVICE */
	if (d < 0 || d >= F.ndev)
		return 101; /* CUDA_ERROR_INVALID_DEVICE */
	/* The 32 hex digits of "GPU-"/"MIG-" 8-4-4-4-12 (a malformed one: zeros). */
	memset(u->bytes, 0, 16);
	const char *s = F.uuid[F.phys[d]];
	for (int n = 0; *s && n < 32; s++) {
		int x = *s >= '0' && *s <= '9' ? *s - '0' : *s >= 'a' && *s <= 'f' ? *s - 'a' + 10
			: *s >= 'A' && *s <= 'F' ? *s - 'A' + 10 : -1;
		if (x < 0 || (n == 0 && s - F.uuid[F.phys[d]] < 4))
			continue; /* dashes, the prefix */
		u->bytes[n / 2] = (char)(n % 2 ? u->bytes[n / 2] | x : x << 4);
		n++;
	}
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) { return cuDeviceGetUuid_v2(u, d); }
EXPORT CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) { init(); (void)d; *b = F.mem; return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceTotalMem(unsigned int *b, CUdevice d)
{
	init();
	(void)d;
	*b = F.mem > 0xffffffffull ? 0xffffffffu : (unsigned)F.mem;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetDevice(CUdevice *d)
{
	if (cur == NULL)
		return CUDA_ERROR_INVALID_CONTEXT;
	*d = cur->dev;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSetCurrent(CUcontext c) { cur = (struct fake_ctx *)c; return CUDA_SUCCESS; }
EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c)
{
	if (c == NULL || ctx_depth == 16)
		return CUDA_ERROR_INVALID_VALUE;
	ctx_stack[ctx_depth++] = cur;
	cur = (struct fake_ctx *)c;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *c)
{
	if (cur == NULL)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (c)
		*c = (CUcontext)cur;
	cur = ctx_depth > 0 ? ctx_stack[--ctx_depth] : NULL;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetCurrent(CUcontext *c) { *c = (CUcontext)cur; return CUDA_SUCCESS; }
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
	init();
	if (d < 0 || d >= F.ndev)
		return CUDA_ERROR_INVALID_VALUE;
	if (atomic_load(&F.primary_refs[d]) == 0 && ctx_mem() && dev_take(d, ctx_mem()) != 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (atomic_fetch_add(&F.primary_refs[d], 1) == 0)
		ctx_count(d, 1);
	*c = (CUcontext)&F.primary[d];
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d)
{
	if (d < 0 || d >= F.ndev || atomic_load(&F.primary_refs[d]) == 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (atomic_fetch_sub(&F.primary_refs[d], 1) == 1) {
		ctx_count(d, -1);
		atomic_fetch_sub(&F.used[d], ctx_mem());
		proc_mem(d, -(int64_t)ctx_mem());
	}
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) { (void)d; return CUDA_SUCCESS; }
static CUresult ctx_create(CUcontext *c, CUdevice d)
{
	init();
	if (d < 0 || d >= F.ndev)
		return CUDA_ERROR_INVALID_VALUE;
	if (ctx_mem() && dev_take(d, ctx_mem()) != 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	struct fake_ctx *x = malloc(sizeof *x);
	x->dev = d;
	x->primary = 0;
	memcpy(x->limit, limit_default, sizeof x->limit);
	atomic_store(&x->done_at, 0);
	ctx_count(d, 1);
	cur = x;
	*c = (CUcontext)x;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxCreate_v2(CUcontext *c, unsigned f, CUdevice d) { (void)f; return ctx_create(c, d); }
EXPORT CUresult cuCtxCreate_v3(CUcontext *c, void *p, int n, unsigned f, CUdevice d) { (void)p; (void)n; (void)f; return ctx_create(c, d); }
EXPORT CUresult cuCtxCreate_v4(CUcontext *c, void *p, unsigned f, CUdevice d) { (void)p; (void)f; return ctx_create(c, d); }
/* The stack is reserved for every resident thread. The device runtime's
 * limits cost memory too, at rates NVIDIA does not document; the fake's
 * are assumptions (64 bytes of state per resident thread per sync level,
 * 2 KiB per pending launch), there only so that growth costs memory. */
static uint64_t limit_cost(int l, uint64_t v)
{
	switch (l) {
	case 0:
		return v * FAKE_SMS * FAKE_THREADS_PER_SM;
	case 3:
		return v * FAKE_SMS * FAKE_THREADS_PER_SM * 64;
	case 4:
		return v * 2048;
	default:
		return v;
	}
}

/* Growth past the defaults costs device memory (the defaults are part of
 * FAKECUDA_CTX_MEM), as the real driver reserves it. */
EXPORT CUresult cuCtxSetLimit(CUlimit l, size_t v)
{
	if (cur == NULL)
		return CUDA_ERROR_INVALID_CONTEXT;
	if ((int)l < 0 || l > 4)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t o = limit_cost(l, cur->limit[l]), n = limit_cost(l, v);
	if (n > o && dev_take(cur->dev, n - o) != 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (o > n) {
		atomic_fetch_sub(&F.used[cur->dev], o - n);
		proc_mem(cur->dev, -(int64_t)(o - n));
	}
	cur->limit[l] = v;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetLimit(size_t *v, CUlimit l)
{
	if (cur == NULL)
		return CUDA_ERROR_INVALID_CONTEXT;
	if ((int)l < 0 || l > 4 || v == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	*v = cur->limit[l];
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d)
{
	init();
	if (d < 0 || d >= F.ndev || v == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (attr == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
		*v = FAKE_SMS;
	else if (attr == CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)
		*v = FAKE_THREADS_PER_SM;
	else
		return CUDA_ERROR_INVALID_VALUE;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext c)
{
	struct fake_ctx *x = (struct fake_ctx *)c;
	if (x == NULL || x->primary)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (cur == x)
		cur = NULL;
	ctx_count(x->dev, -1);
	atomic_fetch_sub(&F.used[x->dev], ctx_mem());
	proc_mem(x->dev, -(int64_t)ctx_mem());
	free(x);
	return CUDA_SUCCESS;
}

/* ---- memory ---------------------------------------------------------------- */


struct hdr {
	uint64_t size;
	uint64_t maplen; /* 0 = malloc'd */
	struct fake_pool *pool;
	int dev;
	int magic;
};
#define MAGIC 0x6d656d66

/* Device bytes: charged to F.used unless a pool has reserved them. */
static int dev_take(int dev, uint64_t size)
{
	/* Like the real driver, a request larger than the device is refused
	 * outright: no 64-bit wrap-around in the fake's own books. */
	uint64_t used = atomic_load(&F.used[dev]);
	do {
		if (size > F.mem || used > F.mem - size)
			return -1;
	} while (!atomic_compare_exchange_weak(&F.used[dev], &used, used + size));
	proc_mem(dev, (int64_t)size);
	return 0;
}

static void *raw_alloc_in(int dev, uint64_t size, int low32, struct fake_pool *pool)
{
	if (dev < 0 || dev >= F.ndev)
		return NULL;
	if (pool == NULL && dev_take(dev, size) != 0)
		return NULL;
	char *p;
	uint64_t maplen = 0;
#ifndef MAP_32BIT
#define MAP_32BIT 0 /* aarch64 (the cross-built fake): no low mappings */
#endif
	if (size <= (1u << 20) && !low32) {
		p = malloc(size + HDR);
	} else {
		maplen = size + HDR;
		p = mmap(NULL, maplen, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | (low32 ? MAP_32BIT : 0), -1, 0);
		if (p == MAP_FAILED)
			p = NULL;
	}
	if (p == NULL) {
		if (pool == NULL) {
			atomic_fetch_sub(&F.used[dev], size);
			proc_mem(dev, -(int64_t)size);
		}
		return NULL;
	}
	struct hdr *h = (struct hdr *)p;
	*h = (struct hdr){size, maplen, pool, dev, MAGIC};
	return p + HDR;
}

static void *raw_alloc(int dev, uint64_t size, int low32) { return raw_alloc_in(dev, size, low32, NULL); }

static uint64_t round_granule(uint64_t n) { return (n + POOL_GRANULE - 1) / POOL_GRANULE * POOL_GRANULE; }

static CUresult free_block(struct hdr *h);

/* Runs the stream-ordered frees of fp the device has reached, and (for an
 * allocation on `stream`, which is ordered after them) those queued on
 * that stream. */
static void pool_settle(struct fake_pool *fp, int all_of_stream, uint64_t stream)
{ /* all_of_stream 2: every pending free, due or not */
	void *due[MAXPEND];
	int n = 0;
	uint64_t now = now_ns();
	pthread_mutex_lock(&fp->mu);
	for (int i = 0; i < fp->npend;) {
		if (fp->pend[i].exec_at <= now || all_of_stream == 2 || (all_of_stream && fp->pend[i].stream == stream)) {
			due[n++] = fp->pend[i].q;
			fp->pend[i] = fp->pend[--fp->npend];
			continue;
		}
		i++;
	}
	pthread_mutex_unlock(&fp->mu);
	for (int i = 0; i < n; i++)
		free_block((struct hdr *)((char *)due[i] - HDR));
}

static void *pool_alloc(struct fake_pool *fp, uint64_t size)
{
	pthread_mutex_lock(&fp->mu);
	if (fp->live + size > fp->reserved) {
		uint64_t want = round_granule(fp->live + size);
		if (!fp->host && dev_take(fp->dev, want - fp->reserved) != 0) {
			pthread_mutex_unlock(&fp->mu);
			return NULL;
		}
		fp->reserved = want;
	}
	fp->live += size;
	pthread_mutex_unlock(&fp->mu);
	void *q = raw_alloc_in(fp->dev, size, 0, fp);
	if (q == NULL) {
		pthread_mutex_lock(&fp->mu);
		fp->live -= size;
		pthread_mutex_unlock(&fp->mu);
	}
	return q;
}

#define MAGIC_PENDING 0x70656e64 /* freed in stream order, not yet run */

static CUresult raw_free(void *q)
{
	if (q == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	struct hdr *h = (struct hdr *)((char *)q - HDR);
	if (h->magic != MAGIC)
		return CUDA_ERROR_INVALID_VALUE;
	return free_block(h);
}

static CUresult free_block(struct hdr *h)
{
	h->magic = 0;
	if (h->pool) {
		struct fake_pool *fp = h->pool;
		pthread_mutex_lock(&fp->mu);
		fp->live -= h->size; /* stays reserved by the pool */
		int gone = fp->destroyed && fp->live == 0;
		pthread_mutex_unlock(&fp->mu);
		if (gone) {
			if (!fp->host) {
				atomic_fetch_sub(&F.used[fp->dev], fp->reserved);
				proc_mem(fp->dev, -(int64_t)fp->reserved);
			}
			free(fp);
		}
	} else {
		atomic_fetch_sub(&F.used[h->dev], h->size);
		proc_mem(h->dev, -(int64_t)h->size);
	}
	if (h->maplen)
		munmap(h, h->maplen);
	else
		free(h);
	return CUDA_SUCCESS;
}

static CUresult alloc_cur(CUdeviceptr *p, uint64_t size, int low32)
{
	init();
	atomic_fetch_add(&F.alloc_calls, 1);
	if (cur == NULL)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	void *q = raw_alloc(cur->dev, size, low32);
	if (q == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*p = (CUdeviceptr)(uintptr_t)q;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { return alloc_cur(p, n, 0); }
EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *p, unsigned int n)
{
	CUdeviceptr q;
	CUresult rc = alloc_cur(&q, n, 1);
	if (rc == CUDA_SUCCESS)
		*p = (CUdeviceptr_v1)q;
	return rc;
}
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned e)
{
	(void)e;
	*pitch = (w + 511) & ~(size_t)511;
	return alloc_cur(p, (uint64_t)*pitch * h, 0);
}
EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *p, unsigned *pitch, unsigned w, unsigned h, unsigned e)
{
	(void)e;
	*pitch = (w + 511) & ~511u;
	CUdeviceptr q;
	CUresult rc = alloc_cur(&q, (uint64_t)*pitch * h, 1);
	if (rc == CUDA_SUCCESS)
		*p = (CUdeviceptr_v1)q;
	return rc;
}
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned f) { (void)f; return alloc_cur(p, n, 0); }
static CUresult alloc_pool(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s);
static CUresult alloc_async(CUdeviceptr *p, size_t n, CUstream s)
{
	init();
	/* The pool of the stream's device, not the current context's. */
	struct fake_stream *fs = stream_of(s);
	if (fs == NULL && cur == NULL)
		return CUDA_ERROR_INVALID_CONTEXT;
	return alloc_pool(p, n, (CUmemoryPool)&default_pool[fs ? fs->dev : cur->dev], s);
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) { return alloc_async(p, n, s); }
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) { return alloc_async(p, n, s); }

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
	init();
	if (!props)
		return CUDA_ERROR_INVALID_VALUE;
	int host = props->location.type == CU_MEM_LOCATION_TYPE_HOST || props->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA;
	if (!host && (props->location.type != CU_MEM_LOCATION_TYPE_DEVICE || props->location.id >= F.ndev))
		return CUDA_ERROR_INVALID_VALUE;
	struct fake_pool *fp = calloc(1, sizeof *fp);
	fp->dev = host ? 0 : props->location.id;
	fp->host = host;
	pthread_mutex_init(&fp->mu, NULL);
	*pool = (CUmemoryPool)fp;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
	struct fake_pool *fp = (struct fake_pool *)pool;
	pool_settle(fp, 0, 0);
	pthread_mutex_lock(&fp->mu);
	uint64_t want = round_granule(fp->live > keep ? fp->live : keep);
	if (want < fp->reserved) {
		if (!fp->host) {
			atomic_fetch_sub(&F.used[fp->dev], fp->reserved - want);
			proc_mem(fp->dev, -(int64_t)(fp->reserved - want));
		}
		fp->reserved = want;
	}
	pthread_mutex_unlock(&fp->mu);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
	/* As the driver documents: with allocations outstanding the pool's
	 * resources go when the last is freed; the handle is dead at once
	 * (later calls on it are the caller's bug: here they fail). */
	struct fake_pool *fp = (struct fake_pool *)pool;
	pool_settle(fp, 2, 0); /* (simplification: its pending frees run now) */
	pthread_mutex_lock(&fp->mu);
	if (fp->live > 0) {
		uint64_t keep = round_granule(fp->live);
		if (keep < fp->reserved) {
			if (!fp->host) {
				atomic_fetch_sub(&F.used[fp->dev], fp->reserved - keep);
				proc_mem(fp->dev, -(int64_t)(fp->reserved - keep));
			}
			fp->reserved = keep;
		}
		fp->destroyed = 1;
		pthread_mutex_unlock(&fp->mu);
		return CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&fp->mu);
	if (!fp->host) {
		atomic_fetch_sub(&F.used[fp->dev], fp->reserved);
		proc_mem(fp->dev, -(int64_t)fp->reserved);
	}
	free(pool);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value)
{
	struct fake_pool *fp = (struct fake_pool *)pool;
	pthread_mutex_lock(&fp->mu);
	int dead = fp->destroyed;
	pthread_mutex_unlock(&fp->mu);
	if (!dead)
		pool_settle(fp, 0, 0);
	pthread_mutex_lock(&fp->mu);
	if (fp->destroyed) {
		pthread_mutex_unlock(&fp->mu);
		return CUDA_ERROR_INVALID_VALUE;
	}
	uint64_t v = attr == CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT ? fp->reserved
		     : attr == CU_MEMPOOL_ATTR_USED_MEM_CURRENT   ? fp->live
								  : 0;
	pthread_mutex_unlock(&fp->mu);
	*(cuuint64_t *)value = v;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice d)
{
	init();
	if (d < 0 || d >= F.ndev)
		return CUDA_ERROR_INVALID_VALUE;
	*pool = (CUmemoryPool)&default_pool[d];
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice d) { return cuDeviceGetMemPool(pool, d); }
static CUresult alloc_pool(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s)
{
	(void)s;
	init();
	atomic_fetch_add(&F.alloc_calls, 1);
	if (pool == NULL || n == 0)
		return CUDA_ERROR_INVALID_VALUE;
	pool_settle((struct fake_pool *)pool, 1, stream_id(s));
	void *q = pool_alloc((struct fake_pool *)pool, n);
	if (q == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*p = (CUdeviceptr)(uintptr_t)q;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) { return alloc_pool(p, n, pool, s); }
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) { return alloc_pool(p, n, pool, s); }
EXPORT CUresult cuMemFree_v2(CUdeviceptr p) { return raw_free((void *)(uintptr_t)p); }
EXPORT CUresult cuMemFree(CUdeviceptr_v1 p) { return raw_free((void *)(uintptr_t)p); }
/* A pool block is freed when the device reaches the free (everything
 * queued before it has run); other blocks at once. */
static CUresult free_async(CUdeviceptr p, CUstream s)
{
	void *q = (void *)(uintptr_t)p;
	if (q == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	struct hdr *h = (struct hdr *)((char *)q - HDR);
	if (h->magic != MAGIC)
		return CUDA_ERROR_INVALID_VALUE;
	struct fake_pool *fp = h->pool;
	uint64_t at = atomic_load(&F.clk->busy_until[PH(h->dev)]);
	if (fp == NULL || at <= now_ns())
		return free_block(h);
	pthread_mutex_lock(&fp->mu);
	if (fp->npend == MAXPEND) {
		pthread_mutex_unlock(&fp->mu);
		return free_block(h);
	}
	h->magic = MAGIC_PENDING;
	fp->pend[fp->npend++] = (struct fake_pending){q, at, stream_id(s)};
	pthread_mutex_unlock(&fp->mu);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { return free_async(p, s); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return free_async(p, s); }

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n, const CUmemAllocationProp *prop,
			    unsigned long long flags)
{
	(void)flags;
	init();
	atomic_fetch_add(&F.alloc_calls, 1);
	if (!prop || n == 0)
		return CUDA_ERROR_INVALID_VALUE;
	int dev = prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? prop->location.id : F.ndev - 1;
	void *q = raw_alloc(dev, n, 0);
	if (q == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
		atomic_fetch_sub(&F.used[dev], n); /* host memory: not on any device */
		proc_mem(dev, -(int64_t)n);
	}
	*h = (CUmemGenericAllocationHandle)(uintptr_t)q;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return raw_free((void *)(uintptr_t)h); }
/* The fake does not model virtual address ranges: mapping always works. */
EXPORT CUresult cuMemMap(CUdeviceptr va, size_t size, size_t off, CUmemGenericAllocationHandle h, unsigned long long f)
{
	(void)va; (void)size; (void)off; (void)h; (void)f;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuMemUnmap(CUdeviceptr va, size_t size) { (void)va; (void)size; return CUDA_SUCCESS; }

static unsigned fmt_bytes(int f)
{
	switch (f) {
	case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
	case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
	default: return 4;
	}
}
static uint64_t arr_bytes(size_t w, size_t h, size_t d, int f, unsigned ch)
{
	uint64_t row = ((uint64_t)(w ? w : 1) * fmt_bytes(f) * (ch ? ch : 1) + 511) & ~511ull;
	return row * (h ? h : 1) * (d ? d : 1);
}
static CUresult arr_alloc(CUarray *a, uint64_t bytes)
{
	CUdeviceptr p;
	CUresult rc = alloc_cur(&p, bytes, 0);
	if (rc == CUDA_SUCCESS)
		*a = (CUarray)(uintptr_t)p;
	return rc;
}
EXPORT CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d) { return arr_alloc(a, arr_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels)); }
EXPORT CUresult cuArrayCreate(CUarray *a, const CUDA_ARRAY_DESCRIPTOR_v1 *d) { return arr_alloc(a, arr_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels)); }
EXPORT CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d) { return arr_alloc(a, arr_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels)); }
EXPORT CUresult cuArray3DCreate(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d) { return arr_alloc(a, arr_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels)); }
EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *a, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels)
{
	uint64_t sum = 0;
	size_t w = d->Width, h = d->Height, z = d->Depth;
	for (unsigned l = 0; l < levels; l++) {
		sum += arr_bytes(w, h, z, d->Format, d->NumChannels);
		w = w > 1 ? w / 2 : 1;
		h = h > 1 ? h / 2 : h;
		z = z > 1 ? z / 2 : z;
	}
	return arr_alloc((CUarray *)a, sum);
}
EXPORT CUresult cuArrayDestroy(CUarray a) { return raw_free(a); }
EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) { return raw_free(a); }

EXPORT CUresult cuMemGetInfo_v2(size_t *f, size_t *t)
{
	if (cur == NULL)
		return CUDA_ERROR_INVALID_CONTEXT;
	*t = F.mem;
	*f = F.mem - atomic_load(&F.used[cur->dev]);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuMemGetInfo(unsigned int *f, unsigned int *t)
{
	size_t ff, tt;
	CUresult rc = cuMemGetInfo_v2(&ff, &tt);
	if (rc == CUDA_SUCCESS) {
		*f = ff > 0xffffffffull ? 0xffffffffu : (unsigned)ff;
		*t = tt > 0xffffffffull ? 0xffffffffu : (unsigned)tt;
	}
	return rc;
}

/* ---- kernels on the simulated clock --------------------------------------- */

struct fake_func { uint64_t ns_per_block; };
struct fake_graph { uint64_t ns; };

EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image) { (void)image; *m = (CUmodule)(uintptr_t)1; return CUDA_SUCCESS; }
EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
	(void)m;
	struct fake_func *ff = malloc(sizeof *ff);
	ff->ns_per_block = (name && name[0] == 'k') ? strtoull(name + 1, NULL, 10) : 1000;
	*f = (CUfunction)ff;
	return CUDA_SUCCESS;
}

static CUresult run_on_clock(uint64_t ns)
{
	init();
	if (cur == NULL)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (ns == 0)
		return CUDA_SUCCESS; /* an empty kernel takes no device time */
	int dev = cur->dev;
	uint64_t now = now_ns(), bu = atomic_load(&F.clk->busy_until[PH(dev)]), start;
	do {
		start = bu > now ? bu : now;
	} while (!atomic_compare_exchange_weak(&F.clk->busy_until[PH(dev)], &bu, start + ns));
	int s = proc_slot();
	if (s >= 0) {
		atomic_fetch_add(&F.clk->proc[s].busy[PH(dev)], ns);
		bucket_add(s, dev, start, start + ns);
	}
	uint64_t end = start + ns;
	for (uint64_t d = atomic_load(&cur->done_at); d < end && !atomic_compare_exchange_weak(&cur->done_at, &d, end);)
		;
	uint64_t qn = queue_ns();
	if (end > now + qn) {
		uint64_t wait = end - now - qn;
		struct timespec ts = {(time_t)(wait / 1000000000ull), (long)(wait % 1000000000ull)};
		nanosleep(&ts, NULL);
	}
	return CUDA_SUCCESS;
}

static uint64_t fn_ns(CUfunction f) { return f ? ((struct fake_func *)f)->ns_per_block : 1000; }

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz)
{
	return run_on_clock(fn_ns(f) * gx * gy * gz);
}
EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
			       unsigned bz, unsigned sh, CUstream s, void **p, void **e)
{
	(void)bx; (void)by; (void)bz; (void)sh; (void)s; (void)p; (void)e;
	return launch(f, gx, gy, gz);
}
EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
				    unsigned bz, unsigned sh, CUstream s, void **p, void **e)
{
	(void)bx; (void)by; (void)bz; (void)sh; (void)s; (void)p; (void)e;
	return launch(f, gx, gy, gz);
}
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **e)
{
	(void)p; (void)e;
	return launch(f, c->gridDimX, c->gridDimY, c->gridDimZ);
}
EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **p, void **e)
{
	(void)p; (void)e;
	return launch(f, c->gridDimX, c->gridDimY, c->gridDimZ);
}
EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
					  unsigned by, unsigned bz, unsigned sh, CUstream s, void **p)
{
	(void)bx; (void)by; (void)bz; (void)sh; (void)s; (void)p;
	return launch(f, gx, gy, gz);
}
EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
					       unsigned by, unsigned bz, unsigned sh, CUstream s, void **p)
{
	(void)bx; (void)by; (void)bz; (void)sh; (void)s; (void)p;
	return launch(f, gx, gy, gz);
}
/* The legacy launch API (cuFuncSetBlockShape + cuLaunchGrid[Async]),
 * deprecated but exported by CUDA 12 drivers (review 15). */
EXPORT CUresult cuFuncSetBlockShape(CUfunction f, int x, int y, int z) { (void)f; (void)x; (void)y; (void)z; return CUDA_SUCCESS; }
EXPORT CUresult cuLaunch(CUfunction f) { return launch(f, 1, 1, 1); }
EXPORT CUresult cuLaunchGrid(CUfunction f, int w, int h) { return launch(f, (unsigned)w, (unsigned)h, 1); }
EXPORT CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream s) { (void)s; return launch(f, (unsigned)w, (unsigned)h, 1); }
EXPORT CUresult cuGraphCreate(CUgraph *g, unsigned flags) { (void)flags; *g = (CUgraph)(uintptr_t)1; return CUDA_SUCCESS; }
/* A graph executes for FAKECUDA_GRAPH_NS (default 100 us). */
EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags)
{
	(void)g; (void)flags;
	struct fake_graph *fg = malloc(sizeof *fg);
	const char *v = getenv("FAKECUDA_GRAPH_NS");
	fg->ns = v ? strtoull(v, NULL, 10) : 100000;
	*e = (CUgraphExec)fg;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s) { (void)s; return run_on_clock(((struct fake_graph *)e)->ns); }
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream s) { (void)s; return run_on_clock(((struct fake_graph *)e)->ns); }
EXPORT CUresult cuCtxSynchronize(void)
{
	if (cur == NULL)
		return CUDA_ERROR_INVALID_CONTEXT;
	uint64_t bu = atomic_load(&F.clk->busy_until[PH(cur->dev)]), now = now_ns();
	/* FAKECUDA_CTX_SYNC=1 (review 15): as the real driver, wait only for
	 * the work queued from this context, not for the whole device. */
	if (getenv("FAKECUDA_CTX_SYNC"))
		bu = atomic_load(&cur->done_at);
	if (bu > now) {
		struct timespec ts = {(time_t)((bu - now) / 1000000000ull), (long)((bu - now) % 1000000000ull)};
		nanosleep(&ts, NULL);
	}
	/* The device's default pool has the driver's default release threshold
	 * (0): at a synchronisation it gives back what it holds beyond its live
	 * blocks. (Pools made with cuMemPoolCreate keep theirs, as with a high
	 * threshold, until cuMemPoolTrimTo.) */
	cuMemPoolTrimTo((CUmemoryPool)&default_pool[cur->dev], 0);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamCreate(CUstream *s, unsigned flags)
{
	(void)flags;
	if (cur == NULL)
		return CUDA_ERROR_INVALID_CONTEXT;
	struct fake_stream *fs = malloc(sizeof *fs);
	fs->dev = cur->dev;
	fs->ctx = cur;
	*s = (CUstream)fs;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamDestroy_v2(CUstream s)
{
	free(stream_of(s));
	return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamGetCtx(CUstream s, CUcontext *c)
{
	struct fake_stream *fs = stream_of(s);
	if (fs == NULL && cur == NULL)
		return CUDA_ERROR_INVALID_CONTEXT;
	*c = (CUcontext)(fs ? fs->ctx : cur);
	return CUDA_SUCCESS;
}
/* The fake's device is one serial queue: a stream is done when the device is. */
EXPORT CUresult cuStreamSynchronize(CUstream s)
{
	struct fake_stream *fs = stream_of(s);
	if (fs == NULL && cur == NULL)
		return CUDA_ERROR_INVALID_CONTEXT;
	int dev = fs ? fs->dev : cur->dev;
	uint64_t bu = atomic_load(&F.clk->busy_until[PH(dev)]), now = now_ns();
	if (bu > now) {
		struct timespec ts = {(time_t)((bu - now) / 1000000000ull), (long)((bu - now) % 1000000000ull)};
		nanosleep(&ts, NULL);
	}
	cuMemPoolTrimTo((CUmemoryPool)&default_pool[dev], 0);
	return CUDA_SUCCESS;
}

/* A newer ABI than the hook knows (as a future driver may add): the
 * table hands it out from version 13020. */
EXPORT CUresult cuMemGetInfo_v3(size_t *f, size_t *t, unsigned int flags)
{
	(void)flags;
	return cuMemGetInfo_v2(f, t);
}

/* Another: an allocation ABI from 13020 (issue 15 M6: the hook must not
 * hand out what it cannot charge). */
EXPORT CUresult cuMemAlloc_v3(CUdeviceptr *d, size_t size, unsigned int flags)
{
	(void)flags;
	return cuMemAlloc_v2(d, size);
}

/* And a legacy launch ABI from 13020 (review 15: an unknown ABI of a
 * launch must not be handed out under an SM limit). */
EXPORT CUresult cuLaunchGrid_v2(CUfunction f, int w, int h, unsigned int flags)
{
	(void)flags;
	return launch(f, (unsigned)w, (unsigned)h, 1);
}

/* ---- cuGetProcAddress ----------------------------------------------------- */

struct pa {
	const char *name;
	int minver;
	int ptsz;
	void *fn;
};
#define E(n, v, f) {n, v, 0, (void *)f}
#define P(n, v, f) {n, v, 1, (void *)f}
EXPORT CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
EXPORT CUresult cuGetProcAddress(const char *, void **, int, cuuint64_t);
static const struct pa table[] = {
	E("cuInit", 2000, cuInit), E("cuDriverGetVersion", 2020, cuDriverGetVersion),
	E("cuDeviceGet", 2000, cuDeviceGet), E("cuDeviceGetCount", 2000, cuDeviceGetCount),
	E("cuDeviceGetUuid", 9020, cuDeviceGetUuid), E("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
	E("cuDeviceTotalMem", 2000, cuDeviceTotalMem), E("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
	E("cuCtxGetDevice", 2000, cuCtxGetDevice), E("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
	E("cuCtxGetCurrent", 4000, cuCtxGetCurrent), E("cuCtxSynchronize", 2000, cuCtxSynchronize),
	E("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2), E("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
	E("cuStreamCreate", 2000, cuStreamCreate), E("cuStreamDestroy", 4000, cuStreamDestroy_v2),
	E("cuStreamGetCtx", 9020, cuStreamGetCtx), E("cuStreamSynchronize", 2000, cuStreamSynchronize),
	E("cuCtxCreate", 3020, cuCtxCreate_v2), E("cuCtxCreate", 11040, cuCtxCreate_v3),
	E("cuCtxCreate", 12050, cuCtxCreate_v4), E("cuCtxDestroy", 4000, cuCtxDestroy_v2),
	E("cuCtxSetLimit", 3010, cuCtxSetLimit), E("cuCtxGetLimit", 3010, cuCtxGetLimit),
	E("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
	E("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
	E("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
	E("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2),
	E("cuMemAlloc", 2000, cuMemAlloc), E("cuMemAlloc", 3020, cuMemAlloc_v2),
	E("cuMemAllocPitch", 2000, cuMemAllocPitch), E("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
	E("cuMemAllocManaged", 6000, cuMemAllocManaged),
	E("cuMemAllocAsync", 11020, cuMemAllocAsync), P("cuMemAllocAsync", 11020, cuMemAllocAsync_ptsz),
	E("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync),
	P("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync_ptsz),
	E("cuMemPoolCreate", 11020, cuMemPoolCreate), E("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
	E("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo), E("cuMemPoolGetAttribute", 11020, cuMemPoolGetAttribute),
	E("cuDeviceGetMemPool", 11020, cuDeviceGetMemPool), E("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
	E("cuMemFree", 2000, cuMemFree), E("cuMemFree", 3020, cuMemFree_v2),
	E("cuMemFreeAsync", 11020, cuMemFreeAsync), P("cuMemFreeAsync", 11020, cuMemFreeAsync_ptsz),
	E("cuMemCreate", 10020, cuMemCreate), E("cuMemRelease", 10020, cuMemRelease),
	E("cuMemMap", 10020, cuMemMap), E("cuMemUnmap", 10020, cuMemUnmap),
	E("cuArrayCreate", 2000, cuArrayCreate), E("cuArrayCreate", 3020, cuArrayCreate_v2),
	E("cuArray3DCreate", 2000, cuArray3DCreate), E("cuArray3DCreate", 3020, cuArray3DCreate_v2),
	E("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate),
	E("cuArrayDestroy", 2000, cuArrayDestroy), E("cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy),
	E("cuMemGetInfo", 2000, cuMemGetInfo), E("cuMemGetInfo", 3020, cuMemGetInfo_v2),
	E("cuMemGetInfo", 13020, cuMemGetInfo_v3), E("cuMemAlloc", 13020, cuMemAlloc_v3), E("cuLaunchGrid", 13020, cuLaunchGrid_v2),
	E("cuModuleLoadData", 2000, cuModuleLoadData), E("cuModuleGetFunction", 2000, cuModuleGetFunction),
	E("cuLaunchKernel", 4000, cuLaunchKernel), P("cuLaunchKernel", 4000, cuLaunchKernel_ptsz),
	E("cuLaunchKernelEx", 11060, cuLaunchKernelEx), P("cuLaunchKernelEx", 11060, cuLaunchKernelEx_ptsz),
	E("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel),
	P("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel_ptsz),
	E("cuGraphCreate", 10000, cuGraphCreate), E("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags),
	E("cuLaunch", 2000, cuLaunch), E("cuLaunchGrid", 2000, cuLaunchGrid), E("cuLaunchGridAsync", 2000, cuLaunchGridAsync),
	E("cuFuncSetBlockShape", 2000, cuFuncSetBlockShape),
	E("cuGraphLaunch", 10000, cuGraphLaunch), P("cuGraphLaunch", 10000, cuGraphLaunch_ptsz),
	E("cuGetProcAddress", 11030, cuGetProcAddress), E("cuGetProcAddress", 12000, cuGetProcAddress_v2),
};

static CUresult pa_lookup(const char *sym, void **pfn, int ver, cuuint64_t flags, CUdriverProcAddressQueryResult *st)
{
	const struct pa *best = NULL;
	int found = 0;
	int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
	for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
		const struct pa *e = &table[i];
		if (strcmp(e->name, sym))
			continue;
		found = 1;
		if (e->minver > ver)
			continue;
		if (best == NULL || e->minver > best->minver ||
		    (e->minver == best->minver && e->ptsz == want_ptsz))
			best = e;
	}
	if (best == NULL) {
		if (st)
			*st = found ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
		*pfn = NULL;
		return CUDA_ERROR_NOT_FOUND;
	}
	if (st)
		*st = CU_GET_PROC_ADDRESS_SUCCESS;
	*pfn = best->fn;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags,
				    CUdriverProcAddressQueryResult *st)
{
	return pa_lookup(sym, pfn, ver, flags, st);
}
EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t flags)
{
	return pa_lookup(sym, pfn, ver, flags, NULL);
}
