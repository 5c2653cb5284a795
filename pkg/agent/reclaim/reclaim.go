// Package reclaim is the last level of GPU preemption on the node: before a
// preempted pod's slices go to its preemptor, no process of the pod may
// still hold a CUDA context on its GPUs. NVML names the processes on each
// GPU; their cgroups (/proc/<pid>/cgroup, host PID namespace) name their
// pod. Leftovers are killed; one that survives is reported, and the agent
// takes the GPU out of service rather than let a new tenant onto it.
package reclaim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/tessera-gpu/tessera/pkg/cgroup"
)

// GPUs lists the processes with a compute context on a GPU (the agent's
// NVML client).
type GPUs interface {
	Processes(uuid string) ([]uint32, error)
}

// Reclaimer checks and cleans a preempted pod's GPUs.
type Reclaimer struct {
	GPUs     GPUs
	ProcRoot string
	// Kill ends a process (SIGKILL on a node).
	Kill func(pid uint32) error
	// Terminate, when set, first asks the GPU's MPS daemon to end the
	// client (terminate_client), so the MPS server drops its state for it;
	// an error (the GPU runs no MPS, the process is no client) is ignored:
	// Kill follows anyway.
	Terminate func(ctx context.Context, uuid string, pid uint32) error
	// Wait bounds how long a killed process may take to let go of its
	// GPU; Poll is how often it is checked.
	Wait, Poll time.Duration
}

// Result is what one reclaim found and did.
type Result struct {
	// Killed are the leftover processes killed, per GPU.
	Killed map[string][]uint32
	// Stuck are the processes still holding a GPU after Wait, per GPU.
	Stuck map[string][]uint32
}

// ErrStuck says a leftover process survived being killed.
var ErrStuck = errors.New("leftover processes still hold the GPU")

// Reclaim makes sure no process of the pod with UID podUID holds any of
// gpus: it kills the leftovers it finds and waits for them to let go. It
// returns ErrStuck (wrapped, with the GPUs and PIDs) when some did not.
func (r *Reclaimer) Reclaim(ctx context.Context, podUID string, gpus []string) (Result, error) {
	res := Result{Killed: map[string][]uint32{}, Stuck: map[string][]uint32{}}
	left, err := r.Processes(podUID, gpus)
	if err != nil {
		return res, err
	}
	for uuid, pids := range left {
		for _, pid := range pids {
			if r.Terminate != nil {
				_ = r.Terminate(ctx, uuid, pid)
			}
			if err := r.Kill(pid); err == nil {
				res.Killed[uuid] = append(res.Killed[uuid], pid)
			}
		}
	}
	if len(left) == 0 {
		return res, nil
	}
	deadline := time.Now().Add(r.Wait)
	for {
		left, err = r.Processes(podUID, gpus)
		if err != nil {
			return res, err
		}
		if len(left) == 0 {
			return res, nil
		}
		if time.Now().After(deadline) {
			res.Stuck = left
			return res, fmt.Errorf("pod %s: %w: %v", podUID, ErrStuck, left)
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(r.Poll):
		}
	}
}

// Processes lists, per GPU of gpus, the processes on it that belong to the
// pod with UID podUID.
func (r *Reclaimer) Processes(podUID string, gpus []string) (map[string][]uint32, error) {
	out := map[string][]uint32{}
	for _, uuid := range gpus {
		pids, err := r.GPUs.Processes(uuid)
		if err != nil {
			return nil, err
		}
		for _, pid := range pids {
			if r.podOf(pid) == podUID && !slices.Contains(out[uuid], pid) {
				out[uuid] = append(out[uuid], pid)
			}
		}
	}
	return out, nil
}

// podOf is the UID of the pod a process runs in, or "" (a host process, or
// one that exited).
func (r *Reclaimer) podOf(pid uint32) string {
	b, err := os.ReadFile(filepath.Join(r.ProcRoot, strconv.FormatUint(uint64(pid), 10), "cgroup"))
	if err != nil {
		return ""
	}
	ref, err := cgroup.Parse(string(b))
	if err != nil {
		return ""
	}
	return ref.PodUID
}
