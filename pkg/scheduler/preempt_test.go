package scheduler

import (
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/scheduler/cache"
	"github.com/tessera-gpu/tessera/pkg/scheduler/schedtest"
)

func cand(name string, prio int32, gpuSeconds float64, a *gpu.PodAssignment) candidate {
	return candidate{pod: &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: map[string]string{"app": name}}},
		assignment: a, priority: prio, gpuSeconds: gpuSeconds}
}

// TestSelectVictims: the victims are what remains after putting back, most
// important first, every candidate the pod can do without.
func TestSelectVictims(t *testing.T) {
	const n = "n1"
	ts := gpu.ModeTimeSlicing
	tests := []struct {
		name   string
		fixed  []*gpu.PodAssignment // pods that may not be evicted
		cands  []candidate
		req    *allocator.Request
		want   []string
		wantOK bool
	}{
		{
			name: "the cheapest of the lowest priority goes; the higher priority and the costlier stay",
			cands: []candidate{
				cand("s1-prio5", 5, 10, schedtest.Grant(n, 0, 16384, 400, ts)),
				cand("s2-prio1-cheap", 1, 10, schedtest.Grant(n, 0, 16384, 400, ts)),
				cand("whole-prio1-costly", 1, 1e6, schedtest.Grant(n, 1, 81920, 1000, gpu.ModeExclusive)),
			},
			req:  schedtest.SliceOf(ts, 40960, 50),
			want: []string{"s2-prio1-cheap"}, wantOK: true,
		},
		{
			name:   "room without evicting anyone: no victims",
			cands:  []candidate{cand("small", 1, 1, schedtest.Grant(n, 0, 8192, 100, ts))},
			req:    schedtest.WholeGPUs(1),
			want:   nil,
			wantOK: true,
		},
		{
			name:  "two whole GPUs cannot be freed while a pod it may not evict holds one",
			fixed: []*gpu.PodAssignment{schedtest.Grant(n, 1, 81920, 1000, gpu.ModeExclusive)},
			cands: []candidate{cand("low", 0, 1, schedtest.Grant(n, 0, 81920, 1000, gpu.ModeExclusive))},
			req:   schedtest.WholeGPUs(2),
		},
		{
			name: "several small victims when one GPU must be emptied",
			cands: []candidate{
				cand("a", 0, 3, schedtest.Grant(n, 0, 8192, 200, ts)),
				cand("b", 0, 2, schedtest.Grant(n, 0, 8192, 200, ts)),
				cand("c", 0, 1, schedtest.Grant(n, 0, 8192, 200, ts)),
			},
			fixed:  []*gpu.PodAssignment{schedtest.Grant(n, 1, 81920, 1000, gpu.ModeExclusive)},
			req:    schedtest.WholeGPUs(1),
			want:   []string{"a", "b", "c"},
			wantOK: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			node, err := allocator.NewNode(schedtest.Inventory(n, 2, 81920, false))
			if err != nil {
				t.Fatal(err)
			}
			node.CPUMilli, node.MemoryMiB = cache.Unlimited, cache.Unlimited
			for _, a := range tt.fixed {
				if err := node.AddAssignment(a, 0, 0, 1.5); err != nil {
					t.Fatal(err)
				}
			}
			for _, c := range tt.cands {
				if err := node.AddAssignment(c.assignment, 0, 0, 1.5); err != nil {
					t.Fatal(err)
				}
			}
			before := node.Clone()
			victims, ok := selectVictims(schedtest.NewAllocator(t), node, tt.req, tt.cands, 1.5)
			if ok != tt.wantOK {
				t.Fatalf("ok %v, want %v", ok, tt.wantOK)
			}
			var got []string
			for _, v := range victims {
				got = append(got, v.pod.Name)
			}
			slices.Sort(got)
			if !slices.Equal(got, tt.want) {
				t.Errorf("victims %v, want %v", got, tt.want)
			}
			if node.Version != before.Version {
				t.Error("selectVictims changed the node it was given")
			}
		})
	}
}

// TestBudgets: a budget's allowed disruptions bound how many of its pods
// one preemption takes.
func TestBudgets(t *testing.T) {
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "b", Namespace: "ns", UID: "pdb"},
		Spec:   policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "b"}}}}},
		Status: policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: 1}}
	pdbs := []*policyv1.PodDisruptionBudget{pdb}
	a, b, c := cand("a", 0, 0, nil), cand("b", 0, 0, nil), cand("c", 0, 0, nil)
	if !disruptionAllowed(a.pod, pdbs) || !withinBudgets([]candidate{a, c}, pdbs) {
		t.Error("one disruption allowed, one taken: refused")
	}
	if withinBudgets([]candidate{a, b}, pdbs) {
		t.Error("two pods of a budget allowing one: accepted")
	}
	pdb.Status.DisruptionsAllowed = 0
	if disruptionAllowed(a.pod, pdbs) || !disruptionAllowed(c.pod, pdbs) {
		t.Error("a budget allowing none must protect its pods, and only them")
	}
}

func TestBetterNodeChoice(t *testing.T) {
	one := nodeChoice{node: "z", victims: []candidate{cand("x", 5, 1, nil)}}
	two := nodeChoice{node: "a", victims: []candidate{cand("x", 0, 1, nil), cand("y", 0, 1, nil)}}
	lowPrio := nodeChoice{node: "y", victims: []candidate{cand("x", 1, 100, nil)}}
	cheap := nodeChoice{node: "x", victims: []candidate{cand("x", 1, 10, nil)}}
	if !better(one, two) || !better(lowPrio, one) || !better(cheap, lowPrio) {
		t.Error("want fewest victims, then lowest priority, then least GPU time")
	}
}
