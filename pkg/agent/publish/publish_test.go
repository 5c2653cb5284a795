package publish

import (
	"context"
	"reflect"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tessera-gpu/tessera/pkg/agent/deviceplugin"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/inventory"
)

// node is a fake API server with node n1, 96 CPUs and 1 TiB allocatable.
func node() *fake.Clientset {
	res := v1.ResourceList{v1.ResourceCPU: resource.MustParse("96"), v1.ResourceMemory: resource.MustParse("1Ti")}
	return fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: v1.NodeStatus{Allocatable: res, Capacity: res}})
}

// recorder keeps what a Publisher told the device plugin and the events.
type recorder struct {
	mu     sync.Mutex
	slots  [][]deviceplugin.GPUSlots
	events []string
}

func (r *recorder) setSlots(s []deviceplugin.GPUSlots) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.slots = append(r.slots, s)
}

func (r *recorder) event(_ context.Context, eventType, reason, _ string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, eventType+"/"+reason)
}

func (r *recorder) counts() (slots, events int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.slots), len(r.events)
}

// TestPublishWritesOnlyChanges: the first Publish writes the inventory
// with the node's CPU and memory and hands the plugin its slots; the same
// GPUs again write nothing; a GPU going unhealthy writes again.
func TestPublishWritesOnlyChanges(t *testing.T) {
	client, rec := node(), &recorder{}
	healthy := true
	build := func(time.Time) *gpu.NodeInventory {
		return &gpu.NodeInventory{Node: "n1", GPUs: []gpu.Device{{UUID: "GPU-a", MemoryMiB: 81920, Slices: 8, Healthy: healthy}}}
	}
	p := New(Config{Node: "n1", Client: client, Build: build, SetSlots: rec.setSlots, Event: rec.event})
	ctx := context.Background()
	if p.Published() != nil {
		t.Fatal("an inventory published before the first Publish")
	}
	for range 2 {
		if err := p.Publish(ctx, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	inv := onNode(t, client)
	if inv.CPUMilli != 96000 || inv.MemoryMiB != 1<<20 || len(inv.GPUs) != 1 {
		t.Fatalf("published %+v, want one GPU with the node's 96 CPUs and 1 TiB", inv)
	}
	if n, _ := rec.counts(); n != 1 {
		t.Errorf("the plugin was handed slots %d times for one inventory, want 1", n)
	}
	if got := p.Published(); got == nil || got.CPUMilli != 0 || !reflect.DeepEqual(got.GPUs, inv.GPUs) {
		t.Errorf("Published() = %+v, want the GPUs alone", got)
	}
	healthy = false
	if err := p.Publish(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	if onNode(t, client).GPUs[0].Healthy {
		t.Error("a GPU gone unhealthy is still published healthy")
	}
	if n, _ := rec.counts(); n != 2 || rec.slots[1][0].Healthy {
		t.Errorf("the plugin's slots after the fault: %+v", rec.slots)
	}
}

// TestInventoryIsRestored: an inventory annotation overwritten with
// garbage, or removed, by anyone but the agent is written back (issue 15:
// the node stayed out of service), with a Warning event on the node.
func TestInventoryIsRestored(t *testing.T) {
	client, rec := node(), &recorder{}
	build := func(time.Time) *gpu.NodeInventory {
		return &gpu.NodeInventory{Node: "n1", GPUs: []gpu.Device{{UUID: "GPU-a", MemoryMiB: 81920, Slices: 8, Healthy: true}}}
	}
	p := New(Config{Node: "n1", Client: client, Build: build, SetSlots: rec.setSlots, Event: rec.event, RepairEvery: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := p.Publish(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	good := onNode(t, client)
	go p.Keep(ctx)
	for _, tc := range []struct {
		name string
		edit func(n *v1.Node)
	}{
		{"garbage", func(n *v1.Node) { n.Annotations[gpu.AnnotationInventory] = `{"v":"v1","gpus":[{"memoryMiB":300000}` }},
		{"removed", func(n *v1.Node) { delete(n.Annotations, gpu.AnnotationInventory) }},
	} {
		n, err := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tc.edit(n)
		if _, err := client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
			n, err := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			inv, err := inventory.FromNode(n)
			return err == nil && inv != nil && reflect.DeepEqual(inv.GPUs, good.GPUs), nil
		})
		if err != nil {
			t.Fatalf("%s: the inventory was not restored: %v", tc.name, err)
		}
	}
	err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		_, events := rec.counts()
		return events >= 2, nil
	})
	if _, events := rec.counts(); err != nil || events != 2 || rec.events[0] != "Warning/GPUInventoryRestored" {
		t.Errorf("events %v, want two Warning/GPUInventoryRestored", rec.events)
	}
}

func onNode(t *testing.T, c *fake.Clientset) *gpu.NodeInventory {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := inventory.FromNode(n)
	if err != nil || inv == nil {
		t.Fatalf("inventory %v, %v", inv, err)
	}
	return inv
}
