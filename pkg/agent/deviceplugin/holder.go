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

// HolderOf implements Holder.
func (h PodResourcesHolder) HolderOf(ctx context.Context, resource string, ids []string) (string, string, string, error) {
	resp, err := h.Client.List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		return "", "", "", fmt.Errorf("kubelet pod-resources List: %w", err)
	}
	want := slices.Clone(ids)
	slices.Sort(want)
	for _, p := range resp.GetPodResources() {
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				if d.GetResourceName() != resource {
					continue
				}
				got := slices.Clone(d.GetDeviceIds())
				slices.Sort(got)
				if slices.Equal(got, want) {
					return p.GetNamespace(), p.GetName(), c.GetName(), nil
				}
			}
		}
	}
	return "", "", "", fmt.Errorf("no container holds exactly %v", ids)
}

// Held implements Holder.
func (h PodResourcesHolder) Held(ctx context.Context, resource string) (map[string]bool, error) {
	resp, err := h.Client.List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("kubelet pod-resources List: %w", err)
	}
	held := map[string]bool{}
	for _, p := range resp.GetPodResources() {
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				if d.GetResourceName() == resource {
					for _, id := range d.GetDeviceIds() {
						held[id] = true
					}
				}
			}
		}
	}
	return held, nil
}
