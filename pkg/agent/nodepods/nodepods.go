// Package nodepods is one node's pods as the agent reads them: an informer
// over the pods bound to the node, in which a bound pod keeps the first
// assignment it was seen with.
package nodepods

import (
	"sync"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/tessera-gpu/tessera/pkg/agent/deviceplugin"
	"github.com/tessera-gpu/tessera/pkg/agent/tenants"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// Pods is one node's pods as the agent reads them: their assignments
// (device plugin), container IDs (per-tenant metrics) and preemption
// notices. Start Factory, and wait for its sync, before the agent's Run.
type Pods struct {
	Factory informers.SharedInformerFactory
	Get     deviceplugin.Pods
	List    tenants.PodSource
	// Changes receives every attempt to change a bound pod's assignment;
	// the pods read through Get and List keep the first one (pass it to
	// agent.Options.AssignmentChanges, which reports them).
	Changes <-chan AssignmentChange
}

// AssignmentChange is a bound pod whose tessera.dev/assignment changed (or
// was removed) after the agent first saw it bound: the change is ignored.
type AssignmentChange struct {
	Pod        *v1.Pod // as the API server has it now
	First, Now string  // the annotation's values; Now is "" when removed
}

// Watch is an informer over the pods bound to node. The first
// assignment a bound pod is seen with is the one that counts: a later change
// is undone in the informer's copy, before anything in the agent reads it,
// and sent to Changes.
func Watch(client kubernetes.Interface, node string) Pods {
	first := &firstAssignments{seen: map[types.UID]string{}, changes: make(chan AssignmentChange, 64)}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
	}), informers.WithTransform(first.transform))
	informer := factory.Core().V1().Pods()
	_, _ = informer.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{DeleteFunc: first.forget})
	lister := informer.Lister()
	return Pods{
		Factory: factory,
		Get: func(ns, name string) *v1.Pod {
			p, err := lister.Pods(ns).Get(name)
			if err != nil {
				return nil
			}
			return p
		},
		List: func() []*v1.Pod {
			ps, _ := lister.List(labels.Everything())
			return ps
		},
		Changes: first.changes,
	}
}

// firstAssignments remembers each bound pod's first assignment.
type firstAssignments struct {
	mu      sync.Mutex
	seen    map[types.UID]string
	changes chan AssignmentChange
}

// transform runs on every pod the informer receives, before it is stored.
func (f *firstAssignments) transform(obj any) (any, error) {
	pod, ok := obj.(*v1.Pod)
	if !ok || pod.Spec.NodeName == "" {
		return obj, nil
	}
	now, has := pod.Annotations[gpu.AnnotationAssignment]
	f.mu.Lock()
	was, known := f.seen[pod.UID]
	if !known && has {
		f.seen[pod.UID] = now
	}
	f.mu.Unlock()
	if !known || (has && now == was) {
		return obj, nil
	}
	// Report with the pod as it came, then keep the first assignment.
	change := AssignmentChange{Pod: pod.DeepCopy(), First: was, Now: now}
	select {
	case f.changes <- change:
	default: // a flood of changes: each is still undone
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[gpu.AnnotationAssignment] = was
	return pod, nil
}

func (f *firstAssignments) forget(obj any) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if pod, ok := obj.(*v1.Pod); ok {
		f.mu.Lock()
		delete(f.seen, pod.UID)
		f.mu.Unlock()
	}
}
