/*
 * libtessera's internals. The library is preloaded into the GPU
 * containers of slices that nothing stronger holds (see README.md): it
 * counts every device allocation against the container's grant per GPU and
 * throttles kernel launches to the container's share of SM time.
 */
#ifndef LIBTESSERA_H
#define LIBTESSERA_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "tessera_cuda.h"
#include "tessera_nvml.h"

#define TESSERA_MAX_GPUS 16
#define TESSERA_MAX_PROCS 1024
#define TESSERA_MAX_DEVICES 64

/*
 * Where the agent puts a container's limits (read-only) and its shared
 * usage region (read-write). Fixed at build time: no variable or file the
 * tenant controls moves them. Test builds (TESSERA_TEST_PATHS) read the
 * directory from TESSERA_TEST_DIR instead; the library the agent ships is
 * never built that way.
 */
#define TESSERA_LIMITS_PATH "/etc/tessera/limits"
#define TESSERA_REGION_PATH "/run/tessera/usage"

/* One GPU's grant, as the agent wrote it. */
struct tessera_limit {
	char uuid[64];
	int64_t memory; /* bytes */
	int cores;      /* percent of SM time, 1-100 */
	int mps;        /* an MPS client: MPS holds its compute, not the library */
};

struct tessera_limits {
	int n;
	struct tessera_limit gpu[TESSERA_MAX_GPUS];
};

/* Parses the limits file's text; on error returns -1 with why filled in. */
int tessera_parse_limits(const char *text, struct tessera_limits *out, char *why, size_t whylen);

/* The shared region: one per container, mapped by all its processes. */
struct tessera_region_gpu {
	_Atomic int64_t used; /* bytes counted against the grant */
	_Atomic int64_t tat;  /* compute: theoretical arrival time, ns (GCRA) */
	char pad[48];         /* one cache line per GPU */
};

struct tessera_region_slot {
	_Atomic int32_t pid; /* 0 free, -1 being reclaimed */
	int32_t pad;
	_Atomic uint64_t start; /* the process's start time (/proc/pid/stat), against pid reuse */
	_Atomic int64_t used[TESSERA_MAX_GPUS];
};

#define TESSERA_REGION_MAGIC 0x31617265737365ULL /* "essera1" */
struct tessera_region {
	_Atomic uint64_t magic;
	uint32_t version;
	uint32_t pad;
	struct tessera_region_gpu gpu[TESSERA_MAX_GPUS];
	struct tessera_region_slot slot[TESSERA_MAX_PROCS];
};

/* The process's view: limits, region, its slot. */
struct tessera_state {
	int ready; /* 1: limits and region in place; 0: fail closed */
	char why[1024];
	struct tessera_limits limits;
	struct tessera_region *region;
};

/* tessera_state_get loads limits and region once per process (and again in
 * a forked child's first call); never NULL. */
struct tessera_state *tessera_state_get(void);
/* tessera_slot is this process's slot, claimed on first use; -1 if none. */
int tessera_slot(void);
/* tessera_reserve counts bytes on GPU g against its grant; 0 when it fits. */
int tessera_reserve(int g, int64_t bytes);
/* tessera_credit returns bytes on GPU g. */
void tessera_credit(int g, int64_t bytes);
/* tessera_reclaim_dead returns the counts of processes that ended without
 * freeing; how many slots it freed. */
int tessera_reclaim_dead(void);
int tessera_pid_start(pid_t pid, uint64_t *start);

/* The limit index of a CUDA device, -1 if it has no grant. */
int tessera_device_index(CUdevice dev);
/* The limit index of the current context's device, -1 if none or no grant. */
int tessera_current_index(void);
/* The limit index of an NVML device, -1 if it has no grant. */
int tessera_nvml_index(nvmlDevice_t dev);

/* The real driver's entry points. */
enum tessera_sym {
#define TESSERA_SYM(name) TS_##name,
#include "symbols.def"
#undef TESSERA_SYM
	TS_COUNT
};
void *tessera_real(enum tessera_sym s);
#define REAL(name) ((__typeof__(&name))tessera_real(TS_##name))
/* GET_REAL declares real, the driver's name, or returns err without one. */
#define GET_REAL(name, err)                         \
	__typeof__(&name) real = REAL(name);        \
	if (!real)                                  \
		return err

/* tessera_current_index's answer when no context is current: the call is
 * passed to the driver, which refuses it. */
#define TESSERA_NO_CONTEXT (-3)

/* tessera_throttle is called before a launch on stream; it may sleep. It
 * returns a token for tessera_launched, which records the launch's cost. */
struct tessera_launch {
	int refused; /* no grant on this GPU, or no limits: the launch fails */
	int g;       /* limit index, -1: not throttled */
	uint64_t key;
	int64_t est; /* GPU ns charged in advance */
	int measured;
	CUcontext ctx;
	CUevent start, end;
};
void tessera_throttle(struct tessera_launch *l, uint64_t key, CUstream stream, int ptsz);
void tessera_launched(struct tessera_launch *l, CUstream stream, int ptsz, CUresult r);
/* tessera_forget_allocations empties the allocation table (a forked child). */
void tessera_forget_allocations(void);
void tessera_forget_launches(void);

/* Says once on stderr why the library refuses, and what to do. */
void tessera_complain(const char *what);

int64_t tessera_now_ns(void);
/* tessera_pid is getpid, cached; tessera_forked resets it in a child. */
int tessera_pid(void);
void tessera_forked(void);
void tessera_forked_symbols(void);

#endif
