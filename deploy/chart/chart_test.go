package chart

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/strvals"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/deploy"
)

// Operator is what a cluster with the Prometheus Operator serves.
var Operator = []string{"monitoring.coreos.com/v1/PrometheusRule", "monitoring.coreos.com/v1/ServiceMonitor"}

// objects decodes every rendered document.
func objects(t *testing.T, r Rendered) []*unstructured.Unstructured {
	t.Helper()
	objs, err := r.Objects()
	if err != nil {
		t.Fatalf("rendered YAML: %v", err)
	}
	return objs
}

func names(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetKind()+"/"+o.GetName())
	}
	return out
}

func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s/%s among %v", kind, name, names(objs))
	return nil
}

func container(t *testing.T, o *unstructured.Unstructured) map[string]any {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	if len(cs) != 1 {
		t.Fatalf("%s/%s has %d containers", o.GetKind(), o.GetName(), len(cs))
	}
	return cs[0].(map[string]any)
}

func schedulerConfig(t *testing.T, objs []*unstructured.Unstructured) map[string]any {
	t.Helper()
	cm := find(t, objs, "ConfigMap", "tessera-scheduler-config")
	text, _, _ := unstructured.NestedString(cm.Object, "data", "scheduler-config.yaml")
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(text), &cfg); err != nil {
		t.Fatalf("scheduler-config.yaml: %v", err)
	}
	return cfg
}

func profileNames(cfg map[string]any) []string {
	var out []string
	for _, p := range cfg["profiles"].([]any) {
		out = append(out, p.(map[string]any)["schedulerName"].(string))
	}
	return out
}

// TestRenderDefault renders the defaults for a cluster with the Prometheus
// Operator and checks what the chart promises: both components, the
// scheduler's two replicas with leader election, non-root, read-only root,
// probes and a disruption budget, the policies and PriorityClasses, and the
// Operator's kinds.
func TestRenderDefault(t *testing.T) {
	r, err := Render(nil, Options{APIVersions: Operator})
	if err != nil {
		t.Fatal(err)
	}
	objs := objects(t, r)
	t.Logf("the chart renders by default (with the Prometheus Operator): %s", strings.Join(names(objs), " "))
	for _, want := range []string{
		"Deployment/tessera-scheduler", "ServiceAccount/tessera-scheduler", "ConfigMap/tessera-scheduler-config",
		"Service/tessera-scheduler-metrics", "PodDisruptionBudget/tessera-scheduler",
		"ClusterRoleBinding/tessera-scheduler-as-kube-scheduler", "ClusterRoleBinding/tessera-scheduler-as-volume-scheduler",
		"DaemonSet/tessera-agent", "ServiceAccount/tessera-agent", "Service/tessera-agent-metrics",
		"DeviceClass/gpu.tessera.dev", "DeviceClass/whole.gpu.tessera.dev", "DeviceClass/mps.gpu.tessera.dev", "DeviceClass/time-sliced.gpu.tessera.dev",
		"PriorityClass/gpu-critical", "PriorityClass/gpu-standard", "PriorityClass/gpu-batch",
		"ValidatingAdmissionPolicy/tessera-scheduler-annotations", "ValidatingAdmissionPolicyBinding/tessera-gpu-pod-limits",
		"PrometheusRule/tessera", "ServiceMonitor/tessera-agent", "ServiceMonitor/tessera-scheduler",
	} {
		if !slices.Contains(names(objs), want) {
			t.Errorf("no %s", want)
		}
	}
	if slices.Contains(names(objs), "Namespace/tessera-system") {
		t.Error("a Namespace by default: helm install --create-namespace would conflict with it")
	}
	dep := find(t, objs, "Deployment", "tessera-scheduler")
	if n, _, _ := unstructured.NestedFieldNoCopy(dep.Object, "spec", "replicas"); n != float64(2) {
		t.Errorf("replicas %v, want 2", n)
	}
	if nonRoot, _, _ := unstructured.NestedBool(dep.Object, "spec", "template", "spec", "securityContext", "runAsNonRoot"); !nonRoot {
		t.Error("the scheduler may run as root")
	}
	c := container(t, dep)
	if ro, _, _ := unstructured.NestedBool(c, "securityContext", "readOnlyRootFilesystem"); !ro {
		t.Error("the scheduler's root file system is writable")
	}
	for _, probe := range []string{"livenessProbe", "readinessProbe"} {
		if path, _, _ := unstructured.NestedString(c, probe, "httpGet", "path"); path == "" {
			t.Errorf("no %s on the scheduler", probe)
		}
	}
	if _, ok := c["resources"].(map[string]any)["requests"]; !ok {
		t.Error("no resource requests on the scheduler")
	}
	if img := c["image"]; img != "ghcr.io/tessera-gpu/tessera-scheduler:v0.1.0" {
		t.Errorf("scheduler image %v", img)
	}
	cfg := schedulerConfig(t, objs)
	if le := cfg["leaderElection"].(map[string]any); le["leaderElect"] != true || le["resourceName"] != "tessera-scheduler" {
		t.Errorf("leader election %v", le)
	}
	if got := profileNames(cfg); !slices.Equal(got, []string{"tessera-scheduler"}) {
		t.Errorf("profiles %v beside kube-scheduler, want only tessera-scheduler", got)
	}
	if args := container(t, find(t, objs, "DaemonSet", "tessera-agent"))["args"].([]any); !slices.Contains(args, any("--mps")) {
		t.Errorf("agent args %v: MPS is on by default", args)
	}
	checkOperatorKinds(t, objs)
}

// checkOperatorKinds holds the Prometheus Operator's objects to the
// Operator's own Go types, refusing any field they do not have, without an
// API server; test/integration's TestChartDryRun also dry-runs them against
// the Operator's CRDs.
func checkOperatorKinds(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		var into any
		switch o.GetKind() {
		case "PrometheusRule":
			into = &monitoringv1.PrometheusRule{}
		case "ServiceMonitor":
			into = &monitoringv1.ServiceMonitor{}
		default:
			continue
		}
		b, err := json.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(into); err != nil {
			t.Errorf("%s/%s does not fit monitoring.coreos.com/v1: %v", o.GetKind(), o.GetName(), err)
		}
		if pr, ok := into.(*monitoringv1.PrometheusRule); ok {
			if len(pr.Spec.Groups) == 0 {
				t.Error("the PrometheusRule has no rule groups")
			}
			for _, g := range pr.Spec.Groups {
				for _, rule := range g.Rules {
					if rule.Expr.String() == "" || (rule.Alert == "" && rule.Record == "") {
						t.Errorf("group %s: a rule without expr or name: %+v", g.Name, rule)
					}
				}
			}
		}
	}
}

// TestRenderVariants renders the values an operator changes most and checks
// each takes effect.
func TestRenderVariants(t *testing.T) {
	tests := []struct {
		name   string
		values string
		apis   []string
		check  func(t *testing.T, objs []*unstructured.Unstructured)
	}{
		{"MPS off", "agent: {mps: false}", Operator, func(t *testing.T, objs []*unstructured.Unstructured) {
			args := container(t, find(t, objs, "DaemonSet", "tessera-agent"))["args"].([]any)
			if slices.Contains(args, any("--mps")) {
				t.Errorf("agent args %v with MPS off", args)
			}
		}},
		{"no Prometheus Operator", "", nil, func(t *testing.T, objs []*unstructured.Unstructured) {
			for _, n := range names(objs) {
				if strings.HasPrefix(n, "PrometheusRule/") || strings.HasPrefix(n, "ServiceMonitor/") {
					t.Errorf("%s rendered for a cluster without the Operator's CRDs", n)
				}
			}
			cm := find(t, objs, "ConfigMap", "tessera-prometheus-rules")
			rules, _, _ := unstructured.NestedString(cm.Object, "data", "tessera-rules.yaml")
			if !strings.Contains(rules, "alert: TesseraGPUStalled") {
				t.Errorf("the rules ConfigMap holds %.80q…", rules)
			}
		}},
		{"custom image registry", "image: {registry: registry.corp.example:5000/gpu/, tag: v9.9.9, pullSecrets: [{name: corp}]}", Operator, func(t *testing.T, objs []*unstructured.Unstructured) {
			for kind, name := range map[string]string{"Deployment": "tessera-scheduler", "DaemonSet": "tessera-agent"} {
				o := find(t, objs, kind, name)
				if img := container(t, o)["image"]; img != "registry.corp.example:5000/gpu/"+name+":v9.9.9" {
					t.Errorf("%s image %v", name, img)
				}
				secrets, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "imagePullSecrets")
				if len(secrets) != 1 {
					t.Errorf("%s pull secrets %v", name, secrets)
				}
			}
		}},
		{"the only scheduler", "scheduler: {mode: only, replicas: 1}", Operator, func(t *testing.T, objs []*unstructured.Unstructured) {
			if got := profileNames(schedulerConfig(t, objs)); !slices.Equal(got, []string{"default-scheduler", "tessera-scheduler"}) {
				t.Errorf("profiles %v as the only scheduler", got)
			}
			if slices.Contains(names(objs), "PodDisruptionBudget/tessera-scheduler") {
				t.Error("a disruption budget of one replica would block every drain")
			}
		}},
		{"an operator's admission decisions", `admissionPolicies: {allowedHostPaths: [/data/models, /scratch], binders: ["system:serviceaccount:kai:kai-scheduler"],
  podStatusWriters: [], priorityClassNamespaces: {gpu-critical: [prod], gpu-standard: [prod, research]}}
agent: {refusedGrace: 90s}`, Operator, func(t *testing.T, objs []*unstructured.Unstructured) {
			data, _, _ := unstructured.NestedStringMap(find(t, objs, "ConfigMap", "tessera-admission").Object, "data")
			want := map[string]string{"allowedHostPaths": "/data/models,/scratch", "binders": "system:serviceaccount:kai:kai-scheduler",
				"podStatusWriters": "", "gpu-critical": "prod", "gpu-standard": "prod,research"}
			if d := cmp.Diff(want, data); d != "" {
				t.Errorf("tessera-admission (-want +got):\n%s", d)
			}
			args := container(t, find(t, objs, "DaemonSet", "tessera-agent"))["args"].([]any)
			if !slices.Contains(args, any("--refused-grace=90s")) {
				t.Errorf("agent args %v lack --refused-grace=90s", args)
			}
		}},
		{"extra scheduler flags, last", `scheduler: {extraArgs: ["--claim-admission-schedulers=tessera-scheduler,gpu-batch", "--v=4"]}`, Operator, func(t *testing.T, objs []*unstructured.Unstructured) {
			args := container(t, find(t, objs, "Deployment", "tessera-scheduler"))["args"].([]any)
			if n := len(args); n < 3 || args[n-2] != "--claim-admission-schedulers=tessera-scheduler,gpu-batch" || args[n-1] != "--v=4" {
				t.Errorf("scheduler args %v: want the extra flags last, in order", args)
			}
		}},
		{"claim admission off", "scheduler: {claimAdmission: {enabled: false}}", Operator, func(t *testing.T, objs []*unstructured.Unstructured) {
			args := container(t, find(t, objs, "Deployment", "tessera-scheduler"))["args"].([]any)
			if slices.ContainsFunc(args, func(a any) bool { return strings.HasPrefix(a.(string), "--claim-admission") }) {
				t.Errorf("scheduler args %v with the webhook off", args)
			}
			for _, n := range names(objs) {
				if strings.HasSuffix(n, "/tessera-claim-admission") {
					t.Errorf("%s rendered with the webhook off", n)
				}
			}
		}},
		{"claim admission on another port", "scheduler: {claimAdmission: {port: 10443}}", Operator, func(t *testing.T, objs []*unstructured.Unstructured) {
			ctr := container(t, find(t, objs, "Deployment", "tessera-scheduler"))
			args := ctr["args"].([]any)
			for _, want := range []string{"--claim-admission-port=10443", "--claim-admission-namespace=tessera-system"} {
				if !slices.Contains(args, any(want)) {
					t.Errorf("scheduler args %v lack %s", args, want)
				}
			}
			ports := ctr["ports"].([]any)
			if !slices.ContainsFunc(ports, func(p any) bool {
				m := p.(map[string]any)
				return m["name"] == "claim-admission" && fmt.Sprint(m["containerPort"]) == "10443"
			}) {
				t.Errorf("scheduler ports %v lack claim-admission 10443", ports)
			}
			svc := find(t, objs, "Service", "tessera-claim-admission")
			sp, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
			if len(sp) != 1 || sp[0].(map[string]any)["targetPort"] != "claim-admission" {
				t.Errorf("the webhook's Service ports %v", sp)
			}
			cfg := find(t, objs, "ValidatingWebhookConfiguration", "tessera-claim-admission")
			hooks, _, _ := unstructured.NestedSlice(cfg.Object, "webhooks")
			if len(hooks) != 1 {
				t.Fatalf("webhooks %v", hooks)
			}
			ref, _, _ := unstructured.NestedMap(hooks[0].(map[string]any), "clientConfig", "service")
			if ref["name"] != "tessera-claim-admission" || ref["namespace"] != "tessera-system" || ref["path"] != "/validate-pod-claims" {
				t.Errorf("the webhook calls %v", ref)
			}
		}},
		{"DRA never", "agent: {dra: never}", Operator, func(t *testing.T, objs []*unstructured.Unstructured) {
			ds := find(t, objs, "DaemonSet", "tessera-agent")
			if args := container(t, ds)["args"].([]any); !slices.Contains(args, any("--dra=never")) {
				t.Errorf("agent args %v lack --dra=never", args)
			}
			if vols, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "volumes"); slices.ContainsFunc(vols, func(v any) bool {
				return v.(map[string]any)["name"] == "dra-plugin"
			}) {
				t.Error("kubelet's plugin directory mounted with DRA off")
			}
			rules, _, _ := unstructured.NestedSlice(find(t, objs, "ClusterRole", "tessera-agent").Object, "rules")
			if strings.Contains(fmt.Sprint(rules), "resourceslices") {
				t.Errorf("the agent may write ResourceSlices with DRA off: %v", rules)
			}
		}},
		{"DRA by node label (the default)", "", Operator, func(t *testing.T, objs []*unstructured.Unstructured) {
			ds := find(t, objs, "DaemonSet", "tessera-agent")
			if args := container(t, ds)["args"].([]any); !slices.Contains(args, any("--dra=node-label")) {
				t.Errorf("agent args %v lack --dra=node-label", args)
			}
			mounts := fmt.Sprint(container(t, ds)["volumeMounts"])
			for _, path := range []string{"/var/lib/kubelet/plugins/gpu.tessera.dev", "/var/lib/kubelet/plugins_registry"} {
				if !strings.Contains(mounts, "mountPath:"+path+" ") {
					t.Errorf("the agent does not mount %s: %s", path, mounts)
				}
			}
			rules, _, _ := unstructured.NestedSlice(find(t, objs, "ClusterRole", "tessera-agent").Object, "rules")
			if !strings.Contains(fmt.Sprint(rules), "resourceslices") || !strings.Contains(fmt.Sprint(rules), "resourceclaims") {
				t.Errorf("the agent may not publish ResourceSlices or read claims: %v", rules)
			}
		}},
		{"no libtessera", "agent: {shim: false}", Operator, func(t *testing.T, objs []*unstructured.Unstructured) {
			ds := find(t, objs, "DaemonSet", "tessera-agent")
			args := container(t, ds)["args"].([]any)
			if !slices.Contains(args, any("--shim-dir=")) {
				t.Errorf("agent args %v lack an empty --shim-dir=", args)
			}
			vols, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "volumes")
			for _, v := range vols {
				if v.(map[string]any)["name"] == "shim" {
					t.Errorf("the agent still mounts the shim directory: %v", v)
				}
			}
		}},
		{"kube-prometheus-stack's selectors", `monitoring:
  serviceMonitor: {interval: 1d, labels: {release: kps}, annotations: {team: sre}}
  rules: {labels: {release: kps}, annotations: {team: sre}}`, Operator, func(t *testing.T, objs []*unstructured.Unstructured) {
			// kube-prometheus-stack's Prometheus selects ServiceMonitors and
			// PrometheusRules by {release: <its release>} by default
			// (serviceMonitorSelectorNilUsesHelmValues, ruleSelectorNilUsesHelmValues).
			selected := selectedBy(objs, labels.SelectorFromSet(labels.Set{"release": "kps"}))
			if want := []string{"PrometheusRule/tessera", "ServiceMonitor/tessera-agent", "ServiceMonitor/tessera-scheduler"}; !slices.Equal(selected, want) {
				t.Errorf("kube-prometheus-stack's selector picks %v, want %v", selected, want)
			}
			for _, n := range []string{"tessera-agent", "tessera-scheduler"} {
				sm := find(t, objs, "ServiceMonitor", n)
				if sm.GetAnnotations()["team"] != "sre" {
					t.Errorf("ServiceMonitor %s annotations %v", n, sm.GetAnnotations())
				}
				eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
				if iv := eps[0].(map[string]any)["interval"]; iv != "1d" {
					t.Errorf("ServiceMonitor %s interval %v", n, iv)
				}
			}
		}},
		{"no monitoring labels", "", Operator, func(t *testing.T, objs []*unstructured.Unstructured) {
			// What the issue found: without labels kube-prometheus-stack's
			// default selector picks none of Tessera's objects.
			if selected := selectedBy(objs, labels.SelectorFromSet(labels.Set{"release": "kps"})); len(selected) != 0 {
				t.Errorf("selected without labels: %v", selected)
			}
		}},
		{"pods placed per component", `scheduler: {podAnnotations: {a.example/x: "1"}, priorityClassName: "", nodeSelector: {role: control}, tolerations: [{key: control, operator: Exists}], resources: {requests: {cpu: 200m}}}
agent: {podAnnotations: {a.example/y: "2"}, priorityClassName: gpu-infra, nodeSelector: {gpu: "yes"}, tolerations: [], resources: {limits: {memory: 1Gi}}}`, Operator, func(t *testing.T, objs []*unstructured.Unstructured) {
			for _, tc := range []struct {
				kind, name, annotation, value, priority, selector string
			}{
				{"Deployment", "tessera-scheduler", "a.example/x", "1", "", "control"},
				{"DaemonSet", "tessera-agent", "a.example/y", "2", "gpu-infra", "yes"},
			} {
				o := find(t, objs, tc.kind, tc.name)
				ann, _, _ := unstructured.NestedStringMap(o.Object, "spec", "template", "metadata", "annotations")
				if ann[tc.annotation] != tc.value {
					t.Errorf("%s pod annotations %v", tc.name, ann)
				}
				if pc, _, _ := unstructured.NestedString(o.Object, "spec", "template", "spec", "priorityClassName"); pc != tc.priority {
					t.Errorf("%s priorityClassName %q, want %q", tc.name, pc, tc.priority)
				}
				sel, _, _ := unstructured.NestedStringMap(o.Object, "spec", "template", "spec", "nodeSelector")
				if sel["role"] != tc.selector && sel["gpu"] != tc.selector {
					t.Errorf("%s nodeSelector %v", tc.name, sel)
				}
			}
			if _, ok, _ := unstructured.NestedSlice(find(t, objs, "DaemonSet", "tessera-agent").Object, "spec", "template", "spec", "tolerations"); ok {
				t.Error("agent tolerations rendered though none were given")
			}
			// Helm merges a given map into the default: cpu 200m beside the
			// default memory request.
			if res := container(t, find(t, objs, "Deployment", "tessera-scheduler"))["resources"]; fmt.Sprint(res) != "map[limits:map[memory:1Gi] requests:map[cpu:200m memory:256Mi]]" {
				t.Errorf("scheduler resources %v", res)
			}
		}},
		{"guards and classes off", "admissionPolicies: {enabled: false}\npriorityClasses: {enabled: false}", Operator, func(t *testing.T, objs []*unstructured.Unstructured) {
			for _, n := range names(objs) {
				if strings.HasPrefix(n, "ValidatingAdmissionPolicy") || strings.HasPrefix(n, "PriorityClass/") {
					t.Errorf("%s rendered while disabled", n)
				}
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var values map[string]any
			if err := yaml.Unmarshal([]byte(tt.values), &values); err != nil {
				t.Fatal(err)
			}
			r, err := Render(values, Options{APIVersions: tt.apis})
			if err != nil {
				t.Fatal(err)
			}
			objs := objects(t, r)
			tt.check(t, objs)
			checkOperatorKinds(t, objs)
		})
	}
}

// TestValuesSchema: a wrong type or an unknown key fails rendering, and the
// message names the path.
func TestValuesSchema(t *testing.T) {
	tests := []struct {
		values, want string
	}{
		{"scheduler: {replicas: two}", "/scheduler/replicas"},
		{"scheduler: {replica: 2}", "replica"},
		{"agent: {mps: yes please}", "/agent/mps"},
		{`agent: {extraArgs: ["allow-no-gpu"]}`, "/agent/extraArgs/0"},
		{`scheduler: {extraArgs: ["v=4"]}`, "/scheduler/extraArgs/0"},
		{"scheduler: {mode: alone}", "/scheduler/mode"},
		{"scheduler: {preemption: {gracePeriod: soon}}", "/scheduler/preemption/gracePeriod"},
		{"monitoring: {grafana: true}", "grafana"},
		{"image: {registry: \"\"}", "/image/registry"},
		{"admissionPolicies: {allowedHostPaths: [/data/../run/tessera]}", "/admissionPolicies/allowedHostPaths/0"},
		{"admissionPolicies: {allowedHostPaths: [data]}", "/admissionPolicies/allowedHostPaths/0"},
		{"admissionPolicies: {allowedHostPaths: [/data/]}", "/admissionPolicies/allowedHostPaths/0"},
		{"admissionPolicies: {binders: [\"a,b\"]}", "/admissionPolicies/binders/0"},
		{"admissionPolicies: {priorityClassNamespaces: {gpu-critical: [Team_A]}}", "/admissionPolicies/priorityClassNamespaces/gpu-critical/0"},
		{"admissionPolicies: {priorityClassNamespaces: {gpu-batch: [x]}}", "gpu-batch"},
		{"agent: {refusedGrace: 5 minutes}", "/agent/refusedGrace"},
		// The ServiceMonitor CRD's duration: no fractions, no µs, days allowed.
		{"monitoring: {serviceMonitor: {interval: 1.5m}}", "/monitoring/serviceMonitor/interval"},
		{"monitoring: {serviceMonitor: {interval: 500us}}", "/monitoring/serviceMonitor/interval"},
		{"monitoring: {serviceMonitor: {labels: {release: 7}}}", "/monitoring/serviceMonitor/labels/release"},
		{"agent: {priorityClassName: Node_Critical}", "/agent/priorityClassName"},
		{"scheduler: {claimAdmission: {port: 443}}", "/scheduler/claimAdmission/port"},
	}
	for _, tt := range tests {
		t.Run(tt.values, func(t *testing.T) {
			var values map[string]any
			if err := yaml.Unmarshal([]byte(tt.values), &values); err != nil {
				t.Fatal(err)
			}
			_, err := Render(values, Options{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Render(%s) = %v, want an error naming %q", tt.values, err, tt.want)
			}
		})
	}
}

// selectedBy lists the objects sel selects by their labels, as Kind/name.
func selectedBy(objs []*unstructured.Unstructured, sel labels.Selector) []string {
	var out []string
	for _, o := range objs {
		if sel.Matches(labels.Set(o.GetLabels())) {
			out = append(out, o.GetKind()+"/"+o.GetName())
		}
	}
	slices.Sort(out)
	return out
}

// TestLint runs Helm's linter over the chart, with the default values and
// with the variants, and wants no error and no warning.
func TestLint(t *testing.T) {
	for _, values := range []map[string]any{nil, {"agent": map[string]any{"mps": false}}, {"scheduler": map[string]any{"mode": "only"}}} {
		l := lint.RunAll("tessera", values, "tessera-system")
		for _, m := range l.Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("helm lint (values %v): %s", values, m)
			}
		}
	}
}

// TestManifestsUpToDate: the plain manifests under deploy/ are what the
// chart renders; a change to one without the other fails here.
func TestManifestsUpToDate(t *testing.T) {
	files, err := Manifests()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join("..", name))
		if err != nil {
			t.Errorf("%v (run `make manifests`)", err)
			continue
		}
		if string(got) != want {
			t.Errorf("deploy/%s differs from the chart's rendering: run `make manifests` (or edit the chart, not the file)", name)
		}
	}
}

// TestREADMEInstallRenders follows the README's install step literally:
// its helm command is the one `make images` prints (deploy.InstallCommand),
// and with the printed tag in place of TAG — a tag of digits, as a short
// commit hash can be, included — its --set flags, parsed as Helm parses
// them, render images tagged so (issue 39: an all-digit tag failed the
// schema through --set, and make images printed no tag at all).
func TestREADMEInstallRenders(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var command []string
	for _, line := range strings.Split(string(readme), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "helm install tessera") || len(command) > 0 {
			command = append(command, strings.TrimSuffix(strings.TrimSpace(line), "\\"))
			if !strings.HasSuffix(line, "\\") {
				break
			}
		}
	}
	if len(command) == 0 {
		t.Fatal("README.md has no helm install command")
	}
	readmeCmd := strings.Fields(strings.Join(command, " "))
	const registry = "registry.example.com/tessera"
	printed := strings.Fields(strings.ReplaceAll(deploy.InstallCommand(registry, "TAG"), "\\\n", " "))
	if !slices.Equal(readmeCmd, printed) {
		t.Fatalf("README's install command\n  %v\nis not what make images prints\n  %v", readmeCmd, printed)
	}
	for _, tag := range []string{"1234567", "v0.4.0", "a343419-dirty"} {
		values := map[string]any{}
		args := strings.Fields(strings.ReplaceAll(strings.Join(readmeCmd, " "), "TAG", tag))
		for i, a := range args {
			switch a {
			case "--set":
				err = strvals.ParseInto(args[i+1], values)
			case "--set-string":
				err = strvals.ParseIntoString(args[i+1], values)
			}
			if err != nil {
				t.Fatalf("%s %s: %v", a, args[i+1], err)
			}
		}
		r, err := Render(values, Options{})
		if err != nil {
			t.Fatalf("tag %s: the README's flags do not render: %v", tag, err)
		}
		objs := objects(t, r)
		for kind, name := range map[string]string{"Deployment": "tessera-scheduler", "DaemonSet": "tessera-agent"} {
			if img := container(t, find(t, objs, kind, name))["image"]; img != registry+"/"+name+":"+tag {
				t.Errorf("tag %s: %s image %v", tag, name, img)
			}
		}
	}
	// Why --set-string: through --set, digits become a number.
	values := map[string]any{}
	if err := strvals.ParseInto("image.tag=1234567", values); err != nil {
		t.Fatal(err)
	}
	if _, err := Render(values, Options{}); err == nil || !strings.Contains(err.Error(), "/image/tag") {
		t.Errorf("--set image.tag=1234567 rendered (%v); the README's --set-string is then not needed", err)
	}
}
