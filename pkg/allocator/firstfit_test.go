package allocator

import (
	"testing"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// TestFirstFit: upstream DRA's choice, as the simulator replays it —
// the node with the most CPU and memory free after the pod (GPUs aside),
// and there the lowest-indexed GPU that fits, however full the others.
func TestFirstFit(t *testing.T) {
	cfg := config.Default().Allocator
	cfg.Policy = config.PolicyFirstFit
	a, err := New(&cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	node := func(name string, cpuUsed int64) *Node {
		var gpus []gpu.Device
		for i := range 4 {
			gpus = append(gpus, gpu.Device{Index: i, UUID: name + "-" + string(rune('0'+i)), Model: "H100", MemoryMiB: 81920, Healthy: true})
		}
		n, err := NewNode(&gpu.NodeInventory{Node: name, CPUMilli: 64000, MemoryMiB: 512 << 10, GPUs: gpus})
		if err != nil {
			t.Fatal(err)
		}
		n.CPUUsed = cpuUsed
		return n
	}
	busy, idle := node("busy", 32000), node("idle", 0)
	quarter := &Request{Sharing: gpu.ModeTimeSlicing, CPUMilli: 1000, Containers: []Container{{Name: "main", Count: 1, MemoryMiB: 8192, Cores: 250}}}
	var p Placement
	for k := range 3 {
		best := a.Choose([]*Node{busy, idle}, quarter, &p)
		if best != 1 {
			t.Fatalf("slice %d went to node %d; want the one with more CPU free (idle)", k, best)
		}
		if len(p.Grants) != 1 || p.Grants[0].GPU != 0 {
			t.Fatalf("slice %d: grants %+v; want GPU 0, the first that fits", k, p.Grants)
		}
		idle.Apply(quarter, &p)
	}
	// GPU 0 holds three quarters; a half no longer fits it: GPU 1 next.
	half := &Request{Sharing: gpu.ModeTimeSlicing, Containers: []Container{{Name: "main", Count: 1, MemoryMiB: 8192, Cores: 500}}}
	if reason := a.Place(idle, half, &p); !reason.OK() || p.Grants[0].GPU != 1 {
		t.Errorf("a half after three quarters on GPU 0: %+v (%v); want GPU 1", p.Grants, reason)
	}
	if config.KnownPolicy(config.PolicyFirstFit) {
		t.Error("first-fit is a scheduler policy; it is the simulator's baseline only")
	}
}
