package nvml

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/tessera-gpu/tessera/pkg/nvml/nvmltest"
)

func open(t *testing.T, srv *server.Server) *Client {
	t.Helper()
	c, err := New(srv)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestDevicesOnEveryServerMock reads the inventory of go-nvml's DGX A100,
// H100 and H200 mocks: eight GPUs each, model and memory as the mock
// defines them, SMs as reported, NVLink peers all-to-all through NVSwitch.
func TestDevicesOnEveryServerMock(t *testing.T) {
	for _, tc := range []struct {
		name   string
		srv    *server.Server
		model  string
		memMiB int64
		sms    uint32
	}{
		{"dgxa100", dgxa100.New(), "Mock NVIDIA A100-SXM4-40GB", 40960, 108},
		{"dgxh100", dgxh100.New(), "NVIDIA H100 80GB HBM3", 81920, 132},
		{"dgxh200", dgxh200.New(), "NVIDIA H200 141GB HBM3e", 144384, 132},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nvmltest.Install(tc.srv, func(int) *nvmltest.Reading { return &nvmltest.Reading{SMCount: tc.sms, NVLink: true} })
			devs, err := open(t, tc.srv).Devices()
			if err != nil {
				t.Fatal(err)
			}
			if len(devs) != 8 {
				t.Fatalf("%d GPUs, want 8", len(devs))
			}
			uuids := map[string]bool{}
			for i, d := range devs {
				if d.Index != i || d.Model != tc.model || d.MemoryMiB != tc.memMiB || d.SMCount != int(tc.sms) {
					t.Errorf("GPU %d = %+v, want %s with %d MiB and %d SMs", i, d, tc.model, tc.memMiB, tc.sms)
				}
				if !strings.HasPrefix(d.UUID, "GPU-") || uuids[d.UUID] {
					t.Errorf("GPU %d UUID %q: not a fresh GPU UUID", i, d.UUID)
				}
				uuids[d.UUID] = true
				if len(d.NVLinkPeers) != 7 {
					t.Errorf("GPU %d NVLink peers %v, want the 7 others", i, d.NVLinkPeers)
				}
				if d.MIGEnabled {
					t.Errorf("GPU %d: MIG enabled", i)
				}
				dev := d.Device(true, true)
				if !dev.Healthy || dev.UUID != d.UUID || dev.MemoryMiB != d.MemoryMiB || !dev.MPSCapable {
					t.Errorf("inventory record %+v", dev)
				}
			}
		})
	}
}

// TestMIGGPUsAreNotSliced: a GPU in MIG mode is published unhealthy for
// Tessera's slicing; PCIe boards without NVLink have no peers.
func TestMIGGPUsAreNotSliced(t *testing.T) {
	srv := dgxa100.New()
	nvmltest.Install(srv, func(int) *nvmltest.Reading { return &nvmltest.Reading{SMCount: 108} })
	d0 := srv.Devices[0].(*server.Device)
	if ret, _ := d0.SetMigMode(gonvml.DEVICE_MIG_ENABLE); ret != gonvml.SUCCESS {
		t.Fatal(ret)
	}
	devs, err := open(t, srv).Devices()
	if err != nil {
		t.Fatal(err)
	}
	if !devs[0].MIGEnabled || devs[0].Device(true, false).Healthy {
		t.Errorf("MIG GPU: %+v", devs[0])
	}
	if devs[1].MIGEnabled || len(devs[1].NVLinkPeers) != 0 {
		t.Errorf("GPU 1: %+v", devs[1])
	}
}

// TestSampleReadsUsagePerProcess: memory per process, device and
// per-process SM utilization, temperature, power and throttling, as the
// GPUs report them; per-process samples are read once each.
func TestSampleReadsUsagePerProcess(t *testing.T) {
	srv := dgxh100.New()
	nvmltest.Install(srv, func(i int) *nvmltest.Reading {
		r := &nvmltest.Reading{SMCount: 132, Util: uint32(10 * i), TempC: uint32(40 + i), PowerMW: 300000 + uint32(i)*1000}
		if i == 2 {
			r.Used = 30 << 30
			r.Procs = []gonvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 20 << 30}, {Pid: 200, UsedGpuMemory: 10 << 30}}
			r.ProcUtil = []gonvml.ProcessUtilizationSample{
				{Pid: 100, TimeStamp: 5, SmUtil: 10}, {Pid: 100, TimeStamp: 9, SmUtil: 55}, {Pid: 200, TimeStamp: 8, SmUtil: 15},
				{Pid: 999, TimeStamp: 9, SmUtil: 99}, // exited since
			}
			r.Reasons = gonvml.ClocksEventReasonSwThermalSlowdown
		}
		if i == 3 {
			r.Reasons = gonvml.ClocksEventReasonGpuIdle
		}
		return r
	})
	c := open(t, srv)
	us, err := c.Sample()
	if err != nil {
		t.Fatal(err)
	}
	if len(us) != 8 {
		t.Fatalf("%d GPUs sampled", len(us))
	}
	u := us[2]
	if u.MemoryUsedMiB != 30<<10 || u.MemoryTotalMiB != 81920 || u.SMUtil != 20 || u.TemperatureC != 42 || u.PowerW != 302 {
		t.Errorf("GPU 2 usage %+v", u)
	}
	if !u.Throttled() || us[3].Throttled() || us[0].Throttled() {
		t.Errorf("throttled: GPU 2 %v (thermal), GPU 3 %v (idle), GPU 0 %v", u.Throttled(), us[3].Throttled(), us[0].Throttled())
	}
	want := []ProcessUsage{{PID: 100, MemoryMiB: 20 << 10, SMUtil: 55}, {PID: 200, MemoryMiB: 10 << 10, SMUtil: 15}}
	if len(u.Processes) != 2 || u.Processes[0] != want[0] || u.Processes[1] != want[1] {
		t.Errorf("processes %+v, want %+v", u.Processes, want)
	}
	// A second pass sees no new per-process samples: utilization unknown,
	// not repeated.
	us, err = c.Sample()
	if err != nil {
		t.Fatal(err)
	}
	if p := us[2].Processes[0]; !math.IsNaN(p.SMUtil) || p.MemoryMiB != 20<<10 {
		t.Errorf("second pass: %+v, want memory and no SM sample", p)
	}
}

// TestUnsupportedReadingsAreMissingNotZero and a lost GPU is reported as
// lost without failing the pass over the others.
func TestUnsupportedReadingsAreMissingNotZero(t *testing.T) {
	srv := dgxa100.New()
	nvmltest.Install(srv, func(i int) *nvmltest.Reading {
		return &nvmltest.Reading{Unsupported: i == 1, Lost: i == 5, Util: 50, TempC: 60, PowerMW: 250000}
	})
	c := open(t, srv)
	us, err := c.Sample()
	if err != nil {
		t.Fatal(err)
	}
	if u := us[1]; !math.IsNaN(u.SMUtil) || !math.IsNaN(u.TemperatureC) || !math.IsNaN(u.PowerW) {
		t.Errorf("unsupported readings: %+v, want NaN", u)
	}
	if u := us[0]; u.SMUtil != 50 || u.TemperatureC != 60 || u.PowerW != 250 {
		t.Errorf("GPU 0: %+v", u)
	}
	if !us[5].Lost || us[4].Lost {
		t.Errorf("Lost: GPU 5 %v, GPU 4 %v", us[5].Lost, us[4].Lost)
	}
	if devs, err := c.Devices(); err == nil || len(devs) != 7 {
		t.Errorf("Devices with a lost GPU: %d GPUs, error %v; want the 7 others and an error naming GPU 5", len(devs), err)
	} else if !strings.Contains(err.Error(), "GPU 5") {
		t.Errorf("error %v does not name GPU 5", err)
	}
}

// TestNoDriverIsAClearError: NVML that cannot load says so.
func TestNoDriverIsAClearError(t *testing.T) {
	srv := dgxh100.New()
	srv.InitFunc = func() gonvml.Return { return gonvml.ERROR_LIBRARY_NOT_FOUND }
	if _, err := New(srv); !errors.Is(err, ErrNoDriver) {
		t.Fatalf("New = %v, want ErrNoDriver", err)
	}
}

// TestWatchEventsDeliversXids: XID critical errors reach the callback with
// the GPU's UUID and code; timeouts are not events; ctx stops the watch.
func TestWatchEventsDeliversXids(t *testing.T) {
	srv := dgxh200.New()
	nvmltest.Install(srv, func(int) *nvmltest.Reading {
		return &nvmltest.Reading{Events: gonvml.EventTypeXidCriticalError | gonvml.EventTypeSingleBitEccError}
	})
	var mu sync.Mutex
	queue := []gonvml.EventData{
		{Device: srv.Devices[3], EventType: gonvml.EventTypeXidCriticalError, EventData: 79},
		{Device: srv.Devices[6], EventType: gonvml.EventTypeXidCriticalError, EventData: 13},
	}
	registered := 0
	for _, d := range srv.Devices {
		d.(*server.Device).RegisterEventsFunc = func(types uint64, _ gonvml.EventSet) gonvml.Return {
			if types != gonvml.EventTypeXidCriticalError {
				t.Errorf("registered %b, want XID only (the GPU lacks double-bit ECC events)", types)
			}
			mu.Lock()
			registered++
			mu.Unlock()
			return gonvml.SUCCESS
		}
	}
	srv.EventSetCreateFunc = func() (gonvml.EventSet, gonvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(uint32) (gonvml.EventData, gonvml.Return) {
				mu.Lock()
				defer mu.Unlock()
				if len(queue) == 0 {
					time.Sleep(5 * time.Millisecond)
					return gonvml.EventData{}, gonvml.ERROR_TIMEOUT
				}
				ev := queue[0]
				queue = queue[1:]
				return ev, gonvml.SUCCESS
			},
			FreeFunc: func() gonvml.Return { return gonvml.SUCCESS },
		}, gonvml.SUCCESS
	}
	c := open(t, srv)
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan Event, 4)
	done := make(chan error)
	go func() { done <- c.WatchEvents(ctx, func(e Event) { got <- e }) }()
	uuid3, _ := srv.Devices[3].GetUUID()
	uuid6, _ := srv.Devices[6].GetUUID()
	for _, want := range []Event{{UUID: uuid3, Type: gonvml.EventTypeXidCriticalError, Xid: 79}, {UUID: uuid6, Type: gonvml.EventTypeXidCriticalError, Xid: 13}} {
		select {
		case e := <-got:
			if e != want {
				t.Errorf("event %+v, want %+v", e, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no event")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if registered != 8 {
		t.Errorf("%d GPUs registered for events, want 8", registered)
	}
}
