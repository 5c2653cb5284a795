/*
 * A fake libcuda.so.1 for libtessera's tests: device memory simulated
 * (with the GPU's total enforced), kernels timed on the shared fake
 * device (fakestate.h), streams, events, stream capture and graphs, and
 * cuGetProcAddress choosing version suffixes and per-thread variants as
 * the driver does. Not a CUDA: just enough of its behaviour for the
 * library's decisions to be tested.
 */
#include <pthread.h>
#include <string.h>

#include "fakestate.h"
#include "tessera_cuda.h"

struct CUctx_st {
	int dev;
};
struct CUfunc_st {
	int64_t ns;
};
struct CUmod_st {
	int unused;
};
struct CUgraph_st {
	int64_t ns;
	int nodes;
};
struct CUgraphExec_st {
	int64_t ns;
};
struct CUstream_st {
	int64_t tail;
	int capturing, invalidated;
	struct CUgraph_st *graph;
};
struct CUevent_st {
	int64_t time; /* 0: not recorded */
};
struct CUarray_st {
	int dev;
	int64_t bytes;
};
struct CUmipmappedArray_st {
	int dev;
	int64_t bytes;
};

static __thread CUcontext current;
static __thread int capture_mode;
static __thread struct CUstream_st per_thread_stream;
static struct CUstream_st legacy_stream;
static pthread_mutex_t legacy_mu = PTHREAD_MUTEX_INITIALIZER;
static struct CUctx_st primary[FAKE_MAX_GPUS];

/* Live allocations: pointer or handle → device and size. */
#define NB 65536
struct alloc {
	uint64_t key;
	int dev;
	int64_t bytes;
	struct alloc *next;
};
static struct alloc *allocs[NB];
static pthread_mutex_t allocs_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic uint64_t next_addr = 0x7f0000000000ULL;

static CUresult take(int dev, int64_t bytes, uint64_t *key)
{
	struct fake_gpu *g = &fake_state()->gpu[dev];
	if (bytes <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (atomic_fetch_add(&g->used, bytes) + bytes > g->total) {
		atomic_fetch_sub(&g->used, bytes);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (*key == 0)
		*key = atomic_fetch_add(&next_addr, ((uint64_t)bytes + 4095) & ~4095ULL);
	struct alloc *a = malloc(sizeof(*a));
	*a = (struct alloc){.key = *key, .dev = dev, .bytes = bytes};
	pthread_mutex_lock(&allocs_mu);
	a->next = allocs[*key / 4096 % NB];
	allocs[*key / 4096 % NB] = a;
	pthread_mutex_unlock(&allocs_mu);
	return CUDA_SUCCESS;
}

static CUresult give(uint64_t key)
{
	pthread_mutex_lock(&allocs_mu);
	for (struct alloc **p = &allocs[key / 4096 % NB]; *p; p = &(*p)->next) {
		if ((*p)->key == key) {
			struct alloc *a = *p;
			*p = a->next;
			pthread_mutex_unlock(&allocs_mu);
			atomic_fetch_sub(&fake_state()->gpu[a->dev].used, a->bytes);
			free(a);
			return CUDA_SUCCESS;
		}
	}
	pthread_mutex_unlock(&allocs_mu);
	return CUDA_ERROR_INVALID_VALUE;
}

static int cur_dev(void) { return current ? current->dev : -1; }

CUresult cuInit(unsigned int flags) { fake_state(); return CUDA_SUCCESS; }
CUresult cuDeviceGetCount(int *n) { *n = fake_state()->ngpus; return CUDA_SUCCESS; }
CUresult cuDeviceGet(CUdevice *d, int i) { if (i < 0 || i >= fake_state()->ngpus) return CUDA_ERROR_INVALID_VALUE; *d = i; return CUDA_SUCCESS; }
CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) { if (d < 0 || d >= fake_state()->ngpus) return CUDA_ERROR_INVALID_VALUE; memcpy(u->bytes, fake_state()->gpu[d].uuid, 16); return CUDA_SUCCESS; }
CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { return cuDeviceGetUuid(u, d); }
CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) { if (d < 0 || d >= fake_state()->ngpus) return CUDA_ERROR_INVALID_VALUE; *b = (size_t)fake_state()->gpu[d].total; return CUDA_SUCCESS; }
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { if (d < 0 || d >= fake_state()->ngpus) return CUDA_ERROR_INVALID_VALUE; primary[d].dev = d; *c = &primary[d]; return CUDA_SUCCESS; }
CUresult cuCtxCreate_v2(CUcontext *c, unsigned int flags, CUdevice d) { CUresult r = cuDevicePrimaryCtxRetain(c, d); if (r == CUDA_SUCCESS) current = *c; return r; }
CUresult cuCtxSetCurrent(CUcontext c) { current = c; return CUDA_SUCCESS; }
CUresult cuCtxGetCurrent(CUcontext *c) { *c = current; return CUDA_SUCCESS; }
CUresult cuCtxGetDevice(CUdevice *d) { if (!current) return CUDA_ERROR_INVALID_CONTEXT; *d = current->dev; return CUDA_SUCCESS; }

#define NEED_CONTEXT() \
	if (!current)  \
	return CUDA_ERROR_INVALID_CONTEXT

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { NEED_CONTEXT(); uint64_t k = 0; CUresult r = take(cur_dev(), (int64_t)n, &k); if (r == CUDA_SUCCESS) *p = k; return r; }
CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned f) { return cuMemAlloc_v2(p, n); }
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) { return cuMemAlloc_v2(p, n); }
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) { return cuMemAlloc_v2(p, n); }
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) { return cuMemAlloc_v2(p, n); }
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) { return cuMemAlloc_v2(p, n); }
CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned e)
{
	NEED_CONTEXT();
	*pitch = (w + 511) & ~(size_t)511;
	return cuMemAlloc_v2(p, *pitch * h);
}
CUresult cuMemFree_v2(CUdeviceptr p) { return p == 0 ? CUDA_SUCCESS : give(p); }
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { return cuMemFree_v2(p); }
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return cuMemFree_v2(p); }
CUresult cuMemGetInfo_v2(size_t *f, size_t *t)
{
	NEED_CONTEXT();
	struct fake_gpu *g = &fake_state()->gpu[cur_dev()];
	*t = (size_t)g->total;
	*f = (size_t)(g->total - atomic_load(&g->used));
	return CUDA_SUCCESS;
}

static int64_t elem(CUarray_format f) { return f == CU_AD_FORMAT_FLOAT || f == CU_AD_FORMAT_UNSIGNED_INT32 || f == CU_AD_FORMAT_SIGNED_INT32 ? 4 : f == CU_AD_FORMAT_HALF || f == CU_AD_FORMAT_UNSIGNED_INT16 || f == CU_AD_FORMAT_SIGNED_INT16 ? 2 : 1; }

CUresult cuArray3DCreate_v2(CUarray *h, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
	NEED_CONTEXT();
	struct CUarray_st *a = malloc(sizeof(*a));
	a->dev = cur_dev();
	a->bytes = elem(d->Format) * d->NumChannels * (int64_t)(d->Width ? d->Width : 1) * (int64_t)(d->Height ? d->Height : 1) * (int64_t)(d->Depth ? d->Depth : 1);
	uint64_t k = (uint64_t)(uintptr_t)a;
	CUresult r = take(a->dev, a->bytes, &k);
	if (r != CUDA_SUCCESS) {
		free(a);
		return r;
	}
	*h = a;
	return r;
}
CUresult cuArrayCreate_v2(CUarray *h, const CUDA_ARRAY_DESCRIPTOR *d)
{
	CUDA_ARRAY3D_DESCRIPTOR d3 = {d->Width, d->Height, 0, d->Format, d->NumChannels, 0};
	return cuArray3DCreate_v2(h, &d3);
}
CUresult cuArrayDestroy(CUarray h)
{
	CUresult r = give((uint64_t)(uintptr_t)h);
	if (r == CUDA_SUCCESS)
		free(h);
	return r;
}
CUresult cuMipmappedArrayCreate(CUmipmappedArray *h, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels)
{
	CUarray a;
	CUresult r = cuArray3DCreate_v2(&a, d);
	if (r == CUDA_SUCCESS)
		*h = (CUmipmappedArray)a;
	return r;
}
CUresult cuMipmappedArrayDestroy(CUmipmappedArray h) { return cuArrayDestroy((CUarray)h); }

static _Atomic uint64_t next_handle = 1;
CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n, const CUmemAllocationProp *p, unsigned long long flags)
{
	if (p->location.type != CU_MEM_LOCATION_TYPE_DEVICE || p->location.id < 0 || p->location.id >= fake_state()->ngpus)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t k = atomic_fetch_add(&next_handle, 1) * 4096;
	CUresult r = take(p->location.id, (int64_t)n, &k);
	if (r == CUDA_SUCCESS)
		*h = k;
	return r;
}
CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return give(h); }

/* Streams and the device's timeline. */
static struct CUstream_st *stream_of(CUstream s)
{
	if (s == NULL || s == (CUstream)0x1)
		return &legacy_stream;
	if (s == (CUstream)0x2)
		return &per_thread_stream;
	return s;
}

/* run puts ns of work on the device after what the stream holds. */
static void run(struct CUstream_st *st, int64_t ns, int kind)
{
	struct fake_gpu *g = &fake_state()->gpu[cur_dev()];
	int64_t now = fake_now(), old = atomic_load(&g->busy_until), start;
	do {
		start = old > now ? old : now;
		if (st->tail > start)
			start = st->tail;
	} while (!atomic_compare_exchange_weak(&g->busy_until, &old, start + ns));
	if (st == &legacy_stream)
		pthread_mutex_lock(&legacy_mu);
	st->tail = start + ns;
	if (st == &legacy_stream)
		pthread_mutex_unlock(&legacy_mu);
	struct fake_proc *p = fake_proc();
	atomic_fetch_add(&p->busy_ns, ns);
	atomic_fetch_add(kind == 0 ? &p->kernels : kind == 1 ? &p->cooperative : &p->graphs, 1);
}

CUresult cuStreamCreate(CUstream *s, unsigned flags) { *s = calloc(1, sizeof(struct CUstream_st)); return CUDA_SUCCESS; }
CUresult cuStreamDestroy_v2(CUstream s) { free(s); return CUDA_SUCCESS; }

static void wait_until(int64_t t)
{
	int64_t now;
	while ((now = fake_now()) < t) {
		struct timespec ts = {0, t - now};
		nanosleep(&ts, NULL);
	}
}

CUresult cuStreamSynchronize(CUstream s) { wait_until(stream_of(s)->tail); return CUDA_SUCCESS; }
CUresult cuCtxSynchronize(void) { NEED_CONTEXT(); wait_until(atomic_load(&fake_state()->gpu[cur_dev()].busy_until)); return CUDA_SUCCESS; }

CUresult cuStreamBeginCapture_v2(CUstream s, int mode)
{
	struct CUstream_st *st = stream_of(s);
	if (st == &legacy_stream)
		return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	st->capturing = 1;
	st->invalidated = 0;
	st->graph = calloc(1, sizeof(struct CUgraph_st));
	return CUDA_SUCCESS;
}
CUresult cuStreamEndCapture(CUstream s, CUgraph *g)
{
	struct CUstream_st *st = stream_of(s);
	if (!st->capturing)
		return CUDA_ERROR_INVALID_VALUE;
	st->capturing = 0;
	if (st->invalidated) {
		free(st->graph);
		return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
	}
	*g = st->graph;
	return CUDA_SUCCESS;
}
CUresult cuStreamIsCapturing(CUstream s, int *status) { *status = stream_of(s)->capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE; return CUDA_SUCCESS; }
CUresult cuThreadExchangeStreamCaptureMode(int *mode) { int m = capture_mode; capture_mode = *mode; *mode = m; return CUDA_SUCCESS; }

CUresult cuEventCreate(CUevent *e, unsigned flags) { *e = calloc(1, sizeof(struct CUevent_st)); return CUDA_SUCCESS; }
CUresult cuEventDestroy_v2(CUevent e) { free(e); return CUDA_SUCCESS; }
CUresult cuEventRecord(CUevent e, CUstream s)
{
	NEED_CONTEXT();
	struct CUstream_st *st = stream_of(s);
	if (st->capturing) {
		/* Not a node this fake captures: the capture is spoilt, as a
		 * stray call spoils a real one. */
		st->invalidated = 1;
		return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	}
	/* An event is reached when its stream gets the device. */
	struct fake_gpu *g = &fake_state()->gpu[cur_dev()];
	int64_t now = fake_now(), old = atomic_load(&g->busy_until), t;
	do {
		t = old > now ? old : now;
		if (st->tail > t)
			t = st->tail;
	} while (!atomic_compare_exchange_weak(&g->busy_until, &old, t));
	st->tail = t;
	e->time = t;
	return CUDA_SUCCESS;
}
CUresult cuEventQuery(CUevent e) { return e->time && e->time <= fake_now() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY; }
CUresult cuEventSynchronize(CUevent e) { wait_until(e->time); return CUDA_SUCCESS; }
CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b)
{
	if (!a->time || !b->time || b->time > fake_now())
		return CUDA_ERROR_NOT_READY;
	*ms = (float)(b->time - a->time) / 1e6f;
	return CUDA_SUCCESS;
}

/* A function named k<microseconds> runs that long. */
CUresult cuModuleLoadData(CUmodule *m, const void *image) { *m = calloc(1, sizeof(struct CUmod_st)); return CUDA_SUCCESS; }
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
	if (name[0] != 'k')
		return CUDA_ERROR_NOT_FOUND;
	*f = malloc(sizeof(struct CUfunc_st));
	(*f)->ns = atoll(name + 1) * 1000;
	return CUDA_SUCCESS;
}

static CUresult launch(CUfunction f, CUstream s, int kind)
{
	NEED_CONTEXT();
	struct CUstream_st *st = stream_of(s);
	if (st->capturing) {
		st->graph->ns += f->ns;
		st->graph->nodes++;
		return CUDA_SUCCESS;
	}
	run(st, f->ns, kind);
	return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sh, CUstream s, void **p, void **x) { return launch(f, s, 0); }
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sh, CUstream s, void **p, void **x) { return launch(f, s ? s : (CUstream)0x2, 0); }
CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **x) { return launch(f, c->hStream, 0); }
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **p, void **x) { return launch(f, c->hStream ? c->hStream : (CUstream)0x2, 0); }
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sh, CUstream s, void **p) { return launch(f, s, 1); }
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sh, CUstream s, void **p) { return launch(f, s ? s : (CUstream)0x2, 1); }
CUresult cuLaunch(CUfunction f) { return launch(f, NULL, 0); }
CUresult cuLaunchGrid(CUfunction f, int w, int h) { return launch(f, NULL, 0); }
CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream s) { return launch(f, s, 0); }

CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags) { *e = malloc(sizeof(struct CUgraphExec_st)); (*e)->ns = g->ns; return CUDA_SUCCESS; }
CUresult cuGraphLaunch(CUgraphExec e, CUstream s)
{
	NEED_CONTEXT();
	struct CUstream_st *st = stream_of(s);
	if (st->capturing)
		return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	run(st, e->ns, 2);
	return CUDA_SUCCESS;
}
CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream s) { return cuGraphLaunch(e, s ? s : (CUstream)0x2); }
CUresult cuGraphExecDestroy(CUgraphExec e) { free(e); return CUDA_SUCCESS; }
CUresult cuGraphDestroy(CUgraph g) { free(g); return CUDA_SUCCESS; }

/* A version newer than the library knows, as a future driver may add:
 * cuGetProcAddress hands it out for CUDA 13.5 and later. */
CUresult cuMemAlloc_v3(CUdeviceptr *p, size_t n);
CUresult cuMemAlloc_v3(CUdeviceptr *p, size_t n) { return cuMemAlloc_v2(p, n); }

/* The legacy 32-bit entry points exist in the real driver too. */
CUresult cuMemAlloc(unsigned int *p, unsigned int n) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult cuMemGetInfo(unsigned int *f, unsigned int *t) { return CUDA_ERROR_NOT_SUPPORTED; }

/* cuGetProcAddress: the newest version suffix the driver has for a name
 * (and its per-thread-stream variant when asked), as a real driver maps
 * "cuMemAlloc" to cuMemAlloc_v2. */
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags, int *status);
#define E(n) {#n, (void *)&n},
static const struct {
	const char *name;
	void *fn;
} exports[] = {
	E(cuInit) E(cuDeviceGetCount) E(cuDeviceGet) E(cuDeviceGetUuid) E(cuDeviceGetUuid_v2) E(cuDeviceTotalMem_v2)
	E(cuDevicePrimaryCtxRetain) E(cuCtxCreate_v2) E(cuCtxSetCurrent) E(cuCtxGetCurrent) E(cuCtxGetDevice) E(cuCtxSynchronize)
	E(cuMemAlloc_v2) E(cuMemAllocManaged) E(cuMemAllocAsync) E(cuMemAllocAsync_ptsz) E(cuMemAllocFromPoolAsync)
	E(cuMemAllocFromPoolAsync_ptsz) E(cuMemAllocPitch_v2) E(cuMemFree_v2) E(cuMemFreeAsync) E(cuMemFreeAsync_ptsz)
	E(cuMemGetInfo_v2) E(cuArrayCreate_v2) E(cuArray3DCreate_v2) E(cuArrayDestroy) E(cuMipmappedArrayCreate)
	E(cuMipmappedArrayDestroy) E(cuMemCreate) E(cuMemRelease) E(cuStreamCreate) E(cuStreamDestroy_v2) E(cuStreamSynchronize)
	E(cuStreamBeginCapture_v2) E(cuStreamEndCapture) E(cuStreamIsCapturing) E(cuThreadExchangeStreamCaptureMode)
	E(cuEventCreate) E(cuEventDestroy_v2) E(cuEventRecord) E(cuEventQuery) E(cuEventSynchronize) E(cuEventElapsedTime)
	E(cuModuleLoadData) E(cuModuleGetFunction) E(cuLaunchKernel) E(cuLaunchKernel_ptsz) E(cuLaunchKernelEx)
	E(cuLaunchKernelEx_ptsz) E(cuLaunchCooperativeKernel) E(cuLaunchCooperativeKernel_ptsz) E(cuLaunch) E(cuLaunchGrid)
	E(cuLaunchGridAsync) E(cuGraphInstantiateWithFlags) E(cuGraphLaunch) E(cuGraphLaunch_ptsz) E(cuGraphExecDestroy)
	E(cuGraphDestroy) E(cuMemAlloc) E(cuMemGetInfo) E(cuGetProcAddress) E(cuGetProcAddress_v2) E(cuMemAlloc_v3)
};

static void *find(const char *name)
{
	for (size_t i = 0; i < sizeof(exports) / sizeof(exports[0]); i++)
		if (strcmp(exports[i].name, name) == 0)
			return exports[i].fn;
	return NULL;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags, int *status)
{
	char name[128];
	void *f = NULL;
	if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
		snprintf(name, sizeof(name), "%s_ptsz", symbol);
		f = find(name);
	}
	if (!f && !strchr(symbol, '_') && version >= 13050) {
		snprintf(name, sizeof(name), "%s_v3", symbol);
		f = find(name);
	}
	if (!f && !strchr(symbol, '_') && strcmp(symbol, "cuGetProcAddress") != 0) {
		snprintf(name, sizeof(name), "%s_v2", symbol);
		f = find(name);
	}
	if (!f && strcmp(symbol, "cuGetProcAddress") == 0)
		f = find("cuGetProcAddress_v2");
	if (!f)
		f = find(symbol);
	*pfn = f;
	if (status)
		*status = f ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	return f ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) { return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL); }
