/*
 * The shared accounting region: one file (CUDA_DEVICE_MEMORY_SHARED_CACHE)
 * mmap'd MAP_SHARED by every process of a container, or an anonymous
 * private mapping when no file is named.
 *
 * Invariants (every process relies on these; keep them true):
 *  I1. All-zero is a valid, empty region. Creating the file is just
 *      open+ftruncate; there is no initialisation step to race on.
 *  I2. A slot belongs to the process whose pid is in `owner` (low 32 bits,
 *      RECLAIM bit clear). Only the owner adds to or subtracts from its
 *      slot's `used[]`; nobody ever writes another live process's slot.
 *  I3. The container's usage of a device is the sum of `used[dev]` over
 *      slots [0, hw). A slot is claimed (CAS owner 0 -> pid) and `hw`
 *      raised past it before its first charge, so no charge is ever
 *      invisible to the sum.
 *  I4. Charging is add-then-check: the owner adds `size` to its slot, sums
 *      all slots (seq_cst), and takes the add back if the sum exceeds the
 *      limit. With sequentially consistent atomics, of two racing charges
 *      the later one always sees the earlier, so the committed sum never
 *      exceeds the limit. Races near the limit can refuse both (safe).
 *  I5. No locks. A process SIGKILLed at any instruction leaves at most its
 *      own slot non-zero. Any process may reclaim the slot of a dead owner:
 *      CAS owner pid -> RECLAIM|self, zero used[], store owner 0. A
 *      reclaimer that dies mid-way leaves RECLAIM|deadpid, which any other
 *      process takes over the same way (zeroing is idempotent). Nobody
 *      ever waits on another process.
 *  I6. Liveness is kill(pid, 0) plus the process start time recorded in
 *      the slot, so a recycled pid does not keep a dead slot alive. A
 *      slot that already carries our own pid belongs to the image this
 *      process exec'd away from (its device memory went with it): attach
 *      reclaims it.
 *  I7. Layout is versioned by `magic`; a region with another magic is not
 *      touched (accounting falls back to per-process, loudly).
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "state.h"

#define GP_MAX_SLOTS 1024
#define GP_MAGIC 0x6770706b68303031ull /* "gppkh001" */
#define GP_RECLAIM (1ull << 62)

struct gp_slot {
	_Atomic uint64_t owner;      /* pid, or RECLAIM|reclaimer pid, or 0 */
	_Atomic uint64_t start_time; /* /proc/<pid>/stat field 22; 0 = unknown */
	_Atomic uint64_t used[GP_MAX_DEV];
	uint64_t pad[6];
} __attribute__((aligned(64)));

struct gp_region {
	_Atomic uint64_t magic;
	_Atomic uint32_t hw; /* slots [0, hw) may be in use */
	char pad[64 - 12];
	struct gp_slot slots[GP_MAX_SLOTS];
};

_Static_assert(sizeof(struct gp_slot) == 192, "slot layout is part of the file format");

static uint64_t start_time_of(pid_t pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	/* comm may contain spaces and parens; fields restart after the last ')'. */
	char *p = strrchr(buf, ')');
	if (p == NULL)
		return 0;
	p++; /* the space before field 3 */
	for (int field = 3; field < 22 && p; field++)
		p = strchr(p + 1, ' ');
	return p ? strtoull(p + 1, NULL, 10) : 0;
}

/* 1 if the process that owns (pid, start) is gone. */
static int owner_dead(pid_t pid, uint64_t start)
{
	if (pid <= 0)
		return 0;
	if (kill(pid, 0) != 0 && errno == ESRCH)
		return 1;
	if (start != 0) {
		uint64_t now = start_time_of(pid);
		if (now != 0 && now != start)
			return 1; /* pid recycled */
	}
	return 0;
}

int gp_region_open(struct gp_region_handle *h, const char *path)
{
	h->r = NULL;
	h->slot = -1;
	h->shared = 0;
	size_t size = sizeof(struct gp_region);
	void *m = MAP_FAILED;
	if (path && *path) {
		int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
		uint64_t magic = 0;
		if (fd >= 0 && pread(fd, &magic, sizeof magic, 0) == (ssize_t)sizeof magic && magic != 0 &&
		    magic != GP_MAGIC) {
			/* I7: not ours (another version, or another library's file). */
			gp_log(GP_LOG_ERROR, "shared cache %s has another layout (magic %llx); accounting is per process",
			       path, (unsigned long long)magic);
			close(fd);
			fd = -1;
			errno = EEXIST;
		}
		if (fd >= 0) {
			struct stat st;
			if (fstat(fd, &st) == 0 && (size_t)st.st_size < size && ftruncate(fd, (off_t)size) != 0)
				gp_log(GP_LOG_ERROR, "shared cache %s: ftruncate: %s", path, strerror(errno));
			else
				m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
			close(fd);
		}
		if (m == MAP_FAILED)
			gp_log(GP_LOG_ERROR, "shared cache %s unusable (%s); accounting is per process",
			       path, strerror(errno));
		else
			h->shared = 1;
	}
	if (m == MAP_FAILED)
		m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return -1;
	struct gp_region *r = m;
	uint64_t zero = 0;
	if (!atomic_compare_exchange_strong(&r->magic, &zero, GP_MAGIC) && zero != GP_MAGIC) {
		gp_log(GP_LOG_ERROR, "shared cache %s has another layout (magic %llx); accounting is per process",
		       path, (unsigned long long)zero);
		munmap(m, size);
		h->shared = 0;
		m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (m == MAP_FAILED)
			return -1;
		r = m;
		atomic_store(&r->magic, GP_MAGIC);
	}
	h->r = r;
	return 0;
}

static void zero_slot(struct gp_slot *s)
{
	for (int d = 0; d < GP_MAX_DEV; d++)
		atomic_store(&s->used[d], 0);
	atomic_store(&s->start_time, 0);
}

/* Reclaims slot i if its owner (or its dead reclaimer) is gone. */
static int try_reclaim(struct gp_region_handle *h, int i, pid_t self)
{
	struct gp_slot *s = &h->r->slots[i];
	uint64_t o = atomic_load(&s->owner);
	if (o == 0)
		return 0;
	pid_t pid = (pid_t)(o & 0xffffffffu);
	if (pid == self)
		return 0;
	uint64_t start = (o & GP_RECLAIM) ? 0 : atomic_load(&s->start_time);
	if (!owner_dead(pid, start))
		return 0;
	if (!atomic_compare_exchange_strong(&s->owner, &o, GP_RECLAIM | (uint64_t)self))
		return 0;
	zero_slot(s);
	atomic_store(&s->owner, 0);
	gp_log(GP_LOG_INFO, "reclaimed slot %d of dead pid %d", i, (int)pid);
	return 1;
}

int gp_region_reclaim_dead(struct gp_region_handle *h)
{
	int n = 0;
	uint32_t hw = atomic_load(&h->r->hw);
	pid_t self = getpid();
	for (uint32_t i = 0; i < hw && i < GP_MAX_SLOTS; i++)
		n += try_reclaim(h, (int)i, self);
	return n;
}

int gp_region_attach(struct gp_region_handle *h)
{
	pid_t self = getpid();
	struct gp_region *r = h->r;
	uint32_t hw0 = atomic_load(&r->hw);
	for (uint32_t i = 0; i < hw0 && i < GP_MAX_SLOTS; i++) {
		uint64_t o = (uint64_t)self;
		if (atomic_load(&r->slots[i].owner) != o)
			continue;
		if (atomic_compare_exchange_strong(&r->slots[i].owner, &o, GP_RECLAIM | (uint64_t)self)) {
			zero_slot(&r->slots[i]);
			atomic_store(&r->slots[i].owner, 0);
			gp_log(GP_LOG_INFO, "reclaimed slot %u of this process's previous image", i);
		}
	}
	for (int pass = 0; pass < 2; pass++) {
		for (int i = 0; i < GP_MAX_SLOTS; i++) {
			uint64_t z = 0;
			if (atomic_load(&r->slots[i].owner) != 0)
				continue;
			if (!atomic_compare_exchange_strong(&r->slots[i].owner, &z, (uint64_t)self))
				continue;
			/* I3: publish hw before the first charge. */
			uint32_t hw = atomic_load(&r->hw);
			while (hw < (uint32_t)i + 1 && !atomic_compare_exchange_weak(&r->hw, &hw, (uint32_t)i + 1))
				;
			zero_slot(&r->slots[i]);
			atomic_store(&r->slots[i].start_time, start_time_of(self));
			h->slot = i;
			h->pid = self;
			return 0;
		}
		gp_region_reclaim_dead(h); /* full: make room from dead processes */
	}
	gp_log(GP_LOG_ERROR, "shared cache has no free slot (%d processes)", GP_MAX_SLOTS);
	return -1;
}

void gp_region_detach(struct gp_region_handle *h)
{
	if (h->slot < 0)
		return;
	struct gp_slot *s = &h->r->slots[h->slot];
	zero_slot(s);
	uint64_t o = (uint64_t)h->pid;
	atomic_compare_exchange_strong(&s->owner, &o, 0);
	h->slot = -1;
}

uint64_t gp_region_used(struct gp_region_handle *h, int dev)
{
	uint64_t sum = 0;
	uint32_t hw = atomic_load(&h->r->hw);
	for (uint32_t i = 0; i < hw && i < GP_MAX_SLOTS; i++)
		sum += atomic_load(&h->r->slots[i].used[dev]);
	return sum;
}

int gp_region_reserve(struct gp_region_handle *h, int dev, uint64_t size, uint64_t limit)
{
	if (h->slot < 0)
		return -1;
	_Atomic uint64_t *mine = &h->r->slots[h->slot].used[dev];
	for (int attempt = 0; attempt < 3; attempt++) {
		atomic_fetch_add(mine, size);
		if (gp_region_used(h, dev) <= limit)
			return 0;
		atomic_fetch_sub(mine, size);
		/* Over: perhaps a dead process still holds a share (I5). */
		if (attempt == 0 && gp_region_reclaim_dead(h) > 0)
			continue;
		if (!h->shared)
			return -1; /* nobody else can be racing us */
		/* A racing charge may be taken back in a moment (I4). */
		sched_yield();
	}
	return -1;
}

void gp_region_add(struct gp_region_handle *h, int dev, uint64_t size)
{
	if (h->slot >= 0)
		atomic_fetch_add(&h->r->slots[h->slot].used[dev], size);
}

void gp_region_release(struct gp_region_handle *h, int dev, uint64_t size)
{
	if (h->slot >= 0)
		atomic_fetch_sub(&h->r->slots[h->slot].used[dev], size);
}

int gp_region_pids(struct gp_region_handle *h, pid_t *out, int max)
{
	int n = 0;
	uint32_t hw = atomic_load(&h->r->hw);
	for (uint32_t i = 0; i < hw && i < GP_MAX_SLOTS && n < max; i++) {
		uint64_t o = atomic_load(&h->r->slots[i].owner);
		if (o != 0 && !(o & GP_RECLAIM))
			out[n++] = (pid_t)o;
	}
	return n;
}
