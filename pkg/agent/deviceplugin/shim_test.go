package deviceplugin_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"

	"github.com/tessera-gpu/tessera/pkg/agent/deviceplugin"
	"github.com/tessera-gpu/tessera/pkg/agent/shim"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// TestKubeletStartsShimmedContainers: on a node whose driver has no kernel
// memory limits (R580) the time-sliced container kubelet's real device
// manager starts gets libtessera — the library, /etc/ld.so.preload and its
// limits read-only, its usage directory read-write — with the grant by GPU
// UUID, and is told memory=shim,compute=shim; an agent that was not given
// the library refuses such a container instead of starting it unheld.
func TestKubeletStartsShimmedContainers(t *testing.T) {
	dir := kubeletDir(t)
	logger, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	lib := filepath.Join(t.TempDir(), "libtessera.so")
	if err := os.WriteFile(lib, []byte("ELF stand-in"), 0o755); err != nil {
		t.Fatal(err)
	}
	shimRoot := t.TempDir()
	sd, err := shim.Install(shimRoot, lib)
	if err != nil {
		t.Fatal(err)
	}
	r580 := gpu.IsolationOffer{Shim: true}
	isolate := func(ctx context.Context, pod *v1.Pod, ca gpu.ContainerAssignment) ([]gpu.Guarantee, error) {
		out := make([]gpu.Guarantee, len(ca.GPUs))
		for i, g := range ca.GPUs {
			out[i] = gpu.GuaranteeOf(ca.Mode, g, r580, gpu.MPSServerLimits{})
		}
		return out, nil
	}
	cdi := t.TempDir()
	const uuid = "GPU-0a1b2c3d-0000-4000-8000-000000000004"
	// start runs a plugin with sd and a kubelet of its own, and starts pod
	// i's container through them.
	start := func(sd *shim.Dir, i int) (*v1.Pod, error) {
		k := startKubelet(t, logger)
		defer func() { _ = k.m.Stop(logger) }()
		p := deviceplugin.New(deviceplugin.Config{Node: node, Holder: k, Pods: k.get, CDIDir: cdi, Enforcer: limitsOnly(isolate),
			PipeDir: func(string) string { return "" }, Shim: sd})
		p.SetGPUs([]deviceplugin.GPUSlots{{UUID: uuid, Slices: 8, Healthy: true}})
		pctx, pcancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = p.Run(pctx, dir, 50*time.Millisecond) }()
		defer func() { pcancel(); <-done }()
		k.waitAllocatable(8)
		pod := gpuPod(t, i, &gpu.PodAssignment{Node: node, Containers: []gpu.ContainerAssignment{{Name: "main", Mode: gpu.ModeTimeSlicing,
			GPUs: []gpu.GPUGrant{{UUID: uuid, Index: 0, MemoryMiB: 8192, CoresPerMille: 300}}}}})
		k.admit(pod)
		if err := k.m.Allocate(ctx, pod, &pod.Spec.Containers[0], lifecycle.AddOperation); err != nil {
			t.Fatalf("Allocate: %v", err)
		}
		opts, err := k.m.GetDeviceRunContainerOptions(ctx, pod, &pod.Spec.Containers[0])
		if err != nil {
			return pod, err
		}
		var ids []string
		for _, d := range opts.CDIDevices {
			ids = append(ids, strings.TrimPrefix(d.Name, deviceplugin.CDIKind+"="))
		}
		spec := readSpec(t, cdi, ids)
		if env := envOf(spec); !slices.Contains(env, deviceplugin.IsolationEnv+"=0:memory=shim,compute=shim") {
			t.Errorf("container env %v does not say libtessera holds its slice", env)
		}
		mounts := map[string]string{}
		edits := spec["devices"].([]any)[0].(map[string]any)["containerEdits"].(map[string]any)
		for _, m := range edits["mounts"].([]any) {
			m := m.(map[string]any)
			var opts []string
			for _, o := range m["options"].([]any) {
				opts = append(opts, o.(string))
			}
			mounts[m["containerPath"].(string)] = m["hostPath"].(string) + " " + strings.Join(opts, ",")
		}
		podDir := filepath.Join(shimRoot, "pods", string(pod.UID), "main")
		for path, want := range map[string]string{
			shim.LibraryInContainer: filepath.Join(shimRoot, "libtessera.so") + " rbind,ro",
			shim.PreloadInContainer: filepath.Join(shimRoot, "ld.so.preload") + " rbind,ro",
			shim.LimitsInContainer:  filepath.Join(podDir, "limits") + " rbind,ro",
			shim.RunDirInContainer:  filepath.Join(podDir, "run") + " rbind,rw",
		} {
			if mounts[path] != want {
				t.Errorf("mount at %s: %q, want %q", path, mounts[path], want)
			}
		}
		limits, err := os.ReadFile(filepath.Join(podDir, "limits"))
		if err != nil || !strings.Contains(string(limits), uuid+" 8589934592 30\n") {
			t.Errorf("limits %q (%v), want %s's 8 GiB and 30 %%", limits, err, uuid)
		}
		return pod, nil
	}
	if _, err := start(sd, 0); err != nil {
		t.Fatalf("run options: %v", err)
	}
	if _, err := start(nil, 1); err == nil || !strings.Contains(err.Error(), "held by libtessera, which this agent was not given") {
		t.Fatalf("a shim slice on an agent without the library: %v, want refused", err)
	}
}
