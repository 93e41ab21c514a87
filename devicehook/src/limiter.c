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
 *    process while we launched is ours (we are alone); otherwise it cannot
 *    be attributed: the duty cycle, one warning.
 *
 * Control: the tick records (time, cumulative cost admitted). On each new
 * sample the window is [stamp - cadence, stamp], the cadence being the
 * smallest of the last 8 gaps between sample stamps (paced to what the
 * driver really does; a "new" stamp less than MIN_GAP_US after the last is
 * the same sample again and teaches nothing). From our utilisation u in that window and the cost c we
 * admitted in it, k = u / (c/window) (percent per cost unit per second,
 * smoothed) and rate = target / k. A lone container keeps its cap (the
 * rate is not raised just because the device is idle). Floor: the rate
 * never goes below a quarter of the first calibrated rate.
 *
 * The rate is learnt from the tenant's own launches, so the launch mix
 * games it (issue 15 H1: tiny kernels while it calibrates, heavy ones
 * after; H2: a kernel longer than a sample window costs one launch). The
 * bound is therefore a budget in device time that no launch shape
 * changes: it grows by target % of the wall time and shrinks by what NVML
 * says the container ran; no launch passes while it is negative. The rate
 * only makes an honest mix smooth. The budget is the container's (review
 * 15: per process, a fresh process per long kernel never paid): one per
 * limits index in the shared region (struct gp_sm_budget), each interval
 * accrued and each sample charged once for the whole container, and what
 * a process ran after its last sample (NVML lists only running
 * processes) charged when its slot is zeroed (region.c I10).
 *
 * Fail closed (issue 15 H3b): before the first calibration, and while this
 * process's samples cannot be attributed (host pid unknown on a shared
 * device), the duty cycle that covers an untrusted NVML paces launches.
 *
 * The fast path (no device throttled) is one relaxed load in dispatch.c;
 * this file runs only for throttled devices.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "state.h"

#define MAX_SAMPLES 256
#define MAX_PIDS 256
/* No driver samples faster than 1/6 s; a stamp newer than the last by less
 * than this is the same window stamped twice (a stamp computed across a
 * clock adjustment or a preemption). Before, one such 1 us gap became the
 * cadence for good: every later window was 1 us long, its cost the slope
 * between two control ticks, and the rate followed CPU-scheduling noise
 * (30 % alone measured 43-44 % in rare runs on a loaded machine). */
#define MIN_GAP_US 20000ull

/* A change of the wall clock's offset from the monotonic clock larger than
 * this between two ticks is a step (settimeofday, an NTP step), not NTP's
 * slewing (at most 0.5 ms/s). */
#define STEP_US 250000ll
/* A sample stamped later than the wall clock now by more than this was
 * stamped before the clock stepped back. */
#define FUTURE_US 100000ull

/* The wall clock (what NVML stamps samples with) and its offset from the
 * monotonic clock, read back to back (retried when preempted between). */
static void clocks_us(unsigned long long *rt, long long *off)
{
	struct timespec m0, r, m1;
	for (int i = 0; i < 4; i++) {
		clock_gettime(CLOCK_MONOTONIC, &m0);
		clock_gettime(CLOCK_REALTIME, &r);
		clock_gettime(CLOCK_MONOTONIC, &m1);
		long long d = (m1.tv_sec - m0.tv_sec) * 1000000ll + (m1.tv_nsec - m0.tv_nsec) / 1000;
		if (d < 1000)
			break;
	}
	*rt = (unsigned long long)r.tv_sec * 1000000ull + (unsigned long long)r.tv_nsec / 1000;
	long long mono = (long long)m1.tv_sec * 1000000ll + m1.tv_nsec / 1000;
	*off = (long long)*rt - mono;
}

/* NVML as the node provides it (issue 15 H3a). Loaded by soname, a stub
 * libnvidia-ml.so.1 on the tenant's LD_LIBRARY_PATH (or linked by the
 * application first) answered NOT_FOUND or "MIG" and the limiter never
 * throttled. The trusted copy is libnvidia-ml.so.1 in the folder the
 * driver itself was loaded from (dladdr of the real cuInit: the NVIDIA
 * container toolkit mounts both there), and only when this process cannot
 * change it (gp_fd_writable_by_us), on the driver's own filesystem (the
 * folder's libnvidia-ml.so.1 is a symlink in the image's writable layer:
 * repointed at a file on another read-only mount, a configMap volume say,
 * it would pass the first test). It is loaded through /proc/self/fd
 * from the descriptor that was checked, so nothing can swap the file in
 * between. NULL, with the reason in why, when there is none. */
static void *trusted_nvml(char *why, size_t n)
{
	void *sym = gp.libcuda ? gp.real_dlsym(gp.libcuda, "cuInit") : NULL;
	Dl_info di;
	const char *slash;
	if (sym == NULL || dladdr(sym, &di) == 0 || di.dli_fname == NULL || di.dli_fname[0] != '/' ||
	    (slash = strrchr(di.dli_fname, '/')) == NULL) {
		snprintf(why, n, "cannot tell which folder the driver was loaded from");
		return NULL;
	}
	char path[4096];
	snprintf(path, sizeof path, "%.*s/libnvidia-ml.so.1", (int)(slash - di.dli_fname), di.dli_fname);
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0) {
		snprintf(why, n, "%.300s (beside the driver) cannot be opened: %s", path, strerror(errno));
		return NULL;
	}
	const char *w = gp_fd_writable_by_us(fd);
	struct stat drv, nv;
	int dfd = open(di.dli_fname, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	int same = dfd >= 0 && fstat(dfd, &drv) == 0 && fstat(fd, &nv) == 0 && drv.st_dev == nv.st_dev;
	if (dfd >= 0)
		close(dfd);
	void *lib = NULL;
	if (w != NULL)
		snprintf(why, n, "%.300s %s", path, w);
	else if (!same)
		snprintf(why, n, "%.300s is not on the driver's filesystem", path);
	else {
		char fdpath[64];
		snprintf(fdpath, sizeof fdpath, "/proc/self/fd/%d", fd);
		if ((lib = dlopen(fdpath, RTLD_NOW | RTLD_LOCAL)) == NULL)
			snprintf(why, n, "%.300s cannot be loaded: %.150s", path, dlerror());
	}
	close(fd);
	return lib;
}

static void nvml_syms(void)
{
	if (gp.real_dlsym == NULL)
		return;
	char why[512];
	void *lib = trusted_nvml(why, sizeof why);
	if (lib == NULL && gp.cfg.from_file) {
		/* Limits from the node's file: never the tenant's NVML. */
		gp.nvml_untrusted = 1;
		gp_log(gp.cfg.any_sm_limit ? GP_LOG_ERROR : GP_LOG_INFO,
		       "NVML is not trusted: %s; %s", why,
		       gp.cfg.any_sm_limit ? "the SM limit is enforced by a fixed duty cycle instead"
					   : "contexts are charged the configured reserve");
		return;
	}
	if (lib == NULL) {
		/* The environment contract: the environment is the tenant's
		 * anyway (it can unset the limit), so its NVML will do. */
		gp_log(GP_LOG_DEBUG, "NVML by soname (%s)", why);
		lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	}
	if (lib == NULL)
		return;
	gp.nvml_init = (gp_fn_nvml_init)gp.real_dlsym(lib, "nvmlInit_v2");
	gp.nvml_byuuid = (gp_fn_nvml_byuuid)gp.real_dlsym(lib, "nvmlDeviceGetHandleByUUID");
	gp.nvml_procutil = (gp_fn_nvml_procutil)gp.real_dlsym(lib, "nvmlDeviceGetProcessUtilization");
	gp.nvml_util = (gp_fn_nvml_util)gp.real_dlsym(lib, "nvmlDeviceGetUtilizationRates");
	gp.nvml_procs = (gp_fn_nvml_procs)gp.real_dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3");
	gp.nvml_migmode = (gp_fn_nvml_migmode)gp.real_dlsym(lib, "nvmlDeviceGetMigMode");
	gp.nvml_ok = gp.nvml_init != NULL && gp.nvml_init() == NVML_SUCCESS && gp.nvml_byuuid && gp.nvml_procutil;
	if (!gp.nvml_ok && gp.cfg.from_file) {
		gp.nvml_untrusted = 1; /* the node's NVML, but unusable: the same safe mode */
		gp_log(gp.cfg.any_sm_limit ? GP_LOG_ERROR : GP_LOG_INFO, "NVML does not initialise; %s",
		       gp.cfg.any_sm_limit ? "the SM limit is enforced by a fixed duty cycle instead"
					   : "contexts are charged the configured reserve");
	}
}

static int nvml_ready(void)
{
	pthread_once(&gp.nvml_sym_once, nvml_syms);
	return gp.nvml_ok;
}

/* The NVML device of CUdevice dev (review 15). NVML numbers GPUs in PCI
 * order whatever CUDA_VISIBLE_DEVICES (the tenant's) says, so asking by
 * the CUDA ordinal read a sibling GPU's utilisation and process list
 * (its neighbour's samples charged to us, a sibling's host pid adopted).
 * The device is found by the UUID the driver gives for dev
 * (cuDeviceGetUuid[_v2], the driver's own, as the memory side's map) with
 * nvmlDeviceGetHandleByUUID; looked up once and cached. Where either
 * cannot answer, there is no NVML device for dev: the limiter stays in
 * its duty cycle, the host pid unknown, contexts charged the reserve
 * (fail closed, one line). */
static int nvml_dev(int dev, nvmlDevice_t *h)
{
	if (dev < 0 || dev >= GP_MAX_DEV)
		return -1;
	uintptr_t v = atomic_load_explicit(&gp.nvml_dev[dev], memory_order_acquire);
	if (v == 0) {
		CUuuid u;
		nvmlDevice_t d = NULL;
		int ok = 0;
		if (gp.nvml_byuuid && gp.dev_get_uuid && gp.dev_get_uuid(&u, (CUdevice)dev) == CUDA_SUCCESS) {
			const unsigned char *b = (const unsigned char *)u.bytes;
			char hex[40];
			snprintf(hex, sizeof hex,
				 "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
				 b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
			static const char *const pre[] = {"GPU-", "MIG-"};
			for (int i = 0; i < 2 && !ok; i++) {
				char name[48];
				snprintf(name, sizeof name, "%s%s", pre[i], hex);
				ok = gp.nvml_byuuid(name, &d) == NVML_SUCCESS;
				if (ok && i == 1)
					atomic_store(&gp.nvml_dev_mig[dev], 1);
			}
		}
		v = ok ? (uintptr_t)d + 2 : 1;
		uintptr_t z = 0;
		if (atomic_compare_exchange_strong(&gp.nvml_dev[dev], &z, v) && !ok)
			gp_log(GP_LOG_WARN, "device %d: NVML cannot be asked for it by its UUID; the SM limit is held by a "
			       "fixed duty cycle and contexts are charged the configured reserve", dev);
		else
			v = atomic_load(&gp.nvml_dev[dev]);
	}
	if (v == 1)
		return -1;
	*h = (nvmlDevice_t)(v - 2);
	return 0;
}

/* ---- host pid ----------------------------------------------------------- */

/* NVML's compute processes on dev, all of them: malloc'd (the caller
 * frees it), *np entries; NULL when NVML cannot say. A fixed 64 made a
 * node with more processes on the device (NVML_ERROR_INSUFFICIENT_SIZE)
 * look like one NVML cannot list: no host pid, contexts unmeasured
 * (review 15). The list may grow between two calls: retried a few times
 * with the size NVML asks, plus room. */
static nvmlProcessInfo_t *list_procs(int dev, unsigned *np)
{
	nvmlDevice_t h;
	if (!gp.nvml_procs || nvml_dev(dev, &h) != 0)
		return NULL;
	unsigned cap = 64;
	for (int try = 0; try < 4; try++) {
		nvmlProcessInfo_t *p = calloc(cap, sizeof *p);
		if (p == NULL)
			return NULL;
		unsigned n = cap;
		nvmlReturn_t rc = gp.nvml_procs(h, &n, p);
		if (rc == NVML_SUCCESS) {
			*np = n < cap ? n : cap;
			return p;
		}
		free(p);
		if (rc != NVML_ERROR_INSUFFICIENT_SIZE || n > (1u << 16))
			return NULL;
		cap = (n > cap ? n : 2 * cap) + 16;
	}
	return NULL;
}

/* NVML reports usedGpuMemory as NVML_VALUE_NOT_AVAILABLE (~0) where it
 * cannot tell per-process memory (MIG without privilege, vGPU guests,
 * WDDM). That, or any figure above the device's total, is "cannot
 * measure", never a size: read as one it charged a context 2^64-1 bytes
 * and refused every context under a memory limit (review 15). */
static int mem_unknown(int dev, unsigned long long v)
{
	if (v == ~0ull)
		return 1;
	size_t total = 0;
	return gp.dev_total_mem && gp.dev_total_mem(&total, (CUdevice)dev) == CUDA_SUCCESS && total > 0 && v > total;
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
	unsigned n0, n1;
	nvmlProcessInfo_t *l0 = list_procs(dev, &n0), *l1;
	if (l0 == NULL)
		return;
	if (gp_charge(dev, PROBE) != CUDA_SUCCESS) {
		free(l0);
		return;
	}
	CUdeviceptr d;
	if (gp.mem_alloc(&d, PROBE) != CUDA_SUCCESS) {
		gp_uncharge(dev, PROBE);
		free(l0);
		return;
	}
	l1 = list_procs(dev, &n1);
	gp.mem_free(d);
	gp_uncharge(dev, PROBE);
	unsigned hit = 0, nhit = 0;
	for (int c = 0; c < nc && l1; c++)
		for (unsigned i = 0; i < n1; i++) {
			if (l1[i].pid != gp.host_cands[c])
				continue;
			unsigned long long before = 0, after = l1[i].usedGpuMemory;
			for (unsigned j = 0; j < n0; j++)
				if (l0[j].pid == l1[i].pid)
					before = l0[j].usedGpuMemory;
			if (mem_unknown(dev, before) || mem_unknown(dev, after))
				continue; /* no figure, no probe */
			if (after >= before + PROBE && after < before + 2 * PROBE) {
				hit = l1[i].pid;
				nhit++;
			}
		}
	free(l0);
	free(l1);
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
	unsigned n;
	nvmlProcessInfo_t *l = list_procs(dev, &n);
	if (l == NULL)
		return -1;
	int rc = 0;
	*out = 0; /* not listed: no context, no memory on dev */
	for (unsigned i = 0; i < n; i++)
		if (l[i].pid == self) {
			if (mem_unknown(dev, l[i].usedGpuMemory))
				rc = -1; /* listed, but NVML cannot tell: the caller charges the reserve */
			*out = l[i].usedGpuMemory;
		}
	free(l);
	return rc;
}

void gp_hostpid_before(int dev, struct gp_pidsnap *s)
{
	s->ok = 0;
	s->procs = NULL;
	if (!want_hostpid(dev) || !nvml_ready())
		return;
	if ((s->procs = list_procs(dev, &s->n)) != NULL)
		s->ok = 1;
}

void gp_hostpid_after(int dev, struct gp_pidsnap *s, int created)
{
	if (!s->ok || !created || !want_hostpid(dev)) {
		free(s->procs);
		return;
	}
	unsigned fresh[8], nfresh = 0, n = 0;
	nvmlProcessInfo_t *now = list_procs(dev, &n);
	for (unsigned i = 0; now && i < n; i++) {
		int old = 0;
		for (unsigned j = 0; j < s->n; j++)
			old |= now[i].pid == s->procs[j].pid;
		if (!old && nfresh < 8)
			fresh[nfresh++] = now[i].pid;
	}
	free(now);
	free(s->procs);
	s->procs = NULL;
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

/* Our utilisation in the newest samples (stamped in (since, until]), or
 * -1 when unknown: the container's processes' host pids (this one's and
 * those recorded in the shared region) summed. While this process's own
 * host pid is unknown its utilisation cannot be told apart, unless the
 * sample lists a single process, not one of the container's others, while
 * we launched: then we are alone on the device and it is us.
 *
 * *charge is what the container's budget is charged for the samples:
 * the same sum, but a listed process of the container read at 0 % counts
 * 1 % (session 13 review: NVML's smUtil is a whole percent, so a process
 * kept just under 1 % of every window was charged nothing, and m of them
 * took about m % beyond the limit; a process is listed only for a window
 * it ran in, so an idle one is not charged). *self is 1 when this
 * process is listed (or is the lone process taken for us). */
static double attribute(struct gp_limiter *l, nvmlProcessUtilizationSample_t *s, unsigned n,
			unsigned long long since, unsigned long long until, double admitted, double *charge, int *self_in)
{
	unsigned ours[MAX_PIDS];
	int no = gp_region_hostpids(&gp.region, ours, MAX_PIDS - 1);
	unsigned self = atomic_load(&gp.host_pid);
	if (self != 0)
		ours[no++] = self;
	double sum = 0, ch = 0;
	unsigned listed = 0, last = 0, sib = 0;
	*self_in = 0;
	for (unsigned i = 0; i < n; i++) {
		if (s[i].timeStamp <= since || s[i].timeStamp > until)
			continue;
		listed++;
		last = i;
		for (int j = 0; j < no; j++)
			if (s[i].pid == ours[j]) {
				sum += s[i].smUtil;
				ch += s[i].smUtil > 0 ? s[i].smUtil : 1;
				sib = 1;
				if (self != 0 && s[i].pid == self)
					*self_in = 1;
				break;
			}
	}
	*charge = ch;
	if (self != 0)
		return sum;
	if (listed == 1 && admitted > 0 && !sib) {
		*self_in = 1;
		*charge = s[last].smUtil > 0 ? s[last].smUtil : 1;
		return s[last].smUtil; /* alone on the device: it is us */
	}
	if (listed == 0)
		return no > 0 ? 0 : -1; /* nobody ran (a neighbour's window only) */
	(void)l;
	return -1;
}

/* The container's budget for dev (review 15): the shared region's slot of
 * dev's limits index, so every process of the container (and every
 * process after it) spends and pays into one budget; the process's own
 * only for a device with no limits index. */
static struct gp_sm_budget *budget_of(int dev, struct gp_limiter *l)
{
	struct gp_sm_budget *b = atomic_load_explicit(&l->budget, memory_order_acquire);
	if (b != NULL)
		return b;
	b = gp_region_budget(&gp.region, gp_dev_index(dev));
	if (b == NULL)
		b = &l->local;
	atomic_store_explicit(&l->budget, b, memory_order_release);
	return b;
}

/* The container's sample cadence as last seen by any of its processes,
 * bounded (the region is tenant-writable): 0 when unknown. */
static unsigned long long shared_cadence(struct gp_sm_budget *b)
{
	unsigned long long c = atomic_load(&b->cadence_us);
	return c < MIN_GAP_US ? 0 : c > 2000000ull ? 2000000ull : c;
}

/* The budget grows by target % of the wall time since the container's
 * last accrual, up to what one sample window and the burst would spend
 * (so a container idle for a while cannot bank more than that). Each
 * interval is accrued once, by whichever process's tick claims it (CAS on
 * accrued_ns); a budget above the cap (written by a tenant, or a cap that
 * shrank) is brought back to it. */
static void accrue(struct gp_limiter *l, struct gp_sm_budget *b)
{
	uint64_t now = gp_now_ns();
	double win = l->cadence_us ? (double)l->cadence_us : shared_cadence(b) ? (double)shared_cadence(b) : 1e6;
	int64_t max = (int64_t)((double)l->target / 100.0 * (win + 250000.0) * 1e3);
	uint64_t last = atomic_load(&b->accrued_ns);
	if (last == 0 || last > now + 1000000000ull) {
		/* Never accrued, or a time from the future (a tenant's write):
		 * start from now. */
		atomic_compare_exchange_strong(&b->accrued_ns, &last, now);
		return;
	}
	if (last >= now)
		return; /* another process accrued up to a moment after our clock read */
	if (!atomic_compare_exchange_strong(&b->accrued_ns, &last, now))
		return; /* another process accrued this interval */
	uint64_t dt = now - last;
	int64_t add = dt > 3600000000000ull ? max : (int64_t)((double)l->target / 100.0 * (double)dt);
	int64_t cur = atomic_load(&b->credit_ns), nv;
	do {
		nv = cur > max || add > max - cur ? max : cur + add;
	} while (!atomic_compare_exchange_weak(&b->credit_ns, &cur, nv));
}

/* Claims the samples stamped in (old, ts] for charging: 1 and *old when
 * this process is the first of the container to see ts. A charged stamp
 * in the future is from before a backward step of the wall clock (or a
 * tenant's write): it is replaced. */
static int claim(struct gp_sm_budget *b, unsigned long long ts, unsigned long long rt, unsigned long long *old)
{
	uint64_t o = atomic_load(&b->charged_ts);
	while (ts > o || o > rt + FUTURE_US) {
		if (atomic_compare_exchange_weak(&b->charged_ts, &o, ts)) {
			*old = o > rt + FUTURE_US ? 0 : o;
			return 1;
		}
	}
	return 0;
}

/* Review 15: what this process may still have running on dev that no
 * NVML sample covered starts at its first launch since the last sample
 * that did (region.c I10); its slot says so, so that whoever zeroes the
 * slot (this process at exit, a reclaimer after a SIGKILL) charges it. */
static void note_launch(int dev, struct gp_limiter *l)
{
	uint64_t now = gp_now_ns();
	atomic_store_explicit(&l->last_launch_ns, now, memory_order_relaxed);
	gp_region_sm_alive(&gp.region);
	gp_region_sm_from(&gp.region, gp_dev_index(dev), now, 0);
}

/* A poll of NVML moved what is covered: a sample stamped at end_ns
 * (monotonic) reported everything up to it; and when this process was not
 * in it (or there was no sample) and launched nothing for a whole window
 * before, nothing of it can be running unreported. */
static void covered(int dev, struct gp_limiter *l, uint64_t end_ns, int listed, uint64_t now_ns, unsigned long long c)
{
	int i = gp_dev_index(dev);
	if (i < 0)
		return;
	uint64_t last = atomic_load_explicit(&l->last_launch_ns, memory_order_relaxed);
	uint64_t cns = (uint64_t)c * 1000ull;
	if (end_ns != 0)
		gp_region_sm_from(&gp.region, i, end_ns, 1);
	uint64_t ref = end_ns != 0 ? end_ns : now_ns > cns ? now_ns - cns : 0;
	if (!listed && ref > cns && last < ref - cns)
		gp_region_sm_from(&gp.region, i, 0, 0);
}

/* Session 13: NVML lists this process at 0 % for a window in which it
 * launched `obs` cost units a second: it ran under 1 % (smUtil is a whole
 * percent), so a unit costs under 1/obs percent-seconds, and the rate
 * target * obs gives under the target. Before, a 0 % sample taught the
 * limiter nothing: next to a busy neighbour a process in the fail-closed
 * duty cycle (whose synchronisation also waits out the neighbour's queued
 * work) ran under 1 % and never calibrated (0.12 % under a 10 % limit,
 * 0.03 % under 5 %), and a calibrated process whose kernels became lighter
 * kept a rate too low for them. The bound calibrates an uncalibrated
 * process and raises the rate wherever it is above it; it is a lower
 * bound on the right rate, so it is marked, and while it stands each 0 %
 * sample in which the rate held us back raises it again (by target, at
 * least twice: a light start that calibrated from a few launches grows as
 * soon as its demand does, rather than keep its rate for good, which is
 * what the rule first tried did: 0.20 % under 10 %). The first real
 * reading replaces it. The floor is set from real readings only; the
 * container's budget, charged from NVML (a 0 % process at 1 %), bounds
 * what any rate can take. */
static void learn_bound(int dev, struct gp_limiter *l, double obs, int held)
{
	double kb = 1.0 / obs;
	pthread_mutex_lock(&l->mu);
	double r = (double)l->target * obs;
	if (held && r < 2 * obs)
		r = 2 * obs;
	if (l->rate > 0 && !(held && l->k_bound) && r <= l->rate) {
		pthread_mutex_unlock(&l->mu);
		return; /* the bound is below what we have: nothing new */
	}
	if (l->rate > 0 && held && l->k_bound && r < 2 * l->rate)
		r = 2 * l->rate;
	if (r < l->floor)
		r = l->floor;
	if (l->rate <= 0)
		l->tokens = 0;
	l->rate = r;
	l->k = (double)l->target / r;
	l->k_bound = 1;
	pthread_mutex_unlock(&l->mu);
	gp_log(GP_LOG_DEBUG, "limiter dev %d: read 0 %% at %.0f/s admitted (held %d): a unit costs under %.3g; rate %.0f",
	       dev, obs, held, kb, r);
}

/* Issue 15 L3: the ring is kept in monotonic time, and NVML's stamps (wall
 * clock, CPU microseconds) are moved onto it with the offset between the
 * clocks read at the same tick. Before, the ring was in wall-clock time:
 * a clock stepped back made every later sample look older than the last
 * one seen (stale: the limiter learnt nothing until the clock caught up),
 * and stepped forward, one window fell between ring entries of two times.
 * A step is detected (the offset moved by more than STEP_US): NVML's
 * stamps before and after it are not comparable, so the last stamp seen
 * and the gaps are forgotten (the rate is held), and a sample stamped in
 * the future is one from before a backward step, ignored. */
static void control(int dev, struct gp_limiter *l)
{
	unsigned long long rt;
	long long off;
	clocks_us(&rt, &off);
	struct gp_sm_budget *b = budget_of(dev, l);
	accrue(l, b);
	if (l->off_known && llabs(off - l->clock_off) > STEP_US) {
		gp_log(GP_LOG_INFO, "limiter dev %d: the wall clock stepped by %lld ms; NVML's stamps re-based", dev,
		       (off - l->clock_off) / 1000);
		l->last_sample_us = 0;
		l->ngaps = 0;
	}
	l->clock_off = off;
	l->off_known = 1;
	unsigned long long now = (unsigned long long)((long long)rt - off); /* monotonic */
	l->ring[l->ring_i].us = now;
	l->ring[l->ring_i].cum = atomic_load(&l->launched);
	l->ring_i = (l->ring_i + 1) % GP_RING;
	if (l->ring_n < GP_RING)
		l->ring_n++;
	nvmlDevice_t h;
	if (!nvml_ready() || nvml_dev(dev, &h) != 0)
		return;
	nvmlProcessUtilizationSample_t s[MAX_SAMPLES];
	unsigned n = MAX_SAMPLES;
	unsigned long long prev_poll = l->poll_rt;
	l->poll_rt = rt;
	unsigned long long cad = l->cadence_us ? l->cadence_us : shared_cadence(b) ? shared_cadence(b) : 1000000ull;
	if (gp.nvml_procutil(h, s, &n, l->last_sample_us) != NVML_SUCCESS) {
		covered(dev, l, 0, 0, now * 1000ull, cad);
		return; /* NOT_FOUND: no sample since the last one; hold */
	}
	unsigned long long ts = 0, since = l->last_sample_us, until = rt + FUTURE_US;
	for (unsigned i = 0; i < n; i++)
		if (s[i].timeStamp > ts && s[i].timeStamp <= until)
			ts = s[i].timeStamp;
	if (ts <= since) {
		covered(dev, l, 0, 0, now * 1000ull, cad);
		return; /* stale: hold */
	}
	{
		unsigned self = atomic_load(&gp.host_pid);
		int listed = self == 0; /* cannot tell: as if listed */
		for (unsigned i = 0; i < n && !listed; i++)
			listed = s[i].pid == self && s[i].timeStamp > since && s[i].timeStamp <= until;
		long long e = (long long)ts - off;
		covered(dev, l, e > 0 ? (uint64_t)e * 1000ull : 1, listed, now * 1000ull, cad);
	}
	unsigned long long gap = ts - since;
	l->last_sample_us = ts;
	if (since != 0 && gap < MIN_GAP_US)
		return; /* the same window stamped twice: no new information */
	if (since != 0) {
		/* The cadence is the smallest of the last gaps, so one odd gap
		 * cannot shrink every later window for good. */
		l->gaps[l->ngaps++ % 8] = gap;
		l->cadence_us = 0;
		for (int i = 0; i < (l->ngaps < 8 ? l->ngaps : 8); i++)
			if (l->cadence_us == 0 || l->gaps[i] < l->cadence_us)
				l->cadence_us = l->gaps[i];
		atomic_store(&b->cadence_us, l->cadence_us);
	}
	/* This process's first sample: its window's length is the
	 * container's cadence, if a process of it has seen one (review 15: a
	 * fresh process charges what the one before it ran after its last
	 * sample); otherwise not known yet. */
	unsigned long long win = l->cadence_us ? l->cadence_us : shared_cadence(b);
	if (win == 0) {
		/* No process of the container has seen two samples yet (each
		 * may live shorter than a cadence: review 15). The gap from the
		 * last stamp the container charged is one, or several, windows:
		 * its smallest so far is the cadence. */
		unsigned long long c = atomic_load(&b->charged_ts);
		if (c != 0 && ts > c + MIN_GAP_US && ts - c <= 2000000ull)
			atomic_store(&b->cadence_us, ts - c);
		else if (c == 0 || ts > c + MIN_GAP_US)
			claim(b, ts, rt, &c); /* the container's first: only its stamp is known */
		if ((win = shared_cadence(b)) == 0)
			return;
	}
	long long tm = (long long)ts - off; /* the sample's end on the monotonic ring */
	unsigned long long end = tm > 0 ? (unsigned long long)tm : 0;
	double admitted = cum_at(l, end) - cum_at(l, end > win ? end - win : 0);
	double ucharge;
	int self_in;
	double u = attribute(l, s, n, since, until, admitted, &ucharge, &self_in);
	if (u < 0) {
		/* H3(b): the duty cycle paces launches until a sample can be
		 * attributed again (gp_limiter_admit). */
		if (!atomic_exchange(&l->unknown, 1) && !l->said_unknown) {
			l->said_unknown = 1;
			gp_log(GP_LOG_WARN, "SM limiter dev %d: this process's host pid is unknown and the device is "
			       "shared, so NVML cannot tell its utilisation from its neighbours'; the SM limit of %d %% is "
			       "enforced by a fixed duty cycle while it stays so", dev, l->target);
		}
		return;
	}
	atomic_store(&l->unknown, 0);
	/* H1/H2: what the container ran comes off the budget, whatever the
	 * launches were, once per sample for the whole container (review 15):
	 * the first of its processes to see a stamp charges the samples since
	 * the last one charged. A sample covers one window (the cadence); when
	 * samples were missed (this thread was late, gap > 1.5 windows; only
	 * when nobody charged in between) and we were running before or
	 * launched since, the time since that poll is charged at this
	 * sample's rate (the driver keeps only the last sample). A gap of
	 * NOT_FOUND polls is idle time, not missed. */
	unsigned long long old;
	if (claim(b, ts, rt, &old)) {
		double uc = ucharge;
		int ign;
		if (old != since && attribute(l, s, n, old, until, admitted, &uc, &ign) < 0)
			uc = ucharge;
		double charged = (double)win;
		unsigned long long pgap = rt - prev_poll;
		if (old == since && since != 0 && prev_poll != 0 && pgap > win + win / 2 && pgap <= gap &&
		    (l->u_prev > 0 || cum_at(l, end > win ? end - win : 0) > cum_at(l, end > gap ? end - gap : 0)))
			charged = (double)pgap;
		if (uc > 0) {
			atomic_fetch_sub(&b->credit_ns, (int64_t)(uc / 100.0 * charged * 1e3));
			gp_log(GP_LOG_DEBUG, "limiter dev %d: the container ran %.1f %% of %.0f us; budget %.0f us", dev,
			       uc, charged, (double)atomic_load(&b->credit_ns) / 1e3);
		}
	}
	l->u_prev = u;
	int held = atomic_exchange_explicit(&l->waited, 0, memory_order_relaxed);
	if (since == 0)
		return; /* nothing to learn from the first sample */
	double obs = admitted / ((double)win / 1e6);
	if (obs <= 0)
		return; /* nothing of ours ran: nothing to learn */
	if (u <= 0) {
		if (self_in)
			learn_bound(dev, l, obs, held);
		return;
	}
	double k = u / obs;
	/* A cost learnt from a bound (below) is replaced by the first real
	 * reading, not averaged with it. */
	l->k = l->k > 0 && !l->k_bound ? sqrt(l->k * k) : k;
	l->k_bound = 0;
	double r = (double)l->target / l->k;
	pthread_mutex_lock(&l->mu);
	if (l->floor == 0)
		l->floor = r / 4; /* from a real reading only */
	if (r < l->floor)
		r = l->floor;
	if (l->rate <= 0)
		l->tokens = 0;
	l->rate = r;
	pthread_mutex_unlock(&l->mu);
	gp_log(GP_LOG_DEBUG, "limiter dev %d: util %.1f in %llu us, admitted %.0f/s, target %d, rate %.0f, budget %.0f us",
	       dev, u, win, obs, l->target, r, (double)atomic_load(&b->credit_ns) / 1e3);
}

static void *control_loop(void *arg)
{
	(void)arg;
	uint64_t period_ns = (uint64_t)gp.cfg.sm_period_ms * 1000000ull, reclaimed = 0;
	for (;;) {
		struct timespec ts = {(time_t)(period_ns / 1000000000ull), (long)(period_ns % 1000000000ull)};
		while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
			;
		gp_region_sm_alive(&gp.region);
		/* Review 15: a SIGKILLed process's unreported time is charged
		 * when its slot is reclaimed, so dead slots are looked for
		 * twice a second, not only when memory runs short. */
		uint64_t t = gp_now_ns();
		if (t - reclaimed >= 500000000ull) {
			reclaimed = t;
			gp_region_reclaim_dead(&gp.region);
		}
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
		gp.lim[d].target = gp_sm_limit(d);
	}
	atomic_store(&gp.sm_active, gp.cfg.any_sm_limit && !gp.cfg.disabled);
}

static void start_control(void)
{
	int z = 0;
	if (!atomic_compare_exchange_strong(&gp.limiter_started, &z, 1))
		return;
	/* hook15 review H1: before this process's first launch passes, the
	 * container's dead processes are charged what they ran unreported
	 * (region.c settle_tail), so a process that starts after another was
	 * killed starts in its debt. Else only a ticking control thread looks
	 * for dead slots, and a relay of processes that each live shorter
	 * than a period has none. */
	if (gp.region.r != NULL && gp.region.sm)
		gp_region_reclaim_dead(&gp.region);
	if (!nvml_ready()) {
		if (gp.nvml_untrusted) {
			for (int d = 0; d < GP_MAX_DEV; d++)
				gp.lim[d].duty = gp.lim[d].target != 0;
			return; /* logged by nvml_syms */
		}
		gp_log(GP_LOG_ERROR, "SM limit set but NVML is unavailable; launches are not throttled");
		return;
	}
	/* Only devices the driver has (hook15 review L5): a limit for every
	 * index (CUDA_DEVICE_SM_LIMIT) asked NVML for devices that do not
	 * exist, one WARN line each (here and at every control tick). No
	 * launch can reach an index at or past the driver's count, so there is
	 * nothing to throttle there. */
	int ndev = GP_MAX_DEV;
	CUresult (*count)(int *) = gp.libcuda ? (CUresult(*)(int *))gp.real_dlsym(gp.libcuda, "cuDeviceGetCount") : NULL;
	if (count && count(&ndev) != CUDA_SUCCESS)
		ndev = GP_MAX_DEV;
	for (int d = ndev < 0 ? 0 : ndev; d < GP_MAX_DEV; d++)
		gp.lim[d].target = 0;
	/* On a MIG device the slice is the SM limit, and NVML reports no
	 * per-process utilisation: say so, once, and do not throttle. */
	for (int d = 0; d < ndev && d < GP_MAX_DEV; d++) {
		nvmlDevice_t h;
		unsigned cur = 0, pend = 0;
		if (gp.lim[d].target == 0 || nvml_dev(d, &h) != 0)
			continue;
		/* A CUDA device with a MIG UUID is a MIG instance (its handle
		 * has no MIG mode of its own); else the GPU's mode. */
		if (!atomic_load(&gp.nvml_dev_mig[d]) &&
		    (!gp.nvml_migmode || gp.nvml_migmode(h, &cur, &pend) != NVML_SUCCESS || cur != 1 /* NVML_DEVICE_MIG_ENABLE */))
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

/* Duty cycle, for when NVML cannot be trusted (limits from the node's
 * file): without a trusted measure of SM time the limiter cannot learn
 * what a launch costs, so it bounds time instead. Launches pass for
 * target % of a period; then the launching thread waits until the device
 * has run everything the process queued on it (sync_device: every context
 * of the process on the device), and no launch
 * passes for busy * (100 - target) / target, busy being the wall time from
 * the first launch of the phase to the end of that wait. The device ran
 * our work at most `busy`, so our share is at most the target (less when
 * the device was idle part of it, or ran a neighbour's work: conservative).
 * Costs: one synchronisation per period in the thread that ends a phase;
 * an application whose queued work waits for that very thread (a stream
 * waiting on a value it has yet to write) would deadlock. Only this mode
 * synchronises. */
void gp_ctx_register(int dev, CUcontext c)
{
	uint64_t v = (uint64_t)(uintptr_t)c;
	if (dev < 0 || dev >= GP_MAX_DEV || v == 0)
		return;
	for (int i = 0; i < GP_MAX_CTX; i++)
		if (atomic_load(&gp.ctxs[dev][i]) == v)
			return; /* the primary context, retained again */
	for (int i = 0; i < GP_MAX_CTX; i++) {
		uint64_t z = 0;
		if (atomic_compare_exchange_strong(&gp.ctxs[dev][i], &z, v))
			return;
	}
	if (!atomic_exchange(&gp.ctxs_full, 1))
		gp_log(GP_LOG_WARN, "more than %d contexts on device %d: the SM limiter's duty cycle does not wait for the "
		       "work of the rest", GP_MAX_CTX, dev);
}

void gp_ctx_forget(CUcontext c)
{
	uint64_t v = (uint64_t)(uintptr_t)c;
	for (int d = 0; v != 0 && d < GP_MAX_DEV; d++)
		for (int i = 0; i < GP_MAX_CTX; i++) {
			uint64_t w = v;
			atomic_compare_exchange_strong(&gp.ctxs[d][i], &w, 0);
		}
}

/* Waits until the device has run what this process queued on dev: the
 * current context's work, and every other context of the process on dev
 * (each pushed current for its cuCtxSynchronize). Review 15: waiting for
 * the current context alone let heavy kernels from a second context run
 * through the duty cycle's off phases (84-99 % under 30 %). */
static void sync_device(int dev)
{
	if (gp.ctx_sync == NULL)
		return;
	gp.ctx_sync();
	CUcontext cur = NULL, popped;
	if (gp.ctx_get_current)
		gp.ctx_get_current(&cur);
	for (int i = 0; i < GP_MAX_CTX && gp.ctx_push && gp.ctx_pop; i++) {
		uint64_t v = atomic_load(&gp.ctxs[dev][i]);
		if (v == 0 || (CUcontext)(uintptr_t)v == cur || gp.ctx_push((CUcontext)(uintptr_t)v) != CUDA_SUCCESS)
			continue;
		gp.ctx_sync();
		gp.ctx_pop(&popped);
	}
}

/* Hook15 review M3: with no trusted NVML nothing charged the container's
 * budget, and the duty cycle's phase is per process, so a container that
 * ran each kernel in a fresh process was never held (54-65 % under 30 %:
 * each process's first phase passes). Now the duty cycle pays into the
 * container's budget what it can bound: each phase ends with every launch
 * of it run (sync_device, no launch of the process passes meanwhile), so
 * the device ran our work for at most the phase's wall time, which is
 * charged, and nothing of ours is left unreported (the slot's span is
 * cleared). What a process runs after its last phase (one kernel, then
 * exit or SIGKILL) stays in its slot's span, charged at 100 % when the
 * slot is zeroed (region.c settle_tail), before the container's next
 * process launches (start_control reclaims the dead). The budget accrues
 * at every launch in this mode (there is no control thread), and no
 * launch passes while it is negative (govern_locked). A lone process
 * pays its phases exactly what they accrue; several at once are charged
 * each its own phases (the sum of their phases bounds the device time the
 * container used), so together they get at most the target, less when
 * their phases overlap: conservative, like the mode. */
static void duty_charge(struct gp_limiter *l, uint64_t busy_ns)
{
	int dev = (int)(l - gp.lim);
	struct gp_sm_budget *b = budget_of(dev, l);
	atomic_fetch_sub(&b->credit_ns, (int64_t)(busy_ns > (uint64_t)INT64_MAX ? INT64_MAX : busy_ns));
	gp_region_sm_from(&gp.region, gp_dev_index(dev), 0, 0);
}

static void duty_locked(struct gp_limiter *l)
{
	uint64_t on_ns = (uint64_t)gp.cfg.sm_period_ms * 1000000ull * (uint64_t)l->target / 100;
	if (!l->in_duty) { /* a phase begins: none is left from an earlier spell */
		l->in_duty = 1;
		l->on_start = 0;
	}
	for (;;) {
		uint64_t now = gp_now_ns();
		if (l->off_until > now) { /* off, or another thread is waiting for the device */
			uint64_t w = l->off_until - now;
			struct timespec ts = {0, (long)(w < 2000000 ? w : 2000000)};
			pthread_mutex_unlock(&l->mu);
			nanosleep(&ts, NULL);
			pthread_mutex_lock(&l->mu);
			continue;
		}
		if (l->on_start == 0)
			l->on_start = now;
		if (now - l->on_start < on_ns)
			break;
		uint64_t start = l->on_start;
		l->off_until = UINT64_MAX;
		pthread_mutex_unlock(&l->mu);
		sync_device((int)(l - gp.lim));
		uint64_t t = gp_now_ns();
		pthread_mutex_lock(&l->mu);
		l->off_until = t + (t - start) / (uint64_t)l->target * (uint64_t)(100 - l->target);
		l->on_start = 0;
		if (l->duty)
			duty_charge(l, t - start);
	}
}


/* H1/H2: no launch passes while the budget is negative (what NVML says
 * the container ran is more than target % of the time). Called with mu
 * held; waits at most 2 ms at a time so the control thread's updates take
 * effect promptly. */
static void govern_locked(int dev, struct gp_limiter *l)
{
	struct gp_sm_budget *b = budget_of(dev, l);
	int64_t c;
	if (l->duty)
		accrue(l, b); /* no control thread in this mode (M3) */
	while ((c = atomic_load_explicit(&b->credit_ns, memory_order_relaxed)) < 0) {
		double wait = -(double)c * 100.0 / (double)l->target + 1000;
		if (wait > 2e6)
			wait = 2e6;
		pthread_mutex_unlock(&l->mu);
		struct timespec ts = {0, (long)wait};
		nanosleep(&ts, NULL);
		pthread_mutex_lock(&l->mu);
		if (l->duty)
			accrue(l, b);
	}
}

/* Session 14 (the hook15 review's PoC "slots full"): a process of a
 * container with a shared accounting file that has no slot in it (1024
 * processes of the container hold every slot, or the file could not be
 * used) was limited per process: no slot records its host pid (the
 * others never count its utilisation) or its unreported span (never
 * charged), so a tenant that parked 1024 idle processes ran every later
 * one outside the container's SM budget. Its memory is already refused
 * (dispatch.c: the region fails closed); under an SM limit its launches
 * are now refused too (CUDA_ERROR_NOT_PERMITTED, one ERROR line), for the
 * process's life, like its memory. Without a shared file (the
 * environment's contract with no CUDA_DEVICE_MEMORY_SHARED_CACHE) the
 * accounting is per process by configuration and nothing changes. */
static int sm_slotless(int dev)
{
	if (gp.cfg.shared_cache[0] == 0 || (gp.region.r != NULL && gp.region.slot >= 0) || atomic_load(&gp.exited))
		return 0; /* no shared file, a slot, or detached at exit */
	static _Atomic int said;
	if (!atomic_exchange(&said, 1))
		gp_log(GP_LOG_ERROR, "SM limit of %d %% on device %d but this process has no slot in the shared "
		       "accounting file %s (full, or unusable: logged above): its launches are refused, as its GPU "
		       "memory is", gp.lim[dev].target, dev, gp.cfg.shared_cache);
	return 1;
}

int gp_limiter_admit(int dev, uint64_t cost)
{
	if (dev < 0 || dev >= GP_MAX_DEV)
		return 0;
	struct gp_limiter *l = &gp.lim[dev];
	if (l->target == 0)
		return 0;
	if (!atomic_load_explicit(&gp.limiter_started, memory_order_acquire)) {
		start_control();
		if (l->target == 0)
			return 0; /* MIG: start_control turned it off */
	}
	if (__builtin_expect(gp.region.slot < 0, 0) && sm_slotless(dev))
		return CUDA_ERROR_NOT_PERMITTED;
	if (l->duty) {
		pthread_mutex_lock(&l->mu);
		govern_locked(dev, l);
		duty_locked(l);
		pthread_mutex_unlock(&l->mu);
		note_launch(dev, l);
		atomic_fetch_add_explicit(&l->launched, cost ? cost : 1, memory_order_relaxed);
		return 0;
	}
	if (__builtin_expect(atomic_load_explicit(&gp.host_ncands, memory_order_relaxed) > 1, 0) &&
	    atomic_load(&gp.host_pid) == 0)
		probe_hostpid(dev);
	if (cost == 0)
		cost = 1;
	pthread_mutex_lock(&l->mu);
	if (l->target == 0) { /* MIG, found by another thread's start_control */
		pthread_mutex_unlock(&l->mu);
		return 0;
	}
	govern_locked(dev, l);
	/* H3(b): fail closed. Until the first calibration, and while this
	 * process's samples cannot be attributed, nothing tells what a launch
	 * costs: the duty cycle bounds the share instead (before, launches
	 * passed unthrottled in both states). */
	int uncal = l->rate <= 0, unknown = atomic_load_explicit(&l->unknown, memory_order_relaxed);
	if (uncal || unknown) {
		if (uncal && !l->said_uncal) {
			l->said_uncal = 1;
			gp_log(GP_LOG_INFO, "SM limiter dev %d: not calibrated yet (it learns from NVML's second sample of "
			       "this process); a fixed duty cycle holds the SM limit of %d %% until then", dev, l->target);
		}
		duty_locked(l);
		l->last_ns = gp_now_ns();
		pthread_mutex_unlock(&l->mu);
		note_launch(dev, l);
		atomic_fetch_add_explicit(&l->launched, cost, memory_order_relaxed);
		return 0;
	}
	l->in_duty = 0;
	for (;;) {
		uint64_t now = gp_now_ns();
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
	note_launch(dev, l);
	atomic_fetch_add_explicit(&l->launched, cost, memory_order_relaxed);
	return 0;
}
