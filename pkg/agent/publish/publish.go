// Package publish keeps a node's GPU inventory on its Node object: it
// writes the annotation the scheduler places GPU pods by whenever the GPUs
// change (a fault, a recovery, a new slice count), hands the device plugin
// the same slots, and writes the annotation back whenever anyone else
// changes it, since a node whose inventory nobody repairs takes no GPU pod.
package publish

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/pkg/agent/deviceplugin"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/inventory"
)

// Config is what a Publisher reads and tells.
type Config struct {
	Node   string
	Client kubernetes.Interface
	// Build is the node's inventory at now: its GPUs with their health,
	// slice counts and isolation offers, and the GPUs reclaimed.
	Build func(now time.Time) *gpu.NodeInventory
	// SetSlots hands the device plugin each GPU's slots as published.
	SetSlots func([]deviceplugin.GPUSlots)
	// Event records an event on the node.
	Event func(ctx context.Context, eventType, reason, note string)
	// Published, when set, is told of every inventory written (its GPUs),
	// after the write: the DRA driver republishes its ResourceSlice.
	Published func(ctx context.Context, inv *gpu.NodeInventory)
	// RepairEvery is the shortest time between two repairs, so two writers
	// (a second agent by mistake) cannot make the agent spin (a second
	// when zero).
	RepairEvery time.Duration
}

// ownVersionsKept is how many of its own writes a Publisher recognizes in
// the watch: more than the writes that can be in flight between two
// events.
const ownVersionsKept = 16

// Publisher publishes one node's inventory and keeps it. Its methods are
// safe for concurrent use.
type Publisher struct {
	cfg Config

	// writeMu is held from a write until its outcome is recorded, so the
	// watch never judges the Node by a write still in flight; ownVersions
	// are the Node's resourceVersions that this Publisher's last writes
	// produced (oldest first), so the watch's late news of an earlier
	// write of its own is not taken for someone else's.
	writeMu     sync.Mutex
	ownVersions []string

	// mu guards what was last published.
	mu        sync.Mutex
	published *gpu.NodeInventory // GPUs only, what the next Publish compares with
	raw       string             // the annotation as last written
	repair    bool               // the next Publish writes even if the GPUs did not change
}

// New is a Publisher that has published nothing yet.
func New(cfg Config) *Publisher {
	if cfg.RepairEvery <= 0 {
		cfg.RepairEvery = time.Second
	}
	return &Publisher{cfg: cfg}
}

// Published is the inventory last published (its GPUs, not CPU and
// memory), or nil before the first.
func (p *Publisher) Published() *gpu.NodeInventory {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.published == nil {
		return nil
	}
	inv := *p.published
	return &inv
}

// Publish writes the inventory and hands the device plugin its slots when
// the GPUs changed since the last write, or a repair is due.
func (p *Publisher) Publish(ctx context.Context, now time.Time) error {
	inv := p.cfg.Build(now)
	p.mu.Lock()
	same := !p.repair && p.published != nil && reflect.DeepEqual(p.published, inv)
	p.mu.Unlock()
	if same {
		return nil
	}
	var slots []deviceplugin.GPUSlots
	unhealthy := 0
	for _, g := range inv.GPUs {
		slots = append(slots, deviceplugin.GPUSlots{UUID: g.UUID, Slices: g.Slices, Healthy: g.Healthy})
		if !g.Healthy {
			unhealthy++
		}
	}
	p.cfg.SetSlots(slots)
	published := *inv
	// CPU and memory come from the Node's allocatable (kubelet's numbers).
	if n, err := p.cfg.Client.CoreV1().Nodes().Get(ctx, p.cfg.Node, metav1.GetOptions{}); err == nil {
		inv.CPUMilli = n.Status.Allocatable.Cpu().MilliValue()
		inv.MemoryMiB = n.Status.Allocatable.Memory().Value() >> 20
	}
	raw, err := gpu.EncodeInventory(inv)
	if err != nil {
		return err
	}
	p.writeMu.Lock()
	version, err := inventory.Publish(ctx, p.cfg.Client, inv)
	if err == nil {
		if version != "" {
			p.ownVersions = append(p.ownVersions, version)
		}
		if len(p.ownVersions) > ownVersionsKept {
			p.ownVersions = p.ownVersions[len(p.ownVersions)-ownVersionsKept:]
		}
		p.mu.Lock()
		p.published, p.raw, p.repair = &published, string(raw), false
		p.mu.Unlock()
	}
	p.writeMu.Unlock()
	if err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Published GPU inventory", "node", p.cfg.Node, "gpus", len(inv.GPUs), "unhealthy", unhealthy)
	if p.cfg.Published != nil {
		p.cfg.Published(ctx, &published)
	}
	return nil
}

// Keep watches the node and writes the inventory back whenever the
// annotation differs from what was last written (overwritten, removed,
// garbage) by anyone else, with a Warning event; it returns when ctx ends.
func (p *Publisher) Keep(ctx context.Context) {
	logger := klog.FromContext(ctx)
	factory := informers.NewSharedInformerFactoryWithOptions(p.cfg.Client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", p.cfg.Node).String()
	}))
	differs := make(chan struct{}, 1)
	check := func(obj any) {
		n, ok := obj.(*v1.Node)
		if !ok || n.Name != p.cfg.Node || !p.changedByOthers(n) {
			return
		}
		select {
		case differs <- struct{}{}:
		default:
		}
	}
	if _, err := factory.Core().V1().Nodes().Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: check, UpdateFunc: func(_, obj any) { check(obj) },
	}); err != nil {
		logger.Error(err, "Not watching this node's inventory annotation")
		return
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	for {
		select {
		case <-ctx.Done():
			return
		case <-differs:
		}
		p.mu.Lock()
		p.repair = true // even though the GPUs did not change
		p.mu.Unlock()
		logger.Info("This node's GPU inventory annotation was changed by someone else; restoring it", "node", p.cfg.Node)
		p.cfg.Event(ctx, v1.EventTypeWarning, "GPUInventoryRestored",
			fmt.Sprintf("annotation %s was changed or removed by someone other than this node's tessera-agent; restored", gpu.AnnotationInventory))
		if err := p.Publish(ctx, time.Now()); err != nil {
			logger.Error(err, "Restoring the GPU inventory failed")
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(p.cfg.RepairEvery):
		}
	}
}

// changedByOthers reports whether the Node's annotation differs from the
// last write, in a version this Publisher did not write.
func (p *Publisher) changedByOthers(n *v1.Node) bool {
	p.writeMu.Lock()
	defer p.writeMu.Unlock()
	own := slices.Contains(p.ownVersions, n.ResourceVersion)
	p.mu.Lock()
	want := p.raw
	p.mu.Unlock()
	got, has := n.Annotations[gpu.AnnotationInventory]
	return want != "" && !own && (!has || got != want)
}
