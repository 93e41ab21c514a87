/*
 * A tenant's stub libnvidia-ml.so.1 (issue 15 H3a), for tests only: put
 * on LD_LIBRARY_PATH ahead of the driver's folder, it is what a hook that
 * loads NVML by soname gets. It claims every device is in MIG mode (so an
 * SM limit "does not apply"), has no utilisation sample ever
 * (NVML_ERROR_NOT_FOUND: the limiter never calibrates) and no processes;
 * memory queries answer plausibly so that the application runs.
 */
#include <stdint.h>
#include <string.h>

#include "../src/cuda_types.h"

#define EXPORT __attribute__((visibility("default")))

EXPORT nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }
EXPORT nvmlReturn_t nvmlInit(void) { return NVML_SUCCESS; }
EXPORT nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *d)
{
	*d = (nvmlDevice_t)(uintptr_t)(i + 1);
	return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned *i)
{
	*i = (unsigned)((uintptr_t)d - 1);
	return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
	(void)d;
	m->total = m->free = 80ull << 30;
	m->used = 0;
	return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m)
{
	(void)d;
	memset(m, 0, sizeof *m);
	m->total = m->free = 80ull << 30;
	return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *out,
						    unsigned *count, unsigned long long lastSeen)
{
	(void)d; (void)out; (void)lastSeen;
	*count = 0;
	return NVML_ERROR_NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned *count, nvmlProcessInfo_t *out)
{
	(void)d; (void)out;
	*count = 0;
	return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned *current, unsigned *pending)
{
	(void)d;
	*current = *pending = 1;
	return NVML_SUCCESS;
}
