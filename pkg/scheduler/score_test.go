package scheduler

import (
	"testing"

	fwk "k8s.io/kube-scheduler/framework"
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
