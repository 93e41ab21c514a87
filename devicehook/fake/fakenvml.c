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
 *    window's end, and lists only processes with some SM time in it;
 *  - only samples newer than lastSeenTimeStamp are returned; when there
 *    are none, NVML_ERROR_NOT_FOUND (between two samples, or on an idle
 *    device);
 *  - pids are host pids (FAKECUDA_PID_OFFSET of each process added).
 * FAKENVML_SAMPLE_MS=0 selects the idealised mode older tests were written
 * against: every call is a fresh sample of the time since the previous call.
 * nvmlDeviceGetComputeRunningProcesses_v3 lists processes with a live
 * context (host pids).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "../src/cuda_types.h"

#define EXPORT __attribute__((visibility("default")))
#define MAXP 256

uint64_t fakecuda_used(int dev);
uint64_t fakecuda_mem(void);
int fakecuda_ndev(void);
int fakecuda_busy(int dev, uint64_t *pids, uint64_t *busy, int max);
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
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) { *n = (unsigned)fakecuda_ndev(); return NVML_SUCCESS; }
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *d)
{
	if ((int)i >= fakecuda_ndev())
		return NVML_ERROR_INVALID_ARGUMENT;
	*d = (nvmlDevice_t)(uintptr_t)(i + 1);
	return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned *i)
{
	if (idx(d) < 0 || idx(d) >= fakecuda_ndev())
		return NVML_ERROR_INVALID_ARGUMENT;
	*i = (unsigned)idx(d);
	return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
	if (idx(d) < 0 || idx(d) >= fakecuda_ndev() || !m)
		return NVML_ERROR_INVALID_ARGUMENT;
	m->total = fakecuda_mem();
	m->used = fakecuda_used(idx(d));
	m->free = m->total - m->used;
	return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m)
{
	if (idx(d) < 0 || idx(d) >= fakecuda_ndev() || !m)
		return NVML_ERROR_INVALID_ARGUMENT;
	m->total = fakecuda_mem();
	m->reserved = 64ull << 20; /* the real driver reserves some; the hook must hide it */
	m->used = fakecuda_used(idx(d));
	m->free = m->total - m->reserved - m->used;
	return NVML_SUCCESS;
}

static uint64_t cadence_ns(void)
{
	const char *v = getenv("FAKENVML_SAMPLE_MS");
	return (v ? strtoull(v, NULL, 10) : 167) * 1000000ull;
}

static unsigned long long realtime_us_at(uint64_t mono)
{
	struct timespec rt;
	clock_gettime(CLOCK_REALTIME, &rt);
	uint64_t rt_ns = (uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec, now = now_ns();
	return (rt_ns - (now - mono)) / 1000;
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
	if (ts <= lastSeen || n == 0) {
		*count = 0;
		return NVML_ERROR_NOT_FOUND;
	}
	if (out == NULL || *count < (unsigned)n) {
		*count = (unsigned)n;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	for (int i = 0; i < n; i++) {
		uint64_t u = busy[i] * 100 / p;
		out[i] = (nvmlProcessUtilizationSample_t){(unsigned)pids[i], ts, (unsigned)(u > 100 ? 100 : u), 0, 0, 0};
	}
	*count = (unsigned)n;
	return NVML_SUCCESS;
}

/* FAKENVML_MIG=1: every device is in MIG mode. */
EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned *current, unsigned *pending)
{
	if (idx(d) < 0 || idx(d) >= fakecuda_ndev() || !current || !pending)
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
	if (out == NULL || *count < (unsigned)n) {
		*count = (unsigned)n;
		return n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
	}
	for (int i = 0; i < n; i++)
		out[i] = (nvmlProcessInfo_t){(unsigned)pids[i], mem[i], 0xffffffffu, 0xffffffffu};
	*count = (unsigned)n;
	return NVML_SUCCESS;
}

/* FAKENVML_SAMPLE_MS=0: a sample per call, of the busy time since the last. */
static nvmlReturn_t idealised_procutil(int dev, nvmlProcessUtilizationSample_t *out, unsigned *count)
{
	uint64_t pids[MAXP], busy[MAXP];
	int n = fakecuda_busy(dev, pids, busy, MAXP);
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
	int n = fakecuda_busy(dev, pids, busy, MAXP);
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
