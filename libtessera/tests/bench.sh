#!/usr/bin/env bash
# The library's cost per allocation (cuMemAlloc + cuMemFree) and per
# launch (cuLaunchKernel of an empty kernel), against the fake driver with
# and without it, in one run: 100 % cores (no throttle) and 50 % (each
# launch measured by two events and charged).
set -euo pipefail
dir=$1
scratch=$(mktemp -d "${TMPDIR:-/tmp}/libtessera-bench.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
run() { env TESSERA_TEST_DIR="$scratch" FAKE_GPU_STATE="$scratch/fake-$1" "${@:2}" "$dir/bench"; }
for round in 1 2 3; do
	echo "GPU-00000000-0000-0000-0000-000000000001 85899345920 100" >"$scratch/limits"
	base=$(run base-$round)
	full=$(run full-$round LD_PRELOAD="$dir/libtessera.so")
	echo "GPU-00000000-0000-0000-0000-000000000001 85899345920 50" >"$scratch/limits"
	half=$(run half-$round LD_PRELOAD="$dir/libtessera.so")
	echo "round $round: driver alone: $(echo $base | tr '\n' ' ')| with libtessera, 100 % cores: $(echo $full | tr '\n' ' ')| 50 % cores: $(echo $half | tr '\n' ' ')"
done
