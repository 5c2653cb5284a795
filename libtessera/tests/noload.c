/* The library never loads the driver into a process that does not use it:
 * a dlsym of a name that merely starts like the driver's (cuBLAS', cuDNN's,
 * cudart's, or the program's own) or of a wrapped name while no driver is
 * loaded leaves libcuda.so.1 and libnvidia-ml.so.1 unloaded. Built without
 * the fake driver; run with it on the library path, where a dlopen would
 * find it. */
#include "check.h"

/* Exported (-rdynamic): names dlsym finds in this program. */
int cublasCreate_v2(void) { return 0; }
int nvmlLookalike(void) { return 0; }

int main(void)
{
	const char *names[] = {"cublasCreate_v2", "nvmlLookalike", "cuMemAlloc_v2", "nvmlDeviceGetMemoryInfo", "cudaMalloc"};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		(void)dlsym(RTLD_DEFAULT, names[i]);
	CHECK(dlsym(RTLD_DEFAULT, "cublasCreate_v2") == (void *)cublasCreate_v2, "dlsym of the program's own cublasCreate_v2 was changed");
	CHECK(dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD) == NULL, "dlsym loaded libcuda.so.1 into a process that never asked for it");
	CHECK(dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NOLOAD) == NULL, "dlsym loaded libnvidia-ml.so.1 into a process that never asked for it");
	return done("noload: dlsym never loads the driver into a process that does not use it");
}
