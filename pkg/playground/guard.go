package playground

import (
	"context"
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/preemption"
)

// Apply server-side applies objs, in order, as cfg's user: what `kubectl
// apply --server-side` does with a manifest.
func Apply(ctx context.Context, cfg *rest.Config, objs []*unstructured.Unstructured) error {
	return apply(ctx, cfg, objs, nil)
}

// DryRunApply is Apply with the API server's dry run: every object is
// defaulted, validated and admitted (policies included) and none is stored.
func DryRunApply(ctx context.Context, cfg *rest.Config, objs []*unstructured.Unstructured) error {
	return apply(ctx, cfg, objs, []string{metav1.DryRunAll})
}

func apply(ctx context.Context, cfg *rest.Config, objs []*unstructured.Unstructured, dryRun []string) error {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	for _, u := range objs {
		gvk := u.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("%s %s: %w", gvk.Kind, u.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = dyn.Resource(mapping.Resource).Namespace(u.GetNamespace())
		}
		if _, err := ri.Apply(ctx, u.GetName(), u, metav1.ApplyOptions{FieldManager: "tessera", Force: true, DryRun: dryRun}); err != nil {
			return fmt.Errorf("%s %s: %w", gvk.Kind, u.GetName(), err)
		}
	}
	return nil
}

// As is cfg acting as user, with the user's extra info, through the API
// server's impersonation: how the playground runs its scheduler and agents
// under their own service accounts with the admin's credentials. The API
// server adds a service account's groups itself.
func As(cfg *rest.Config, user string, extra map[string][]string) *rest.Config {
	out := rest.CopyConfig(cfg)
	out.Impersonate = rest.ImpersonationConfig{UserName: user, Extra: extra}
	return out
}

// AsKubelet is cfg acting under the name kubelet has on node
// (system:node:<node>, group system:nodes), which the policies let report
// its pods' phase. The playground's API server authorizes with RBAC alone
// (no Node authorizer), so the stand-in kubelet keeps an administrator's
// rights under that name.
func AsKubelet(cfg *rest.Config, node string) *rest.Config {
	out := rest.CopyConfig(cfg)
	out.Impersonate = rest.ImpersonationConfig{UserName: "system:node:" + node, Groups: []string{"system:nodes", "system:masters"}}
	return out
}

// AsAgent is cfg acting as the tessera-agent of node, as a token bound to
// the agent's pod there would.
func AsAgent(cfg *rest.Config, node string) *rest.Config {
	return As(cfg, deploy.AgentUser, map[string][]string{deploy.NodeNameExtra: {node}})
}

// Guard applies what guards a cluster: the namespace, service accounts and
// RBAC of tessera-scheduler and tessera-agent (not the agent's DaemonSet),
// and the admission policies, with every namespace granted the preempting
// priority classes; it returns once every policy is in force (the status
// policy, which no dry run reaches without a pod, loads with the others).
func Guard(ctx context.Context, cfg *rest.Config) error {
	var objs []*unstructured.Unstructured
	for _, m := range []struct{ name, manifest string }{
		{"tessera-agent.yaml", deploy.Agent},
		{"tessera-scheduler-rbac.yaml", deploy.SchedulerRBAC},
		{"admission-policies.yaml", deploy.AdmissionPolicies},
	} {
		o, err := deploy.Objects(m.manifest)
		if err != nil {
			return fmt.Errorf("deploy/%s: %w", m.name, err)
		}
		for _, u := range o {
			if u.GetKind() == "DaemonSet" {
				continue
			}
			if u.GetKind() == "ConfigMap" && u.GetName() == deploy.AdmissionConfigMap {
				// A sandbox of one user: every namespace may use the
				// preempting classes (the end-to-end tests make their own).
				for _, class := range []string{"gpu-critical", "gpu-standard"} {
					if err := unstructured.SetNestedField(u.Object, "*", "data", class); err != nil {
						return err
					}
				}
			}
			objs = append(objs, u)
		}
	}
	if err := Apply(ctx, cfg, objs); err != nil {
		return err
	}
	return WaitForPolicies(ctx, cfg)
}

// WaitForPolicies returns once the API server refuses, for each shipped
// policy, a dry-run request that the policy forbids: the admission plugin
// loads policies from its informers, a moment after they are created.
func WaitForPolicies(ctx context.Context, cfg *rest.Config) error {
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	// An administrator (system:masters, whom RBAC lets bind) who is no
	// scheduler.
	probeAdmin := rest.CopyConfig(cfg)
	probeAdmin.Impersonate = rest.ImpersonationConfig{UserName: "tessera-guard-probe", Groups: []string{"system:masters"}}
	asProbe, err := kubernetes.NewForConfig(probeAdmin)
	if err != nil {
		return err
	}
	asAgent, err := kubernetes.NewForConfig(As(cfg, deploy.AgentUser, nil))
	if err != nil {
		return err
	}
	probe := func(mutate func(*v1.Pod)) func(context.Context) error {
		return func(ctx context.Context) error {
			p := guardProbePod()
			mutate(p)
			_, err := client.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, p, dry)
			return err
		}
	}
	probes := map[string]func(context.Context) error{
		"tessera-scheduler-annotations": probe(func(p *v1.Pod) { p.Annotations = map[string]string{gpu.AnnotationAssignment: "{}"} }),
		"tessera-checkpointed":          probe(func(p *v1.Pod) { p.Annotations = map[string]string{preemption.AnnotationCheckpointed: "now"} }),
		"tessera-gpu-pod-limits": probe(func(p *v1.Pod) {
			yes := true
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Privileged: &yes}
		}),
		"tessera-gpu-pod-node-name": probe(func(p *v1.Pod) { p.Spec.NodeName = "guard-probe" }),
		"tessera-gpu-pod-scheduler": probe(func(p *v1.Pod) { p.Spec.SchedulerName = "" }),
		// Its parameters loaded too: the refusal is the rule's, not the
		// one for a missing ConfigMap.
		"tessera-gpu-priority": probe(func(p *v1.Pod) { p.Spec.PriorityClassName = "system-node-critical" }),
		"tessera-node-inventory": func(ctx context.Context) error {
			n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "guard-probe", Annotations: map[string]string{gpu.AnnotationInventory: "{}"}}}
			_, err := client.CoreV1().Nodes().Create(ctx, n, dry)
			return err
		},
		"tessera-pod-binding": func(ctx context.Context) error {
			b := &v1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "guard-probe"}, Target: v1.ObjectReference{Kind: "Node", Name: "guard-probe"}}
			return asProbe.CoreV1().Pods(metav1.NamespaceDefault).Bind(ctx, b, dry)
		},
		"tessera-agent-node-bound": func(ctx context.Context) error {
			l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "guard-probe"}}
			_, err := asAgent.CoordinationV1().Leases(deploy.Namespace).Create(ctx, l, dry)
			return err
		},
	}
	// A refusal that names the policy but comes from its missing
	// parameters is not the policy in force.
	const noParams = "no params found"
	for policy, try := range probes {
		var last error
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			last = try(ctx)
			return apierrors.IsForbidden(last) && strings.Contains(last.Error(), "'"+policy+"'") && !strings.Contains(last.Error(), noParams), nil
		})
		if err != nil {
			return fmt.Errorf("admission policy %s not in force after a minute (its probe got: %v): %w", policy, last, err)
		}
	}
	return nil
}

// guardProbePod is a GPU pod that every policy lets through.
func guardProbePod() *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "guard-probe"},
		Spec: v1.PodSpec{SchedulerName: "tessera-scheduler", Containers: []v1.Container{{Name: "main", Image: "none",
			Resources: v1.ResourceRequirements{Limits: v1.ResourceList{gpu.ResourceGPU: resource.MustParse("1")}}}}},
	}
}
