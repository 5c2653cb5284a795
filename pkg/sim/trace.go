// Package sim replays a GPU-sharing trace through pkg/allocator, the way the
// FGD paper's simulator does, and reports how much of the cluster's GPU
// capacity each scoring policy manages to allocate as demand arrives.
//
// It reads the openb CSV format (see ../shared/traces/openb/README.md) and has
// a seeded synthetic generator of the same shape for runs without a trace. It
// does no I/O of its own beyond the readers and writers it is handed.
package sim

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// NodeSpec is one row of a node list.
type NodeSpec struct {
	Name      string
	CPUMilli  int64
	MemoryMiB int64
	GPUs      int
	Model     string
}

// PodSpec is one row of a pod list.
type PodSpec struct {
	Name      string
	CPUMilli  int64
	MemoryMiB int64
	NumGPU    int
	// GPUMilli is the share of each GPU, 1000 = whole.
	GPUMilli int64
	// Models is the gpu_spec allow-list; empty means any.
	Models []string
	// Created and Deleted are the pod's creation_time and deletion_time in
	// seconds (0 where the list has none): a timeline replay
	// (Trace.Timeline) lets it arrive and leave by them.
	Created, Deleted int64
}

// Demand is the pod's GPU demand in milli-GPU.
func (p PodSpec) Demand() int64 { return int64(p.NumGPU) * p.GPUMilli }

// ErrTrace is wrapped by every error about the content of a trace file.
var ErrTrace = errors.New("bad trace")

// GPUMemoryMiB is the memory of the trace's GPU models. The simulator maps
// gpu_milli to memory in proportion (oversubscription 1.0), so only the
// proportion matters; models not listed (the trace's anonymised G2, G3, …) get
// DefaultGPUMemoryMiB.
var GPUMemoryMiB = map[string]int64{
	"P100": 16 << 10, "T4": 16 << 10, "V100M16": 16 << 10, "V100M32": 32 << 10,
	"A10": 24 << 10, "A100": 80 << 10, "H100": 80 << 10, "H200": 141 << 10,
}

// DefaultGPUMemoryMiB is the memory of a GPU model not in GPUMemoryMiB.
const DefaultGPUMemoryMiB = 32 << 10

type table struct {
	file string
	r    *csv.Reader
	cols map[string]int
}

func openTable(r io.Reader, file string, required ...string) (*table, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = true
	header, err := cr.Read()
	if err != nil {
		if err == io.EOF {
			return nil, fmt.Errorf("%s:1: %w: empty file, want a header row", file, ErrTrace)
		}
		return nil, fmt.Errorf("%s: %w: %v", file, ErrTrace, err)
	}
	t := &table{file: file, r: cr, cols: map[string]int{}}
	for i, h := range header {
		t.cols[strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))] = i
	}
	for _, c := range required {
		if _, ok := t.cols[c]; !ok {
			return nil, fmt.Errorf("%s:1: %w: no column %q (header has %s)", file, ErrTrace, c, strings.Join(header, ","))
		}
	}
	return t, nil
}

type row struct {
	t    *table
	rec  []string
	line int
	err  error
}

func (t *table) next() (*row, bool, error) {
	rec, err := t.r.Read()
	if err == io.EOF {
		return nil, false, nil
	}
	if err != nil {
		line := 0
		var pe *csv.ParseError
		if errors.As(err, &pe) {
			line, err = pe.Line, pe.Err
		}
		return nil, false, fmt.Errorf("%s:%d: %w: %v", t.file, line, ErrTrace, err)
	}
	line, _ := t.r.FieldPos(0)
	return &row{t: t, rec: rec, line: line}, true, nil
}

func (r *row) str(col string) string {
	i, ok := r.t.cols[col]
	if !ok || i >= len(r.rec) {
		return ""
	}
	return strings.TrimSpace(r.rec[i])
}

func (r *row) int(col string, min, max int64) int64 {
	if r.err != nil {
		return 0
	}
	s := r.str(col)
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		r.err = fmt.Errorf("%s:%d: %w: column %s: %q is not an integer", r.t.file, r.line, ErrTrace, col, s)
		return 0
	}
	if v < min || v > max {
		r.err = fmt.Errorf("%s:%d: %w: column %s: %d is outside %d..%d", r.t.file, r.line, ErrTrace, col, v, min, max)
	}
	return v
}

func (r *row) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%s:%d: %w: %s", r.t.file, r.line, ErrTrace, fmt.Sprintf(format, args...))
	}
}

// ParseNodes reads a node list (columns sn, cpu_milli, memory_mib, gpu, model).
func ParseNodes(in io.Reader, file string) ([]NodeSpec, error) {
	t, err := openTable(in, file, "sn", "cpu_milli", "memory_mib", "gpu", "model")
	if err != nil {
		return nil, err
	}
	var nodes []NodeSpec
	seen := map[string]int{}
	for {
		r, ok, err := t.next()
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		n := NodeSpec{
			Name:      r.str("sn"),
			CPUMilli:  r.int("cpu_milli", 0, 1<<40),
			MemoryMiB: r.int("memory_mib", 0, 1<<40),
			GPUs:      int(r.int("gpu", 0, allocator.MaxGPUsPerNode)),
			Model:     r.str("model"),
		}
		switch {
		case n.Name == "":
			r.fail("column sn: empty node name")
		case seen[n.Name] != 0:
			r.fail("node %s already defined on line %d", n.Name, seen[n.Name])
		case n.GPUs > 0 && n.Model == "":
			r.fail("node %s has %d GPUs but no model", n.Name, n.GPUs)
		}
		if r.err != nil {
			return nil, r.err
		}
		seen[n.Name] = r.line
		nodes = append(nodes, n)
	}
	if len(nodes) == 0 {
		return nil, fmt.Errorf("%s: %w: no nodes", file, ErrTrace)
	}
	return nodes, nil
}

// ParsePods reads a pod list (columns name, cpu_milli, memory_mib, num_gpu,
// gpu_milli; optional gpu_spec, creation_time and deletion_time; other
// columns are ignored).
func ParsePods(in io.Reader, file string) ([]PodSpec, error) {
	t, err := openTable(in, file, "name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
	if err != nil {
		return nil, err
	}
	var pods []PodSpec
	for {
		r, ok, err := t.next()
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		p := PodSpec{
			Name:      r.str("name"),
			CPUMilli:  r.int("cpu_milli", 0, 1<<40),
			MemoryMiB: r.int("memory_mib", 0, 1<<40),
			NumGPU:    int(r.int("num_gpu", 0, allocator.MaxGPUsPerNode)),
			GPUMilli:  r.int("gpu_milli", 0, gpu.CoresPerGPU),
		}
		// Empty times are 0, as the lists without times have them.
		if r.str("creation_time") != "" {
			p.Created = r.int("creation_time", 0, 1<<40)
		}
		if r.str("deletion_time") != "" {
			p.Deleted = r.int("deletion_time", 0, 1<<40)
		}
		if spec := r.str("gpu_spec"); spec != "" && r.err == nil {
			models, err := gpu.ParseModelList(spec)
			if err != nil {
				r.fail("column gpu_spec: %v", err)
			}
			p.Models = models
		}
		switch {
		case r.err != nil:
		case p.NumGPU > 0 && p.GPUMilli == 0:
			r.fail("pod %s asks for %d GPUs with gpu_milli 0", p.Name, p.NumGPU)
		case p.NumGPU == 0 && p.GPUMilli > 0:
			r.fail("pod %s asks for gpu_milli %d with num_gpu 0", p.Name, p.GPUMilli)
		case p.NumGPU == 0 && p.CPUMilli == 0 && p.MemoryMiB == 0:
			r.fail("pod %s asks for nothing", p.Name)
		case p.Deleted < p.Created:
			r.fail("pod %s leaves (deletion_time %d) before it arrives (creation_time %d)", p.Name, p.Deleted, p.Created)
		}
		if r.err != nil {
			return nil, r.err
		}
		pods = append(pods, p)
	}
	if len(pods) == 0 {
		return nil, fmt.Errorf("%s: %w: no pods", file, ErrTrace)
	}
	return pods, nil
}

// ReadNodes and ReadPods parse a file by path; errors name file:line.
func ReadNodes(path string) ([]NodeSpec, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseNodes(f, path)
}

// ReadPods parses a pod list by path.
func ReadPods(path string) ([]PodSpec, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParsePods(f, path)
}

// Inventory turns a node row into an allocator node.
func (n NodeSpec) Inventory() *gpu.NodeInventory {
	inv := &gpu.NodeInventory{Node: n.Name, CPUMilli: n.CPUMilli, MemoryMiB: n.MemoryMiB}
	mem, ok := GPUMemoryMiB[n.Model]
	if !ok {
		mem = DefaultGPUMemoryMiB
	}
	for i := range n.GPUs {
		inv.GPUs = append(inv.GPUs, gpu.Device{Index: i, UUID: fmt.Sprintf("%s-gpu%d", n.Name, i), Model: n.Model, MemoryMiB: mem, Healthy: true})
	}
	return inv
}

// Request turns a pod row into an allocator request: gpu_milli becomes cores
// and, in proportion, memory on whichever GPU the pod lands.
func (p PodSpec) Request() *allocator.Request {
	r := &allocator.Request{CPUMilli: p.CPUMilli, MemoryMiB: p.MemoryMiB, Sharing: gpu.ModeAuto, Models: p.Models}
	if p.NumGPU > 0 {
		r.Containers = []allocator.Container{{
			Count: p.NumGPU,
			Whole: p.GPUMilli == gpu.CoresPerGPU,
			Cores: int(p.GPUMilli),
		}}
	}
	return r
}
