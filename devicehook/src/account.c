/*
 * Allocation accounting: which handle holds how many bytes on which device,
 * and the per-device charge against CUDA_DEVICE_MEMORY_LIMIT[_i].
 *
 * The handle table is a lock-free open-addressing hash (linear probing).
 * A key moves EMPTY -> BUSY (inserter owns the entry) -> handle (published
 * with release) -> TOMB (the one remover that won the CAS owns it). The
 * driver never hands out the same live handle twice, so a key is present
 * at most once. Tombstones are reused by inserts; lookups stop at EMPTY.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "state.h"

#define K_EMPTY 0ull
#define K_BUSY 1ull
#define K_TOMB 2ull

int gp_table_init(struct gp_table *t, unsigned log2cap)
{
	size_t n = (size_t)1 << log2cap;
	/* Anonymous mmap: pages are touched (and cost memory) only when used. */
	void *m = mmap(NULL, n * sizeof(struct gp_entry), PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED)
		return -1;
	/* Small pages: a transparent huge page would be zeroed (2 MiB) on the
	 * first insert, which costs more than the rest of init together. */
	madvise(m, n * sizeof(struct gp_entry), MADV_NOHUGEPAGE);
	t->e = m;
	t->mask = n - 1;
	atomic_store(&t->overflow, 0);
	return 0;
}

void gp_table_clear(struct gp_table *t)
{
	for (uint64_t i = 0; i <= t->mask; i++)
		if (atomic_load_explicit(&t->e[i].key, memory_order_relaxed) != K_EMPTY)
			atomic_store(&t->e[i].key, K_EMPTY);
}

static inline uint64_t mix(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdull;
	k ^= k >> 33;
	return k;
}

int gp_table_put(struct gp_table *t, uint64_t key, int kind, int dev, uint64_t size, uint64_t aux, uint64_t ctx)
{
	if (key <= K_TOMB)
		return -1;
	uint64_t i = mix(key) & t->mask;
	for (uint64_t n = 0; n <= t->mask; n++, i = (i + 1) & t->mask) {
		struct gp_entry *e = &t->e[i];
		uint64_t k = atomic_load_explicit(&e->key, memory_order_relaxed);
		if (k != K_EMPTY && k != K_TOMB)
			continue;
		if (!atomic_compare_exchange_strong(&e->key, &k, K_BUSY))
			continue;
		e->size = size;
		e->dev = dev;
		e->kind = kind;
		e->aux = aux;
		e->ctx = ctx;
		atomic_store_explicit(&e->key, key, memory_order_release);
		return 0;
	}
	atomic_fetch_add(&t->overflow, 1);
	return -1;
}

static struct gp_entry *find(struct gp_table *t, uint64_t key, int kind)
{
	uint64_t i = mix(key) & t->mask;
	for (uint64_t n = 0; n <= t->mask; n++, i = (i + 1) & t->mask) {
		struct gp_entry *e = &t->e[i];
		uint64_t k = atomic_load_explicit(&e->key, memory_order_acquire);
		if (k == K_EMPTY)
			return NULL;
		if (k == key && e->kind == kind)
			return e;
	}
	return NULL;
}

int gp_table_get(struct gp_table *t, uint64_t key, int kind, int *dev, uint64_t *size)
{
	struct gp_entry *e = find(t, key, kind);
	if (e == NULL)
		return 0;
	*dev = e->dev;
	*size = e->size;
	return 1;
}

int gp_table_take(struct gp_table *t, uint64_t key, int kind, int *dev, uint64_t *size, uint64_t *aux,
		  uint64_t *ctx)
{
	for (;;) {
		struct gp_entry *e = find(t, key, kind);
		if (e == NULL)
			return 0;
		int d = e->dev;
		uint64_t s = e->size, a = e->aux, c = e->ctx;
		uint64_t k = key;
		if (atomic_compare_exchange_strong(&e->key, &k, K_TOMB)) {
			*dev = d;
			*size = s;
			*aux = a;
			*ctx = c;
			return 1;
		}
		/* Lost a race with a concurrent free of the same handle (a double
		 * free in the application): look again; the winner owns it. */
	}
}

/* ---- devices and limits indices -----------------------------------------
 * Issue 14 finding 7: the limits and the shared region's per-device
 * counters used to be kept per CUdevice ordinal, which the tenant's
 * CUDA_VISIBLE_DEVICES chooses: with "0" in one process and "1,0" in
 * another, both charged GPU-A under different ordinals, up to twice its
 * limit. With GPUPACK_DEVICE_UUID_<i> in the trusted file, an ordinal
 * counts as the index whose UUID the driver reports for it; the map is
 * made once per device (the first charge on it) and cached. */

static void format_uuid(const unsigned char *u, char *out, size_t n)
{
	snprintf(out, n, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
		 u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

static int index_of_uuid(const unsigned char *u)
{
	for (int i = 0; i < GP_MAX_DEV; i++)
		if ((gp.cfg.uuid_set & (1u << i)) && !memcmp(gp.cfg.uuid[i], u, 16))
			return i;
	return GP_DEV_NONE;
}

int gp_dev_resolve(int dev)
{
	if (dev < 0 || dev >= GP_MAX_DEV)
		return GP_DEV_NONE;
	CUuuid u;
	CUresult rc = gp.dev_get_uuid ? gp.dev_get_uuid(&u, dev) : CUDA_ERROR_NOT_FOUND;
	if (rc == CUDA_ERROR_NOT_INITIALIZED)
		return GP_DEV_NONE; /* before cuInit: ask again next time */
	int i = rc == CUDA_SUCCESS ? index_of_uuid((const unsigned char *)u.bytes) : GP_DEV_NONE;
	int z = 0;
	if (!atomic_compare_exchange_strong(&gp.dev_index[dev], &z, i < 0 ? -1 : i + 1))
		return z > 0 ? z - 1 : GP_DEV_NONE; /* another thread asked first: its answer */
	if (i < 0) {
		char s[40] = "";
		if (rc == CUDA_SUCCESS)
			format_uuid((const unsigned char *)u.bytes, s, sizeof s);
		if (rc == CUDA_SUCCESS)
			gp_log(GP_LOG_ERROR, "CUDA device %d (UUID %s) is none of the GPUs in the limits file; "
			       "its GPU memory allocations are refused", dev, s);
		else
			gp_log(GP_LOG_ERROR, "CUDA device %d: the driver does not tell its UUID (%s %d); "
			       "its GPU memory allocations are refused", dev,
			       gp.dev_get_uuid ? "cuDeviceGetUuid returned" : "no cuDeviceGetUuid, error", rc);
	}
	return i;
}

/* Called at init, when the driver may not be initialised: the map is only
 * looked at, never made (that would log about devices that do not
 * exist). */
int gp_sm_limit(int dev)
{
	if (!gp.cfg.uuid_set)
		return dev >= 0 && dev < GP_MAX_DEV ? gp.cfg.sm_limit[dev] : 0;
	int v = dev >= 0 && dev < GP_MAX_DEV ? atomic_load(&gp.dev_index[dev]) : -1;
	if (v > 0)
		return gp.cfg.sm_limit[v - 1];
	/* Not mapped (yet): the tightest limit the file gives any GPU. */
	int t = 0;
	for (int j = 0; j < GP_MAX_DEV; j++)
		if ((gp.cfg.uuid_set & (1u << j)) && gp.cfg.sm_limit[j] != 0 && (t == 0 || gp.cfg.sm_limit[j] < t))
			t = gp.cfg.sm_limit[j];
	return t;
}

int gp_nvml_index(nvmlDevice_t d)
{
	if (!gp.cfg.uuid_set) {
		unsigned int idx;
		if (gp.nvml_index == NULL || gp.nvml_index(d, &idx) != NVML_SUCCESS || idx >= GP_MAX_DEV)
			return GP_DEV_NONE;
		return (int)idx;
	}
	char buf[96];
	unsigned char u[16];
	if (gp.nvml_uuid == NULL || gp.nvml_uuid(d, buf, sizeof buf) != NVML_SUCCESS)
		return GP_DEV_NONE;
	buf[sizeof buf - 1] = '\0';
	return gp_parse_uuid(buf, u) == 0 ? index_of_uuid(u) : GP_DEV_NONE;
}

int gp_index_dev(int i)
{
	if (!gp.cfg.uuid_set)
		return i;
	for (int d = 0; d < GP_MAX_DEV; d++)
		if (atomic_load(&gp.dev_index[d]) == i + 1)
			return d;
	return -1;
}

uint64_t gp_index_used(int i)
{
	return i < 0 ? 0 : gp_region_used(&gp.region, i);
}

CUresult gp_charge(int dev, uint64_t size)
{
	if (!gp_mem_limited(dev) || size == 0)
		return CUDA_SUCCESS;
	int i = gp_dev_index(dev);
	if (i >= 0 && gp_region_reserve(&gp.region, i, size, gp.cfg.mem_limit[i]) == 0)
		return CUDA_SUCCESS;
	gp_log(GP_LOG_INFO, "device %d: refusing %llu bytes (used %llu of %llu)", dev,
	       (unsigned long long)size, (unsigned long long)gp_used(dev),
	       (unsigned long long)gp_mem_limit(dev));
	return CUDA_ERROR_OUT_OF_MEMORY;
}

void gp_uncharge(int dev, uint64_t size)
{
	int i;
	if (gp_mem_limited(dev) && size != 0 && (i = gp_dev_index(dev)) >= 0)
		gp_region_release(&gp.region, i, size);
}

/* A device with no index (GP_DEV_NONE) has nowhere to be charged; nothing
 * is charged on it either, since every charge on it is refused. */
void gp_charge_force(int dev, uint64_t size)
{
	int i;
	if (gp_mem_limited(dev) && size != 0 && (i = gp_dev_index(dev)) >= 0)
		gp_region_add(&gp.region, i, size);
}

void gp_track(uint64_t key, int kind, int dev, uint64_t size, uint64_t pool)
{
	if (!gp_mem_limited(dev))
		return;
	CUcontext c = NULL;
	if (kind != GP_K_VMM && kind != GP_K_CTX && gp.ctx_get_current)
		gp.ctx_get_current(&c);
	if (gp_table_put(&gp.table, key, kind, dev, size, pool, (uint64_t)(uintptr_t)c) != 0)
		gp_log(GP_LOG_ERROR, "allocation table full; %llu bytes on device %d stay charged until exit",
		       (unsigned long long)size, dev);
}

int gp_untrack(uint64_t key, int kind)
{
	int dev;
	uint64_t size, pool, ctx;
	if (!gp_table_take(&gp.table, key, kind, &dev, &size, &pool, &ctx))
		return 0;
	if (pool)
		gp_pool_freed(pool, dev, size, GP_RESERVED_UNKNOWN);
	else
		gp_uncharge(dev, size);
	return 1;
}

void gp_untrack_ctx(uint64_t ctx)
{
	if (ctx == 0)
		return;
	for (uint64_t i = 0; i <= gp.table.mask; i++) {
		struct gp_entry *e = &gp.table.e[i];
		uint64_t k = atomic_load(&e->key);
		if (k > K_TOMB && e->ctx == ctx)
			gp_untrack(k, e->kind);
	}
}

/* ---- pools ---------------------------------------------------------------
 * A small registry under one mutex: pool operations are rare next to plain
 * allocations, and the mutex keeps live/slack/charge moves atomic. */


static int pool_find(uint64_t pool, int dev, int add)
{
	for (int i = 0; i < gp.pools.n; i++)
		if (gp.pools.e[i].pool == pool)
			return i;
	if (!add || gp.pools.n == GP_MAX_POOLS || dev < 0)
		return -1;
	gp.pools.e[gp.pools.n].pool = pool;
	gp.pools.e[gp.pools.n].dev = dev;
	gp.pools.e[gp.pools.n].live = gp.pools.e[gp.pools.n].slack = 0;
	gp.pools.e[gp.pools.n].npend = 0;
	return gp.pools.n++;
}

/* In a forked child: the parent's pools and blocks are not ours. */
void gp_pool_reset(void)
{
	pthread_mutex_init(&gp.pools.mu, NULL);
	gp.pools.n = 0;
}

static void reconcile_locked(int i, uint64_t reserved);

/* A destroyed pool's handle is dead: forget it (its reserve is uncharged;
 * blocks still live stay charged until freed), so nothing asks the driver
 * about it again. */
void gp_pool_forget(uint64_t pool)
{
	pthread_mutex_lock(&gp.pools.mu);
	int i = pool_find(pool, -1, 0);
	if (i >= 0) {
		reconcile_locked(i, 0);
		gp.pools.e[i] = gp.pools.e[gp.pools.n - 1];
		gp.pools.n--;
	}
	pthread_mutex_unlock(&gp.pools.mu);
}

void gp_pool_register(uint64_t pool, int dev)
{
	pthread_mutex_lock(&gp.pools.mu);
	pool_find(pool, dev, 1);
	pthread_mutex_unlock(&gp.pools.mu);
}

int gp_pool_dev(uint64_t pool)
{
	pthread_mutex_lock(&gp.pools.mu);
	int i = pool_find(pool, -1, 0);
	int dev = i < 0 ? -1 : gp.pools.e[i].dev;
	pthread_mutex_unlock(&gp.pools.mu);
	return dev;
}

static void reconcile_locked(int i, uint64_t reserved)
{
	if (reserved == GP_RESERVED_UNKNOWN)
		return;
	uint64_t want = reserved > gp.pools.e[i].live ? reserved - gp.pools.e[i].live : 0;
	if (want > gp.pools.e[i].slack)
		gp_charge_force(gp.pools.e[i].dev, want - gp.pools.e[i].slack); /* the driver already holds it */
	else
		gp_uncharge(gp.pools.e[i].dev, gp.pools.e[i].slack - want);
	gp.pools.e[i].slack = want;
}

/* Pending stream-ordered frees of pool i on stream (0 if none). */
static uint64_t *pend_of(int i, uint64_t stream, int add)
{
	for (int k = 0; k < gp.pools.e[i].npend; k++)
		if (gp.pools.e[i].pend[k].stream == stream)
			return &gp.pools.e[i].pend[k].bytes;
	if (!add)
		return NULL;
	if (gp.pools.e[i].npend == 8) {
		/* Out of room: the rest pooled under a stream no request has
		 * (no reuse credit, which can only refuse early). */
		stream = UINT64_MAX;
		for (int k = 0; k < 8; k++)
			if (gp.pools.e[i].pend[k].stream == stream)
				return &gp.pools.e[i].pend[k].bytes;
		gp.pools.e[i].pend[7].stream = stream;
		return &gp.pools.e[i].pend[7].bytes;
	}
	int k = gp.pools.e[i].npend++;
	gp.pools.e[i].pend[k].stream = stream;
	gp.pools.e[i].pend[k].bytes = 0;
	return &gp.pools.e[i].pend[k].bytes;
}

void gp_pool_pending(uint64_t pool, uint64_t stream, uint64_t size)
{
	pthread_mutex_lock(&gp.pools.mu);
	int i = pool_find(pool, -1, 0);
	if (i >= 0) {
		uint64_t *b = pend_of(i, stream, 1);
		*b = *b > UINT64_MAX - size ? UINT64_MAX : *b + size;
	}
	pthread_mutex_unlock(&gp.pools.mu);
}

/* Memory the pool already holds (slack) serves the request first, as far
 * as the driver can reuse it (gp_pool_begin in state.h); only the rest is
 * charged, and refused if over the limit. Before (issue 15 M7), a block
 * freed with cuMemFreeAsync counted as reusable at the call: a request on
 * another stream passed uncharged, reached the driver while the free had
 * not run, and the pool grew past the limit before the hook took it back. */
CUresult gp_pool_begin(uint64_t pool, int dev, uint64_t size, uint64_t stream, uint64_t reserved, uint64_t used,
		       uint64_t *taken)
{
	pthread_mutex_lock(&gp.pools.mu);
	int i = pool_find(pool, dev, 1);
	if (i < 0) {
		pthread_mutex_unlock(&gp.pools.mu);
		*taken = 0;
		return gp_charge(dev, size);
	}
	reconcile_locked(i, reserved);
	uint64_t usable = gp.pools.e[i].slack, idle = usable, credit = 0;
	uint64_t *pend = NULL;
	if (reserved != GP_RESERVED_UNKNOWN && used != GP_RESERVED_UNKNOWN) {
		uint64_t live = gp.pools.e[i].live;
		uint64_t pending = used > live ? used - live : 0; /* frees the driver has yet to run */
		if (pending == 0)
			gp.pools.e[i].npend = 0;
		idle = reserved > used ? reserved - used : 0;
		if ((pend = pend_of(i, stream, 0)) != NULL)
			credit = *pend < pending ? *pend : pending;
		if (idle + credit < usable)
			usable = idle + credit;
	} else
		idle = usable; /* the driver's figures unknown: the old rule */
	uint64_t take = usable < size ? usable : size;
	CUresult rc = gp_charge(dev, size - take);
	if (rc == CUDA_SUCCESS) {
		gp.pools.e[i].slack -= take;
		gp.pools.e[i].live += size;
		if (pend != NULL && take > idle)
			*pend -= take - idle < *pend ? take - idle : *pend;
		*taken = take;
	}
	pthread_mutex_unlock(&gp.pools.mu);
	return rc;
}

void gp_pool_end(uint64_t pool, int dev, uint64_t size, uint64_t taken, int ok, uint64_t reserved)
{
	pthread_mutex_lock(&gp.pools.mu);
	int i = pool_find(pool, dev, 0);
	if (i < 0) {
		if (!ok)
			gp_uncharge(dev, size);
	} else {
		if (!ok) {
			gp.pools.e[i].live -= size;
			gp_uncharge(dev, size - taken);
			gp.pools.e[i].slack += taken;
		}
		reconcile_locked(i, reserved);
	}
	pthread_mutex_unlock(&gp.pools.mu);
}

void gp_pool_freed(uint64_t pool, int dev, uint64_t size, uint64_t reserved)
{
	pthread_mutex_lock(&gp.pools.mu);
	int i = pool_find(pool, dev, 0);
	if (i < 0 || reserved == GP_RESERVED_UNKNOWN) {
		/* Without the driver's figure, assume the pool let it go. */
		if (i >= 0)
			gp.pools.e[i].live -= size;
		gp_uncharge(dev, size);
	} else {
		/* The block goes back to the pool, which may keep it reserved. */
		gp.pools.e[i].live -= size;
		gp.pools.e[i].slack += size;
		reconcile_locked(i, reserved);
	}
	pthread_mutex_unlock(&gp.pools.mu);
}

void gp_pool_reconcile(uint64_t pool, int dev, uint64_t reserved)
{
	pthread_mutex_lock(&gp.pools.mu);
	int i = pool_find(pool, dev, 0);
	if (i >= 0)
		reconcile_locked(i, reserved);
	pthread_mutex_unlock(&gp.pools.mu);
}

uint64_t gp_pool_live(uint64_t pool)
{
	pthread_mutex_lock(&gp.pools.mu);
	int i = pool_find(pool, -1, 0);
	uint64_t live = i < 0 ? 0 : gp.pools.e[i].live;
	pthread_mutex_unlock(&gp.pools.mu);
	return live;
}

int gp_pool_list(int dev, uint64_t *out, int max)
{
	int n = 0;
	pthread_mutex_lock(&gp.pools.mu);
	for (int i = 0; i < gp.pools.n; i++)
		if (gp.pools.e[i].dev == dev) {
			if (out && n < max)
				out[n] = gp.pools.e[i].pool;
			n++;
		}
	pthread_mutex_unlock(&gp.pools.mu);
	return n;
}

uint64_t gp_used(int dev)
{
	return gp_index_used(gp_dev_index(dev));
}

static unsigned format_bytes(int f)
{
	switch (f) {
	case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
	case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
	case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT: return 4;
	default: return 16; /* newer/compressed formats: overestimate, never under */
	}
}

static uint64_t mul_sat(uint64_t a, uint64_t b)
{
	if (a != 0 && b > UINT64_MAX / a)
		return UINT64_MAX;
	return a * b;
}

/* Row pitch aligned to 512 bytes, as the driver lays out CUDA arrays; a
 * slight overestimate is safe, an underestimate would be an accounting gap. */
uint64_t gp_array_bytes(size_t w, size_t h, size_t d, int format, unsigned ch)
{
	uint64_t row = mul_sat(mul_sat(w ? w : 1, format_bytes(format)), ch ? ch : 1);
	if (row > UINT64_MAX - 511)
		return UINT64_MAX;
	row = (row + 511) & ~511ull;
	return mul_sat(mul_sat(row, h ? h : 1), d ? d : 1);
}

uint64_t gp_mipmap_bytes(size_t w, size_t h, size_t d, int format, unsigned ch, unsigned levels)
{
	uint64_t sum = 0;
	for (unsigned l = 0; l < levels && l < 64; l++) {
		uint64_t b = gp_array_bytes(w, h, d, format, ch);
		sum = sum > UINT64_MAX - b ? UINT64_MAX : sum + b;
		w = w > 1 ? w / 2 : 1;
		h = h > 1 ? h / 2 : h;
		d = d > 1 ? d / 2 : d;
	}
	return sum;
}

/* ---- VMM mappings ----------------------------------------------------------
 * cuMemRelease on a handle that is still mapped only drops the handle: the
 * memory lives until the last cuMemUnmap (NCCL and others release right
 * after mapping). Such a handle stays charged until then. Mapping calls
 * are rare, so a mutex and linear scans do. */


static int grow(void **p, size_t *cap, size_t n, size_t elem)
{
	if (n < *cap)
		return 0;
	size_t c = *cap ? *cap * 2 : 64;
	void *q = realloc(*p, c * elem);
	if (q == NULL)
		return -1;
	*p = q;
	*cap = c;
	return 0;
}

void gp_vmm_mapped(uint64_t va, uint64_t size, uint64_t handle)
{
	pthread_mutex_lock(&gp.vmm.mu);
	if (grow((void **)&gp.vmm.maps, &gp.vmm.capmaps, gp.vmm.nmaps, sizeof *gp.vmm.maps) == 0)
		gp.vmm.maps[gp.vmm.nmaps++] = (struct gp_vmm_map){va, size, handle};
	pthread_mutex_unlock(&gp.vmm.mu);
}

static int mapped_locked(uint64_t handle)
{
	for (size_t i = 0; i < gp.vmm.nmaps; i++)
		if (gp.vmm.maps[i].handle == handle)
			return 1;
	return 0;
}

/* After a successful cuMemRelease: uncharge now, or when the last mapping goes. */
void gp_vmm_released(uint64_t handle, int dev, uint64_t size)
{
	pthread_mutex_lock(&gp.vmm.mu);
	if (mapped_locked(handle) && grow((void **)&gp.vmm.deferred, &gp.vmm.capdeferred, gp.vmm.ndeferred, sizeof *gp.vmm.deferred) == 0)
		gp.vmm.deferred[gp.vmm.ndeferred++] = (struct gp_vmm_deferred){handle, size, dev};
	else
		gp_uncharge(dev, size);
	pthread_mutex_unlock(&gp.vmm.mu);
}

void gp_vmm_unmapped(uint64_t va, uint64_t size)
{
	pthread_mutex_lock(&gp.vmm.mu);
	for (size_t i = 0; i < gp.vmm.nmaps;) {
		if (gp.vmm.maps[i].va >= va && gp.vmm.maps[i].va - va < size) {
			uint64_t h = gp.vmm.maps[i].handle;
			gp.vmm.maps[i] = gp.vmm.maps[--gp.vmm.nmaps];
			if (mapped_locked(h))
				continue;
			for (size_t j = 0; j < gp.vmm.ndeferred; j++)
				if (gp.vmm.deferred[j].handle == h) {
					gp_uncharge(gp.vmm.deferred[j].dev, gp.vmm.deferred[j].size);
					gp.vmm.deferred[j] = gp.vmm.deferred[--gp.vmm.ndeferred];
					break;
				}
			continue;
		}
		i++;
	}
	pthread_mutex_unlock(&gp.vmm.mu);
}

void gp_vmm_reset(void)
{
	pthread_mutex_init(&gp.vmm.mu, NULL);
	gp.vmm.nmaps = gp.vmm.ndeferred = 0;
}
