package agentendpoint

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	restclient "k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/tessera-gpu/tessera/deploy"
)

// TestTheChartAgrees: the shipped DaemonSet runs where Namespace says, its
// pods carry the labels Selector picks, and its metrics port is Port.
func TestTheChartAgrees(t *testing.T) {
	objs, err := deploy.Objects(deploy.Agent)
	if err != nil {
		t.Fatal(err)
	}
	sel, err := labels.Parse(Selector)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, u := range objs {
		if u.GetKind() != "DaemonSet" {
			continue
		}
		var ds appsv1.DaemonSet
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &ds); err != nil {
			t.Fatal(err)
		}
		found = true
		if ds.Namespace != Namespace {
			t.Errorf("DaemonSet in %q, want %q", ds.Namespace, Namespace)
		}
		if !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
			t.Errorf("pod labels %v do not match %q", ds.Spec.Template.Labels, Selector)
		}
		var port int32
		for _, p := range ds.Spec.Template.Spec.Containers[0].Ports {
			if p.Name == "metrics" {
				port = p.ContainerPort
			}
		}
		if port != Port {
			t.Errorf("metrics containerPort %d, want %d", port, Port)
		}
	}
	if !found {
		t.Fatal("no DaemonSet in deploy/tessera-agent.yaml")
	}
}

const sample = "# TYPE tessera_gpu_stall_ratio gauge\ntessera_gpu_stall_ratio{node=\"n1\",UUID=\"GPU-a\"} 0.25\n"

func TestFromURL(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.Error(w, "tessera-agent of node n2 is not running", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, sample)
	}))
	defer srv.Close()
	m, err := FromURL(context.Background(), srv.Client(), srv.URL+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	got := m.Families["tessera_gpu_stall_ratio"].GetMetric()
	if len(got) != 1 || got[0].GetGauge().GetValue() != 0.25 || Labels(got[0])["UUID"] != "GPU-a" || m.From != srv.URL+"/metrics" {
		t.Errorf("read %+v", m)
	}
	_, err = FromURL(context.Background(), srv.Client(), srv.URL+"/stopped")
	if err == nil || !strings.Contains(err.Error(), "/stopped: 503 Service Unavailable") {
		t.Errorf("an agent answering 503: %v, want the URL and status", err)
	}
}

// TestFromPods: running agent pods are read through the API server's
// proxy on Port; one that answers garbage is named in the error while the
// others are returned; pods not running are not asked.
func TestFromPods(t *testing.T) {
	pod := func(name string, phase v1.PodPhase) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace, Labels: map[string]string{"app.kubernetes.io/name": "tessera-agent"}},
			Status: v1.PodStatus{Phase: phase}}
	}
	client := fake.NewClientset(pod("good", v1.PodRunning), pod("garbled", v1.PodRunning), pod("pending", v1.PodPending))
	var asked []string
	client.PrependProxyReactor("pods", func(action k8stesting.Action) (bool, restclient.ResponseWrapper, error) {
		pa := action.(k8stesting.ProxyGetAction)
		asked = append(asked, pa.GetName()+":"+pa.GetPort()+"/"+pa.GetPath())
		body := sample
		if pa.GetName() == "garbled" {
			body = "tessera_gpu_stall_ratio{ 1\n"
		}
		return true, proxied(body), nil
	})
	got, err := FromPods(context.Background(), client, Namespace)
	if err == nil || !strings.Contains(err.Error(), "agent "+Namespace+"/garbled") {
		t.Errorf("error %v, want it to name the garbled agent", err)
	}
	if len(got) != 1 || got[0].From != Namespace+"/good" {
		t.Errorf("read %+v, want the good agent only", got)
	}
	if strings.Join(asked, " ") != "good:9401/metrics garbled:9401/metrics" && strings.Join(asked, " ") != "garbled:9401/metrics good:9401/metrics" {
		t.Errorf("asked %v", asked)
	}
}

type proxied string

func (p proxied) DoRaw(context.Context) ([]byte, error) { return []byte(p), nil }
func (p proxied) Stream(context.Context) (io.ReadCloser, error) {
	return io.NopCloser(strings.NewReader(string(p))), nil
}
