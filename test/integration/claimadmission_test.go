package integration

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/pkg/claimadmission"
)

// freePort is a loopback port nobody listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestClaimAdmissionWebhook: tessera-scheduler run with the chart's
// --claim-admission-* flags makes the webhook's certificate and puts its
// CA in the chart's ValidatingWebhookConfiguration (here given a loopback
// URL: this API server reaches no Service); the real API server then
// refuses a default-scheduler pod whose claim template asks
// gpu.tessera.dev, with the reason, and a privileged tessera-scheduler
// one, and admits the same pod naming tessera-scheduler, a pod of another
// driver's claim (privileged or not), one whose claim is not made yet and
// one without claims (the last never sent, by the configuration's
// matchConditions).
func TestClaimAdmissionWebhook(t *testing.T) {
	c := startCluster(t)
	ns := deploy.Namespace
	if _, err := c.client.CoreV1().Namespaces().Create(c.ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	objs, err := deploy.Objects(deploy.Scheduler)
	if err != nil {
		t.Fatal(err)
	}
	var cfg *admissionregistrationv1.ValidatingWebhookConfiguration
	var args []string
	for _, u := range objs {
		switch {
		case u.GetKind() == "ValidatingWebhookConfiguration" && u.GetName() == claimadmission.Name:
			cfg = &admissionregistrationv1.ValidatingWebhookConfiguration{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, cfg); err != nil {
				t.Fatal(err)
			}
		case u.GetKind() == "Deployment" && u.GetName() == "tessera-scheduler":
			ctrs, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
			for _, ctr := range ctrs {
				list, _, _ := unstructured.NestedStringSlice(ctr.(map[string]any), "args")
				for _, a := range list {
					if strings.HasPrefix(a, "--claim-admission-") {
						args = append(args, a)
					}
				}
			}
		}
	}
	if cfg == nil || len(args) != 2 {
		t.Fatalf("the shipped manifests: webhook configuration %v, the scheduler's claim-admission flags %v", cfg != nil, args)
	}
	// The chart's flags, but on loopback and a free port.
	for i, a := range args {
		if strings.HasPrefix(a, "--claim-admission-port=") {
			args[i] = fmt.Sprintf("--claim-admission-port=%d", port)
		}
	}
	args = append(args, "--claim-admission-address=127.0.0.1")
	svc := cfg.Webhooks[0].ClientConfig.Service
	if svc == nil || svc.Name != claimadmission.Name || svc.Path == nil || *svc.Path != claimadmission.Path {
		t.Fatalf("the chart's webhook calls %+v", cfg.Webhooks[0].ClientConfig)
	}
	url := fmt.Sprintf("https://127.0.0.1:%d%s", port, claimadmission.Path)
	cfg.Webhooks[0].ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url}
	if _, err := c.client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(c.ctx, cfg, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the chart's ValidatingWebhookConfiguration: %v", err)
	}
	c.startScheduler("", args...)

	// The replica's certificate: its CA in the configuration, its Secret
	// owned by it.
	if err := wait.PollUntilContextTimeout(c.ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := c.client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, claimadmission.Name, metav1.GetOptions{})
		return err == nil && len(got.Webhooks[0].ClientConfig.CABundle) > 0, nil
	}); err != nil {
		t.Fatal("the scheduler never put its CA in the webhook configuration")
	}
	secret, err := c.client.CoreV1().Secrets(ns).Get(c.ctx, claimadmission.Name, metav1.GetOptions{})
	if err != nil || secret.Type != v1.SecretTypeTLS || len(secret.OwnerReferences) != 1 || secret.OwnerReferences[0].Kind != "ValidatingWebhookConfiguration" {
		t.Fatalf("the webhook's Secret: %+v (%v)", secret, err)
	}

	const user = "ml"
	if _, err := c.client.CoreV1().Namespaces().Create(c.ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: user}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	template := func(name, class string) {
		t.Helper()
		tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: user},
			Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
				Requests: []resourceapi.DeviceRequest{{Name: "dev", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class}}}}}}}
		if _, err := c.client.ResourceV1().ResourceClaimTemplates(user).Create(c.ctx, tmpl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	template("slice", "gpu.tessera.dev")
	template("nic", "nic.example.com")
	create := func(p *v1.Pod) error {
		_, err := c.client.CoreV1().Pods(user).Create(c.ctx, p, metav1.CreateOptions{})
		return err
	}
	spec := func(name, scheduler string, claims ...v1.PodResourceClaim) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: user}, Spec: v1.PodSpec{SchedulerName: scheduler, ResourceClaims: claims,
			Containers: []v1.Container{{Name: "main", Image: "registry.example/train"}}}}
	}
	pod := func(name, scheduler string, claims ...v1.PodResourceClaim) error {
		return create(spec(name, scheduler, claims...))
	}
	privileged := func(p *v1.Pod) *v1.Pod {
		on := true
		p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Privileged: &on}
		return p
	}
	fromTemplate := func(t string) v1.PodResourceClaim {
		return v1.PodResourceClaim{Name: "gpu", ResourceClaimTemplateName: &t}
	}
	later := "made-later"

	// The webhook may take a moment to answer after the CA is set: until
	// then the API server admits (failurePolicy Ignore).
	var refused error
	if err := wait.PollUntilContextTimeout(c.ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		refused = pod(fmt.Sprintf("default-%d", time.Now().UnixNano()), "default-scheduler", fromTemplate("slice"))
		return refused != nil, nil
	}); err != nil {
		t.Fatal("the API server never refused a default-scheduler pod with a gpu.tessera.dev claim template")
	}
	if !apierrors.IsForbidden(refused) || !strings.Contains(refused.Error(), `admission webhook "claims.gpu.tessera.dev" denied the request`) ||
		!strings.Contains(refused.Error(), `names spec.schedulerName "default-scheduler": set it to tessera-scheduler`) {
		t.Errorf("refusal: %v", refused)
	}
	t.Logf("the API server's answer: %v", refused)
	if err := create(privileged(spec("escape", tesseraScheduler, fromTemplate("slice")))); !apierrors.IsForbidden(err) ||
		!strings.Contains(err.Error(), "the pod could leave its GPU slice: container main is privileged") {
		t.Errorf("a privileged tessera-scheduler pod with a gpu.tessera.dev claim: %v", err)
	}
	for name, err := range map[string]error{
		"a privileged pod of another driver's claim": create(privileged(spec("nic-privileged", tesseraScheduler, fromTemplate("nic")))),
		"the same pod naming tessera-scheduler":      pod("tessera", tesseraScheduler, fromTemplate("slice")),
		"another driver's claim":                     pod("nic", "default-scheduler", fromTemplate("nic")),
		"a claim not made yet":                       pod("later", "default-scheduler", v1.PodResourceClaim{Name: "gpu", ResourceClaimName: &later}),
		"no claims":                                  pod("plain", "default-scheduler"),
	} {
		if err != nil {
			t.Errorf("%s refused: %v", name, err)
		}
	}
}
