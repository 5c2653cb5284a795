package scheduler

import (
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/preemption"
	"github.com/tessera-gpu/tessera/pkg/scheduler/cache"
	"github.com/tessera-gpu/tessera/pkg/scheduler/schedtest"
)

// update rewrites the golden files of this package's datadriven tests with
// what the code does now: go test ./pkg/scheduler -run Golden -update, then
// review the diff.
var update = flag.Bool("update", false, "rewrite testdata's expected results with this run's")

func runGolden(t *testing.T, path string, f func(t *testing.T, d *datadriven.TestData) string) {
	t.Helper()
	if *update {
		if err := flag.Set("rewrite", "true"); err != nil {
			t.Fatal(err)
		}
	}
	datadriven.RunTest(t, path, f)
}

// preemptionScene builds a preemptionView from a golden file's commands.
type preemptionScene struct {
	t     *testing.T
	now   time.Time
	order []string
	nodes map[string]*nodeView
	pods  []*v1.Pod
	pdbs  []*policyv1.PodDisruptionBudget
}

func newPreemptionScene(t *testing.T) *preemptionScene {
	return &preemptionScene{t: t, now: time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC), nodes: map[string]*nodeView{}}
}

func argOr(d *datadriven.TestData, key, def string) string {
	for _, a := range d.CmdArgs {
		if a.Key == key && len(a.Vals) > 0 {
			return a.Vals[0]
		}
	}
	return def
}

func intArg(t *testing.T, d *datadriven.TestData, key string, def int64) int64 {
	s := argOr(d, key, "")
	if s == "" {
		return def
	}
	var v int64
	if _, err := fmt.Sscan(s, &v); err != nil {
		t.Fatalf("%s: %s=%q is not a number", d.Pos, key, s)
	}
	return v
}

func modeArg(d *datadriven.TestData) gpu.SharingMode {
	switch argOr(d, "mode", "exclusive") {
	case "ts":
		return gpu.ModeTimeSlicing
	case "mps":
		return gpu.ModeMPS
	default:
		return gpu.ModeExclusive
	}
}

// pod is a GPU pod of the scene: name is its UID too.
func (s *preemptionScene) pod(d *datadriven.TestData) *v1.Pod {
	name := argOr(d, "name", "")
	prio := int32(intArg(s.t, d, "prio", 0))
	age, err := time.ParseDuration(argOr(d, "age", "10m"))
	if err != nil {
		s.t.Fatalf("%s: %v", d.Pos, err)
	}
	created := metav1.NewTime(s.now.Add(-age))
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: name, UID: types.UID(name), CreationTimestamp: created,
			Labels: map[string]string{"app": argOr(d, "app", name)}, Annotations: map[string]string{}},
		Spec: v1.PodSpec{Priority: &prio, Containers: []v1.Container{{Name: "m", Resources: v1.ResourceRequirements{
			Limits: v1.ResourceList{gpu.ResourceGPU: resource.MustParse(argOr(d, "gpus", "1"))}}}}},
		Status: v1.PodStatus{StartTime: &created},
	}
}

// grantOf is the assignment of a command's gpu, mem and cores on its node.
func (s *preemptionScene) grantOf(d *datadriven.TestData) *gpu.PodAssignment {
	node := argOr(d, "node", "")
	return schedtest.Grant(node, int(intArg(s.t, d, "gpu", 0)), intArg(s.t, d, "mem", 81920), int(intArg(s.t, d, "cores", 100))*10, modeArg(d))
}

func (s *preemptionScene) node(name string, d *datadriven.TestData) *nodeView {
	nv, ok := s.nodes[name]
	if !ok {
		s.t.Fatalf("%s: no node %q (declare it with node first)", d.Pos, name)
	}
	return nv
}

func (s *preemptionScene) book(d *datadriven.TestData, a *gpu.PodAssignment) {
	if err := s.node(a.Node, d).usage.AddAssignment(a, 0, 0, 1.5); err != nil {
		s.t.Fatalf("%s: %v", d.Pos, err)
	}
}

func (s *preemptionScene) request(d *datadriven.TestData) *allocator.Request {
	mem, cores := intArg(s.t, d, "mem", 0), int(intArg(s.t, d, "cores", 0))
	if mem == 0 && cores == 0 {
		return schedtest.WholeGPUs(int(intArg(s.t, d, "gpus", 1)))
	}
	r := schedtest.SliceOf(modeArg(d), mem, cores)
	r.Containers[0].Count = int(intArg(s.t, d, "gpus", 1))
	// exclusive with a size: whole GPUs of at least that memory.
	r.Containers[0].Whole = r.Sharing == gpu.ModeExclusive
	return r
}

func (s *preemptionScene) run(d *datadriven.TestData) string {
	switch d.Cmd {
	case "node":
		name := argOr(d, "name", "")
		n, err := allocator.NewNode(schedtest.Inventory(name, int(intArg(s.t, d, "gpus", 1)), intArg(s.t, d, "mem", 81920), false))
		if err != nil {
			s.t.Fatal(err)
		}
		n.CPUMilli, n.MemoryMiB = cache.Unlimited, cache.Unlimited
		s.nodes[name] = &nodeView{name: name, usage: n}
		s.order = append(s.order, name)
	case "bound":
		pod, a := s.pod(d), s.grantOf(d)
		pod.Spec.NodeName = a.Node
		if by := argOr(d, "victim-of", ""); by != "" {
			pod.Annotations[preemption.AnnotationNotice] = (&preemption.Notice{Preemptor: "ml/" + by, PreemptorUID: by, Node: a.Node}).Encode()
		}
		s.book(d, a)
		nv := s.node(a.Node, d)
		nv.bound = append(nv.bound, boundPod{pod: pod, assignment: a})
		s.pods = append(s.pods, pod)
	case "reclaiming":
		a := s.grantOf(d)
		s.book(d, a)
		nv := s.node(a.Node, d)
		nv.reclaiming = append(nv.reclaiming, cache.ReclaimingVictim{Assignment: a, Preemptor: types.UID(argOr(d, "preemptor", ""))})
	case "nominated":
		pod := s.pod(d)
		pod.Status.NominatedNodeName = argOr(d, "node", "")
		nv := s.node(pod.Status.NominatedNodeName, d)
		nv.nominated = append(nv.nominated, nominatedPreemptor{pod: pod, req: s.request(d)})
		s.pods = append(s.pods, pod)
	case "budget":
		allowed := int32(intArg(s.t, d, "allowed", 0))
		one := intstr.FromInt32(1)
		s.pdbs = append(s.pdbs, &policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "pdb-" + argOr(d, "app", ""), UID: types.UID("pdb-" + argOr(d, "app", ""))},
			Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": argOr(d, "app", "")}}},
			Status:     policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: allowed},
		})
	case "plan":
		preemptor := s.pod(d)
		if !mayPreempt(preemptor, s.pods) {
			return "no plan: no GPU pod of lower priority to evict"
		}
		v := &preemptionView{now: s.now, pdbs: s.pdbs}
		for _, name := range s.order {
			v.nodes = append(v.nodes, *s.nodes[name])
		}
		c := planPreemption(schedtest.NewAllocator(s.t), 1.5, preemptor, s.request(d), v)
		if c == nil {
			return "no plan: no node fits the pod even without every lower-priority GPU pod it may evict"
		}
		if len(c.victims) == 0 {
			return fmt.Sprintf("node %s, no new victims: the slices already on their way suffice", c.node)
		}
		var out []string
		for _, vc := range c.victims {
			out = append(out, fmt.Sprintf("%s (priority %d, %.0f GPU-seconds)", vc.pod.Name, vc.priority, vc.gpuSeconds))
		}
		return fmt.Sprintf("node %s, victims: %s", c.node, strings.Join(out, ", "))
	default:
		s.t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
	}
	return ""
}

// TestGoldenPreemptionPlans replays the preemption scenarios of
// testdata/preemption/*.txt through planPreemption: nodes, the pods on them
// (bound, nominated, victims awaiting reclaim), budgets, and the plan for a
// preemptor. A change of behaviour shows as a diff of those files.
func TestGoldenPreemptionPlans(t *testing.T) {
	datadriven.Walk(t, "testdata/preemption", func(t *testing.T, path string) {
		var s *preemptionScene
		runGolden(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd == "reset" || s == nil {
				s = newPreemptionScene(t)
				if d.Cmd == "reset" {
					return ""
				}
			}
			s.t = t
			return s.run(d)
		})
	})
}
