package memlimit

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/pkg/cgroup"
	"github.com/tessera-gpu/tessera/pkg/nvml"
)

// NVML is what the limiter needs of the driver (nvml.Client).
type NVML interface {
	SetMemoryLimits(uuid, cgroup string, soft, hard uint64) error
	ClearMemoryLimits(uuid, cgroup string) error
	GetMemoryLimits(uuid, cgroup string) (nvml.MemoryLimits, bool, error)
	ProbeMemoryLimits(uuid, scratch string) (bool, string, error)
}

// Limiter applies the plan through NVML on the cgroup hierarchy at Root
// (/sys/fs/cgroup on a node, with the host's cgroup namespace).
type Limiter struct {
	NVML NVML
	Root string
}

// ErrNoPodCgroup says the pod's cgroup was not found under the root: the
// limit cannot be set, so the container must not start.
var ErrNoPodCgroup = errors.New("the pod's cgroup was not found")

// kubepodsRoots are where kubelet puts pod cgroups: the systemd driver's
// slice and the cgroupfs driver's directory.
var kubepodsRoots = []string{"kubepods.slice", "kubepods"}

// PodCgroups finds every pod cgroup under the root, by pod UID: the pods of
// the Guaranteed class directly under kubepods, the others one level down
// under their QoS class.
func (l *Limiter) PodCgroups() (map[string]string, error) {
	out := map[string]string{}
	found := false
	for _, top := range kubepodsRoots {
		base := filepath.Join(l.Root, top)
		if _, err := os.Stat(base); err != nil {
			continue
		}
		found = true
		if err := scanPods(base, 2, out); err != nil {
			return out, err
		}
	}
	if !found {
		return out, fmt.Errorf("no kubepods cgroup under %s (is it the host's cgroup v2 hierarchy, and does kubelet use cgroups per QoS class?)", l.Root)
	}
	return out, nil
}

func scanPods(dir string, depth int, out map[string]string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		path := filepath.Join(dir, e.Name())
		if uid, ok := cgroup.PodUIDOfSegment(e.Name()); ok {
			out[uid] = path
			continue
		}
		if depth > 1 {
			if err := scanPods(path, depth-1, out); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}

// PodCgroup finds one pod's cgroup.
func (l *Limiter) PodCgroup(uid string) (string, error) {
	all, err := l.PodCgroups()
	if err != nil {
		return "", err
	}
	if p, ok := all[uid]; ok {
		return p, nil
	}
	return "", fmt.Errorf("pod %s: %w under %s", uid, ErrNoPodCgroup, l.Root)
}

// ApplyPod sets a starting pod's limits (ForPod of the plan). Any failure is
// returned, naming the GPU and the cgroup: the caller refuses the
// container rather than let it run unlimited.
func (l *Limiter) ApplyPod(ctx context.Context, uid string, wants map[string]Want) error {
	if len(wants) == 0 {
		return nil
	}
	cg, err := l.PodCgroup(uid)
	if err != nil {
		return err
	}
	for _, uuid := range slices.Sorted(maps.Keys(wants)) {
		w := wants[uuid]
		if err := l.NVML.SetMemoryLimits(uuid, cg, w.Soft, w.Hard); err != nil {
			return err
		}
		klog.FromContext(ctx).V(2).Info("GPU memory limit set", "podUID", uid, "gpu", uuid, "cgroup", cg, "hardMiB", w.Hard>>20, "softMiB", w.Soft>>20)
	}
	return nil
}

// Result is what one reconciliation did.
type Result struct {
	Set, Updated, Cleared int
}

// Reconcile makes every pod cgroup's limits on the GPUs the rule's: it sets
// missing limits, updates changed ones (soft limits follow the GPU's
// tenants) and clears limits no active pod should have — a pod that ended
// and whose cgroup lingers, or a limit a crashed agent left behind. Pods in
// the plan without a cgroup yet are skipped: PreStartContainer sets theirs.
// Errors are joined; one cgroup's failure does not stop the others.
func (l *Limiter) Reconcile(ctx context.Context, plan map[Key]Want, gpus []string) (Result, error) {
	var res Result
	cgs, err := l.PodCgroups()
	if err != nil {
		return res, err
	}
	logger := klog.FromContext(ctx)
	var errs []error
	for _, uid := range slices.Sorted(maps.Keys(cgs)) {
		cg := cgs[uid]
		for _, uuid := range gpus {
			want, wanted := plan[Key{uid, uuid}]
			got, found, err := l.NVML.GetMemoryLimits(uuid, cg)
			if errors.Is(err, nvml.ErrCgroupUnusable) {
				break // the pod's cgroup went away while we looked
			}
			if err != nil {
				errs = append(errs, err)
				continue
			}
			switch {
			case wanted && (!found || got.Soft != want.Soft || got.Hard != want.Hard):
				if err := l.NVML.SetMemoryLimits(uuid, cg, want.Soft, want.Hard); err != nil {
					errs = append(errs, err)
					continue
				}
				if found && got.Set() {
					res.Updated++
				} else {
					res.Set++
				}
				logger.V(2).Info("GPU memory limit reconciled", "podUID", uid, "gpu", uuid, "hardMiB", want.Hard>>20, "softMiB", want.Soft>>20)
			case !wanted && found && got.Set():
				if err := l.NVML.ClearMemoryLimits(uuid, cg); err != nil && !errors.Is(err, nvml.ErrCgroupUnusable) {
					errs = append(errs, err)
					continue
				}
				res.Cleared++
				logger.Info("GPU memory limit of a pod that no longer holds the GPU removed", "podUID", uid, "gpu", uuid, "cgroup", cg)
			}
		}
	}
	return res, errors.Join(errs...)
}

// Probe finds, per GPU, whether the driver offers per-cgroup memory limits,
// by trying them on a scratch cgroup it creates under the root and removes.
// why explains a GPU without them; err is for a probe that could not run at
// all (no cgroup v2 hierarchy, or no right to create a cgroup).
func (l *Limiter) Probe(gpus []string) (offered map[string]bool, why map[string]string, err error) {
	offered, why = map[string]bool{}, map[string]string{}
	controllers, cerr := os.ReadFile(filepath.Join(l.Root, "cgroup.controllers"))
	if cerr != nil {
		return offered, why, fmt.Errorf("%s is not a cgroup v2 hierarchy (NVML's memory limits need cgroup v2): %w", l.Root, cerr)
	}
	scratch := filepath.Join(l.Root, fmt.Sprintf("tessera-probe-%d", os.Getpid()))
	if err := os.Mkdir(scratch, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return offered, why, fmt.Errorf("create a scratch cgroup to try NVML's memory limits: %w", err)
	}
	defer os.Remove(scratch)
	var errs []error
	for _, uuid := range gpus {
		ok, reason, err := l.NVML.ProbeMemoryLimits(uuid, scratch)
		if err != nil {
			errs = append(errs, err)
			why[uuid] = err.Error()
			continue
		}
		offered[uuid] = ok
		if !ok {
			if !strings.Contains(" "+string(controllers)+" ", " dmem") {
				reason += "; the kernel offers no dmem cgroup controller (" + strings.TrimSpace(string(controllers)) + ")"
			}
			why[uuid] = reason
		}
	}
	return offered, why, errors.Join(errs...)
}
