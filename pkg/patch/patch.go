// Package patch builds the JSON patches Tessera's components send to the
// API server from typed values, so that no value is ever quoted by hand: a
// message holding a control character or a quote stays valid JSON (Go's %q
// writes \x07, which JSON does not have).
package patch

import (
	"encoding/json"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Annotations is a JSON merge patch (types.MergePatchType) setting each
// annotation given a value and removing each given nil. With a
// resourceVersion it applies only to that version of the object (the API
// server answers Conflict otherwise).
func Annotations(resourceVersion string, set map[string]*string) []byte {
	meta := map[string]any{"annotations": set}
	if resourceVersion != "" {
		meta["resourceVersion"] = resourceVersion
	}
	return mustMarshal(map[string]any{"metadata": meta})
}

// PodCondition is a strategic merge patch (types.StrategicMergePatchType,
// on the status subresource) putting one condition, merged by its type.
func PodCondition(c v1.PodCondition) []byte {
	return mustMarshal(map[string]any{"status": map[string]any{"conditions": []v1.PodCondition{c}}})
}

// NodeResource is a strategic merge patch of a Node's status setting one
// extended resource's capacity and allocatable.
func NodeResource(name v1.ResourceName, capacity, allocatable int64) []byte {
	return mustMarshal(map[string]any{"status": map[string]any{
		"capacity":    v1.ResourceList{name: *resource.NewQuantity(capacity, resource.DecimalSI)},
		"allocatable": v1.ResourceList{name: *resource.NewQuantity(allocatable, resource.DecimalSI)},
	}})
}

// mustMarshal marshals values that always marshal (strings, maps of
// strings, API types).
func mustMarshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
