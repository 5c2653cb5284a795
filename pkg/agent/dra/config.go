package dra

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
)

// The opaque configuration of the driver, in a DeviceClass or a claim:
// {"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GPUConfig", ...}.
const (
	ConfigAPIVersion = "gpu.tessera.dev/v1alpha1"
	ConfigKind       = "GPUConfig"
)

// GPUConfig is what a DeviceClass (or a claim) may ask of the driver.
type GPUConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// Whole: the request takes whole GPUs (every core); a request of the
	// class that names less capacity is refused when it is prepared.
	Whole bool `json:"whole,omitempty"`
}

// configFor is the configuration that applies to request: every opaque
// configuration of this driver in the allocation (the class's, then the
// claim's) naming it, or naming no request. Whole from any holds (a claim
// cannot make its class's whole GPUs shared). An unknown version, kind or
// field is refused: the driver does not guess what it was asked.
func configFor(a *resourceapi.AllocationResult, request string) (GPUConfig, error) {
	var out GPUConfig
	parent, _, _ := strings.Cut(request, "/")
	for _, c := range a.Devices.Config {
		if c.Opaque == nil || c.Opaque.Driver != DriverName {
			continue
		}
		if len(c.Requests) > 0 && !slices.Contains(c.Requests, request) && !slices.Contains(c.Requests, parent) {
			continue
		}
		var g GPUConfig
		dec := json.NewDecoder(bytes.NewReader(c.Opaque.Parameters.Raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&g); err != nil {
			return out, fmt.Errorf("the %s configuration of request %s (%s): %w", DriverName, request, c.Source, err)
		}
		if g.APIVersion != ConfigAPIVersion || g.Kind != ConfigKind {
			return out, fmt.Errorf("the %s configuration of request %s (%s) is %s %s; this driver reads %s %s",
				DriverName, request, c.Source, g.APIVersion, g.Kind, ConfigAPIVersion, ConfigKind)
		}
		out.Whole = out.Whole || g.Whole
	}
	return out, nil
}
