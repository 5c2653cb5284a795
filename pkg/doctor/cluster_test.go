package doctor

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/version"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
	restclient "k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/pkg/agentendpoint"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/inventory"
)

var now = time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)

func lease(ns, name, holder string, renewed time.Duration, seconds int32) *coordinationv1.Lease {
	t := metav1.NewMicroTime(now.Add(-renewed))
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &t, LeaseDurationSeconds: &seconds}}
}

func gpuNode(t *testing.T, name string) *v1.Node {
	t.Helper()
	raw, err := gpu.EncodeInventory(&gpu.NodeInventory{Node: name, GPUs: []gpu.Device{{Index: 0, UUID: "GPU-" + name, Model: "H100", MemoryMiB: 81920, Healthy: true, Slices: 8}}})
	if err != nil {
		t.Fatal(err)
	}
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{gpu.AnnotationInventory: string(raw)}}}
}

// draNode is gpuNode labelled for DRA, and its inventory saying DRA when
// serving.
func draNode(t *testing.T, name string, labelled, serving bool) *v1.Node {
	t.Helper()
	raw, err := gpu.EncodeInventory(&gpu.NodeInventory{Node: name, DRA: serving,
		GPUs: []gpu.Device{{Index: 0, UUID: "GPU-" + name, Model: "H100", MemoryMiB: 81920, Healthy: true, Slices: 8}}})
	if err != nil {
		t.Fatal(err)
	}
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{gpu.AnnotationInventory: string(raw)}}}
	if labelled {
		n.Labels = map[string]string{"tessera.dev/dra": "true"}
	}
	return n
}

func draSlice(node string, devices int) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: node + "-gpu.tessera.dev"},
		Spec: resourceapi.ResourceSliceSpec{Driver: gpu.DRADriver, NodeName: &node, Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1}}}
	for i := range devices {
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{Name: gpu.DRADeviceName(i)})
	}
	return s
}

func gpuPodOn(t *testing.T, name, node string, memMiB int64) *v1.Pod {
	t.Helper()
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: name, CreationTimestamp: metav1.NewTime(now.Add(-10 * time.Minute))},
		Spec: v1.PodSpec{NodeName: node, SchedulerName: "tessera-scheduler", Containers: []v1.Container{{Name: "main", Resources: v1.ResourceRequirements{
			Limits: v1.ResourceList{gpu.ResourceGPU: resource.MustParse("1")}}}}}}
	if node != "" {
		enc, err := gpu.EncodeAssignment(&gpu.PodAssignment{Node: node, Containers: []gpu.ContainerAssignment{{Name: "main", Mode: gpu.ModeTimeSlicing,
			GPUs: []gpu.GPUGrant{{UUID: "GPU-" + node, MemoryMiB: memMiB, CoresPerMille: 250}}}}})
		if err != nil {
			t.Fatal(err)
		}
		p.Annotations = map[string]string{gpu.AnnotationAssignment: enc}
	}
	return p
}

func policies(bound ...string) []runtime.Object {
	var out []runtime.Object
	for _, p := range Policies {
		out = append(out, &admissionv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: p}})
	}
	for _, b := range bound {
		out = append(out, &admissionv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: b}, Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: b}})
	}
	return out
}

func agentPodOn(node string, mutate func(p *v1.Pod)) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "tessera-system", Name: "tessera-agent-" + node, Labels: map[string]string{"app.kubernetes.io/name": "tessera-agent"}},
		Spec: v1.PodSpec{NodeName: node}, Status: v1.PodStatus{Phase: v1.PodRunning}}
	mutate(p)
	return p
}

func crashing(code int32) func(p *v1.Pod) {
	return func(p *v1.Pod) {
		p.Status.ContainerStatuses = []v1.ContainerStatus{{Name: "agent", RestartCount: 7,
			State:                v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
			LastTerminationState: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: code, Reason: "Error"}}}}
	}
}

// TestClusterFaults: each cluster-side fault, on the API objects it leaves,
// is found with its remedy; a healthy cluster is all ok.
func TestClusterFaults(t *testing.T) {
	stallServer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("# TYPE tessera_gpu_stall_ratio gauge\ntessera_gpu_stall_ratio{node=\"n1\",gpu=\"0\",UUID=\"GPU-n1\"} 0.4\ntessera_gpu_stall_ratio{node=\"n1\",gpu=\"1\",UUID=\"GPU-n2\"} 0.05\n"))
	}))
	defer stallServer.Close()
	schedServer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`# TYPE scheduler_scheduling_attempt_duration_seconds histogram
scheduler_scheduling_attempt_duration_seconds_bucket{result="scheduled",le="0.001"} 90
scheduler_scheduling_attempt_duration_seconds_bucket{result="scheduled",le="0.01"} 98
scheduler_scheduling_attempt_duration_seconds_bucket{result="scheduled",le="2"} 99
scheduler_scheduling_attempt_duration_seconds_bucket{result="scheduled",le="4"} 100
scheduler_scheduling_attempt_duration_seconds_bucket{result="scheduled",le="+Inf"} 100
scheduler_scheduling_attempt_duration_seconds_sum{result="scheduled"} 3
scheduler_scheduling_attempt_duration_seconds_count{result="scheduled"} 100
`))
	}))
	defer schedServer.Close()

	healthy := func(t *testing.T) []runtime.Object {
		objs := []runtime.Object{gpuNode(t, "n1"), gpuNode(t, "n2"),
			lease("tessera-system", inventory.HeartbeatName("n1"), "n1", 3*time.Second, 40),
			lease("tessera-system", inventory.HeartbeatName("n2"), "n2", 3*time.Second, 40),
			lease("kube-system", "tessera-scheduler", "sched-0_abc", 2*time.Second, 15)}
		objs = append(objs, &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "tessera-system", Name: deploy.AdmissionConfigMap}})
		return append(objs, policies(Policies...)...)
	}
	tests := []struct {
		name    string
		objs    func(t *testing.T) []runtime.Object
		opts    func(o *ClusterOptions)
		version string
		id      string
		sev     Severity
		want    []string
	}{
		{name: "healthy", objs: healthy, id: "policies.installed", sev: OK, want: []string{"all 10 admission policies installed and bound, their ConfigMap tessera-admission present"}},
		{name: "the policies' ConfigMap missing",
			objs: func(t *testing.T) []runtime.Object {
				var objs []runtime.Object
				for _, o := range healthy(t) {
					if cm, ok := o.(*v1.ConfigMap); !ok || cm.Name != deploy.AdmissionConfigMap {
						objs = append(objs, o)
					}
				}
				return objs
			},
			id: "policies.config", sev: Error, want: []string{"they refuse every GPU pod", "not found", "apply deploy/admission-policies.yaml"}},
		{name: "Kubernetes too old (compatibility row: k8s 1.24+)", objs: healthy, version: "v1.29.4",
			id: "version.kubernetes", sev: Error, want: []string{"Kubernetes 1.29 is older than 1.34", "ValidatingAdmissionPolicy v1"}},
		{name: "agent stopped: heartbeat stale",
			objs: func(t *testing.T) []runtime.Object {
				return append(healthy(t)[:2], lease("tessera-system", inventory.HeartbeatName("n1"), "n1", 5*time.Minute, 40),
					lease("tessera-system", inventory.HeartbeatName("n2"), "n2", time.Second, 40))
			},
			id: "agents.heartbeat", sev: Error, want: []string{"n1", "not been heard from for 5m0s", "spec.nodeName=n1"}},
		{name: "a GPU node without inventory and no agent pod",
			objs: func(t *testing.T) []runtime.Object {
				return append(healthy(t), &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n3", Labels: map[string]string{"nvidia.com/gpu.present": "true"}}})
			},
			id: "agents.pod", sev: Error, want: []string{"n3", "its DaemonSet placed none", "describe daemonset tessera-agent"}},
		{name: "an agent crash-looping for want of a driver",
			objs: func(t *testing.T) []runtime.Object {
				return append(healthy(t), &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n3", Labels: map[string]string{"nvidia.com/gpu.present": "true"}}},
					agentPodOn("n3", crashing(3)))
			},
			id: "agents.pod", sev: Error, want: []string{"n3", "exit 3, NVML did not load", "7 restarts, CrashLoopBackOff, last exit 3", "agent.allowNoGPU=true", "logs tessera-agent-n3 --previous"}},
		{name: "an agent crash-looping on a bad flag",
			objs: func(t *testing.T) []runtime.Object {
				return append(healthy(t)[:2], lease("tessera-system", inventory.HeartbeatName("n1"), "n1", 5*time.Minute, 40),
					lease("tessera-system", inventory.HeartbeatName("n2"), "n2", time.Second, 40), agentPodOn("n1", crashing(2)))
			},
			id: "agents.pod", sev: Error, want: []string{"n1", "exit 2, a bad flag or configuration", "agent.extraArgs"}},
		{name: "an agent crash-looping otherwise",
			objs: func(t *testing.T) []runtime.Object {
				return append(healthy(t)[:2], lease("tessera-system", inventory.HeartbeatName("n1"), "n1", 5*time.Minute, 40),
					lease("tessera-system", inventory.HeartbeatName("n2"), "n2", time.Second, 40), agentPodOn("n1", crashing(137)))
			},
			id: "agents.pod", sev: Error, want: []string{"n1", "exit 137", "last exit 137 (Error)"}},
		{name: "an agent pod pending",
			objs: func(t *testing.T) []runtime.Object {
				return append(healthy(t), &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n3", Labels: map[string]string{"nvidia.com/gpu.present": "true"}}},
					agentPodOn("n3", func(p *v1.Pod) {
						p.Status.Phase = v1.PodPending
						p.Status.Conditions = []v1.PodCondition{{Type: v1.PodScheduled, Status: v1.ConditionFalse, Message: "0/3 nodes are available: 1 Insufficient memory."}}
					}))
			},
			id: "agents.pod", sev: Error, want: []string{"n3", "is Pending", "1 Insufficient memory", "describe pod tessera-agent-n3"}},
		{name: "an agent serving an empty node (allowNoGPU, no driver)",
			objs: func(t *testing.T) []runtime.Object {
				raw, err := gpu.EncodeInventory(&gpu.NodeInventory{Node: "n2", GPUs: []gpu.Device{},
					NoGPU: "NVML is not available (no NVIDIA driver, or libnvidia-ml.so.1 not mounted into the agent): ERROR_LIBRARY_NOT_FOUND"})
				if err != nil {
					t.Fatal(err)
				}
				objs := healthy(t)
				objs[1] = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2", Annotations: map[string]string{gpu.AnnotationInventory: string(raw)}}}
				return objs
			},
			id: "agents.gpus", sev: Warning, want: []string{"n2", "serves no GPU: NVML did not load", "ERROR_LIBRARY_NOT_FOUND", "agent.runtimeClassName"}},
		{name: "a GPU node without inventory",
			objs: func(t *testing.T) []runtime.Object {
				return append(healthy(t), &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n3", Labels: map[string]string{"nvidia.com/gpu.present": "true"}}})
			},
			id: "agents.inventory", sev: Error, want: []string{"n3", "has not started there"}},
		{name: "scheduler not leading",
			objs: func(t *testing.T) []runtime.Object {
				return append(healthy(t)[:4], lease("kube-system", "tessera-scheduler", "sched-0_abc", 10*time.Minute, 15))
			},
			id: "scheduler.leader", sev: Error, want: []string{"last renewed 10m0s ago", "GPU pods are not placed"}},
		{name: "scheduling too slow", objs: healthy, opts: func(o *ClusterOptions) { o.SchedulerMetrics = schedServer.URL },
			id: "scheduler.latency", sev: Warning, want: []string{"p99 scheduling attempt 2s over 100 attempts", "percentageOfNodesToScore"}},
		{name: "pending GPU pods grouped by reason",
			objs: func(t *testing.T) []runtime.Object {
				var out []runtime.Object
				for _, n := range []string{"a", "b"} {
					p := gpuPodOn(t, "wait-"+n, "", 0)
					p.Status.Conditions = []v1.PodCondition{{Type: v1.PodScheduled, Status: v1.ConditionFalse, Reason: "Unschedulable",
						Message: "0/2 nodes are available: 2 no GPU with the memory and cores asked free. GPUs: largest free GPU fragment 8192 MiB and 90% cores (node n1 GPU 3); nodes short of: 2 a GPU fragment. preemption cannot make room: no GPU pod of lower priority to evict"}}
					out = append(out, p)
				}
				return append(healthy(t), out...)
			},
			id: "pending.gpu-pods", sev: Warning, want: []string{"no GPU with the memory and cores asked free", "2 GPU pod(s) waiting, the oldest for 10m0s", "ml/wait-a ml/wait-b"}},
		{name: "pod stuck in ContainerCreating: refused by the agent",
			objs: func(t *testing.T) []runtime.Object {
				p := gpuPodOn(t, "rogue", "n1", 4096)
				p.Annotations = nil
				p.Status.Phase = v1.PodPending
				p.Status.ContainerStatuses = []v1.ContainerStatus{{Name: "main", State: v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "RunContainerError",
					Message: "device plugin PreStartContainer rpc failed with err: pod ml/rogue (bound to \"n1\") was not placed here by tessera-scheduler: no Tessera GPU assignment covers this container"}}}}
				return append(healthy(t), p)
			},
			id: "refused.gpu-pods", sev: Error, want: []string{"ml/rogue", "was not placed here by tessera-scheduler", "recreated through it"}},
		{name: "CUDA_ERROR_OUT_OF_MEMORY on a slice not held",
			objs: func(t *testing.T) []runtime.Object {
				p := gpuPodOn(t, "train", "n1", 8192)
				p.Status.Phase = v1.PodFailed
				p.Status.Conditions = []v1.PodCondition{{Type: gpu.ConditionIsolation, Status: v1.ConditionFalse, Message: "main on GPU-n1: memory=none,compute=none (none: accounted)"}}
				p.Status.ContainerStatuses = []v1.ContainerStatus{{Name: "main", State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 1, Reason: "Error",
					Message: "RuntimeError: CUDA error: CUDA_ERROR_OUT_OF_MEMORY: out of memory"}}}}
				return append(healthy(t), p)
			},
			id: "oom.gpu-containers", sev: Warning, want: []string{"ml/train/main", "8192 MiB slice of GPU-n1 (memory held by none)", "memory-hard"}},
		{name: "CUDA_ERROR_OUT_OF_MEMORY in an event on a running pod",
			objs: func(t *testing.T) []runtime.Object {
				p := gpuPodOn(t, "serve", "n1", 16384)
				p.Status.Phase = v1.PodRunning
				p.Status.Conditions = []v1.PodCondition{{Type: gpu.ConditionIsolation, Status: v1.ConditionFalse, Message: "main on GPU-n1: memory=kernel,compute=none"}}
				p.Status.ContainerStatuses = []v1.ContainerStatus{{Name: "main", State: v1.ContainerState{Running: &v1.ContainerStateRunning{}}}}
				ev := &v1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "serve.oom"}, Reason: "ModelLoadFailed",
					InvolvedObject: v1.ObjectReference{Kind: "Pod", Namespace: "ml", Name: "serve", FieldPath: "spec.containers{main}"},
					Message:        "loading the model: CUDA_ERROR_OUT_OF_MEMORY"}
				return append(healthy(t), p, ev)
			},
			id: "oom.gpu-containers", sev: Warning, want: []string{"ml/serve/main", "16384 MiB slice", "held by kernel", "too small"}},
		{name: "stalled GPU", objs: healthy, opts: func(o *ClusterOptions) { o.AgentMetrics = []string{stallServer.URL} },
			id: "stall.gpu", sev: Warning, want: []string{"n1 GPU-n1", "stalled 40% of its busy samples", "longer time slice"}},
		{name: "a DRA node without its ResourceSlice",
			objs: func(t *testing.T) []runtime.Object { return append(healthy(t)[1:], draNode(t, "n1", true, true)) },
			id:   "dra.slice", sev: Error, want: []string{"n1", "publishes no gpu.tessera.dev ResourceSlice", "spec.nodeName=n1", "kubectl get resourceslices"}},
		{name: "a DRA node with its ResourceSlice",
			objs: func(t *testing.T) []runtime.Object {
				return append(healthy(t)[1:], draNode(t, "n1", true, true), draSlice("n1", 1))
			},
			id: "dra.slice", sev: OK, want: []string{"n1", "serves 1 GPU(s) through DRA"}},
		{name: "a DRA node's slice short of a GPU",
			objs: func(t *testing.T) []runtime.Object {
				return append(healthy(t)[1:], draNode(t, "n1", true, true), draSlice("n1", 0))
			},
			id: "dra.slice", sev: Warning, want: []string{"lists 0 device(s), its inventory 1 GPU(s)"}},
		{name: "a node labelled for DRA whose agent serves the plugin",
			objs: func(t *testing.T) []runtime.Object { return append(healthy(t)[1:], draNode(t, "n1", true, false)) },
			id:   "dra.node", sev: Warning, want: []string{"labelled tessera.dev/dra=true but its agent serves the device plugin", "agent.dra is never"}},
		{name: "admission policies missing or unbound",
			objs: func(t *testing.T) []runtime.Object {
				objs := healthy(t)[:5]
				return append(objs, &admissionv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: "tessera-checkpointed"}})
			},
			id: "policies.installed", sev: Error, want: []string{"tessera-scheduler-annotations", "forge their GPU assignment"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset(tt.objs(t)...)
			// The agents' pods answer no scrape here (their metrics are
			// given by URL where a case needs them).
			client.PrependProxyReactor("pods", func(k8stesting.Action) (bool, restclient.ResponseWrapper, error) {
				return true, noScrape{}, nil
			})
			client.Discovery().(*fakediscovery.FakeDiscovery).FakedServerVersion = &version.Info{GitVersion: "v1.37.2"}
			if tt.version != "" {
				client.Discovery().(*fakediscovery.FakeDiscovery).FakedServerVersion = &version.Info{GitVersion: tt.version}
			}
			o := ClusterOptions{Namespace: "tessera-system", LeaseNamespace: "kube-system", Now: now}
			if tt.opts != nil {
				tt.opts(&o)
			}
			got := DiagnoseCluster(context.Background(), client, o, 5*time.Second)
			if tt.name == "healthy" {
				for _, f := range got {
					if f.Severity > Info {
						t.Errorf("healthy cluster: %s %s %s: %s (%s)", f.Severity, f.ID, f.Subject, f.Summary, f.Evidence)
					}
				}
			}
			var hit *Finding
			for _, f := range find(got, tt.id) {
				if f.Severity == tt.sev {
					hit = &f
					break
				}
			}
			if hit == nil {
				t.Fatalf("no %s finding of %s; found %+v", tt.sev, tt.id, got)
			}
			text := hit.Subject + "\n" + hit.Summary + "\n" + hit.Evidence + "\n" + hit.Remedy
			for _, w := range tt.want {
				if !strings.Contains(text, w) {
					t.Errorf("%s lacks %q:\n%s", tt.id, w, text)
				}
			}
		})
	}
}

func TestHistogramQuantile(t *testing.T) {
	mfs, err := agentendpoint.Parse(strings.NewReader(`# TYPE h histogram
h_bucket{le="1"} 50
h_bucket{le="2"} 100
h_bucket{le="+Inf"} 100
h_sum 100
h_count 100
`))
	if err != nil {
		t.Fatal(err)
	}
	for q, want := range map[float64]float64{0.5: 1, 0.75: 1.5, 0.99: 1.98} {
		if got, n, ok := histogramQuantile(mfs["h"], q); !ok || n != 100 || got < want-1e-9 || got > want+1e-9 {
			t.Errorf("q%.2f = %v (%d, %v), want %v", q, got, n, ok, want)
		}
	}
	if _, _, ok := histogramQuantile(nil, 0.99); ok {
		t.Error("a missing histogram has a quantile")
	}
}

// noScrape is a pod proxy that answers no request.
type noScrape struct{}

func (noScrape) DoRaw(context.Context) ([]byte, error) {
	return nil, errors.New("no agent serves metrics in this test")
}

func (noScrape) Stream(context.Context) (io.ReadCloser, error) {
	return nil, errors.New("no agent serves metrics in this test")
}
