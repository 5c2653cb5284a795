/* A fake libnvidia-ml.so.1 over the fake driver's GPUs (fakestate.h): it
 * lists every process that ran on them, as NVML lists the whole GPU's. */
#include <string.h>

#include "fakestate.h"
#include "tessera_nvml.h"

struct nvmlDevice_st {
	int index;
};
static struct nvmlDevice_st devices[FAKE_MAX_GPUS];

nvmlReturn_t nvmlInit_v2(void) { fake_state(); return NVML_SUCCESS; }
nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) { *n = (unsigned)fake_state()->ngpus; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *d)
{
	if (i >= (unsigned)fake_state()->ngpus)
		return NVML_ERROR_INVALID_ARGUMENT;
	devices[i].index = (int)i;
	*d = &devices[i];
	return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *out, unsigned len)
{
	const unsigned char *b = fake_state()->gpu[d->index].uuid;
	snprintf(out, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
	return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
	struct fake_gpu *g = &fake_state()->gpu[d->index];
	m->total = (unsigned long long)g->total;
	m->used = (unsigned long long)atomic_load(&g->used);
	m->free = m->total - m->used;
	return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m)
{
	nvmlMemory_t v1;
	nvmlDeviceGetMemoryInfo(d, &v1);
	m->total = v1.total;
	m->reserved = 0;
	m->free = v1.free;
	m->used = v1.used;
	return NVML_SUCCESS;
}

static nvmlReturn_t list(unsigned *count, void *infos, int v2)
{
	struct fake_state *s = fake_state();
	unsigned n = 0, room = infos ? *count : 0;
	for (int i = 0; i < FAKE_MAX_PROCS; i++) {
		int32_t pid = atomic_load(&s->proc[i].pid);
		if (pid == 0)
			continue;
		if (n < room) {
			if (v2)
				((nvmlProcessInfo_v2_t *)infos)[n] = (nvmlProcessInfo_v2_t){.pid = (unsigned)pid, .usedGpuMemory = 1ULL << 30};
			else
				((nvmlProcessInfo_v1_t *)infos)[n] = (nvmlProcessInfo_v1_t){.pid = (unsigned)pid, .usedGpuMemory = 1ULL << 30};
		}
		n++;
	}
	*count = n;
	return n > room ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned *c, nvmlProcessInfo_v1_t *i) { return list(c, i, 0); }
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned *c, nvmlProcessInfo_v2_t *i) { return list(c, i, 1); }
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned *c, nvmlProcessInfo_v2_t *i) { return list(c, i, 1); }
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t d, unsigned *c, nvmlProcessInfo_v1_t *i) { return list(c, i, 0); }
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t d, unsigned *c, nvmlProcessInfo_v2_t *i) { return list(c, i, 1); }
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t d, unsigned *c, nvmlProcessInfo_v2_t *i) { return list(c, i, 1); }
