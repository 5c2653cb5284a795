package integration

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"

	v1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tessera-gpu/tessera/deploy"
)

// TestShippedPriorityClasses creates deploy/priorityclasses.yaml on the real
// API server: every class is accepted as written (a preemptionPolicy the API
// does not know, such as "Always", would be refused here).
func TestShippedPriorityClasses(t *testing.T) {
	c := startCluster(t)
	pcs, err := deploy.ShippedPriorityClasses()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"gpu-critical": true, "gpu-standard": true, "gpu-batch": true}
	for _, pc := range pcs {
		got, err := c.client.SchedulingV1().PriorityClasses().Create(c.ctx, &pc, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("%s: %v", pc.Name, err)
		}
		if got.PreemptionPolicy == nil || *got.PreemptionPolicy != *pc.PreemptionPolicy {
			t.Errorf("%s: preemptionPolicy %v", pc.Name, got.PreemptionPolicy)
		}
		delete(want, pc.Name)
	}
	if len(want) != 0 {
		t.Fatalf("missing classes %v", want)
	}
	bad := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "always"}, Value: 10}
	always := v1.PreemptionPolicy("Always")
	bad.PreemptionPolicy = &always
	if _, err := c.client.SchedulingV1().PriorityClasses().Create(c.ctx, bad, metav1.CreateOptions{}); err == nil {
		t.Fatal(`the API server accepted preemptionPolicy "Always"`)
	}
}

// TestShippedAgentManifest creates deploy/tessera-agent.yaml on the real API
// server, object by object, so a field the API rejects fails here.
func TestShippedAgentManifest(t *testing.T) {
	c := startCluster(t)
	b, err := os.ReadFile("../../deploy/tessera-agent.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	created := 0
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if len(u.Object) == 0 {
			continue
		}
		gvk := u.GroupVersionKind()
		mapping, err := c.mapper().RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s: %v", gvk, err)
		}
		var ri dynamic.ResourceInterface = c.dynamic().Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = c.dynamic().Resource(mapping.Resource).Namespace(u.GetNamespace())
		}
		if _, err := ri.Create(c.ctx, &u, metav1.CreateOptions{}); err != nil {
			t.Fatalf("%s %s: %v", gvk.Kind, u.GetName(), err)
		}
		created++
	}
	// Namespace, ServiceAccount, ClusterRole, ClusterRoleBinding, the
	// heartbeat Role and RoleBinding, the metrics Service, the agent's
	// configuration, the DaemonSet and the DRA driver's four DeviceClasses
	// (their CEL compiled by the API server).
	if created != 13 {
		t.Fatalf("created %d objects, want 13", created)
	}
}

func (c *cluster) restConfig() *rest.Config {
	c.t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		c.t.Fatal(err)
	}
	return cfg
}

func (c *cluster) dynamic() dynamic.Interface {
	return dynamic.NewForConfigOrDie(c.restConfig())
}

func (c *cluster) mapper() meta.RESTMapper {
	dc := discovery.NewDiscoveryClientForConfigOrDie(c.restConfig())
	return restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
}
