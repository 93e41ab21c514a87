/*
 * The environment contract (HAMi-core compatible), read once at init:
 *   CUDA_DEVICE_MEMORY_LIMIT[_i]   bytes, or a number with k/m/g/t suffix
 *                                   (binary units, case-insensitive).
 *                                   0 or unset = no limit (HAMi semantics).
 *   CUDA_DEVICE_SM_LIMIT[_i]       percent 0..100; 0 and 100 = unthrottled.
 *   CUDA_DEVICE_MEMORY_SHARED_CACHE path of the shared accounting file.
 *   CUDA_DISABLE_CONTROL           true/1 = pass everything through.
 *   LIBCUDA_LOG_LEVEL              0 error, 1 warn (default), 3 info, 4 debug.
 * gpupack extensions:
 *   GPUPACK_CONTEXT_RESERVE        size charged per CUDA context (default 0).
 *   GPUPACK_SM_PERIOD_MS           limiter control period (default 100).
 *
 * Safe fallbacks for malformed values, always logged at ERROR:
 *   - a malformed per-device memory limit falls back to the generic one if
 *     that is valid, otherwise to 0 bytes usable: every allocation on that
 *     device is refused. Refusing is safe; guessing "unlimited" would let a
 *     tenant take the whole GPU from its neighbours.
 *   - a malformed SM limit falls back likewise, otherwise to unthrottled:
 *     over-using SMs slows neighbours but cannot crash them.
 *
 * The trusted limits file GP_LIMITS_PATH (/etc/gpupack/limits), written
 * root-owned by gpupack-node's device plugin and mounted read-only, takes
 * precedence over all of the above. When it exists, every limit comes from
 * it alone: the same keys, GPUPACK_SM_PERIOD_MS and CUDA_DISABLE_CONTROL in
 * the environment are ignored (the environment is the tenant's). Format:
 *   - one KEY=VALUE per line; a line whose first non-blank is '#' is a
 *     comment; blank lines are allowed; no quoting; blanks (space, tab, CR)
 *     around key and value are trimmed; no inline comments;
 *   - keys: CUDA_DEVICE_MEMORY_LIMIT[_i], CUDA_DEVICE_SM_LIMIT[_i] (i <
 *     GP_MAX_DEV), CUDA_DEVICE_MEMORY_SHARED_CACHE (absolute path),
 *     GPUPACK_CONTEXT_RESERVE, LIBCUDA_LOG_LEVEL, values as in the
 *     environment; GPUPACK_DEVICE_UUID_<i> (file only: the GPU that limits
 *     index i is, "GPU-" or "MIG-" and 8-4-4-4-12 hex digits; no UUID may
 *     be given for two indices); other keys are ignored (forward
 *     compatible, debug log);
 *   - with any GPUPACK_DEVICE_UUID_<i>, index i names that GPU, not the
 *     process's CUDA device i: the hook maps each CUdevice to an index by
 *     cuDeviceGetUuid (account.c, gp_dev_index), so CUDA_VISIBLE_DEVICES
 *     and CUDA_DEVICE_ORDER (the tenant's) cannot move a charge to
 *     another index; a device whose UUID is not in the file gets no
 *     memory. Without them, index i is CUDA device i (older plugins);
 *   - unparsable, and so fail closed (every GPU memory allocation refused,
 *     one ERROR line): larger than GP_LIMITS_MAX, not a regular file,
 *     unreadable, a NUL byte, a line without '=', an empty key, a bad value
 *     for a known key (no fallbacks here: the writer is a program), a
 *     duplicate key.
 * A file that does not exist (ENOENT/ENOTDIR) means the environment
 * contract above applies (nodes not managed by gpupack, HAMi mode).
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>
#ifdef __has_include
#if __has_include(<linux/openat2.h>)
#include <linux/openat2.h>
#endif
#endif

#include "state.h"

static int log_level = GP_LOG_WARN;

void gp_log(int level, const char *fmt, ...)
{
	if (level > log_level)
		return;
	char buf[512];
	static const char *names[] = {"ERROR", "WARN", "WARN", "INFO", "DEBUG"};
	int n = snprintf(buf, sizeof buf, "[gpupack-hook %d %s] ", (int)getpid(),
			 names[level < 0 ? 0 : level > 4 ? 4 : level]);
	va_list ap;
	va_start(ap, fmt);
	if (n > 0 && n < (int)sizeof buf)
		n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
	va_end(ap);
	if (n >= (int)sizeof buf - 1)
		n = (int)sizeof buf - 2;
	if (n < 0)
		return;
	buf[n++] = '\n';
	/* write(2) rather than stdio: safe in any thread, no buffering surprises. */
	ssize_t w = write(2, buf, (size_t)n);
	(void)w;
}

int gp_parse_size(const char *s, uint64_t *out)
{
	if (s == NULL || *s == '\0')
		return -1;
	uint64_t v = 0;
	const char *p = s;
	if (!isdigit((unsigned char)*p))
		return -1;
	for (; isdigit((unsigned char)*p); p++) {
		unsigned d = (unsigned)(*p - '0');
		if (v > (UINT64_MAX - d) / 10)
			return -1;
		v = v * 10 + d;
	}
	unsigned shift = 0;
	switch (*p) {
	case '\0': break;
	case 'k': case 'K': shift = 10; p++; break;
	case 'm': case 'M': shift = 20; p++; break;
	case 'g': case 'G': shift = 30; p++; break;
	case 't': case 'T': shift = 40; p++; break;
	default: return -1;
	}
	if (*p != '\0')
		return -1;
	if (shift && v > (UINT64_MAX >> shift))
		return -1;
	*out = v << shift;
	return 0;
}

int gp_parse_percent(const char *s, int *out)
{
	uint64_t v;
	if (s == NULL)
		return -1;
	for (const char *p = s; *p; p++)
		if (!isdigit((unsigned char)*p))
			return -1; /* no suffixes on a percentage */
	if (gp_parse_size(s, &v) != 0 || v > 100)
		return -1;
	*out = (int)v;
	return 0;
}

int gp_parse_bool(const char *s, int *out)
{
	if (s == NULL)
		return -1;
	if (!strcmp(s, "1") || !strcasecmp(s, "true") || !strcasecmp(s, "yes") || !strcasecmp(s, "on")) {
		*out = 1;
		return 0;
	}
	if (!strcmp(s, "0") || !strcasecmp(s, "false") || !strcasecmp(s, "no") || !strcasecmp(s, "off") || !*s) {
		*out = 0;
		return 0;
	}
	return -1;
}

static const char *env_get(char *const *envp, const char *key)
{
	size_t n = strlen(key);
	for (; envp && *envp; envp++)
		if (!strncmp(*envp, key, n) && (*envp)[n] == '=')
			return *envp + n + 1;
	return NULL;
}

/* "<prefix><digits>=" with digits < GP_MAX_DEV: the device index, else -1. */
static int dev_key(const char *kv, const char *prefix, const char **val)
{
	size_t n = strlen(prefix);
	if (strncmp(kv, prefix, n))
		return -1;
	const char *p = kv + n;
	if (!isdigit((unsigned char)p[0]))
		return -1;
	int i = p[0] - '0';
	p++;
	if (isdigit((unsigned char)*p) && i != 0) {
		i = i * 10 + (*p - '0');
		p++;
	}
	if (*p != '=' || i >= GP_MAX_DEV)
		return -1;
	*val = p + 1;
	return i;
}

void gp_config_from_env(struct gp_config *c, char *const *envp)
{
	memset(c, 0, sizeof *c);
	const char *v;
	char key[64];
	/* One pass for the per-device keys (the first occurrence wins, as
	 * with getenv); init cost matters when 64 processes start at once. */
	const char *mem_dev[GP_MAX_DEV] = {0}, *sm_dev[GP_MAX_DEV] = {0};
	for (char *const *e = envp; e && *e; e++) {
		if ((*e)[0] != 'C')
			continue;
		int i;
		if ((i = dev_key(*e, "CUDA_DEVICE_MEMORY_LIMIT_", &v)) >= 0 && !mem_dev[i])
			mem_dev[i] = v;
		else if ((i = dev_key(*e, "CUDA_DEVICE_SM_LIMIT_", &v)) >= 0 && !sm_dev[i])
			sm_dev[i] = v;
	}

	c->log_level = GP_LOG_WARN;
	if ((v = env_get(envp, "LIBCUDA_LOG_LEVEL")) != NULL) {
		int l;
		if (gp_parse_percent(v, &l) == 0 && l <= 4)
			c->log_level = l;
		else
			gp_log(GP_LOG_ERROR, "LIBCUDA_LOG_LEVEL=%.32s is not 0..4; using 1", v);
	}
	log_level = c->log_level;

	if ((v = env_get(envp, "CUDA_DISABLE_CONTROL")) != NULL && gp_parse_bool(v, &c->disabled) != 0) {
		gp_log(GP_LOG_ERROR, "CUDA_DISABLE_CONTROL=%.32s is not a boolean; control stays on", v);
		c->disabled = 0;
	}

	/* Memory limits: generic first, then per device. */
	uint64_t generic = GP_UNLIMITED;
	int generic_bad = 0;
	if ((v = env_get(envp, "CUDA_DEVICE_MEMORY_LIMIT")) != NULL) {
		uint64_t b;
		if (gp_parse_size(v, &b) == 0)
			generic = b == 0 ? GP_UNLIMITED : b;
		else {
			generic_bad = 1;
			gp_log(GP_LOG_ERROR, "CUDA_DEVICE_MEMORY_LIMIT=%.32s is malformed; "
			       "allocations are refused until it is fixed", v);
		}
	}
	for (int i = 0; i < GP_MAX_DEV; i++) {
		c->mem_limit[i] = generic_bad ? 0 : generic;
		if ((v = mem_dev[i]) == NULL)
			continue;
		snprintf(key, sizeof key, "CUDA_DEVICE_MEMORY_LIMIT_%d", i);
		uint64_t b;
		if (gp_parse_size(v, &b) == 0)
			c->mem_limit[i] = b == 0 ? GP_UNLIMITED : b;
		else {
			c->mem_limit[i] = (generic_bad || generic == GP_UNLIMITED) ? 0 : generic;
			gp_log(GP_LOG_ERROR, "%s=%.32s is malformed; device %d limited to %llu bytes",
			       key, v, i, (unsigned long long)c->mem_limit[i]);
		}
	}

	int sm_generic = 0;
	if ((v = env_get(envp, "CUDA_DEVICE_SM_LIMIT")) != NULL && gp_parse_percent(v, &sm_generic) != 0) {
		gp_log(GP_LOG_ERROR, "CUDA_DEVICE_SM_LIMIT=%.32s is not a percentage 0..100; unthrottled", v);
		sm_generic = 0;
	}
	for (int i = 0; i < GP_MAX_DEV; i++) {
		c->sm_limit[i] = sm_generic;
		if ((v = sm_dev[i]) != NULL) {
			snprintf(key, sizeof key, "CUDA_DEVICE_SM_LIMIT_%d", i);
			int p;
			if (gp_parse_percent(v, &p) == 0)
				c->sm_limit[i] = p;
			else
				gp_log(GP_LOG_ERROR, "%s=%.32s is not a percentage 0..100; using %d", key, v, sm_generic);
		}
		if (c->sm_limit[i] >= 100)
			c->sm_limit[i] = 0;
	}

	c->sm_period_ms = 100;
	if ((v = env_get(envp, "GPUPACK_SM_PERIOD_MS")) != NULL) {
		uint64_t p;
		if (gp_parse_size(v, &p) == 0 && p >= 1 && p <= 10000)
			c->sm_period_ms = (unsigned)p;
		else
			gp_log(GP_LOG_ERROR, "GPUPACK_SM_PERIOD_MS=%.32s is not 1..10000; using 100", v);
	}
	if ((v = env_get(envp, "GPUPACK_CONTEXT_RESERVE")) != NULL && gp_parse_size(v, &c->ctx_reserve) != 0) {
		gp_log(GP_LOG_ERROR, "GPUPACK_CONTEXT_RESERVE=%.32s is malformed; using 0", v);
		c->ctx_reserve = 0;
	}
	if ((v = env_get(envp, "CUDA_DEVICE_MEMORY_SHARED_CACHE")) != NULL && *v) {
		if (strlen(v) >= sizeof c->shared_cache)
			gp_log(GP_LOG_ERROR, "CUDA_DEVICE_MEMORY_SHARED_CACHE is longer than %zu bytes; "
			       "accounting is per process", sizeof c->shared_cache - 1);
		else
			strcpy(c->shared_cache, v);
	}
	for (int i = 0; i < GP_MAX_DEV; i++) {
		c->any_mem_limit |= c->mem_limit[i] != GP_UNLIMITED;
		c->any_sm_limit |= c->sm_limit[i] != 0;
	}
}

/* ---- the trusted limits file ------------------------------------------- */

static void config_defaults(struct gp_config *c)
{
	memset(c, 0, sizeof *c);
	for (int i = 0; i < GP_MAX_DEV; i++)
		c->mem_limit[i] = GP_UNLIMITED;
	c->log_level = GP_LOG_WARN;
	c->sm_period_ms = 100;
}

static void config_closed(struct gp_config *c)
{
	config_defaults(c);
	for (int i = 0; i < GP_MAX_DEV; i++)
		c->mem_limit[i] = 0;
	c->any_mem_limit = 1;
	c->from_file = 1;
	c->fail_closed = 1;
}

static int is_blank(char ch)
{
	return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\v' || ch == '\f';
}

/* "<prefix>" exactly: -2; "<prefix>_<i>" with a canonical i < GP_MAX_DEV:
 * i; the prefix followed by anything else: -3; another key: -1. */
static int file_key(const char *k, const char *prefix)
{
	size_t n = strlen(prefix);
	if (strncmp(k, prefix, n))
		return -1;
	if (k[n] == '\0')
		return -2;
	if (k[n] != '_')
		return -1; /* e.g. CUDA_DEVICE_MEMORY_LIMITX: another key */
	const char *p = k + n + 1;
	if (!isdigit((unsigned char)p[0]) || (p[0] == '0' && p[1] != '\0'))
		return -3;
	int i = 0;
	for (; isdigit((unsigned char)*p); p++) {
		i = i * 10 + (*p - '0');
		if (i >= GP_MAX_DEV)
			return -3;
	}
	return *p == '\0' ? i : -3;
}

/* "GPU-" or "MIG-", then 8-4-4-4-12 hex digits (either case): the 16
 * bytes of cuDeviceGetUuid / nvmlDeviceGetUUID. 0, or -1 when malformed. */
int gp_parse_uuid(const char *s, unsigned char out[16])
{
	if (strncmp(s, "GPU-", 4) && strncmp(s, "MIG-", 4))
		return -1;
	s += 4;
	int n = 0;
	for (int i = 0; i < 36; i++) {
		if (i == 8 || i == 13 || i == 18 || i == 23) {
			if (s[i] != '-')
				return -1;
			continue;
		}
		int v = isdigit((unsigned char)s[i]) ? s[i] - '0'
			: (s[i] >= 'a' && s[i] <= 'f') ? s[i] - 'a' + 10
			: (s[i] >= 'A' && s[i] <= 'F') ? s[i] - 'A' + 10 : -1;
		if (v < 0)
			return -1;
		if (n % 2 == 0)
			out[n / 2] = (unsigned char)(v << 4);
		else
			out[n / 2] |= (unsigned char)v;
		n++;
	}
	return s[36] == '\0' ? 0 : -1;
}

#define FAIL(...)                                         \
	do {                                              \
		snprintf(err, errlen, __VA_ARGS__);       \
		config_closed(c);                         \
		return -1;                                \
	} while (0)

int gp_config_from_file(struct gp_config *c, const char *buf, size_t len, char *err, size_t errlen)
{
	config_defaults(c);
	c->from_file = 1;
	if (errlen)
		err[0] = '\0';
	if (len > GP_LIMITS_MAX)
		FAIL("larger than %d bytes", GP_LIMITS_MAX);
	if (memchr(buf, '\0', len) != NULL)
		FAIL("contains a NUL byte");
	enum { S_MEM = 1, S_SM = 2, S_CACHE = 4, S_RESERVE = 8, S_LOG = 16 };
	unsigned seen = 0, mem_seen = 0, sm_seen = 0;
	uint64_t mem_generic = GP_UNLIMITED, mem_dev[GP_MAX_DEV] = {0};
	int sm_generic = 0, sm_dev[GP_MAX_DEV] = {0};
	int unknown = 0, line = 0;
	char first_unknown[128] = "";
	char key[128], val[1024];
	const char *p = buf, *end = buf + len;
	while (p < end) {
		line++;
		const char *eol = memchr(p, '\n', (size_t)(end - p));
		if (eol == NULL)
			eol = end;
		const char *a = p, *b = eol;
		p = eol < end ? eol + 1 : end;
		while (a < b && is_blank(*a))
			a++;
		while (b > a && is_blank(b[-1]))
			b--;
		if (a == b || *a == '#')
			continue;
		const char *eq = memchr(a, '=', (size_t)(b - a));
		if (eq == NULL)
			FAIL("line %d has no '='", line);
		const char *ke = eq, *vs = eq + 1;
		while (ke > a && is_blank(ke[-1]))
			ke--;
		while (vs < b && is_blank(*vs))
			vs++;
		size_t kl = (size_t)(ke - a), vl = (size_t)(b - vs);
		if (kl == 0)
			FAIL("line %d has an empty key", line);
		if (kl >= sizeof key) {
			/* Too long to be a known key: an unknown one. */
			if (unknown++ == 0)
				snprintf(first_unknown, sizeof first_unknown, "(a key of %zu bytes)", kl);
			continue;
		}
		memcpy(key, a, kl);
		key[kl] = '\0';
		int known = file_key(key, "CUDA_DEVICE_MEMORY_LIMIT") != -1 || file_key(key, "CUDA_DEVICE_SM_LIMIT") != -1 ||
			    file_key(key, "GPUPACK_DEVICE_UUID") != -1 ||
			    !strcmp(key, "CUDA_DEVICE_MEMORY_SHARED_CACHE") || !strcmp(key, "GPUPACK_CONTEXT_RESERVE") ||
			    !strcmp(key, "LIBCUDA_LOG_LEVEL");
		if (!known) {
			if (unknown++ == 0)
				snprintf(first_unknown, sizeof first_unknown, "%s", key);
			continue;
		}
		if (vl >= sizeof val)
			FAIL("line %d: the value of %.64s is longer than %zu bytes", line, key, sizeof val - 1);
		memcpy(val, vs, vl);
		val[vl] = '\0';
		int i;
		if ((i = file_key(key, "CUDA_DEVICE_MEMORY_LIMIT")) != -1) {
			uint64_t v;
			if (i == -3)
				FAIL("line %d: %.64s is not a device index below %d", line, key, GP_MAX_DEV);
			if (gp_parse_size(val, &v) != 0)
				FAIL("line %d: %.64s=%.32s is not a size", line, key, val);
			unsigned bit = i == -2 ? 1u << GP_MAX_DEV : 1u << i;
			if (mem_seen & bit)
				FAIL("line %d: %.64s is given twice", line, key);
			mem_seen |= bit;
			if (i == -2)
				mem_generic = v == 0 ? GP_UNLIMITED : v;
			else
				mem_dev[i] = v == 0 ? GP_UNLIMITED : v;
		} else if ((i = file_key(key, "GPUPACK_DEVICE_UUID")) != -1) {
			unsigned char u[16];
			if (i < 0)
				FAIL("line %d: %.64s is not a device index below %d", line, key, GP_MAX_DEV);
			if (gp_parse_uuid(val, u) != 0)
				FAIL("line %d: %.64s=%.64s is not a GPU UUID (GPU-/MIG- and 8-4-4-4-12 hex digits)", line, key, val);
			if (c->uuid_set & (1u << i))
				FAIL("line %d: %.64s is given twice", line, key);
			for (int j = 0; j < GP_MAX_DEV; j++)
				if ((c->uuid_set & (1u << j)) && !memcmp(c->uuid[j], u, 16))
					FAIL("line %d: %.64s names the GPU of GPUPACK_DEVICE_UUID_%d too", line, key, j);
			memcpy(c->uuid[i], u, 16);
			c->uuid_set |= 1u << i;
		} else if ((i = file_key(key, "CUDA_DEVICE_SM_LIMIT")) != -1) {
			int v;
			if (i == -3)
				FAIL("line %d: %.64s is not a device index below %d", line, key, GP_MAX_DEV);
			if (gp_parse_percent(val, &v) != 0)
				FAIL("line %d: %.64s=%.32s is not a percentage 0..100", line, key, val);
			unsigned bit = i == -2 ? 1u << GP_MAX_DEV : 1u << i;
			if (sm_seen & bit)
				FAIL("line %d: %.64s is given twice", line, key);
			sm_seen |= bit;
			if (i == -2)
				sm_generic = v;
			else
				sm_dev[i] = v;
		} else {
			unsigned bit = 0;
			if (!strcmp(key, "CUDA_DEVICE_MEMORY_SHARED_CACHE")) {
				bit = S_CACHE;
				if (val[0] != '/')
					FAIL("line %d: CUDA_DEVICE_MEMORY_SHARED_CACHE=%.64s is not an absolute path", line, val);
				strcpy(c->shared_cache, val);
			} else if (!strcmp(key, "GPUPACK_CONTEXT_RESERVE")) {
				bit = S_RESERVE;
				if (gp_parse_size(val, &c->ctx_reserve) != 0)
					FAIL("line %d: GPUPACK_CONTEXT_RESERVE=%.32s is not a size", line, val);
			} else if (!strcmp(key, "LIBCUDA_LOG_LEVEL")) {
				bit = S_LOG;
				int l;
				if (gp_parse_percent(val, &l) != 0 || l > 4)
					FAIL("line %d: LIBCUDA_LOG_LEVEL=%.32s is not 0..4", line, val);
				c->log_level = l;
			}
			if (seen & bit)
				FAIL("line %d: %.64s is given twice", line, key);
			seen |= bit;
		}
	}
	for (int d = 0; d < GP_MAX_DEV; d++) {
		c->mem_limit[d] = (mem_seen & (1u << d)) ? mem_dev[d] : mem_generic;
		c->sm_limit[d] = (sm_seen & (1u << d)) ? sm_dev[d] : sm_generic;
		if (c->sm_limit[d] >= 100)
			c->sm_limit[d] = 0;
		c->any_mem_limit |= c->mem_limit[d] != GP_UNLIMITED;
		c->any_sm_limit |= c->sm_limit[d] != 0;
	}
	if (unknown && errlen)
		snprintf(err, errlen, "ignored %d unknown key(s), the first %.64s", unknown, first_unknown);
	return 0;
}
#undef FAIL

int gp_installed_by_node(const char *lib_path)
{
	if (lib_path == NULL || lib_path[0] == '\0')
		return 0;
	const char *slash = strrchr(lib_path, '/');
	char path[4096];
	int n = slash == NULL ? snprintf(path, sizeof path, "%s", GP_NODE_MARKER)
			      : snprintf(path, sizeof path, "%.*s/%s", (int)(slash - lib_path), lib_path, GP_NODE_MARKER);
	if (n < 0 || (size_t)n >= sizeof path)
		return 1; /* cannot tell: the strict reading */
	struct stat st;
	/* Any kind of file: the folder is a read-only mount, so nothing in
	 * the container can remove the stamp, only cover it (which leaves a
	 * mount point, still there). */
	if (lstat(path, &st) == 0)
		return 1;
	return errno != ENOENT && errno != ENOTDIR; /* EACCES etc.: strict */
}

/* Opens the limits file without following a symlink anywhere in the path
 * (openat2 RESOLVE_NO_SYMLINKS, Linux 5.6), else (older kernels, a seccomp
 * profile that answers ENOSYS) without following one as the last
 * component (O_NOFOLLOW). A symlink the image plants at or above the path
 * is then ELOOP: something is there that is not the node's file, which
 * fails closed. O_NONBLOCK: a FIFO planted at the path must not hang
 * every CUDA process; it is refused as not a regular file. */
static int open_limits(const char *path)
{
	int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW;
#if defined(SYS_openat2) && defined(RESOLVE_NO_SYMLINKS)
	struct open_how how = {.flags = (uint64_t)flags, .resolve = RESOLVE_NO_SYMLINKS};
	long fd = syscall(SYS_openat2, AT_FDCWD, path, &how, sizeof how);
	if (fd >= 0 || (errno != ENOSYS && errno != EPERM && errno != E2BIG))
		return (int)fd;
#endif
	return open(path, flags);
}

void gp_config_load(struct gp_config *c, char *const *envp, const char *path, int node, int require_ro)
{
	char err[256];
	int fd = open_limits(path);
	if (fd < 0 && (errno == ENOENT || errno == ENOTDIR) && node) {
		/* The node's own library without its limits file: something in
		 * the image or a volume hides the file (a symlink plus a mount
		 * over its target). The environment is the tenant's: refuse. */
		int e = errno;
		config_closed(c);
		log_level = c->log_level;
		gp_log(GP_LOG_ERROR, "limits file %s is missing (%s) although this library is gpupack-node's; "
		       "every GPU memory allocation is refused", path, strerror(e));
		return;
	}
	if (fd < 0 && (errno == ENOENT || errno == ENOTDIR)) {
		gp_config_from_env(c, envp);
		return;
	}
	const char *why = NULL;
	char *buf = NULL;
	size_t len = 0;
	struct stat st;
	struct statvfs vfs;
	if (fd < 0 && errno == ELOOP)
		why = "is (or is reached through) a symlink";
	else if (fd < 0)
		snprintf(err, sizeof err, "cannot be opened: %s", strerror(errno)), why = err;
	else if (fstat(fd, &st) != 0)
		snprintf(err, sizeof err, "cannot be read: %s", strerror(errno)), why = err;
	else if (!S_ISREG(st.st_mode))
		why = "is not a regular file";
	else if (require_ro && fstatvfs(fd, &vfs) != 0)
		snprintf(err, sizeof err, "cannot be checked: %s", strerror(errno)), why = err;
	else if (require_ro && !(vfs.f_flag & ST_RDONLY))
		/* gpupack-node's device plugin mounts it read-only; a writable
		 * one is a file the container put there, or can change. */
		why = "is not on a read-only mount";
	else if (st.st_size > GP_LIMITS_MAX)
		snprintf(err, sizeof err, "is larger than %d bytes", GP_LIMITS_MAX), why = err;
	else if ((buf = malloc(GP_LIMITS_MAX + 1)) == NULL)
		why = "cannot be read: out of memory";
	else {
		/* Read one byte past the limit: the size may have changed since fstat. */
		while (len <= GP_LIMITS_MAX) {
			ssize_t n = read(fd, buf + len, GP_LIMITS_MAX + 1 - len);
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0) {
				snprintf(err, sizeof err, "cannot be read: %s", strerror(errno));
				why = err;
				break;
			}
			if (n == 0)
				break;
			len += (size_t)n;
		}
	}
	if (fd >= 0)
		close(fd);
	int unparsable = 0;
	if (why == NULL && gp_config_from_file(c, buf, len, err, sizeof err) != 0)
		why = err, unparsable = 1;
	free(buf);
	if (why != NULL) {
		config_closed(c);
		log_level = c->log_level;
		gp_log(GP_LOG_ERROR, "limits file %s %s%s%s; every GPU memory allocation is refused", path,
		       unparsable ? "is unparsable (" : "", why, unparsable ? ")" : "");
		return;
	}
	log_level = c->log_level;
	if (err[0])
		gp_log(GP_LOG_DEBUG, "limits file %s: %s", path, err);
	gp_log(GP_LOG_INFO, "limits from %s; the environment's limits and CUDA_DISABLE_CONTROL are ignored", path);
}

/* Whether the process could change the file open at fd (issue 15 H3a: a
 * library the hook loads on the node's behalf must not be the tenant's).
 * NULL when it cannot: the file is on a read-only mount (the NVIDIA
 * container toolkit bind-mounts the driver's libraries read-only), or it
 * is owned by another uid, not writable by group or others, and this
 * process has neither root's uid nor CAP_DAC_OVERRIDE/CAP_FOWNER.
 * Otherwise the reason, for the log. Group ownership is not looked up: a
 * group-writable file counts as writable whatever the groups. */
const char *gp_fd_writable_by_us(int fd)
{
	struct stat st;
	struct statvfs vfs;
	if (fstat(fd, &st) != 0 || fstatvfs(fd, &vfs) != 0)
		return "cannot be checked";
	if (!S_ISREG(st.st_mode))
		return "is not a regular file";
	if (vfs.f_flag & ST_RDONLY)
		return NULL;
	uid_t me = geteuid();
	if (me == 0)
		return "is on a writable mount and this process is root";
	if (st.st_uid == me)
		return "is owned by this process's uid";
	if (st.st_mode & (S_IWGRP | S_IWOTH))
		return "is writable by group or others";
	/* Effective capabilities, from /proc/self/status (CapEff, hex). */
	FILE *f = fopen("/proc/self/status", "re");
	unsigned long long eff = ~0ull; /* unknown: assume the worst */
	if (f != NULL) {
		char line[256];
		while (fgets(line, sizeof line, f))
			if (sscanf(line, "CapEff: %llx", &eff) == 1)
				break;
		fclose(f);
	}
	if (eff & ((1ull << 1) /* CAP_DAC_OVERRIDE */ | (1ull << 3) /* CAP_FOWNER */))
		return "is on a writable mount and this process may override file permissions";
	return NULL;
}
