package sim

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const podHeader = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"

func TestParsePods(t *testing.T) {
	in := podHeader +
		"p0,12000,16384,1,1000,,LS,Running,0,1,0\n" +
		"p1,6000,12288,1,460,V100M16|V100M32,LS,Running,7,1200,0\n" +
		"p2,4000,8192,0,0,,BE,Running,0,1,0\n" +
		"p3,32000,65536,8,1000,,LS,Running,0,1,0\n"
	pods, err := ParsePods(strings.NewReader(in), "pods.csv")
	if err != nil {
		t.Fatal(err)
	}
	want := []PodSpec{
		{Name: "p0", CPUMilli: 12000, MemoryMiB: 16384, NumGPU: 1, GPUMilli: 1000, Deleted: 1},
		{Name: "p1", CPUMilli: 6000, MemoryMiB: 12288, NumGPU: 1, GPUMilli: 460, Models: []string{"V100M16", "V100M32"}, Created: 7, Deleted: 1200},
		{Name: "p2", CPUMilli: 4000, MemoryMiB: 8192, Deleted: 1},
		{Name: "p3", CPUMilli: 32000, MemoryMiB: 65536, NumGPU: 8, GPUMilli: 1000, Deleted: 1},
	}
	if diff := cmp.Diff(want, pods); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	// The multigpu50 file has only the first five columns.
	short := "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,1024,2,1000\n"
	if _, err := ParsePods(strings.NewReader(short), "short.csv"); err != nil {
		t.Errorf("five-column file: %v", err)
	}
}

func TestParseErrorsNameFileAndLine(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr string
	}{
		{"not a number", podHeader + "p0,12000,16384,1,1000,,LS,Running,0,1,0\np1,abc,1,1,100,,,,,,\n", `pods.csv:3: bad trace: column cpu_milli: "abc" is not an integer`},
		{"negative", podHeader + "p1,-5,1,1,100,,,,,,\n", "pods.csv:2: bad trace: column cpu_milli: -5 is outside 0.."},
		{"milli above a GPU", podHeader + "p1,1,1,1,1001,,,,,,\n", "pods.csv:2: bad trace: column gpu_milli: 1001 is outside 0..1000"},
		{"gpus without share", podHeader + "p1,1,1,2,0,,,,,,\n", "pods.csv:2: bad trace: pod p1 asks for 2 GPUs with gpu_milli 0"},
		{"share without gpus", podHeader + "p1,1,1,0,500,,,,,,\n", "pods.csv:2: bad trace: pod p1 asks for gpu_milli 500 with num_gpu 0"},
		{"too many gpus", podHeader + "p1,1,1,65,1000,,,,,,\n", "pods.csv:2: bad trace: column num_gpu: 65 is outside 0..64"},
		{"empty spec", podHeader + "p1,1,1,1,100,|,,,,,\n", "pods.csv:2: bad trace: column gpu_spec"},
		{"missing column", "name,cpu_milli,memory_mib,num_gpu\np,1,1,1\n", `pods.csv:1: bad trace: no column "gpu_milli"`},
		{"empty file", "", "pods.csv:1: bad trace: empty file"},
		{"header only", podHeader, "pods.csv: bad trace: no pods"},
		{"unbalanced quote", podHeader + "p1,\"1,1,1,100\n", "pods.csv:2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParsePods(strings.NewReader(tt.in), "pods.csv")
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("ParsePods() error = %v, want it to contain %q", err, tt.wantErr)
			}
			if !errors.Is(err, ErrTrace) {
				t.Errorf("error does not wrap ErrTrace: %v", err)
			}
		})
	}
}

func TestParseNodes(t *testing.T) {
	in := "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nn1,32000,131072,0,\n"
	nodes, err := ParseNodes(strings.NewReader(in), "nodes.csv")
	if err != nil {
		t.Fatal(err)
	}
	want := []NodeSpec{{Name: "n0", CPUMilli: 64000, MemoryMiB: 262144, GPUs: 2, Model: "P100"}, {Name: "n1", CPUMilli: 32000, MemoryMiB: 131072}}
	if diff := cmp.Diff(want, nodes); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	for _, bad := range []struct{ in, want string }{
		{"sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,2,P100\nn0,1,1,2,P100\n", "nodes.csv:3: bad trace: node n0 already defined on line 2"},
		{"sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,2,\n", "nodes.csv:2: bad trace: node n0 has 2 GPUs but no model"},
		{"sn,cpu_milli,memory_mib,gpu,model\n,1,1,0,\n", "nodes.csv:2: bad trace: column sn: empty node name"},
		{"sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,x,A\n", `nodes.csv:2: bad trace: column gpu: "x" is not an integer`},
	} {
		if _, err := ParseNodes(strings.NewReader(bad.in), "nodes.csv"); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ParseNodes(%q) error = %v, want %q", bad.in, err, bad.want)
		}
	}
}

func FuzzParsePods(f *testing.F) {
	f.Add(podHeader + "p0,12000,16384,1,1000,,LS,Running,0,1,0\n")
	f.Add(podHeader + "p1,6000,12288,1,460,V100M16|V100M32,LS,Running,0,1,0\n")
	f.Add("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,8,1000\n")
	f.Add(podHeader + "p1,\"1,1,1,100\n")
	f.Fuzz(func(t *testing.T, in string) {
		pods, err := ParsePods(strings.NewReader(in), "fuzz.csv")
		if err != nil {
			if !errors.Is(err, ErrTrace) && !strings.HasPrefix(err.Error(), "fuzz.csv") {
				t.Fatalf("error without file name: %v", err)
			}
			return
		}
		for _, p := range pods {
			if p.CPUMilli < 0 || p.MemoryMiB < 0 || p.NumGPU < 0 || p.GPUMilli < 0 || p.GPUMilli > 1000 || (p.NumGPU > 0) != (p.GPUMilli > 0) {
				t.Fatalf("accepted an impossible pod %+v", p)
			}
			if err := p.Request().Check(); err != nil {
				t.Fatalf("accepted pod %+v makes a bad request: %v", p, err)
			}
		}
	})
}

func FuzzParseNodes(f *testing.F) {
	f.Add("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\n")
	f.Add("sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,0,\n")
	f.Fuzz(func(t *testing.T, in string) {
		nodes, err := ParseNodes(strings.NewReader(in), "fuzz.csv")
		if err != nil {
			return
		}
		for _, n := range nodes {
			if n.Name == "" || n.GPUs < 0 || n.CPUMilli < 0 || (n.GPUs > 0 && n.Model == "") {
				t.Fatalf("accepted an impossible node %+v", n)
			}
		}
	})
}
