package playground

import (
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/nvml/nvmltest"
)

// load simulates the GPU processes of a node's running containers on its
// NVML mock, so the agent's real readout has something to read: each
// container gets one process per assigned GPU, using a steady share of the
// memory and SMs it was granted, and a /proc/<pid>/cgroup in this node's
// fake /proc that names its pod and container the way a containerd node's
// kubepods hierarchy does. The agent maps the processes to tenants with the
// same code it runs on a node.
type load struct {
	procRoot string
	byUUID   map[string]int // GPU UUID → index

	// events are delivered by the mock's event set (Node.InjectXid).
	events chan gonvml.EventData

	mu      sync.Mutex
	nextPID uint32
	gpus    []gpuLoad
	pids    map[types.UID][]uint32
	// unkillable processes ignore kill (a process stuck in the driver).
	unkillable map[uint32]bool
	// limits are each GPU's kernel memory limits per cgroup, as the
	// driver (580 and later) keeps them.
	limits []*nvmltest.CgroupLimits
	// stalled GPUs report their clocks held down by their power cap.
	stalled map[int]bool
	// signals are those the agent sent to the simulated processes.
	signals map[uint32][]syscall.Signal
	// hung, while not nil, holds every utilization reading until it is
	// closed: NVML hung, as on a GPU fallen off the bus.
	hung chan struct{}
}

type gpuLoad struct {
	totalBytes uint64
	procs      map[uint32]procLoad
}

type procLoad struct {
	usedBytes uint64
	smPercent uint32
}

// newLoad installs the simulation on srv; PIDs start at firstPID so that
// nodes do not share them (they share one fake /proc root each, but unique
// PIDs make logs unambiguous).
func newLoad(srv *server.Server, procRoot string, firstPID uint32, kernelLimits bool) (*load, error) {
	if err := os.MkdirAll(procRoot, 0o755); err != nil {
		return nil, err
	}
	l := &load{procRoot: procRoot, byUUID: map[string]int{}, nextPID: firstPID, pids: map[types.UID][]uint32{},
		events: make(chan gonvml.EventData, 16), unkillable: map[uint32]bool{}}
	srv.EventSetCreateFunc = func() (gonvml.EventSet, gonvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(ms uint32) (gonvml.EventData, gonvml.Return) {
				select {
				case ev := <-l.events:
					return ev, gonvml.SUCCESS
				case <-time.After(time.Duration(ms) * time.Millisecond):
					return gonvml.EventData{}, gonvml.ERROR_TIMEOUT
				}
			},
			FreeFunc: func() gonvml.Return { return gonvml.SUCCESS },
		}, gonvml.SUCCESS
	}
	nvmltest.Install(srv, func(i int) *nvmltest.Reading {
		lim := nvmltest.NewCgroupLimits(srv.Devices[i].(*server.Device).MemoryInfo.Total)
		l.limits = append(l.limits, lim)
		return &nvmltest.Reading{SMCount: smCount(srv), NVLink: true, TempC: 34, PowerMW: 70_000,
			Events: uint64(gonvml.EventTypeXidCriticalError), KernelLimits: kernelLimits, Limits: lim}
	})
	for i, dev := range srv.Devices {
		d := dev.(*server.Device)
		l.byUUID[d.UUID] = i
		l.gpus = append(l.gpus, gpuLoad{totalBytes: d.MemoryInfo.Total, procs: map[uint32]procLoad{}})
		i := i
		total := d.MemoryInfo.Total
		d.GetMemoryInfoFunc = func() (gonvml.Memory, gonvml.Return) {
			used, _ := l.usage(i)
			return gonvml.Memory{Total: total, Used: used, Free: total - used}, gonvml.SUCCESS
		}
		d.GetUtilizationRatesFunc = func() (gonvml.Utilization, gonvml.Return) {
			l.mu.Lock()
			hung := l.hung
			l.mu.Unlock()
			if hung != nil {
				<-hung
			}
			used, util := l.usage(i)
			return gonvml.Utilization{Gpu: util, Memory: uint32(100 * used / total)}, gonvml.SUCCESS
		}
		d.GetCurrentClocksEventReasonsFunc = func() (uint64, gonvml.Return) {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.stalled[i] {
				return gonvml.ClocksEventReasonSwPowerCap, gonvml.SUCCESS
			}
			return 0, gonvml.SUCCESS
		}
		d.GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) {
			_, util := l.usage(i)
			return 34 + util*45/100, gonvml.SUCCESS
		}
		d.GetPowerUsageFunc = func() (uint32, gonvml.Return) {
			_, util := l.usage(i)
			return 70_000 + util*5_800, gonvml.SUCCESS
		}
		d.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) {
			l.mu.Lock()
			defer l.mu.Unlock()
			var out []gonvml.ProcessInfo
			for pid, p := range l.gpus[i].procs {
				out = append(out, gonvml.ProcessInfo{Pid: pid, UsedGpuMemory: p.usedBytes})
			}
			return out, gonvml.SUCCESS
		}
		d.GetProcessUtilizationFunc = func(uint64) ([]gonvml.ProcessUtilizationSample, gonvml.Return) {
			l.mu.Lock()
			defer l.mu.Unlock()
			now := uint64(time.Now().UnixMicro())
			var out []gonvml.ProcessUtilizationSample
			for pid, p := range l.gpus[i].procs {
				out = append(out, gonvml.ProcessUtilizationSample{Pid: pid, TimeStamp: now, SmUtil: p.smPercent})
			}
			if len(out) == 0 {
				return nil, gonvml.ERROR_NOT_FOUND
			}
			return out, gonvml.SUCCESS
		}
	}
	return l, nil
}

// smCount is the SM count of the mock's model (the mocks leave it out).
func smCount(srv *server.Server) uint32 {
	name, _ := srv.Devices[0].GetName()
	switch {
	case strings.Contains(name, "A100"):
		return 108
	default: // H100 and H200 SXM
		return 132
	}
}

// usage is a GPU's used memory and SM utilization (percent, capped at 100).
func (l *load) usage(i int) (uint64, uint32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var used uint64
	var util uint32
	for _, p := range l.gpus[i].procs {
		used += p.usedBytes
		util += p.smPercent
	}
	return min(used, l.gpus[i].totalBytes), min(util, 100)
}

// busy is a container's steady share (55–95 %) of what it was granted,
// fixed by its name so that a playground run is reproducible.
func busy(pod *v1.Pod, container string) float64 {
	h := fnv.New32a()
	fmt.Fprintf(h, "%s/%s/%s", pod.Namespace, pod.Name, container)
	return 0.55 + float64(h.Sum32()%41)/100
}

// start gives each GPU container of pod one process per GPU of a (the
// pod's assignment, or what its claims hold; nil: none).
func (l *load) start(pod *v1.Pod, a *gpu.PodAssignment, containerIDs map[string]string) {
	if a == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range a.Containers {
		share := busy(pod, c.Name)
		for _, g := range c.GPUs {
			i, ok := l.byUUID[g.UUID]
			if !ok {
				continue
			}
			mem, cores := uint64(g.MemoryMiB)<<20, g.CoresPerMille
			if c.Mode == gpu.ModeExclusive || (g.MemoryMiB == 0 && g.CoresPerMille == 0) {
				mem, cores = l.gpus[i].totalBytes, gpu.CoresPerGPU
			}
			pid := l.nextPID
			l.nextPID++
			if err := l.writeCgroup(pid, pod.UID, containerIDs[c.Name]); err != nil {
				continue
			}
			l.gpus[i].procs[pid] = procLoad{usedBytes: uint64(float64(mem) * share), smPercent: uint32(float64(cores) * share * 100 / gpu.CoresPerGPU)}
			l.pids[pod.UID] = append(l.pids[pod.UID], pid)
		}
	}
}

// uuidAt is the UUID of the GPU with NVML index i ("" for none).
func (l *load) uuidAt(i int) string {
	for uuid, at := range l.byUUID {
		if at == i {
			return uuid
		}
	}
	return ""
}

// writeCgroup writes the process's cgroup as the systemd driver names it.
func (l *load) writeCgroup(pid uint32, pod types.UID, containerID string) error {
	dir := filepath.Join(l.procRoot, strconv.FormatUint(uint64(pid), 10))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	uid := strings.ReplaceAll(string(pod), "-", "_")
	line := fmt.Sprintf("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice/cri-containerd-%s.scope\n", uid, containerID)
	return os.WriteFile(filepath.Join(dir, "cgroup"), []byte(line), 0o644)
}

// Leftover says what a pod's GPU processes do when its containers stop.
type Leftover string

// Leftovers a playground pod can ask for (annotation
// playground.tessera.dev/leftover), to exercise preemption's reclaim.
const (
	// LeftoverNone: the processes end with their containers.
	LeftoverNone Leftover = ""
	// LeftoverProcess: they outlive the containers, holding their GPU
	// memory, until killed.
	LeftoverProcess Leftover = "process"
	// LeftoverUnkillable: they outlive the containers and survive kill.
	LeftoverUnkillable Leftover = "unkillable"
)

// stop ends a pod's processes, or leaves them behind as asked.
func (l *load) stop(uid types.UID, left Leftover) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, pid := range l.pids[uid] {
		switch left {
		case LeftoverProcess:
			continue
		case LeftoverUnkillable:
			l.unkillable[pid] = true
			continue
		}
		l.endLocked(pid)
	}
	delete(l.pids, uid)
}

func (l *load) endLocked(pid uint32) {
	for i := range l.gpus {
		delete(l.gpus[i].procs, pid)
	}
	_ = os.RemoveAll(filepath.Join(l.procRoot, strconv.FormatUint(uint64(pid), 10)))
}

// releaseStuck ends the processes that ignored kill, as a GPU reset or a
// reboot finally does.
func (l *load) releaseStuck() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(l.unkillable)
	for pid := range l.unkillable {
		delete(l.unkillable, pid)
		l.endLocked(pid)
	}
	return n
}

// kill is the node's kill(pid, SIGKILL) for the agent's reclaim.
func (l *load) kill(pid uint32) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.unkillable[pid] {
		return nil // the signal is delivered; the process does not die
	}
	found := false
	for i := range l.gpus {
		if _, ok := l.gpus[i].procs[pid]; ok {
			found = true
		}
	}
	if !found {
		return syscall.ESRCH
	}
	l.endLocked(pid)
	return nil
}

// signal is the node's kill(pid, sig) for the agent's preemption notices:
// the simulated PIDs are not the host's (they would name real processes of
// the machine running the playground), so the signal is recorded, not
// sent.
func (l *load) signal(pid uint32, sig syscall.Signal) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	found := l.unkillable[pid]
	for i := range l.gpus {
		_, ok := l.gpus[i].procs[pid]
		found = found || ok
	}
	if !found {
		return syscall.ESRCH
	}
	if l.signals == nil {
		l.signals = map[uint32][]syscall.Signal{}
	}
	l.signals[pid] = append(l.signals[pid], sig)
	return nil
}

// hang holds every utilization reading from now on (on), or releases
// those held and lets the next ones through.
func (l *load) hang(on bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case on && l.hung == nil:
		l.hung = make(chan struct{})
	case !on && l.hung != nil:
		close(l.hung)
		l.hung = nil
	}
}

// stall sets GPU i's clock event reasons to its power cap, or clears them.
func (l *load) stall(i int, on bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stalled == nil {
		l.stalled = map[int]bool{}
	}
	l.stalled[i] = on
}
