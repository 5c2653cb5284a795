// Package deploy embeds the shipped manifests, so that the playground runs
// the scheduler configuration, PriorityClasses, RBAC and admission policies
// a cluster would get.
package deploy

import (
	_ "embed"
	"errors"
	"fmt"
	"io"
	"strings"

	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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

// AdmissionPolicies is admission-policies.yaml: the ValidatingAdmissionPolicies
// (and their bindings) that keep Tessera's annotations to the identities that
// own them and GPU pods inside their slices.
//
//go:embed admission-policies.yaml
var AdmissionPolicies string

// SchedulerRBAC is tessera-scheduler-rbac.yaml: tessera-scheduler's service
// account and roles.
//
//go:embed tessera-scheduler-rbac.yaml
var SchedulerRBAC string

// Scheduler is tessera-scheduler.yaml: the scheduler's configuration,
// Deployment and Services, and its claim admission webhook.
//
//go:embed tessera-scheduler.yaml
var Scheduler string

// Agent is tessera-agent.yaml: the namespace, the agent's service account,
// roles and DaemonSet, and the DRA driver's DeviceClasses.
//
//go:embed tessera-agent.yaml
var Agent string

// InstallCommand is the helm command that installs the chart from a
// checkout with the images `make images` tagged <registry>/<name>:<tag>:
// what make images prints, and the README's install step. The tag goes
// through --set-string, since Helm's --set makes a tag of digits (a short
// commit hash can be one) a number, which the chart's schema refuses.
func InstallCommand(registry, tag string) string {
	return "helm install tessera deploy/chart/tessera -n " + Namespace + " --create-namespace \\\n" +
		"    --set image.registry=" + registry + " --set-string image.tag=" + tag
}

// AdmissionConfigMap is the ConfigMap, in Namespace, whose lists (allowed
// host paths, binders, status writers, priority grants) the admission
// policies read at every request: without it they refuse every request
// they match.
const AdmissionConfigMap = "tessera-admission"

// The identities the admission policies trust, as the API server names the
// service accounts' users.
const (
	Namespace     = "tessera-system"
	SchedulerUser = "system:serviceaccount:" + Namespace + ":tessera-scheduler"
	AgentUser     = "system:serviceaccount:" + Namespace + ":tessera-agent"
	// NodeNameExtra is the user's extra info that a service-account token
	// bound to a pod carries: the pod's node. The policies let an agent
	// write only that node.
	NodeNameExtra = "authentication.kubernetes.io/node-name"
)

// Objects decodes a multi-document manifest into its objects, skipping
// empty documents.
func Objects(manifest string) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifest), 4096)
	var out []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, fmt.Errorf("object %d: %w", len(out)+1, err)
		}
		if len(u.Object) != 0 {
			out = append(out, u)
		}
	}
}
