/*
 * An LD_PRELOAD shim for tests (issue 15 L3): CLOCK_REALTIME, as every
 * library in the process reads it through clock_gettime, steps by
 * FAKECLOCK_STEP_MS (signed) once FAKECLOCK_STEP_AFTER_MS have passed
 * since the process started, as settimeofday or an NTP step would do it.
 * The machine's clock is left alone; other clocks pass through.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int64_t step_ns, after_ns, start_ns;

static int64_t mono(void)
{
	struct timespec ts;
	syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

__attribute__((constructor)) static void init(void)
{
	const char *s = getenv("FAKECLOCK_STEP_MS"), *a = getenv("FAKECLOCK_STEP_AFTER_MS");
	step_ns = s ? strtoll(s, NULL, 10) * 1000000ll : 0;
	after_ns = a ? strtoll(a, NULL, 10) * 1000000ll : 0;
	start_ns = mono();
}

__attribute__((visibility("default"))) int clock_gettime(clockid_t c, struct timespec *ts)
{
	long r = syscall(SYS_clock_gettime, c, ts);
	if (r != 0 || c != CLOCK_REALTIME || step_ns == 0 || mono() - start_ns < after_ns)
		return (int)r;
	int64_t t = (int64_t)ts->tv_sec * 1000000000ll + ts->tv_nsec + step_ns;
	ts->tv_sec = (time_t)(t / 1000000000ll);
	ts->tv_nsec = (long)(t % 1000000000ll);
	return 0;
}
