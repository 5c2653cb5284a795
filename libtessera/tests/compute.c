/* The compute throttle holds a 30/70 split between two containers that
 * both want the whole GPU, whether they launch kernels, cooperative
 * kernels or CUDA graphs. Two child processes, each a container (its own
 * directory and limits), launch 2 ms kernels on the fake GPU for a few
 * seconds; the split is read from the fake device's own accounting.
 *
 *   compute <mode-a> <mode-b> [--control]
 * mode: plain, cooperative, graph, ex, threads (four threads, a stream
 * each, sharing the context). With --control the library is not
 * loaded and the test checks that the split is then NOT held (so the test
 * can fail).
 */
#include <pthread.h>

#include "check.h"
#include "../fake/fakestate.h"

#define SECONDS 3.0

static void launches(const char *mode);

static CUcontext shared_ctx;
static void *thread_launches(void *arg)
{
	cuCtxSetCurrent(shared_ctx);
	launches("plain");
	return NULL;
}

static void tenant(const char *mode)
{
	on_device(0);
	if (strcmp(mode, "threads") == 0) {
		pthread_t t[4];
		cuCtxGetCurrent(&shared_ctx);
		for (int i = 0; i < 4; i++)
			pthread_create(&t[i], NULL, thread_launches, NULL);
		for (int i = 0; i < 4; i++)
			pthread_join(t[i], NULL);
	} else {
		launches(mode);
	}
	_exit(failures ? 1 : 0);
}

static void launches(const char *mode)
{
	CUmodule m;
	CUfunction f;
	CU(cuModuleLoadData(&m, "fake"));
	CU(cuModuleGetFunction(&f, m, "k2000"));
	CUstream s;
	CU(cuStreamCreate(&s, 0));
	CUgraphExec exec = NULL;
	if (strcmp(mode, "graph") == 0) {
		/* Captured as PyTorch's CUDA graphs are: four kernels. */
		CU(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
		for (int i = 0; i < 4; i++)
			CU(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
		CUgraph g;
		CU(cuStreamEndCapture(s, &g));
		CU(cuGraphInstantiateWithFlags(&exec, g, 0));
	}
	double end = now_s() + SECONDS;
	int n = 0;
	while (now_s() < end) {
		if (exec)
			CU(cuGraphLaunch(exec, s));
		else if (strcmp(mode, "cooperative") == 0)
			CU(cuLaunchCooperativeKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL));
		else if (strcmp(mode, "ex") == 0) {
			CUlaunchConfig c = {1, 1, 1, 1, 1, 1, 0, s, NULL, 0};
			CU(cuLaunchKernelEx(&c, f, NULL, NULL));
		} else
			CU(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
		/* A training loop keeps a few launches queued, not thousands. */
		if (++n % 4 == 0)
			CU(cuStreamSynchronize(s));
	}
	CU(cuStreamSynchronize(s));
}

static pid_t start(const char *dir, const char *limits, const char *mode)
{
	mkdir(dir, 0755);
	write_limits(dir, limits);
	pid_t pid = fork();
	if (pid == 0) {
		setenv("TESSERA_TEST_DIR", dir, 1);
		tenant(mode);
	}
	return pid;
}

static int64_t busy_of(pid_t pid)
{
	struct fake_state *s = fake_state();
	for (int i = 0; i < FAKE_MAX_PROCS; i++)
		if (atomic_load(&s->proc[i].pid) == pid)
			return atomic_load(&s->proc[i].busy_ns);
	return 0;
}

int main(int argc, char **argv)
{
	const char *ma = argc > 1 ? argv[1] : "plain", *mb = argc > 2 ? argv[2] : "plain";
	int control = argc > 3 && strcmp(argv[3], "--control") == 0;
	int race_only = argc > 3 && strcmp(argv[3], "--race-only") == 0;
	char da[600], db[600];
	snprintf(da, sizeof(da), "%s/a", getenv("TESSERA_TEST_DIR"));
	snprintf(db, sizeof(db), "%s/b", getenv("TESSERA_TEST_DIR"));
	fake_state();
	double t0 = now_s();
	pid_t a = start(da, GPU0 " 1073741824 30\n", ma);
	pid_t b = start(db, GPU0 " 1073741824 70\n", mb);
	int sa, sb;
	waitpid(a, &sa, 0);
	waitpid(b, &sb, 0);
	double wall = now_s() - t0;
	CHECK(WIFEXITED(sa) && WEXITSTATUS(sa) == 0 && WIFEXITED(sb) && WEXITSTATUS(sb) == 0, "a tenant failed");
	double ba = busy_of(a) / 1e9, bb = busy_of(b) / 1e9;
	double share = 100 * ba / (ba + bb);
	printf("     %s (30 %%) vs %s (70 %%)%s: %.1f %% / %.1f %% of %.2f s GPU time; GPU busy %.0f %% of %.2f s\n",
	       ma, mb, control ? " without the library" : "", share, 100 - share, ba + bb, 100 * (ba + bb) / wall, wall);
	char name[160];
	if (race_only) {
		snprintf(name, sizeof(name), "compute: %s and %s launches through the throttle (split %.1f / %.1f, not checked here)", ma, mb, share, 100 - share);
	} else if (control) {
		CHECK(share > 40, "without the library the 30 %% tenant got %.1f %%: the test cannot tell a throttle from none", share);
		snprintf(name, sizeof(name), "compute: without the library %s/%s is not held (%.1f %%)", ma, mb, share);
	} else {
		CHECK(share >= 25 && share <= 35, "the 30 %% tenant got %.1f %% of the GPU time, want 30 ± 5", share);
		CHECK(ba / wall <= 0.35 && bb / wall <= 0.75, "a tenant ran past its grant of the wall time: %.1f %% and %.1f %%", 100 * ba / wall, 100 * bb / wall);
		snprintf(name, sizeof(name), "compute: %s 30 %% / %s 70 %% held at %.1f / %.1f", ma, mb, share, 100 - share);
	}
	return done(name);
}
