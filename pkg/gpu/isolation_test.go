package gpu

import "testing"

func TestGuaranteeOf(t *testing.T) {
	none := IsolationOffer{}
	kernel := IsolationOffer{KernelMemoryLimits: true}
	mps := IsolationOffer{MPSLimits: true, KernelMemoryLimits: true}
	shim := IsolationOffer{Shim: true}
	kernelShim := IsolationOffer{KernelMemoryLimits: true, Shim: true}
	mpsShim := IsolationOffer{MPSLimits: true, Shim: true}
	small := GPUGrant{MemoryMiB: 8192, CoresPerMille: 200}
	big := GPUGrant{MemoryMiB: 32768, CoresPerMille: 600}
	tests := []struct {
		name   string
		mode   SharingMode
		grant  GPUGrant
		offer  IsolationOffer
		server MPSServerLimits
		want   Guarantee
	}{
		{"whole GPU", ModeExclusive, GPUGrant{MemoryMiB: 81920, CoresPerMille: 1000}, none, MPSServerLimits{}, Guarantee{MechanismDevice, MechanismDevice}},
		{"time-sliced, no kernel limits: accounted only", ModeTimeSlicing, small, none, MPSServerLimits{}, Guarantee{MechanismNone, MechanismNone}},
		{"time-sliced with kernel limits", ModeTimeSlicing, small, kernel, MPSServerLimits{}, Guarantee{MechanismKernel, MechanismNone}},
		{"MPS, the server's limit is this tenant's grant", ModeMPS, big, mps, MPSServerLimitsFor([]GPUGrant{small, big}), Guarantee{MechanismMPSServer, MechanismMPSServer}},
		{"MPS, a bigger tenant raised the server's limit", ModeMPS, small, mps, MPSServerLimitsFor([]GPUGrant{small, big}), Guarantee{MechanismMPSClient, MechanismMPSClient}},
		{"MPS, equal tenants", ModeMPS, small, mps, MPSServerLimitsFor([]GPUGrant{small, small}), Guarantee{MechanismMPSServer, MechanismMPSServer}},
		{"MPS without a daemon the agent limits", ModeMPS, small, kernel, MPSServerLimits{ThreadPercent: 20, MemoryMiB: 8192}, Guarantee{MechanismNone, MechanismNone}},
		{"whole GPU with the shim offered: no shim", ModeExclusive, GPUGrant{MemoryMiB: 81920, CoresPerMille: 1000}, shim, MPSServerLimits{}, Guarantee{MechanismDevice, MechanismDevice}},
		{"time-sliced, no kernel limits, shim (R580)", ModeTimeSlicing, small, shim, MPSServerLimits{}, Guarantee{MechanismShim, MechanismShim}},
		{"time-sliced, kernel limits and shim: the kernel holds memory", ModeTimeSlicing, small, kernelShim, MPSServerLimits{}, Guarantee{MechanismKernel, MechanismShim}},
		{"MPS, server limit above the grant, shim: memory by the shim", ModeMPS, small, mpsShim, MPSServerLimitsFor([]GPUGrant{small, big}), Guarantee{MechanismShim, MechanismMPSClient}},
		{"MPS, server limit is the grant, shim offered: the server", ModeMPS, big, mpsShim, MPSServerLimitsFor([]GPUGrant{small, big}), Guarantee{MechanismMPSServer, MechanismMPSServer}},
		{"MPS without daemon limits, shim: memory by the shim", ModeMPS, small, shim, MPSServerLimits{ThreadPercent: 20, MemoryMiB: 8192}, Guarantee{MechanismShim, MechanismNone}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := GuaranteeOf(tt.mode, tt.grant, tt.offer, tt.server); got != tt.want {
				t.Errorf("GuaranteeOf = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestMPSServerLimitsFor(t *testing.T) {
	if got, want := MPSServerLimitsFor(nil), (MPSServerLimits{ThreadPercent: 100}); got != want {
		t.Errorf("no tenant: %+v, want %+v", got, want)
	}
	// Cores round up to whole percent: 333‰ is 34 %, never below the grant.
	got := MPSServerLimitsFor([]GPUGrant{{MemoryMiB: 4096, CoresPerMille: 333}, {MemoryMiB: 2048, CoresPerMille: 100}})
	if want := (MPSServerLimits{ThreadPercent: 34, MemoryMiB: 4096}); got != want {
		t.Errorf("MPSServerLimitsFor = %+v, want %+v", got, want)
	}
}

func TestMechanismEnforced(t *testing.T) {
	for m, want := range map[Mechanism]bool{MechanismDevice: true, MechanismKernel: true, MechanismMPSServer: true, MechanismShim: true, MechanismMPSClient: false, MechanismNone: false} {
		if m.Enforced() != want {
			t.Errorf("%s.Enforced() = %v, want %v", m, !want, want)
		}
	}
}

func TestNeedsShim(t *testing.T) {
	for _, tt := range []struct {
		gs   []Guarantee
		want bool
	}{
		{nil, false},
		{[]Guarantee{{MechanismKernel, MechanismNone}, {MechanismDevice, MechanismDevice}}, false},
		{[]Guarantee{{MechanismKernel, MechanismShim}}, true},
		{[]Guarantee{{MechanismDevice, MechanismDevice}, {MechanismShim, MechanismMPSClient}}, true},
	} {
		if got := NeedsShim(tt.gs); got != tt.want {
			t.Errorf("NeedsShim(%v) = %v, want %v", tt.gs, got, tt.want)
		}
	}
}

func TestParseIsolation(t *testing.T) {
	for in, want := range map[string]bool{"": false, "memory-hard": true, " memory-hard ": true} {
		got, err := ParseIsolation(in)
		if err != nil || got != want {
			t.Errorf("ParseIsolation(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseIsolation("hard"); err == nil {
		t.Error("ParseIsolation(hard) accepted")
	}
}

func TestSliceGuaranteesRoundTrip(t *testing.T) {
	gs := []SliceGuarantee{
		{Container: "main", GPU: "GPU-b", Guarantee: Guarantee{Memory: MechanismKernel, Compute: MechanismNone}},
		{Container: "main", GPU: "GPU-a", Guarantee: Guarantee{Memory: MechanismMPSServer, Compute: MechanismMPSClient}},
	}
	text := FormatSliceGuarantees(gs)
	if want := "main on GPU-a: memory=mps-server,compute=mps-client; main on GPU-b: memory=kernel,compute=none"; text != want {
		t.Fatalf("format = %q, want %q", text, want)
	}
	got, err := ParseSliceGuarantees(text + " (none: accounted by the scheduler, not held)")
	if err != nil || len(got) != 2 || got[0].GPU != "GPU-a" || got[1].Guarantee != gs[0].Guarantee {
		t.Fatalf("parse = %+v, %v", got, err)
	}
	for _, bad := range []string{"main GPU-a: memory=kernel,compute=none", "main on GPU-a: memory=steel,compute=none", "main on GPU-a: memory=kernel", "main on GPU-a: disk=kernel,compute=none"} {
		if _, err := ParseSliceGuarantees(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func FuzzParseSliceGuarantees(f *testing.F) {
	f.Add("main on GPU-a: memory=mps-server,compute=mps-client; side on GPU-b: memory=kernel,compute=none (why)")
	f.Add("")
	f.Add("a on b: memory=device,compute=device")
	f.Fuzz(func(t *testing.T, s string) {
		gs, err := ParseSliceGuarantees(s)
		if err != nil {
			return
		}
		// What parses formats to text that parses to the same guarantees.
		again, err := ParseSliceGuarantees(FormatSliceGuarantees(gs))
		if err != nil || len(again) != len(gs) {
			t.Fatalf("%q → %+v → %q → %+v, %v", s, gs, FormatSliceGuarantees(gs), again, err)
		}
	})
}
