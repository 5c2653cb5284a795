package dra

import (
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// TestContainersGiven: the containers given a claim, through the pod's
// entry that names it directly or, for a template's claim, the pod's
// status; init containers first; another entry's containers not.
func TestContainersGiven(t *testing.T) {
	direct, made := "shared-gpu", "train-gpu-x7k2p"
	pod := &v1.Pod{Spec: v1.PodSpec{
		ResourceClaims: []v1.PodResourceClaim{{Name: "shared", ResourceClaimName: &direct}, {Name: "gpu", ResourceClaimTemplateName: &direct}},
		InitContainers: []v1.Container{{Name: "warm", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}},
		Containers: []v1.Container{{Name: "main", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}},
			{Name: "side", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "shared"}}}}}},
		Status: v1.PodStatus{ResourceClaimStatuses: []v1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: &made}}}}
	for claim, want := range map[string][]string{made: {"warm", "main"}, direct: {"side"}, "other": nil} {
		if got := ContainersGiven(pod, claim); !slices.Equal(got, want) {
			t.Errorf("ContainersGiven(%s) = %v, want %v", claim, got, want)
		}
	}
}
