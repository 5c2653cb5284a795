package agent

import (
	"context"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/pkg/agent/timeslice"
)

// timeShared is the GPUs this agent time-slices: every GPU of a node not in
// MPS mode, but for MIG-partitioned ones, which Tessera does not slice.
func (a *Agent) timeShared() []string {
	if a.mpsMgr != nil || a.gpus == nil {
		return nil
	}
	var out []string
	for _, d := range a.devices {
		if !d.MIGEnabled {
			out = append(out, d.UUID)
		}
	}
	return out
}

// timeSlicer is how the agent sets time-slice classes: the one it was given,
// else the driver's nvidia-smi (the error says why there is none).
func timeSlicer(opts Options) (timeslice.Setter, error) {
	if opts.TimeSlicer != nil {
		return opts.TimeSlicer, nil
	}
	path := opts.NvidiaSMI
	if path == "" {
		path = timeslice.DefaultNvidiaSMI
	}
	smi, err := timeslice.Find(path)
	if err != nil {
		return nil, err
	}
	return smi, nil
}

// prepareTimeShared puts the time-shared GPUs in the default compute mode:
// one left in exclusive-process mode (by an earlier MPS setup, or by hand)
// would refuse every tenant's context but the first.
func (a *Agent) prepareTimeShared(ctx context.Context) {
	logger := klog.FromContext(ctx)
	for _, d := range a.devices {
		if d.MIGEnabled || d.ComputeMode == gonvml.COMPUTEMODE_DEFAULT {
			continue
		}
		if err := a.gpus.SetComputeMode(d.UUID, gonvml.COMPUTEMODE_DEFAULT); err != nil {
			logger.Error(err, "GPU is not in the default compute mode, and setting it failed; time-sliced tenants after the first will be refused", "gpu", d.UUID, "mode", d.ComputeMode)
			continue
		}
		logger.Info("Set the default compute mode on a time-shared GPU", "gpu", d.UUID, "was", d.ComputeMode)
	}
}

// wantedTimeSlices is each time-shared GPU's class, from its tenants: the
// IO-bound length where any tenant is an inference pod, the compute-bound
// one otherwise (and on a GPU with no tenant).
func (a *Agent) wantedTimeSlices(gpus []string) map[string]timeslice.Class {
	tenants := a.tenancy()
	want := make(map[string]timeslice.Class, len(gpus))
	for _, uuid := range gpus {
		want[uuid] = timeslice.ClassOf(a.opts.Config.TimeSlice, tenants[uuid].inference)
	}
	return want
}

// applyTimeSlices brings every time-shared GPU to the class its tenants
// call for (timeslice.Controller reports what happened).
func (a *Agent) applyTimeSlices(ctx context.Context, now time.Time) {
	if a.timeSlices == nil {
		return
	}
	a.timeSlices.Apply(ctx, a.wantedTimeSlices(a.timeShared()), now)
}
