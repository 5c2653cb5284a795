package deviceplugin_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/pkg/agent/deviceplugin"
)

// handover is a kubelet whose answer to "who holds these slots" changes
// between two looks: the slot passes to pod p01 while p00's call runs.
type handover struct {
	mu    sync.Mutex
	looks int
}

func (h *handover) HolderOf(context.Context, string, []string) (string, string, string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.looks++
	if h.looks == 1 {
		return "ns", "p00", "main", nil
	}
	return "ns", "p01", "main", nil
}

func (h *handover) Held(context.Context, string) (map[string]bool, error) {
	return map[string]bool{}, nil
}

// TestPreStartWritesForTheHolderOnly: a PreStartContainer whose container
// lost its slot while the call ran writes no spec (it would overwrite the
// next holder's), and says why.
func TestPreStartWritesForTheHolderOnly(t *testing.T) {
	pods := map[string]*v1.Pod{"p00": gpuPod(t, 0, assignment(1)), "p01": gpuPod(t, 1, assignment(3))}
	cdi := t.TempDir()
	p := deviceplugin.New(deviceplugin.Config{Node: node, Holder: &handover{}, CDIDir: cdi,
		Pods:    func(_, name string) *v1.Pod { return pods[name] },
		PipeDir: func(string) string { return "" }})
	_, err := p.PreStartContainer(context.Background(), &pluginapi.PreStartContainerRequest{DevicesIds: []string{"GPU-5-s0"}})
	if err == nil || !strings.Contains(err.Error(), "passed from pod ns/p00 container main to pod ns/p01 container main") {
		t.Fatalf("PreStartContainer: %v, want the handover named", err)
	}
	if _, err := os.Stat(deviceplugin.SpecPath(cdi, "GPU-5-s0")); !os.IsNotExist(err) {
		t.Errorf("a spec was written for a slot its container no longer holds: %v", err)
	}
}
