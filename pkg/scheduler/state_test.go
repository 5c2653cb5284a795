package scheduler

import "testing"

// TestCloneIsIndependent: a clone of a cycle's state is a new object even
// without nominated pods, so AddPod on it (the framework adds the nominated
// pods to a per-node clone while Filter runs on other nodes) never writes
// what other nodes' Filter reads; the rejection tally stays one per cycle.
func TestCloneIsIndependent(t *testing.T) {
	s := &stateData{rejected: &rejections{}}
	c, ok := s.Clone().(*stateData)
	if !ok || c == s {
		t.Fatal("Clone returned the original")
	}
	c.nominated = map[string][]nominatedPod{"n1": {{uid: "u1"}}}
	if s.nominated != nil {
		t.Error("a clone's nominated pods reached the original")
	}
	if c.rejected != s.rejected {
		t.Error("a clone has its own rejection tally; want the cycle's")
	}
	cc := c.Clone().(*stateData)
	cc.nominated["n1"] = append(cc.nominated["n1"], nominatedPod{uid: "u2"})
	if len(c.nominated["n1"]) != 1 {
		t.Error("a clone of a clone shares its nominated pods")
	}
}

// TestDominantRejection: the reason most nodes gave, ties by name, Other
// when Tessera refused nowhere.
func TestDominantRejection(t *testing.T) {
	var r rejections
	if got := r.dominant(); got != "Other" {
		t.Errorf("empty: %s", got)
	}
	for _, reason := range []string{"NoFragment", "SlicesFull", "NoFragment", "SlicesFull", "InsufficientSlots"} {
		r.add(reason)
	}
	if got := r.dominant(); got != "NoFragment" {
		t.Errorf("dominant %s, want NoFragment (tied with SlicesFull, first by name)", got)
	}
	var none *rejections
	none.add("x")
	if got := none.dominant(); got != "Other" {
		t.Errorf("nil tally: %s", got)
	}
}
