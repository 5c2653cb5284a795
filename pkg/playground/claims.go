package playground

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
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
	go wait.UntilWithContext(cctx, func(ctx context.Context) { c.collectOrphanClaims(ctx, factory) }, time.Second)
	return nil
}

// collectOrphanClaims deletes the claims whose owning pod is gone, as a
// cluster's garbage collector does for a ResourceClaimTemplate's claims
// (the playground runs no garbage collector): the ResourceClaim controller
// then deallocates a deleted claim no pod holds. Without it a claim whose
// pod was deleted while the scheduler was binding it — its reservation
// undone by Unreserve, its allocation kept — stays allocated.
func (c *Cluster) collectOrphanClaims(ctx context.Context, factory informers.SharedInformerFactory) {
	claims, err := factory.Resource().V1().ResourceClaims().Lister().List(labels.Everything())
	if err != nil {
		return
	}
	pods := factory.Core().V1().Pods().Lister()
	for _, claim := range claims {
		owner := metav1.GetControllerOf(claim)
		if owner == nil || owner.Kind != "Pod" || claim.DeletionTimestamp != nil {
			continue
		}
		if p, err := pods.Pods(claim.Namespace).Get(owner.Name); err == nil && p.UID == owner.UID {
			continue
		}
		uid := claim.UID
		err := c.Client.ResourceV1().ResourceClaims(claim.Namespace).Delete(ctx, claim.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			klog.FromContext(ctx).V(2).Info("Could not delete an orphaned claim", "claim", klog.KObj(claim), "err", err)
		}
	}
}
