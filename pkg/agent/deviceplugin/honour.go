package deviceplugin

import (
	"errors"
	"fmt"
	"slices"
	"sort"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
)

// ErrCannotHonour says an assignment names a GPU the node does not have, or
// grants more than the node's GPUs hold once what was granted before it is
// counted: whoever wrote it, the agent does not hand it out.
var ErrCannotHonour = errors.New("this node cannot honour the pod's GPU assignment")

// Honoured checks the assignment of the pod with uid against the node's
// GPUs (inv) and everything granted before it, with the scheduler's own
// rules (allocator.Node.AddAssignment: GPUs the node has, Σ cores ≤ 100 %,
// Σ memory ≤ memory × oversub, one sharing mode per GPU). The node's live
// pods are counted in the order they were created (then by UID), each only
// if it was itself honoured, so a pod that arrives over a GPU's limits is
// the one refused, and never makes the tenants before it lose their GPUs on
// a container restart. Pods of no Tessera profile (schedulers) and pods
// whose assignment is not for this node count for nothing.
//
// It is pure: the plugin calls it with its informer's pods.
func Honoured(inv *gpu.NodeInventory, pods []*v1.Pod, schedulers []string, oversub float64, uid types.UID) error {
	node, err := allocator.NewNode(inv)
	if err != nil {
		return fmt.Errorf("the agent's own inventory: %w", err)
	}
	order := slices.Clone(pods)
	sort.SliceStable(order, func(i, j int) bool {
		ti, tj := order[i].CreationTimestamp, order[j].CreationTimestamp
		if !ti.Equal(&tj) {
			return ti.Before(&tj)
		}
		return order[i].UID < order[j].UID
	})
	for _, p := range order {
		if !slices.Contains(schedulers, p.Spec.SchedulerName) {
			continue
		}
		a, err := podgpu.BoundAssignment(p)
		if err != nil || a == nil || a.Node != inv.Node {
			if p.UID == uid {
				return fmt.Errorf("%w: it has no assignment for node %s", ErrCannotHonour, inv.Node)
			}
			continue
		}
		err = node.AddAssignment(a, 0, 0, oversub)
		if p.UID == uid {
			if err != nil {
				return fmt.Errorf("%w, counting the pods placed on it before: %v", ErrCannotHonour, err)
			}
			return nil
		}
	}
	return fmt.Errorf("%w: the pod is not among the node's pods yet", ErrCannotHonour)
}
