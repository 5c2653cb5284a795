package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/validation"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/deploy/chart"
	"github.com/tessera-gpu/tessera/pkg/playground"
)

// TestChartDryRun renders the chart for the default values and the
// variants an operator picks, and server-side applies every object to the
// real API server with dry run: each is defaulted, validated and admitted as
// `helm install` would have it, nothing is stored. The Prometheus Operator's
// CRDs (testdata, copied from the Operator's module) are installed first, so
// its PrometheusRule and ServiceMonitors are checked against the Operator's
// own schemas; one variant renders for a cluster without them. The
// scheduler configuration of each variant is loaded and validated as
// kube-scheduler would.
func TestChartDryRun(t *testing.T) {
	decodeAll := func(t *testing.T, text string) []*unstructured.Unstructured {
		t.Helper()
		objs, err := deploy.Objects(text)
		if err != nil {
			t.Fatal(err)
		}
		return objs
	}
	c := startCluster(t)
	cfg := c.restConfig()
	var crds []*unstructured.Unstructured
	for _, f := range []string{"monitoring.coreos.com_prometheusrules.yaml", "monitoring.coreos.com_servicemonitors.yaml"} {
		b, err := os.ReadFile(filepath.Join("testdata", "prometheus-operator-crd", f))
		if err != nil {
			t.Fatal(err)
		}
		crds = append(crds, decodeAll(t, string(b))...)
	}
	if err := playground.Apply(c.ctx, cfg, crds); err != nil {
		t.Fatal(err)
	}
	// A CRD serves its kind once Established.
	ext := apiextensionsclient.NewForConfigOrDie(cfg)
	for _, crd := range crds {
		err := wait.PollUntilContextTimeout(c.ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			got, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.GetName(), metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			for _, cond := range got.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			t.Fatalf("CRD %s never established: %v", crd.GetName(), err)
		}
	}
	// …and the API server's discovery lists it a moment later.
	err := wait.PollUntilContextTimeout(c.ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := c.client.Discovery().ServerResourcesForGroupVersion("monitoring.coreos.com/v1")
		if err != nil {
			return false, nil
		}
		n := 0
		for _, r := range l.APIResources {
			if r.Name == "prometheusrules" || r.Name == "servicemonitors" {
				n++
			}
		}
		return n == 2, nil
	})
	if err != nil {
		t.Fatalf("the Prometheus Operator's kinds never appeared in discovery: %v", err)
	}
	operator := []string{"monitoring.coreos.com/v1/PrometheusRule", "monitoring.coreos.com/v1/ServiceMonitor"}
	// Objects of a namespace that does not exist fail even a dry run; helm
	// install --create-namespace makes it first.
	if _, err := c.client.CoreV1().Namespaces().Create(c.ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tessera-system"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, values string
		apis         []string
	}{
		{"default", "", operator},
		{"MPS off", "agent: {mps: false}", operator},
		{"no Prometheus Operator", "", nil},
		{"custom image registry", "image: {registry: registry.corp.example:5000/gpu, tag: v9.9.9, pullSecrets: [{name: corp}]}", operator},
		{"the only scheduler", "scheduler: {mode: only, replicas: 1, leaseNamespace: tessera-system}", operator},
		{"plain manifests", "createNamespace: true", nil},
		{"kube-prometheus-stack's selectors and per-component pods", "monitoring: {serviceMonitor: {interval: 1d, labels: {release: kps}}, rules: {labels: {release: kps}, annotations: {team: sre}}}\n" +
			"scheduler: {podAnnotations: {a.example/x: \"1\"}, priorityClassName: \"\"}\nagent: {podAnnotations: {a.example/y: \"2\"}}", operator},
		{"an operator's admission decisions", "admissionPolicies: {allowedHostPaths: [/data/models], binders: [\"system:serviceaccount:kai:kai-scheduler\"], priorityClassNamespaces: {gpu-critical: [prod]}}\nagent: {refusedGrace: 90s}", operator},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var values map[string]any
			if err := yaml.Unmarshal([]byte(tc.values), &values); err != nil {
				t.Fatal(err)
			}
			r, err := chart.Render(values, chart.Options{APIVersions: tc.apis})
			if err != nil {
				t.Fatal(err)
			}
			all, err := r.Join()
			if err != nil {
				t.Fatal(err)
			}
			var objs []*unstructured.Unstructured
			operatorKinds := 0
			for _, u := range decodeAll(t, all) {
				if u.GetKind() == "Namespace" && u.GetName() == "tessera-system" {
					continue // made above, as --create-namespace would
				}
				if u.GroupVersionKind().Group == "monitoring.coreos.com" {
					operatorKinds++
				}
				objs = append(objs, u)
			}
			if (operatorKinds > 0) != (tc.apis != nil) {
				t.Errorf("%d Prometheus Operator objects rendered for APIs %v", operatorKinds, tc.apis)
			}
			if err := playground.DryRunApply(c.ctx, cfg, objs); err != nil {
				t.Fatalf("dry-run apply: %v", err)
			}
			t.Logf("%d objects admitted (%d of the Prometheus Operator)", len(objs), operatorKinds)
			// The Operator's schema does hold: a mistyped field is refused.
			for _, u := range objs {
				if u.GetKind() != "ServiceMonitor" {
					continue
				}
				bad := u.DeepCopy()
				eps, _, _ := unstructured.NestedSlice(bad.Object, "spec", "endpoints")
				eps[0].(map[string]any)["honorLabels"] = "yes"
				_ = unstructured.SetNestedSlice(bad.Object, eps, "spec", "endpoints")
				if err := playground.DryRunApply(c.ctx, cfg, []*unstructured.Unstructured{bad}); err == nil || !strings.Contains(err.Error(), "honorLabels") {
					t.Errorf("a ServiceMonitor with honorLabels: \"yes\" was not refused by its CRD's schema: %v", err)
				}
				break
			}

			// The scheduler configuration, as kube-scheduler loads it.
			for _, u := range objs {
				if u.GetKind() != "ConfigMap" || u.GetName() != "tessera-scheduler-config" {
					continue
				}
				text, _, _ := unstructured.NestedString(u.Object, "data", "scheduler-config.yaml")
				path := filepath.Join(t.TempDir(), "scheduler-config.yaml")
				if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
					t.Fatal(err)
				}
				sc, err := options.LoadConfigFromFile(klog.Background(), path)
				if err != nil {
					t.Fatalf("kube-scheduler cannot load the chart's configuration: %v", err)
				}
				if err := validation.ValidateKubeSchedulerConfiguration(sc); err != nil {
					t.Fatalf("kube-scheduler refuses the chart's configuration: %v", err)
				}
			}
		})
	}
}
