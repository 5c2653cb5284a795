/*
 * Finding the driver's entry points, and handing out the library's own.
 *
 * A program reaches a driver function three ways: linked against
 * libcuda.so.1 (the preloaded library's definition comes first), through
 * dlsym on the driver's handle (cudart and NVML users do), and through
 * cuGetProcAddress (CUDA 12+ runtimes get every entry point that way, each
 * version suffix and per-thread-stream variant chosen by the driver). The
 * last two are answered by the driver with its own pointer; the library
 * swaps each pointer it knows for its wrapper, by identity, so whatever
 * name or version the caller asked for, the variant the driver chose is
 * the one wrapped.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "libtessera.h"

/*
 * dlopen and dlvsym moved into the C library in glibc 2.34, and a build
 * there binds them to their 2.34 versions, which an older glibc in a
 * tenant's image lacks: the loader would refuse to preload the library.
 * Bound to their first versions, they come from libdl on an older glibc
 * and from the C library's compatibility symbols on a newer one.
 */
#if defined(__x86_64__)
__asm__(".symver dlopen,dlopen@GLIBC_2.2.5");
__asm__(".symver dlvsym,dlvsym@GLIBC_2.2.5");
#elif defined(__aarch64__)
__asm__(".symver dlopen,dlopen@GLIBC_2.17");
__asm__(".symver dlvsym,dlvsym@GLIBC_2.17");
#endif

enum { LIB_CUDA, LIB_NVML };

struct sym {
	const char *name;
	int lib;
	void *wrapper; /* NULL: called only */
};

/* The refused legacy entry points: 32-bit pointers and the deprecated
 * multi-device launch, which the library cannot count. */
#define CU_WRAP(n)
#define CU_HELP(n)
#define NVML_WRAP(n)
#define NVML_HELP(n)
#define CU_REFUSE(n)                                                                                   \
	CUresult n(void);                                                                              \
	CUresult n(void)                                                                               \
	{                                                                                              \
		tessera_complain(#n " is a legacy entry point libtessera cannot count: it is refused"); \
		return CUDA_ERROR_NOT_SUPPORTED;                                                       \
	}
#include "symbols.def"
#undef CU_WRAP
#undef CU_HELP
#undef NVML_WRAP
#undef NVML_HELP
#undef CU_REFUSE

static const struct sym syms[TS_COUNT] = {
#define CU_WRAP(n) [TS_##n] = {#n, LIB_CUDA, (void *)&n},
#define CU_REFUSE(n) [TS_##n] = {#n, LIB_CUDA, (void *)&n},
#define CU_HELP(n) [TS_##n] = {#n, LIB_CUDA, NULL},
#define NVML_WRAP(n) [TS_##n] = {#n, LIB_NVML, (void *)&n},
#define NVML_HELP(n) [TS_##n] = {#n, LIB_NVML, NULL},
#include "symbols.def"
#undef CU_WRAP
#undef CU_HELP
#undef NVML_WRAP
#undef NVML_HELP
#undef CU_REFUSE
};

static void *real_fn[TS_COUNT];
static _Atomic int resolved[2];
static _Atomic int resolving;

typedef void *(*dlsym_fn)(void *, const char *);

/*
 * dlsym runs before anything else in a process: sanitizer runtimes call it
 * while they start, before they can follow instrumented code. So the two
 * functions below are never instrumented, and the RTLD_NEXT path is a tail
 * call whatever the build's optimization: glibc finds "next" from its
 * caller's address, which must be the program's, not this library's.
 */
#define UNINSTRUMENTED __attribute__((no_sanitize_address, no_sanitize_thread, no_sanitize_undefined, optimize("O2", "optimize-sibling-calls")))

/* The C library's dlsym, past this library's. */
UNINSTRUMENTED static dlsym_fn real_dlsym(void)
{
	static dlsym_fn fn;
	dlsym_fn f = __atomic_load_n(&fn, __ATOMIC_ACQUIRE);
	if (f)
		return f;
	static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", NULL};
	for (int i = 0; !f && versions[i]; i++)
		f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
	__atomic_store_n(&fn, f, __ATOMIC_RELEASE);
	return f;
}

/* resolve finds the driver's entry points in its library: already loaded
 * only (load: 0), or loading it (load: 1, when a wrapper is called — the
 * program calls the driver, so it needs it). */
static void resolve(int lib, int load)
{
	if (atomic_load_explicit(&resolved[lib], memory_order_acquire))
		return;
	int expect = 0;
	while (!atomic_compare_exchange_weak(&resolving, &expect, 1)) {
		expect = 0;
		sched_yield();
	}
	if (!atomic_load(&resolved[lib])) {
		const char *so = lib == LIB_CUDA ? "libcuda.so.1" : "libnvidia-ml.so.1";
		void *h = dlopen(so, RTLD_NOW | RTLD_NOLOAD);
		if (!h && load)
			h = dlopen(so, RTLD_NOW);
		if (h) {
			for (int i = 0; i < TS_COUNT; i++)
				if (syms[i].lib == lib)
					real_fn[i] = real_dlsym()(h, syms[i].name);
			atomic_store_explicit(&resolved[lib], 1, memory_order_release);
		}
	}
	atomic_store(&resolving, 0);
}

void tessera_forked_symbols(void) { atomic_store(&resolving, 0); }

void *tessera_real(enum tessera_sym s)
{
	resolve(syms[s].lib, 1);
	return real_fn[s];
}

/* base_len is the length of a name without its version and stream
 * suffixes: cuMemAlloc for cuMemAlloc_v2, cuLaunchKernel for
 * cuLaunchKernel_ptsz. */
static size_t base_len(const char *name)
{
	size_t n = strlen(name);
	for (;;) {
		if (n > 5 && (memcmp(name + n - 5, "_ptsz", 5) == 0 || memcmp(name + n - 5, "_ptds", 5) == 0)) {
			n -= 5;
			continue;
		}
		size_t k = n;
		while (k > 0 && name[k - 1] >= '0' && name[k - 1] <= '9')
			k--;
		if (k < n && k >= 2 && name[k - 1] == 'v' && name[k - 2] == '_') {
			n = k - 2;
			continue;
		}
		return n;
	}
}

/* guarded says name is of a family the library wraps (any version of
 * cuMemAlloc, of cuLaunchKernel…). */
static int guarded(int lib, const char *name)
{
	size_t n = base_len(name);
	for (int i = 0; i < TS_COUNT; i++)
		if (syms[i].lib == lib && syms[i].wrapper && base_len(syms[i].name) == n && strncmp(syms[i].name, name, n) == 0)
			return 1;
	return 0;
}

/* wrap is the library's wrapper of the driver's pointer p for name. A
 * pointer the library does not know, of a family it wraps, is a version
 * newer than the library: handing it out would go around the limits, so
 * it is refused (NULL), and the library says so. It never loads a
 * library: a pointer of the driver's comes from a loaded one. */
static void *wrap(int lib, const char *name, void *p)
{
	if (!p)
		return p;
	resolve(lib, 0);
	for (int i = 0; i < TS_COUNT; i++)
		if (syms[i].lib == lib && syms[i].wrapper && (real_fn[i] == p || syms[i].wrapper == p))
			return syms[i].wrapper;
	if (name && guarded(lib, name)) {
		char why[300];
		snprintf(why, sizeof(why), "the driver's %.80s is a version this library does not know: refused, so that it cannot go around the slice's limits (update libtessera)", name);
		tessera_complain(why);
		return NULL;
	}
	return p;
}

UNINSTRUMENTED void *dlsym(void *handle, const char *name)
{
	dlsym_fn rd = real_dlsym();
	if (handle == RTLD_NEXT)
		return rd(handle, name); /* a tail call: see above */
	void *p = rd(handle, name);
	int cuda = name[0] == 'c' && name[1] == 'u';
	int nvml = name[0] == 'n' && name[1] == 'v' && name[2] == 'm' && name[3] == 'l';
	if (!p || (!cuda && !nvml))
		return p; /* not the driver's: no instrumented code on this path */
	return wrap(cuda ? LIB_CUDA : LIB_NVML, name, p);
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
	CUresult r = REAL(cuGetProcAddress)(symbol, pfn, version, flags);
	if (r == CUDA_SUCCESS && pfn && !(*pfn = wrap(LIB_CUDA, symbol, *pfn)))
		return CUDA_ERROR_NOT_FOUND;
	return r;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags, int *status)
{
	CUresult r = REAL(cuGetProcAddress_v2)(symbol, pfn, version, flags, status);
	if (r == CUDA_SUCCESS && pfn && !(*pfn = wrap(LIB_CUDA, symbol, *pfn))) {
		if (status)
			*status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
		return CUDA_ERROR_NOT_FOUND;
	}
	return r;
}
