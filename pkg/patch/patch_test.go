package patch

import (
	"encoding/json"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
)

func ptr(s string) *string { return &s }

// asJSON is what a string becomes through JSON: invalid UTF-8 turns into
// U+FFFD, as the API server would store it.
func asJSON(s string) string {
	b, _ := json.Marshal(s)
	var out string
	_ = json.Unmarshal(b, &out)
	return out
}

// FuzzAnnotations: whatever the values (quotes, control characters,
// invalid UTF-8), the patch applied by JSON merge-patch to a pod sets and
// removes exactly the annotations given.
func FuzzAnnotations(f *testing.F) {
	f.Add("tessera.dev/notice", `{"preemptor":"ns/p"}`, "42")
	f.Add("a", "bell\x07 and \"quotes\" and \xff", "")
	f.Fuzz(func(t *testing.T, key, value, rv string) {
		if key == "" {
			return
		}
		pod := v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Annotations: map[string]string{"keep": "1", "drop": "2"}}}
		orig, _ := json.Marshal(pod)
		set := map[string]*string{key: ptr(value)}
		if key != "drop" {
			set["drop"] = nil
		}
		out, err := jsonpatch.MergePatch(orig, Annotations(rv, set))
		if err != nil {
			t.Fatalf("patch does not apply: %v", err)
		}
		var got v1.Pod
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatal(err)
		}
		// The key goes through JSON too (invalid UTF-8 becomes U+FFFD; the
		// API server refuses such keys anyway).
		k, wantValue := asJSON(key), asJSON(value)
		if got.Annotations[k] != wantValue {
			t.Errorf("annotation %q = %q, want %q", k, got.Annotations[k], wantValue)
		}
		if _, ok := got.Annotations["drop"]; ok && k != "drop" {
			t.Error("a removed annotation stayed")
		}
		if k != "keep" && got.Annotations["keep"] != "1" {
			t.Error("an untouched annotation changed")
		}
		if got.ResourceVersion != asJSON(rv) {
			t.Errorf("resourceVersion %q, want %q", got.ResourceVersion, rv)
		}
	})
}

// TestPodConditionMergesByType: the condition replaces the one of its type
// and leaves the others.
func TestPodConditionMergesByType(t *testing.T) {
	at := metav1.NewTime(time.Unix(1000, 0).UTC())
	pod := v1.Pod{Status: v1.PodStatus{Conditions: []v1.PodCondition{
		{Type: v1.PodReady, Status: v1.ConditionTrue},
		{Type: v1.DisruptionTarget, Status: v1.ConditionTrue, Reason: "old"},
	}}}
	orig, _ := json.Marshal(pod)
	out, err := strategicpatch.StrategicMergePatch(orig, PodCondition(v1.PodCondition{Type: v1.DisruptionTarget, Status: v1.ConditionFalse,
		Reason: "PreemptionCancelled", Message: "a \"quoted\" why\x07", LastTransitionTime: at}), v1.Pod{})
	if err != nil {
		t.Fatal(err)
	}
	var got v1.Pod
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Conditions) != 2 {
		t.Fatalf("conditions %+v", got.Status.Conditions)
	}
	for _, c := range got.Status.Conditions {
		if c.Type == v1.DisruptionTarget && (c.Status != v1.ConditionFalse || c.Message != "a \"quoted\" why\x07" || !c.LastTransitionTime.Equal(&at)) {
			t.Errorf("condition %+v", c)
		}
	}
}

func TestNodeResource(t *testing.T) {
	var got v1.Node
	if err := json.Unmarshal(NodeResource("tessera.dev/gpu", 64, 56), &got); err != nil {
		t.Fatal(err)
	}
	c, a := got.Status.Capacity["tessera.dev/gpu"], got.Status.Allocatable["tessera.dev/gpu"]
	if c.Value() != 64 || a.Value() != 56 {
		t.Errorf("capacity %v, allocatable %v", c.String(), a.String())
	}
}
