/*
 * The container's limits and its shared usage region.
 *
 * The agent writes the limits (read-only inside the container) and creates
 * the region's directory; every process of the container maps the region.
 * Memory is counted twice there: per GPU (what the grant is checked
 * against) and per process slot (so the share of a process that ended
 * without freeing can be returned, and NVML's per-process lists can be
 * answered). Both are updated with atomics: no lock is held across
 * processes, so a process killed at any instant leaves nothing locked.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "libtessera.h"

static struct tessera_state state;
static _Atomic int state_pid;   /* the pid state was loaded in */
static _Atomic int state_spin;  /* 0 free, 1 loading */
static _Atomic int my_slot = -1;
static _Atomic int slot_pid;    /* the pid my_slot was claimed by */

/* The process's pid, cached: getpid is a system call on every glibc
 * since 2.25, and the allocation path asks for it. A forked child sets
 * its own (tessera_forked). */
static _Atomic int cached_pid;

int tessera_pid(void)
{
	int pid = atomic_load_explicit(&cached_pid, memory_order_relaxed);
	if (pid == 0) {
		pid = getpid();
		atomic_store_explicit(&cached_pid, pid, memory_order_relaxed);
	}
	return pid;
}

static _Atomic int slot_spin;

/* tessera_forked runs in a forked child: its pid, and the spin locks a
 * thread of the parent may have held at the fork (only the forking
 * thread lives on in the child, so nobody would release them). */
void tessera_forked(void)
{
	atomic_store(&cached_pid, getpid());
	atomic_store(&state_spin, 0);
	atomic_store(&slot_spin, 0);
	tessera_forked_symbols();
}

int64_t tessera_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void tessera_complain(const char *what)
{
	static _Atomic int said;
	if (atomic_exchange(&said, 1))
		return;
	fprintf(stderr, "libtessera: %s\n", what);
}

int tessera_parse_limits(const char *text, struct tessera_limits *out, char *why, size_t whylen)
{
	memset(out, 0, sizeof(*out));
	int lineno = 0;
	const char *p = text;
	while (*p) {
		const char *eol = strchr(p, '\n');
		size_t len = eol ? (size_t)(eol - p) : strlen(p);
		char line[256];
		lineno++;
		if (len >= sizeof(line)) {
			snprintf(why, whylen, "limits line %d: longer than %zu bytes", lineno, sizeof(line) - 1);
			return -1;
		}
		memcpy(line, p, len);
		line[len] = 0;
		p += len + (eol ? 1 : 0);
		char *s = line;
		while (*s == ' ' || *s == '\t')
			s++;
		if (*s == 0 || *s == '#')
			continue;
		char uuid[128], mode[8], extra[8];
		long long mem;
		int cores;
		int n = sscanf(s, "%127s %lld %d %7s %7s", uuid, &mem, &cores, mode, extra);
		if ((n != 3 && n != 4) || (n == 4 && strcmp(mode, "mps") != 0)) {
			snprintf(why, whylen, "limits line %d: want \"<GPU UUID> <memory bytes> <cores percent> [mps]\"", lineno);
			return -1;
		}
		if (strncmp(uuid, "GPU-", 4) != 0 || strlen(uuid) >= sizeof(out->gpu[0].uuid)) {
			snprintf(why, whylen, "limits line %d: %.80s is not a GPU UUID (GPU-…)", lineno, uuid);
			return -1;
		}
		if (mem <= 0 || cores < 1 || cores > 100) {
			snprintf(why, whylen, "limits line %d: memory must be > 0 bytes and cores 1-100 (got %lld, %d)", lineno, mem, cores);
			return -1;
		}
		for (int i = 0; i < out->n; i++)
			if (strcmp(out->gpu[i].uuid, uuid) == 0) {
				snprintf(why, whylen, "limits line %d: GPU %s listed twice", lineno, uuid);
				return -1;
			}
		if (out->n == TESSERA_MAX_GPUS) {
			snprintf(why, whylen, "limits: more than %d GPUs", TESSERA_MAX_GPUS);
			return -1;
		}
		struct tessera_limit *l = &out->gpu[out->n++];
		strcpy(l->uuid, uuid);
		l->memory = mem;
		l->cores = cores;
		l->mps = n == 4;
	}
	if (out->n == 0) {
		snprintf(why, whylen, "limits: no GPU listed");
		return -1;
	}
	return 0;
}

static void paths(char *limits, char *region, size_t len)
{
#ifdef TESSERA_TEST_PATHS
	const char *dir = getenv("TESSERA_TEST_DIR");
	if (dir) {
		snprintf(limits, len, "%s/limits", dir);
		snprintf(region, len, "%s/usage", dir);
		return;
	}
#endif
	snprintf(limits, len, "%s", TESSERA_LIMITS_PATH);
	snprintf(region, len, "%s", TESSERA_REGION_PATH);
}

static int load(struct tessera_state *st)
{
	char lpath[256], rpath[256];
	paths(lpath, rpath, sizeof(lpath));
	int fd = open(lpath, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		snprintf(st->why, sizeof(st->why), "cannot read the slice's limits %s (%s): GPU memory allocations are refused; the node's agent writes it when it starts the container", lpath, strerror(errno));
		return -1;
	}
	char text[8192];
	ssize_t n = read(fd, text, sizeof(text) - 1);
	close(fd);
	if (n < 0 || n == (ssize_t)sizeof(text) - 1) {
		snprintf(st->why, sizeof(st->why), "cannot read the slice's limits %s: %s", lpath, n < 0 ? strerror(errno) : "too long");
		return -1;
	}
	text[n] = 0;
	char why[200];
	if (tessera_parse_limits(text, &st->limits, why, sizeof(why)) != 0) {
		snprintf(st->why, sizeof(st->why), "%s in %s: GPU memory allocations are refused", why, lpath);
		return -1;
	}
	fd = open(rpath, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
	if (fd < 0) {
		snprintf(st->why, sizeof(st->why), "cannot open the container's usage region %s (%s): GPU memory allocations are refused", rpath, strerror(errno));
		return -1;
	}
	/* lseek, not fstat: fstat is a symbol of glibc 2.33 and later. */
	off_t size = lseek(fd, 0, SEEK_END);
	if (size < (off_t)sizeof(struct tessera_region) && ftruncate(fd, sizeof(struct tessera_region)) != 0) {
		snprintf(st->why, sizeof(st->why), "cannot size the usage region %s (%s)", rpath, strerror(errno));
		close(fd);
		return -1;
	}
	void *m = mmap(NULL, sizeof(struct tessera_region), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED) {
		snprintf(st->why, sizeof(st->why), "cannot map the usage region %s (%s)", rpath, strerror(errno));
		return -1;
	}
	struct tessera_region *r = m;
	uint64_t zero = 0;
	if (!atomic_compare_exchange_strong(&r->magic, &zero, TESSERA_REGION_MAGIC) && zero != TESSERA_REGION_MAGIC) {
		snprintf(st->why, sizeof(st->why), "the usage region %s is not libtessera's (another version?)", rpath);
		munmap(m, sizeof(struct tessera_region));
		return -1;
	}
	st->region = r;
	return 0;
}

struct tessera_state *tessera_state_get(void)
{
	int pid = tessera_pid();
	if (atomic_load_explicit(&state_pid, memory_order_acquire) == pid)
		return &state;
	/* First call in this process (or a forked child: the mapping and the
	 * limits are inherited, only the pid changes). */
	int expect = 0;
	while (!atomic_compare_exchange_weak(&state_spin, &expect, 1)) {
		expect = 0;
		sched_yield();
	}
	if (atomic_load(&state_pid) != pid) {
		if (state.region == NULL && !state.ready) {
			state.ready = load(&state) == 0;
			if (!state.ready)
				tessera_complain(state.why);
		}
		atomic_store_explicit(&state_pid, pid, memory_order_release);
	}
	atomic_store(&state_spin, 0);
	return &state;
}

int tessera_pid_start(pid_t pid, uint64_t *start)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = 0;
	/* Field 22 (starttime); the command (field 2) may hold spaces and
	 * parentheses, so count from its closing parenthesis. */
	char *s = strrchr(buf, ')');
	if (!s)
		return -1;
	if (s[1] == ' ' && s[2] == 'Z')
		return -1; /* a zombie: its GPU memory went with its files */
	int field = 2;
	for (; *s && field < 22; s++)
		if (*s == ' ')
			field++;
	*start = strtoull(s, NULL, 10);
	return 0;
}

/* alive: the slot's process still runs (same pid, same start time). */
static int alive(int32_t pid, uint64_t start)
{
	uint64_t now;
	if (tessera_pid_start(pid, &now) != 0)
		return 0;
	return start == 0 || now == start;
}

int tessera_reclaim_dead(void)
{
	struct tessera_state *st = tessera_state_get();
	if (!st->ready)
		return 0;
	int freed = 0;
	for (int i = 0; i < TESSERA_MAX_PROCS; i++) {
		struct tessera_region_slot *s = &st->region->slot[i];
		int32_t pid = atomic_load(&s->pid);
		if (pid <= 0 || alive(pid, atomic_load(&s->start)))
			continue;
		/* Whoever swaps the pid out returns the counts, once. */
		if (!atomic_compare_exchange_strong(&s->pid, &pid, -1))
			continue;
		for (int g = 0; g < TESSERA_MAX_GPUS; g++) {
			int64_t b = atomic_exchange(&s->used[g], 0);
			if (b)
				atomic_fetch_sub(&st->region->gpu[g].used, b);
		}
		atomic_store(&s->start, 0);
		atomic_store(&s->pid, 0);
		freed++;
	}
	return freed;
}

int tessera_slot(void)
{
	int pid = tessera_pid();
	if (atomic_load_explicit(&slot_pid, memory_order_acquire) == pid)
		return atomic_load(&my_slot);
	struct tessera_state *st = tessera_state_get();
	if (!st->ready)
		return -1;
	int expect = 0;
	while (!atomic_compare_exchange_weak(&slot_spin, &expect, 1)) {
		expect = 0;
		sched_yield();
	}
	int got = -1;
	if (atomic_load(&slot_pid) == pid) {
		got = atomic_load(&my_slot);
		goto out;
	}
	uint64_t start = 0;
	tessera_pid_start(pid, &start);
	for (int pass = 0; pass < 2 && got < 0; pass++) {
		for (int i = 0; i < TESSERA_MAX_PROCS; i++) {
			struct tessera_region_slot *sl = &st->region->slot[i];
			int32_t zero = 0;
			if (atomic_load(&sl->pid) != 0 || !atomic_compare_exchange_strong(&sl->pid, &zero, pid))
				continue;
			atomic_store(&sl->start, start);
			got = i;
			break;
		}
		if (got < 0)
			tessera_reclaim_dead();
	}
	if (got < 0) {
		tessera_complain("no free process slot in the usage region: GPU memory allocations are refused");
		goto out;
	}
	atomic_store(&my_slot, got);
	atomic_store_explicit(&slot_pid, pid, memory_order_release);
out:
	atomic_store(&slot_spin, 0);
	return got;
}

int tessera_reserve(int g, int64_t bytes)
{
	struct tessera_state *st = tessera_state_get();
	if (!st->ready || g < 0 || g >= st->limits.n || bytes < 0)
		return -1; /* a size past 2^63 (negative here) would raise the count's room */
	int s = tessera_slot();
	if (s < 0)
		return -1;
	_Atomic int64_t *used = &st->region->gpu[g].used;
	int64_t limit = st->limits.gpu[g].memory;
	for (int reclaimed = 0;;) {
		int64_t cur = atomic_load(used);
		if (bytes > limit - cur) {
			if (!reclaimed++ && tessera_reclaim_dead() > 0)
				continue;
			return -1;
		}
		if (atomic_compare_exchange_weak(used, &cur, cur + bytes))
			break;
	}
	/* GPU first, slot second: a process killed in between leaves bytes
	 * counted that nobody returns — too much held, never too little. */
	atomic_fetch_add(&st->region->slot[s].used[g], bytes);
	return 0;
}

void tessera_credit(int g, int64_t bytes)
{
	struct tessera_state *st = tessera_state_get();
	if (!st->ready || g < 0 || g >= st->limits.n)
		return;
	int s = tessera_slot();
	if (s >= 0)
		atomic_fetch_sub(&st->region->slot[s].used[g], bytes);
	atomic_fetch_sub(&st->region->gpu[g].used, bytes);
}

/* The process's counts go back when it exits: the driver frees its memory. */
__attribute__((destructor)) static void release_slot(void)
{
	int s = atomic_load(&my_slot);
	if (s < 0 || atomic_load(&slot_pid) != getpid() || !state.ready)
		return;
	struct tessera_region_slot *sl = &state.region->slot[s];
	int32_t pid = getpid();
	if (!atomic_compare_exchange_strong(&sl->pid, &pid, -1))
		return;
	for (int g = 0; g < TESSERA_MAX_GPUS; g++) {
		int64_t b = atomic_exchange(&sl->used[g], 0);
		if (b)
			atomic_fetch_sub(&state.region->gpu[g].used, b);
	}
	atomic_store(&sl->start, 0);
	atomic_store(&sl->pid, 0);
}

/* Device ordinal → limit index + 2, by UUID; 0: not looked up yet. */
static _Atomic int dev_index[TESSERA_MAX_DEVICES];

static void format_uuid(const CUuuid *u, char *out)
{
	const unsigned char *b = (const unsigned char *)u->bytes;
	sprintf(out, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static int index_of_uuid(const char *uuid)
{
	struct tessera_state *st = tessera_state_get();
	if (!st->ready)
		return -1;
	for (int i = 0; i < st->limits.n; i++)
		if (strcasecmp(st->limits.gpu[i].uuid, uuid) == 0)
			return i;
	return -1;
}

int tessera_device_index(CUdevice dev)
{
	if (dev < 0 || dev >= TESSERA_MAX_DEVICES)
		return -1;
	int i = atomic_load_explicit(&dev_index[dev], memory_order_relaxed);
	if (i != 0)
		return i - 2;
	CUuuid u;
	CUresult r = CUDA_ERROR_NOT_FOUND;
	if (tessera_real(TS_cuDeviceGetUuid_v2))
		r = REAL(cuDeviceGetUuid_v2)(&u, dev);
	else if (tessera_real(TS_cuDeviceGetUuid))
		r = REAL(cuDeviceGetUuid)(&u, dev);
	if (r != CUDA_SUCCESS)
		return -1;
	char s[64];
	format_uuid(&u, s);
	i = index_of_uuid(s);
	if (i < 0) {
		char why[200];
		snprintf(why, sizeof(why), "GPU %s has no grant in this container's limits: its allocations and launches are refused", s);
		tessera_complain(why);
	}
	atomic_store_explicit(&dev_index[dev], i + 2, memory_order_relaxed);
	return i;
}

int tessera_current_index(void)
{
	CUdevice dev;
	if (!REAL(cuCtxGetDevice) || REAL(cuCtxGetDevice)(&dev) != CUDA_SUCCESS)
		return TESSERA_NO_CONTEXT;
	return tessera_device_index(dev);
}

int tessera_nvml_index(nvmlDevice_t dev)
{
	char uuid[96];
	if (!tessera_real(TS_nvmlDeviceGetUUID) || REAL(nvmlDeviceGetUUID)(dev, uuid, sizeof(uuid)) != NVML_SUCCESS)
		return -1;
	return index_of_uuid(uuid);
}
