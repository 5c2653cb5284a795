// Command isolation is the Go half of hack/gpu-isolation-check.sh: it puts
// limits in force on a real GPU through the agent's own code — the memlimit
// limiter over Tessera's NVML client for kernel memory limits, the MPS
// manager for server limits — so the check measures what the agent does,
// not a re-implementation. It builds no Kubernetes package.
//
//	isolation uuid  --index 0
//	isolation nvml  (every NVML call the agent makes, against this driver)
//	isolation probe --gpu UUID --root /sys/fs/cgroup/tessera-check-1
//	isolation limit --gpu UUID --root R --uid UID --hard-mib N [--soft-mib N]
//	isolation clear --gpu UUID --root R
//	isolation mps   --gpu UUID --dir D --threads N --mem-mib N   (runs until stdin closes)
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/pkg/agent/memlimit"
	"github.com/tessera-gpu/tessera/pkg/agent/mps"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/nvml"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "isolation: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: isolation uuid|probe|limit|clear|mps [flags]")
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	var (
		index   = fs.Int("index", 0, "GPU index (uuid)")
		uuid    = fs.String("gpu", "", "GPU UUID")
		root    = fs.String("root", "", "cgroup v2 root holding kubepods.slice (probe, limit, clear)")
		uid     = fs.String("uid", "", "pod UID (limit)")
		hardMiB = fs.Uint64("hard-mib", 0, "hard limit, MiB (limit)")
		softMiB = fs.Uint64("soft-mib", 0, "soft limit, MiB; the hard limit when 0 (limit)")
		dir     = fs.String("dir", "", "MPS root directory (mps)")
		binary  = fs.String("mps-control", mps.DefaultBinary, "MPS control program (mps)")
		threads = fs.Int("threads", 100, "server active thread percentage (mps)")
		memMiB  = fs.Int64("mem-mib", 0, "server pinned memory limit, MiB; 0 none (mps)")
	)
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	c, err := nvml.New(gonvml.New())
	if err != nil {
		return err
	}
	defer c.Close()
	ctx := context.Background()
	lim := &memlimit.Limiter{NVML: c, Root: *root}
	switch args[0] {
	case "uuid":
		devs, err := c.Devices()
		if err != nil {
			return err
		}
		for _, d := range devs {
			if d.Index == *index {
				fmt.Println(d.UUID)
				return nil
			}
		}
		return fmt.Errorf("no GPU with index %d", *index)
	case "nvml":
		return walkNVML(ctx, c)
	case "probe":
		driver, _, _ := c.DriverVersion()
		offered, why, err := lim.Probe([]string{*uuid})
		if err != nil {
			return err
		}
		fmt.Printf("driver %s: kernel memory limits offered=%v %s\n", driver, offered[*uuid], why[*uuid])
		if !offered[*uuid] {
			os.Exit(3)
		}
		return nil
	case "limit":
		soft := *softMiB
		if soft == 0 {
			soft = *hardMiB
		}
		// The agent's path: ApplyPod finds the pod's cgroup by UID under
		// the root and sets the limit through NVML.
		if err := lim.ApplyPod(ctx, *uid, map[string]memlimit.Want{*uuid: {Soft: soft << 20, Hard: *hardMiB << 20}}); err != nil {
			return err
		}
		cg, err := lim.PodCgroup(*uid)
		if err != nil {
			return err
		}
		got, found, err := c.GetMemoryLimits(*uuid, cg)
		if err != nil {
			return err
		}
		fmt.Printf("limit on %s: found=%v soft=%d MiB hard=%d MiB used=%d MiB\n", cg, found, got.Soft>>20, got.Hard>>20, got.Used>>20)
		return nil
	case "clear":
		// The agent's path for an ended pod: reconcile with no pod wanting
		// a limit.
		res, err := lim.Reconcile(ctx, map[memlimit.Key]memlimit.Want{}, []string{*uuid})
		fmt.Printf("cleared %d limit(s)\n", res.Cleared)
		return err
	case "mps":
		m := mps.New(mps.Config{Binary: *binary, Root: *dir, GPUs: []mps.GPU{{UUID: *uuid, DefaultThreadPercentage: 100}}})
		if err := m.Start(ctx); err != nil {
			return err
		}
		defer func() { _ = m.Stop(ctx) }()
		if err := m.SetServerLimits(ctx, *uuid, gpu.MPSServerLimits{ThreadPercent: *threads, MemoryMiB: *memMiB}); err != nil {
			return err
		}
		t, _ := m.Control(ctx, *uuid, "get_default_active_thread_percentage")
		mem, _ := m.Control(ctx, *uuid, "get_default_device_pinned_mem_limit 0")
		fmt.Printf("MPS up: pipe %s, server defaults: threads %s%%, memory %s\n", m.PipeDir(*uuid), t, mem)
		_, _ = io.Copy(io.Discard, os.Stdin)
		return nil
	}
	return fmt.Errorf("unknown command %q", args[0])
}

// walkNVML makes every NVML call the agent makes on a node (inventory,
// sampling with per-process usage, driver version, persistence mode,
// processes, events, whether memory limits are offered) and prints what
// each answered: a call the driver lacks shows here instead of killing an
// agent.
func walkNVML(ctx context.Context, c *nvml.Client) error {
	driver, cuda, err := c.DriverVersion()
	fmt.Printf("nvml: driver %s, CUDA %d, err %v\n", driver, cuda, err)
	devs, err := c.Devices()
	if err != nil {
		return fmt.Errorf("devices: %w", err)
	}
	for _, d := range devs {
		fmt.Printf("nvml: device %+v\n", d)
		pm, err := c.PersistenceMode(d.UUID)
		fmt.Printf("nvml: persistence mode %v, err %v\n", pm, err)
		procs, err := c.Processes(d.UUID)
		fmt.Printf("nvml: processes %v, err %v\n", procs, err)
		ok, err := c.MemoryLimitsOffered(d.UUID, "/sys/fs/cgroup")
		fmt.Printf("nvml: memory limits offered %v, err %v\n", ok, err)
	}
	for i := 0; i < 2; i++ {
		use, err := c.Sample()
		for _, u := range use {
			fmt.Printf("nvml: sample %d: GPU %d mem %d/%d MiB sm %.0f%% %.0f C %.0f W clocks 0x%x throttled %v, %d process(es), lost %v; err %v\n",
				i, u.Index, u.MemoryUsedMiB, u.MemoryTotalMiB, u.SMUtil, u.TemperatureC, u.PowerW, u.ClockEventReasons, u.Throttled(), len(u.Processes), u.Lost, err)
		}
		time.Sleep(time.Second)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	events := 0
	err = c.WatchEvents(wctx, func(nvml.Event) { events++ })
	fmt.Printf("nvml: watched events for 2 s: %d event(s), err %v\n", events, err)
	return nil
}
