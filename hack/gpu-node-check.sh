#!/usr/bin/env bash
# Reads a GPU node through Tessera's NVML layer and MPS manager (the code the
# agent runs) and
# prints nvidia-smi's view beside it, so the two can be compared by eye, then
# `tessera doctor node`'s findings on the same node (run it as root for the
# kubelet and runtime checks). It
# builds only cmd/tessera (no Kubernetes packages): seconds, not minutes.
# Usage: hack/gpu-node-check.sh [samples]
set -euo pipefail
cd "$(dirname "$0")/.."
samples=${1:-4}
go build -o bin/tessera ./cmd/tessera 2>/dev/null
mps=()
if command -v nvidia-cuda-mps-control >/dev/null; then
	# Starts one MPS daemon on GPU 0 in a scratch directory, sets and reads
	# back a default limit, and stops it. Leaves the compute mode as it is.
	mps=(--mps-check "$(command -v nvidia-cuda-mps-control)")
fi
if command -v nvidia-smi >/dev/null; then
	# Sets GPU 0's time-slice class to long with the agent's nvidia-smi
	# command line, then back to the driver's default.
	mps+=(--timeslice-check "$(command -v nvidia-smi)")
fi
echo "== tessera gpus --samples $samples ${mps[*]}"
./bin/tessera gpus --samples "$samples" --interval 500ms "${mps[@]}" || echo "tessera gpus exited $?"
if command -v nvidia-smi >/dev/null; then
	echo
	echo "== nvidia-smi"
	nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,utilization.gpu,temperature.gpu,power.draw,compute_mode,mig.mode.current \
		--format=csv
	nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv || true
fi
echo
echo "== tessera doctor node"
./bin/tessera doctor node || echo "tessera doctor node exited $? (1: warnings, 2: errors)"
