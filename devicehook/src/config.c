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
 */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
