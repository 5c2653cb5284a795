package deviceplugin_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/pkg/agent/deviceplugin"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

func TestHonoured(t *testing.T) {
	inv := &gpu.NodeInventory{Node: node, CPUMilli: 64000, MemoryMiB: 1 << 20, GPUs: []gpu.Device{
		{Index: 0, UUID: "GPU-0", Model: "H100", MemoryMiB: 81920, Healthy: true, MPSCapable: true, Slices: 8},
		{Index: 1, UUID: "GPU-1", Model: "H100", MemoryMiB: 81920, Healthy: true, MPSCapable: true, Slices: 8},
	}}
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	type grant struct {
		uuid  string
		mode  gpu.SharingMode
		mem   int64
		cores int // per mille
	}
	pod := func(name string, age int, scheduler string, gs ...grant) *v1.Pod {
		c := gpu.ContainerAssignment{Name: "main"}
		for _, g := range gs {
			c.Mode = g.mode
			c.GPUs = append(c.GPUs, gpu.GPUGrant{UUID: g.uuid, MemoryMiB: g.mem, CoresPerMille: g.cores})
		}
		a, err := gpu.EncodeAssignment(&gpu.PodAssignment{Node: node, Containers: []gpu.ContainerAssignment{c}})
		if err != nil {
			t.Fatal(err)
		}
		return &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name),
				CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(age) * time.Second)),
				Annotations:       map[string]string{gpu.AnnotationAssignment: a}},
			Spec:   v1.PodSpec{NodeName: node, SchedulerName: scheduler},
			Status: v1.PodStatus{Phase: v1.PodRunning},
		}
	}
	const tessera = "tessera-scheduler"
	whole := func(uuid string) grant { return grant{uuid, gpu.ModeExclusive, 81920, 1000} }
	mps := func(uuid string, mem int64, cores int) grant { return grant{uuid, gpu.ModeMPS, mem, cores} }
	finished := pod("done", 0, tessera, whole("GPU-0"))
	finished.Status.Phase = v1.PodSucceeded

	for _, tc := range []struct {
		name   string
		pods   []*v1.Pod
		check  string
		wantOK bool
		want   string
	}{
		{"alone on its GPU", []*v1.Pod{pod("a", 0, tessera, whole("GPU-0"))}, "a", true, ""},
		{"beside tenants, within limits", []*v1.Pod{
			pod("a", 0, tessera, mps("GPU-0", 40960, 500)), pod("b", 1, tessera, mps("GPU-0", 40960, 500)),
		}, "b", true, ""},
		{"memory oversubscribed up to 1.5x", []*v1.Pod{
			pod("a", 0, tessera, mps("GPU-0", 61440, 300)), pod("b", 1, tessera, mps("GPU-0", 61440, 300)),
		}, "b", true, ""},
		{"a GPU the node does not have", []*v1.Pod{pod("a", 0, tessera, whole("GPU-9"))}, "a", false, "names GPU GPU-9, which node " + node + " does not have"},
		{"a whole GPU over tenants: the newcomer is refused", []*v1.Pod{
			pod("a", 0, tessera, mps("GPU-0", 20480, 250)), pod("forged", 5, tessera, grant{"GPU-0", gpu.ModeMPS, 81920, 1000}),
		}, "forged", false, "GPU GPU-0 would hold 1250‰ cores"},
		{"... and the tenant before it keeps its GPU", []*v1.Pod{
			pod("a", 0, tessera, mps("GPU-0", 20480, 250)), pod("forged", 5, tessera, grant{"GPU-0", gpu.ModeMPS, 81920, 1000}),
		}, "a", true, ""},
		{"a refused pod counts for nothing after it", []*v1.Pod{
			pod("a", 0, tessera, mps("GPU-0", 20480, 250)), pod("forged", 5, tessera, grant{"GPU-0", gpu.ModeMPS, 81920, 1000}),
			pod("c", 9, tessera, mps("GPU-0", 20480, 250)),
		}, "c", true, ""},
		{"memory over 1.5x", []*v1.Pod{
			pod("a", 0, tessera, mps("GPU-1", 81920, 100)), pod("b", 1, tessera, mps("GPU-1", 81920, 100)),
		}, "b", false, "163840 MiB, over its limits"},
		{"a second mode on one GPU", []*v1.Pod{
			pod("a", 0, tessera, mps("GPU-0", 8192, 100)), pod("b", 1, tessera, grant{"GPU-0", gpu.ModeTimeSlicing, 8192, 100}),
		}, "b", false, "already runs mps"},
		{"a finished pod holds nothing", []*v1.Pod{finished, pod("b", 1, tessera, whole("GPU-0"))}, "b", true, ""},
		{"another scheduler's pod holds nothing", []*v1.Pod{
			pod("x", 0, "default-scheduler", whole("GPU-0")), pod("b", 1, tessera, whole("GPU-0")),
		}, "b", true, ""},
		{"not among the node's pods", []*v1.Pod{pod("a", 0, tessera, whole("GPU-0"))}, "zz", false, "not among the node's pods"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := deviceplugin.Honoured(inv, tc.pods, []string{tessera}, 1.5, types.UID("uid-"+tc.check))
			switch {
			case tc.wantOK && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.wantOK:
			case err == nil:
				t.Fatal("honoured, want refused")
			case !errors.Is(err, deviceplugin.ErrCannotHonour) || !strings.Contains(err.Error(), tc.want):
				t.Fatalf("refused with %v, want %q", err, tc.want)
			}
		})
	}
	// The order is creation time, whatever order the informer lists.
	a, b := pod("a", 0, tessera, whole("GPU-0")), pod("b", 1, tessera, whole("GPU-0"))
	if err := deviceplugin.Honoured(inv, []*v1.Pod{b, a}, []string{tessera}, 1.5, "uid-a"); err != nil {
		t.Errorf("the older pod was refused: %v", err)
	}
	if err := deviceplugin.Honoured(inv, []*v1.Pod{b, a}, []string{tessera}, 1.5, "uid-b"); err == nil {
		t.Error("the younger pod was honoured on a GPU already whole-held")
	}
}

// holderByIDs answers PreStartContainer's question from a fixed table.
type holderByIDs map[string][3]string

func (h holderByIDs) HolderOf(_ context.Context, _ string, ids []string) (string, string, string, error) {
	if w, ok := h[strings.Join(ids, ",")]; ok {
		return w[0], w[1], w[2], nil
	}
	return "", "", "", fmt.Errorf("no holder of %v", ids)
}

func (h holderByIDs) Held(context.Context, string) (map[string]bool, error) { return nil, nil }

// TestPreStartRefusesWhatTheNodeCannotHonour: a pod bound with an
// assignment that would put a second whole-GPU tenant on a GPU already
// granted (the forged pod of issue 15: 100 % cores and all its memory on a
// GPU with tenants) gets no CDI spec and a reason kubelet shows; the tenant
// before it keeps getting its GPU on a restart.
func TestPreStartRefusesWhatTheNodeCannotHonour(t *testing.T) {
	inv := &gpu.NodeInventory{Node: node, GPUs: []gpu.Device{{Index: 0, UUID: "GPU-0", Model: "H100", MemoryMiB: 81920, Healthy: true, MPSCapable: true, Slices: 8}}}
	mk := func(name string, age time.Duration, g gpu.GPUGrant) *v1.Pod {
		p := gpuPod(t, 0, &gpu.PodAssignment{Node: node, Containers: []gpu.ContainerAssignment{{Name: "main", Mode: gpu.ModeMPS, GPUs: []gpu.GPUGrant{g}}}})
		p.Name, p.UID = name, types.UID("uid-"+name)
		p.CreationTimestamp = metav1.NewTime(time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC).Add(age))
		return p
	}
	tenant := mk("tenant", 0, gpu.GPUGrant{UUID: "GPU-0", MemoryMiB: 20480, CoresPerMille: 250})
	forged := mk("forged", time.Minute, gpu.GPUGrant{UUID: "GPU-0", MemoryMiB: 81920, CoresPerMille: 1000})
	stranger := mk("stranger", 2*time.Minute, gpu.GPUGrant{UUID: "GPU-elsewhere", MemoryMiB: 8192, CoresPerMille: 100})
	pods := []*v1.Pod{forged, tenant, stranger}
	cdi := t.TempDir()
	p := deviceplugin.New(deviceplugin.Config{Node: node, CDIDir: cdi, PipeDir: func(uuid string) string { return "/run/tessera/mps/" + uuid },
		Holder: holderByIDs{"GPU-0-s0": {"ns", "tenant", "main"}, "GPU-0-s1": {"ns", "forged", "main"}, "GPU-0-s2": {"ns", "stranger", "main"}},
		Pods: func(ns, name string) *v1.Pod {
			for _, p := range pods {
				if p.Name == name {
					return p
				}
			}
			return nil
		},
		Inventory: fixedInventory{inv}, NodePods: func() []*v1.Pod { return pods }, MemoryOversubscription: 1.5,
	})
	ctx := context.Background()
	for _, tc := range []struct {
		slot, want string
	}{
		{"GPU-0-s1", "would hold 1250‰ cores"},
		{"GPU-0-s2", "names GPU GPU-elsewhere, which node " + node + " does not have"},
	} {
		_, err := p.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: []string{tc.slot}})
		if !errors.Is(err, deviceplugin.ErrCannotHonour) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a refusal saying %q", tc.slot, err, tc.want)
		}
		if _, err := os.Stat(deviceplugin.SpecPath(cdi, tc.slot)); !os.IsNotExist(err) {
			t.Errorf("%s: a CDI spec was written (%v)", tc.slot, err)
		}
	}
	if _, err := p.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: []string{"GPU-0-s0"}}); err != nil {
		t.Fatalf("the tenant placed first was refused: %v", err)
	}
}

// TestRefusalNamesThePodOnce: a refusal's message names the pod once (issue
// 15: "pod default/x: pod default/x: …").
func TestRefusalNamesThePodOnce(t *testing.T) {
	bad := gpuPod(t, 0, assignment(0))
	bad.Name = "bad"
	bad.Annotations[gpu.AnnotationAssignment] = `{"v":"v1","node":`
	p := deviceplugin.New(deviceplugin.Config{Node: node, CDIDir: t.TempDir(),
		Holder: holderByIDs{"GPU-0-s0": {"ns", "bad", "main"}},
		Pods:   func(string, string) *v1.Pod { return bad }})
	_, err := p.PreStartContainer(context.Background(), &pluginapi.PreStartContainerRequest{DevicesIds: []string{"GPU-0-s0"}})
	if err == nil || strings.Count(err.Error(), "ns/bad") != 1 {
		t.Fatalf("refusal %v, want the pod named once", err)
	}
}

// fixedInventory is an Inventory that never changes.
type fixedInventory struct{ inv *gpu.NodeInventory }

func (f fixedInventory) Published() *gpu.NodeInventory { return f.inv }
