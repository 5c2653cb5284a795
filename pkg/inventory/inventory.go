// Package inventory publishes a node's GPU inventory on the API server and
// reads it back. The agent publishes; the scheduler reads through its node
// informer. The record is the versioned JSON of gpu.EncodeInventory in the
// node annotation tessera.dev/inventory: a node annotation needs no CRD to be
// installed, travels with the Node object the scheduler already watches, and
// disappears with the node.
package inventory

import (
	"context"
	"encoding/json"
	"fmt"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// FromNode reads the inventory a node carries: nil and no error when it
// carries none (not a Tessera node, or its agent has not started yet).
func FromNode(node *v1.Node) (*gpu.NodeInventory, error) {
	s, ok := node.Annotations[gpu.AnnotationInventory]
	if !ok {
		return nil, nil
	}
	inv, err := gpu.DecodeInventory([]byte(s))
	if err != nil {
		return nil, fmt.Errorf("node %s: annotation %s: %w", node.Name, gpu.AnnotationInventory, err)
	}
	if inv.Node != node.Name {
		return nil, fmt.Errorf("node %s: annotation %s describes node %q", node.Name, gpu.AnnotationInventory, inv.Node)
	}
	return inv, nil
}

// Publish writes inv onto its node with a merge patch that touches only the
// inventory annotation, so it never races with other writers of the Node.
// It returns the Node's resourceVersion after the write, by which the
// writer tells its own change from others' in a watch.
func Publish(ctx context.Context, client kubernetes.Interface, inv *gpu.NodeInventory) (string, error) {
	b, err := gpu.EncodeInventory(inv)
	if err != nil {
		return "", err
	}
	return patchAnnotation(ctx, client, inv.Node, string(b))
}

// Withdraw removes the inventory annotation, for an agent that stops serving
// GPUs on the node.
func Withdraw(ctx context.Context, client kubernetes.Interface, node string) error {
	_, err := patchAnnotation(ctx, client, node, nil)
	return err
}

func patchAnnotation(ctx context.Context, client kubernetes.Interface, node string, value any) (string, error) {
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{gpu.AnnotationInventory: value}},
	})
	if err != nil {
		return "", err
	}
	n, err := client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return "", fmt.Errorf("publish GPU inventory of node %s: %w", node, err)
	}
	return n.ResourceVersion, nil
}
