// timeslice: one busy kernel that watches the GPU's global timer and records
// every stall longer than a threshold — the moments its context was
// switched out for another process's. Two of these on one time-sliced GPU
// show the driver's time slice: the length of the runs between stalls.
// Prints: runs=<n> median_run_ms=<x> median_gap_ms=<y>.
// Built by hack/gpu-isolation-check.sh with nvcc (seconds).
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin(unsigned long long run_ns, unsigned long long gap_ns, unsigned long long *ev, int max_ev, int *n_ev) {
  if (threadIdx.x != 0 || blockIdx.x != 0) {
    // The other blocks keep the SMs busy for as long as block 0 watches.
    unsigned long long start = now_ns();
    while (now_ns() - start < run_ns) {}
    return;
  }
  unsigned long long start = now_ns(), last = start;
  while (last - start < run_ns) {
    unsigned long long t = now_ns();
    if (t - last > gap_ns) {
      int i = atomicAdd(n_ev, 1);
      if (i < max_ev) { ev[2 * i] = last; ev[2 * i + 1] = t; }
    }
    last = t;
  }
}

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 3.0;
  const int max_ev = 8192;
  unsigned long long *ev; int *n;
  cudaMallocManaged(&ev, sizeof(unsigned long long) * 2 * max_ev);
  cudaMallocManaged(&n, sizeof(int));
  *n = 0;
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  spin<<<sms, 32>>>((unsigned long long)(seconds * 1e9), 200000ULL /* 0.2 ms */, ev, max_ev, n);
  cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) { printf("error=%s\n", cudaGetErrorString(err)); return 1; }
  int k = std::min(*n, max_ev);
  std::vector<double> runs, gaps;
  for (int i = 0; i < k; i++) {
    gaps.push_back((ev[2 * i + 1] - ev[2 * i]) / 1e6);
    if (i > 0) runs.push_back((ev[2 * i] - ev[2 * i - 1]) / 1e6);
  }
  auto median = [](std::vector<double> v) { if (v.empty()) return 0.0; std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
  printf("runs=%zu median_run_ms=%.2f median_gap_ms=%.2f\n", runs.size(), median(runs), median(gaps));
  return 0;
}
