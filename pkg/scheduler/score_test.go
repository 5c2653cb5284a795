package scheduler

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/scheduler/schedtest"
)

func TestNormalizeScoreKeepsTheBestUnique(t *testing.T) {
	p := &Plugin{}
	scores := fwk.NodeScoreList{{Name: "a", Score: 57_000_000}, {Name: "b", Score: 57_001_000}, {Name: "c", Score: 0}, {Name: "d", Score: 57_001_000}}
	if st := p.NormalizeScore(nil, nil, nil, scores); st != nil {
		t.Fatal(st)
	}
	want := []int64{98, 100, 0, 100}
	for i, s := range scores {
		if s.Score != want[i] {
			t.Errorf("%s: %d, want %d", s.Name, s.Score, want[i])
		}
	}
	same := fwk.NodeScoreList{{Name: "a", Score: 5}, {Name: "b", Score: 5}}
	p.NormalizeScore(nil, nil, nil, same)
	if same[0].Score != 100 || same[1].Score != 100 {
		t.Errorf("equal scores: %v", same)
	}
}

func TestScore(t *testing.T) {
	busy := schedtest.InventoryNode(t, schedtest.Inventory("busy", 2, 81920, false))
	idle := schedtest.InventoryNode(t, schedtest.Inventory("idle", 2, 81920, false))
	for _, c := range []struct {
		policy, want string
	}{
		{"binpack", "busy"},
		{"spread", "idle"},
	} {
		t.Run(c.policy, func(t *testing.T) {
			h := newHarness(t, `{"policy":"`+c.policy+`"}`, []*v1.Node{busy, idle}, schedtest.GPUPod(t, "holder", "busy", 0))
			pod := wholeGPUPod("one", "1")
			state, st := h.preFilter(pod)
			if !st.IsSuccess() {
				t.Fatal(st)
			}
			if st := h.p.PreScore(h.ctx, state, pod, nil); !st.IsSuccess() {
				t.Fatal(st)
			}
			var scores fwk.NodeScoreList
			for _, n := range []string{"busy", "idle"} {
				s, st := h.p.Score(h.ctx, state, pod, h.nodeInfo(n))
				if !st.IsSuccess() {
					t.Fatal(st)
				}
				scores = append(scores, fwk.NodeScore{Name: n, Score: s})
			}
			if st := h.p.NormalizeScore(h.ctx, state, pod, scores); !st.IsSuccess() {
				t.Fatal(st)
			}
			best := scores[0]
			for _, s := range scores {
				if s.Score < 0 || s.Score > fwk.MaxNodeScore {
					t.Fatalf("normalized score %d outside 0–%d", s.Score, fwk.MaxNodeScore)
				}
				if s.Score > best.Score {
					best = s
				}
			}
			if best.Name != c.want || best.Score != fwk.MaxNodeScore {
				t.Fatalf("%s scores %v, want %s first at %d", c.policy, scores, c.want, fwk.MaxNodeScore)
			}
		})
	}
	t.Run("pod without GPUs", func(t *testing.T) {
		h := newHarness(t, "", []*v1.Node{busy})
		if st := h.p.PreScore(h.ctx, framework.NewCycleState(), &v1.Pod{}, nil); st.Code() != fwk.Skip {
			t.Fatalf("PreScore = %v, want Skip", st)
		}
	})
}
