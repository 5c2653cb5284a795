"""A tenant of hack/gpu-isolation-check.sh, run inside the cgroup (or with
the MPS environment) the check prepared.

  tenant.py alloc             allocate 256 MiB blocks until CUDA refuses; print
                              what the tenant was told and what it got
  tenant.py matmul SECONDS    fp16 matmuls for SECONDS; print TFLOP/s
"""
import sys
import time

import torch


def alloc():
    free, total = torch.cuda.mem_get_info()
    print(f"sees free={free >> 20} MiB total={total >> 20} MiB", flush=True)
    blocks, err = [], "none"
    try:
        while len(blocks) * 256 < (total >> 20):
            blocks.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
    except torch.cuda.OutOfMemoryError:  # what a hard limit must give
        err = "CUDA out of memory"
    except RuntimeError as e:
        err = str(e).splitlines()[0][:120]
    print(f"allocated={len(blocks) * 256} MiB error={err}", flush=True)


def matmul(seconds):
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    n, start = 0, time.time()
    while time.time() - start < seconds:
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        n += 10
    dt = time.time() - start
    print(f"tflops={2 * 8192 ** 3 * n / dt / 1e12:.1f}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "alloc":
        alloc()
    else:
        matmul(float(sys.argv[2]))
