package doctor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/pkg/agent/mps"
	"github.com/tessera-gpu/tessera/pkg/nvml/nvmltest"
)

// healthyNode is a recorded GPU node where everything is as Tessera wants
// it: an MPS node with kernel 6.8, cgroup v2 with dmem, kubelet with the
// agent registered, containerd 2 with CDI, the NVIDIA toolkit configured.
func healthyNode() fstest.MapFS {
	sock := &fstest.MapFile{Mode: fs.ModeSocket}
	exe := &fstest.MapFile{Data: []byte("#!"), Mode: 0o755}
	fsys := fstest.MapFS{
		"proc/sys/kernel/osrelease":                              {Data: []byte("6.8.0-45-generic\n")},
		"sys/fs/cgroup/cgroup.controllers":                       {Data: []byte("cpuset cpu io memory hugetlb pids rdma misc dmem\n")},
		"usr/bin/nvidia-smi":                                     exe,
		"usr/bin/nvidia-cuda-mps-control":                        exe,
		"usr/bin/nvidia-container-runtime":                       exe,
		"usr/bin/nvidia-cdi-hook":                                exe,
		"var/lib/kubelet/device-plugins/kubelet.sock":            sock,
		"var/lib/kubelet/device-plugins/tessera-1764745123.sock": sock,
		"var/lib/kubelet/pod-resources/kubelet.sock":             sock,
		"var/lib/kubelet/config.yaml":                            {Data: []byte("kind: KubeletConfiguration\ncgroupDriver: systemd\n")},
		"etc/containerd/config.toml":                             {Data: []byte("version = 3\n")},
		"etc/nvidia-container-runtime/config.toml":               {Data: []byte("accept-nvidia-visible-devices-envvar-when-unprivileged = false\n[nvidia-container-runtime]\nmode = \"cdi\"\n")},
		"proc/1234/comm":                                         {Data: []byte("kubelet\n")},
		"proc/1234/cmdline":                                      {Data: []byte("/usr/bin/kubelet\x00--config=/var/lib/kubelet/config.yaml\x00--container-runtime-endpoint=unix:///run/containerd/containerd.sock\x00")},
		"var/run/cdi/tessera-GPU-0-s0.json":                      {Data: []byte("{}")},
	}
	return fsys
}

// mpsDirs gives every GPU of srv an MPS directory with a control pipe.
func mpsDirs(fsys fstest.MapFS, srv *server.Server) {
	for _, d := range srv.Devices {
		u, _ := d.GetUUID()
		fsys["run/tessera/mps/"+u+"/pipe/control"] = &fstest.MapFile{Mode: fs.ModeNamedPipe}
		fsys["run/tessera/mps/"+u+"/log/control.log"] = &fstest.MapFile{Data: []byte("[2026-12-04 10:00:00.000 Control 1] Starting control daemon\n")}
	}
}

// gpus is the DGX H100 mock with each GPU's reading from r.
func gpus(r func(i int) *nvmltest.Reading) *server.Server {
	srv := dgxh100.New()
	nvmltest.Install(srv, r)
	return srv
}

func exclusive(int) *nvmltest.Reading {
	return &nvmltest.Reading{KernelLimits: true, ComputeMode: gonvml.COMPUTEMODE_EXCLUSIVE_PROCESS}
}

func diagnose(t *testing.T, fsys fs.FS, lib gonvml.Interface, libErr error, o NodeOptions) []Finding {
	t.Helper()
	return DiagnoseNode(context.Background(), fsys, lib, libErr, nil, o, 10*time.Second)
}

// find returns the findings with id (and subject, when given).
func find(fs []Finding, id string) []Finding {
	var out []Finding
	for _, f := range fs {
		if f.ID == id {
			out = append(out, f)
		}
	}
	return out
}

func TestHealthyNodeIsAllOK(t *testing.T) {
	srv := gpus(exclusive)
	fsys := healthyNode()
	mpsDirs(fsys, srv)
	got := diagnose(t, fsys, srv, nil, NodeOptions{MPS: true})
	for _, f := range got {
		if f.Severity > OK {
			t.Errorf("healthy node: %s %s %s: %s (%s)", f.Severity, f.ID, f.Subject, f.Summary, f.Evidence)
		}
	}
	if n := len(find(got, "mps.daemon")); n != len(srv.Devices) {
		t.Errorf("%d mps.daemon findings, want one per GPU (%d)", n, len(srv.Devices))
	}
	if ExitCode(got) != 0 {
		t.Errorf("exit code %d", ExitCode(got))
	}
}

// TestFaultsOfTheSourceWriteUp: each compatibility row and each node-side
// row of the source write-up's troubleshooting table, set up on a fixture,
// is found with its remedy.
func TestFaultsOfTheSourceWriteUp(t *testing.T) {
	tests := []struct {
		name    string
		break_  func(fsys fstest.MapFS, srv *server.Server)
		reading func(i int) *nvmltest.Reading
		libErr  error
		id      string
		sev     Severity
		want    []string // in summary, evidence or remedy
	}{
		{name: "kernel too old (compatibility: kernel 5.15 with cgroup v2)",
			break_: func(f fstest.MapFS, _ *server.Server) {
				f["proc/sys/kernel/osrelease"].Data = []byte("4.19.0-27-amd64\n")
			},
			id: "kernel.version", sev: Error, want: []string{"kernel 4.19 is older than 5.8", "Upgrade the kernel"}},
		{name: "no cgroup v2",
			break_: func(f fstest.MapFS, _ *server.Server) { delete(f, "sys/fs/cgroup/cgroup.controllers") },
			id:     "kernel.cgroup-v2", sev: Error, want: []string{"no cgroup v2 hierarchy", "systemd.unified_cgroup_hierarchy=1"}},
		{name: "no dmem controller",
			break_: func(f fstest.MapFS, _ *server.Server) {
				f["sys/fs/cgroup/cgroup.controllers"].Data = []byte("cpuset cpu io memory pids\n")
			},
			id: "kernel.dmem", sev: Info, want: []string{"no dmem cgroup controller", "6.14"}},
		{name: "no driver (compatibility: driver with MPS)", libErr: errors.New("libnvidia-ml.so.1: cannot open shared object file"),
			id: "driver.nvml", sev: Error, want: []string{"libnvidia-ml.so.1", "Install the NVIDIA driver"}},
		{name: "driver 470 / CUDA 11.4 (compatibility row: MPS limits need more)",
			break_: func(_ fstest.MapFS, srv *server.Server) {
				srv.SystemGetDriverVersionFunc = func() (string, gonvml.Return) { return "470.82.01", gonvml.SUCCESS }
				srv.SystemGetCudaDriverVersionFunc = func() (int, gonvml.Return) { return 11040, gonvml.SUCCESS }
			},
			id: "driver.mps-memory-limit", sev: Warning, want: []string{"CUDA 11.4 predates MPS client memory limits", "R495"}},
		{name: "persistence off (the write-up: MPS settings lost on restart)",
			reading: func(i int) *nvmltest.Reading { r := exclusive(i); r.PersistenceOff = i == 3; return r },
			id:      "gpu.persistence", sev: Warning, want: []string{"persistence mode is off", "nvidia-persistenced"}},
		{name: "MPS will not start",
			break_: func(f fstest.MapFS, srv *server.Server) {
				u, _ := srv.Devices[2].GetUUID()
				delete(f, "run/tessera/mps/"+u+"/pipe/control")
				f["run/tessera/mps/"+u+"/log/control.log"].Data = []byte("[2026-12-04 10:00:00.000 Control 1] Starting control daemon\n[2026-12-04 10:00:00.100 Control 1] Failed to start: the GPU is not in exclusive-process mode\n")
			},
			id: "mps.daemon", sev: Error, want: []string{"MPS daemon is not running", "Failed to start: the GPU is not in exclusive-process mode", "exclusive-process"}},
		{name: "no MPS control program",
			break_: func(f fstest.MapFS, _ *server.Server) { delete(f, "usr/bin/nvidia-cuda-mps-control") },
			id:     "mps.control", sev: Error, want: []string{"nvidia-cuda-mps-control not found"}},
		{name: "pod stuck in ContainerCreating: the device plugin is not registered",
			break_: func(f fstest.MapFS, _ *server.Server) {
				delete(f, "var/lib/kubelet/device-plugins/tessera-1764745123.sock")
			},
			id: "kubelet.registration", sev: Error, want: []string{"has not registered with kubelet", "ContainerCreating", "Got registration request from device plugin"}},
		{name: "CUDA_ERROR_OUT_OF_MEMORY: memory not held on this driver",
			reading: func(i int) *nvmltest.Reading { r := exclusive(i); r.KernelLimits = false; return r },
			id:      "isolation.kernel-memory", sev: Info, want: []string{"held by libtessera", "memory-hard"}},
		{name: "kubelet config: DynamicKubeletConfig gate (the write-up's advice)",
			break_: func(f fstest.MapFS, _ *server.Server) {
				f["var/lib/kubelet/config.yaml"].Data = []byte("kind: KubeletConfiguration\nfeatureGates:\n  DevicePlugins: true\n  DynamicKubeletConfig: true\n")
			},
			id: "kubelet.feature-gate", sev: Error, want: []string{"DynamicKubeletConfig, removed in Kubernetes 1.26", "Remove it from featureGates"}},
		{name: "kubelet flag --container-runtime=remote",
			break_: func(f fstest.MapFS, _ *server.Server) {
				f["proc/1234/cmdline"].Data = []byte("/usr/bin/kubelet\x00--container-runtime=remote\x00")
			},
			id: "kubelet.flag", sev: Error, want: []string{"removed in Kubernetes 1.27", "--container-runtime=remote"}},
		{name: "containerd 1.7 without CDI",
			break_: func(f fstest.MapFS, _ *server.Server) {
				f["etc/containerd/config.toml"].Data = []byte("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"registry.k8s.io/pause:3.9\"\n")
			},
			id: "runtime.cdi", sev: Error, want: []string{"CDI is off", "enable_cdi = true"}},
		{name: "containerd CDI without /var/run/cdi",
			break_: func(f fstest.MapFS, _ *server.Server) {
				f["etc/containerd/config.toml"].Data = []byte("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  enable_cdi = true\n  cdi_spec_dirs = [\"/etc/cdi\"]\n")
			},
			id: "runtime.cdi", sev: Error, want: []string{"does not read /var/run/cdi"}},
		{name: "containerd started with its own config (k3s), CDI off there",
			break_: func(f fstest.MapFS, _ *server.Server) {
				f["proc/77/cmdline"] = &fstest.MapFile{Data: []byte("/usr/local/bin/containerd\x00-c\x00/var/lib/rancher/k3s/agent/etc/containerd/config.toml\x00--state\x00/run/k3s/containerd\x00")}
				f["var/lib/rancher/k3s/agent/etc/containerd/config.toml"] = &fstest.MapFile{Data: []byte("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  enable_cdi = false\n")}
			},
			id: "runtime.cdi", sev: Error, want: []string{"CDI is off", "/var/lib/rancher/k3s/agent/etc/containerd/config.toml: config version 2, enable_cdi false",
				"section of /var/lib/rancher/k3s/agent/etc/containerd/config.toml"}},
		{name: "containerd's drop-in turns CDI off",
			break_: func(f fstest.MapFS, _ *server.Server) {
				f["proc/77/cmdline"] = &fstest.MapFile{Data: []byte("/usr/bin/containerd\x00--config=/etc/containerd/config.toml\x00")}
				f["etc/containerd/config.toml"].Data = []byte("version = 3\nimports = [\"conf.d/*.toml\"]\n")
				f["etc/containerd/conf.d/99-gpu.toml"] = &fstest.MapFile{Data: []byte("version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\n  enable_cdi = false\n")}
			},
			id: "runtime.cdi", sev: Error, want: []string{"CDI is off", "/etc/containerd/config.toml (with /etc/containerd/conf.d/99-gpu.toml)"}},
		{name: "the NVIDIA runtime honours NVIDIA_VISIBLE_DEVICES",
			break_: func(f fstest.MapFS, _ *server.Server) {
				f["etc/nvidia-container-runtime/config.toml"].Data = []byte("[nvidia-container-runtime]\nmode = \"auto\"\n")
			},
			id: "runtime.visible-devices", sev: Warning, want: []string{"rest on a variable", "= false"}},
		{name: "no NVIDIA container toolkit",
			break_: func(f fstest.MapFS, _ *server.Server) {
				delete(f, "usr/bin/nvidia-container-runtime")
				delete(f, "usr/bin/nvidia-cdi-hook")
			},
			id: "runtime.nvidia-toolkit", sev: Error, want: []string{"not installed"}},
		{name: "stale CDI specs with no agent",
			break_: func(f fstest.MapFS, _ *server.Server) {
				delete(f, "var/lib/kubelet/device-plugins/tessera-1764745123.sock")
			},
			id: "leftovers.cdi-specs", sev: Warning, want: []string{"1 Tessera slot spec(s)", "tessera-*.json"}},
		{name: "a CUDA process outside any pod",
			reading: func(i int) *nvmltest.Reading {
				r := exclusive(i)
				if i == 1 {
					r.Procs = []gonvml.ProcessInfo{{Pid: 4242, UsedGpuMemory: 2 << 30}, {Pid: 4343, UsedGpuMemory: 1 << 30}}
				}
				return r
			},
			break_: func(f fstest.MapFS, _ *server.Server) {
				f["proc/4242/comm"] = &fstest.MapFile{Data: []byte("python3\n")}
				f["proc/4242/cgroup"] = &fstest.MapFile{Data: []byte("0::/user.slice/user-1000.slice/session-3.scope\n")}
				f["proc/4343/comm"] = &fstest.MapFile{Data: []byte("python3\n")}
				f["proc/4343/cgroup"] = &fstest.MapFile{Data: []byte("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0c6e1a9a_3a9e_4f0e_9a55_6f7b2f2bb1de.slice/cri-containerd-" + strings.Repeat("ab", 32) + ".scope\n")}
			},
			id: "leftovers.gpu-processes", sev: Warning, want: []string{"pid 4242 (python3)", "outside any pod", "Stop it"}},
		{name: "compute mode left default on an MPS node",
			reading: func(i int) *nvmltest.Reading { r := exclusive(i); r.ComputeMode = gonvml.COMPUTEMODE_DEFAULT; return r },
			id:      "gpu.compute-mode", sev: Warning, want: []string{"compute mode is default on an MPS node"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reading := tt.reading
			if reading == nil {
				reading = exclusive
			}
			srv := gpus(reading)
			fsys := healthyNode()
			mpsDirs(fsys, srv)
			if tt.break_ != nil {
				tt.break_(fsys, srv)
			}
			var lib gonvml.Interface = srv
			if tt.libErr != nil {
				lib = nil
			}
			got := diagnose(t, fsys, lib, tt.libErr, NodeOptions{MPS: true})
			var hit *Finding
			for _, f := range find(got, tt.id) {
				if f.Severity == tt.sev && strings.Contains(f.Summary+"\n"+f.Evidence+"\n"+f.Remedy, tt.want[0]) {
					hit = &f
					break
				}
			}
			if hit == nil {
				t.Fatalf("no %s finding of %s; found %+v", tt.sev, tt.id, find(got, tt.id))
			}
			text := hit.Summary + "\n" + hit.Evidence + "\n" + hit.Remedy
			for _, w := range tt.want {
				if !strings.Contains(text, w) {
					t.Errorf("%s lacks %q:\n%s", tt.id, w, text)
				}
			}
			if ExitCode(got) != map[Severity]int{Error: 2, Warning: 1, Info: 0}[Worst(got)] {
				t.Errorf("exit code %d for worst %s", ExitCode(got), Worst(got))
			}
		})
	}
}

// TestChecksThatCannotRunSaySo: a check that hangs or panics is a warning
// that says it could not run, never a pass; the others still report.
func TestChecksThatCannotRunSaySo(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	got := Run(context.Background(), []Check{
		{ID: "hangs", Run: func(ctx context.Context) []Finding { <-block; return nil }},
		{ID: "panics", Run: func(context.Context) []Finding { panic("nil map") }},
		{ID: "fine", Run: func(context.Context) []Finding { return []Finding{pass("fine", "", "fine", "")} }},
	}, 100*time.Millisecond)
	if len(got) != 3 || got[0].Severity != Warning || got[1].Severity != Warning || got[2].ID != "fine" {
		t.Fatalf("findings %+v", got)
	}
	if !strings.Contains(find(got, "hangs")[0].Summary, "did not finish within 100ms") || !strings.Contains(find(got, "panics")[0].Evidence, "nil map") {
		t.Errorf("findings %+v", got)
	}
	if ExitCode(got) != 1 {
		t.Errorf("exit code %d, want 1", ExitCode(got))
	}
}

func TestOutput(t *testing.T) {
	fs := []Finding{
		{ID: "b", Severity: Warning, Summary: "warned", Evidence: "line one\nline two", Remedy: "do this"},
		{ID: "a", Severity: OK, Summary: "fine"},
		{ID: "c", Severity: Error, Subject: "GPU 0", Summary: "broken"},
	}
	Sort(fs)
	var table bytes.Buffer
	if err := Render(&table, fs, false); err != nil {
		t.Fatal(err)
	}
	text := table.String()
	if i, j := strings.Index(text, "ERROR"), strings.Index(text, "WARNING"); i < 0 || j < i {
		t.Errorf("not worst first:\n%s", text)
	}
	for _, want := range []string{"found: line one | line two", "do: do this", "1 error(s), 1 warning(s), 0 info, 1 ok"} {
		if !strings.Contains(text, want) {
			t.Errorf("table lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "\x1b[") {
		t.Error("colour without a terminal")
	}
	var js bytes.Buffer
	if err := WriteJSON(&js, fs); err != nil {
		t.Fatal(err)
	}
	var back struct {
		Worst    Severity  `json:"worst"`
		Findings []Finding `json:"findings"`
	}
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || back.Worst != Error || len(back.Findings) != 3 || back.Findings[0].Severity != Error {
		t.Fatalf("JSON %s: %+v, %v", js.String(), back, err)
	}
}

// TestPodProcessesAreNotLeftovers: a GPU process in a pod's cgroup is a
// tenant, not a leftover.
func TestPodProcessesAreNotLeftovers(t *testing.T) {
	srv := gpus(func(i int) *nvmltest.Reading {
		r := exclusive(i)
		r.Procs = []gonvml.ProcessInfo{{Pid: 4343, UsedGpuMemory: 1 << 30}}
		return r
	})
	fsys := healthyNode()
	mpsDirs(fsys, srv)
	fsys["proc/4343/comm"] = &fstest.MapFile{Data: []byte("python3\n")}
	fsys["proc/4343/cgroup"] = &fstest.MapFile{Data: []byte("0::/kubepods.slice/kubepods-pod0c6e1a9a_3a9e_4f0e_9a55_6f7b2f2bb1de.slice/cri-containerd-" + strings.Repeat("ab", 32) + ".scope\n")}
	if got := find(diagnose(t, fsys, srv, nil, NodeOptions{MPS: true}), "leftovers.gpu-processes"); len(got) != 0 {
		t.Fatalf("a pod's process reported as a leftover: %+v", got)
	}
}

// TestMPSStandInMadeToFail: the doctor asks a GPU's daemon — the MPS
// stand-in, run by the agent's own MPS manager — for its servers and
// clients; killed, leaving its pipe behind (the write-up's "MPS will not
// start" as it looks afterwards), it is an error with its log.
func TestMPSStandInMadeToFail(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "nvidia-cuda-mps-control")
	if out, err := exec.Command("go", "build", "-o", bin, "../agent/mps/testdata/fakecontrol").CombinedOutput(); err != nil {
		t.Fatalf("building the MPS stand-in: %v\n%s", err, out)
	}
	srv := gpus(exclusive)
	uuid, _ := srv.Devices[0].GetUUID()
	root := t.TempDir()
	m := mps.New(mps.Config{Binary: bin, Root: root, GPUs: []mps.GPU{{UUID: uuid, DefaultThreadPercentage: 100}}})
	ctx := context.Background()
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Stop(ctx) })
	query := func(u, command string) (string, error) { return m.Control(ctx, u, command) }
	fsys := healthyNode()
	mpsDirs(fsys, srv)
	daemon := func() Finding {
		t.Helper()
		for _, f := range find(DiagnoseNode(ctx, fsys, srv, nil, query, NodeOptions{MPS: true}, 10*time.Second), "mps.daemon") {
			if f.Subject == uuid {
				return f
			}
		}
		t.Fatal("no mps.daemon finding for GPU 0")
		return Finding{}
	}
	if f := daemon(); f.Severity != OK || !strings.Contains(f.Evidence, "server ") {
		t.Fatalf("a running daemon: %+v", f)
	}
	b, err := os.ReadFile(filepath.Join(m.PipeDir(uuid), "fake.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return syscall.Kill(pid, 0) != nil, nil
	})
	if f := daemon(); f.Severity != Error || !strings.Contains(f.Summary, "does not answer") || !strings.Contains(f.Evidence, "get_server_list") {
		t.Fatalf("a killed daemon: %+v", f)
	}
}
