package soak

import (
	"strings"
	"testing"
	"time"

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
