package scheduler

import (
	"context"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	plfeature "k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources"
)

// ResourcesFitName is the plugin that stands in for NodeResourcesFit in the
// tessera-scheduler profile.
const ResourcesFitName = "TesseraNodeResourcesFit"

// ResourcesFit is upstream NodeResourcesFit (Filter and PreFilter) shown the
// pod without its tessera.dev resources. Those are TesseraGPU's to account;
// NodeResourcesFit would skip them anyway (ignoredResourceGroups), but only
// after matching each of them against a regular expression on every node it
// filters, three of them per GPU pod on every node of every cycle. CPU, memory, ephemeral storage, pod count
// and every other extended resource are checked by the upstream code itself;
// tessera.dev/gpu, kubelet's device-plugin slots, by TesseraGPU's Filter
// (slotsFit: two map lookups, where the upstream check of that one name
// cost a tenth of the throughput).
type ResourcesFit struct {
	fit interface {
		fwk.PreFilterPlugin
		fwk.FilterPlugin
		fwk.EnqueueExtensions
	}
}

var (
	_ fwk.PreFilterPlugin   = (*ResourcesFit)(nil)
	_ fwk.FilterPlugin      = (*ResourcesFit)(nil)
	_ fwk.EnqueueExtensions = (*ResourcesFit)(nil)
)

const strippedKey fwk.StateKey = ResourcesFitName + "/pod"

type strippedPod struct{ pod *v1.Pod }

func (s *strippedPod) Clone() fwk.StateData { return s }

// NewResourcesFit is the plugin factory for app.WithPlugin. It takes no
// arguments: scoring stays with TesseraGPU's policy.
func NewResourcesFit(ctx context.Context, _ runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	args := &schedconfig.NodeResourcesFitArgs{ScoringStrategy: &schedconfig.ScoringStrategy{
		Type:      schedconfig.LeastAllocated,
		Resources: []schedconfig.ResourceSpec{{Name: string(v1.ResourceCPU), Weight: 1}, {Name: string(v1.ResourceMemory), Weight: 1}},
	}}
	p, err := noderesources.NewFit(ctx, args, h, plfeature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate))
	if err != nil {
		return nil, err
	}
	return &ResourcesFit{fit: p.(*noderesources.Fit)}, nil
}

// Name implements fwk.Plugin.
func (r *ResourcesFit) Name() string { return ResourcesFitName }

// PreFilter runs NodeResourcesFit's PreFilter on the pod without tessera.dev
// resources and keeps that pod for Filter.
func (r *ResourcesFit) PreFilter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	p := withoutTesseraResources(pod)
	state.Write(strippedKey, &strippedPod{p})
	return r.fit.PreFilter(ctx, state, p, nodes)
}

// PreFilterExtensions lets preemption add and remove pods from the state.
func (r *ResourcesFit) PreFilterExtensions() fwk.PreFilterExtensions {
	return r.fit.PreFilterExtensions()
}

// Filter is NodeResourcesFit's Filter on the same pod PreFilter saw.
func (r *ResourcesFit) Filter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) *fwk.Status {
	if d, err := state.Read(strippedKey); err == nil {
		pod = d.(*strippedPod).pod
	}
	return r.fit.Filter(ctx, state, pod, nodeInfo)
}

// EventsToRegister is NodeResourcesFit's.
func (r *ResourcesFit) EventsToRegister(ctx context.Context) ([]fwk.ClusterEventWithHint, error) {
	return r.fit.EventsToRegister(ctx)
}

// withoutTesseraResources returns pod itself when it asks for no tessera.dev
// resource, else a copy whose containers' requests and limits lack them.
func withoutTesseraResources(pod *v1.Pod) *v1.Pod {
	has := func(l v1.ResourceList) bool {
		for name := range l {
			if isTessera(name) {
				return true
			}
		}
		return false
	}
	any := false
	for _, cs := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			any = any || has(cs[i].Resources.Requests) || has(cs[i].Resources.Limits)
		}
	}
	if !any {
		return pod
	}
	p := pod.DeepCopy()
	for _, cs := range [][]v1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for i := range cs {
			for _, l := range []v1.ResourceList{cs[i].Resources.Requests, cs[i].Resources.Limits} {
				for name := range l {
					if isTessera(name) {
						delete(l, name)
					}
				}
			}
		}
	}
	return p
}

func isTessera(name v1.ResourceName) bool {
	return strings.HasPrefix(string(name), "tessera.dev/")
}
