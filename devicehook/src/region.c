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
 *      No arithmetic wraps: a request above the limit is refused before
 *      any add, a slot add that would pass 2^64 is refused, and the sum
 *      saturates at 2^64-1 (read as "over any limit"). Without this, a
 *      request of 2^64 - used makes the sum read 0 while it is pending.
 *  I5. No locks. A process SIGKILLed at any instruction leaves at most its
 *      own slot non-zero. Any process may reclaim the slot of a dead owner:
 *      CAS owner pid -> RECLAIM|self, zero used[], store owner 0. A
 *      reclaimer that dies mid-way leaves RECLAIM|deadpid, which any other
 *      process takes over the same way (zeroing is idempotent). Nobody
 *      ever waits on another process.
 *  I6. Liveness is kill(pid, 0) plus the process start time recorded in
 *      the slot, so a recycled pid does not keep a dead slot alive. A
 *      slot that already carries our own owner word (pid and namespace
 *      tag) belongs to the image this process exec'd away from (its device
 *      memory went with it): attach reclaims it.
 *  I9. Pids are namespace-relative: a process in a nested pid namespace of
 *      the container (`unshare -p -f`) is pid 1 there, and the container's
 *      pids do not exist for it. So the owner word carries a tag of the
 *      owner's pid namespace (bits 32..61, from the inode of
 *      /proc/self/ns/pid; 0 = unknown, written by an older library, or no
 *      /proc), set in the same CAS that claims the slot. kill(pid, 0) and
 *      "same pid = my previous image" are used only between slots of the
 *      same tag (or tag 0: the old behaviour). For another namespace the
 *      slot also records the owner's pid as /proc names it and which /proc
 *      (st_dev), published after them by `id_owner` = the owner word:
 *      a checker that has the same /proc looks the owner up there (no
 *      entry, or another start time: dead). Anyone else cannot tell, and
 *      keeps the slot (charged until someone who can see it reclaims it:
 *      refusing early, never handing the limit out twice).
 *  I7. Layout is versioned by `magic` and the file's size; a file with
 *      another magic or size is not touched, and the process refuses every
 *      allocation on a limited device, loudly (fail closed: per-process
 *      accounting would hand out the limit once more per process).
 *      Two sizes are ours: the whole struct, and the slots alone (the
 *      layout before I10: a file an older library made, or one created
 *      where only that much fits), used for memory as ever, with the SM
 *      state per process (h->sm = 0).
 *  I8. The file is created 0666 regardless of umask (several uids in one
 *      container share it) and its blocks are reserved (posix_fallocate)
 *      before it is mapped, so a full filesystem is an error, not SIGBUS.
 */
#include <errno.h>
#include <stddef.h>
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
#define GP_TAG_SHIFT 32
#define GP_TAG_MASK ((1ull << 30) - 1)
#define GP_WORD_PID(o) ((pid_t)((o)&0xffffffffu))
#define GP_WORD_TAG(o) (((o) >> GP_TAG_SHIFT) & GP_TAG_MASK)

struct gp_slot {
	_Atomic uint64_t owner;      /* tag<<32|pid, or RECLAIM|reclaimer's word, or 0 */
	_Atomic uint64_t start_time; /* /proc/<pid>/stat field 22; 0 = unknown */
	_Atomic uint64_t used[GP_MAX_DEV];
	_Atomic uint64_t host_pid; /* as NVML numbers the owner; 0 = unknown */
	_Atomic uint64_t id_owner; /* the owner word proc_pid/proc_dev belong to (I9) */
	_Atomic uint64_t proc_pid; /* the owner's pid as its /proc names it */
	_Atomic uint64_t proc_dev; /* st_dev of that /proc */
	uint64_t pad[2];
} __attribute__((aligned(64)));

/* I10. Container-wide SM state (review 15: it was per process, and a
 *      container that ran each long kernel in a fresh process never paid).
 *      After the slots, so the slots keep their offsets (the node agent
 *      reads them); the file's size versions it (I7). budget[i] is limits
 *      index i's SM budget (struct gp_sm_budget, state.h: lock-free, every
 *      field a CAS or fetch-add target, any process may write it; a
 *      SIGKILL at any instruction leaves it consistent). tail[k] belongs to
 *      slot k's owner (I2): from_ns[i], when it launched on index i work
 *      NVML has not reported yet (real NVML lists only running processes:
 *      what a process ran after its last sample is never reported), and
 *      alive_ns, its control thread's last tick. Whoever zeroes the slot
 *      (the owner at exit, a reclaimer after a SIGKILL) charges
 *      alive_ns - from_ns[i] to budget[i]: a dead process's debt stays
 *      with the container. */
#define GP_TAIL_MAX_NS 60000000000ll /* a charge bound (the region is tenant-writable) */
struct gp_sm_tail {
	_Atomic uint64_t alive_ns;
	_Atomic uint64_t from_ns[GP_MAX_DEV];
	uint64_t pad[7];
};
struct gp_region {
	_Atomic uint64_t magic;
	_Atomic uint32_t hw; /* slots [0, hw) may be in use */
	char pad[64 - 12];
	struct gp_slot slots[GP_MAX_SLOTS];
	struct gp_sm_budget budget[GP_MAX_DEV];
	struct gp_sm_tail tail[GP_MAX_SLOTS];
};

_Static_assert(sizeof(struct gp_slot) == 192, "slot layout is part of the file format");
_Static_assert(sizeof(struct gp_sm_budget) == 64, "budget layout is part of the file format");
_Static_assert(sizeof(struct gp_sm_tail) == 192, "tail layout is part of the file format");
_Static_assert(sizeof(struct gp_region) == 64 + 192 * GP_MAX_SLOTS + 64 * GP_MAX_DEV + 192 * GP_MAX_SLOTS,
	       "region layout is part of the file format");

/* Start time (field 22) of /proc/<pid>/stat, "self" when pid is 0; 0 when
 * unknown. *gone (may be NULL) is set to GONE_NOENT when /proc has no such
 * entry, GONE_ZOMBIE when the process is a zombie: it has exited, its files
 * are closed and the driver has freed its memory; only its parent has not
 * reaped it (a container's pid 1 that never calls wait leaves them for
 * good). */
enum { GONE_NOENT = 1, GONE_ZOMBIE = 2 };
static uint64_t proc_start(uint64_t pid, int *gone)
{
	char path[64], buf[1024];
	if (pid == 0)
		snprintf(path, sizeof path, "/proc/self/stat");
	else
		snprintf(path, sizeof path, "/proc/%llu/stat", (unsigned long long)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (gone)
		*gone = fd < 0 && errno == ENOENT ? GONE_NOENT : 0;
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
	if (gone && (p[1] == 'Z' || p[1] == 'X'))
		*gone = GONE_ZOMBIE;
	for (int field = 3; field < 22 && p; field++)
		p = strchr(p + 1, ' ');
	return p ? strtoull(p + 1, NULL, 10) : 0;
}

/* Who this process is, as slots record it (I9). Computed at attach (and
 * again in a forked child, which is another process). */
struct gp_self {
	pid_t pid;
	uint64_t word;     /* tag<<32 | pid: the owner word of our slot */
	uint64_t start;    /* our start time */
	uint64_t proc_pid; /* our pid as the mounted /proc names it; 0 = unknown */
	uint64_t proc_dev; /* that /proc's st_dev; 0 = unknown */
	int proc_hides;    /* /proc hides processes from us (hidepid): no entry proves nothing; -1 unknown */
};

static void who_am_i(struct gp_self *me)
{
	struct stat st;
	me->pid = getpid();
	uint64_t tag = 0;
	if (stat("/proc/self/ns/pid", &st) == 0) {
		/* Fold the namespace inode into 30 bits, never 0 (0 = unknown). */
		uint64_t x = (uint64_t)st.st_ino * 0x9e3779b97f4a7c15ull;
		tag = (x >> 34) % GP_TAG_MASK + 1;
	}
	me->word = tag << GP_TAG_SHIFT | (uint64_t)(uint32_t)me->pid;
	me->start = proc_start(0, NULL);
	char buf[32];
	ssize_t n = readlink("/proc/self", buf, sizeof buf - 1);
	me->proc_pid = 0;
	me->proc_dev = 0;
	if (n > 0) {
		buf[n] = '\0';
		me->proc_pid = strtoull(buf, NULL, 10);
		if (me->proc_pid != 0 && stat("/proc", &st) == 0)
			me->proc_dev = (uint64_t)st.st_dev;
		else
			me->proc_pid = 0;
	}
	me->proc_hides = -1; /* asked when first needed (owner_dead) */
}

/* Every /proc has a pid 1 (its namespace's init); not seeing it means a
 * hidepid mount that hides other users' processes from us. */
static int proc_hides(struct gp_self *me)
{
	struct stat st;
	if (me->proc_hides < 0)
		me->proc_hides = stat("/proc/1/stat", &st) != 0 && errno == ENOENT;
	return me->proc_hides;
}

/* 1 if the process that owns slot s (owner word o) is gone, as far as
 * this process can tell (I6, I9); 0 if it lives; -1 if this process
 * cannot tell (its pids or its /proc mean nothing here). */
static int owner_dead(struct gp_slot *s, uint64_t o, struct gp_self *me)
{
	pid_t pid = GP_WORD_PID(o);
	uint64_t tag = GP_WORD_TAG(o), mytag = GP_WORD_TAG(me->word);
	uint64_t start = (o & GP_RECLAIM) ? 0 : atomic_load(&s->start_time);
	int known = !(o & GP_RECLAIM) && atomic_load(&s->id_owner) == o;
	uint64_t ppid = known ? atomic_load(&s->proc_pid) : 0, pdev = known ? atomic_load(&s->proc_dev) : 0;
	int same_proc = ppid != 0 && pdev != 0 && pdev == me->proc_dev;
	if (pid <= 0)
		return 0;
	if (tag == 0 || mytag == 0 || tag == mytag) {
		/* Our pid namespace (or one of us cannot tell: as before). */
		if (kill(pid, 0) != 0 && errno == ESRCH)
			return 1;
		uint64_t now = 0;
		int gone = 0;
		if (same_proc)
			now = proc_start(ppid, &gone);
		else if (me->proc_pid == (uint64_t)me->pid)
			now = proc_start((uint64_t)pid, &gone); /* /proc numbers as we do */
		else
			return -1;
		/* kill() found it: a zombie is dead; no /proc entry proves nothing
		 * (hidepid, or it exits right now). Another start time: the pid was
		 * recycled. */
		return gone == GONE_ZOMBIE || (start != 0 && now != 0 && now != start);
	}
	/* Another pid namespace: its pids mean nothing here. */
	if (!same_proc)
		return -1; /* cannot tell: keep it */
	int gone = 0;
	uint64_t now = proc_start(ppid, &gone);
	if (gone == GONE_NOENT)
		return !proc_hides(me);
	return gone == GONE_ZOMBIE || (start != 0 && now != 0 && now != start);
}

/* Maps the named file shared; NULL (reason in why) when it cannot be
 * used as our region. Never modifies a file it does not accept. */
/* The layout before I10 (the slots alone): still used as it is, for
 * memory, when a container's file was made by an older library or in an
 * accounting tmpfs sized for it (an upgrade of gpupack-node under running
 * pods); the SM state then stays per process (gp_region_budget: NULL). */
#define GP_V1_SIZE offsetof(struct gp_region, budget)

static struct gp_region *open_shared(const char *path, size_t *sizep, char *why, size_t whylen, int grow_v1)
{
	size_t size = *sizep;
	/* Every uid of the container must be able to open the file read-write
	 * (processes of several uids share one limit): create it 0666 whatever
	 * the umask. O_NONBLOCK: a FIFO planted at the path must not hang us. */
	int created = 1;
	int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NONBLOCK, 0666);
	if (fd < 0 && errno == EEXIST) {
		created = 0;
		fd = open(path, O_RDWR | O_CLOEXEC | O_NONBLOCK);
	}
	if (fd < 0) {
		snprintf(why, whylen, "cannot be opened read-write: %s", strerror(errno));
		return NULL;
	}
	struct stat st;
	uint64_t magic = 0;
	void *m = MAP_FAILED;
	if (created && fchmod(fd, 0666) != 0)
		snprintf(why, whylen, "fchmod: %s", strerror(errno));
	else if (fstat(fd, &st) != 0)
		snprintf(why, whylen, "fstat: %s", strerror(errno));
	else if (!S_ISREG(st.st_mode))
		snprintf(why, whylen, "is not a regular file");
	else if (st.st_size != 0 && (size_t)st.st_size != size && (size_t)st.st_size != GP_V1_SIZE)
		/* I7: another version or another library (HAMi-core) wrote it. */
		snprintf(why, whylen, "has another layout (%lld bytes, ours are %zu)", (long long)st.st_size, size);
	else if (st.st_size != 0 && (pread(fd, &magic, sizeof magic, 0) != (ssize_t)sizeof magic ||
				     (magic != 0 && magic != GP_MAGIC)))
		snprintf(why, whylen, "has another layout (magic %llx)", (unsigned long long)magic);
	else {
		/* Hook15 review M2: under an SM limit a file of the older layout
		 * is grown to ours in place where there is room (the slots keep
		 * their offsets, so processes of the older library that mapped
		 * the prefix go on as they were). Else a tenant that replaced her
		 * file by one of the older layout once had the SM budget per
		 * process for the container's life (77-80 % under 30 %); now it
		 * is a fresh container budget, once: what writing the budget
		 * does (devicehook M1). Only where there is no room (an
		 * accounting tmpfs sized for the older layout) does it stay. */
		if ((size_t)st.st_size == GP_V1_SIZE && size != GP_V1_SIZE && grow_v1 &&
		    posix_fallocate(fd, 0, (off_t)size) == 0)
			st.st_size = (off_t)size;
		/* Reserve the blocks before mapping: on a full filesystem a
		 * sparse file mapped shared raises SIGBUS at the first store. */
		if (st.st_size != 0)
			size = (size_t)st.st_size;
		int e = posix_fallocate(fd, 0, (off_t)size);
		if (e == ENOSPC && st.st_size == 0 && size != GP_V1_SIZE) {
			/* An accounting tmpfs sized for the older layout. */
			size = GP_V1_SIZE;
			e = ftruncate(fd, 0) == 0 ? posix_fallocate(fd, 0, (off_t)size) : errno;
		}
		if (e != 0)
			snprintf(why, whylen, "cannot reserve %zu bytes: %s", size, strerror(e));
		else if ((m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED)
			snprintf(why, whylen, "mmap: %s", strerror(errno));
	}
	close(fd);
	if (m == MAP_FAILED)
		return NULL;
	struct gp_region *r = m;
	uint64_t zero = 0;
	if (!atomic_compare_exchange_strong(&r->magic, &zero, GP_MAGIC) && zero != GP_MAGIC) {
		/* Raced with a writer of another layout since the pread. */
		snprintf(why, whylen, "has another layout (magic %llx)", (unsigned long long)zero);
		munmap(m, size);
		return NULL;
	}
	*sizep = size;
	return r;
}

int gp_region_open(struct gp_region_handle *h, const char *path)
{
	h->r = NULL;
	h->slot = -1;
	h->shared = 0;
	h->sm = 0;
	size_t size = sizeof(struct gp_region);
	int rc = 0;
	if (path && *path) {
		char why[256] = "";
		h->r = open_shared(path, &size, why, sizeof why, h->sm_limited);
		if (h->r != NULL) {
			h->shared = 1;
			h->sm = size == sizeof(struct gp_region);
			if (!h->sm)
				gp_log(h->sm_limited ? GP_LOG_ERROR : GP_LOG_INFO,
				       "shared cache %s has the layout without the container's SM state (made by an older "
				       "library, or no room for more): SM budgets stay per process", path);
			return 0;
		}
		/* Fail closed: a private region would give this process the
		 * whole limit again, next to the others. The caller refuses
		 * every allocation on a limited device. */
		gp_log(GP_LOG_ERROR, "shared cache %s %s; every GPU memory allocation is refused", path, why);
		rc = -2;
	}
	/* Private accounting (no file named), or a placeholder when the file
	 * is unusable, so queries still have something to read. */
	void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return -1;
	h->r = m;
	h->sm = 1;
	atomic_store(&h->r->magic, GP_MAGIC);
	return rc;
}

/* I10: what slot s's owner ran that NVML never reported is the container's.
 * The span ends at the owner's last tick (alive_ns), but at least one NVML
 * cadence and one control period after from_ns, or now if that is sooner
 * (hook15 review H1): a process killed (or _exit()ed, or exec'd) before its
 * control thread ever ticked has alive_ns from attach, before its first
 * launch, and was charged nothing — a relay of pre-warmed processes, one
 * kernel each, ran 64-73 % under 30 %. The floor bounds what a process
 * that never ticked can have run unseen: from its first unreported launch
 * to when it is reclaimed, at most one cadence plus one period (by then it
 * would have ticked and polled NVML). Cost: an honest process killed right
 * after a launch is charged up to that floor, not less (early, never
 * late). */
#define GP_TAIL_CADENCE_MAX_NS 2000000000ull /* cadence_us is tenant-writable */
static void settle_tail(struct gp_region *r, struct gp_slot *s, unsigned period_ms)
{
	struct gp_sm_tail *t = &r->tail[s - r->slots];
	uint64_t alive = atomic_load(&t->alive_ns), now = gp_now_ns();
	for (int d = 0; d < GP_MAX_DEV; d++) {
		uint64_t from = atomic_exchange(&t->from_ns[d], 0);
		if (from == 0)
			continue;
		uint64_t cad = atomic_load(&r->budget[d].cadence_us) * 1000ull;
		if (cad == 0 || cad > GP_TAIL_CADENCE_MAX_NS)
			cad = GP_TAIL_CADENCE_MAX_NS / 2;
		uint64_t floor = from + cad + (uint64_t)period_ms * 1000000ull, end = alive;
		if (end < floor)
			end = now < floor ? now : floor;
		if (end <= from)
			continue;
		int64_t ns = end - from > (uint64_t)GP_TAIL_MAX_NS ? GP_TAIL_MAX_NS : (int64_t)(end - from);
		atomic_fetch_sub(&r->budget[d].credit_ns, ns);
		gp_log(GP_LOG_DEBUG, "slot %d ran up to %.0f ms on index %d that NVML did not report: charged to the "
		       "container's SM budget", (int)(s - r->slots), (double)ns / 1e6, d);
	}
	atomic_store(&t->alive_ns, 0);
}

/* Hook15 review L/M4: a slot whose owner's liveness this process cannot
 * judge (the owner in a pid namespace of its own with its own /proc) was
 * kept, and the span it may have run unreported was never charged: a
 * process of such a namespace that launched and was SIGKILLed ran free.
 * Its control thread marks the slot alive every period (and every launch
 * does); when that mark is older than STALE_NS while a span is open, the
 * owner is dead or stopped (a stopped one's kernels still ran), and the
 * span is charged as a reclaimer would (settle_tail: up to its last mark,
 * at least one NVML cadence plus a period after the span's start) and
 * cleared. The slot itself, and its memory, stay until the owner can be
 * judged (its own namespace's processes judge it). A live owner whose
 * span was settled opens a new one at its next launch; one that did not
 * tick for that long (a stall, a long off phase of the duty cycle, which
 * marks only at launches) is charged early, never late. */
#define STALE_NS 500000000ull
static void settle_stale_tail(struct gp_region_handle *h, struct gp_slot *s)
{
	struct gp_sm_tail *t = &h->r->tail[s - h->r->slots];
	uint64_t alive = atomic_load(&t->alive_ns), now = gp_now_ns();
	if (alive == 0 || now < alive + STALE_NS + (uint64_t)h->sm_period_ms * 2000000ull)
		return;
	int open = 0;
	for (int d = 0; d < GP_MAX_DEV && !open; d++)
		open = atomic_load(&t->from_ns[d]) != 0;
	if (!open)
		return;
	gp_log(GP_LOG_DEBUG, "slot %d (owner in another pid namespace) has not been marked alive for %.1f s: "
	       "its unreported span is charged", (int)(s - h->r->slots), (double)(now - alive) / 1e9);
	settle_tail(h->r, s, h->sm_period_ms);
}

static void zero_slot(struct gp_region_handle *h, struct gp_slot *s)
{
	if (h->sm)
		settle_tail(h->r, s, h->sm_period_ms);
	atomic_store(&s->id_owner, 0); /* first: the identity below is stale */
	for (int d = 0; d < GP_MAX_DEV; d++)
		atomic_store(&s->used[d], 0);
	atomic_store(&s->host_pid, 0);
	atomic_store(&s->start_time, 0);
	atomic_store(&s->proc_pid, 0);
	atomic_store(&s->proc_dev, 0);
}

static struct gp_self self_id; /* of the attached process (fork: re-attach) */

/* Reclaims slot i if its owner (or its dead reclaimer) is gone. */
static int try_reclaim(struct gp_region_handle *h, int i, struct gp_self *me)
{
	struct gp_slot *s = &h->r->slots[i];
	uint64_t o = atomic_load(&s->owner);
	if (o == 0 || (o & ~GP_RECLAIM) == me->word)
		return 0;
	int dead = owner_dead(s, o, me);
	if (dead < 0 && h->sm)
		settle_stale_tail(h, s);
	if (dead <= 0)
		return 0;
	if (!atomic_compare_exchange_strong(&s->owner, &o, GP_RECLAIM | me->word))
		return 0;
	zero_slot(h, s);
	atomic_store(&s->owner, 0);
	gp_log(GP_LOG_INFO, "reclaimed slot %d of dead pid %d", i, (int)GP_WORD_PID(o));
	return 1;
}

int gp_region_reclaim_dead(struct gp_region_handle *h)
{
	int n = 0;
	uint32_t hw = atomic_load(&h->r->hw);
	if (self_id.pid != getpid())
		who_am_i(&self_id);
	for (uint32_t i = 0; i < hw && i < GP_MAX_SLOTS; i++)
		n += try_reclaim(h, (int)i, &self_id);
	return n;
}

int gp_region_attach(struct gp_region_handle *h)
{
	who_am_i(&self_id);
	pid_t self = self_id.pid;
	uint64_t word = self_id.word;
	struct gp_region *r = h->r;
	uint32_t hw0 = atomic_load(&r->hw);
	for (uint32_t i = 0; i < hw0 && i < GP_MAX_SLOTS; i++) {
		/* Our pid in our namespace (I9): the image we exec'd away from. */
		uint64_t o = word;
		if (atomic_load(&r->slots[i].owner) != o)
			continue;
		if (atomic_compare_exchange_strong(&r->slots[i].owner, &o, GP_RECLAIM | word)) {
			zero_slot(h, &r->slots[i]);
			atomic_store(&r->slots[i].owner, 0);
			gp_log(GP_LOG_INFO, "reclaimed slot %u of this process's previous image", i);
		}
	}
	for (int pass = 0; pass < 2; pass++) {
		for (int i = 0; i < GP_MAX_SLOTS; i++) {
			uint64_t z = 0;
			if (atomic_load(&r->slots[i].owner) != 0)
				continue;
			if (!atomic_compare_exchange_strong(&r->slots[i].owner, &z, word))
				continue;
			/* I3: publish hw before the first charge. */
			uint32_t hw = atomic_load(&r->hw);
			while (hw < (uint32_t)i + 1 && !atomic_compare_exchange_weak(&r->hw, &hw, (uint32_t)i + 1))
				;
			struct gp_slot *s = &r->slots[i];
			zero_slot(h, s);
			atomic_store(&s->start_time, self_id.start);
			atomic_store(&s->proc_pid, self_id.proc_pid);
			atomic_store(&s->proc_dev, self_id.proc_dev);
			atomic_store(&s->id_owner, word); /* I9: publishes the two above */
			h->slot = i;
			h->pid = self;
			h->word = word;
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
	/* I10: at exit, the time up to now is what may have run unreported. */
	if (h->sm)
		atomic_store(&h->r->tail[h->slot].alive_ns, gp_now_ns());
	zero_slot(h, s);
	uint64_t o = h->word;
	atomic_compare_exchange_strong(&s->owner, &o, 0);
	h->slot = -1;
}

uint64_t gp_region_used(struct gp_region_handle *h, int dev)
{
	uint64_t sum = 0;
	uint32_t hw = atomic_load(&h->r->hw);
	for (uint32_t i = 0; i < hw && i < GP_MAX_SLOTS; i++) {
		uint64_t v = atomic_load(&h->r->slots[i].used[dev]);
		if (v > UINT64_MAX - sum)
			return UINT64_MAX; /* I4: saturate, never wrap */
		sum += v;
	}
	return sum;
}

/* Adds size to our own slot unless that would wrap (I4). */
static int slot_add(_Atomic uint64_t *mine, uint64_t size)
{
	uint64_t cur = atomic_load(mine);
	do {
		if (cur > UINT64_MAX - size)
			return -1;
	} while (!atomic_compare_exchange_weak(mine, &cur, cur + size));
	return 0;
}

int gp_region_reserve(struct gp_region_handle *h, int dev, uint64_t size, uint64_t limit)
{
	if (h->slot < 0)
		return -1;
	_Atomic uint64_t *mine = &h->r->slots[h->slot].used[dev];
	if (size > limit)
		return -1; /* I4: could never fit; adding it could wrap the sum */
	for (int attempt = 0; attempt < 3; attempt++) {
		if (slot_add(mine, size) != 0)
			return -1;
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
	/* Memory the driver already holds: charged even past the limit, but
	 * saturating rather than wrapping (I4). */
	if (h->slot >= 0 && slot_add(&h->r->slots[h->slot].used[dev], size) != 0)
		atomic_store(&h->r->slots[h->slot].used[dev], UINT64_MAX);
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
			out[n++] = GP_WORD_PID(o);
	}
	return n;
}

void gp_region_set_hostpid(struct gp_region_handle *h, unsigned hostpid)
{
	if (h->r && h->slot >= 0)
		atomic_store(&h->r->slots[h->slot].host_pid, hostpid);
}

int gp_region_hostpids(struct gp_region_handle *h, unsigned *out, int max)
{
	int n = 0;
	if (h->r == NULL)
		return 0;
	uint32_t hw = atomic_load(&h->r->hw);
	for (uint32_t i = 0; i < hw && i < GP_MAX_SLOTS && n < max; i++) {
		uint64_t o = atomic_load(&h->r->slots[i].owner);
		uint64_t hp = atomic_load(&h->r->slots[i].host_pid);
		if (o != 0 && !(o & GP_RECLAIM) && hp != 0)
			out[n++] = (unsigned)hp;
	}
	return n;
}

struct gp_sm_budget *gp_region_budget(struct gp_region_handle *h, int i)
{
	return h->r == NULL || !h->sm || i < 0 || i >= GP_MAX_DEV ? NULL : &h->r->budget[i];
}

void gp_region_sm_alive(struct gp_region_handle *h)
{
	if (h->r && h->sm && h->slot >= 0)
		atomic_store_explicit(&h->r->tail[h->slot].alive_ns, gp_now_ns(), memory_order_relaxed);
}

void gp_region_sm_from(struct gp_region_handle *h, int i, uint64_t from_ns, int only_if_set)
{
	if (h->r == NULL || !h->sm || h->slot < 0 || i < 0 || i >= GP_MAX_DEV)
		return;
	_Atomic uint64_t *f = &h->r->tail[h->slot].from_ns[i];
	uint64_t cur = atomic_load_explicit(f, memory_order_relaxed);
	if (from_ns == 0) { /* nothing unreported */
		if (cur != 0)
			atomic_store(f, 0);
		return;
	}
	/* Only forward: a launch sets it when clear; a sample moves it on. */
	while ((only_if_set ? cur != 0 : cur == 0) && cur < from_ns &&
	       !atomic_compare_exchange_weak(f, &cur, from_ns))
		;
}
