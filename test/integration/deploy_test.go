package integration

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"

	v1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// TestShippedPriorityClasses creates deploy/priorityclasses.yaml on the real
// API server: every class is accepted as written (a preemptionPolicy the API
// does not know, such as "Always", would be refused here).
func TestShippedPriorityClasses(t *testing.T) {
	c := startCluster(t)
	b, err := os.ReadFile("../../deploy/priorityclasses.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	want := map[string]bool{"gpu-critical": true, "gpu-standard": true, "gpu-batch": true}
	for {
		var pc schedulingv1.PriorityClass
		if err := dec.Decode(&pc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		got, err := c.client.SchedulingV1().PriorityClasses().Create(c.ctx, &pc, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("%s: %v", pc.Name, err)
		}
		if got.PreemptionPolicy == nil || *got.PreemptionPolicy != *pc.PreemptionPolicy {
			t.Errorf("%s: preemptionPolicy %v", pc.Name, got.PreemptionPolicy)
		}
		delete(want, pc.Name)
	}
	if len(want) != 0 {
		t.Fatalf("missing classes %v", want)
	}
	bad := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "always"}, Value: 10}
	always := v1.PreemptionPolicy("Always")
	bad.PreemptionPolicy = &always
	if _, err := c.client.SchedulingV1().PriorityClasses().Create(c.ctx, bad, metav1.CreateOptions{}); err == nil {
		t.Fatal(`the API server accepted preemptionPolicy "Always"`)
	}
}
