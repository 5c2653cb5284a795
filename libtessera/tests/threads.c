/* Many threads allocating and freeing at once: the grant is never passed,
 * and every byte comes back. */
#include <pthread.h>

#include "check.h"
#include "../fake/fakestate.h"

#define THREADS 16
#define ROUNDS 2000

static CUcontext ctx;
static _Atomic long refused;

static void *worker(void *arg)
{
	cuCtxSetCurrent(ctx);
	unsigned seed = (unsigned)(uintptr_t)arg;
	CUdeviceptr held[8] = {0};
	for (int i = 0; i < ROUNDS; i++) {
		int k = rand_r(&seed) % 8;
		if (held[k]) {
			if (cuMemFree_v2(held[k]) != CUDA_SUCCESS)
				abort();
			held[k] = 0;
		} else if (cuMemAlloc_v2(&held[k], (size_t)(8 + rand_r(&seed) % 33) * MiB) != CUDA_SUCCESS) {
			held[k] = 0;
			refused++;
		}
	}
	for (int k = 0; k < 8; k++)
		if (held[k])
			cuMemFree_v2(held[k]);
	return NULL;
}

int main(void)
{
	/* 16 threads × 8 × 8–40 MiB: up to 5 GiB asked of a 256 MiB grant, and one thread alone can pass it. */
	write_limits(NULL, GPU0 " 268435456 100\n");
	CU(cuInit(0));
	CU(cuDevicePrimaryCtxRetain(&ctx, 0));
	CU(cuCtxSetCurrent(ctx));
	pthread_t t[THREADS];
	for (int i = 0; i < THREADS; i++)
		pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(i + 1));
	size_t f, total;
	long over = 0, peak = 0;
	for (int i = 0; i < 200; i++) {
		/* The fake driver's own count, read from its device, never
		 * passes the grant. */
		long used = (long)atomic_load(&fake_state()->gpu[0].used);
		peak = used > peak ? used : peak;
		if (used > 256 * MiB)
			over++;
		usleep(1000);
	}
	for (int i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	CU(cuMemGetInfo_v2(&f, &total));
	CHECK(over == 0, "the device's use passed the grant %ld times (peak %ld bytes)", over, peak);
	CHECK(refused > 0, "no allocation was refused: the test did not reach the cap");
	CHECK(f == (size_t)(256 * MiB), "free %zu after every thread freed all it held", f);
	return done("threads: 16 threads allocate and free at once; the cap holds, every byte returns");
}
