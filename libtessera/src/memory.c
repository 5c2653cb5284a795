/*
 * Device memory: every allocation path counted against the grant, every
 * free credited with exactly what its allocation counted, and the memory
 * queries answered with the grant.
 *
 * The size of each live allocation is kept in a per-process table keyed by
 * what frees it (device pointer, array, mipmapped array, VMM handle), in
 * buckets with their own spin locks: threads freeing different pointers
 * rarely meet.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>

#include "libtessera.h"

enum kind { KIND_PTR = 1, KIND_ARRAY, KIND_MIPMAP, KIND_VMM };

struct entry {
	uint64_t key;
	int kind;
	int g;
	int64_t bytes;
	struct entry *next;
};

#define NBUCKET 4096
static struct bucket {
	_Atomic int lock;
	struct entry *head;
} table[NBUCKET];

static struct bucket *bucket_of(int kind, uint64_t key)
{
	uint64_t h = (key ^ (uint64_t)kind * 0x9e3779b97f4a7c15ULL) * 0xff51afd7ed558ccdULL;
	return &table[(h >> 40) % NBUCKET];
}

static void lock(struct bucket *b)
{
	int expect = 0;
	while (!atomic_compare_exchange_weak_explicit(&b->lock, &expect, 1, memory_order_acquire, memory_order_relaxed)) {
		expect = 0;
		sched_yield();
	}
}

static void unlock(struct bucket *b) { atomic_store_explicit(&b->lock, 0, memory_order_release); }

static void track(int kind, uint64_t key, int g, int64_t bytes)
{
	struct entry *e = malloc(sizeof(*e));
	if (!e)
		return; /* counted, never credited: held too tight, not too loose */
	*e = (struct entry){.key = key, .kind = kind, .g = g, .bytes = bytes};
	struct bucket *b = bucket_of(kind, key);
	lock(b);
	e->next = b->head;
	b->head = e;
	unlock(b);
}

/* untrack removes key's entry: 1 and its GPU and size when there was one. */
static int untrack(int kind, uint64_t key, int *g, int64_t *bytes)
{
	struct bucket *b = bucket_of(kind, key);
	lock(b);
	for (struct entry **p = &b->head; *p; p = &(*p)->next) {
		struct entry *e = *p;
		if (e->key == key && e->kind == kind) {
			*p = e->next;
			unlock(b);
			*g = e->g;
			*bytes = e->bytes;
			free(e);
			return 1;
		}
	}
	unlock(b);
	return 0;
}

/* A forked child cannot free its parent's allocations (CUDA does not
 * survive fork): it starts with an empty table and a slot of its own. */
void tessera_forget_allocations(void)
{
	for (int i = 0; i < NBUCKET; i++) {
		struct entry *e = table[i].head;
		while (e) {
			struct entry *next = e->next;
			free(e);
			e = next;
		}
		table[i].head = NULL;
		atomic_store(&table[i].lock, 0);
	}
}

static void in_child(void)
{
	tessera_forked();
	tessera_forget_allocations();
	tessera_forget_launches();
}

__attribute__((constructor)) static void at_load(void) { pthread_atfork(NULL, NULL, in_child); }

/* DEVICE declares g, the limit index allocations go to now: the current
 * context's GPU. Without a context the call (real with the arguments
 * given) goes to the driver, which refuses it; without a grant (or
 * limits) it is refused here. */
#define DEVICE(g, ...)                        \
	int g = tessera_current_index();      \
	if (g == TESSERA_NO_CONTEXT)          \
		return real(__VA_ARGS__);     \
	if (g < 0)                            \
		return CUDA_ERROR_OUT_OF_MEMORY

static CUresult counted(int kind, int g, int64_t bytes, CUresult r, uint64_t key)
{
	if (r != CUDA_SUCCESS)
		tessera_credit(g, bytes);
	else
		track(kind, key, g, bytes);
	return r;
}

#define ALLOC(kind, g, bytes, call, key)                     \
	do {                                                 \
		if (tessera_reserve(g, (int64_t)(bytes)) != 0) \
			return CUDA_ERROR_OUT_OF_MEMORY;     \
		CUresult r_ = (call);                        \
		return counted(kind, g, (int64_t)(bytes), r_, r_ == CUDA_SUCCESS ? (uint64_t)(key) : 0); \
	} while (0)

/* POINTER_ALLOC defines the wrapper of an allocation that returns a device
 * pointer in *dptr, of size bytes, on the current context's GPU. */
#define POINTER_ALLOC(name, params, ...)                             \
	CUresult name params                                         \
	{                                                            \
		GET_REAL(name, CUDA_ERROR_NOT_FOUND);                \
		DEVICE(g, __VA_ARGS__);                              \
		ALLOC(KIND_PTR, g, size, real(__VA_ARGS__), *dptr);  \
	}

POINTER_ALLOC(cuMemAlloc_v2, (CUdeviceptr * dptr, size_t size), dptr, size)
POINTER_ALLOC(cuMemAllocManaged, (CUdeviceptr * dptr, size_t size, unsigned int flags), dptr, size, flags)
POINTER_ALLOC(cuMemAllocAsync, (CUdeviceptr * dptr, size_t size, CUstream stream), dptr, size, stream)
POINTER_ALLOC(cuMemAllocAsync_ptsz, (CUdeviceptr * dptr, size_t size, CUstream stream), dptr, size, stream)
POINTER_ALLOC(cuMemAllocFromPoolAsync, (CUdeviceptr * dptr, size_t size, CUmemoryPool pool, CUstream stream), dptr, size, pool, stream)
POINTER_ALLOC(cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr * dptr, size_t size, CUmemoryPool pool, CUstream stream), dptr, size, pool, stream)

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned int elem)
{
	GET_REAL(cuMemAllocPitch_v2, CUDA_ERROR_NOT_FOUND);
	DEVICE(g, dptr, pitch, width, height, elem);
	/* The pitch is known only after the call: count the rows' bytes
	 * first, then what padding adds, and give it back if that is past
	 * the grant. */
	int64_t least;
	if (__builtin_mul_overflow((int64_t)width, (int64_t)height, &least) || tessera_reserve(g, least) != 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult r = real(dptr, pitch, width, height, elem);
	if (r != CUDA_SUCCESS) {
		tessera_credit(g, least);
		return r;
	}
	int64_t bytes;
	if (__builtin_mul_overflow((int64_t)*pitch, (int64_t)height, &bytes))
		bytes = INT64_MAX;
	if (bytes > least && tessera_reserve(g, bytes - least) != 0) {
		tessera_credit(g, least);
		if (REAL(cuMemFree_v2))
			REAL(cuMemFree_v2)(*dptr);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	track(KIND_PTR, *dptr, g, bytes > least ? bytes : least);
	return r;
}

/* freed: the driver's free of key, crediting what its allocation counted. */
#define FREE(kind, key, call)                                    \
	do {                                                     \
		int g_;                                          \
		int64_t b_;                                      \
		int had_ = untrack(kind, (uint64_t)(key), &g_, &b_); \
		CUresult r_ = (call);                            \
		if (had_ && r_ == CUDA_SUCCESS)                  \
			tessera_credit(g_, b_);                  \
		else if (had_)                                   \
			track(kind, (uint64_t)(key), g_, b_);    \
		return r_;                                       \
	} while (0)

CUresult cuMemFree_v2(CUdeviceptr p)
{
	GET_REAL(cuMemFree_v2, CUDA_ERROR_NOT_FOUND);
	FREE(KIND_PTR, p, real(p));
}

CUresult cuMemFreeAsync(CUdeviceptr p, CUstream stream)
{
	GET_REAL(cuMemFreeAsync, CUDA_ERROR_NOT_FOUND);
	FREE(KIND_PTR, p, real(p, stream));
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream stream)
{
	GET_REAL(cuMemFreeAsync_ptsz, CUDA_ERROR_NOT_FOUND);
	FREE(KIND_PTR, p, real(p, stream));
}

/* format_bytes is one channel's size; formats not listed count 16 bytes,
 * more than any format has (held too tight, never too loose). */
static int64_t format_bytes(CUarray_format f)
{
	switch (f) {
	case CU_AD_FORMAT_UNSIGNED_INT8:
	case CU_AD_FORMAT_SIGNED_INT8:
		return 1;
	case CU_AD_FORMAT_UNSIGNED_INT16:
	case CU_AD_FORMAT_SIGNED_INT16:
	case CU_AD_FORMAT_HALF:
		return 2;
	case CU_AD_FORMAT_UNSIGNED_INT32:
	case CU_AD_FORMAT_SIGNED_INT32:
	case CU_AD_FORMAT_FLOAT:
		return 4;
	}
	return 16;
}

static int64_t dim(size_t d) { return d ? (int64_t)d : 1; }

/* Mipmap levels halve width, height and depth; layered and cube map
 * arrays (flags 0x1, 0x4) keep their depth, which counts layers. */
static int64_t array_bytes(const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels)
{
	int64_t elem = format_bytes(d->Format) * (int64_t)(d->NumChannels ? d->NumChannels : 1);
	int keep_depth = (d->Flags & 0x5) != 0;
	int64_t total = 0;
	for (unsigned l = 0; l < (levels ? levels : 1) && l < 32; l++) {
		int64_t w = dim(d->Width) >> l, h = dim(d->Height) >> l, z = keep_depth ? dim(d->Depth) : dim(d->Depth) >> l;
		int64_t level;
		/* Dimensions no GPU has overflow: counted as past any grant. */
		if (__builtin_mul_overflow(elem, w ? w : 1, &level) || __builtin_mul_overflow(level, h ? h : 1, &level) ||
		    __builtin_mul_overflow(level, z ? z : 1, &level) || __builtin_add_overflow(total, level, &total))
			return INT64_MAX;
	}
	return total;
}

CUresult cuArrayCreate_v2(CUarray *handle, const CUDA_ARRAY_DESCRIPTOR *desc)
{
	GET_REAL(cuArrayCreate_v2, CUDA_ERROR_NOT_FOUND);
	DEVICE(g, handle, desc);
	if (!desc || !handle)
		return real(handle, desc);
	CUDA_ARRAY3D_DESCRIPTOR d3 = {desc->Width, desc->Height, 0, desc->Format, desc->NumChannels, 0};
	ALLOC(KIND_ARRAY, g, array_bytes(&d3, 1), real(handle, desc), *handle);
}

CUresult cuArray3DCreate_v2(CUarray *handle, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
	GET_REAL(cuArray3DCreate_v2, CUDA_ERROR_NOT_FOUND);
	DEVICE(g, handle, desc);
	if (!desc || !handle)
		return real(handle, desc);
	ALLOC(KIND_ARRAY, g, array_bytes(desc, 1), real(handle, desc), *handle);
}

CUresult cuArrayDestroy(CUarray handle)
{
	GET_REAL(cuArrayDestroy, CUDA_ERROR_NOT_FOUND);
	FREE(KIND_ARRAY, (uintptr_t)handle, real(handle));
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray *handle, const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned int levels)
{
	GET_REAL(cuMipmappedArrayCreate, CUDA_ERROR_NOT_FOUND);
	DEVICE(g, handle, desc, levels);
	if (!desc || !handle)
		return real(handle, desc, levels);
	ALLOC(KIND_MIPMAP, g, array_bytes(desc, levels), real(handle, desc, levels), *handle);
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray handle)
{
	GET_REAL(cuMipmappedArrayDestroy, CUDA_ERROR_NOT_FOUND);
	FREE(KIND_MIPMAP, (uintptr_t)handle, real(handle));
}

/* The virtual memory management API: physical memory is made by
 * cuMemCreate on the device its properties name, whatever the current
 * context, and freed by cuMemRelease. */
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop, unsigned long long flags)
{
	GET_REAL(cuMemCreate, CUDA_ERROR_NOT_FOUND);
	if (!prop || !handle || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return real(handle, size, prop, flags); /* host memory: not the grant's */
	int g = tessera_device_index(prop->location.id);
	if (g < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	ALLOC(KIND_VMM, g, size, real(handle, size, prop, flags), *handle);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	GET_REAL(cuMemRelease, CUDA_ERROR_NOT_FOUND);
	FREE(KIND_VMM, handle, real(handle));
}

/* The grant is the total; free is what the grant leaves, or less where
 * the GPU itself has less. */
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
	GET_REAL(cuMemGetInfo_v2, CUDA_ERROR_NOT_FOUND);
	CUresult r = real(free_bytes, total);
	if (r != CUDA_SUCCESS || !free_bytes || !total)
		return r;
	struct tessera_state *st = tessera_state_get();
	int g = tessera_current_index();
	if (!st->ready || g < 0) {
		*free_bytes = *total = 0;
		return r;
	}
	tessera_reclaim_dead(); /* what ended processes held is free */
	int64_t limit = st->limits.gpu[g].memory;
	int64_t left = limit - atomic_load(&st->region->gpu[g].used);
	if (left < 0)
		left = 0;
	if ((int64_t)*free_bytes > left)
		*free_bytes = (size_t)left;
	*total = (size_t)limit;
	return r;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	GET_REAL(cuDeviceTotalMem_v2, CUDA_ERROR_NOT_FOUND);
	CUresult r = real(bytes, dev);
	if (r != CUDA_SUCCESS || !bytes)
		return r;
	struct tessera_state *st = tessera_state_get();
	int g = tessera_device_index(dev);
	*bytes = st->ready && g >= 0 ? (size_t)st->limits.gpu[g].memory : 0;
	return r;
}
