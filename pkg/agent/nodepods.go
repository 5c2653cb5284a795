package agent

import (
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/pkg/agent/deviceplugin"
	"github.com/tessera-gpu/tessera/pkg/agent/tenants"
)

// NodePods is one node's pods as the agent reads them: their assignments
// (device plugin), container IDs (per-tenant metrics) and preemption
// notices. Start Factory, and wait for its sync, before Run.
type NodePods struct {
	Factory informers.SharedInformerFactory
	Get     deviceplugin.Pods
	List    tenants.PodSource
}

// WatchNodePods is an informer over the pods bound to node.
func WatchNodePods(client kubernetes.Interface, node string) NodePods {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
	}))
	lister := factory.Core().V1().Pods().Lister()
	return NodePods{
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
	}
}
