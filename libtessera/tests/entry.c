/* Entry points reached through dlsym on the driver's handle and through
 * cuGetProcAddress (as CUDA 12 runtimes reach them) are the library's:
 * their allocations are counted, whatever version or variant was asked
 * for. Legacy 32-bit entry points are refused. */
#include "check.h"

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*getproc_fn)(const char *, void **, int, cuuint64_t, int *);

/* in_library says whether p is defined by libtessera. */
static int in_library(void *p)
{
	Dl_info info;
	if (!p || !dladdr(p, &info) || !info.dli_fname)
		return 0;
	const char *base = strrchr(info.dli_fname, '/');
	return strncmp(base ? base + 1 : info.dli_fname, "libtessera", 10) == 0;
}

int main(void)
{
	write_limits(NULL, GPU0 " 104857600 30\n"); /* 100 MiB */
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	CHECK(h != NULL, "dlopen libcuda.so.1: %s", dlerror());
	alloc_fn by_dlsym = (alloc_fn)dlsym(h, "cuMemAlloc_v2");
	CHECK(in_library((void *)by_dlsym), "dlsym(libcuda, cuMemAlloc_v2) is the driver's own");
	getproc_fn getproc = (getproc_fn)dlsym(h, "cuGetProcAddress_v2");
	CHECK(in_library((void *)getproc), "dlsym(libcuda, cuGetProcAddress_v2) is the driver's own");

	on_device(0);
	void *p = NULL;
	int status = -1;
	CU(getproc("cuMemAlloc", &p, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
	CHECK(in_library(p), "cuGetProcAddress(cuMemAlloc) gave the driver's cuMemAlloc_v2");
	alloc_fn by_proc = (alloc_fn)p;
	CUdeviceptr a, b;
	CU(by_dlsym(&a, 60 * MiB));
	CHECK(by_proc(&b, 60 * MiB) == CUDA_ERROR_OUT_OF_MEMORY, "60 + 60 MiB of 100 through dlsym and cuGetProcAddress was allowed");

	const char *wrapped[] = {"cuLaunchKernel", "cuLaunchCooperativeKernel", "cuGraphLaunch", "cuLaunchKernelEx",
				 "cuMemFree", "cuMemGetInfo", "cuMemCreate", "cuMemAllocAsync", "cuArrayCreate", "cuGetProcAddress"};
	for (size_t i = 0; i < sizeof(wrapped) / sizeof(wrapped[0]); i++) {
		for (int ptsz = 0; ptsz < 2; ptsz++) {
			p = NULL;
			CUresult r = getproc(wrapped[i], &p, 12000, ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0, &status);
			CHECK(r == CUDA_SUCCESS && in_library(p), "cuGetProcAddress(%s%s) is the driver's own", wrapped[i], ptsz ? ", per-thread stream" : "");
		}
	}
	/* cuGetProcAddress got from cuGetProcAddress is still the library's. */
	void *gp = NULL;
	CU(getproc("cuGetProcAddress", &gp, 12000, 0, &status));
	p = NULL;
	CU(((getproc_fn)gp)("cuMemAlloc", &p, 12000, 0, &status));
	CHECK(in_library(p), "cuMemAlloc through a cuGetProcAddress got from cuGetProcAddress is the driver's own");

	/* A version of a wrapped entry point newer than the library (the fake
	 * has cuMemAlloc_v3 for CUDA 13.5) is refused, not handed out
	 * unwrapped; an entry point the library does not wrap is the
	 * driver's. */
	CHECK(dlsym(h, "cuMemAlloc_v3") == NULL, "dlsym handed out cuMemAlloc_v3, which the library does not know");
	p = (void *)1;
	status = -1;
	CHECK(getproc("cuMemAlloc", &p, 13050, 0, &status) == CUDA_ERROR_NOT_FOUND && p == NULL && status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
	      "cuGetProcAddress(cuMemAlloc, 13.5) handed out the driver's unknown version (%p, status %d)", p, status);
	void *rec = dlsym(h, "cuEventRecord");
	CHECK(rec && !in_library(rec), "cuEventRecord, which the library does not wrap, was not the driver's");

	/* The legacy 32-bit allocation cannot be counted: refused. */
	CUresult (*legacy)(unsigned *, unsigned) = (CUresult(*)(unsigned *, unsigned))dlsym(h, "cuMemAlloc");
	unsigned small;
	CHECK(legacy && legacy(&small, 1 << 20) == CUDA_ERROR_NOT_SUPPORTED, "the legacy cuMemAlloc was not refused");

	/* NVML through dlsym on its handle. */
	void *nh = dlopen("libnvidia-ml.so.1", RTLD_NOW);
	CHECK(nh && in_library(dlsym(nh, "nvmlDeviceGetMemoryInfo_v2")), "dlsym(libnvidia-ml, nvmlDeviceGetMemoryInfo_v2) is NVML's own");
	CHECK(nh && !in_library(dlsym(nh, "nvmlInit_v2")), "an NVML function the library does not wrap was wrapped");
	CU(cuMemFree_v2(a));
	return done("entry: dlsym and cuGetProcAddress (every suffix and variant) give the library's entry points");
}
