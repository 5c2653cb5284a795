/* The library works in a forked child: the child counts its own memory
 * against the same grant, and what it did not free comes back when it
 * exits or is killed. */
#include "check.h"

static size_t free_now(void)
{
	size_t f, t;
	CU(cuMemGetInfo_v2(&f, &t));
	return f;
}

/* child allocates mib in a fresh context, then exits (or waits to be
 * killed) without freeing. */
static pid_t child(int mib, int linger, int want_ok)
{
	pid_t pid = fork();
	if (pid == 0) {
		on_device(0);
		CUdeviceptr p;
		CUresult r = cuMemAlloc_v2(&p, (size_t)mib * MiB);
		if ((r == CUDA_SUCCESS) != want_ok) {
			fprintf(stderr, "child: cuMemAlloc(%d MiB) = %d\n", mib, r);
			_exit(1);
		}
		if (linger)
			pause();
		_exit(0);
	}
	return pid;
}

static int wait_ok(pid_t pid)
{
	int status;
	waitpid(pid, &status, 0);
	return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int main(void)
{
	write_limits(NULL, GPU0 " 1073741824 100\n");
	on_device(0);
	CUdeviceptr p;
	CU(cuMemAlloc_v2(&p, 512 * MiB));
	CHECK(wait_ok(child(400, 0, 1)), "a child could not allocate 400 MiB beside the parent's 512");
	CHECK(free_now() == (size_t)(512 * MiB), "free %zu after the child exited without freeing: want its 400 MiB back", free_now());
	CHECK(wait_ok(child(600, 0, 0)), "a child allocated 600 MiB of the 512 MiB the parent left");

	/* A killed child's share comes back on the next allocation that
	 * needs it. */
	pid_t k = child(500, 1, 1);
	for (int i = 0; i < 200 && free_now() != (size_t)(12 * MiB); i++)
		usleep(10000);
	CHECK(free_now() == (size_t)(12 * MiB), "free %zu while the child holds 500 MiB", free_now());
	kill(k, SIGKILL);
	waitpid(k, NULL, 0);
	CUdeviceptr q;
	CU(cuMemAlloc_v2(&q, 500 * MiB));
	CHECK(free_now() == (size_t)(12 * MiB), "free %zu after taking the killed child's 500 MiB", free_now());
	CU(cuMemFree_v2(q));
	CU(cuMemFree_v2(p));
	CHECK(free_now() == (size_t)GiB, "free %zu at the end", free_now());
	return done("fork: a child's own count, returned when it exits or is killed");
}
