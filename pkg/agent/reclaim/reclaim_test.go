package reclaim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// fakeGPUs is NVML's process list per GPU; kill removes a process unless it
// is stuck.
type fakeGPUs struct {
	mu    sync.Mutex
	procs map[string][]uint32
	stuck map[uint32]bool
}

func (f *fakeGPUs) Processes(uuid string) ([]uint32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if uuid == "GPU-broken" {
		return nil, errors.New("NVML: GPU is lost")
	}
	return slices.Clone(f.procs[uuid]), nil
}

func (f *fakeGPUs) kill(pid uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stuck[pid] {
		return nil
	}
	for g, ps := range f.procs {
		f.procs[g] = slices.DeleteFunc(ps, func(p uint32) bool { return p == pid })
	}
	return nil
}

const (
	victimUID = "0c6e1a9a-3a9e-4f0e-9a55-6f7b2f2bb1de"
	otherUID  = "1d7f2b0b-4b0f-4f1f-8b66-7f8c3f3cc2ef"
)

// cgroups writes each PID's cgroup into a fake /proc: 100–199 the victim's,
// 200–299 another pod's, 300+ host processes.
func cgroups(t *testing.T, pids ...uint32) string {
	t.Helper()
	root := t.TempDir()
	for _, pid := range pids {
		line := "0::/system.slice/sshd.service\n"
		switch {
		case pid < 200:
			line = fmt.Sprintf("0::/kubepods.slice/kubepods-pod%s.slice/cri-containerd-%064d.scope\n", victimUID, pid)
		case pid < 300:
			line = fmt.Sprintf("0::/kubepods/burstable/pod%s/%064d\n", otherUID, pid)
		}
		dir := filepath.Join(root, fmt.Sprint(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(line), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestReclaim(t *testing.T) {
	tests := []struct {
		name       string
		procs      map[string][]uint32
		stuck      []uint32
		gpus       []string
		wantKilled map[string][]uint32
		wantStuck  map[string][]uint32
		wantErr    error
		wantLeft   map[string][]uint32
	}{
		{
			name:       "nothing left: nothing killed",
			procs:      map[string][]uint32{"GPU-a": {201, 301}},
			gpus:       []string{"GPU-a"},
			wantKilled: map[string][]uint32{}, wantStuck: map[string][]uint32{},
			wantLeft: map[string][]uint32{"GPU-a": {201, 301}},
		},
		{
			name:       "leftovers killed; the other tenant and host processes untouched",
			procs:      map[string][]uint32{"GPU-a": {101, 201, 102}, "GPU-b": {103, 301}},
			gpus:       []string{"GPU-a", "GPU-b"},
			wantKilled: map[string][]uint32{"GPU-a": {101, 102}, "GPU-b": {103}}, wantStuck: map[string][]uint32{},
			wantLeft: map[string][]uint32{"GPU-a": {201}, "GPU-b": {301}},
		},
		{
			name:       "only the victim's GPUs are looked at",
			procs:      map[string][]uint32{"GPU-a": {101}, "GPU-c": {104}},
			gpus:       []string{"GPU-a"},
			wantKilled: map[string][]uint32{"GPU-a": {101}}, wantStuck: map[string][]uint32{},
			wantLeft: map[string][]uint32{"GPU-a": {}, "GPU-c": {104}},
		},
		{
			name:       "a process that survives kill is reported",
			procs:      map[string][]uint32{"GPU-a": {101, 102}},
			stuck:      []uint32{102},
			gpus:       []string{"GPU-a"},
			wantKilled: map[string][]uint32{"GPU-a": {101, 102}}, wantStuck: map[string][]uint32{"GPU-a": {102}},
			wantErr:  ErrStuck,
			wantLeft: map[string][]uint32{"GPU-a": {102}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeGPUs{procs: tt.procs, stuck: map[uint32]bool{}}
			var all []uint32
			for _, ps := range tt.procs {
				all = append(all, ps...)
			}
			for _, p := range tt.stuck {
				f.stuck[p] = true
			}
			var terminated []string
			r := &Reclaimer{GPUs: f, ProcRoot: cgroups(t, all...), Kill: f.kill, Wait: 200 * time.Millisecond, Poll: 10 * time.Millisecond,
				Terminate: func(_ context.Context, uuid string, pid uint32) error {
					terminated = append(terminated, fmt.Sprintf("%s/%d", uuid, pid))
					return errors.New("no MPS here")
				}}
			res, err := r.Reclaim(context.Background(), victimUID, tt.gpus)
			// Every leftover is first handed to MPS's terminate_client.
			killed := 0
			for _, ps := range res.Killed {
				killed += len(ps)
			}
			if len(terminated) != killed {
				t.Errorf("terminate_client asked for %v, killed %v", terminated, res.Killed)
			}
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Fatalf("err %v, want %v", err, tt.wantErr)
			}
			if fmt.Sprint(res.Killed) != fmt.Sprint(tt.wantKilled) || fmt.Sprint(res.Stuck) != fmt.Sprint(tt.wantStuck) {
				t.Errorf("killed %v stuck %v, want %v and %v", res.Killed, res.Stuck, tt.wantKilled, tt.wantStuck)
			}
			for g, want := range tt.wantLeft {
				if got := f.procs[g]; fmt.Sprint(got) != fmt.Sprint(want) && !(len(got) == 0 && len(want) == 0) {
					t.Errorf("GPU %s runs %v after, want %v", g, got, want)
				}
			}
		})
	}
}

// TestReclaimNVMLError: a GPU NVML cannot read is an error to retry, not a
// clean bill.
func TestReclaimNVMLError(t *testing.T) {
	f := &fakeGPUs{procs: map[string][]uint32{}}
	r := &Reclaimer{GPUs: f, ProcRoot: t.TempDir(), Kill: f.kill, Wait: time.Second, Poll: 10 * time.Millisecond}
	if _, err := r.Reclaim(context.Background(), victimUID, []string{"GPU-broken"}); err == nil || errors.Is(err, ErrStuck) {
		t.Fatalf("err %v, want NVML's", err)
	}
}
