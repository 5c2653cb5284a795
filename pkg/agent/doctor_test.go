package agent

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/doctor"
	"github.com/tessera-gpu/tessera/pkg/nvml/nvmltest"
)

// TestDoctorFromTheAgent: the agent runs the doctor's node checks on its
// view of the host — its NVML, the host's kernel and cgroups, kubelet's
// sockets — leaves the runtime's configuration to the node, serves the
// findings on /doctor, and reports its errors in an event on the node.
func TestDoctorFromTheAgent(t *testing.T) {
	root := t.TempDir()
	for path, body := range map[string]string{
		"proc/sys/kernel/osrelease":        "6.8.0-45-generic\n",
		"sys/fs/cgroup/cgroup.controllers": "cpu memory pids\n",
		"usr/bin/nvidia-smi":               "",
	} {
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	srv := dgxh100.New()
	nvmltest.Install(srv, func(int) *nvmltest.Reading { return &nvmltest.Reading{} })
	client := newNode()
	a, err := New(Options{Node: "n1", Config: config.Default(), Client: client, NVML: srv, HostRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	a.DoctorHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/doctor", nil))
	var report struct {
		Worst    doctor.Severity  `json:"worst"`
		Findings []doctor.Finding `json:"findings"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &report); err != nil {
		t.Fatalf("%v: %s", err, rec.Body.String())
	}
	got := map[string]doctor.Severity{}
	for _, f := range report.Findings {
		got[f.ID] = max(got[f.ID], f.Severity)
	}
	for id, want := range map[string]doctor.Severity{
		"driver.version":         doctor.OK,
		"gpu.compute-mode":       doctor.OK,
		"kernel.cgroup-v2":       doctor.OK,
		"runtime.cdi":            doctor.Info, // not visible from the agent, and said so
		"kubelet.device-plugins": doctor.Error,
	} {
		if got[id] != want {
			t.Errorf("%s = %s, want %s (all: %v)", id, got[id], want, got)
		}
	}
	if _, ok := got["runtime.nvidia-toolkit"]; ok {
		t.Error("the toolkit was judged from inside the agent's container")
	}
	a.reportDoctor(context.Background())
	evs := waitEvents(t, client, metav1.NamespaceDefault, eventWith("NodeCheckFailed", a.opts.Node, "kubelet.device-plugins"))
	if !eventWith("NodeCheckFailed", a.opts.Node, "kubelet.device-plugins")(evs) {
		t.Errorf("no NodeCheckFailed event naming kubelet.device-plugins: %+v", evs)
	}
}

// TestEventCountersStartAtZero: the agent's event counters are exported at
// 0 for this node's labels before any event, so increase() sees the first;
// its build, Go runtime and the age of its last sampling pass are exported
// too.
func TestEventCountersStartAtZero(t *testing.T) {
	srv := dgxh100.New()
	nvmltest.Install(srv, func(int) *nvmltest.Reading { return &nvmltest.Reading{} })
	a, err := New(Options{Node: "zero-node", Config: config.Default(), Client: newNode(), NVML: srv, MPS: true, MPSBinary: "/nonexistent", MPSRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.sampler.Pass(time.Now()); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	a.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	uuid, _ := srv.Devices[0].GetUUID()
	for _, want := range []string{
		`tessera_agent_build_info{node="zero-node"`,
		`tessera_agent_last_sample_age_seconds{node="zero-node"}`,
		"go_goroutines ",
		`tessera_reclaim_total{node="zero-node",result="stuck"} 0`,
		`tessera_agent_assignment_changes_total{node="zero-node"} 0`,
		`tessera_mps_daemon_restarts_total{UUID="` + uuid + `",gpu="0",modelName=`,
		`tessera_gpu_sharing_mode{UUID="` + uuid + `",gpu="0",mode="mps",modelName=`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
