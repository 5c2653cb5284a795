package isolation

import (
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// TestIsolationCondition: the pod's condition is True only when every
// dimension of every slice is held, and says what is only accounted.
func TestIsolationCondition(t *testing.T) {
	held := gpu.Guarantee{Memory: gpu.MechanismKernel, Compute: gpu.MechanismDevice}
	loose := gpu.Guarantee{Memory: gpu.MechanismMPSClient, Compute: gpu.MechanismNone}
	for _, tc := range []struct {
		name   string
		gs     []gpu.SliceGuarantee
		status v1.ConditionStatus
		reason string
		says   string
	}{
		{"all held", []gpu.SliceGuarantee{{Container: "main", GPU: "GPU-a", Guarantee: held}}, v1.ConditionTrue, "Enforced", "main on GPU-a: memory=kernel,compute=device"},
		{"one dimension loose", []gpu.SliceGuarantee{{Container: "main", GPU: "GPU-a", Guarantee: held}, {Container: "side", GPU: "GPU-b", Guarantee: loose}},
			v1.ConditionFalse, "PartlyAccounted", "(none: accounted by the scheduler, not held;"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := isolationCondition(tc.gs, time.Unix(0, 0))
			if c.Type != ConditionGPUIsolation || c.Status != tc.status || c.Reason != tc.reason || !strings.Contains(c.Message, tc.says) {
				t.Errorf("condition %+v, want %s %s saying %q", c, tc.status, tc.reason, tc.says)
			}
		})
	}
}

func TestMPSClientsOf(t *testing.T) {
	pod := func(name string, mode gpu.SharingMode, uuid string) *v1.Pod {
		enc, err := gpu.EncodeAssignment(&gpu.PodAssignment{Node: "n1", Containers: []gpu.ContainerAssignment{{Name: "m", Mode: mode,
			GPUs: []gpu.GPUGrant{{UUID: uuid, MemoryMiB: 1024, CoresPerMille: 100}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Annotations: map[string]string{gpu.AnnotationAssignment: enc}},
			Spec: v1.PodSpec{NodeName: "n1"}, Status: v1.PodStatus{Phase: v1.PodRunning}}
	}
	pods := []*v1.Pod{pod("z", gpu.ModeMPS, "GPU-a"), pod("a", gpu.ModeMPS, "GPU-a"), pod("ts", gpu.ModeTimeSlicing, "GPU-a"), pod("other", gpu.ModeMPS, "GPU-b"),
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cpu"}}}
	if got := MPSClientsOf(pods, "GPU-a"); !slices.Equal(got, []string{"ns/a", "ns/z"}) {
		t.Errorf("MPS clients of GPU-a: %v, want [ns/a ns/z]", got)
	}
}
