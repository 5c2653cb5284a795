/*
 * The fake driver's device: GPUs whose memory and timeline all processes
 * of a test share, through the file FAKE_GPU_STATE names (private to the
 * process without it). Kernels do not run: each takes the device's
 * timeline for the time its name says, one after another, as a
 * time-sliced GPU runs one context at a time.
 */
#ifndef FAKESTATE_H
#define FAKESTATE_H

#define _GNU_SOURCE
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define FAKE_MAX_GPUS 4
#define FAKE_MAX_PROCS 256

struct fake_gpu {
	unsigned char uuid[16];
	int64_t total;
	_Atomic int64_t used;
	_Atomic int64_t busy_until; /* ns, CLOCK_MONOTONIC */
};

/* What each process ran, for the tests to read. */
struct fake_proc {
	_Atomic int32_t pid;
	_Atomic int64_t busy_ns, kernels, cooperative, graphs;
};

struct fake_state {
	_Atomic int ready;
	int ngpus;
	struct fake_gpu gpu[FAKE_MAX_GPUS];
	struct fake_proc proc[FAKE_MAX_PROCS];
};

static inline int64_t fake_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline struct fake_state *fake_state(void)
{
	static _Atomic(struct fake_state *) st;
	struct fake_state *s = atomic_load(&st);
	if (s)
		return s;
	const char *path = getenv("FAKE_GPU_STATE");
	if (path) {
		int fd = open(path, O_RDWR | O_CREAT, 0666);
		if (fd < 0 || ftruncate(fd, sizeof(struct fake_state)) != 0) {
			perror("fake driver: FAKE_GPU_STATE");
			abort();
		}
		s = mmap(NULL, sizeof(struct fake_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		close(fd);
	} else {
		s = mmap(NULL, sizeof(struct fake_state), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	}
	if (s == MAP_FAILED)
		abort();
	int zero = 0;
	if (atomic_compare_exchange_strong(&s->ready, &zero, 1)) {
		const char *n = getenv("FAKE_GPU_COUNT"), *mem = getenv("FAKE_GPU_MEMORY");
		s->ngpus = n ? atoi(n) : 2;
		if (s->ngpus < 1 || s->ngpus > FAKE_MAX_GPUS)
			s->ngpus = 2;
		for (int i = 0; i < s->ngpus; i++) {
			s->gpu[i].uuid[15] = (unsigned char)(i + 1);
			s->gpu[i].total = mem ? atoll(mem) : 80LL << 30;
		}
		atomic_store(&s->ready, 2);
	}
	while (atomic_load(&s->ready) != 2)
		;
	atomic_store(&st, s);
	return s;
}

static inline struct fake_proc *fake_proc(void)
{
	struct fake_state *s = fake_state();
	int32_t pid = getpid();
	for (int i = 0; i < FAKE_MAX_PROCS; i++) {
		int32_t p = atomic_load(&s->proc[i].pid);
		if (p == pid)
			return &s->proc[i];
		if (p == 0) {
			int32_t zero = 0;
			if (atomic_compare_exchange_strong(&s->proc[i].pid, &zero, pid) || zero == pid)
				return &s->proc[i];
		}
	}
	abort();
}

#endif
