package allocator

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// TestCodeMessagesCarryNoNumbers: Filter's message is the same on every
// node short of the same thing, so kube-scheduler's "0/N nodes are
// available: …" has one clause per code, not one per node.
func TestCodeMessagesCarryNoNumbers(t *testing.T) {
	seen := map[string]Code{}
	for c := Fits; int(c) < len(codeNames); c++ {
		m := c.Message()
		if strings.ContainsAny(m, "0123456789") {
			t.Errorf("%v's message %q has a number", c, m)
		}
		if other, dup := seen[m]; dup {
			t.Errorf("%v and %v share the message %q", c, other, m)
		}
		seen[m] = c
		if c != Fits && short[c] == "" {
			t.Errorf("%v has no clause in Summarize's line", c)
		}
	}
}

// TestSummarizeOnAThousandNodes: the line for 1,000 nodes short of every
// kind of thing stays under 1 KiB and names the largest free fragment
// anywhere, with its node and GPU.
func TestSummarizeOnAThousandNodes(t *testing.T) {
	var reasons []NodeReason
	for i := range 1000 {
		node := fmt.Sprintf("gpu-node-%04d-%s", i, strings.Repeat("x", 40))
		var r Reason
		switch i % 5 {
		case 0, 1:
			r = Reason{Code: NoFragment, Want: 40960, WantCores: 500, Have: int64(1024 * (i % 37)), GPU: i % 8, HaveCores: int64(10 * (i % 50))}
		case 2:
			r = Reason{Code: NotEnoughWholeGPUs, Want: 4, Have: int64(i % 3)}
		case 3:
			r = Reason{Code: NoAllowedModel, Models: []string{"H100", "H200", "B200", "GB200", "A100"}}
		default:
			r = Reason{Code: Code(1 + i%len(codeNames[1:]))}
		}
		reasons = append(reasons, NodeReason{node, r})
	}
	// The largest: 36 GiB on i ≡ 36 (mod 37) among i%5 ∈ {0,1}; of those
	// the most cores.
	got := Summarize(reasons)
	if len(got) >= 1024 {
		t.Errorf("%d bytes, want under 1 KiB: %s", len(got), got)
	}
	var want NodeReason
	for _, r := range reasons {
		if r.Code == NoFragment && (want.Node == "" || r.Have > want.Have || (r.Have == want.Have && r.HaveCores > want.HaveCores)) {
			want = r
		}
	}
	frag := fmt.Sprintf("largest free GPU fragment %d MiB and %d%% cores (node %s GPU %d)", want.Have, pct(want.HaveCores), want.Node, want.GPU)
	if !strings.Contains(got, frag) {
		t.Errorf("line does not name the largest fragment %q:\n%s", frag, got)
	}
	for _, part := range []string{"0/1000 nodes fit", "a GPU fragment", "whole GPUs (at most 2 free on a node)", "an allowed GPU model (H100, H200, B200, …)"} {
		if !strings.Contains(got, part) {
			t.Errorf("line lacks %q:\n%s", part, got)
		}
	}
	t.Logf("%d bytes: %s", len(got), got)
}

// TestFromInventory: the codes FromInventory names stay the node's answer
// however much is booked on it (the scheduler skips asking whether its
// cache is behind on bookings for them), and no other code is named.
func TestFromInventory(t *testing.T) {
	mpsSlice := slice(10240, 20)
	mpsSlice.Sharing = gpu.ModeMPS
	timeSlice := slice(10240, 20)
	timeSlice.Sharing = gpu.ModeTimeSlicing
	h100 := slice(10240, 20)
	h100.Models = []string{"H100"}
	for _, tc := range []struct {
		name      string
		mps       bool
		req, book *Request
		want      Code
	}{
		{"mps slice on GPUs without MPS", false, mpsSlice, timeSlice, NoMPS},
		{"time-sliced slice on MPS GPUs", true, timeSlice, mpsSlice, NoTimeSlicing},
		{"a model the node lacks", false, h100, whole(1), NoAllowedModel},
	} {
		a := newAllocator(t, config.PolicyBinpack, 1)
		n := testNode(t, "n", 2, 81920, tc.mps)
		var p Placement
		if why := a.Place(n, checked(t, tc.req), &p); why.Code != tc.want {
			t.Fatalf("%s, empty node: %v, want %v", tc.name, why, tc.want)
		}
		for range 2 {
			var bp Placement
			if why := a.Place(n, checked(t, tc.book), &bp); !why.OK() {
				t.Fatalf("%s: booking: %v", tc.name, why)
			}
			n.Apply(tc.book, &bp)
			if why := a.Place(n, tc.req, &p); why.Code != tc.want {
				t.Fatalf("%s, after a booking: %v, want %v", tc.name, why, tc.want)
			}
		}
		if !tc.want.FromInventory() {
			t.Errorf("%v.FromInventory() = false", tc.want)
		}
	}
	inventory := map[Code]bool{NoHealthyGPU: true, NoAllowedModel: true, NoMPS: true, NoTimeSlicing: true, NoHardMemory: true, ServesDRA: true}
	for c := range Code(NumCodes) {
		if got := c.FromInventory(); got != inventory[c] {
			t.Errorf("%v.FromInventory() = %v, want %v", c, got, inventory[c])
		}
	}
}

// TestDRANodeTakesNoGPUPod: a node whose GPUs are served through DRA
// claims takes no GPU request, whatever it has free, and says why; a
// CPU-only pod still fits.
func TestDRANodeTakesNoGPUPod(t *testing.T) {
	a := newAllocator(t, config.PolicyTessera, 1)
	n := testNode(t, "n", 2, 81920, false)
	n.DRA = true
	var p Placement
	for _, req := range []*Request{whole(1), slice(10240, 20)} {
		why := a.Place(n, checked(t, req), &p)
		if why.Code != ServesDRA || !strings.Contains(why.String(), "ResourceClaim") || !ServesDRA.FromInventory() {
			t.Errorf("a GPU pod on a DRA node: %v (%s)", why.Code, why)
		}
	}
	cpu := checked(t, &Request{Sharing: gpu.ModeAuto, CPUMilli: 1000})
	if why := a.Place(n, cpu, &p); !why.OK() {
		t.Errorf("a CPU-only pod on a DRA node: %v", why)
	}
}
