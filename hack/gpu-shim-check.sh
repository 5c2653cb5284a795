#!/usr/bin/env bash
# GPU check of libtessera (issue 41) on one GPU of a real node, with CUDA's
# compiler and PyTorch; it builds only the library (make, a second) and one
# small CUDA program. Steps (about 3 minutes of GPU work in all):
#   1. memory: a process held to 8 GiB by the library — torch.cuda.mem_get_info
#      reports the grant, 6 GiB fits, 3 GiB more is refused with an
#      out-of-memory error, also with PyTorch's expandable segments
#      (cuMemCreate) and through nvidia-smi's view;
#   2. compute: two processes of 30 % and 70 % both running matrix products
#      for 20 s, plain and captured in a CUDA graph: the share of the work
#      the 30 % one did (and, for comparison, without the library);
#   3. launch overhead: an empty kernel launched 200,000 times without the
#      library, with it at 100 % (not throttled) and at 50 % (measured).
# Prints a table; exits 1 when a limit did not hold (a grant passed, the
# 30 % share outside 25–35 %), 2 when it cannot run.
# Usage: hack/gpu-shim-check.sh [gpu-index]
set -uo pipefail
cd "$(dirname "$0")/.."
idx=${1:-0}
py=${PYTHON:-python3}
export PATH=$PATH:/usr/local/nvidia/bin:/usr/local/cuda/bin
for tool in nvcc nvidia-smi "$py" make cc; do
	command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 2; }
done
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-shim-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
# The test-paths build: the limits and the usage region from
# TESSERA_TEST_DIR rather than the container's fixed paths, so the check
# needs no mount namespace; the code is the shipped library's otherwise.
make -s -C libtessera OUT="$work/lib" "$work/lib/plain/libtessera.so" || exit 2
lib=$work/lib/plain/libtessera.so
uuid=$(nvidia-smi -i "$idx" --query-gpu=uuid --format=csv,noheader | tr -d ' ')
[[ $uuid == GPU-* ]] || { echo "no GPU $idx: $uuid" >&2; exit 2; }
export CUDA_VISIBLE_DEVICES=$idx
failed=0
fail() { echo "FAIL: $*"; failed=1; }

# tenant DIR BYTES PERCENT: a container's directory with its limits.
tenant() {
	mkdir -p "$1"
	echo "$uuid $2 $3" >"$1/limits"
}

echo "== 1. memory: an 8 GiB grant"
tenant "$work/mem" $((8 << 30)) 100
cat >"$work/mem.py" <<'PY'
import sys, torch
free, total = torch.cuda.mem_get_info()
print(f"mem_get_info: total {total / 2**30:.2f} GiB, free {free / 2**30:.2f} GiB")
ok = abs(total - 8 * 2**30) < 2**20
a = torch.empty(6 * 2**30, dtype=torch.uint8, device="cuda")
print("6 GiB: allocated")
try:
    b = torch.empty(3 * 2**30, dtype=torch.uint8, device="cuda")
    print("3 GiB more: ALLOCATED (the grant did not hold)")
    ok = False
except torch.cuda.OutOfMemoryError as e:
    print("3 GiB more: refused,", str(e).splitlines()[0][:100])
sys.exit(0 if ok else 1)
PY
TESSERA_TEST_DIR=$work/mem LD_PRELOAD=$lib "$py" "$work/mem.py" || fail "the 8 GiB grant (plain allocations)"
rm -f "$work/mem/usage"
TESSERA_TEST_DIR=$work/mem LD_PRELOAD=$lib PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "$py" "$work/mem.py" ||
	fail "the 8 GiB grant (expandable segments: cuMemCreate)"
echo "nvidia-smi with the library: $(TESSERA_TEST_DIR=$work/mem LD_PRELOAD=$lib nvidia-smi -i "$idx" --query-gpu=memory.total,memory.used --format=csv,noheader 2>&1)"

echo "== 2. compute: 30 % and 70 %, 20 s of matrix products each"
cat >"$work/mm.py" <<'PY'
import sys, time, torch
graph, seconds = sys.argv[1] == "graph", float(sys.argv[2])
a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
c = torch.empty_like(a)
def step():
    for _ in range(8):
        torch.matmul(a, b, out=c)
step(); torch.cuda.synchronize()
if graph:
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            step()
    run = g.replay
else:
    run = step
n, end = 0, time.time() + seconds
while time.time() < end:
    run(); n += 1
    if n % 4 == 0:
        torch.cuda.synchronize()
torch.cuda.synchronize()
print(n)
PY
split() { # mode preload: prints the 30 % tenant's share of the work
	tenant "$work/a-$1-$2" $((40 << 30)) 30
	tenant "$work/b-$1-$2" $((40 << 30)) 70
	local pre_a="" pre_b=""
	if [[ $2 == with ]]; then pre_a=$lib; pre_b=$lib; fi
	TESSERA_TEST_DIR=$work/a-$1-$2 LD_PRELOAD=$pre_a "$py" "$work/mm.py" "$1" 20 >"$work/a.out" &
	TESSERA_TEST_DIR=$work/b-$1-$2 LD_PRELOAD=$pre_b "$py" "$work/mm.py" "$1" 20 >"$work/b.out" &
	wait
	local na nb
	na=$(tail -1 "$work/a.out") nb=$(tail -1 "$work/b.out")
	awk -v a="$na" -v b="$nb" 'BEGIN { if (a + b == 0) print "0.0"; else printf "%.1f", 100 * a / (a + b) }'
	echo " (iterations $na / $nb)" >&2
}
for mode in plain graph; do
	with=$(split $mode with)
	without=$(split $mode without)
	echo "$mode: the 30 % tenant did $with % of the work with libtessera, $without % without"
	awk -v s="$with" 'BEGIN { exit !(s >= 25 && s <= 35) }' || fail "$mode: 30 % tenant got $with %"
done

echo "== 3. launch overhead: an empty kernel, 200,000 launches"
cat >"$work/launch.cu" <<'CU'
#include <chrono>
#include <cstdio>
__global__ void empty() {}
int main() {
	empty<<<1, 1>>>();
	cudaDeviceSynchronize();
	const int n = 200000;
	auto t0 = std::chrono::steady_clock::now();
	for (int i = 0; i < n; i++)
		empty<<<1, 1>>>();
	cudaDeviceSynchronize();
	double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
	printf("%.2f\n", us);
	return cudaGetLastError() != cudaSuccess;
}
CU
nvcc -O2 -o "$work/launch" "$work/launch.cu" || exit 2
tenant "$work/l100" $((8 << 30)) 100
tenant "$work/l50" $((8 << 30)) 50
base=$("$work/launch")
full=$(TESSERA_TEST_DIR=$work/l100 LD_PRELOAD=$lib "$work/launch")
half=$(TESSERA_TEST_DIR=$work/l50 LD_PRELOAD=$lib "$work/launch")
echo "µs per launch: without the library $base, with it at 100 % $full, at 50 % $half"

if [[ $failed != 0 ]]; then
	echo "gpu-shim-check: a limit did not hold"
	exit 1
fi
echo "gpu-shim-check: every limit held"
