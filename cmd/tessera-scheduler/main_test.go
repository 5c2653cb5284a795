package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"

	preemptioncontroller "github.com/tessera-gpu/tessera/pkg/preemption/controller"
	"github.com/tessera-gpu/tessera/pkg/scheduler"
)

// kubeconfig points at a server nobody listens on: Setup builds the scheduler
// without contacting it.
const kubeconfig = `apiVersion: v1
kind: Config
clusters:
- cluster: {server: "https://127.0.0.1:1"}
  name: c
contexts:
- context: {cluster: c, user: u}
  name: ctx
current-context: ctx
users:
- name: u
  user: {token: t}
`

// setup runs the binary's flag parsing and app.Setup on a config file, as
// main does, and returns the plugin names each profile runs per extension
// point.
func setup(t *testing.T, schedulerConfig string) (map[string]*config.Plugins, error) {
	t.Helper()
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	cf := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(kc, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cf, []byte(strings.ReplaceAll(schedulerConfig, "KUBECONFIG", kc)), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := options.NewOptions()
	fs := pflag.NewFlagSet("tessera-scheduler", pflag.ContinueOnError)
	for _, f := range opts.Flags.FlagSets {
		fs.AddFlagSet(f)
	}
	if err := fs.Parse([]string{"--config", cf, "--secure-port", "0"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	_, sched, err := app.Setup(ctx, opts, scheduler.RegisterWith(preemptioncontroller.Start))
	if err != nil {
		return nil, err
	}
	got := map[string]*config.Plugins{}
	for name, p := range sched.Profiles {
		got[name] = p.ListPlugins()
	}
	return got, nil
}

func names(set config.PluginSet) []string {
	var out []string
	for _, p := range set.Enabled {
		out = append(out, p.Name)
	}
	return out
}

// TestShippedConfig checks deploy/scheduler-config.yaml: the tessera profile
// runs TesseraGPU at every extension point it implements, without the
// spreading scorers, and it serves no other profile.
func TestShippedConfig(t *testing.T) {
	b, err := os.ReadFile("../../deploy/scheduler-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// The shipped file runs in-cluster with leader election; point it at a
	// kubeconfig and run alone instead.
	cfg := string(b) + "clientConnection: {kubeconfig: \"KUBECONFIG\"}\n"
	cfg = strings.Replace(cfg, "leaderElect: true", "leaderElect: false", 1)
	got, err := setup(t, cfg)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	tp, ok := got["tessera-scheduler"]
	if !ok {
		t.Fatalf("profiles %v: no tessera-scheduler", keys(got))
	}
	for point, set := range map[string]config.PluginSet{
		"PreFilter": tp.PreFilter, "Filter": tp.Filter, "PreScore": tp.PreScore, "Score": tp.Score,
		"Reserve": tp.Reserve, "Bind": tp.Bind,
	} {
		if !slices.Contains(names(set), scheduler.Name) {
			t.Errorf("tessera-scheduler %s = %v, want %s in it", point, names(set), scheduler.Name)
		}
	}
	for _, off := range []string{"NodeResourcesBalancedAllocation", "NodeResourcesFit", "PodTopologySpread", "ImageLocality"} {
		if slices.Contains(names(tp.Score), off) {
			t.Errorf("tessera-scheduler scores with %s; it should be off so the GPU policy decides", off)
		}
	}
	// DefaultBinder would bind GPU pods without their assignment: TesseraGPU
	// must come first and leave only the other pods to it.
	if b := names(tp.Bind); len(b) == 0 || b[0] != scheduler.Name {
		t.Errorf("tessera-scheduler Bind = %v, want %s first", b, scheduler.Name)
	}
	if !slices.Contains(names(tp.Filter), scheduler.ResourcesFitName) || slices.Contains(names(tp.Filter), "NodeResourcesFit") {
		t.Errorf("tessera-scheduler Filter %v: want %s in place of NodeResourcesFit, or CPU and memory would go unchecked", names(tp.Filter), scheduler.ResourcesFitName)
	}
	// The cluster's kube-scheduler keeps default-scheduler: serving it too
	// would have two schedulers racing for every other pod.
	if len(got) != 1 {
		t.Errorf("profiles %v, want tessera-scheduler alone", keys(got))
	}
}

// TestBadArgsNameTheField: a wrong plugin argument stops the scheduler at
// start with the field's path in the error.
func TestBadArgsNameTheField(t *testing.T) {
	for _, tc := range []struct{ args, want string }{
		{"{policy: firstfit}", "pluginConfig[TesseraGPU].args.policy"},
		{"{memoryOversubscription: 2}", "pluginConfig[TesseraGPU].args.memoryOversubscription"},
		{"{computeOversubscription: 1.2}", "pluginConfig[TesseraGPU].args.computeOversubscription"},
		{"{minSliceMiB: {training: 0, inference: -1}}", "pluginConfig[TesseraGPU].args.minSliceMiB.inference"},
		{"{polcy: binpack}", `unknown field "polcy"`},
	} {
		t.Run(tc.args, func(t *testing.T) {
			cfg := `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {kubeconfig: "KUBECONFIG"}
leaderElection: {leaderElect: false}
profiles:
- schedulerName: tessera-scheduler
  plugins:
    multiPoint:
      enabled: [{name: TesseraGPU}]
  pluginConfig:
  - name: TesseraGPU
    args: ` + tc.args + "\n"
			_, err := setup(t, cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("setup error = %v, want it to name %q", err, tc.want)
			}
		})
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestClaimAdmissionFlags: the binary's webhook flags, as an operator
// gives them: listed in --help, and a port without the namespace of its
// Secret stops the scheduler at start with the flag's name. (One run that
// reaches kube-scheduler's start per process: it applies its logging
// configuration once.)
func TestClaimAdmissionFlags(t *testing.T) {
	var help strings.Builder
	cmd := newCommand()
	cmd.SetOut(&help)
	cmd.SetArgs([]string{"--help"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"--claim-admission-port", "--claim-admission-namespace", "--claim-admission-address", "--claim-admission-schedulers"} {
		if !strings.Contains(help.String(), f) {
			t.Errorf("--help lacks %s", f)
		}
	}
	dir := t.TempDir()
	kc, cf := filepath.Join(dir, "kubeconfig"), filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(kc, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("../../deploy/scheduler-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.Replace(string(b), "leaderElect: true", "leaderElect: false", 1) + "clientConnection: {kubeconfig: \"" + kc + "\"}\n"
	if err := os.WriteFile(cf, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd = newCommand()
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	cmd.SetArgs([]string{"--config", cf, "--secure-port", "0", "--claim-admission-port=9443"})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "--claim-admission-namespace is required with --claim-admission-port") {
		t.Errorf("a port without its namespace: %v, want the scheduler stopped naming --claim-admission-namespace", err)
	}
}
