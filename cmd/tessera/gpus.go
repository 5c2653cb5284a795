package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/spf13/cobra"

	"github.com/tessera-gpu/tessera/pkg/agent/mps"
	"github.com/tessera-gpu/tessera/pkg/agent/timeslice"
	"github.com/tessera-gpu/tessera/pkg/nvml"
)

// exitNoDriver: NVML could not be loaded (no NVIDIA driver here).
const exitNoDriver = 3

// newNVML opens the real driver's NVML; tests replace it with a mock server.
var newNVML = func() gonvml.Interface { return gonvml.New() }

// runGPUs is `tessera gpus`: what the agent reads from this node's GPUs —
// inventory, then usage samples — through the same code the agent runs. On a
// GPU node it is the check that the driver answers what Tessera needs.
func newGPUsCmd(stdout, stderr io.Writer, code *int) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "gpus",
		Short: "Read this node's GPUs through NVML as the agent does",
		Long:  "Prints what the agent reads from this node's GPUs (inventory, then usage\nsamples) through the same code the agent runs: on a GPU node, the check that\nthe driver answers what Tessera needs.",
		Args:  cobra.NoArgs,
	}

	fs := cmd.Flags()
	samples := fs.Int("samples", 3, "usage samples to take")
	interval := fs.Duration("interval", 500*time.Millisecond, "time between samples")
	mpsCheck := fs.String("mps-check", "", "also start an MPS control daemon on GPU 0 with this control program (e.g. nvidia-cuda-mps-control), set a default client limit, read it back and stop it — as the agent does")
	output := fs.StringP("output", "o", "", "output format: json or yaml (default: tables)")
	sliceCheck := fs.String("timeslice-check", "", "also set GPU 0's driver time-slice class to long and back to default with this nvidia-smi, as the agent does on time-shared GPUs")
	cmd.RunE = func(*cobra.Command, []string) error {
		*code = func() int {
			if err := checkOutput(*output); err != nil {
				fmt.Fprintf(stderr, "tessera gpus: %v\n", err)
				return exitUsage
			}
			if *samples < 0 || *interval <= 0 {
				fmt.Fprintln(stderr, "tessera gpus: --samples must be ≥ 0 and --interval positive")
				return exitUsage
			}
			c, err := nvml.New(newNVML())
			if errors.Is(err, nvml.ErrNoDriver) {
				fmt.Fprintf(stderr, "tessera gpus: %v\n", err)
				return exitNoDriver
			}
			if err != nil {
				fmt.Fprintf(stderr, "tessera gpus: %v\n", err)
				return exitError
			}
			defer c.Close()
			devs, err := c.Devices()
			if err != nil {
				fmt.Fprintf(stderr, "tessera gpus: %v\n", err)
			}
			var report gpusReport
			for _, d := range devs {
				report.GPUs = append(report.GPUs, gpuInfo{Index: d.Index, UUID: d.UUID, Model: d.Model, MemoryMiB: d.MemoryMiB,
					SMCount: d.SMCount, MIGEnabled: d.MIGEnabled, ComputeMode: nvml.ComputeModeName(d.ComputeMode), NVLinkPeers: d.NVLinkPeers, PCIBusID: d.PCIBusID})
			}
			table := stdout
			if *output != "" {
				table = io.Discard
			}
			tw := tabwriter.NewWriter(table, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "INDEX\tUUID\tMODEL\tMEMORY MiB\tSMs\tMIG\tCOMPUTE MODE\tNVLINK PEERS")
			for _, d := range devs {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%v\t%s\t%v\n", d.Index, d.UUID, d.Model, d.MemoryMiB, d.SMCount, d.MIGEnabled, nvml.ComputeModeName(d.ComputeMode), d.NVLinkPeers)
			}
			tw.Flush()
			for i := range *samples {
				if i > 0 {
					time.Sleep(*interval)
				}
				us, err := c.Sample()
				if err != nil {
					fmt.Fprintf(stderr, "tessera gpus: %v\n", err)
				}
				at := time.Now()
				fmt.Fprintf(table, "\nsample %d at %s\n", i+1, at.Format(time.RFC3339Nano))
				report.Samples = append(report.Samples, gpuSample{Time: at, GPUs: readings(us)})
				tw := tabwriter.NewWriter(table, 2, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "INDEX\tMEM USED MiB\tSM %\tTEMP °C\tPOWER W\tTHROTTLED\tPROCESSES (pid:MiB:SM%)")
				for _, u := range us {
					if u.Lost {
						fmt.Fprintf(tw, "%d\tlost\t\t\t\t\t\n", u.Index)
						continue
					}
					var procs []string
					for _, p := range u.Processes {
						procs = append(procs, fmt.Sprintf("%d:%d:%s", p.PID, p.MemoryMiB, reading(p.SMUtil)))
					}
					fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%v\t%s\n", u.Index, u.MemoryUsedMiB, reading(u.SMUtil), reading(u.TemperatureC), reading(u.PowerW), u.Throttled(), strings.Join(procs, " "))
				}
				tw.Flush()
			}
			if *output != "" {
				if err := printData(stdout, *output, report); err != nil {
					fmt.Fprintf(stderr, "tessera gpus: %v\n", err)
					return exitError
				}
			}
			if *mpsCheck != "" && len(devs) > 0 {
				if err := checkMPS(*mpsCheck, devs[0].UUID, stdout); err != nil {
					fmt.Fprintf(stderr, "tessera gpus: MPS check: %v\n", err)
					return exitError
				}
			}
			if *sliceCheck != "" && len(devs) > 0 {
				if err := checkTimeSlice(*sliceCheck, devs[0].UUID, stdout); err != nil {
					fmt.Fprintf(stderr, "tessera gpus: time-slice check: %v\n", err)
					return exitError
				}
			}
			return exitOK
		}()
		return nil
	}
	return cmd
}

// checkTimeSlice sets one GPU's time-slice class through the agent's code,
// then puts the driver's default back: a check, not a takeover.
func checkTimeSlice(path, uuid string, stdout io.Writer) error {
	smi, err := timeslice.Find(path)
	if err != nil {
		return err
	}
	ctx := context.Background()
	start := time.Now()
	if err := smi.SetTimeslice(ctx, uuid, timeslice.Long); err != nil {
		return err
	}
	took := time.Since(start)
	if err := smi.SetTimeslice(ctx, uuid, timeslice.Default); err != nil {
		return fmt.Errorf("restoring the default class: %w", err)
	}
	fmt.Fprintf(stdout, "\nTime slice on %s: class long set in %v with %s, default restored\n", uuid, took.Round(time.Millisecond), smi.Path)
	return nil
}

// checkMPS runs the agent's MPS manager on one GPU in a scratch directory:
// start (compute mode left as it is: this is a check, not a takeover), a
// default thread percentage, a health check, and quit.
func checkMPS(binary, uuid string, stdout io.Writer) error {
	root, err := os.MkdirTemp("", "tessera-mps-check")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	m := mps.New(mps.Config{Binary: binary, Root: root, GPUs: []mps.GPU{{UUID: uuid, DefaultThreadPercentage: 40}}})
	ctx := context.Background()
	start := time.Now()
	if err := m.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = m.Stop(ctx) }()
	got, err := m.Control(ctx, uuid, "get_default_active_thread_percentage")
	if err != nil {
		return err
	}
	m.Check(ctx)
	fmt.Fprintf(stdout, "\nMPS on %s: daemon up in %v, pipe %s, default active thread percentage %s, restarts %d\n",
		uuid, time.Since(start).Round(time.Millisecond), m.PipeDir(uuid), got, m.Restarts(uuid))
	return nil
}

// reading prints a reading, or "n/a" where the GPU does not report it.
func reading(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return fmt.Sprintf("%.0f", v)
}

// gpusReport is `tessera gpus -o json|yaml`: the same readings as the
// tables, with a reading the GPU does not report left out (null).
type gpusReport struct {
	GPUs    []gpuInfo   `json:"gpus"`
	Samples []gpuSample `json:"samples"`
}

type gpuInfo struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Model       string `json:"model"`
	MemoryMiB   int64  `json:"memoryMiB"`
	SMCount     int    `json:"smCount,omitempty"`
	MIGEnabled  bool   `json:"migEnabled"`
	ComputeMode string `json:"computeMode"`
	NVLinkPeers []int  `json:"nvlinkPeers,omitempty"`
	PCIBusID    string `json:"pciBusID,omitempty"`
}

type gpuSample struct {
	Time time.Time    `json:"time"`
	GPUs []gpuReading `json:"gpus"`
}

type gpuReading struct {
	Index          int          `json:"index"`
	UUID           string       `json:"uuid"`
	Lost           bool         `json:"lost,omitempty"`
	MemoryUsedMiB  int64        `json:"memoryUsedMiB"`
	MemoryTotalMiB int64        `json:"memoryTotalMiB"`
	SMUtil         *float64     `json:"smUtilPercent"`
	TemperatureC   *float64     `json:"temperatureC"`
	PowerW         *float64     `json:"powerW"`
	Throttled      bool         `json:"throttled"`
	Processes      []gpuProcess `json:"processes,omitempty"`
}

type gpuProcess struct {
	PID       uint32   `json:"pid"`
	MemoryMiB int64    `json:"memoryMiB"`
	SMUtil    *float64 `json:"smUtilPercent"`
}

// known is nil for NaN, NVML's "not reported" in the agent's readings.
func known(v float64) *float64 {
	if math.IsNaN(v) {
		return nil
	}
	return &v
}

func readings(us []nvml.DeviceUsage) []gpuReading {
	out := make([]gpuReading, 0, len(us))
	for _, u := range us {
		r := gpuReading{Index: u.Index, UUID: u.UUID, Lost: u.Lost, MemoryUsedMiB: u.MemoryUsedMiB, MemoryTotalMiB: u.MemoryTotalMiB,
			SMUtil: known(u.SMUtil), TemperatureC: known(u.TemperatureC), PowerW: known(u.PowerW), Throttled: u.Throttled()}
		for _, p := range u.Processes {
			r.Processes = append(r.Processes, gpuProcess{PID: p.PID, MemoryMiB: p.MemoryMiB, SMUtil: known(p.SMUtil)})
		}
		out = append(out, r)
	}
	return out
}
