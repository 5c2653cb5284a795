package gpu

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func randomAssignment(r *rand.Rand) *PodAssignment {
	modes := []SharingMode{ModeExclusive, ModeMPS, ModeTimeSlicing}
	a := &PodAssignment{Node: fmt.Sprintf("node-%d", r.IntN(1000))}
	for c := range 1 + r.IntN(4) {
		ca := ContainerAssignment{Name: fmt.Sprintf("c%d", c), Mode: modes[r.IntN(len(modes))]}
		for g := range 1 + r.IntN(8) {
			ca.GPUs = append(ca.GPUs, GPUGrant{
				UUID:          fmt.Sprintf("GPU-%08x-%d", r.Uint32(), g),
				Index:         g,
				MemoryMiB:     1 + r.Int64N(196608),
				CoresPerMille: 1 + r.IntN(CoresPerGPU),
			})
		}
		a.Containers = append(a.Containers, ca)
	}
	return a
}

func randomInventory(r *rand.Rand) *NodeInventory {
	n := &NodeInventory{Node: fmt.Sprintf("node-%d", r.IntN(1000)), CPUMilli: r.Int64N(256000), MemoryMiB: r.Int64N(2 << 20)}
	count := r.IntN(9)
	for i := range count {
		d := Device{Index: i, UUID: fmt.Sprintf("GPU-%d-%x", i, r.Uint64()), Model: "A100", MemoryMiB: 1 + r.Int64N(143771),
			SMCount: r.IntN(200), Healthy: r.IntN(2) == 0, MPSCapable: r.IntN(2) == 0}
		for p := range count {
			if p != i && r.IntN(3) == 0 {
				d.NVLinkPeers = append(d.NVLinkPeers, p)
			}
		}
		n.GPUs = append(n.GPUs, d)
	}
	return n
}

// TestAssignmentRoundTrip is a property test: every valid assignment survives
// encode → decode unchanged.
func TestAssignmentRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		want := randomAssignment(r)
		s, err := EncodeAssignment(want)
		if err != nil {
			t.Fatalf("case %d: encode: %v", i, err)
		}
		got, err := DecodeAssignment(s)
		if err != nil {
			t.Fatalf("case %d: decode %s: %v", i, s, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("case %d: round trip (-want +got):\n%s", i, diff)
		}
	}
}

func TestInventoryRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 2000 {
		want := randomInventory(r)
		b, err := EncodeInventory(want)
		if err != nil {
			t.Fatalf("case %d: encode: %v", i, err)
		}
		got, err := DecodeInventory(b)
		if err != nil {
			t.Fatalf("case %d: decode %s: %v", i, b, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("case %d: round trip (-want +got):\n%s", i, diff)
		}
	}
}

func TestDecodeAssignmentRejects(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr string
	}{
		{"empty", ``, "EOF"},
		{"not json", `node-1`, "invalid character"},
		{"other version", `{"v":"v2","node":"n","containers":[]}`, `version "v2"`},
		{"no version", `{"node":"n","containers":[]}`, `version ""`},
		{"no node", `{"v":"v1","node":"","containers":[]}`, "node is empty"},
		{"bad mode", `{"v":"v1","node":"n","containers":[{"name":"c","mode":"root","gpus":[{"uuid":"G","index":0,"memoryMiB":1,"cores":1}]}]}`, `mode "root"`},
		{"zero cores", `{"v":"v1","node":"n","containers":[{"name":"c","mode":"mps","gpus":[{"uuid":"G","index":0,"memoryMiB":1,"cores":0}]}]}`, "cores 0 must be 1–1000"},
		{"too many cores", `{"v":"v1","node":"n","containers":[{"name":"c","mode":"mps","gpus":[{"uuid":"G","index":0,"memoryMiB":1,"cores":1001}]}]}`, "cores 1001"},
		{"duplicate gpu", `{"v":"v1","node":"n","containers":[{"name":"c","mode":"mps","gpus":[{"uuid":"G","index":0,"memoryMiB":1,"cores":1},{"uuid":"G","index":0,"memoryMiB":1,"cores":1}]}]}`, "duplicated"},
		{"trailing", `{"v":"v1","node":"n","containers":[]} {}`, "trailing data"},
		{"too large", `{"v":"v1","node":"` + strings.Repeat("x", MaxEncodedBytes) + `"}`, "more than the"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeAssignment(tt.in)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("DecodeAssignment(%.60q) error = %v, want it to contain %q", tt.in, err, tt.wantErr)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
		})
	}
}

func TestInventoryValidate(t *testing.T) {
	ok := func() NodeInventory {
		return NodeInventory{Node: "n", CPUMilli: 1000, MemoryMiB: 1024, GPUs: []Device{
			{Index: 0, UUID: "GPU-0", MemoryMiB: 81920, NVLinkPeers: []int{1}},
			{Index: 1, UUID: "GPU-1", MemoryMiB: 81920, NVLinkPeers: []int{0}},
		}}
	}
	tests := []struct {
		name    string
		mutate  func(*NodeInventory)
		wantErr string
	}{
		{"valid", func(*NodeInventory) {}, ""},
		{"duplicate index", func(n *NodeInventory) { n.GPUs[1].Index = 0; n.GPUs[0].NVLinkPeers = nil; n.GPUs[1].NVLinkPeers = nil }, "index 0 is duplicated"},
		{"duplicate uuid", func(n *NodeInventory) { n.GPUs[1].UUID = "GPU-0" }, "uuid GPU-0 is duplicated"},
		{"zero memory", func(n *NodeInventory) { n.GPUs[0].MemoryMiB = 0 }, "gpus[0].memoryMiB 0 must be positive"},
		{"self peer", func(n *NodeInventory) { n.GPUs[0].NVLinkPeers = []int{0} }, "nvlinkPeers names 0"},
		{"missing peer", func(n *NodeInventory) { n.GPUs[0].NVLinkPeers = []int{7} }, "nvlinkPeers names 7"},
		{"no name", func(n *NodeInventory) { n.Node = "" }, "node name is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := ok()
			tt.mutate(&n)
			err := n.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate() = %v, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}

func TestParseAnnotations(t *testing.T) {
	if m, err := ParseSharingMode("mps"); err != nil || m != ModeMPS {
		t.Errorf("ParseSharingMode(mps) = %q, %v", m, err)
	}
	if m, err := ParseSharingMode(""); err != nil || m != ModeAuto {
		t.Errorf("ParseSharingMode() = %q, %v; want auto", m, err)
	}
	if w, err := ParseWorkloadClass("training"); err != nil || w != WorkloadTraining {
		t.Errorf("ParseWorkloadClass(training) = %q, %v", w, err)
	}
	if models, err := ParseModelList("A100, H100|A100"); err != nil || !cmp.Equal(models, []string{"A100", "H100"}) {
		t.Errorf("ParseModelList = %q, %v", models, err)
	}
	for _, bad := range []func() error{
		func() error { _, err := ParseSharingMode("shared"); return err },
		func() error { _, err := ParseWorkloadClass("batch"); return err },
		func() error { _, err := ParseModelList(", |"); return err },
	} {
		if err := bad(); err == nil || !errors.Is(err, ErrInvalid) {
			t.Errorf("%v, want an ErrInvalid", err)
		}
	}
}

// FuzzDecodeAssignment checks that no input panics the decoder and that whatever
// it accepts re-encodes to something it accepts again, unchanged.
func FuzzDecodeAssignment(f *testing.F) {
	r := rand.New(rand.NewPCG(5, 6))
	for range 8 {
		s, _ := EncodeAssignment(randomAssignment(r))
		f.Add(s)
	}
	f.Add(`{"v":"v1","node":"n","containers":[]}`)
	f.Add(`{"v":"v1","node":"n","containers":[{"name":"c","mode":"mps","gpus":[{"uuid":"G","index":0,"memoryMiB":1,"cores":1}]}]}`)
	f.Add(`{"v":"v1","node":"n","containers":null}`)
	f.Add(`[]`)
	f.Fuzz(func(t *testing.T, s string) {
		a, err := DecodeAssignment(s)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		out, err := EncodeAssignment(a)
		if err != nil {
			t.Fatalf("decoded assignment does not re-encode: %v", err)
		}
		b, err := DecodeAssignment(out)
		if err != nil {
			t.Fatalf("re-encoded assignment does not decode: %v", err)
		}
		if diff := cmp.Diff(a, b, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("second round trip changed it (-first +second):\n%s", diff)
		}
	})
}

func FuzzDecodeInventory(f *testing.F) {
	r := rand.New(rand.NewPCG(7, 8))
	for range 8 {
		b, _ := EncodeInventory(randomInventory(r))
		f.Add(b)
	}
	f.Add([]byte(`{"v":"v1","node":"n","cpuMilli":1,"memoryMiB":1,"gpus":[{"index":0,"uuid":"G","model":"A100","memoryMiB":1,"healthy":true,"nvlinkPeers":[0]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := DecodeInventory(b)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		out, err := EncodeInventory(n)
		if err != nil {
			t.Fatalf("decoded inventory does not re-encode: %v", err)
		}
		m, err := DecodeInventory(out)
		if err != nil {
			t.Fatalf("re-encoded inventory does not decode: %v", err)
		}
		if diff := cmp.Diff(n, m, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("second round trip changed it (-first +second):\n%s", diff)
		}
	})
}

func FuzzParseModelList(f *testing.F) {
	for _, s := range []string{"", "A100", "A100|H100", "T4, P100 ,", "||", "G2|P100|T4|V100M16|V100M32"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		models, err := ParseModelList(s)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, m := range models {
			if m == "" || strings.ContainsAny(m, ",|") || strings.TrimSpace(m) != m {
				t.Fatalf("ParseModelList(%q) gave bad model %q", s, m)
			}
			if seen[m] {
				t.Fatalf("ParseModelList(%q) repeated %q", s, m)
			}
			seen[m] = true
		}
	})
}
