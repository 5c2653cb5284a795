package deviceplugin_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
	"tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-gpu/tessera/pkg/agent/deviceplugin"
	"github.com/tessera-gpu/tessera/pkg/agent/memlimit"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/nvml"
	"github.com/tessera-gpu/tessera/pkg/nvml/nvmltest"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
)

// TestKubeletStartsContainersWithinTheirLimits: through kubelet's real device
// manager, a time-sliced container's pod holds its kernel GPU memory limit
// (the agent's rule, through NVML on the H100 mock) by the time kubelet has
// its run options — before the runtime can create the container — and the
// container is told so; a pod whose cgroup is gone is refused with the
// reason; the limit goes when the pod has ended.
func TestKubeletStartsContainersWithinTheirLimits(t *testing.T) {
	dir := kubeletDir(t)
	logger, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	srv := dgxh100.New()
	var readings []*nvmltest.Reading
	nvmltest.Install(srv, func(int) *nvmltest.Reading {
		r := &nvmltest.Reading{KernelLimits: true}
		readings = append(readings, r)
		return r
	})
	c, err := nvml.New(srv)
	if err != nil {
		t.Fatal(err)
	}
	devs, err := c.Devices()
	if err != nil {
		t.Fatal(err)
	}
	var inventory []gpu.Device
	var slots []deviceplugin.GPUSlots
	for _, d := range devs {
		dev := d.Device(true, false)
		dev.Isolation = &gpu.IsolationOffer{KernelMemoryLimits: true}
		inventory = append(inventory, dev)
		slots = append(slots, deviceplugin.GPUSlots{UUID: d.UUID, Slices: 8, Healthy: true})
	}
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte("cpu memory pids dmem\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	podCgroup := func(p *v1.Pod) string {
		return filepath.Join(root, "kubepods", "burstable", "pod"+string(p.UID))
	}
	lim := &memlimit.Limiter{NVML: c, Root: root}

	k := startKubelet(t, logger)
	defer func() { _ = k.m.Stop(logger) }()
	isolate := func(ctx context.Context, pod *v1.Pod, ca gpu.ContainerAssignment) ([]gpu.Guarantee, error) {
		asg, err := podgpu.BoundAssignment(pod)
		if err != nil {
			return nil, err
		}
		plan := memlimit.Plan([]memlimit.Pod{{UID: string(pod.UID), Assignment: asg}}, inventory)
		if err := lim.ApplyPod(ctx, string(pod.UID), memlimit.ForPod(plan, string(pod.UID))); err != nil {
			return nil, err
		}
		out := make([]gpu.Guarantee, len(ca.GPUs))
		for i, g := range ca.GPUs {
			out[i] = gpu.GuaranteeOf(ca.Mode, g, gpu.IsolationOffer{KernelMemoryLimits: true}, gpu.MPSServerLimits{})
		}
		return out, nil
	}
	cdi := t.TempDir()
	p := deviceplugin.New(deviceplugin.Config{Node: node, Holder: k, Pods: k.get, CDIDir: cdi, Enforcer: limitsOnly(isolate),
		PipeDir: func(string) string { return "" }})
	p.SetGPUs(slots)
	pctx, pcancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(pctx, dir, 50*time.Millisecond) }()
	defer func() { pcancel(); <-done }()
	k.waitAllocatable(int64(8 * len(slots)))

	grant := gpu.GPUGrant{UUID: devs[4].UUID, Index: 4, MemoryMiB: 8192, CoresPerMille: 250}
	pod := func(i int) *v1.Pod {
		return gpuPod(t, i, &gpu.PodAssignment{Node: node, Containers: []gpu.ContainerAssignment{{Name: "main", Mode: gpu.ModeTimeSlicing, GPUs: []gpu.GPUGrant{grant}}}})
	}
	held, gone := pod(0), pod(1)
	// Kubelet's cgroup names carry real pod UIDs.
	held.UID, gone.UID = "5b1f5a3e-0d3c-4f7e-9b1a-2c4d6e8f0a11", "5b1f5a3e-0d3c-4f7e-9b1a-2c4d6e8f0a22"
	// Kubelet makes the pod's cgroup before it starts its containers.
	if err := os.MkdirAll(filepath.Join(podCgroup(held), "0123abcd"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, pd := range []*v1.Pod{held, gone} {
		k.admit(pd)
		if err := k.m.Allocate(ctx, pd, &pd.Spec.Containers[0], lifecycle.AddOperation); err != nil {
			t.Fatalf("%s: Allocate: %v", pd.Name, err)
		}
	}
	opts, err := k.m.GetDeviceRunContainerOptions(ctx, held, &held.Spec.Containers[0])
	if err != nil {
		t.Fatalf("run options: %v", err)
	}
	// Kubelet has its run options: the limit is in force before the
	// runtime creates the container.
	soft, hard, ok := readings[4].Limits.Limit(podCgroup(held))
	if !ok || hard != 8192<<20 || soft != 8192<<20 {
		t.Fatalf("limit of the starting pod: soft %d hard %d (set %v), want its 8 GiB grant", soft, hard, ok)
	}
	if err := readings[4].Limits.Allocate(filepath.Join(podCgroup(held), "0123abcd"), 8193<<20); !strings.Contains(errString(err), "OUT_OF_MEMORY") {
		t.Errorf("allocating past the grant: %v, want out of memory", err)
	}
	var ids []string
	for _, d := range opts.CDIDevices {
		ids = append(ids, strings.TrimPrefix(d.Name, deviceplugin.CDIKind+"="))
	}
	if env := envOf(readSpec(t, cdi, ids)); !slices.Contains(env, deviceplugin.IsolationEnv+"=0:memory=kernel,compute=none") {
		t.Errorf("container env %v does not say what holds its slice", env)
	}
	// No cgroup to limit: refused, with the reason kubelet shows.
	if _, err := k.m.GetDeviceRunContainerOptions(ctx, gone, &gone.Spec.Containers[0]); err == nil ||
		!strings.Contains(err.Error(), "its GPU limits could not be set, so it does not start") || !strings.Contains(err.Error(), "cgroup was not found") {
		t.Fatalf("a pod without its cgroup: %v, want refused", err)
	}
	// The pod ended (its cgroup lingers): the agent's reconciliation,
	// with no pod wanting a limit, removes it.
	res, err := lim.Reconcile(ctx, map[memlimit.Key]memlimit.Want{}, []string{grant.UUID})
	if err != nil || res.Cleared != 1 {
		t.Fatalf("reconcile after the pod ended: %+v, %v; want one limit cleared", res, err)
	}
	if _, _, ok := readings[4].Limits.Limit(podCgroup(held)); ok {
		t.Error("the ended pod's limit is still set")
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// limitsOnly is an Enforcer that sets limits with isolate and has no
// driver edits.
type limitsOnly func(ctx context.Context, pod *v1.Pod, c gpu.ContainerAssignment) ([]gpu.Guarantee, error)

func (f limitsOnly) Isolate(ctx context.Context, pod *v1.Pod, c gpu.ContainerAssignment) ([]gpu.Guarantee, error) {
	return f(ctx, pod, c)
}

func (limitsOnly) DriverEdits([]string) (*specs.ContainerEdits, error) { return nil, nil }
