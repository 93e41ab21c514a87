/*
 * A fake libnvidia-ml.so.1 backed by the fake driver's counters: memory
 * figures from fakecuda_used, per-process SM utilisation from the
 * simulated device clock.
 *
 * nvmlDeviceGetProcessUtilization behaves as the real one does where the
 * SM limiter cares:
 *  - the driver samples on a cadence (FAKENVML_SAMPLE_MS, default 167:
 *    1/6 s; real GPUs show 1/6 s to 1 s). A sample covers one whole
 *    cadence window, is stamped (CPU microseconds, CLOCK_REALTIME) with the
 *    window's end (following a step of the wall clock), and lists only processes with some SM time in it;
 *  - only samples newer than lastSeenTimeStamp are returned; when there
 *    are none, NVML_ERROR_NOT_FOUND (between two samples, or on an idle
 *    device);
 *  - pids are host pids (FAKECUDA_PID_OFFSET of each process added).
 *  - FAKENVML_LIE_AFTER_MS=t (hostile, not the default): from t ms after
 *    this process's first call on, every listed process reads 100 % busy
 *    (a driver that charges a neighbour's work to us), for the floor test.
 *  - FAKENVML_RESTAMP_EVERY=k (test of a hostile driver, not the realistic
 *    default): every k-th call that has nothing newer than lastSeen returns
 *    the last window again stamped lastSeen + 1 us, as a stamp computed
 *    twice across a clock adjustment or preemption would read.
 * FAKENVML_SAMPLE_MS=0 selects the idealised mode older tests were written
 * against: every call is a fresh sample of the time since the previous call.
 * nvmlDeviceGetComputeRunningProcesses_v3 lists processes with a live
 * context (host pids).
 * Devices are the physical ones in their own order (the real NVML's PCI
 * order), whatever the caller's CUDA_VISIBLE_DEVICES; nvmlDeviceGetUUID
 * and nvmlDeviceGetHandleByUUID name them as cuDeviceGetUuid does.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "../src/cuda_types.h"

#define EXPORT __attribute__((visibility("default")))
#define MAXP 256

uint64_t fakecuda_used_phys(int p);
uint64_t fakecuda_mem(void);
int fakecuda_nphys(void);
int fakecuda_busy_phys(int p, uint64_t *pids, uint64_t *busy, int max);
int fakecuda_window(int dev, uint64_t from, uint64_t to, uint64_t *hostpids, uint64_t *busy, int max);
int fakecuda_ctx_procs(int dev, uint64_t *hostpids, uint64_t *mem, int max);

struct snap {
	uint64_t pid;
	uint64_t busy;
	uint64_t t;
};
static struct snap snaps[8][MAXP];
static uint64_t dev_prev_busy[8], dev_prev_t[8];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int idx(nvmlDevice_t d) { return (int)(uintptr_t)d - 1; }

EXPORT nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }
EXPORT nvmlReturn_t nvmlInit(void) { return NVML_SUCCESS; }
EXPORT nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) { *n = (unsigned)fakecuda_nphys(); return NVML_SUCCESS; }
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *d)
{
	if ((int)i >= fakecuda_nphys())
		return NVML_ERROR_INVALID_ARGUMENT;
	*d = (nvmlDevice_t)(uintptr_t)(i + 1);
	return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned *i)
{
	if (idx(d) < 0 || idx(d) >= fakecuda_nphys())
		return NVML_ERROR_INVALID_ARGUMENT;
	*i = (unsigned)idx(d);
	return NVML_SUCCESS;
}
int fakecuda_uuid_phys(int p, char *out, unsigned n);
/* NVML numbers the physical devices in their own (PCI) order, whatever
 * this process's CUDA_VISIBLE_DEVICES: under a reordered one, CUDA ordinal
 * i is not NVML device i (the real NVML's behaviour; the UUID is what
 * both share). */
EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *out, unsigned n)
{
	if (idx(d) < 0 || idx(d) >= fakecuda_nphys() || !out)
		return NVML_ERROR_INVALID_ARGUMENT;
	return fakecuda_uuid_phys(idx(d), out, n) == 0 ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d)
{
	if (!uuid || !d)
		return NVML_ERROR_INVALID_ARGUMENT;
	for (int p = 0; p < fakecuda_nphys(); p++) {
		char u[96];
		if (fakecuda_uuid_phys(p, u, sizeof u) == 0 && !strcasecmp(u, uuid)) {
			*d = (nvmlDevice_t)(uintptr_t)(p + 1);
			return NVML_SUCCESS;
		}
	}
	return NVML_ERROR_NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
	if (idx(d) < 0 || idx(d) >= fakecuda_nphys() || !m)
		return NVML_ERROR_INVALID_ARGUMENT;
	m->total = fakecuda_mem();
	m->used = fakecuda_used_phys(idx(d));
	m->free = m->total - m->used;
	return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m)
{
	if (idx(d) < 0 || idx(d) >= fakecuda_nphys() || !m)
		return NVML_ERROR_INVALID_ARGUMENT;
	m->total = fakecuda_mem();
	m->reserved = 64ull << 20; /* the real driver reserves some; the hook must hide it */
	m->used = fakecuda_used_phys(idx(d));
	m->free = m->total - m->reserved - m->used;
	return NVML_SUCCESS;
}

static uint64_t cadence_ns(void)
{
	const char *v = getenv("FAKENVML_SAMPLE_MS");
	return (v ? strtoull(v, NULL, 10) : 167) * 1000000ull;
}

/* The driver stamps a sample once; a stamp recomputed at every call from
 * two clock reads would move when the caller is preempted between them
 * (FAKENVML_RESTAMP_EVERY models that on purpose). So the offset between
 * the clocks is read once per process. */
static pthread_once_t offset_once = PTHREAD_ONCE_INIT;
static int64_t rt_minus_mono;

static void read_offset(void)
{
	struct timespec rt;
	uint64_t m0 = now_ns();
	clock_gettime(CLOCK_REALTIME, &rt);
	uint64_t m1 = now_ns();
	rt_minus_mono = (int64_t)((uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec) - (int64_t)(m0 / 2 + m1 / 2);
}

/* The driver stamps with the wall clock as it is now: a step of it (more
 * than 1 s off the offset read at the start: settimeofday, an NTP step,
 * the tests' clockstep.so) moves the stamps of later samples with it; the
 * sub-millisecond jitter of reading two clocks does not. */
static unsigned long long realtime_us_at(uint64_t mono)
{
	pthread_once(&offset_once, read_offset);
	struct timespec rt;
	clock_gettime(CLOCK_REALTIME, &rt);
	int64_t drift = (int64_t)((uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec) - (int64_t)now_ns() - rt_minus_mono;
	int64_t step = (drift > 1000000000ll || drift < -1000000000ll) ? drift : 0;
	return (unsigned long long)((int64_t)mono + rt_minus_mono + step) / 1000;
}

static nvmlReturn_t idealised_procutil(int dev, nvmlProcessUtilizationSample_t *out, unsigned *count);

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *out,
						    unsigned *count, unsigned long long lastSeen)
{
	int dev = idx(d);
	if (dev < 0 || dev >= 8 || !count)
		return NVML_ERROR_INVALID_ARGUMENT;
	uint64_t p = cadence_ns();
	if (p == 0)
		return idealised_procutil(dev, out, count);
	uint64_t end = now_ns() / p * p; /* the last complete sample window */
	unsigned long long ts = realtime_us_at(end);
	uint64_t pids[MAXP], busy[MAXP];
	int n = end >= p ? fakecuda_window(dev, end - p, end, pids, busy, MAXP) : 0;
	static _Atomic unsigned long stale_calls;
	const char *rs = getenv("FAKENVML_RESTAMP_EVERY");
	unsigned long every = rs ? strtoul(rs, NULL, 10) : 0;
	if (ts <= lastSeen && n > 0 && every > 0 && lastSeen != 0 && ++stale_calls % every == 0)
		ts = lastSeen + 1;
	if (ts <= lastSeen || n == 0) {
		*count = 0;
		return NVML_ERROR_NOT_FOUND;
	}
	if (out == NULL || *count < (unsigned)n) {
		*count = (unsigned)n;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	static _Atomic uint64_t first_call;
	uint64_t z = 0, t0 = now_ns();
	atomic_compare_exchange_strong(&first_call, &z, t0);
	const char *lie = getenv("FAKENVML_LIE_AFTER_MS");
	int lying = lie && t0 - atomic_load(&first_call) >= strtoull(lie, NULL, 10) * 1000000ull;
	for (int i = 0; i < n; i++) {
		uint64_t u = lying ? 100 : busy[i] * 100 / p;
		out[i] = (nvmlProcessUtilizationSample_t){(unsigned)pids[i], ts, (unsigned)(u > 100 ? 100 : u), 0, 0, 0};
	}
	*count = (unsigned)n;
	return NVML_SUCCESS;
}

/* FAKENVML_MIG=1: every device is in MIG mode. */
EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned *current, unsigned *pending)
{
	if (idx(d) < 0 || idx(d) >= fakecuda_nphys() || !current || !pending)
		return NVML_ERROR_INVALID_ARGUMENT;
	const char *v = getenv("FAKENVML_MIG");
	*current = *pending = (v && *v == '1') ? 1 : 0;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned *count, nvmlProcessInfo_t *out)
{
	int dev = idx(d);
	if (dev < 0 || dev >= 8 || !count)
		return NVML_ERROR_INVALID_ARGUMENT;
	uint64_t pids[MAXP], mem[MAXP];
	int n = fakecuda_ctx_procs(dev, pids, mem, MAXP);
	/* FAKENVML_EXTRA_PROCS=N: N other processes (1 MiB each) listed before
	 * the fake's own, as on a busy node (review 15: more than 64). */
	const char *xv = getenv("FAKENVML_EXTRA_PROCS");
	int extra = xv ? atoi(xv) : 0;
	if (extra < 0 || extra > MAXP)
		extra = 0;
	if (extra > 0 && n + extra <= MAXP) {
		memmove(pids + extra, pids, (size_t)n * sizeof *pids);
		memmove(mem + extra, mem, (size_t)n * sizeof *mem);
		for (int i = 0; i < extra; i++) {
			pids[i] = 0x7f000000u + (unsigned)i;
			mem[i] = 1u << 20;
		}
		n += extra;
	}
	if (out == NULL || *count < (unsigned)n) {
		*count = (unsigned)n;
		return n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
	}
	/* FAKENVML_MEM_NOT_AVAILABLE=1: usedGpuMemory is NVML_VALUE_NOT_AVAILABLE
	 * (~0ull), as NVML reports it where it may not tell per-process memory
	 * (MIG without privilege, vGPU guests, WDDM; review 15). */
	int na = getenv("FAKENVML_MEM_NOT_AVAILABLE") != NULL;
	for (int i = 0; i < n; i++)
		out[i] = (nvmlProcessInfo_t){(unsigned)pids[i], na ? ~0ull : mem[i], 0xffffffffu, 0xffffffffu};
	*count = (unsigned)n;
	return NVML_SUCCESS;
}

/* FAKENVML_SAMPLE_MS=0: a sample per call, of the busy time since the last. */
static nvmlReturn_t idealised_procutil(int dev, nvmlProcessUtilizationSample_t *out, unsigned *count)
{
	uint64_t pids[MAXP], busy[MAXP];
	int n = fakecuda_busy_phys(dev, pids, busy, MAXP);
	if (out == NULL) {
		*count = (unsigned)n;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	uint64_t t = now_ns();
	unsigned k = 0;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < n; i++) {
		struct snap *s = NULL;
		for (int j = 0; j < MAXP; j++)
			if (snaps[dev][j].pid == pids[i] || snaps[dev][j].pid == 0) {
				s = &snaps[dev][j];
				break;
			}
		if (s == NULL)
			continue;
		if (s->pid == 0) {
			*s = (struct snap){pids[i], busy[i], t};
			continue;
		}
		uint64_t db = busy[i] - s->busy, dt = t - s->t;
		s->busy = busy[i];
		s->t = t;
		if (db == 0 || dt == 0 || k >= *count)
			continue;
		uint64_t u = db * 100 / dt;
		out[k++] = (nvmlProcessUtilizationSample_t){(unsigned)pids[i], t / 1000, (unsigned)(u > 100 ? 100 : u), 0, 0, 0};
	}
	pthread_mutex_unlock(&mu);
	*count = k;
	return k ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u)
{
	int dev = idx(d);
	if (dev < 0 || dev >= 8 || !u)
		return NVML_ERROR_INVALID_ARGUMENT;
	uint64_t pids[MAXP], busy[MAXP], sum = 0;
	int n = fakecuda_busy_phys(dev, pids, busy, MAXP);
	for (int i = 0; i < n; i++)
		sum += busy[i];
	uint64_t t = now_ns();
	pthread_mutex_lock(&mu);
	uint64_t db = sum - dev_prev_busy[dev], dt = t - dev_prev_t[dev];
	int first = dev_prev_t[dev] == 0;
	dev_prev_busy[dev] = sum;
	dev_prev_t[dev] = t;
	pthread_mutex_unlock(&mu);
	uint64_t p = (first || dt == 0) ? 0 : db * 100 / dt;
	u->gpu = (unsigned)(p > 100 ? 100 : p);
	u->memory = 0;
	return NVML_SUCCESS;
}
