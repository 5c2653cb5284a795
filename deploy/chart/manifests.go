package chart

import (
	"fmt"

	"sigs.k8s.io/yaml"
)

// generatedHeader opens every file Manifests writes.
const generatedHeader = "# Generated from deploy/chart/tessera by `make manifests` (default values,\n# namespace tessera-system); edit the chart, not this file.\n"

// manifestFiles maps each plain manifest under deploy/ to the templates it
// is made of.
var manifestFiles = []struct {
	file      string
	templates []string
}{
	{"tessera-agent.yaml", []string{"templates/namespace.yaml", "templates/agent.yaml", "templates/deviceclasses.yaml"}},
	{"tessera-scheduler-rbac.yaml", []string{"templates/scheduler-rbac.yaml"}},
	{"tessera-scheduler.yaml", []string{"templates/scheduler-config.yaml", "templates/scheduler.yaml", "templates/claim-admission.yaml"}},
	{"admission-policies.yaml", []string{"templates/admission-policies.yaml"}},
	{"priorityclasses.yaml", []string{"templates/priorityclasses.yaml"}},
}

// Manifests renders the plain manifests under deploy/ from the chart: its
// default values with the namespace object, in tessera-system, for a cluster
// without the Prometheus Operator. The keys are paths relative to deploy/.
// scheduler-config.yaml is the scheduler's configuration file itself (the
// ConfigMap's content), prometheus/tessera-rules.yaml the rule file and
// grafana/tessera-dashboard.json the Grafana dashboard.
func Manifests() (map[string]string, error) {
	r, err := Render(map[string]any{"createNamespace": true}, Options{})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, m := range manifestFiles {
		text, err := r.Join(m.templates...)
		if err != nil {
			return nil, err
		}
		out[m.file] = generatedHeader + text
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal([]byte(r["templates/scheduler-config.yaml"]), &cm); err != nil {
		return nil, fmt.Errorf("the scheduler's ConfigMap: %w", err)
	}
	cfg, ok := cm.Data["scheduler-config.yaml"]
	if !ok {
		return nil, fmt.Errorf("the scheduler's ConfigMap has no scheduler-config.yaml")
	}
	out["scheduler-config.yaml"] = generatedHeader + cfg
	rules, err := Files.ReadFile("tessera/files/tessera-rules.yaml")
	if err != nil {
		return nil, err
	}
	out["prometheus/tessera-rules.yaml"] = generatedHeader + string(rules)
	// JSON holds no comment: the dashboard is written as the chart has it.
	dashboard, err := Files.ReadFile("tessera/files/tessera-dashboard.json")
	if err != nil {
		return nil, err
	}
	out["grafana/tessera-dashboard.json"] = string(dashboard)
	return out, nil
}
