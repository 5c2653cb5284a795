// Package refusal follows the pods whose GPUs the device plugin refused. A
// refused pod still holds its slots in kubelet until it is deleted, so
// other pods placed on the node would be rejected for want of slots: the
// Tracker reports it (events on the pod and the node,
// tessera_agent_refused_slots, which tessera-scheduler's slot count
// mirrors), and deletes the pod once its grace is up.
package refusal

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// DefaultGrace is how long a pod refused its GPUs may hold its slots
// before the agent deletes it: long enough for an operator to read why,
// short enough that a pod bound past the admission policies cannot hoard a
// node.
const DefaultGrace = 5 * time.Minute

// Config is what a Tracker reads and tells.
type Config struct {
	Node   string
	Client kubernetes.Interface
	// NodePods lists this node's pods; a refused pod no longer among them
	// is forgotten. Nil forgets none.
	NodePods func() []*v1.Pod
	// Grace is how long a refused pod may hold its slots (DefaultGrace
	// when zero).
	Grace time.Duration
	// Now is the grace's clock (time.Now when nil).
	Now func() time.Time
	// NodeEvent records an event on the node, PodEvent one on a pod.
	NodeEvent func(ctx context.Context, eventType, reason, note string)
	PodEvent  func(ctx context.Context, namespace, name string, uid types.UID, eventType, reason, note string)
}

// pod is a refused pod and the slots its containers hold.
type pod struct {
	namespace, name string
	slots           map[string]int // container → slots
	// since is the first refusal: the grace runs from it.
	since time.Time
}

// Tracker follows one node's refused pods. Its methods are safe for
// concurrent use.
type Tracker struct {
	cfg  Config
	held *prometheus.GaugeVec

	mu      sync.Mutex
	refused map[types.UID]*pod
}

// New is a Tracker with no refused pod.
func New(cfg Config) *Tracker {
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultGrace
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	t := &Tracker{cfg: cfg, refused: map[types.UID]*pod{}, held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tessera_agent_refused_slots",
		Help: "Device-plugin slots held by pods whose GPUs the agent refused: kubelet gives them to no other pod until those pods are deleted.",
	}, []string{"node"})}
	t.held.WithLabelValues(cfg.Node).Set(0)
	return t
}

// Collectors are the Tracker's series, for the agent's registry.
func (t *Tracker) Collectors() []prometheus.Collector { return []prometheus.Collector{t.held} }

// Held is how many slots refused pods hold now.
func (t *Tracker) Held() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.heldLocked()
}

// PreStarted follows the device plugin's PreStartContainer answers
// (deviceplugin.Config.PreStarted): err is why the container was refused
// its slots, nil if it got them.
func (t *Tracker) PreStarted(p *v1.Pod, container string, slots int, err error) {
	t.mu.Lock()
	r := t.refused[p.UID]
	switch {
	case err == nil && r != nil:
		delete(r.slots, container)
		if len(r.slots) == 0 {
			delete(t.refused, p.UID)
		}
	case err != nil:
		if r == nil {
			r = &pod{namespace: p.Namespace, name: p.Name, slots: map[string]int{}, since: t.cfg.Now()}
			t.refused[p.UID] = r
		}
		r.slots[container] = slots
	}
	t.exportLocked()
	t.mu.Unlock()
	if err == nil {
		return
	}
	ctx := context.Background()
	t.cfg.PodEvent(ctx, p.Namespace, p.Name, p.UID, v1.EventTypeWarning, "GPUSlotsRefused",
		fmt.Sprintf("container %s is refused its GPUs and holds %d slot(s) of this node until the pod is deleted (by the agent %s after the first refusal): %v",
			container, slots, t.cfg.Grace, err))
	t.cfg.NodeEvent(ctx, v1.EventTypeWarning, "GPUSlotsHeld",
		fmt.Sprintf("pod %s/%s holds %d GPU slot(s) that kubelet gives to no other pod until it is deleted: its GPUs were refused", p.Namespace, p.Name, slots))
}

// Prune forgets refused pods that left the node (their slots with them),
// and deletes those still there past the grace: kubelet frees a pod's
// slots only when it ends, and a pod refused its GPUs never starts.
func (t *Tracker) Prune(ctx context.Context) {
	t.forgetDeparted(ctx)
	t.mu.Lock()
	due := overdue(t.refused, t.cfg.Now(), t.cfg.Grace)
	var pods []pod
	for _, uid := range due {
		pods = append(pods, *t.refused[uid])
	}
	t.mu.Unlock()
	for i, r := range pods {
		t.release(ctx, due[i], r)
	}
}

// overdue lists the refused pods whose grace has run out at now, oldest
// first: the pods the agent refuses for good.
func overdue(refused map[types.UID]*pod, now time.Time, grace time.Duration) []types.UID {
	var out []types.UID
	for uid, r := range refused {
		if now.Sub(r.since) >= grace {
			out = append(out, uid)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := refused[out[i]], refused[out[j]]
		if !a.since.Equal(b.since) {
			return a.since.Before(b.since)
		}
		return out[i] < out[j]
	})
	return out
}

// release deletes a pod refused its GPUs for longer than the grace, the
// pod with that UID only (a new pod of the same name is not touched).
func (t *Tracker) release(ctx context.Context, uid types.UID, r pod) {
	logger := klog.FromContext(ctx)
	held := 0
	for _, n := range r.slots {
		held += n
	}
	forget := func() {
		t.mu.Lock()
		delete(t.refused, uid)
		t.exportLocked()
		t.mu.Unlock()
	}
	err := t.cfg.Client.CoreV1().Pods(r.namespace).Delete(ctx, r.name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	switch {
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		forget() // gone already, or the name is another pod's now
		return
	case err != nil:
		logger.Error(err, "Could not delete a pod refused its GPUs; its slots stay held", "pod", klog.KRef(r.namespace, r.name))
		return
	}
	logger.Info("Deleted a pod refused its GPUs past the grace; its slots are free", "pod", klog.KRef(r.namespace, r.name), "slots", held, "grace", t.cfg.Grace)
	msg := fmt.Sprintf("pod %s/%s was refused its GPUs for %s, holding %d slot(s): deleted to free them", r.namespace, r.name, t.cfg.Grace, held)
	t.cfg.PodEvent(ctx, r.namespace, r.name, uid, v1.EventTypeWarning, "GPUSlotsReleased", msg)
	t.cfg.NodeEvent(ctx, v1.EventTypeWarning, "GPUSlotsReleased", msg)
	forget()
}

// forgetDeparted forgets refused pods that left the node.
func (t *Tracker) forgetDeparted(ctx context.Context) {
	if t.cfg.NodePods == nil {
		return
	}
	onNode := map[types.UID]bool{}
	for _, p := range t.cfg.NodePods() {
		onNode[p.UID] = true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for uid, r := range t.refused {
		if !onNode[uid] {
			klog.FromContext(ctx).V(2).Info("A refused pod left; its slots are free", "pod", klog.KRef(r.namespace, r.name))
			delete(t.refused, uid)
		}
	}
	t.exportLocked()
}

func (t *Tracker) heldLocked() int {
	total := 0
	for _, r := range t.refused {
		for _, n := range r.slots {
			total += n
		}
	}
	return total
}

func (t *Tracker) exportLocked() {
	t.held.WithLabelValues(t.cfg.Node).Set(float64(t.heldLocked()))
}
