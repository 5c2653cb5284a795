package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/deploy/chart"
)

// kubeconfig points at nothing: the cases below stop before any request.
const kubeconfig = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
contexts: [{name: ctx, context: {cluster: c, user: u}}]
current-context: ctx
users: [{name: u, user: {token: t}}]
`

func TestStartupErrors(t *testing.T) {
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: tessera.dev/v1alpha1\nkind: TesseraConfiguration\nhealth:\n  quietPeriod: -5s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	noDriver := func() gonvml.Interface {
		s := dgxh100.New()
		s.InitFunc = func() gonvml.Return { return gonvml.ERROR_LIBRARY_NOT_FOUND }
		return s
	}
	defer func(f func() gonvml.Interface) { newNVML = f }(newNVML)
	newNVML = noDriver
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"bad config names the field", []string{"--node", "n1", "--kubeconfig", kc, "--config", bad}, exitUsage, "health.quietPeriod: invalid value -5s"},
		{"no node", []string{"--kubeconfig", kc}, exitUsage, "--node"},
		{"no scheduler profile", []string{"--node", "n1", "--kubeconfig", kc, "--scheduler-names", " , "}, exitUsage, "--scheduler-names \" , \" names no scheduler profile"},
		{"no driver", []string{"--node", "n1", "--kubeconfig", kc, "--pod-resources-socket", filepath.Join(dir, "pr.sock")}, exitNoDriver, "no NVIDIA driver"},
		{"unknown flag", []string{"--gpus", "8"}, exitUsage, "flag provided but not defined"},
		{"unknown DRA mode", []string{"--node", "n1", "--kubeconfig", kc, "--dra", "yes"}, exitUsage, `--dra "yes": give never, always or node-label`},
		{"refused grace not positive", []string{"--node", "n1", "--kubeconfig", kc, "--refused-grace", "0s"}, exitUsage, "--refused-grace 0s: give a positive duration, such as 5m0s"},
		{"refused grace not a duration", []string{"--node", "n1", "--kubeconfig", kc, "--refused-grace", "soon"}, exitUsage, `invalid value "soon" for flag -refused-grace`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("NODE_NAME", "")
			var errOut bytes.Buffer
			if code := run(context.Background(), tc.args, &errOut); code != tc.code || !strings.Contains(errOut.String(), tc.want) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", code, errOut.String(), tc.code, tc.want)
			}
		})
	}
}

// TestChartArgsAreTheAgents runs the agent with the arguments the chart
// renders for an operator's values — no-GPU mode and an extra flag — as
// its DaemonSet would, on a node without a driver: it does not exit for
// the missing driver (exit 3, crash-looping), it goes on to serve an empty
// node (here it stops at the API server, which this test does not run,
// reading its Node for the chart's --dra=node-label).
func TestChartArgsAreTheAgents(t *testing.T) {
	dir := t.TempDir()
	args := chartAgent(t, `agent: {allowNoGPU: true, extraArgs: ["--scheduler-names=tessera-scheduler,gpu-batch"]}`, dir)
	if !slices.Contains(args, "--allow-no-gpu") || args[len(args)-1] != "--scheduler-names=tessera-scheduler,gpu-batch" {
		t.Fatalf("rendered agent args %q: want --allow-no-gpu and the extra flag last", args)
	}
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	// The library the image would hold, given as an operator would.
	lib := filepath.Join(dir, "libtessera.so")
	if err := os.WriteFile(lib, []byte("library"), 0o755); err != nil {
		t.Fatal(err)
	}
	defer func(f func() gonvml.Interface) { newNVML = f }(newNVML)
	newNVML = func() gonvml.Interface {
		s := dgxh100.New()
		s.InitFunc = func() gonvml.Return { return gonvml.ERROR_LIBRARY_NOT_FOUND }
		return s
	}
	// The node's own paths and port stay the node's: what the test runs
	// points at its scratch directory and the loopback (a later flag wins,
	// as the chart's extraArgs rely on).
	local := []string{"--node", "n1", "--kubeconfig", kc, "--metrics-addr", "127.0.0.1:0", "--cgroup-root=", "--driver-root=",
		"--device-plugin-dir", dir, "--pod-resources-socket", filepath.Join(dir, "pr.sock"), "--cdi-dir", filepath.Join(dir, "cdi"),
		"--mps-root", filepath.Join(dir, "mps"), "--preemption-dir", filepath.Join(dir, "preemption"), "--host-root=",
		"--shim-dir", filepath.Join(dir, "shim"), "--shim-library", lib,
		"--dra-plugin-dir", filepath.Join(dir, "dra"), "--plugin-registry-dir", filepath.Join(dir, "plugins_registry")}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var errOut bytes.Buffer
	code := run(ctx, append(args, local...), &errOut)
	// Past the driver, the agent's first request is the chart's
	// --dra=node-label reading its Node's label (which decides what the
	// first inventory says), here with no API server to answer.
	if code == exitNoDriver || code == exitUsage || !strings.Contains(errOut.String(), "reading node n1's tessera.dev/dra label (--dra=node-label)") {
		t.Fatalf("the agent with the chart's no-GPU mode exited %d: %s; want it past the driver, reading its node's DRA label", code, errOut.String())
	}
	// --shim-library was read and put where --shim-dir says.
	if b, err := os.ReadFile(filepath.Join(dir, "shim", "libtessera.so")); err != nil || string(b) != "library" {
		t.Errorf("libtessera in --shim-dir: %q, %v; want the --shim-library file", b, err)
	}
	t.Logf("exit %d (no API server here): %s", code, strings.TrimSpace(errOut.String()))
}

// chartAgent renders the chart with values (YAML) and returns the agent
// container's arguments as its DaemonSet runs them, with its configuration
// file (ConfigMap tessera-agent-config, which the DaemonSet mounts at the
// path --config names) written to dir and --config pointing there.
func chartAgent(t *testing.T, values, dir string) []string {
	t.Helper()
	var v map[string]any
	if err := yaml.Unmarshal([]byte(values), &v); err != nil {
		t.Fatal(err)
	}
	r, err := chart.Render(v, chart.Options{})
	if err != nil {
		t.Fatal(err)
	}
	objs, err := r.Objects()
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	var config string
	for _, u := range objs {
		switch {
		case u.GetKind() == "DaemonSet" && u.GetName() == "tessera-agent":
			containers, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
			for _, a := range containers[0].(map[string]any)["args"].([]any) {
				args = append(args, a.(string))
			}
		case u.GetKind() == "ConfigMap" && u.GetName() == "tessera-agent-config":
			config, _, _ = unstructured.NestedString(u.Object, "data", "agent-config.yaml")
		}
	}
	i := slices.Index(args, "--config=/etc/tessera/agent-config.yaml")
	if i < 0 || config == "" {
		t.Fatalf("rendered agent args %q, configuration %q: want --config naming the ConfigMap's file", args, config)
	}
	path := filepath.Join(dir, "agent-config.yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	args[i] = "--config=" + path
	return args
}
