/* Helpers for libtessera's tests: each test is a program that exits 0 when
 * every check held and prints what failed otherwise. They run against the
 * fake driver (fake/) with the library preloaded (or linked, in the
 * sanitizer builds), each in a scratch directory TESSERA_TEST_DIR. */
#ifndef CHECK_H
#define CHECK_H

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tessera_cuda.h"
#include "tessera_nvml.h"

static int failures;

#define CHECK(cond, ...)                                                     \
	do {                                                                 \
		if (!(cond)) {                                               \
			fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                        \
			fputc('\n', stderr);                                 \
			failures++;                                          \
		}                                                            \
	} while (0)

#define CU(call) CHECK((call) == CUDA_SUCCESS, "%s", #call)

#define MiB (1LL << 20)
#define GiB (1LL << 30)

#define GPU0 "GPU-00000000-0000-0000-0000-000000000001"
#define GPU1 "GPU-00000000-0000-0000-0000-000000000002"

/* write_limits writes the container's limits, as the agent does, in dir
 * (TESSERA_TEST_DIR when NULL). */
static inline void write_limits(const char *dir, const char *text)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/limits", dir ? dir : getenv("TESSERA_TEST_DIR"));
	FILE *f = fopen(path, "w");
	if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
		perror(path);
		exit(2);
	}
}

/* on_device makes a context on device d current in this thread. */
static inline void on_device(int d)
{
	CUcontext c;
	CU(cuInit(0));
	CU(cuCtxCreate_v2(&c, 0, d));
}

static inline double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static inline int done(const char *name)
{
	if (failures) {
		fprintf(stderr, "FAIL %s: %d checks failed\n", name, failures);
		return 1;
	}
	printf("ok   %s\n", name);
	return 0;
}

#endif
