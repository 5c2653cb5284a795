// Package nvmltest fills in what go-nvml's whole-server mocks leave out —
// usage, topology, event support and per-cgroup memory limits — so tests of
// the agent can set each GPU's readings, faults and processes, and see the
// limits the agent sets take effect on simulated allocations.
package nvmltest

import (
	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// Reading is what one mock GPU reports, set per test.
type Reading struct {
	SMCount  uint32
	Used     uint64 // bytes
	Util     uint32
	TempC    uint32
	PowerMW  uint32
	Reasons  uint64
	Procs    []gonvml.ProcessInfo
	ProcUtil []gonvml.ProcessUtilizationSample
	// Unsupported makes every optional reading NOT_SUPPORTED.
	Unsupported bool
	Lost        bool
	NVLink      bool
	Events      uint64 // supported event types
	// ComputeMode is what GetComputeMode answers and SetComputeMode sets.
	ComputeMode gonvml.ComputeMode
	// KernelLimits makes the GPU offer NVML's per-cgroup memory limits,
	// recorded in Limits (which Install creates when nil); without it the
	// calls answer NOT_SUPPORTED, as a driver without the feature does.
	KernelLimits bool
	Limits       *CgroupLimits
	// PersistenceOff makes GetPersistenceMode answer disabled.
	PersistenceOff bool
}

// Install sets the readings on a go-nvml whole-server mock (dgxa100,
// dgxh100, dgxh200): the mocks answer identity and memory themselves and
// leave usage, topology and events to the test, which r describes per GPU.
func Install(srv *server.Server, r func(i int) *Reading) {
	for i, dev := range srv.Devices {
		d := dev.(*server.Device)
		rd := r(i)
		opt := func() gonvml.Return {
			if rd.Unsupported {
				return gonvml.ERROR_NOT_SUPPORTED
			}
			return gonvml.SUCCESS
		}
		d.GetAttributesFunc = func() (gonvml.DeviceAttributes, gonvml.Return) {
			return gonvml.DeviceAttributes{MultiprocessorCount: rd.SMCount}, opt()
		}
		d.GetComputeModeFunc = func() (gonvml.ComputeMode, gonvml.Return) { return rd.ComputeMode, gonvml.SUCCESS }
		d.SetComputeModeFunc = func(m gonvml.ComputeMode) gonvml.Return { rd.ComputeMode = m; return gonvml.SUCCESS }
		d.GetPersistenceModeFunc = func() (gonvml.EnableState, gonvml.Return) {
			if rd.PersistenceOff {
				return gonvml.FEATURE_DISABLED, gonvml.SUCCESS
			}
			return gonvml.FEATURE_ENABLED, gonvml.SUCCESS
		}
		total := d.MemoryInfo.Total
		d.GetMemoryInfoFunc = func() (gonvml.Memory, gonvml.Return) {
			if rd.Lost {
				return gonvml.Memory{}, gonvml.ERROR_GPU_IS_LOST
			}
			return gonvml.Memory{Total: total, Used: rd.Used, Free: total - rd.Used}, gonvml.SUCCESS
		}
		d.GetUtilizationRatesFunc = func() (gonvml.Utilization, gonvml.Return) {
			return gonvml.Utilization{Gpu: rd.Util}, opt()
		}
		d.GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { return rd.TempC, opt() }
		d.GetPowerUsageFunc = func() (uint32, gonvml.Return) { return rd.PowerMW, opt() }
		d.GetCurrentClocksEventReasonsFunc = func() (uint64, gonvml.Return) { return rd.Reasons, opt() }
		d.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) { return rd.Procs, gonvml.SUCCESS }
		d.GetProcessUtilizationFunc = func(since uint64) ([]gonvml.ProcessUtilizationSample, gonvml.Return) {
			var out []gonvml.ProcessUtilizationSample
			for _, s := range rd.ProcUtil {
				if s.TimeStamp > since {
					out = append(out, s)
				}
			}
			if len(out) == 0 {
				return nil, gonvml.ERROR_NOT_FOUND
			}
			return out, gonvml.SUCCESS
		}
		d.GetP2PStatusFunc = func(gonvml.Device, gonvml.GpuP2PCapsIndex) (gonvml.GpuP2PStatus, gonvml.Return) {
			if !rd.NVLink {
				return gonvml.P2P_STATUS_NOT_SUPPORTED, gonvml.SUCCESS
			}
			return gonvml.P2P_STATUS_OK, gonvml.SUCCESS
		}
		if rd.Limits == nil {
			rd.Limits = NewCgroupLimits(total)
		}
		d.SetMemoryLimits_v1Func = func(cgroup string, soft, hard uint64) gonvml.Return {
			if !rd.KernelLimits {
				return gonvml.ERROR_NOT_SUPPORTED
			}
			return rd.Limits.set(cgroup, soft, hard)
		}
		d.GetMemoryLimits_v1Func = func(cgroup string) (gonvml.MemoryLimits_v1, gonvml.Return) {
			if !rd.KernelLimits {
				return gonvml.MemoryLimits_v1{}, gonvml.ERROR_NOT_SUPPORTED
			}
			return rd.Limits.get(cgroup)
		}
		// What NVIDIA's CDI generator (nvcdi, through go-nvlib) asks that
		// the mocks leave unset: these GPUs are not MIG devices.
		d.IsMigDeviceHandleFunc = func() (bool, gonvml.Return) { return false, gonvml.SUCCESS }
		d.GetMaxMigDeviceCountFunc = func() (int, gonvml.Return) { return 0, gonvml.SUCCESS }
		d.GetSupportedEventTypesFunc = func() (uint64, gonvml.Return) { return rd.Events, gonvml.SUCCESS }
		d.RegisterEventsFunc = func(uint64, gonvml.EventSet) gonvml.Return { return gonvml.SUCCESS }
	}
}
