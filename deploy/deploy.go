// Package deploy embeds the shipped manifests, so that the playground runs
// the scheduler configuration and PriorityClasses a cluster would get.
package deploy

import (
	_ "embed"
	"errors"
	"fmt"
	"io"
	"strings"

	schedulingv1 "k8s.io/api/scheduling/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// SchedulerConfig is scheduler-config.yaml.
//
//go:embed scheduler-config.yaml
var SchedulerConfig string

// PriorityClasses is priorityclasses.yaml.
//
//go:embed priorityclasses.yaml
var PriorityClasses string

// StandaloneSchedulerConfig is SchedulerConfig for a cluster where
// tessera-scheduler is the only scheduler (the playground, the integration
// tests): no leader election, and the upstream default profile served too,
// as scheduler-config.yaml describes for replacing kube-scheduler. The
// caller appends its clientConnection.
func StandaloneSchedulerConfig() string {
	cfg := strings.Replace(SchedulerConfig, "leaderElect: true", "leaderElect: false", 1)
	return strings.Replace(cfg, "profiles:\n", "profiles:\n  - schedulerName: default-scheduler\n", 1)
}

// ShippedPriorityClasses decodes PriorityClasses.
func ShippedPriorityClasses() ([]schedulingv1.PriorityClass, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(PriorityClasses), 4096)
	var out []schedulingv1.PriorityClass
	for {
		var pc schedulingv1.PriorityClass
		if err := dec.Decode(&pc); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, fmt.Errorf("deploy/priorityclasses.yaml: %w", err)
		}
		if pc.Name != "" {
			out = append(out, pc)
		}
	}
}
