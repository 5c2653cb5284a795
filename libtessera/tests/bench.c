/* The library's cost per call against the fake driver alone: run once
 * with the library preloaded and once without (tests/bench.sh). */
#include "check.h"

#define N 200000

static double per_call_ns(double t0, int n) { return (now_s() - t0) * 1e9 / n; }

int main(int argc, char **argv)
{
	on_device(0);
	CUdeviceptr p;
	double t0 = now_s();
	for (int i = 0; i < N; i++) {
		cuMemAlloc_v2(&p, 1 << 20);
		cuMemFree_v2(p);
	}
	printf("alloc+free %.0f ns\n", per_call_ns(t0, N));
	CUmodule m;
	CUfunction f;
	cuModuleLoadData(&m, "fake");
	cuModuleGetFunction(&f, m, "k0");
	CUstream s;
	cuStreamCreate(&s, 0);
	t0 = now_s();
	for (int i = 0; i < N; i++)
		cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL);
	printf("launch %.0f ns\n", per_call_ns(t0, N));
	return 0;
}
