/*
 * NVML as the container sees it: a granted GPU's memory is the grant, its
 * use the container's, and its processes the container's own (so
 * nvidia-smi inside the container shows the slice, not the GPU).
 */
#define _GNU_SOURCE
#include "libtessera.h"

static void slice_memory(nvmlDevice_t dev, unsigned long long *total, unsigned long long *free_bytes, unsigned long long *used)
{
	struct tessera_state *st = tessera_state_get();
	int g = tessera_nvml_index(dev);
	if (!st->ready || g < 0) {
		*total = *free_bytes = *used = 0;
		return;
	}
	tessera_reclaim_dead();
	int64_t u = atomic_load(&st->region->gpu[g].used);
	int64_t limit = st->limits.gpu[g].memory;
	if (u < 0)
		u = 0;
	*total = (unsigned long long)limit;
	*used = (unsigned long long)u;
	unsigned long long left = u < limit ? (unsigned long long)(limit - u) : 0;
	if (*free_bytes > left)
		*free_bytes = left;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *m)
{
	GET_REAL(nvmlDeviceGetMemoryInfo, NVML_ERROR_NOT_SUPPORTED);
	nvmlReturn_t r = real(dev, m);
	if (r == NVML_SUCCESS && m)
		slice_memory(dev, &m->total, &m->free, &m->used);
	return r;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *m)
{
	GET_REAL(nvmlDeviceGetMemoryInfo_v2, NVML_ERROR_NOT_SUPPORTED);
	nvmlReturn_t r = real(dev, m);
	if (r == NVML_SUCCESS && m) {
		slice_memory(dev, &m->total, &m->free, &m->used);
		m->reserved = 0;
	}
	return r;
}

/* processes lists the container's processes holding memory on dev, as the
 * process lists do: the count needed when infos is too small. */
static nvmlReturn_t processes(nvmlDevice_t dev, unsigned *count, void *infos, int v2)
{
	if (!count)
		return NVML_ERROR_INVALID_ARGUMENT;
	struct tessera_state *st = tessera_state_get();
	int g = tessera_nvml_index(dev);
	unsigned n = 0, room = infos ? *count : 0;
	if (st->ready && g >= 0) {
		tessera_reclaim_dead();
		for (int i = 0; i < TESSERA_MAX_PROCS; i++) {
			struct tessera_region_slot *s = &st->region->slot[i];
			int32_t pid = atomic_load(&s->pid);
			int64_t used = atomic_load(&s->used[g]);
			if (pid <= 0 || used <= 0)
				continue;
			if (n < room) {
				if (v2)
					((nvmlProcessInfo_v2_t *)infos)[n] = (nvmlProcessInfo_v2_t){.pid = (unsigned)pid, .usedGpuMemory = (unsigned long long)used, .gpuInstanceId = 0xFFFFFFFF, .computeInstanceId = 0xFFFFFFFF};
				else
					((nvmlProcessInfo_v1_t *)infos)[n] = (nvmlProcessInfo_v1_t){.pid = (unsigned)pid, .usedGpuMemory = (unsigned long long)used};
			}
			n++;
		}
	}
	*count = n;
	return n > room ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}

#define PROCESS_LIST(name, type, v2)                                              \
	nvmlReturn_t name(nvmlDevice_t dev, unsigned *count, type *infos)          \
	{                                                                         \
		GET_REAL(name, NVML_ERROR_NOT_SUPPORTED);                         \
		(void)real;                                                       \
		return processes(dev, count, infos, v2);                          \
	}

PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t, 0)
PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_v2_t, 1)
PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_v2_t, 1)
PROCESS_LIST(nvmlDeviceGetMPSComputeRunningProcesses, nvmlProcessInfo_v1_t, 0)
PROCESS_LIST(nvmlDeviceGetMPSComputeRunningProcesses_v2, nvmlProcessInfo_v2_t, 1)
PROCESS_LIST(nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlProcessInfo_v2_t, 1)
