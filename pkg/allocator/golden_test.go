package allocator

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// update rewrites testdata's expected results with this run's: go test
// ./pkg/allocator -run Golden -update, then review the diff.
var update = flag.Bool("update", false, "rewrite testdata's expected results with this run's")

// TestGoldenPlacements replays arrivals and departures on a small cluster
// (testdata/placements/*.txt) under every policy and prints where each pod
// landed: a change of a policy's choices shows as a diff of those files.
//
// Commands: "cluster" with one node per input line ("<name> gpus=<n>
// [mem=<MiB>] [model=<m>] [mps]"), and "place" with one event per input
// line: "<pod> gpus=<n> [mem=<MiB> cores=<%>] [mode=ts|mps]" arrives,
// "- <pod>" leaves. The target workload of fgd and tessera is the shapes of
// the place command's arrivals.
func TestGoldenPlacements(t *testing.T) {
	if *update {
		if err := flag.Set("rewrite", "true"); err != nil {
			t.Fatal(err)
		}
	}
	datadriven.Walk(t, "testdata/placements", func(t *testing.T, path string) {
		var invs []*gpu.NodeInventory
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "cluster":
				invs = nil
				for _, line := range lines(d.Input) {
					name, kv := fields(t, d, line)
					inv := &gpu.NodeInventory{Node: name, CPUMilli: 64000, MemoryMiB: 512 << 10}
					for i := range atoi(t, d, kv["gpus"], "1") {
						inv.GPUs = append(inv.GPUs, gpu.Device{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", name, i), Model: or(kv["model"], "H100"),
							MemoryMiB: int64(atoi(t, d, kv["mem"], "81920")), Healthy: true, MPSCapable: kv["mps"] != ""})
					}
					invs = append(invs, inv)
				}
				return ""
			case "place":
				return placeAll(t, d, invs)
			}
			t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
			return ""
		})
	})
}

type goldenEvent struct {
	pod   string
	leave bool
	req   *Request
}

func placeAll(t *testing.T, d *datadriven.TestData, invs []*gpu.NodeInventory) string {
	var events []goldenEvent
	var counts []ShapeCount
	for _, line := range lines(d.Input) {
		if rest, ok := strings.CutPrefix(line, "- "); ok {
			events = append(events, goldenEvent{pod: strings.TrimSpace(rest), leave: true})
			continue
		}
		name, kv := fields(t, d, line)
		c := Container{Name: "m", Count: atoi(t, d, kv["gpus"], "1"), MemoryMiB: int64(atoi(t, d, kv["mem"], "0")), Cores: atoi(t, d, kv["cores"], "0") * gpu.CoresPerGPU / 100}
		c.Whole = c.MemoryMiB == 0 && c.Cores == 0
		r := &Request{Sharing: gpu.ModeAuto, Containers: []Container{c}}
		switch kv["mode"] {
		case "ts":
			r.Sharing = gpu.ModeTimeSlicing
		case "mps":
			r.Sharing = gpu.ModeMPS
		}
		if err := r.Check(); err != nil {
			return fmt.Sprintf("%s: %v", name, err)
		}
		events = append(events, goldenEvent{pod: name, req: r})
		counts = append(counts, ShapeCount{Request: r, Count: 1})
	}
	w, err := NewWorkload(counts, 1)
	if err != nil {
		t.Fatal(err)
	}
	cols := map[config.Policy][]string{}
	for _, policy := range config.Policies {
		cfg := config.Default().Allocator
		cfg.Policy = policy
		a, err := New(&cfg, w)
		if err != nil {
			t.Fatal(err)
		}
		nodes := make([]*Node, len(invs))
		for i, inv := range invs {
			if nodes[i], err = NewNode(inv); err != nil {
				t.Fatal(err)
			}
		}
		type placed struct {
			node int
			a    *gpu.PodAssignment
		}
		held := map[string]placed{}
		var p Placement
		for _, e := range events {
			if e.leave {
				if h, ok := held[e.pod]; ok {
					nodes[h.node].RemoveAssignment(h.a, 0, 0)
					delete(held, e.pod)
				}
				cols[policy] = append(cols[policy], "")
				continue
			}
			best := a.Choose(nodes, e.req, &p)
			if best < 0 {
				cols[policy] = append(cols[policy], "-")
				continue
			}
			asg := nodes[best].Assignment(e.req, &p)
			nodes[best].Apply(e.req, &p)
			held[e.pod] = placed{node: best, a: asg}
			cols[policy] = append(cols[policy], describe(asg))
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-10s", "pod")
	for _, policy := range config.Policies {
		fmt.Fprintf(&b, " %-18s", policy)
	}
	for i, e := range events {
		b.WriteString("\n")
		if e.leave {
			fmt.Fprintf(&b, "- %s leaves", e.pod)
			continue
		}
		fmt.Fprintf(&b, "%-10s", e.pod)
		for _, policy := range config.Policies {
			fmt.Fprintf(&b, " %-18s", cols[policy][i])
		}
	}
	out := strings.Split(b.String(), "\n")
	for i := range out {
		out[i] = strings.TrimRight(out[i], " ")
	}
	return strings.Join(out, "\n")
}

// describe is an assignment in a column: node:GPU indexes, and the slice
// of a shared one.
func describe(a *gpu.PodAssignment) string {
	var parts []string
	for _, c := range a.Containers {
		for _, g := range c.GPUs {
			if c.Mode == gpu.ModeExclusive {
				parts = append(parts, strconv.Itoa(g.Index))
			} else {
				parts = append(parts, fmt.Sprintf("%d(%dG/%d%%)", g.Index, g.MemoryMiB/1024, g.CoresPerMille/10))
			}
		}
	}
	return a.Node + ":" + strings.Join(parts, ",")
}

func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

func fields(t *testing.T, d *datadriven.TestData, line string) (string, map[string]string) {
	f := strings.Fields(line)
	kv := map[string]string{}
	for _, x := range f[1:] {
		k, v, ok := strings.Cut(x, "=")
		if !ok {
			v = "true"
		}
		kv[k] = v
	}
	return f[0], kv
}

func atoi(t *testing.T, d *datadriven.TestData, s, def string) int {
	if s == "" {
		s = def
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("%s: %q is not a number", d.Pos, s)
	}
	return n
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
