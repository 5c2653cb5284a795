/* Several processes of one container share one grant: together they get
 * it and no more, whoever asks first. */
#include "check.h"

#define PROCS 8

int main(void)
{
	write_limits(NULL, GPU0 " 1073741824 100\n");
	int fds[2];
	if (pipe(fds) != 0)
		return 2;
	/* Each asks for 16 × 16 MiB (256 MiB); the 1 GiB grant takes 64 of
	 * the 128 allocations. */
	pid_t pids[PROCS];
	for (int i = 0; i < PROCS; i++) {
		if ((pids[i] = fork()) == 0) {
			char cmd[1];
			close(fds[1]);
			if (read(fds[0], cmd, 1) < 0)
				_exit(2);
			on_device(0);
			CUdeviceptr p;
			for (int j = 0; j < 16; j++)
				cuMemAlloc_v2(&p, 16 * MiB);
			pause();
			_exit(0);
		}
	}
	close(fds[0]);
	close(fds[1]); /* all start at once */
	usleep(300000);
	on_device(0);
	size_t f, t;
	for (int i = 0; i < 300; i++) {
		CU(cuMemGetInfo_v2(&f, &t));
		if (f == 0)
			break;
		usleep(10000);
	}
	CHECK(f == 0, "the %d processes left %zu bytes of the grant unused", PROCS, f);
	nvmlDevice_t d;
	nvmlInit_v2();
	nvmlDeviceGetHandleByIndex_v2(0, &d);
	unsigned n = 16;
	nvmlProcessInfo_v2_t infos[16];
	CHECK(nvmlDeviceGetComputeRunningProcesses_v3(d, &n, infos) == NVML_SUCCESS, "process list");
	unsigned long long sum = 0;
	for (unsigned i = 0; i < n; i++)
		sum += infos[i].usedGpuMemory;
	CHECK(sum == (unsigned long long)GiB, "the processes listed hold %llu bytes, want the 1 GiB grant", sum);
	CUdeviceptr p;
	CHECK(cuMemAlloc_v2(&p, 1) == CUDA_ERROR_OUT_OF_MEMORY, "one byte past the shared grant was allowed");
	for (int i = 0; i < PROCS; i++)
		kill(pids[i], SIGKILL);
	for (int i = 0; i < PROCS; i++)
		waitpid(pids[i], NULL, 0);
	CU(cuMemAlloc_v2(&p, GiB));
	CU(cuMemFree_v2(p));
	return done("processes: eight processes share one grant; the killed ones' shares return");
}
