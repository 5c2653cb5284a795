package nodepreempt

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/preemption"
)

// pod is a pod of node n1 holding GPUs, under a notice when noticed,
// having reported a checkpoint when saved.
func pod(t *testing.T, uid string, phase v1.PodPhase, noticed, saved bool, gpus ...string) *v1.Pod {
	t.Helper()
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: uid, Namespace: "ns", UID: types.UID(uid), Annotations: map[string]string{}},
		Spec: v1.PodSpec{NodeName: "n1"}, Status: v1.PodStatus{Phase: phase}}
	if len(gpus) > 0 {
		a := &gpu.PodAssignment{Node: "n1"}
		for _, g := range gpus {
			a.Containers = append(a.Containers, gpu.ContainerAssignment{Name: "c" + g, Mode: gpu.ModeExclusive,
				GPUs: []gpu.GPUGrant{{UUID: g, MemoryMiB: 81920, CoresPerMille: 1000}}})
		}
		enc, err := gpu.EncodeAssignment(a)
		if err != nil {
			t.Fatal(err)
		}
		p.Annotations[gpu.AnnotationAssignment] = enc
	}
	if noticed {
		n := &preemption.Notice{Preemptor: "ns/big", Node: "n1", NoticeAt: time.Unix(0, 0), Deadline: time.Unix(30, 0)}
		p.Annotations[preemption.AnnotationNotice] = n.Encode()
	}
	if saved {
		p.Annotations[preemption.AnnotationCheckpointed] = "2026-12-07T00:00:00Z"
	}
	return p
}

// TestPlan: what one look at the node's pods asks, from the pods and the
// victims known.
func TestPlan(t *testing.T) {
	type want struct {
		Notify     map[string][]string // pod → its GPUs
		Checkpoint []string
		Withdraw   []string
		Reclaim    []string
	}
	for _, tc := range []struct {
		name    string
		pods    func(t *testing.T) []*v1.Pod
		victims map[types.UID]known
		claims  map[types.UID][]string
		want    want
	}{
		{"no notice, no victim", func(t *testing.T) []*v1.Pod {
			return []*v1.Pod{pod(t, "a", v1.PodRunning, false, false, "GPU-0")}
		}, nil, nil, want{}},
		{"a new victim is notified and looked at for a checkpoint, its GPUs each once", func(t *testing.T) []*v1.Pod {
			return []*v1.Pod{pod(t, "v", v1.PodRunning, true, false, "GPU-0", "GPU-1", "GPU-0")}
		}, nil, nil, want{Notify: map[string][]string{"v": {"GPU-0", "GPU-1"}}, Checkpoint: []string{"v"}}},
		{"a known victim is not notified again; one that reported its checkpoint is not looked at", func(t *testing.T) []*v1.Pod {
			return []*v1.Pod{pod(t, "v", v1.PodRunning, true, true, "GPU-0")}
		}, map[types.UID]known{"v": {}}, nil, want{}},
		{"a victim whose notice was taken back while it runs is withdrawn", func(t *testing.T) []*v1.Pod {
			return []*v1.Pod{pod(t, "v", v1.PodRunning, false, false, "GPU-0")}
		}, map[types.UID]known{"v": {}}, nil, want{Withdraw: []string{"v"}}},
		{"victims that finished or left are reclaimed, not those being reclaimed", func(t *testing.T) []*v1.Pod {
			return []*v1.Pod{pod(t, "done", v1.PodSucceeded, true, true, "GPU-0"), pod(t, "failed", v1.PodFailed, false, false, "GPU-1")}
		}, map[types.UID]known{"done": {}, "failed": {}, "left": {}, "busy": {reclaiming: true}}, nil, want{Reclaim: []string{"done", "failed", "left"}}},
		// A finished pod's assignment holds nothing (podgpu.BoundAssignment).
		{"a pod that finished under a notice no agent saw is notified and reclaimed at once", func(t *testing.T) []*v1.Pod {
			return []*v1.Pod{pod(t, "late", v1.PodFailed, true, false, "GPU-0")}
		}, nil, nil, want{Notify: map[string][]string{"late": nil}, Checkpoint: []string{"late"}, Reclaim: []string{"late"}}},
		{"an assignment on another node gives no GPUs", func(t *testing.T) []*v1.Pod {
			p := pod(t, "v", v1.PodRunning, true, true)
			enc, _ := gpu.EncodeAssignment(&gpu.PodAssignment{Node: "n2", Containers: []gpu.ContainerAssignment{{Name: "m", Mode: gpu.ModeExclusive,
				GPUs: []gpu.GPUGrant{{UUID: "GPU-9", MemoryMiB: 1, CoresPerMille: 1000}}}}})
			p.Annotations[gpu.AnnotationAssignment] = enc
			return []*v1.Pod{p}
		}, nil, nil, want{Notify: map[string][]string{"v": nil}}},
		// A claim holder's GPUs are its prepared claims' (issue 42):
		// reclaimed as a device-plugin pod's, each GPU once.
		{"a claim holder's GPUs come from its claims", func(t *testing.T) []*v1.Pod {
			return []*v1.Pod{pod(t, "holder", v1.PodRunning, true, true), pod(t, "both", v1.PodRunning, true, true, "GPU-0")}
		}, nil, map[types.UID][]string{"holder": {"GPU-3", "GPU-5"}, "both": {"GPU-0", "GPU-1"}, "other": {"GPU-7"}},
			want{Notify: map[string][]string{"holder": {"GPU-3", "GPU-5"}, "both": {"GPU-0", "GPU-1"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := plan("n1", tc.pods(t), tc.victims, tc.claims)
			var got want
			for _, nv := range s.notify {
				if got.Notify == nil {
					got.Notify = map[string][]string{}
				}
				got.Notify[nv.pod.Name] = nv.gpus
				if nv.notice == nil || nv.notice.Preemptor != "ns/big" {
					t.Errorf("notice of %s: %+v", nv.pod.Name, nv.notice)
				}
			}
			for _, p := range s.checkpoint {
				got.Checkpoint = append(got.Checkpoint, p.Name)
			}
			for _, uid := range s.withdraw {
				got.Withdraw = append(got.Withdraw, string(uid))
			}
			for _, uid := range s.reclaim {
				got.Reclaim = append(got.Reclaim, string(uid))
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("plan (-want +got):\n%s", d)
			}
		})
	}
}
