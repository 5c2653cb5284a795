// Package metrics is the agent's Prometheus view of its GPUs: one sampling
// pass reads every GPU through pkg/nvml, names each GPU process's pod
// container through pkg/agent/tenants, folds in health and slice counts, and
// replaces the snapshot a scrape reads. Scrapes never touch NVML, so a slow
// or hung driver call delays the next snapshot, not Prometheus.
//
// Series (labels gpu.SeriesLabels — node, gpu = index, UUID, modelName, as
// DCGM exporter names them — on every GPU series; plus namespace, pod,
// container on the per-tenant ones):
//
//	tessera_gpu_memory_used_bytes, tessera_gpu_memory_total_bytes
//	tessera_gpu_sm_utilization_ratio        device SM ("GPU") utilization, 0–1
//	tessera_gpu_temperature_celsius, tessera_gpu_power_watts
//	tessera_gpu_throttled                   1 when clocks are held down by power or heat
//	tessera_gpu_stall_ratio                 see Stall
//	tessera_gpu_slices, tessera_gpu_slices_allocated
//	tessera_gpu_healthy                     0 while a fault or loss keeps the GPU out
//	tessera_container_gpu_memory_used_bytes per tenant
//	tessera_container_gpu_sm_utilization_ratio per tenant
//
// A reading the GPU does not support is absent, not zero.
package metrics

import (
	"math"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tessera-gpu/tessera/pkg/agent/health"
	"github.com/tessera-gpu/tessera/pkg/agent/tenants"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/nvml"
)

// Stall is the stall ratio of one GPU: among the samples of the last window
// (config stall.window, 5 minutes) in which the GPU was busy (SM utilization
// above zero), the fraction whose clocks were held down by a slowdown — power
// cap, hardware slowdown, thermal slowdown or power brake
// (nvml.DeviceUsage.Throttled). An idle GPU has ratio 0. The shipped alert
// fires above stall.threshold (15 %).
type Stall struct {
	window  time.Duration
	samples []stallSample
}

type stallSample struct {
	at        time.Time
	busy      bool
	throttled bool
}

// Add records a sample taken at now and drops those older than the window.
func (s *Stall) Add(now time.Time, u nvml.DeviceUsage) {
	busy := !math.IsNaN(u.SMUtil) && u.SMUtil > 0
	s.samples = append(s.samples, stallSample{at: now, busy: busy, throttled: busy && u.Throttled()})
	cut := 0
	for cut < len(s.samples) && now.Sub(s.samples[cut].at) > s.window {
		cut++
	}
	if cut > 0 {
		s.samples = append(s.samples[:0], s.samples[cut:]...)
	}
}

// Ratio is the stall ratio over the window.
func (s *Stall) Ratio() float64 {
	busy, stalled := 0, 0
	for _, x := range s.samples {
		if x.busy {
			busy++
			if x.throttled {
				stalled++
			}
		}
	}
	if busy == 0 {
		return 0
	}
	return float64(stalled) / float64(busy)
}

// SliceCount is how many slices a GPU advertises and how many are handed out.
type SliceCount struct{ Total, Allocated int }

// Slices gives every GPU's SliceCount by UUID; a pass asks it once.
type Slices func() map[string]SliceCount

// Sampler runs sampling passes and is the Prometheus collector of their
// results.
type Sampler struct {
	node     string
	gpus     *nvml.Client
	resolver *tenants.Resolver
	health   *health.Tracker
	slices   Slices

	mu      sync.Mutex
	models  map[string]string // UUID → model, read once
	indices map[string]int    // UUID → index, read once
	stalls  map[string]*Stall
	window  time.Duration
	snap    []gpuSnapshot
	// lastPass is when the last sampling pass finished: its age grows
	// while NVML hangs.
	lastPass time.Time
}

type gpuSnapshot struct {
	usage   nvml.DeviceUsage
	model   string
	stall   float64
	healthy bool
	slices  SliceCount
	tenants map[tenants.Tenant]*tenantUse
}

type tenantUse struct {
	memMiB int64
	sm     float64 // NaN when no process of the tenant had a sample
}

// NewSampler samples gpus on node; resolver may be nil (no per-tenant
// series), slices may be nil (no slice series).
func NewSampler(node string, gpus *nvml.Client, resolver *tenants.Resolver, tracker *health.Tracker, slices Slices, stallWindow time.Duration) *Sampler {
	s := &Sampler{node: node, gpus: gpus, resolver: resolver, health: tracker, slices: slices,
		models: map[string]string{}, indices: map[string]int{}, stalls: map[string]*Stall{}, window: stallWindow}
	// The GPUs as read at start: their models label every series, and one
	// that stops enumerating later is reported lost.
	devs, _ := gpus.Devices()
	for _, d := range devs {
		s.models[d.UUID] = d.Model
		s.indices[d.UUID] = d.Index
	}
	return s
}

// Pass samples every GPU once at now and publishes the result. A GPU that
// could not be read is reported in the error and left out; a lost GPU is
// reported to the health tracker.
func (s *Sampler) Pass(now time.Time) error {
	usage, err := s.gpus.Sample()
	var pids []uint32
	for _, u := range usage {
		for _, p := range u.Processes {
			pids = append(pids, p.PID)
		}
	}
	var who map[uint32]tenants.Tenant
	if s.resolver != nil && len(pids) > 0 {
		who = s.resolver.Resolve(pids)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// A GPU read at start that no longer enumerates (fell off the bus, or
	// was removed) is lost: out of service, and kept in the inventory so the
	// bookings of pods still bound to it stay accounted.
	seen := make(map[string]bool, len(usage))
	for _, u := range usage {
		seen[u.UUID] = true
	}
	var vanished []string
	for uuid := range s.models {
		if !seen[uuid] {
			s.health.Lost(uuid, now)
			vanished = append(vanished, uuid)
		}
	}
	sort.Strings(vanished)
	var counts map[string]SliceCount
	if s.slices != nil {
		counts = s.slices()
	}
	snap := make([]gpuSnapshot, 0, len(usage))
	for _, u := range usage {
		if u.Lost {
			s.health.Lost(u.UUID, now)
		} else {
			s.health.Answering(u.UUID)
		}
		st := s.stalls[u.UUID]
		if st == nil {
			st = &Stall{window: s.window}
			s.stalls[u.UUID] = st
		}
		st.Add(now, u)
		g := gpuSnapshot{usage: u, model: s.models[u.UUID], stall: st.Ratio()}
		g.healthy, _, _ = s.health.Healthy(u.UUID, now)
		g.slices = counts[u.UUID]
		for _, p := range u.Processes {
			t, ok := who[p.PID]
			if !ok {
				continue
			}
			if g.tenants == nil {
				g.tenants = map[tenants.Tenant]*tenantUse{}
			}
			tu := g.tenants[t]
			if tu == nil {
				tu = &tenantUse{sm: math.NaN()}
				g.tenants[t] = tu
			}
			tu.memMiB += p.MemoryMiB
			if !math.IsNaN(p.SMUtil) {
				if math.IsNaN(tu.sm) {
					tu.sm = 0
				}
				tu.sm += p.SMUtil
			}
		}
		snap = append(snap, g)
	}
	// A vanished GPU keeps its series, tessera_gpu_healthy at 0 first of
	// all: an alert on unhealthy GPUs must see it.
	for _, uuid := range vanished {
		g := gpuSnapshot{usage: nvml.DeviceUsage{UUID: uuid, Index: s.indices[uuid], Lost: true}, model: s.models[uuid], slices: counts[uuid]}
		g.healthy, _, _ = s.health.Healthy(uuid, now)
		snap = append(snap, g)
	}
	s.snap, s.lastPass = snap, now
	return err
}

// Utilization is the last pass's SM utilization per GPU UUID, 0–1; a GPU
// that did not report one is absent.
func (s *Sampler) Utilization() map[string]float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]float64, len(s.snap))
	for _, g := range s.snap {
		if !g.usage.Lost && !math.IsNaN(g.usage.SMUtil) {
			out[g.usage.UUID] = g.usage.SMUtil / 100
		}
	}
	return out
}

var (
	gpuLabels    = gpu.SeriesLabels
	tenantLabels = gpu.TenantSeriesLabels

	descMemUsed   = prometheus.NewDesc("tessera_gpu_memory_used_bytes", "GPU memory in use, all processes.", gpuLabels, nil)
	descMemTotal  = prometheus.NewDesc("tessera_gpu_memory_total_bytes", "GPU memory.", gpuLabels, nil)
	descSM        = prometheus.NewDesc("tessera_gpu_sm_utilization_ratio", "Share of the sample period in which a kernel ran on the GPU (NVML GPU utilization), 0-1.", gpuLabels, nil)
	descTemp      = prometheus.NewDesc("tessera_gpu_temperature_celsius", "GPU core temperature.", gpuLabels, nil)
	descPower     = prometheus.NewDesc("tessera_gpu_power_watts", "GPU board power draw.", gpuLabels, nil)
	descThrottled = prometheus.NewDesc("tessera_gpu_throttled", "1 when the GPU's clocks are held down by power or heat.", gpuLabels, nil)
	descStall     = prometheus.NewDesc("tessera_gpu_stall_ratio", "Over the stall window, the fraction of busy samples with clocks held down by power or heat (see docs/operations.md).", gpuLabels, nil)
	descSlices    = prometheus.NewDesc("tessera_gpu_slices", "Slices the GPU is advertised as.", gpuLabels, nil)
	descAlloc     = prometheus.NewDesc("tessera_gpu_slices_allocated", "Slices of the GPU handed to containers.", gpuLabels, nil)
	descHealthy   = prometheus.NewDesc("tessera_gpu_healthy", "1 when the GPU takes slices; 0 after a fault (until the quiet period passes) or while it is lost.", gpuLabels, nil)
	descTMem      = prometheus.NewDesc("tessera_container_gpu_memory_used_bytes", "GPU memory used by a container's processes on one GPU.", tenantLabels, nil)
	descPassAge   = prometheus.NewDesc("tessera_agent_last_sample_age_seconds", "Seconds since the agent's last sampling pass finished: it grows while NVML hangs.", []string{"node"}, nil)
	descTSM       = prometheus.NewDesc("tessera_container_gpu_sm_utilization_ratio", "SM utilization of a container's processes on one GPU over the last sample period, 0-1.", tenantLabels, nil)
)

// Describe implements prometheus.Collector.
func (s *Sampler) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descMemUsed, descMemTotal, descSM, descTemp, descPower, descThrottled, descStall, descSlices, descAlloc, descHealthy, descTMem, descTSM, descPassAge} {
		ch <- d
	}
}

// Collect implements prometheus.Collector from the last pass.
func (s *Sampler) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	snap, last := s.snap, s.lastPass
	s.mu.Unlock()
	if !last.IsZero() {
		ch <- prometheus.MustNewConstMetric(descPassAge, prometheus.GaugeValue, time.Since(last).Seconds(), s.node)
	}
	const mib = 1 << 20
	for _, g := range snap {
		u := g.usage
		l := gpu.SeriesLabelValues(s.node, u.Index, u.UUID, g.model)
		gauge := func(d *prometheus.Desc, v float64, labels []string) {
			if !math.IsNaN(v) {
				ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
			}
		}
		gauge(descHealthy, b2f(g.healthy), l)
		if s.slices != nil {
			gauge(descSlices, float64(g.slices.Total), l)
			gauge(descAlloc, float64(g.slices.Allocated), l)
		}
		if u.Lost {
			continue
		}
		gauge(descMemUsed, float64(u.MemoryUsedMiB)*mib, l)
		gauge(descMemTotal, float64(u.MemoryTotalMiB)*mib, l)
		gauge(descSM, u.SMUtil/100, l)
		gauge(descTemp, u.TemperatureC, l)
		gauge(descPower, u.PowerW, l)
		gauge(descThrottled, b2f(u.Throttled()), l)
		gauge(descStall, g.stall, l)
		for t, tu := range g.tenants {
			tl := append(append([]string{}, l...), t.Namespace, t.Pod, t.Container)
			gauge(descTMem, float64(tu.memMiB)*mib, tl)
			gauge(descTSM, tu.sm/100, tl)
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
