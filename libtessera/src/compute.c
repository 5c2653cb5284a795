/*
 * Compute: a container's kernels get at most its share of the GPU's time.
 *
 * Each launch is charged its GPU time, known in advance only as an
 * estimate (the last measured times of the same kernel and grid, or graph)
 * and corrected when the launch's own events say how long it ran. The
 * charge drives a generic cell rate algorithm per GPU in the container's
 * shared region: a theoretical arrival time (TAT) that moves on by
 * cost / share for every launch; a launch more than the burst ahead of the
 * clock waits. Cooperative launches and CUDA graph launches go through the
 * same charge (a graph is one launch whose events bracket all its
 * kernels), so neither escapes the share.
 *
 * Nothing is locked on the launch path: the TAT is one atomic shared by
 * the container's processes, the estimates a lock-free table, and the
 * launches still being measured a ring per thread.
 */
#define _GNU_SOURCE
#include <string.h>
#include <time.h>

#include "libtessera.h"

/* The most a container may run ahead of its share: launches within this
 * much of the TAT go at once, so the GPU's queue stays fed. */
#define BURST_NS (20 * 1000 * 1000LL)
/* Launches in flight and not yet measured, per thread. At the limit the
 * thread waits for the oldest: no launch goes uncharged. */
#define RING 256

/* Estimates: open addressing, keys and values set with atomics. */
#define NEST 4096
static struct {
	_Atomic uint64_t key;
	_Atomic int64_t ns;
} est_table[NEST];

static int64_t estimate(uint64_t key)
{
	uint64_t h = key * 0x9e3779b97f4a7c15ULL;
	for (int i = 0; i < 8; i++) {
		unsigned j = (unsigned)((h >> 32) + i) % NEST;
		if (atomic_load_explicit(&est_table[j].key, memory_order_acquire) == key)
			return atomic_load_explicit(&est_table[j].ns, memory_order_relaxed);
	}
	return 0;
}

static void learn(uint64_t key, int64_t ns)
{
	uint64_t h = key * 0x9e3779b97f4a7c15ULL;
	for (int i = 0; i < 8; i++) {
		unsigned j = (unsigned)((h >> 32) + i) % NEST;
		uint64_t k = atomic_load(&est_table[j].key);
		if (k == 0) {
			atomic_store_explicit(&est_table[j].ns, ns, memory_order_relaxed);
			if (atomic_compare_exchange_strong(&est_table[j].key, &k, key))
				return;
		}
		if (k == key) {
			int64_t old = atomic_load_explicit(&est_table[j].ns, memory_order_relaxed);
			atomic_store_explicit(&est_table[j].ns, (3 * old + ns) / 4, memory_order_relaxed);
			return;
		}
	}
}

struct pending {
	CUevent start, end;
	CUcontext ctx;
	int g;
	uint64_t key;
	int64_t est;
};

static __thread struct {
	struct pending p[RING];
	unsigned head, tail;
	unsigned generation; /* the fork generation the ring belongs to */
} ring;

/* Events for reuse, per thread, of one context: creating and destroying
 * two per launch would cost two driver calls more each. */
#define POOL 64
static __thread struct {
	CUevent ev[POOL];
	int n;
	CUcontext ctx;
	unsigned generation;
} pool;

static _Atomic unsigned fork_generation;

/* event is an event of ctx, reused or new; NULL when none can be made. */
static CUevent event(CUcontext ctx)
{
	unsigned gen = atomic_load_explicit(&fork_generation, memory_order_relaxed);
	if (pool.generation != gen) {
		pool.n = 0; /* the parent's events: not this process's to use */
		pool.generation = gen;
	}
	if (pool.ctx == ctx && pool.n > 0)
		return pool.ev[--pool.n];
	CUevent e = NULL;
	if (REAL(cuEventCreate)(&e, CU_EVENT_DEFAULT) != CUDA_SUCCESS)
		return NULL;
	return e;
}

/* release keeps e, an event of ctx, for the next launch in ctx. */
static void release(CUevent e, CUcontext ctx)
{
	if (!e)
		return;
	if (pool.ctx != ctx) {
		while (pool.n > 0)
			REAL(cuEventDestroy_v2)(pool.ev[--pool.n]);
		pool.ctx = ctx;
	}
	if (pool.n < POOL)
		pool.ev[pool.n++] = e;
	else
		REAL(cuEventDestroy_v2)(e);
}

void tessera_forget_launches(void)
{
	/* The events were the parent's: the child's rings start empty. */
	atomic_fetch_add(&fork_generation, 1);
	memset(est_table, 0, sizeof(est_table));
}

static int64_t wall_per_gpu_ns(int64_t gpu_ns, int cores) { return gpu_ns * 100 / cores; }

/* correct moves the GPU's TAT by a measured launch's error. */
static void correct(int g, int64_t delta_gpu_ns)
{
	struct tessera_state *st = tessera_state_get();
	int cores = st->limits.gpu[g].cores;
	atomic_fetch_add(&st->region->gpu[g].tat, wall_per_gpu_ns(delta_gpu_ns, cores));
}

static void done(struct pending *e)
{
	release(e->start, e->ctx);
	release(e->end, e->ctx);
}

/* harvest charges the launches whose events have completed, oldest first;
 * with wait, it waits for the oldest. */
static void harvest(int wait)
{
	unsigned gen = atomic_load_explicit(&fork_generation, memory_order_relaxed);
	if (ring.generation != gen) {
		ring.head = ring.tail = 0;
		ring.generation = gen;
	}
	while (ring.tail != ring.head) {
		struct pending *e = &ring.p[ring.tail % RING];
		CUresult r = wait ? REAL(cuEventSynchronize)(e->end) : REAL(cuEventQuery)(e->end);
		wait = 0;
		if (r == CUDA_ERROR_NOT_READY)
			return;
		float ms;
		if (r == CUDA_SUCCESS && REAL(cuEventElapsedTime)(&ms, e->start, e->end) == CUDA_SUCCESS) {
			int64_t ns = (int64_t)(ms * 1e6);
			correct(e->g, ns - e->est);
			learn(e->key, ns);
		}
		done(e);
		ring.tail++;
	}
}

static void sleep_ns(int64_t ns)
{
	struct timespec ts = {.tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL};
	while (nanosleep(&ts, &ts) != 0)
		;
}

void tessera_throttle(struct tessera_launch *l, uint64_t key, CUstream stream, int ptsz)
{
	memset(l, 0, sizeof(*l));
	l->g = -1;
	struct tessera_state *st = tessera_state_get();
	int g = tessera_current_index();
	if (g == TESSERA_NO_CONTEXT)
		return; /* the driver refuses the launch */
	if (!st->ready || g < 0) {
		l->refused = 1;
		return;
	}
	int cores = st->limits.gpu[g].cores;
	if (cores >= 100 || st->limits.gpu[g].mps)
		return;
	if (ptsz && stream == NULL)
		stream = (CUstream)0x2; /* CU_STREAM_PER_THREAD */
	/* A launch into a stream being captured runs when its graph does:
	 * the graph's launch is charged. */
	int capturing = CU_STREAM_CAPTURE_STATUS_NONE;
	if (REAL(cuStreamIsCapturing)(stream, &capturing) != CUDA_SUCCESS || capturing != CU_STREAM_CAPTURE_STATUS_NONE)
		return;
	/* Queries and events are not capture-safe in another thread's global
	 * capture; a library makes its own calls relaxed. */
	int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
	int exchanged = REAL(cuThreadExchangeStreamCaptureMode) && REAL(cuThreadExchangeStreamCaptureMode)(&mode) == CUDA_SUCCESS;
	harvest(0);
	if (ring.head - ring.tail >= RING)
		harvest(1);

	int64_t est = estimate(key);
	_Atomic int64_t *tat = &st->region->gpu[g].tat;
	int64_t now = tessera_now_ns(), base;
	int64_t old = atomic_load(tat);
	do {
		base = old > now ? old : now;
	} while (!atomic_compare_exchange_weak(tat, &old, base + wall_per_gpu_ns(est, cores)));
	if (base - BURST_NS > now)
		sleep_ns(base - BURST_NS - now);

	l->g = g;
	l->key = key;
	l->est = est;
	if (REAL(cuCtxGetCurrent)(&l->ctx) == CUDA_SUCCESS && (l->start = event(l->ctx)) != NULL) {
		if (REAL(cuEventRecord)(l->start, stream) == CUDA_SUCCESS && (l->end = event(l->ctx)) != NULL)
			l->measured = 1;
		else
			release(l->start, l->ctx);
	}
	if (exchanged)
		REAL(cuThreadExchangeStreamCaptureMode)(&mode);
}

void tessera_launched(struct tessera_launch *l, CUstream stream, int ptsz, CUresult r)
{
	if (l->g < 0)
		return;
	if (r != CUDA_SUCCESS) {
		correct(l->g, -l->est); /* it will not run */
		if (l->measured)
			done(&(struct pending){.start = l->start, .end = l->end, .ctx = l->ctx});
		return;
	}
	if (!l->measured)
		return;
	if (ptsz && stream == NULL)
		stream = (CUstream)0x2;
	if (REAL(cuEventRecord)(l->end, stream) != CUDA_SUCCESS) {
		done(&(struct pending){.start = l->start, .end = l->end, .ctx = l->ctx});
		return;
	}
	ring.p[ring.head % RING] = (struct pending){.start = l->start, .end = l->end, .ctx = l->ctx, .g = l->g, .key = l->key, .est = l->est};
	ring.head++;
}

static uint64_t kernel_key(CUfunction f, unsigned gx, unsigned gy, unsigned gz)
{
	uint64_t k = (uint64_t)(uintptr_t)f;
	k ^= ((uint64_t)gx * 0x9e3779b1u) ^ ((uint64_t)gy << 21) ^ ((uint64_t)gz << 42);
	return k ? k : 1;
}

#define LAUNCH(name, key, stream, ptsz, ...)                       \
	GET_REAL(name, CUDA_ERROR_NOT_FOUND);                      \
	struct tessera_launch l;                                   \
	tessera_throttle(&l, key, stream, ptsz);                   \
	if (l.refused)                                             \
		return CUDA_ERROR_NOT_PERMITTED;                   \
	CUresult r = real(__VA_ARGS__);                            \
	tessera_launched(&l, stream, ptsz, r);                     \
	return r

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shared, CUstream s, void **params, void **extra)
{
	LAUNCH(cuLaunchKernel, kernel_key(f, gx, gy, gz), s, 0, f, gx, gy, gz, bx, by, bz, shared, s, params, extra);
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shared, CUstream s, void **params, void **extra)
{
	LAUNCH(cuLaunchKernel_ptsz, kernel_key(f, gx, gy, gz), s, 1, f, gx, gy, gz, bx, by, bz, shared, s, params, extra);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
	if (!c)
		return CUDA_ERROR_INVALID_VALUE;
	LAUNCH(cuLaunchKernelEx, kernel_key(f, c->gridDimX, c->gridDimY, c->gridDimZ), c->hStream, 0, c, f, params, extra);
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
	if (!c)
		return CUDA_ERROR_INVALID_VALUE;
	LAUNCH(cuLaunchKernelEx_ptsz, kernel_key(f, c->gridDimX, c->gridDimY, c->gridDimZ), c->hStream, 1, c, f, params, extra);
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shared, CUstream s, void **params)
{
	LAUNCH(cuLaunchCooperativeKernel, kernel_key(f, gx, gy, gz), s, 0, f, gx, gy, gz, bx, by, bz, shared, s, params);
}

CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shared, CUstream s, void **params)
{
	LAUNCH(cuLaunchCooperativeKernel_ptsz, kernel_key(f, gx, gy, gz), s, 1, f, gx, gy, gz, bx, by, bz, shared, s, params);
}

CUresult cuGraphLaunch(CUgraphExec exec, CUstream s)
{
	LAUNCH(cuGraphLaunch, (uint64_t)(uintptr_t)exec | 1, s, 0, exec, s);
}

CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream s)
{
	LAUNCH(cuGraphLaunch_ptsz, (uint64_t)(uintptr_t)exec | 1, s, 1, exec, s);
}

/* The pre-CUDA 4 launches run on the legacy default stream. */
CUresult cuLaunch(CUfunction f)
{
	LAUNCH(cuLaunch, kernel_key(f, 1, 1, 1), NULL, 0, f);
}

CUresult cuLaunchGrid(CUfunction f, int w, int h)
{
	LAUNCH(cuLaunchGrid, kernel_key(f, (unsigned)w, (unsigned)h, 1), NULL, 0, f, w, h);
}

CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream s)
{
	LAUNCH(cuLaunchGridAsync, kernel_key(f, (unsigned)w, (unsigned)h, 1), s, 0, f, w, h, s);
}
