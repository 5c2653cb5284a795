package inventory

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The agent's heartbeat: a Lease per node, renewed every HeartbeatEvery,
// as kubelet's node lease is. The inventory annotation changes only when
// the GPUs do, so it cannot say whether its agent still runs; the Lease
// does (tessera doctor cluster reads it).
const (
	HeartbeatEvery = 10 * time.Second
	// HeartbeatDuration is how long a renewal vouches for the agent.
	HeartbeatDuration = 40 * time.Second
)

// HeartbeatName is the Lease of the agent of node.
func HeartbeatName(node string) string { return "tessera-agent-" + node }

// Heartbeat renews the Lease of the agent of node in namespace, creating
// it the first time; the renewal vouches for the agent for duration.
func Heartbeat(ctx context.Context, client kubernetes.Interface, namespace, node string, now time.Time, duration time.Duration) error {
	leases := client.CoordinationV1().Leases(namespace)
	renew := metav1.NewMicroTime(now)
	seconds := int32(max(1, duration/time.Second))
	l, err := leases.Get(ctx, HeartbeatName(node), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: HeartbeatName(node), Namespace: namespace, Labels: map[string]string{"app.kubernetes.io/name": "tessera-agent"}},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: &node, LeaseDurationSeconds: &seconds, AcquireTime: &renew, RenewTime: &renew},
		}, metav1.CreateOptions{})
	case err == nil:
		l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &node, &seconds, &renew
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("heartbeat lease %s/%s: %w", namespace, HeartbeatName(node), err)
	}
	return nil
}
