package deviceplugin

import (
	"context"
	"fmt"
	"slices"

	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// PodResourcesHolder answers HolderOf from kubelet's pod-resources API
// (/var/lib/kubelet/pod-resources/kubelet.sock on a node), which reports
// what kubelet's device manager recorded at Allocate.
type PodResourcesHolder struct {
	Client podresourcesapi.PodResourcesListerClient
}

// each calls fn with every container's device IDs of resource, from one
// List, until fn returns true.
func (h PodResourcesHolder) each(ctx context.Context, resource string, fn func(namespace, pod, container string, ids []string) bool) error {
	resp, err := h.Client.List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		return fmt.Errorf("kubelet pod-resources List: %w", err)
	}
	for _, p := range resp.GetPodResources() {
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				if d.GetResourceName() == resource && fn(p.GetNamespace(), p.GetName(), c.GetName(), d.GetDeviceIds()) {
					return nil
				}
			}
		}
	}
	return nil
}

// HolderOf implements Holder.
func (h PodResourcesHolder) HolderOf(ctx context.Context, resource string, ids []string) (string, string, string, error) {
	want := slices.Sorted(slices.Values(ids))
	var ns, pod, container string
	err := h.each(ctx, resource, func(n, p, c string, got []string) bool {
		if slices.Equal(slices.Sorted(slices.Values(got)), want) {
			ns, pod, container = n, p, c
			return true
		}
		return false
	})
	if err == nil && pod == "" {
		err = fmt.Errorf("no container holds exactly %v", ids)
	}
	return ns, pod, container, err
}

// Held implements Holder.
func (h PodResourcesHolder) Held(ctx context.Context, resource string) (map[string]bool, error) {
	held := map[string]bool{}
	err := h.each(ctx, resource, func(_, _, _ string, ids []string) bool {
		for _, id := range ids {
			held[id] = true
		}
		return false
	})
	return held, err
}
