/*
 * SM limiter for CUDA_DEVICE_SM_LIMIT[_i].
 *
 * Launches are admitted by a token bucket per device whose unit is the
 * launch's grid size (blocks; a graph launch counts as GRAPH_COST). What a
 * unit costs in SM time depends on the kernels, so a control thread learns
 * it from NVML and sets the rate that gives the target.
 *
 * What NVML really gives (and the fake NVML models, fakenvml.c):
 *  - per-process samples on the driver's cadence (1/6 s to 1 s), each
 *    stamped with the CPU time of its window's end; between two samples,
 *    and on an idle device, NVML_ERROR_NOT_FOUND. Neither says "0 % busy":
 *    both are "no new information", and the rate is held.
 *  - host pids: a container's getpid() never matches. Each process finds
 *    its host pid when it creates a context (the NVML process list before
 *    and after; exactly one new pid = ours, as HAMi-core does) and records
 *    it in its shared-region slot, so every process of the container sums
 *    the same pids. Utilisation of any other pid is never charged to us.
 *    Fallback when unresolved (two processes created contexts at the same
 *    instant, or NVML has no process list): a sample that lists a single
 *    process while we launched is ours (we are alone); otherwise no
 *    information, rate held, one warning.
 *
 * Control: the tick records (time, cumulative cost admitted). On each new
 * sample the window is [stamp - cadence, stamp], the cadence being the
 * smallest gap between sample stamps seen (paced to what the driver
 * really does). From our utilisation u in that window and the cost c we
 * admitted in it, k = u / (c/window) (percent per cost unit per second,
 * smoothed) and rate = target / k. The bucket is unbounded until the
 * first calibration, so a lone container sees its cap from the first
 * sample on and keeps it (the rate is not raised just because the device
 * is idle). Floor: the rate never goes below a quarter of the first
 * calibrated rate, so a bad sample cannot starve the container.
 *
 * The fast path (no device throttled) is one relaxed load in dispatch.c;
 * this file runs only for throttled devices.
 */
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "state.h"

#define MAX_SAMPLES 256
#define MAX_PIDS 256

static unsigned long long realtime_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000;
}

static void nvml_syms(void)
{
	void *lib = gp.real_dlsym ? dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL) : NULL;
	if (lib == NULL)
		return;
	gp.nvml_init = (gp_fn_nvml_init)gp.real_dlsym(lib, "nvmlInit_v2");
	gp.nvml_byindex = (gp_fn_nvml_byindex)gp.real_dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
	gp.nvml_procutil = (gp_fn_nvml_procutil)gp.real_dlsym(lib, "nvmlDeviceGetProcessUtilization");
	gp.nvml_util = (gp_fn_nvml_util)gp.real_dlsym(lib, "nvmlDeviceGetUtilizationRates");
	gp.nvml_procs = (gp_fn_nvml_procs)gp.real_dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3");
	gp.nvml_migmode = (gp_fn_nvml_migmode)gp.real_dlsym(lib, "nvmlDeviceGetMigMode");
	gp.nvml_ok = gp.nvml_init != NULL && gp.nvml_init() == NVML_SUCCESS && gp.nvml_byindex && gp.nvml_procutil;
}

static int nvml_ready(void)
{
	pthread_once(&gp.nvml_sym_once, nvml_syms);
	return gp.nvml_ok;
}

/* ---- host pid ----------------------------------------------------------- */

static int list_procs(int dev, unsigned *out, unsigned long long *mem, unsigned max)
{
	nvmlDevice_t h;
	if (!gp.nvml_procs || gp.nvml_byindex((unsigned)dev, &h) != NVML_SUCCESS)
		return -1;
	nvmlProcessInfo_t p[64];
	unsigned n = 64;
	if (gp.nvml_procs(h, &n, p) != NVML_SUCCESS)
		return -1;
	for (unsigned i = 0; i < n && i < max; i++) {
		out[i] = p[i].pid;
		if (mem)
			mem[i] = p[i].usedGpuMemory;
	}
	return (int)(n < max ? n : max);
}

static void resolved(unsigned hostpid, const char *how)
{
	atomic_store(&gp.host_pid, hostpid);
	gp_region_set_hostpid(&gp.region, hostpid);
	gp_log(GP_LOG_INFO, "NVML knows this process as pid %u (%s)", hostpid, how);
}

/* Several processes created contexts at once, so the list diff named
 * several candidates. Tell them apart by memory: allocate PROBE bytes
 * (charged like any allocation) and see whose usedGpuMemory grew by it.
 * Runs in an application thread (it needs the current context). */
#define PROBE (16ull << 20)
static void probe_hostpid(int dev)
{
	int nc = atomic_load(&gp.host_ncands);
	if (nc < 2 || !gp.mem_alloc || !gp.mem_free || atomic_fetch_add(&gp.host_probes, 1) >= 5)
		return;
	unsigned p0[64], p1[64];
	unsigned long long m0[64], m1[64];
	int n0 = list_procs(dev, p0, m0, 64);
	if (n0 < 0 || gp_charge(dev, PROBE) != CUDA_SUCCESS)
		return;
	CUdeviceptr d;
	if (gp.mem_alloc(&d, PROBE) != CUDA_SUCCESS) {
		gp_uncharge(dev, PROBE);
		return;
	}
	int n1 = list_procs(dev, p1, m1, 64);
	gp.mem_free(d);
	gp_uncharge(dev, PROBE);
	unsigned hit = 0, nhit = 0;
	for (int c = 0; c < nc; c++)
		for (int i = 0; i < n1; i++) {
			if (p1[i] != gp.host_cands[c])
				continue;
			unsigned long long before = 0;
			for (int j = 0; j < n0; j++)
				if (p0[j] == p1[i])
					before = m0[j];
			if (m1[i] >= before + PROBE && m1[i] < before + 2 * PROBE) {
				hit = p1[i];
				nhit++;
			}
		}
	if (nhit == 1) {
		resolved(hit, "memory probe");
		atomic_store(&gp.host_ncands, 0);
	}
}

static int want_hostpid(int dev)
{
	return dev >= 0 && dev < GP_MAX_DEV && (gp.cfg.any_sm_limit || gp.cfg.any_mem_limit) && !gp.cfg.disabled &&
	       atomic_load(&gp.host_pid) == 0;
}

int gp_proc_mem(int dev, uint64_t *out)
{
	unsigned self = atomic_load(&gp.host_pid);
	if (self == 0 || !nvml_ready())
		return -1;
	unsigned p[64];
	unsigned long long m[64];
	int n = list_procs(dev, p, m, 64);
	if (n < 0)
		return -1;
	*out = 0; /* not listed: no context, no memory on dev */
	for (int i = 0; i < n; i++)
		if (p[i] == self)
			*out = m[i];
	return 0;
}

void gp_hostpid_before(int dev, struct gp_pidsnap *s)
{
	s->ok = 0;
	if (!want_hostpid(dev) || !nvml_ready())
		return;
	int n = list_procs(dev, s->pids, NULL, 64);
	if (n >= 0) {
		s->n = (unsigned)n;
		s->ok = 1;
	}
}

void gp_hostpid_after(int dev, struct gp_pidsnap *s, int created)
{
	if (!s->ok || !created || !want_hostpid(dev))
		return;
	unsigned now[64], fresh[8], nfresh = 0;
	int n = list_procs(dev, now, NULL, 64);
	for (int i = 0; i < n; i++) {
		int old = 0;
		for (unsigned j = 0; j < s->n; j++)
			old |= now[i] == s->pids[j];
		if (!old && nfresh < 8)
			fresh[nfresh++] = now[i];
	}
	if (nfresh == 1) {
		resolved(fresh[0], "new in NVML's process list at context creation");
	} else if (nfresh > 1) {
		memcpy(gp.host_cands, fresh, sizeof fresh);
		atomic_store(&gp.host_ncands, (int)nfresh);
		gp_log(GP_LOG_INFO, "%u processes created contexts at once; a memory probe will tell which is this one",
		       nfresh);
	} else if (!atomic_exchange(&gp.host_pid_tried, 1))
		gp_log(GP_LOG_INFO, "this process did not appear in NVML's process list; will retry at the next context creation");
}

/* ---- control ------------------------------------------------------------ */

/* Cumulative cost admitted at time us, interpolated between ticks. */
static double cum_at(struct gp_limiter *l, unsigned long long us)
{
	int n = l->ring_n;
	if (n == 0)
		return 0;
	int newest = (l->ring_i + GP_RING - 1) % GP_RING, oldest = (l->ring_i + GP_RING - n) % GP_RING;
	if (us >= l->ring[newest].us)
		return (double)l->ring[newest].cum;
	if (us <= l->ring[oldest].us)
		return (double)l->ring[oldest].cum;
	for (int k = 1; k < n; k++) {
		int i1 = (newest + GP_RING - k + 1) % GP_RING, i0 = (newest + GP_RING - k) % GP_RING;
		if (l->ring[i0].us <= us) {
			double span = (double)(l->ring[i1].us - l->ring[i0].us);
			double f = span > 0 ? (double)(us - l->ring[i0].us) / span : 1;
			return (double)l->ring[i0].cum + f * (double)(l->ring[i1].cum - l->ring[i0].cum);
		}
	}
	return (double)l->ring[oldest].cum;
}

/* Our utilisation in the newest samples, or -1 when unknown. */
static double attribute(struct gp_limiter *l, nvmlProcessUtilizationSample_t *s, unsigned n,
			unsigned long long since, double admitted)
{
	unsigned ours[MAX_PIDS];
	int no = gp_region_hostpids(&gp.region, ours, MAX_PIDS - 1);
	unsigned self = atomic_load(&gp.host_pid);
	if (self != 0)
		ours[no++] = self;
	double sum = 0;
	unsigned listed = 0, last = 0;
	for (unsigned i = 0; i < n; i++) {
		if (s[i].timeStamp <= since)
			continue;
		listed++;
		last = i;
		for (int j = 0; j < no; j++)
			if (s[i].pid == ours[j]) {
				sum += s[i].smUtil;
				break;
			}
	}
	if (no > 0)
		return sum;
	if (listed == 1 && admitted > 0)
		return s[last].smUtil; /* alone on the device: it is us */
	if (!l->warned) {
		l->warned = 1;
		gp_log(GP_LOG_WARN, "SM limiter: this container's host pids are unknown and the device is shared; "
		       "holding the current rate");
	}
	return -1;
}

static void control(int dev, struct gp_limiter *l)
{
	unsigned long long now = realtime_us();
	l->ring[l->ring_i].us = now;
	l->ring[l->ring_i].cum = atomic_load(&l->launched);
	l->ring_i = (l->ring_i + 1) % GP_RING;
	if (l->ring_n < GP_RING)
		l->ring_n++;
	nvmlDevice_t h;
	if (!nvml_ready() || gp.nvml_byindex((unsigned)dev, &h) != NVML_SUCCESS)
		return;
	nvmlProcessUtilizationSample_t s[MAX_SAMPLES];
	unsigned n = MAX_SAMPLES;
	if (gp.nvml_procutil(h, s, &n, l->last_sample_us) != NVML_SUCCESS)
		return; /* NOT_FOUND: no sample since the last one; hold */
	unsigned long long ts = 0, since = l->last_sample_us;
	for (unsigned i = 0; i < n; i++)
		if (s[i].timeStamp > ts)
			ts = s[i].timeStamp;
	if (ts <= since)
		return; /* stale: hold */
	l->last_sample_us = ts;
	if (since == 0)
		return; /* the first: its window's length is not known yet */
	unsigned long long gap = ts - since;
	if (l->cadence_us == 0 || gap < l->cadence_us)
		l->cadence_us = gap;
	unsigned long long win = l->cadence_us;
	double admitted = cum_at(l, ts) - cum_at(l, ts > win ? ts - win : 0);
	double u = attribute(l, s, n, since, admitted);
	double obs = admitted / ((double)win / 1e6);
	if (u <= 0 || obs <= 0)
		return; /* unknown, or nothing of ours ran: nothing to learn */
	double k = u / obs;
	l->k = l->k > 0 ? sqrt(l->k * k) : k; /* geometric smoothing */
	double r = (double)l->target / l->k;
	pthread_mutex_lock(&l->mu);
	if (l->floor == 0)
		l->floor = r / 4;
	if (r < l->floor)
		r = l->floor;
	if (l->rate <= 0)
		l->tokens = 0;
	l->rate = r;
	pthread_mutex_unlock(&l->mu);
	gp_log(GP_LOG_DEBUG, "limiter dev %d: util %.1f in %llu us, admitted %.0f/s, target %d, rate %.0f", dev, u,
	       win, obs, l->target, r);
}

static void *control_loop(void *arg)
{
	(void)arg;
	uint64_t period_ns = (uint64_t)gp.cfg.sm_period_ms * 1000000ull;
	for (;;) {
		struct timespec ts = {(time_t)(period_ns / 1000000000ull), (long)(period_ns % 1000000000ull)};
		while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
			;
		for (int d = 0; d < GP_MAX_DEV; d++)
			if (gp.lim[d].target != 0)
				control(d, &gp.lim[d]);
	}
	return NULL;
}

void gp_limiter_setup(void)
{
	for (int d = 0; d < GP_MAX_DEV; d++) {
		pthread_mutex_init(&gp.lim[d].mu, NULL);
		gp.lim[d].target = gp.cfg.sm_limit[d];
	}
	atomic_store(&gp.sm_active, gp.cfg.any_sm_limit && !gp.cfg.disabled);
}

static void start_control(void)
{
	int z = 0;
	if (!atomic_compare_exchange_strong(&gp.limiter_started, &z, 1))
		return;
	if (!nvml_ready()) {
		gp_log(GP_LOG_ERROR, "SM limit set but NVML is unavailable; launches are not throttled");
		return;
	}
	/* On a MIG device the slice is the SM limit, and NVML reports no
	 * per-process utilisation: say so, once, and do not throttle. */
	for (int d = 0; d < GP_MAX_DEV; d++) {
		nvmlDevice_t h;
		unsigned cur = 0, pend = 0;
		if (gp.lim[d].target == 0 || !gp.nvml_migmode || gp.nvml_byindex((unsigned)d, &h) != NVML_SUCCESS ||
		    gp.nvml_migmode(h, &cur, &pend) != NVML_SUCCESS || cur != 1 /* NVML_DEVICE_MIG_ENABLE */)
			continue;
		gp_log(GP_LOG_WARN, "device %d is in MIG mode: CUDA_DEVICE_SM_LIMIT=%d does not apply (the MIG slice "
		       "bounds the SMs); launches are not throttled", d, gp.lim[d].target);
		gp.lim[d].target = 0;
	}
	/* The thread blocks every signal so it never runs application handlers. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_t a;
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&gp.limiter_thread, &a, control_loop, NULL) != 0)
		gp_log(GP_LOG_ERROR, "cannot start the SM limiter thread; launches are not throttled");
	pthread_attr_destroy(&a);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

void gp_limiter_admit(int dev, uint64_t cost)
{
	if (dev < 0 || dev >= GP_MAX_DEV)
		return;
	struct gp_limiter *l = &gp.lim[dev];
	if (l->target == 0)
		return;
	if (!atomic_load_explicit(&gp.limiter_started, memory_order_acquire))
		start_control();
	if (__builtin_expect(atomic_load_explicit(&gp.host_ncands, memory_order_relaxed) > 1, 0) &&
	    atomic_load(&gp.host_pid) == 0)
		probe_hostpid(dev);
	if (cost == 0)
		cost = 1;
	pthread_mutex_lock(&l->mu);
	for (;;) {
		uint64_t now = gp_now_ns();
		if (l->rate <= 0) {
			l->last_ns = now;
			break;
		}
		/* Burst: one period, but at least 250 ms, so a process the CPU
		 * scheduler delayed can catch up on what it was owed. */
		double burst = l->rate * (gp.cfg.sm_period_ms < 250 ? 0.25 : (double)gp.cfg.sm_period_ms / 1000.0);
		l->tokens += l->rate * (double)(now - l->last_ns) / 1e9;
		if (l->tokens > burst)
			l->tokens = burst;
		l->last_ns = now;
		if (l->tokens > 0)
			break;
		/* In debt: sleep until the bucket is positive again (at most 2 ms
		 * at a time so a rate increase takes effect promptly). */
		double wait = -l->tokens / l->rate * 1e9 + 1000;
		if (wait > 2e6)
			wait = 2e6;
		atomic_store_explicit(&l->waited, 1, memory_order_relaxed);
		pthread_mutex_unlock(&l->mu);
		struct timespec ts = {0, (long)wait};
		nanosleep(&ts, NULL);
		pthread_mutex_lock(&l->mu);
	}
	l->tokens -= (double)cost; /* may go negative: big launches are not starved */
	pthread_mutex_unlock(&l->mu);
	atomic_fetch_add_explicit(&l->launched, cost, memory_order_relaxed);
}
