package scheduler

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/scheduler/cache"
	"github.com/tessera-gpu/tessera/pkg/scheduler/schedtest"
)

// TestUnreadableInventoryReason: a node whose inventory annotation is
// garbage tells its pods so (why is in the node's event), instead of asking whether the agent
// runs there; a readable one clears it.
func TestUnreadableInventoryReason(t *testing.T) {
	p := &Plugin{shared: &shared{cache: cache.New(1.5)}}
	logger := klog.Background()
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "n1", Annotations: map[string]string{gpu.AnnotationInventory: `{"v":"v1","gpus":[{"uuid":`}}}
	p.onNode(logger, node)
	if got := p.noInventoryReason("n1"); !strings.Contains(got, "GPU inventory (annotation tessera.dev/inventory) is unreadable (see the node's InvalidGPUInventory event)") ||
		strings.Contains(got, "is tessera-agent running there") {
		t.Fatalf("reason %q", got)
	}
	if got := p.noInventoryReason("n2"); !strings.Contains(got, "is tessera-agent running there?") {
		t.Fatalf("node without inventory: %q", got)
	}
	raw, err := gpu.EncodeInventory(schedtest.Inventory("n1", 1, 81920, false))
	if err != nil {
		t.Fatal(err)
	}
	node.Annotations[gpu.AnnotationInventory] = string(raw)
	p.onNode(logger, node)
	if _, ok := p.unreadable.Load("n1"); ok || !p.cache.HasNode("n1") {
		t.Fatal("a readable inventory did not replace the unreadable one")
	}
}
