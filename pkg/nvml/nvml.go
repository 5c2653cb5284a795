// Package nvml is the node's only door to the GPUs (tessera-agent and
// `tessera doctor node`): the inventory the agent publishes (UUID, model,
// memory, SMs, NVLink peers, MIG and compute mode), the usage it samples
// (memory per process, device and per-process SM utilization, temperature,
// power, clock-event reasons) and the XID events that take a GPU out of
// service. It wraps go-nvml's nvml.Interface, so tests
// run on go-nvml's whole-server mocks (dgxa100, dgxh100, dgxh200) and the
// agent on the real driver with the same code.
//
// A reading a GPU does not support (NOT_SUPPORTED, common on consumer boards
// and inside MIG) is reported as missing, never as zero: a zero temperature
// or power would be a lie on a dashboard. A GPU that fell off the bus
// (GPU_IS_LOST) is reported as lost so the agent can remove it.
package nvml

import (
	"errors"
	"fmt"
	"math"
	"sync"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// ErrNoDriver says NVML could not be loaded or initialised: no NVIDIA driver
// on this node, or the agent's container lacks the driver's libraries.
var ErrNoDriver = errors.New("NVML is not available (no NVIDIA driver, or libnvidia-ml.so.1 not mounted into the agent)")

// Client reads one node's GPUs. It is safe for concurrent use.
type Client struct {
	lib gonvml.Interface

	mu sync.Mutex
	// lastProcSample is, per GPU UUID, the newest per-process utilization
	// timestamp already read, so each pass returns only new samples.
	lastProcSample map[string]uint64

	// missing names the NVML entry points the node's library lacks, looked
	// up once at New: go-nvml binds symbols lazily, so calling one a driver
	// does not export kills the whole process ("symbol lookup error"), as
	// nvmlDeviceSetMemoryLimits_v1 did on driver 580.159.
	missing map[string]bool
}

// optionalSymbols are the entry points newer than the drivers the agent
// supports: each is looked up before it is called.
var optionalSymbols = []string{"nvmlDeviceSetMemoryLimits_v1", "nvmlDeviceGetMemoryLimits_v1"}

// New initialises NVML through lib (gonvml.New() on a node; a mock server in
// tests). Close releases it.
func New(lib gonvml.Interface) (*Client, error) {
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		if ret == gonvml.ERROR_LIBRARY_NOT_FOUND || ret == gonvml.ERROR_DRIVER_NOT_LOADED {
			return nil, fmt.Errorf("%w: %s", ErrNoDriver, errorString(lib, ret))
		}
		return nil, fmt.Errorf("NVML init: %s", errorString(lib, ret))
	}
	c := &Client{lib: lib, lastProcSample: map[string]uint64{}, missing: map[string]bool{}}
	for _, name := range optionalSymbols {
		if !hasSymbol(lib, name) {
			c.missing[name] = true
		}
	}
	return c, nil
}

// hasSymbol says whether lib exports name. A library that cannot answer
// (go-nvml's mocks leave Extensions unset, and panic) is taken at its word:
// its calls are Go functions, not symbols.
func hasSymbol(lib gonvml.Interface, name string) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = true
		}
	}()
	return lib.Extensions().LookupSymbol(name) == nil
}

// lacks is the error for a call the driver's NVML does not export.
func (c *Client) lacks(symbol, what string) error {
	if !c.missing[symbol] {
		return nil
	}
	return fmt.Errorf("%s: %w (this driver's NVML has no %s)", what, ErrNotSupported, symbol)
}

// Close shuts NVML down.
func (c *Client) Close() error {
	if ret := c.lib.Shutdown(); ret != gonvml.SUCCESS {
		return fmt.Errorf("NVML shutdown: %s", errorString(c.lib, ret))
	}
	return nil
}

// errorString is ret's message; mocks do not implement ErrorString.
func errorString(lib gonvml.Interface, ret gonvml.Return) (s string) {
	defer func() {
		if recover() != nil {
			s = fmt.Sprintf("NVML return %d", int32(ret))
		}
	}()
	return lib.ErrorString(ret)
}

// DeviceInfo is what the agent publishes about one GPU.
type DeviceInfo struct {
	Index     int
	UUID      string
	Model     string
	MemoryMiB int64
	// SMCount is 0 when the GPU does not report it.
	SMCount int
	// NVLinkPeers are the indexes of the GPUs this one reaches over NVLink
	// (directly or through NVSwitch).
	NVLinkPeers []int
	// MIGEnabled: the GPU is partitioned by MIG; Tessera does not slice it.
	MIGEnabled  bool
	ComputeMode gonvml.ComputeMode
	PCIBusID    string
}

// Device converts the reading into the inventory's device record. MPS
// capability is the agent's decision (config), not a property NVML reports.
func (d DeviceInfo) Device(healthy, mps bool) gpu.Device {
	return gpu.Device{Index: d.Index, UUID: d.UUID, Model: d.Model, MemoryMiB: d.MemoryMiB, SMCount: d.SMCount,
		Healthy: healthy && !d.MIGEnabled, MPSCapable: mps, NVLinkPeers: d.NVLinkPeers}
}

// Devices reads every GPU's identity and topology. A GPU that fails to
// answer is left out and its error returned alongside the others, so one
// lost GPU does not hide the node's seven good ones.
func (c *Client) Devices() ([]DeviceInfo, error) {
	var (
		out     []DeviceInfo
		handles []gonvml.Device
	)
	err := c.eachDevice(func(i int, d gonvml.Device) error {
		info, err := c.deviceInfo(i, d)
		if err != nil {
			return err
		}
		out = append(out, info)
		handles = append(handles, d)
		return nil
	})
	if out == nil && err != nil {
		return nil, err
	}
	// NVLink peers: P2P over NVLink between every pair NVML reports OK. This
	// covers direct links and NVSwitch fabrics alike, where the remote end of
	// each link is a switch, not a GPU.
	for i := range out {
		for j := range out {
			if i == j {
				continue
			}
			st, ret := handles[i].GetP2PStatus(handles[j], gonvml.P2P_CAPS_INDEX_NVLINK)
			if ret == gonvml.SUCCESS && st == gonvml.P2P_STATUS_OK {
				out[i].NVLinkPeers = append(out[i].NVLinkPeers, out[j].Index)
			}
		}
	}
	return out, err
}

// eachDevice calls fn with every GPU's index and handle. A GPU whose handle
// or fn fails is skipped; the failures come back joined, each naming its GPU.
// Only failing to count the GPUs stops it before the first.
func (c *Client) eachDevice(fn func(i int, d gonvml.Device) error) error {
	n, ret := c.lib.DeviceGetCount()
	if ret != gonvml.SUCCESS {
		return fmt.Errorf("NVML device count: %s", errorString(c.lib, ret))
	}
	var errs []error
	for i := range n {
		d, ret := c.lib.DeviceGetHandleByIndex(i)
		if ret != gonvml.SUCCESS {
			errs = append(errs, fmt.Errorf("GPU %d: handle: %s", i, errorString(c.lib, ret)))
			continue
		}
		if err := fn(i, d); err != nil {
			errs = append(errs, fmt.Errorf("GPU %d: %w", i, err))
		}
	}
	return errors.Join(errs...)
}

func (c *Client) deviceInfo(i int, d gonvml.Device) (DeviceInfo, error) {
	info := DeviceInfo{Index: i}
	var ret gonvml.Return
	if info.UUID, ret = d.GetUUID(); ret != gonvml.SUCCESS {
		return info, fmt.Errorf("UUID: %s", errorString(c.lib, ret))
	}
	if info.Model, ret = d.GetName(); ret != gonvml.SUCCESS {
		return info, fmt.Errorf("name: %s", errorString(c.lib, ret))
	}
	mem, ret := d.GetMemoryInfo()
	if ret != gonvml.SUCCESS {
		return info, fmt.Errorf("memory: %s", errorString(c.lib, ret))
	}
	info.MemoryMiB = int64(mem.Total >> 20)
	if attr, ret := d.GetAttributes(); ret == gonvml.SUCCESS {
		info.SMCount = int(attr.MultiprocessorCount)
	}
	if cur, _, ret := d.GetMigMode(); ret == gonvml.SUCCESS {
		info.MIGEnabled = cur == gonvml.DEVICE_MIG_ENABLE
	}
	if m, ret := d.GetComputeMode(); ret == gonvml.SUCCESS {
		info.ComputeMode = m
	}
	if pci, ret := d.GetPciInfo(); ret == gonvml.SUCCESS {
		info.PCIBusID = busID(pci)
	}
	return info, nil
}

func busID(p gonvml.PciInfo) string {
	b := make([]byte, 0, len(p.BusId))
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

// ProcessUsage is one process's use of one GPU.
type ProcessUsage struct {
	PID       uint32
	MemoryMiB int64
	// SMUtil is the process's SM utilization in percent over the last
	// sample period; NaN when the GPU reported no sample for it.
	SMUtil float64
}

// DeviceUsage is one sampling pass over one GPU. Float readings are NaN when
// the GPU does not support them.
type DeviceUsage struct {
	Index          int
	UUID           string
	MemoryUsedMiB  int64
	MemoryTotalMiB int64
	// SMUtil is the device's SM ("GPU") utilization, percent.
	SMUtil       float64
	TemperatureC float64
	PowerW       float64
	// ClockEventReasons is NVML's bitmask of why clocks are held down
	// (gonvml.ClocksEventReason*); Throttled says whether any of them is a
	// slowdown rather than idling or an application setting.
	ClockEventReasons uint64
	Processes         []ProcessUsage
	// Lost: the GPU stopped answering (fell off the bus, XID 79); the other
	// readings are empty.
	Lost bool
}

// slowdownReasons are the clock-event reasons that slow a busy GPU down.
const slowdownReasons = gonvml.ClocksEventReasonSwPowerCap | gonvml.ClocksThrottleReasonHwSlowdown |
	gonvml.ClocksEventReasonSwThermalSlowdown | gonvml.ClocksThrottleReasonHwThermalSlowdown |
	gonvml.ClocksThrottleReasonHwPowerBrakeSlowdown

// Throttled says whether the GPU's clocks were held down by power or heat.
func (u DeviceUsage) Throttled() bool { return u.ClockEventReasons&slowdownReasons != 0 }

// Sample reads every GPU's usage once. A GPU that cannot be read is returned
// with Lost set (GPU_IS_LOST) or left out with an error, never fatal to the
// pass.
func (c *Client) Sample() ([]DeviceUsage, error) {
	var out []DeviceUsage
	err := c.eachDevice(func(i int, d gonvml.Device) error {
		u, err := c.sampleDevice(i, d)
		if u.UUID != "" {
			out = append(out, u)
		}
		return err
	})
	if out == nil && err != nil {
		return nil, err
	}
	return out, err
}

func (c *Client) sampleDevice(i int, d gonvml.Device) (DeviceUsage, error) {
	u := DeviceUsage{Index: i, SMUtil: math.NaN(), TemperatureC: math.NaN(), PowerW: math.NaN()}
	uuid, ret := d.GetUUID()
	if ret != gonvml.SUCCESS {
		return u, fmt.Errorf("UUID: %s", errorString(c.lib, ret))
	}
	u.UUID = uuid
	mem, ret := d.GetMemoryInfo()
	if ret == gonvml.ERROR_GPU_IS_LOST {
		u.Lost = true
		return u, nil
	}
	if ret != gonvml.SUCCESS {
		return u, fmt.Errorf("memory: %s", errorString(c.lib, ret))
	}
	u.MemoryUsedMiB, u.MemoryTotalMiB = int64(mem.Used>>20), int64(mem.Total>>20)
	if ut, ret := d.GetUtilizationRates(); ret == gonvml.SUCCESS {
		u.SMUtil = float64(ut.Gpu)
	}
	if t, ret := d.GetTemperature(gonvml.TEMPERATURE_GPU); ret == gonvml.SUCCESS {
		u.TemperatureC = float64(t)
	}
	if p, ret := d.GetPowerUsage(); ret == gonvml.SUCCESS {
		u.PowerW = float64(p) / 1000
	}
	if r, ret := d.GetCurrentClocksEventReasons(); ret == gonvml.SUCCESS {
		u.ClockEventReasons = r
	}
	procs, ret := d.GetComputeRunningProcesses()
	if ret == gonvml.ERROR_GPU_IS_LOST {
		u.Lost = true
		return u, nil
	}
	byPID := map[uint32]int{}
	if ret == gonvml.SUCCESS {
		for _, p := range procs {
			byPID[p.Pid] = len(u.Processes)
			u.Processes = append(u.Processes, ProcessUsage{PID: p.Pid, MemoryMiB: int64(p.UsedGpuMemory >> 20), SMUtil: math.NaN()})
		}
	}
	// Per-process SM utilization: only samples newer than the last pass.
	c.mu.Lock()
	since := c.lastProcSample[uuid]
	c.mu.Unlock()
	samples, ret := d.GetProcessUtilization(since)
	if ret == gonvml.SUCCESS {
		newest := since
		seen := map[uint32]uint64{} // per process, the newest sample taken
		for _, s := range samples {
			newest = max(newest, s.TimeStamp)
			k, ok := byPID[s.Pid]
			if !ok {
				continue
			}
			if ts, dup := seen[s.Pid]; dup && ts > s.TimeStamp {
				continue
			}
			seen[s.Pid] = s.TimeStamp
			u.Processes[k].SMUtil = float64(s.SmUtil)
		}
		c.mu.Lock()
		c.lastProcSample[uuid] = newest
		c.mu.Unlock()
	}
	return u, nil
}

// ComputeModeName is how people name a compute mode (nvidia-smi -c).
func ComputeModeName(m gonvml.ComputeMode) string {
	switch m {
	case gonvml.COMPUTEMODE_DEFAULT:
		return "default"
	case gonvml.COMPUTEMODE_EXCLUSIVE_THREAD:
		return "exclusive-thread"
	case gonvml.COMPUTEMODE_PROHIBITED:
		return "prohibited"
	case gonvml.COMPUTEMODE_EXCLUSIVE_PROCESS:
		return "exclusive-process"
	}
	return fmt.Sprintf("compute mode %d", m)
}

// SetComputeMode sets a GPU's compute mode (MPS needs exclusive-process).
func (c *Client) SetComputeMode(uuid string, m gonvml.ComputeMode) error {
	d, ret := c.lib.DeviceGetHandleByUUID(uuid)
	if ret != gonvml.SUCCESS {
		return fmt.Errorf("GPU %s: handle: %s", uuid, errorString(c.lib, ret))
	}
	if ret := d.SetComputeMode(m); ret != gonvml.SUCCESS {
		return fmt.Errorf("GPU %s: set compute mode: %s", uuid, errorString(c.lib, ret))
	}
	return nil
}

// Processes lists the PIDs holding a compute context on a GPU (host PID
// namespace), for preemption's reclaim check.
func (c *Client) Processes(uuid string) ([]uint32, error) {
	d, ret := c.lib.DeviceGetHandleByUUID(uuid)
	if ret != gonvml.SUCCESS {
		return nil, fmt.Errorf("GPU %s: handle: %s", uuid, errorString(c.lib, ret))
	}
	procs, ret := d.GetComputeRunningProcesses()
	if ret != gonvml.SUCCESS {
		return nil, fmt.Errorf("GPU %s: running processes: %s", uuid, errorString(c.lib, ret))
	}
	out := make([]uint32, 0, len(procs))
	for _, p := range procs {
		out = append(out, p.Pid)
	}
	return out, nil
}

// PersistenceMode says whether the driver stays loaded with no client
// (nvidia-persistenced or persistence mode on): without it, the driver
// unloads between jobs and loses the GPU's settings (compute mode, MPS).
func (c *Client) PersistenceMode(uuid string) (bool, error) {
	d, ret := c.lib.DeviceGetHandleByUUID(uuid)
	if ret != gonvml.SUCCESS {
		return false, fmt.Errorf("GPU %s: handle: %s", uuid, errorString(c.lib, ret))
	}
	m, ret := d.GetPersistenceMode()
	if ret != gonvml.SUCCESS {
		return false, fmt.Errorf("GPU %s: persistence mode: %s", uuid, errorString(c.lib, ret))
	}
	return m == gonvml.FEATURE_ENABLED, nil
}

// MemoryLimitsOffered says, without setting anything, whether the driver
// offers per-cgroup memory limits on a GPU: it reads the limits of cgroup
// (an existing one, the hierarchy's root for instance). NOT_SUPPORTED is
// the answer no; the other errors are errors.
func (c *Client) MemoryLimitsOffered(uuid, cgroup string) (bool, error) {
	_, _, err := c.GetMemoryLimits(uuid, cgroup)
	switch {
	case errors.Is(err, ErrNotSupported):
		return false, nil
	case err != nil:
		return false, err
	}
	return true, nil
}

// DriverVersion is the NVIDIA driver's version ("580.65.06") and the CUDA
// driver API version it implements (12090 for 12.9).
func (c *Client) DriverVersion() (driver string, cuda int, err error) {
	driver, ret := c.lib.SystemGetDriverVersion()
	if ret != gonvml.SUCCESS {
		return "", 0, fmt.Errorf("NVML driver version: %s", errorString(c.lib, ret))
	}
	cuda, ret = c.lib.SystemGetCudaDriverVersion()
	if ret != gonvml.SUCCESS {
		return driver, 0, fmt.Errorf("NVML CUDA driver version: %s", errorString(c.lib, ret))
	}
	return driver, cuda, nil
}

// MemoryLimits are NVML's per-cgroup limits of one GPU's memory, in bytes.
type MemoryLimits struct {
	// Soft: the cgroup is first to lose memory past it under pressure;
	// 0 for none.
	Soft uint64
	// Hard: allocations past it fail; NoHardLimit for none.
	Hard uint64
	// Used is what the cgroup holds on the GPU now (read only).
	Used uint64
}

// NoHardLimit is NVML's "no hard limit" (NVML_DEVICE_MEMORY_LIMIT_MAX).
const NoHardLimit = gonvml.DEVICE_MEMORY_LIMIT_MAX

// Set says whether any limit is in force.
func (l MemoryLimits) Set() bool { return l.Soft != 0 || l.Hard != NoHardLimit }

// ErrNotSupported says the driver or GPU does not offer the call: an answer
// about the node, not a failure of the agent.
var ErrNotSupported = errors.New("not supported by this driver or GPU")

// ErrCgroupUnusable says NVML could not open the cgroup (it is gone, or not
// a cgroup v2 directory).
var ErrCgroupUnusable = errors.New("NVML cannot open the cgroup")

func limitError(lib gonvml.Interface, what string, ret gonvml.Return) error {
	switch ret {
	case gonvml.ERROR_NOT_SUPPORTED, gonvml.ERROR_FUNCTION_NOT_FOUND:
		return fmt.Errorf("%s: %w (%s)", what, ErrNotSupported, errorString(lib, ret))
	case gonvml.ERROR_OPERATING_SYSTEM:
		return fmt.Errorf("%s: %w (%s)", what, ErrCgroupUnusable, errorString(lib, ret))
	}
	return fmt.Errorf("%s: %s", what, errorString(lib, ret))
}

// SetMemoryLimits sets a cgroup's limits of a GPU's memory (the cgroup's
// directory under /sys/fs/cgroup). The driver applies them to every process
// of the cgroup and its descendants; removing the cgroup removes them.
func (c *Client) SetMemoryLimits(uuid, cgroup string, soft, hard uint64) error {
	d, ret := c.lib.DeviceGetHandleByUUID(uuid)
	if ret != gonvml.SUCCESS {
		return fmt.Errorf("GPU %s: handle: %s", uuid, errorString(c.lib, ret))
	}
	if err := c.lacks("nvmlDeviceSetMemoryLimits_v1", fmt.Sprintf("GPU %s: set memory limits of cgroup %s", uuid, cgroup)); err != nil {
		return err
	}
	if ret := d.SetMemoryLimits_v1(cgroup, soft, hard); ret != gonvml.SUCCESS {
		return limitError(c.lib, fmt.Sprintf("GPU %s: set memory limits of cgroup %s", uuid, cgroup), ret)
	}
	return nil
}

// ClearMemoryLimits removes a cgroup's limits of a GPU's memory.
func (c *Client) ClearMemoryLimits(uuid, cgroup string) error {
	return c.SetMemoryLimits(uuid, cgroup, 0, NoHardLimit)
}

// GetMemoryLimits reads a cgroup's limits of a GPU's memory; found is false
// when none were ever set on it.
func (c *Client) GetMemoryLimits(uuid, cgroup string) (l MemoryLimits, found bool, err error) {
	d, ret := c.lib.DeviceGetHandleByUUID(uuid)
	if ret != gonvml.SUCCESS {
		return l, false, fmt.Errorf("GPU %s: handle: %s", uuid, errorString(c.lib, ret))
	}
	if err := c.lacks("nvmlDeviceGetMemoryLimits_v1", fmt.Sprintf("GPU %s: memory limits of cgroup %s", uuid, cgroup)); err != nil {
		return l, false, err
	}
	got, ret := d.GetMemoryLimits_v1(cgroup)
	switch ret {
	case gonvml.SUCCESS:
		return MemoryLimits{Soft: got.SoftLimit, Hard: got.HardLimit, Used: got.CurrentUsed}, true, nil
	case gonvml.ERROR_NOT_FOUND:
		return MemoryLimits{Hard: NoHardLimit}, false, nil
	}
	return l, false, limitError(c.lib, fmt.Sprintf("GPU %s: memory limits of cgroup %s", uuid, cgroup), ret)
}

// ProbeMemoryLimits tries NVML's per-cgroup memory limits on a GPU with a
// scratch cgroup (which the caller creates and removes): it sets a limit,
// reads it back and clears it. offered is the answer; why says, when it is
// false, what the driver said. err is for a probe that could not run (the
// scratch cgroup unusable), which answers nothing.
func (c *Client) ProbeMemoryLimits(uuid, scratch string) (offered bool, why string, err error) {
	const probe = 1 << 30
	err = c.SetMemoryLimits(uuid, scratch, probe/2, probe)
	switch {
	case errors.Is(err, ErrNotSupported):
		return false, err.Error(), nil
	case err != nil:
		return false, "", err
	}
	defer func() {
		if cerr := c.ClearMemoryLimits(uuid, scratch); cerr != nil && err == nil {
			err = cerr
		}
	}()
	l, found, err := c.GetMemoryLimits(uuid, scratch)
	if err != nil {
		return false, "", err
	}
	if !found || l.Hard != probe || l.Soft != probe/2 {
		return false, fmt.Sprintf("GPU %s: limits set on a scratch cgroup read back as soft %d, hard %d (found %v)", uuid, l.Soft, l.Hard, found), nil
	}
	return true, "", nil
}
