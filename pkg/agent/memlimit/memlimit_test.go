package memlimit

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/nvml"
	"github.com/tessera-gpu/tessera/pkg/nvml/nvmltest"
)

const mib = 1 << 20

func slice(uuid string, memMiB int64, mode gpu.SharingMode, name string) gpu.ContainerAssignment {
	return gpu.ContainerAssignment{Name: name, Mode: mode, GPUs: []gpu.GPUGrant{{UUID: uuid, MemoryMiB: memMiB, CoresPerMille: 100}}}
}

func TestPlan(t *testing.T) {
	offer := &gpu.IsolationOffer{KernelMemoryLimits: true}
	gpus := []gpu.Device{
		{Index: 0, UUID: "A", MemoryMiB: 80000, Isolation: offer},
		{Index: 1, UUID: "B", MemoryMiB: 80000}, // no kernel limits
		{Index: 2, UUID: "C", MemoryMiB: 80000, Isolation: offer},
	}
	pods := []Pod{
		{UID: "p1", Assignment: &gpu.PodAssignment{Node: "n", Containers: []gpu.ContainerAssignment{slice("A", 20000, gpu.ModeTimeSlicing, "a"), slice("B", 20000, gpu.ModeTimeSlicing, "b")}}},
		{UID: "p2", Assignment: &gpu.PodAssignment{Node: "n", Containers: []gpu.ContainerAssignment{slice("A", 30000, gpu.ModeMPS, "a")}}},
		// GPU C oversubscribed 1.5x: 60000 + 60000 MiB on 80000.
		{UID: "p3", Assignment: &gpu.PodAssignment{Node: "n", Containers: []gpu.ContainerAssignment{slice("C", 60000, gpu.ModeTimeSlicing, "a")}}},
		{UID: "p4", Assignment: &gpu.PodAssignment{Node: "n", Containers: []gpu.ContainerAssignment{slice("C", 30000, gpu.ModeTimeSlicing, "a"), slice("C", 30000, gpu.ModeTimeSlicing, "b")}}},
		// A whole GPU gets no limit.
		{UID: "p5", Assignment: &gpu.PodAssignment{Node: "n", Containers: []gpu.ContainerAssignment{{Name: "w", Mode: gpu.ModeExclusive, GPUs: []gpu.GPUGrant{{UUID: "A", MemoryMiB: 80000, CoresPerMille: 1000}}}}}},
		{UID: "p6"},
	}
	want := map[Key]Want{
		{"p1", "A"}: {Soft: 20000 * mib, Hard: 20000 * mib},
		{"p2", "A"}: {Soft: 30000 * mib, Hard: 30000 * mib},
		{"p3", "C"}: {Soft: 40000 * mib, Hard: 60000 * mib},
		{"p4", "C"}: {Soft: 40000 * mib, Hard: 60000 * mib}, // two containers of one pod, summed
	}
	got := Plan(pods, gpus)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Plan (-want +got):\n%s", diff)
	}
	var soft uint64
	for k, w := range got {
		if k.GPU == "C" {
			soft += w.Soft
		}
	}
	if soft > 80000*mib {
		t.Errorf("soft limits on the oversubscribed GPU add up to %d MiB, more than its 80000", soft/mib)
	}
	if diff := cmp.Diff(map[string]Want{"C": {Soft: 40000 * mib, Hard: 60000 * mib}}, ForPod(got, "p3")); diff != "" {
		t.Errorf("ForPod (-want +got):\n%s", diff)
	}
}

// node is a scratch cgroup hierarchy in kubelet's systemd layout, and a
// DGX H100 mock whose GPUs offer kernel limits (all but the last).
type node struct {
	root     string
	client   *nvml.Client
	uuids    []string
	readings []*nvmltest.Reading
}

func newNode(t *testing.T) *node {
	t.Helper()
	n := &node{root: t.TempDir()}
	srv := dgxh100.New()
	nvmltest.Install(srv, func(i int) *nvmltest.Reading {
		r := &nvmltest.Reading{KernelLimits: i < len(srv.Devices)-1}
		n.readings = append(n.readings, r)
		return r
	})
	c, err := nvml.New(srv)
	if err != nil {
		t.Fatal(err)
	}
	n.client = c
	devs, err := c.Devices()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		n.uuids = append(n.uuids, d.UUID)
	}
	if err := os.WriteFile(filepath.Join(n.root, "cgroup.controllers"), []byte("cpuset cpu io memory hugetlb pids rdma misc\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return n
}

// pod makes a pod cgroup and one container cgroup under it; systemd says
// which driver's layout.
func (n *node) pod(t *testing.T, uid, qos string, systemd bool) (pod, ctr string) {
	t.Helper()
	if systemd {
		u := strings.ReplaceAll(uid, "-", "_")
		if qos == "" {
			pod = filepath.Join(n.root, "kubepods.slice", "kubepods-pod"+u+".slice")
		} else {
			pod = filepath.Join(n.root, "kubepods.slice", "kubepods-"+qos+".slice", "kubepods-"+qos+"-pod"+u+".slice")
		}
		ctr = filepath.Join(pod, "cri-containerd-"+strings.Repeat("ab", 32)+".scope")
	} else {
		pod = filepath.Join(n.root, "kubepods", qos, "pod"+uid)
		ctr = filepath.Join(pod, strings.Repeat("cd", 32))
	}
	if err := os.MkdirAll(ctr, 0o755); err != nil {
		t.Fatal(err)
	}
	return pod, ctr
}

const (
	uid1 = "0c6e1a9a-3a9e-4f0e-9a55-6f7b2f2bb1de"
	uid2 = "1d7f2b0b-4b0f-4f1f-8b66-7f8c3f3cc2ef"
	uid3 = "2e803c1c-5c10-4f2f-9c77-809d404dd3f0"
)

func TestPodCgroupsBothDrivers(t *testing.T) {
	n := newNode(t)
	p1, _ := n.pod(t, uid1, "burstable", true)
	p2, _ := n.pod(t, uid2, "", true)
	p3, _ := n.pod(t, uid3, "besteffort", false)
	l := &Limiter{NVML: n.client, Root: n.root}
	got, err := l.PodCgroups()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{uid1: p1, uid2: p2, uid3: p3}, got); diff != "" {
		t.Errorf("PodCgroups (-want +got):\n%s", diff)
	}
	if _, err := (&Limiter{Root: t.TempDir()}).PodCgroups(); err == nil || !strings.Contains(err.Error(), "no kubepods cgroup") {
		t.Errorf("no kubepods: %v", err)
	}
	if _, err := l.PodCgroup("99999999-0000-0000-0000-000000000000"); !errors.Is(err, ErrNoPodCgroup) {
		t.Errorf("unknown pod: %v, want ErrNoPodCgroup", err)
	}
}

// TestApplyPodHoldsTheTenant: after ApplyPod, a simulated process in the
// container's cgroup gets exactly its grant and not a byte more.
func TestApplyPodHoldsTheTenant(t *testing.T) {
	n := newNode(t)
	_, ctr := n.pod(t, uid1, "burstable", true)
	l := &Limiter{NVML: n.client, Root: n.root}
	if err := l.ApplyPod(context.Background(), uid1, map[string]Want{n.uuids[0]: {Soft: 8192 * mib, Hard: 8192 * mib}}); err != nil {
		t.Fatal(err)
	}
	lim := n.readings[0].Limits
	if err := lim.Allocate(ctr, 8192*mib); err != nil {
		t.Fatalf("the grant itself: %v", err)
	}
	if err := lim.Allocate(ctr, mib); !errors.Is(err, nvmltest.ErrOutOfMemory) {
		t.Fatalf("1 MiB past the grant: %v, want out of memory", err)
	}
	// A GPU without the feature, and a pod without a cgroup, fail the pod.
	if err := l.ApplyPod(context.Background(), uid1, map[string]Want{n.uuids[7]: {Hard: mib}}); !errors.Is(err, nvml.ErrNotSupported) {
		t.Errorf("GPU without kernel limits: %v", err)
	}
	if err := l.ApplyPod(context.Background(), uid2, map[string]Want{n.uuids[0]: {Hard: mib}}); !errors.Is(err, ErrNoPodCgroup) {
		t.Errorf("pod without a cgroup: %v", err)
	}
}

// TestReconcile: missing limits are set, soft limits follow the plan, a
// limit no active pod should have (left by a crashed agent) is cleared, and
// a pod whose cgroup is gone is skipped.
func TestReconcile(t *testing.T) {
	n := newNode(t)
	p1, _ := n.pod(t, uid1, "burstable", true)
	p2, _ := n.pod(t, uid2, "besteffort", true)
	leftover, _ := n.pod(t, uid3, "burstable", true)
	a, b := n.uuids[0], n.uuids[1]
	// A crashed agent left uid3's limit, and an old soft limit on uid1.
	for _, s := range []struct {
		uuid, cg   string
		soft, hard uint64
	}{{a, leftover, mib, 2 * mib}, {a, p1, 1000 * mib, 4096 * mib}} {
		if err := n.client.SetMemoryLimits(s.uuid, s.cg, s.soft, s.hard); err != nil {
			t.Fatal(err)
		}
	}
	plan := map[Key]Want{
		{uid1, a}:       {Soft: 4096 * mib, Hard: 4096 * mib},
		{uid2, b}:       {Soft: 2048 * mib, Hard: 2048 * mib},
		{"gone-pod", a}: {Soft: mib, Hard: mib},
	}
	l := &Limiter{NVML: n.client, Root: n.root}
	res, err := l.Reconcile(context.Background(), plan, n.uuids[:2])
	if err != nil {
		t.Fatal(err)
	}
	if want := (Result{Set: 1, Updated: 1, Cleared: 1}); res != want {
		t.Errorf("Reconcile = %+v, want %+v", res, want)
	}
	if diff := cmp.Diff([]string{p1}, n.readings[0].Limits.Cgroups()); diff != "" {
		t.Errorf("GPU 0's limited cgroups (-want +got):\n%s", diff)
	}
	if soft, hard, ok := n.readings[1].Limits.Limit(p2); !ok || soft != 2048*mib || hard != 2048*mib {
		t.Errorf("uid2 on GPU 1: %d/%d %v", soft, hard, ok)
	}
	// A second pass has nothing to do.
	if res, err := l.Reconcile(context.Background(), plan, n.uuids[:2]); err != nil || res != (Result{}) {
		t.Errorf("second pass: %+v, %v; want nothing done", res, err)
	}
	// The pod ends: its limits go.
	delete(plan, Key{uid1, a})
	if res, _ := l.Reconcile(context.Background(), plan, n.uuids[:2]); res.Cleared != 1 {
		t.Errorf("after uid1 ended: %+v, want one cleared", res)
	}
}

func TestProbe(t *testing.T) {
	n := newNode(t)
	l := &Limiter{NVML: n.client, Root: n.root}
	offered, why, err := l.Probe([]string{n.uuids[0], n.uuids[7]})
	if err != nil {
		t.Fatal(err)
	}
	if !offered[n.uuids[0]] || offered[n.uuids[7]] {
		t.Errorf("offered = %v, want GPU 0 only", offered)
	}
	if w := why[n.uuids[7]]; !strings.Contains(w, "not supported") || !strings.Contains(w, "no dmem cgroup controller") {
		t.Errorf("why GPU 7 = %q, want the driver's answer and the missing dmem controller", w)
	}
	if entries, _ := filepath.Glob(filepath.Join(n.root, "tessera-probe-*")); len(entries) != 0 {
		t.Errorf("scratch cgroup left behind: %v", entries)
	}
	if _, _, err := (&Limiter{NVML: n.client, Root: t.TempDir()}).Probe(n.uuids[:1]); err == nil || !strings.Contains(err.Error(), "not a cgroup v2 hierarchy") {
		t.Errorf("no cgroup v2: %v", err)
	}
}
