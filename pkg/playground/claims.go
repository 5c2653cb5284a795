package playground

import (
	"context"
	"fmt"

	"k8s.io/client-go/informers"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/controller/resourceclaim"
)

// runClaimController runs kube-controller-manager's ResourceClaim
// controller, as a cluster does: it makes a pod's claims from its
// ResourceClaimTemplates, and when a pod ends it takes the pod off its
// claims' reservedFor and deallocates them (a template's claim is
// deleted with its pod), so that a DRA node's capacity comes back.
func (c *Cluster) runClaimController(ctx context.Context) error {
	cctx, stop := context.WithCancel(klog.NewContext(context.WithoutCancel(ctx), klog.FromContext(ctx).WithName("resourceclaim-controller")))
	c.stopClaims = stop
	factory := informers.NewSharedInformerFactory(c.Client, 0)
	// PodGroups are read only with gang scheduling's gates on, which the
	// playground's API server leaves off: their informer is never started.
	unused := informers.NewSharedInformerFactory(c.Client, 0)
	ctrl, err := resourceclaim.NewController(klog.FromContext(cctx), c.Client, factory.Core().V1().Pods(), unused.Scheduling().V1beta1().PodGroups(),
		factory.Resource().V1().ResourceClaims(), factory.Resource().V1().ResourceClaimTemplates())
	if err != nil {
		stop()
		return fmt.Errorf("ResourceClaim controller: %w", err)
	}
	factory.Start(cctx.Done())
	go ctrl.Run(cctx, 2)
	return nil
}
