package claimadmission

import (
	"context"
	"errors"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
)

// fakeLookup answers from maps of claim and template name to classes; a
// name in broken is an error.
type fakeLookup struct {
	claims, templates map[string][]string
	broken            string
}

func (f fakeLookup) ClaimClasses(_ context.Context, _, name string) ([]string, bool, error) {
	if name == f.broken {
		return nil, false, errors.New("the API server is away")
	}
	c, ok := f.claims[name]
	return c, ok, nil
}

func (f fakeLookup) TemplateClasses(_ context.Context, _, name string) ([]string, bool, error) {
	if name == f.broken {
		return nil, false, errors.New("the API server is away")
	}
	c, ok := f.templates[name]
	return c, ok, nil
}

func claimPod(scheduler string, claims ...v1.PodResourceClaim) *v1.Pod {
	return &v1.Pod{Spec: v1.PodSpec{SchedulerName: scheduler, ResourceClaims: claims}}
}

func privileged(p *v1.Pod) *v1.Pod {
	on := true
	p.Spec.Containers = []v1.Container{{Name: "main", SecurityContext: &v1.SecurityContext{Privileged: &on}}}
	return p
}

func fromTemplate(name, template string) v1.PodResourceClaim {
	return v1.PodResourceClaim{Name: name, ResourceClaimTemplateName: &template}
}

func fromClaim(name, claim string) v1.PodResourceClaim {
	return v1.PodResourceClaim{Name: name, ResourceClaimName: &claim}
}

// TestRefusal: a pod naming another scheduler, or one that could leave
// its slice, is refused when one of its claims (or the template it is made
// from) asks one of gpu.tessera.dev's classes; not for other drivers'
// claims, claims not made yet, or well-behaved pods naming a Tessera
// profile (whose claims are not even read); an unreadable claim is an
// error, not a refusal, unless another claim already decides.
func TestRefusal(t *testing.T) {
	look := fakeLookup{
		claims:    map[string][]string{"mine": {"mps.gpu.tessera.dev"}, "nic": {"nic.example.com"}},
		templates: map[string][]string{"slice": {"gpu.tessera.dev"}, "nic": {"nic.example.com"}, "either": {"nic.example.com", "whole.gpu.tessera.dev"}},
		broken:    "broken",
	}
	schedulers := []string{"tessera-scheduler"}
	for _, tc := range []struct {
		name    string
		pod     *v1.Pod
		refused string // part of the refusal; "" for none
		err     bool
	}{
		{"template of Tessera's class, default scheduler", claimPod("default-scheduler", fromTemplate("gpu", "slice")),
			`claim "gpu" (ResourceClaimTemplate slice) asks gpu.tessera.dev devices (DeviceClass gpu.tessera.dev), but the pod names spec.schedulerName "default-scheduler": set it to tessera-scheduler`, false},
		{"claim of an MPS class", claimPod("other", fromClaim("gpu", "mine")), "DeviceClass mps.gpu.tessera.dev", false},
		{"a prioritized alternative of Tessera's", claimPod("default-scheduler", fromTemplate("any", "either")), "DeviceClass whole.gpu.tessera.dev", false},
		{"named Tessera profile", claimPod("tessera-scheduler", fromTemplate("gpu", "slice")), "", false},
		{"named Tessera profile, claims unread", claimPod("tessera-scheduler", fromClaim("x", "broken")), "", false},
		{"named Tessera profile, privileged", privileged(claimPod("tessera-scheduler", fromTemplate("gpu", "slice"))),
			"and the pod could leave its GPU slice: container main is privileged (it sees every GPU of the node); remove them", false},
		{"privileged with another driver's claim", privileged(claimPod("tessera-scheduler", fromTemplate("n", "nic"))), "", false},
		{"another driver's claims", claimPod("default-scheduler", fromTemplate("n", "nic"), fromClaim("m", "nic")), "", false},
		{"a claim not made yet", claimPod("default-scheduler", fromClaim("gpu", "later")), "", false},
		{"no claims", claimPod("default-scheduler"), "", false},
		{"unreadable claim", claimPod("default-scheduler", fromClaim("x", "broken")), "", true},
		{"unreadable claim, another decides", claimPod("default-scheduler", fromClaim("x", "broken"), fromTemplate("gpu", "slice")), "asks gpu.tessera.dev devices", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Refusal(context.Background(), tc.pod, schedulers, look)
			if (err != nil) != tc.err {
				t.Errorf("error %v, want one: %v", err, tc.err)
			}
			if (tc.refused == "") != (got == "") || !strings.Contains(got, tc.refused) {
				t.Errorf("refusal %q, want one containing %q", got, tc.refused)
			}
		})
	}
}

func TestClassesOf(t *testing.T) {
	spec := &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
		{Name: "a", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.tessera.dev"}},
		{Name: "b", FirstAvailable: []resourceapi.DeviceSubRequest{{Name: "x", DeviceClassName: "nic.example.com"}, {Name: "y", DeviceClassName: "gpu.tessera.dev"}}},
	}}}
	if got := classesOf(spec); strings.Join(got, ",") != "gpu.tessera.dev,nic.example.com" {
		t.Errorf("classesOf = %v", got)
	}
	for name, want := range map[string]bool{"gpu.tessera.dev": true, "mps.gpu.tessera.dev": true, "gpu.tessera.dev.example.com": false, "xgpu.tessera.dev": false} {
		if TesseraClass(name) != want {
			t.Errorf("TesseraClass(%q) = %v", name, !want)
		}
	}
}

// TestStartChecksItsOptions: no port runs nothing; a bad port or a missing
// namespace is an error naming the flag, before anything listens.
func TestStartChecksItsOptions(t *testing.T) {
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{}, ""},
		{Options{Port: 70000, Namespace: "tessera-system"}, "--claim-admission-port 70000: give a port from 1 to 65535"},
		{Options{Port: 9443}, "--claim-admission-namespace is required"},
	} {
		err := tc.o.Start(context.Background(), nil)
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: %v, want %q", tc.o, err, tc.want)
		}
	}
}
