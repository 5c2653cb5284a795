/* Every allocation path counts against the grant; one past it fails with
 * CUDA_ERROR_OUT_OF_MEMORY; frees are credited exactly; the memory queries
 * report the grant. */
#include "check.h"

static size_t free_now(void)
{
	size_t f, t;
	CU(cuMemGetInfo_v2(&f, &t));
	return f;
}

int main(void)
{
	write_limits(NULL, "# tessera limits\n" GPU0 " 1073741824 30\n" GPU1 " 536870912 50\n");
	on_device(0);
	size_t f, t;
	CU(cuMemGetInfo_v2(&f, &t));
	CHECK(t == (size_t)GiB && f == (size_t)GiB, "cuMemGetInfo: total %zu free %zu, want the 1 GiB grant", t, f);
	size_t total;
	CU(cuDeviceTotalMem_v2(&total, 0));
	CHECK(total == (size_t)GiB, "cuDeviceTotalMem: %zu, want the grant", total);
	CU(cuDeviceTotalMem_v2(&total, 1));
	CHECK(total == (size_t)(512 * MiB), "cuDeviceTotalMem of GPU 1: %zu, want its own grant (by UUID)", total);

	/* cuMemAlloc: the cap and an exact credit. */
	CUdeviceptr a, b, c;
	CU(cuMemAlloc_v2(&a, 600 * MiB));
	CHECK(cuMemAlloc_v2(&b, 500 * MiB) == CUDA_ERROR_OUT_OF_MEMORY, "600 + 500 MiB of a 1 GiB grant was allowed");
	CU(cuMemAlloc_v2(&b, 424 * MiB));
	CHECK(free_now() == 0, "free %zu after the whole grant was allocated", free_now());
	CHECK(cuMemAlloc_v2(&c, 1) == CUDA_ERROR_OUT_OF_MEMORY, "one byte past the grant was allowed");
	CHECK(cuMemAlloc_v2(&c, (size_t)-1) == CUDA_ERROR_OUT_OF_MEMORY && free_now() == 0, "a size past 2^63 changed the count: free %zu", free_now());
	size_t huge_pitch;
	CHECK(cuMemAllocPitch_v2(&c, &huge_pitch, (size_t)1 << 40, (size_t)1 << 40, 4) == CUDA_ERROR_OUT_OF_MEMORY, "an overflowing pitched size was allowed");
	CU(cuMemFree_v2(b));
	CHECK(free_now() == (size_t)(424 * MiB), "free %zu after freeing 424 MiB", free_now());
	CHECK(cuMemFree_v2(b) != CUDA_SUCCESS, "a double free succeeded");
	CHECK(free_now() == (size_t)(424 * MiB), "a failed double free credited memory: free %zu", free_now());

	/* Pitch: the padded size is what counts. */
	size_t pitch;
	CU(cuMemAllocPitch_v2(&b, &pitch, 1000, 1024, 4));
	CHECK(pitch == 1024 && free_now() == (size_t)(423 * MiB), "pitch %zu, free %zu: want 1024 and 423 MiB", pitch, free_now());
	CU(cuMemFree_v2(b));
	CHECK(cuMemAllocPitch_v2(&b, &pitch, 425 * 1024, 1024, 4) == CUDA_ERROR_OUT_OF_MEMORY, "a pitched allocation past the grant was allowed");
	CHECK(free_now() == (size_t)(424 * MiB), "a refused pitched allocation left %zu free", free_now());

	/* Managed, stream-ordered and pool allocations. */
	CU(cuMemAllocManaged(&b, 100 * MiB, 1));
	CU(cuMemAllocAsync(&c, 100 * MiB, NULL));
	CUdeviceptr d, e;
	CU(cuMemAllocFromPoolAsync(&d, 100 * MiB, NULL, NULL));
	CU(cuMemAllocAsync_ptsz(&e, 100 * MiB, NULL));
	CHECK(free_now() == (size_t)(24 * MiB), "free %zu after 400 MiB managed, async and pool", free_now());
	CHECK(cuMemAllocManaged(&a, 25 * MiB, 1) == CUDA_ERROR_OUT_OF_MEMORY, "managed memory past the grant was allowed");
	CHECK(cuMemAllocFromPoolAsync_ptsz(&a, 25 * MiB, NULL, NULL) == CUDA_ERROR_OUT_OF_MEMORY, "pool memory past the grant was allowed");
	CU(cuMemFree_v2(b));
	CU(cuMemFreeAsync(c, NULL));
	CU(cuMemFreeAsync_ptsz(d, NULL));
	CU(cuMemFreeAsync(e, NULL));
	CHECK(free_now() == (size_t)(424 * MiB), "free %zu after the frees", free_now());

	/* Arrays and mipmapped arrays. */
	CUarray arr;
	CUDA_ARRAY_DESCRIPTOR ad = {8192, 8192, CU_AD_FORMAT_FLOAT, 1}; /* 256 MiB */
	CU(cuArrayCreate_v2(&arr, &ad));
	CHECK(free_now() == (size_t)(168 * MiB), "free %zu after a 256 MiB array", free_now());
	CUDA_ARRAY3D_DESCRIPTOR a3 = {1024, 1024, 64, CU_AD_FORMAT_HALF, 2, 0}; /* 256 MiB */
	CUarray arr3;
	CHECK(cuArray3DCreate_v2(&arr3, &a3) == CUDA_ERROR_OUT_OF_MEMORY, "a 3D array past the grant was allowed");
	CU(cuArrayDestroy(arr));
	CU(cuArray3DCreate_v2(&arr3, &a3));
	CHECK(free_now() == (size_t)(168 * MiB), "free %zu after a 256 MiB 3D array", free_now());
	CU(cuArrayDestroy(arr3));
	CUmipmappedArray mip;
	CUDA_ARRAY3D_DESCRIPTOR m = {4096, 4096, 0, CU_AD_FORMAT_UNSIGNED_INT8, 4, 0}; /* 64 MiB + 16 + 4 + ... */
	CU(cuMipmappedArrayCreate(&mip, &m, 13));
	size_t want = 0;
	for (int l = 0; l < 13; l++)
		want += (size_t)4 * (4096 >> l) * (4096 >> l);
	CHECK(free_now() == (size_t)(424 * MiB) - want, "free %zu after a mipmapped array of %zu bytes", free_now(), want);
	CU(cuMipmappedArrayDestroy(mip));

	/* The virtual memory management API, on the GPU its properties name. */
	CUmemAllocationProp prop = {0};
	prop.type = 1;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = 1;
	CUmemGenericAllocationHandle h1, h2;
	CU(cuMemCreate(&h1, 400 * MiB, &prop, 0));
	CHECK(cuMemCreate(&h2, 200 * MiB, &prop, 0) == CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate past GPU 1's 512 MiB grant was allowed");
	CHECK(free_now() == (size_t)(424 * MiB), "GPU 1's allocation was counted on GPU 0: free %zu", free_now());
	CU(cuMemRelease(h1));
	CU(cuMemCreate(&h2, 512 * MiB, &prop, 0));
	CU(cuMemRelease(h2));

	/* NVML: the grant as the total, the container's use as used, its
	 * processes as the list. */
	CHECK(nvmlInit_v2() == NVML_SUCCESS, "nvmlInit");
	nvmlDevice_t n0;
	CHECK(nvmlDeviceGetHandleByIndex_v2(0, &n0) == NVML_SUCCESS, "handle");
	nvmlMemory_t mem;
	CHECK(nvmlDeviceGetMemoryInfo(n0, &mem) == NVML_SUCCESS, "memory info");
	CHECK(mem.total == (unsigned long long)GiB && mem.used == (unsigned long long)(600 * MiB) && mem.free == (unsigned long long)(424 * MiB),
	      "NVML memory: total %llu used %llu free %llu", mem.total, mem.used, mem.free);
	nvmlMemory_v2_t mem2 = {.version = 2};
	CHECK(nvmlDeviceGetMemoryInfo_v2(n0, &mem2) == NVML_SUCCESS && mem2.total == (unsigned long long)GiB && mem2.used == (unsigned long long)(600 * MiB),
	      "NVML memory v2: total %llu used %llu", mem2.total, mem2.used);
	unsigned count = 0;
	CHECK(nvmlDeviceGetComputeRunningProcesses_v3(n0, &count, NULL) == NVML_ERROR_INSUFFICIENT_SIZE && count == 1, "process count %u, want 1", count);
	nvmlProcessInfo_v2_t procs[4];
	count = 4;
	CHECK(nvmlDeviceGetComputeRunningProcesses_v3(n0, &count, procs) == NVML_SUCCESS && count == 1 && procs[0].pid == (unsigned)getpid() &&
		      procs[0].usedGpuMemory == (unsigned long long)(600 * MiB),
	      "processes: %u, first pid %u using %llu", count, count ? procs[0].pid : 0, count ? procs[0].usedGpuMemory : 0);
	nvmlProcessInfo_v1_t p1[4];
	count = 4;
	CHECK(nvmlDeviceGetComputeRunningProcesses(n0, &count, p1) == NVML_SUCCESS && count == 1 && p1[0].usedGpuMemory == (unsigned long long)(600 * MiB), "v1 processes");
	CU(cuMemFree_v2(a));
	CHECK(free_now() == (size_t)GiB, "free %zu after every free, want the whole grant", free_now());
	return done("memory: every allocation path, the cap, exact frees, reported memory");
}
