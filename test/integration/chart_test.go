package integration

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/validation"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/deploy/chart"
	"github.com/tessera-gpu/tessera/pkg/playground"
)

// TestChartDryRun renders the chart for the default values and the
// variants an operator picks, and server-side applies every object to the
// real API server with dry run: each is defaulted, validated and admitted as
// `helm install` would have it, nothing is stored. The Prometheus Operator's
// kinds are held to their Go types in deploy/chart's tests instead (this API
// server has no such CRDs). The scheduler configuration of each variant is
// loaded and validated as kube-scheduler would.
func TestChartDryRun(t *testing.T) {
	c := startCluster(t)
	cfg := c.restConfig()
	// Objects of a namespace that does not exist fail even a dry run; helm
	// install --create-namespace makes it first.
	if _, err := c.client.CoreV1().Namespaces().Create(c.ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tessera-system"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, values string
	}{
		{"default", ""},
		{"MPS off", "agent: {mps: false}"},
		{"custom image registry", "image: {registry: registry.corp.example:5000/gpu, tag: v9.9.9, pullSecrets: [{name: corp}]}"},
		{"the only scheduler", "scheduler: {mode: only, replicas: 1, leaseNamespace: tessera-system}"},
		{"plain manifests", "createNamespace: true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var values map[string]any
			if err := yaml.Unmarshal([]byte(tc.values), &values); err != nil {
				t.Fatal(err)
			}
			// Without the Prometheus Operator, as this API server is.
			r, err := chart.Render(values, chart.Options{})
			if err != nil {
				t.Fatal(err)
			}
			all, err := r.Join()
			if err != nil {
				t.Fatal(err)
			}
			var objs []*unstructured.Unstructured
			dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(all), 4096)
			for {
				var m map[string]any
				if err := dec.Decode(&m); errors.Is(err, io.EOF) {
					break
				} else if err != nil {
					t.Fatal(err)
				}
				if len(m) == 0 {
					continue
				}
				u := &unstructured.Unstructured{Object: m}
				if u.GetKind() == "Namespace" && u.GetName() == "tessera-system" {
					continue // exists: its dry run would conflict with nothing
				}
				objs = append(objs, u)
			}
			if err := playground.DryRunApply(c.ctx, cfg, objs); err != nil {
				t.Fatalf("dry-run apply: %v", err)
			}
			t.Logf("%d objects admitted", len(objs))

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
