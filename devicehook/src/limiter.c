/*
 * SM limiter for CUDA_DEVICE_SM_LIMIT[_i].
 *
 * Launches are admitted by a token bucket per device whose unit is the
 * launch's grid size (blocks; a graph launch counts as GRAPH_COST). The
 * bucket's refill rate is not known in advance (it depends on the
 * kernels), so a control thread closes the loop every period: it reads the
 * container's SM utilisation from NVML (the processes in the shared region,
 * or this process) and scales the rate by target/utilisation, damped. Until
 * the first over-target sample the bucket is unbounded.
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

double gp_limiter_next_rate(double rate, double target, double util, double observed, int waited)
{
	if (util < 0)
		return rate; /* no sample this period */
	if (rate <= 0) {
		/* Uncalibrated: the first time we see too much use, start from the
		 * rate that produced it, scaled to the target. */
		if (util > target && observed > 0)
			return observed * target / util;
		return 0;
	}
	double f = 1.0;
	if (util > target)
		f = target / util;
	else if (waited && util < target)
		f = target / (util < 1 ? 1 : util);
	/* Damping: move half way (in log space) to the ideal correction. */
	f = sqrt(f);
	if (f < 0.5)
		f = 0.5;
	if (f > 2.0)
		f = 2.0;
	return rate * f;
}

static int nvml_ready(void)
{
	return gp.nvml_procutil != NULL && gp.nvml_byindex != NULL;
}

/* The container's SM utilisation on dev over the last period, percent, or
 * -1 when NVML gave nothing usable. */
static double measure(int dev, uint64_t launched)
{
	struct gp_limiter *l = &gp.lim[dev];
	nvmlDevice_t h;
	if (!nvml_ready() || gp.nvml_byindex((unsigned)dev, &h) != NVML_SUCCESS)
		return -1;
	nvmlProcessUtilizationSample_t s[MAX_SAMPLES];
	unsigned n = MAX_SAMPLES;
	nvmlReturn_t rc = gp.nvml_procutil(h, s, &n, l->last_sample_us);
	if (rc == NVML_ERROR_NOT_FOUND)
		return 0; /* no process ran a kernel since the last sample */
	if (rc != NVML_SUCCESS)
		return -1;
	pid_t pids[MAX_PIDS];
	int np = gp_region_pids(&gp.region, pids, MAX_PIDS);
	if (np == 0) {
		pids[0] = getpid();
		np = 1;
	}
	double sum = 0;
	int matched = 0;
	for (unsigned i = 0; i < n; i++) {
		if (s[i].timeStamp > l->last_sample_us)
			l->last_sample_us = s[i].timeStamp;
		for (int j = 0; j < np; j++)
			if ((pid_t)s[i].pid == pids[j]) {
				sum += s[i].smUtil;
				matched = 1;
			}
	}
	if (matched)
		l->pids_visible = 1;
	else if (n > 0 && launched > 0 && !l->pids_visible && gp.nvml_util) {
		/* We launched but NVML has never shown our pids (pid namespace):
		 * fall back to the whole device, which can only over-throttle.
		 * Once our pids have been seen, "not listed" means "idle"; other
		 * processes' work must never be charged to us. */
		nvmlUtilization_t u;
		if (gp.nvml_util(h, &u) == NVML_SUCCESS)
			return u.gpu;
	}
	return sum;
}

static void *control_loop(void *arg)
{
	(void)arg;
	uint64_t period_ns = (uint64_t)gp.cfg.sm_period_ms * 1000000ull;
	uint64_t prev = gp_now_ns();
	for (;;) {
		struct timespec ts = {(time_t)(period_ns / 1000000000ull), (long)(period_ns % 1000000000ull)};
		while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
			;
		uint64_t now = gp_now_ns();
		double dt = (double)(now - prev) / 1e9;
		prev = now;
		for (int d = 0; d < GP_MAX_DEV; d++) {
			struct gp_limiter *l = &gp.lim[d];
			if (l->target == 0)
				continue;
			uint64_t launched = atomic_exchange(&l->launched, 0);
			double u = measure(d, launched);
			int waited = atomic_exchange(&l->waited, 0);
			pthread_mutex_lock(&l->mu);
			double r = gp_limiter_next_rate(l->rate, l->target, u, dt > 0 ? launched / dt : 0, waited);
			if (l->rate <= 0 && r > 0)
				l->tokens = 0;
			l->rate = r;
			pthread_mutex_unlock(&l->mu);
			gp_log(GP_LOG_DEBUG, "limiter dev %d: util %.1f target %d rate %.0f", d, u, l->target, r);
		}
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
	void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	if (lib != NULL) {
		{
			gp.nvml_init = (gp_fn_nvml_init)gp.real_dlsym(lib, "nvmlInit_v2");
			gp.nvml_byindex = (gp_fn_nvml_byindex)gp.real_dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
			gp.nvml_procutil = (gp_fn_nvml_procutil)gp.real_dlsym(lib, "nvmlDeviceGetProcessUtilization");
			gp.nvml_util = (gp_fn_nvml_util)gp.real_dlsym(lib, "nvmlDeviceGetUtilizationRates");
		}
	}
	if (gp.nvml_init == NULL || gp.nvml_init() != NVML_SUCCESS) {
		gp_log(GP_LOG_ERROR, "SM limit set but NVML is unavailable; launches are not throttled");
		return;
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
	if (cost == 0)
		cost = 1;
	pthread_mutex_lock(&l->mu);
	for (;;) {
		uint64_t now = gp_now_ns();
		if (l->rate <= 0) {
			l->last_ns = now;
			break;
		}
		/* Burst: one period, but at least 50 ms, so a process the CPU
		 * scheduler delayed can catch up on what it was owed. */
		double burst = l->rate * (gp.cfg.sm_period_ms < 50 ? 0.05 : (double)gp.cfg.sm_period_ms / 1000.0);
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
