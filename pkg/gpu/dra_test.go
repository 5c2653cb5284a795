package gpu

import "testing"

func TestDRADeviceIndex(t *testing.T) {
	for _, tc := range []struct {
		name string
		i    int
		ok   bool
	}{{"gpu-0", 0, true}, {"gpu-15", 15, true}, {"gpu-01", 0, false}, {"gpu--1", 0, false}, {"gpu-", 0, false}, {"nic-0", 0, false},
		{"gpu-+1", 0, false}, {"gpu-1a", 0, false}, {"gpu- 1", 0, false}, {"gpu-99999999999", 0, false}} {
		if i, ok := DRADeviceIndex(tc.name); i != tc.i || ok != tc.ok {
			t.Errorf("DRADeviceIndex(%q) = %d, %v; want %d, %v", tc.name, i, ok, tc.i, tc.ok)
		}
	}
	for i := range 2000 {
		if got, ok := DRADeviceIndex(DRADeviceName(i)); !ok || got != i {
			t.Errorf("DRADeviceIndex(DRADeviceName(%d)) = %d, %v", i, got, ok)
		}
	}
	if n := DRADeviceName(7); n != "gpu-7" {
		t.Errorf("DRADeviceName(7) = %q", n)
	}
}

func TestClaimOfferAndMode(t *testing.T) {
	offer := IsolationOffer{KernelMemoryLimits: true, Shim: true}
	if o := ClaimOffer(offer, 1); o != offer {
		t.Errorf("ClaimOffer, one pod: %+v, want the offer itself", o)
	}
	for _, pods := range []int{0, 2} {
		o := ClaimOffer(offer, pods)
		if o.KernelMemoryLimits || !o.Shim || o.Why != "kernel memory limits: not set for a claim shared by several pods" {
			t.Errorf("ClaimOffer, %d pods: %+v", pods, o)
		}
	}
	for _, tc := range []struct {
		cores int64
		mps   bool
		want  SharingMode
	}{{100, true, ModeExclusive}, {99, true, ModeMPS}, {25, false, ModeTimeSlicing}} {
		if got := ClaimMode(tc.cores, tc.mps); got != tc.want {
			t.Errorf("ClaimMode(%d, %v) = %s, want %s", tc.cores, tc.mps, got, tc.want)
		}
	}
}
