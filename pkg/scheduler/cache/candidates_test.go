package cache

import (
	"slices"
	"testing"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/scheduler/schedtest"
)

// TestCandidates: the nodes a shape is tried on are those whose inventory
// could hold it empty, plus those without a usable inventory; they follow
// inventories coming, changing and leaving.
func TestCandidates(t *testing.T) {
	c := New(1)
	a := schedtest.NewAllocator(t)
	set := func(inv *gpu.NodeInventory) {
		t.Helper()
		raw, err := gpu.EncodeInventory(inv)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.SetNode(string(raw), inv); err != nil {
			t.Fatal(err)
		}
	}
	set(schedtest.Inventory("mps", 2, 81920, true))
	set(schedtest.Inventory("ts", 2, 81920, false))
	c.SetBare("cpu", true)
	mpsSlice, whole, three := schedtest.SliceOf(gpu.ModeMPS, 10240, 20), schedtest.WholeGPUs(1), schedtest.WholeGPUs(3)
	names := func(x *CandidateSet) []string {
		if x.Nodes == nil {
			return nil
		}
		out := x.Nodes.UnsortedList()
		slices.Sort(out)
		return out
	}
	check := func(step string, r *allocator.Request, want []string, excluded map[string]allocator.Code) {
		t.Helper()
		got := c.Candidates(a, c.Shape(r.Key()), r)
		if !slices.Equal(names(got), want) {
			t.Errorf("%s: candidates %v, want %v", step, names(got), want)
		}
		have := map[string]allocator.Code{}
		for _, x := range got.Excluded {
			have[x.Name] = x.Reason.Code
		}
		if len(have) != len(excluded) {
			t.Errorf("%s: excluded %v, want %v", step, have, excluded)
		}
		for n, code := range excluded {
			if have[n] != code {
				t.Errorf("%s: %s excluded for %v, want %v", step, n, have[n], code)
			}
		}
		if got.Known != 3 {
			t.Errorf("%s: %d nodes known, want 3", step, got.Known)
		}
	}
	check("an MPS slice", mpsSlice, []string{"cpu", "mps"}, map[string]allocator.Code{"ts": allocator.NoMPS})
	check("a whole GPU: every node may", whole, nil, nil)
	check("more GPUs than a node has", three, []string{"cpu"}, map[string]allocator.Code{"mps": allocator.NotEnoughWholeGPUs, "ts": allocator.NotEnoughWholeGPUs})
	// A booking changes nothing: candidates look at the empty node.
	if _, reason, err := c.Reserve(a, "u1", "ml/p", "mps", whole); err != nil || !reason.OK() {
		t.Fatal(reason, err)
	}
	check("after a booking", mpsSlice, []string{"cpu", "mps"}, map[string]allocator.Code{"ts": allocator.NoMPS})
	set(schedtest.Inventory("ts", 2, 81920, true)) // its GPUs now run MPS
	check("the other node turned MPS-capable", mpsSlice, nil, nil)
	c.RemoveNode("ts")
	c.SetBare("ts", true)
	check("its inventory gone", three, []string{"cpu", "ts"}, map[string]allocator.Code{"mps": allocator.NotEnoughWholeGPUs})
}
