package soak

import (
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

func asg(node string, mode gpu.SharingMode, grants ...gpu.GPUGrant) *gpu.PodAssignment {
	return &gpu.PodAssignment{Node: node, Containers: []gpu.ContainerAssignment{{Name: "main", Mode: mode, GPUs: grants}}}
}

// TestSafety: each invariant, broken once, is reported; the healthy state
// is not.
func TestSafety(t *testing.T) {
	t0 := time.Unix(1000, 0)
	inv := &gpu.NodeInventory{Node: "n1", GPUs: []gpu.Device{
		{Index: 0, UUID: "G0", MemoryMiB: 80000, Healthy: true},
		{Index: 1, UUID: "G1", MemoryMiB: 80000, Healthy: true},
	}}
	ts := func(mem int64, cores int) gpu.GPUGrant {
		return gpu.GPUGrant{UUID: "G0", MemoryMiB: mem, CoresPerMille: cores}
	}
	running := func(name string, a *gpu.PodAssignment) PodState {
		return PodState{Namespace: "soak", Name: name, UID: "u-" + name, Node: "n1", Phase: "Running", Created: t0, Bound: t0, Assignment: a}
	}
	node := func(slots map[string][]string, visible map[string]string) NodeState {
		return NodeState{Name: "n1", Inventory: inv, Slots: slots, Visible: visible}
	}
	fine := node(map[string][]string{"soak/a/main": {"G0-s0"}, "soak/b/main": {"G0-s1"}}, map[string]string{"G0-s0": "G0", "G0-s1": "G0"})
	for _, tc := range []struct {
		name string
		s    State
		want string
	}{
		{"two tenants within the GPU", State{At: t0, Nodes: []NodeState{fine},
			Pods: []PodState{running("a", asg("n1", gpu.ModeTimeSlicing, ts(40000, 500))), running("b", asg("n1", gpu.ModeTimeSlicing, ts(40000, 500)))}}, ""},
		{"cores over 100 %", State{At: t0, Nodes: []NodeState{fine},
			Pods: []PodState{running("a", asg("n1", gpu.ModeTimeSlicing, ts(1000, 600))), running("b", asg("n1", gpu.ModeTimeSlicing, ts(1000, 500)))}}, "cores ≤ 100 %"},
		{"memory over the oversubscription", State{At: t0, Nodes: []NodeState{fine},
			Pods: []PodState{running("a", asg("n1", gpu.ModeTimeSlicing, ts(70000, 100))), running("b", asg("n1", gpu.ModeTimeSlicing, ts(70000, 100)))}}, "memory ≤ capacity"},
		{"two modes", State{At: t0, Nodes: []NodeState{fine},
			Pods: []PodState{running("a", asg("n1", gpu.ModeTimeSlicing, ts(1000, 100))), running("b", asg("n1", gpu.ModeMPS, ts(1000, 100)))}}, "one sharing mode"},
		{"two exclusive owners", State{At: t0, Nodes: []NodeState{fine},
			Pods: []PodState{running("a", asg("n1", gpu.ModeExclusive, gpu.GPUGrant{UUID: "G0"})), running("b", asg("n1", gpu.ModeExclusive, gpu.GPUGrant{UUID: "G0"}))}}, "one exclusive owner"},
		{"a finished pod and a reclaimed victim hold nothing", State{At: t0, Nodes: []NodeState{{Name: "n1", Inventory: &gpu.NodeInventory{Node: "n1", GPUs: inv.GPUs, Reclaimed: []string{"u-b"}}}},
			Pods: []PodState{
				func() PodState {
					p := running("a", asg("n1", gpu.ModeExclusive, gpu.GPUGrant{UUID: "G0"}))
					p.Phase = "Succeeded"
					return p
				}(),
				func() PodState {
					p := running("b", asg("n1", gpu.ModeExclusive, gpu.GPUGrant{UUID: "G0"}))
					p.Deleting = true
					return p
				}(),
				running("c", asg("n1", gpu.ModeExclusive, gpu.GPUGrant{UUID: "G0"}))}}, ""},
		{"one slot, two holders", State{At: t0, Nodes: []NodeState{node(map[string][]string{"soak/a/main": {"G0-s0"}, "soak/b/main": {"G0-s0"}}, map[string]string{"G0-s0": "G0"})},
			Pods: []PodState{running("a", asg("n1", gpu.ModeTimeSlicing, ts(1000, 100))), running("b", asg("n1", gpu.ModeTimeSlicing, ts(1000, 100)))}}, "one holder per slot"},
		{"a spec showing another GPU", State{At: t0, Nodes: []NodeState{node(map[string][]string{"soak/a/main": {"G0-s0"}}, map[string]string{"G0-s0": "G1"})},
			Pods: []PodState{running("a", asg("n1", gpu.ModeTimeSlicing, ts(1000, 100)))}}, "CDI spec equals assignment"},
		{"a running container without its spec", State{At: t0, Nodes: []NodeState{node(map[string][]string{"soak/a/main": {"G0-s0"}}, map[string]string{})},
			Pods: []PodState{running("a", asg("n1", gpu.ModeTimeSlicing, ts(1000, 100)))}}, "has no CDI spec"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Checker{Oversubscription: 1.5, Grace: time.Second}
			got := c.Safety(tc.s)
			if tc.want == "" && len(got) > 0 || tc.want != "" && (len(got) == 0 || !strings.Contains(got[0].String(), tc.want)) {
				t.Errorf("violations %v, want %q", got, tc.want)
			}
		})
	}
}

// TestUnhealthyGPUPlacement: a placement bound after the GPU was seen
// unhealthy for longer than the grace is a violation; one bound within the
// grace (the scheduler had not seen the inventory yet) is not.
func TestUnhealthyGPUPlacement(t *testing.T) {
	t0 := time.Unix(1000, 0)
	sick := &gpu.NodeInventory{Node: "n1", GPUs: []gpu.Device{{Index: 0, UUID: "G0", MemoryMiB: 80000, Healthy: false}}}
	c := &Checker{Oversubscription: 1.5, Grace: 2 * time.Second}
	if v := c.Safety(State{At: t0, Nodes: []NodeState{{Name: "n1", Inventory: sick}}}); len(v) != 0 {
		t.Fatal(v)
	}
	pod := func(bound time.Time) PodState {
		return PodState{Namespace: "soak", Name: "a", Node: "n1", Phase: "Pending", Bound: bound,
			Assignment: asg("n1", gpu.ModeExclusive, gpu.GPUGrant{UUID: "G0"})}
	}
	if v := c.Safety(State{At: t0.Add(time.Second), Nodes: []NodeState{{Name: "n1", Inventory: sick}}, Pods: []PodState{pod(t0.Add(time.Second))}}); len(v) != 0 {
		t.Errorf("within the grace: %v", v)
	}
	if v := c.Safety(State{At: t0.Add(5 * time.Second), Nodes: []NodeState{{Name: "n1", Inventory: sick}}, Pods: []PodState{pod(t0.Add(5 * time.Second))}}); len(v) != 1 {
		t.Errorf("after the grace: %v, want one violation", v)
	}
}

// TestLiveness: pods older than the bound run, succeeded, or wait with a
// reason.
func TestLiveness(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := t0.Add(time.Minute)
	pods := []PodState{
		{Name: "running", Phase: "Running", Created: t0},
		{Name: "waiting", Phase: "Pending", Created: t0, PendingReason: "0/3 nodes are available"},
		{Name: "young", Phase: "Pending", Created: at.Add(-time.Second)},
		{Name: "silent", Phase: "Pending", Created: t0},
		{Name: "stuck", Phase: "Pending", Created: t0, Node: "n1", Bound: t0, Assignment: asg("n1", gpu.ModeExclusive)},
		{Name: "failed", Phase: "Failed", Created: t0},
	}
	var got []string
	for _, v := range Liveness(State{At: at, Pods: pods}, 30*time.Second) {
		got = append(got, v.Detail)
	}
	if len(got) != 3 || !strings.Contains(strings.Join(got, ";"), "silent") || !strings.Contains(strings.Join(got, ";"), "stuck") || !strings.Contains(strings.Join(got, ";"), "failed") {
		t.Errorf("liveness %v, want silent, stuck and failed", got)
	}
}

// TestClaimPodsChecked: a pod's gpu.tessera.dev claims become its
// assignment (as the driver prepares them), so the per-GPU invariants
// count claims with device-plugin pods, and a running claim pod's claim
// spec must show its claim's GPU.
func TestClaimPodsChecked(t *testing.T) {
	t0 := time.Unix(1000, 0)
	inv := &gpu.NodeInventory{Node: "n1", DRA: true, GPUs: []gpu.Device{
		{Index: 0, UUID: "G0", MemoryMiB: 80000, Healthy: true},
		{Index: 1, UUID: "G1", MemoryMiB: 80000, Healthy: true},
	}}
	claim := func(name, uid, pod, device string, cores int64) resourceapi.ResourceClaim {
		share := types.UID("s-" + name)
		return resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(uid)}, Status: resourceapi.ResourceClaimStatus{
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod, UID: types.UID("u-" + pod)}},
			Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
				Driver: gpu.DRADriver, Pool: "n1", Device: device, ShareID: &share, ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{
					gpu.DRAMemory: resource.MustParse("8Gi"), gpu.DRACores: *resource.NewQuantity(cores, resource.DecimalSI)}}}}}}}
	}
	pod := func(name, claimName string) PodState {
		return PodState{Namespace: "soak", Name: name, UID: "u-" + name, Node: "n1", Phase: "Running", Created: t0, Bound: t0, ClaimNames: []string{claimName}, RunningAfter: true}
	}
	for _, tc := range []struct {
		name    string
		claims  []resourceapi.ResourceClaim
		visible map[string]string
		want    string
	}{
		{"two slices within the GPU", []resourceapi.ResourceClaim{claim("ca", "c-a", "a", "gpu-0", 60), claim("cb", "c-b", "b", "gpu-0", 40)},
			map[string]string{"c-a": "G0", "c-b": "G0"}, ""},
		{"claims over 100 % of the cores", []resourceapi.ResourceClaim{claim("ca", "c-a", "a", "gpu-0", 60), claim("cb", "c-b", "b", "gpu-0", 50)},
			map[string]string{"c-a": "G0", "c-b": "G0"}, "cores ≤ 100 %"},
		{"a whole-GPU claim and a slice", []resourceapi.ResourceClaim{claim("ca", "c-a", "a", "gpu-1", 100), claim("cb", "c-b", "b", "gpu-1", 10)},
			map[string]string{"c-a": "G1", "c-b": "G1"}, "one sharing mode"},
		{"a claim's spec on another GPU", []resourceapi.ResourceClaim{claim("ca", "c-a", "a", "gpu-0", 60), claim("cb", "c-b", "b", "gpu-1", 40)},
			map[string]string{"c-a": "G0", "c-b": "G0"}, "CDI spec equals assignment"},
		{"a running claim pod without its spec", []resourceapi.ResourceClaim{claim("ca", "c-a", "a", "gpu-0", 60), claim("cb", "c-b", "b", "gpu-1", 40)},
			map[string]string{"c-a": "G0"}, "has no CDI spec"},
		// Listed running, gone from a list taken after the specs were
		// read: it ended meanwhile, its claim unprepared.
		{"a pod that ended while the specs were read", []resourceapi.ResourceClaim{claim("ca", "c-a", "a", "gpu-0", 60), claim("cb", "c-b", "b!ended", "gpu-1", 40)},
			map[string]string{"c-a": "G0"}, ""},
		{"a claim reserved for another pod is not this one's", []resourceapi.ResourceClaim{claim("ca", "c-a", "a", "gpu-0", 60), claim("cb", "c-b", "z", "gpu-0", 90)},
			map[string]string{"c-a": "G0", "c-b": "G0"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := pod("b", "cb")
			if tc.claims[1].Status.ReservedFor[0].Name == "b!ended" {
				tc.claims[1].Status.ReservedFor[0].UID = types.UID(b.UID)
				b.RunningAfter = false
			}
			s := State{At: t0, Nodes: []NodeState{{Name: "n1", Inventory: inv, ClaimVisible: tc.visible}},
				Pods: []PodState{pod("a", "ca"), b}}
			claimAssignments(&s, tc.claims)
			c := &Checker{Oversubscription: 1.5, Grace: time.Second}
			var got []string
			for _, v := range c.Safety(s) {
				got = append(got, v.String())
			}
			joined := strings.Join(got, "\n")
			if tc.want == "" && len(got) > 0 || tc.want != "" && !strings.Contains(joined, tc.want) {
				t.Errorf("violations:\n%s\nwant %q", joined, tc.want)
			}
		})
	}
}
