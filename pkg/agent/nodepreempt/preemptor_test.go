package nodepreempt

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/pkg/agent/reclaim"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/nvml"
	"github.com/tessera-gpu/tessera/pkg/nvml/nvmltest"
	"github.com/tessera-gpu/tessera/pkg/preemption"
)

// TestNoticeReachesTheWorkload: a victim's notice lands in its notice
// directory, and, as its pod asked, as a signal to its GPU processes and a
// POST to the pod.
func TestNoticeReachesTheWorkload(t *testing.T) {
	const uid = "0c6e1a9a-3a9e-4f0e-9a55-6f7b2f2bb1de"
	srv := dgxh100.New()
	nvmltest.Install(srv, func(i int) *nvmltest.Reading {
		r := &nvmltest.Reading{SMCount: 132}
		if i == 0 {
			r.Procs = []gonvml.ProcessInfo{{Pid: 4242}, {Pid: 5353}} // the victim's, and a host process
		}
		return r
	})
	procRoot := t.TempDir()
	for pid, cg := range map[int]string{
		4242: fmt.Sprintf("0::/kubepods.slice/kubepods-pod%s.slice/cri-containerd-%064d.scope\n", uid, 1),
		5353: "0::/system.slice/sshd.service\n",
	} {
		dir := filepath.Join(procRoot, fmt.Sprint(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	uuid0, _ := srv.Devices[0].GetUUID()

	var mu sync.Mutex
	var signalled []string
	posted := make(chan []byte, 1)
	pod := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/checkpoint" || r.Method != http.MethodPost {
			http.NotFound(w, r)
			return
		}
		b, _ := io.ReadAll(r.Body)
		posted <- b
	}))
	defer pod.Close()
	_, port, _ := net.SplitHostPort(pod.Listener.Addr().String())

	n := &preemption.Notice{Preemptor: "prod/urgent", PreemptorUID: "p", Node: "n1", NoticeAt: time.Now(), Deadline: time.Now().Add(time.Minute)}
	asg, _ := gpu.EncodeAssignment(&gpu.PodAssignment{Node: "n1", Containers: []gpu.ContainerAssignment{{Name: "main", Mode: gpu.ModeExclusive,
		GPUs: []gpu.GPUGrant{{UUID: uuid0, MemoryMiB: 81920, CoresPerMille: 1000}}}}})
	victim := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "lab", UID: uid, Annotations: map[string]string{
		gpu.AnnotationAssignment: asg, preemption.AnnotationNotice: n.Encode(),
		preemption.AnnotationSignal: "SIGUSR1", preemption.AnnotationURL: "http://:" + port + "/checkpoint",
	}}, Spec: v1.PodSpec{NodeName: "n1"}, Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: "127.0.0.1"}}

	noticeRoot := t.TempDir()
	signal := func(pid uint32, sig syscall.Signal) error {
		mu.Lock()
		defer mu.Unlock()
		signalled = append(signalled, fmt.Sprintf("%d:%v", pid, sig))
		return nil
	}
	a := newTestPreemptor(t, srv, procRoot, noticeRoot, func() []*v1.Pod { return []*v1.Pod{victim} }, fake.NewClientset(), signal)
	a.Pass(context.Background(), time.Now())

	b, err := os.ReadFile(filepath.Join(noticeRoot, uid, preemption.NoticeFile))
	if err != nil {
		t.Fatal(err)
	}
	var got preemption.Notice
	if err := json.Unmarshal(b, &got); err != nil || got.Preemptor != "prod/urgent" {
		t.Fatalf("notice file %s: %v", b, err)
	}
	select {
	case body := <-posted:
		if err := json.Unmarshal(body, &got); err != nil || got.Preemptor != "prod/urgent" {
			t.Errorf("posted %s", body)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the pod's checkpoint URL was not called")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		s := fmt.Sprint(signalled)
		mu.Unlock()
		if s == fmt.Sprintf("[4242:%v]", syscall.SIGUSR1) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("signalled %s; want SIGUSR1 to the victim's GPU process only", s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestNoticeTrustsNothingThePodPlaced: the victim's containers can write its
// notice directory and choose what its checkpoint URL answers. A symlink
// placed at the notice's name is replaced, not written through (the agent
// runs as root on the host); one at the checkpoint marker's name is no
// checkpoint; a redirect from the pod is not followed.
func TestNoticeTrustsNothingThePodPlaced(t *testing.T) {
	const uid = "5b0f8f4e-1111-4e0f-9a55-6f7b2f2bb1de"
	srv := dgxh100.New()
	nvmltest.Install(srv, func(int) *nvmltest.Reading { return &nvmltest.Reading{SMCount: 132} })
	uuid0, _ := srv.Devices[0].GetUUID()

	hostDir := t.TempDir()
	hostFile := filepath.Join(hostDir, "shadow")
	if err := os.WriteFile(hostFile, []byte("root:x:0:0"), 0o600); err != nil {
		t.Fatal(err)
	}
	noticeRoot := t.TempDir()
	dir := filepath.Join(noticeRoot, uid)
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(hostFile, filepath.Join(dir, preemption.NoticeFile)); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(hostFile, filepath.Join(dir, preemption.CheckpointedFile)); err != nil {
		t.Fatal(err)
	}

	elsewhere := make(chan string, 1)
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { elsewhere <- r.Method + " " + r.URL.Path }))
	defer target.Close()
	answered := make(chan struct{}, 1)
	pod := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+"/admin/delete-everything", http.StatusTemporaryRedirect)
		answered <- struct{}{}
	}))
	defer pod.Close()
	_, port, _ := net.SplitHostPort(pod.Listener.Addr().String())

	n := &preemption.Notice{Preemptor: "prod/urgent", Node: "n1", NoticeAt: time.Now(), Deadline: time.Now().Add(time.Minute)}
	asg, _ := gpu.EncodeAssignment(&gpu.PodAssignment{Node: "n1", Containers: []gpu.ContainerAssignment{{Name: "main", Mode: gpu.ModeExclusive,
		GPUs: []gpu.GPUGrant{{UUID: uuid0, MemoryMiB: 81920, CoresPerMille: 1000}}}}})
	victim := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "lab", UID: uid, Annotations: map[string]string{
		gpu.AnnotationAssignment: asg, preemption.AnnotationNotice: n.Encode(), preemption.AnnotationURL: "http://:" + port + "/checkpoint",
	}}, Spec: v1.PodSpec{NodeName: "n1"}, Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: "127.0.0.1"}}
	client := fake.NewClientset()
	a := newTestPreemptor(t, srv, t.TempDir(), noticeRoot, func() []*v1.Pod { return []*v1.Pod{victim} }, client, nil)
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx := klog.NewContext(context.Background(), logger)
	a.Pass(ctx, time.Now())

	if b, _ := os.ReadFile(hostFile); string(b) != "root:x:0:0" {
		t.Fatalf("the host file behind the pod's symlink now holds %q", b)
	}
	fi, err := os.Lstat(filepath.Join(dir, preemption.NoticeFile))
	if err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("notice is %v (%v), want a regular file in place of the symlink", fi, err)
	}
	for _, act := range client.Actions() {
		if act.GetVerb() == "patch" && act.GetResource().Resource == "pods" {
			t.Fatalf("a symlink at %s was reported as a checkpoint: %v", preemption.CheckpointedFile, act)
		}
	}
	select {
	case <-answered:
	case <-time.After(5 * time.Second):
		t.Fatal("the pod's checkpoint URL was not called")
	}
	// A followed redirect would be called before the client returned the
	// answer, which the agent then logs.
	logged := func() bool {
		return strings.Contains(logger.GetSink().(ktesting.Underlier).GetBuffer().String(), "answered with a redirect, which the agent does not follow")
	}
	for deadline := time.Now().Add(5 * time.Second); !logged() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if !logged() {
		t.Fatal("the agent did not log the pod's redirect as not followed")
	}
	select {
	case got := <-elsewhere:
		t.Fatalf("the agent followed the pod's redirect: %s", got)
	default:
	}
}

// TestNoticeDirsOfPodsThatLeftAreRemoved: every GPU container's pod gets a
// notice directory; they went away only for victims (issue 15: 364 left
// for 2 live pods). A pod's directory goes once it is off the node; a live
// pod's and a victim's being reclaimed stay.
func TestNoticeDirsOfPodsThatLeftAreRemoved(t *testing.T) {
	srv := dgxh100.New()
	nvmltest.Install(srv, func(int) *nvmltest.Reading { return &nvmltest.Reading{SMCount: 132} })
	root := t.TempDir()
	for _, uid := range []string{"live", "left-1", "left-2", "reclaiming"} {
		if err := os.MkdirAll(filepath.Join(root, uid), 0o777); err != nil {
			t.Fatal(err)
		}
	}
	live := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "live"}, Spec: v1.PodSpec{NodeName: "n1"}}
	a := newTestPreemptor(t, srv, t.TempDir(), root, func() []*v1.Pod { return []*v1.Pod{live} }, fake.NewClientset(), nil)
	a.victims["reclaiming"] = &victim{namespace: "ns", name: "v", reclaiming: true}
	a.Pass(context.Background(), time.Now())
	entries, _ := os.ReadDir(root)
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if fmt.Sprint(left) != "[live reclaiming]" {
		t.Fatalf("notice directories left: %v, want [live reclaiming]", left)
	}
}

// TestVictimThatLeftWhileTheAgentWasAwayIsReclaimed: victims are known in
// memory, so one whose pod left while the agent restarted was never listed
// as reclaimed, and the scheduler held its slices until its reclaim timeout
// (found by the soak). Its notice directory still holds the notice: the
// agent adopts it, reclaims it, lists it, and removes the directory; a
// directory without a notice is only removed.
func TestVictimThatLeftWhileTheAgentWasAwayIsReclaimed(t *testing.T) {
	srv := dgxh100.New()
	nvmltest.Install(srv, func(int) *nvmltest.Reading { return &nvmltest.Reading{SMCount: 132} })
	root := t.TempDir()
	for _, uid := range []string{"victim-left", "tenant-left"} {
		if err := os.MkdirAll(filepath.Join(root, uid), 0o777); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "victim-left", preemption.NoticeFile), []byte(`{"preemptor":"ns/big"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	a := newTestPreemptor(t, srv, t.TempDir(), root, func() []*v1.Pod { return nil }, fake.NewClientset(), nil)
	a.Pass(context.Background(), time.Now())
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := os.Stat(filepath.Join(root, "victim-left"))
		if slices.Contains(a.Reclaimed(), "victim-left") && os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the victim that left is not reclaimed: listed %v, its directory: %v", a.Reclaimed(), err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if slices.Contains(a.Reclaimed(), "tenant-left") {
		t.Error("a pod that was no victim is listed as reclaimed")
	}
	for _, uid := range []string{"victim-left", "tenant-left"} {
		if _, err := os.Stat(filepath.Join(root, uid)); !os.IsNotExist(err) {
			t.Errorf("notice directory %s left: %v", uid, err)
		}
	}
}

// newTestPreemptor is a Preemptor on node n1 over the mock driver srv, as
// the agent makes it, with events and quarantines dropped.
func newTestPreemptor(t *testing.T, srv gonvml.Interface, procRoot, noticeRoot string, pods func() []*v1.Pod, client kubernetes.Interface,
	signal func(uint32, syscall.Signal) error) *Preemptor {
	t.Helper()
	c, err := nvml.New(srv)
	if err != nil {
		t.Fatal(err)
	}
	devices, err := c.Devices()
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Node: "n1", Client: client, NodePods: pods, NoticeRoot: noticeRoot, Signal: signal,
		Reclaimer:  &reclaim.Reclaimer{GPUs: c, ProcRoot: procRoot, Kill: func(uint32) error { return nil }, Wait: time.Second, Poll: 10 * time.Millisecond},
		Quarantine: func(string, time.Time, string) {},
		Event:      func(context.Context, string, string, string) {},
		Publish:    func(context.Context) error { return nil }}
	for _, d := range devices {
		cfg.GPUs = append(cfg.GPUs, d.UUID)
	}
	return New(cfg)
}

// TestReclaimingHoldsAClaimHoldersGPUs: a victim's GPUs are named busy
// from when its pod finished or left until its reclaim ends (a claim's
// GPU is free once the claim is deallocated, leftovers or not), and not
// while it still runs under its notice; other GPUs are not busy.
func TestReclaimingHoldsAClaimHoldersGPUs(t *testing.T) {
	var pods []*v1.Pod
	p := New(Config{Node: "n1", NodePods: func() []*v1.Pod { return pods }})
	p.victims["v"] = &victim{namespace: "ns", name: "victim", gpus: []string{"GPU-1", "GPU-2"}}
	running := pod(t, "v", v1.PodRunning, true, false)
	for _, tc := range []struct {
		name string
		pods []*v1.Pod
		gpus []string
		busy bool
	}{
		{"running under its notice", []*v1.Pod{running}, []string{"GPU-1"}, false},
		{"finished", []*v1.Pod{pod(t, "v", v1.PodSucceeded, true, false)}, []string{"GPU-0", "GPU-2"}, true},
		{"gone", nil, []string{"GPU-1"}, true},
		{"gone, another GPU", nil, []string{"GPU-3"}, false},
	} {
		pods = tc.pods
		victim, busy := p.Reclaiming(tc.gpus)
		if busy != tc.busy || (busy && victim != "ns/victim") {
			t.Errorf("%s: Reclaiming(%v) = %q, %v; want busy %v", tc.name, tc.gpus, victim, busy, tc.busy)
		}
	}
	// Reclaimed: nothing is busy any more.
	delete(p.victims, "v")
	if _, busy := p.Reclaiming([]string{"GPU-1"}); busy {
		t.Error("a reclaimed victim's GPU is still busy")
	}
}
