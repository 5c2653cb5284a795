package timeslice

import (
	"context"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/pkg/nvml"
)

// SetterFor is how a node sets time-slice classes: given when not nil, else
// the driver's nvidia-smi at nvidiaSMI (DefaultNvidiaSMI when empty, looked
// up on $PATH). The error says why there is none.
func SetterFor(given Setter, nvidiaSMI string) (Setter, error) {
	if given != nil {
		return given, nil
	}
	if nvidiaSMI == "" {
		nvidiaSMI = DefaultNvidiaSMI
	}
	smi, err := Find(nvidiaSMI)
	if err != nil {
		return nil, err
	}
	return smi, nil
}

// Shared is the GPUs a node time-slices among devices: all but the
// MIG-partitioned ones, which Tessera does not slice.
func Shared(devices []nvml.DeviceInfo) []string {
	var out []string
	for _, d := range devices {
		if !d.MIGEnabled {
			out = append(out, d.UUID)
		}
	}
	return out
}

// ComputeModes sets a GPU's compute mode (pkg/nvml's Client).
type ComputeModes interface {
	SetComputeMode(uuid string, mode gonvml.ComputeMode) error
}

// Prepare puts the time-shared GPUs among devices in the default compute
// mode: one left in exclusive-process mode (by an earlier MPS setup, or by
// hand) would refuse every tenant's context but the first.
func Prepare(ctx context.Context, gpus ComputeModes, devices []nvml.DeviceInfo) {
	logger := klog.FromContext(ctx)
	for _, d := range devices {
		if d.MIGEnabled || d.ComputeMode == gonvml.COMPUTEMODE_DEFAULT {
			continue
		}
		if err := gpus.SetComputeMode(d.UUID, gonvml.COMPUTEMODE_DEFAULT); err != nil {
			logger.Error(err, "GPU is not in the default compute mode, and setting it failed; time-sliced tenants after the first will be refused", "gpu", d.UUID, "mode", d.ComputeMode)
			continue
		}
		logger.Info("Set the default compute mode on a time-shared GPU", "gpu", d.UUID, "was", d.ComputeMode)
	}
}
