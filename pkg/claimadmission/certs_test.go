package claimadmission

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	admissionv1 "k8s.io/api/admission/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestKeyPairKeptInItsSecret: the first replica makes the certificate and
// its Secret (owned by the webhook configuration), later calls reuse it;
// one for other names, or about to expire, is replaced; a Secret made
// without an owner gets it, keeping its certificate; a replica that loses
// the race to create reads the winner's.
func TestKeyPairKeptInItsSecret(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	hosts := Hosts(Name, "tessera-system")
	client := fake.NewClientset()
	owner := &metav1.OwnerReference{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingWebhookConfiguration", Name: Name, UID: "cfg-uid"}

	kp, err := ensureKeyPair(ctx, client, "tessera-system", Name, hosts, nil, now)
	if err != nil || !kp.usable(hosts, now) {
		t.Fatalf("first key pair: usable %v, %v", kp.usable(hosts, now), err)
	}
	again, err := ensureKeyPair(ctx, client, "tessera-system", Name, hosts, owner, now)
	if err != nil || !bytes.Equal(again.cert, kp.cert) {
		t.Fatalf("second call made a new certificate (%v): replicas would disagree", err)
	}
	s, _ := client.CoreV1().Secrets("tessera-system").Get(ctx, Name, metav1.GetOptions{})
	if s.Type != v1.SecretTypeTLS || len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != "cfg-uid" {
		t.Errorf("Secret type %s, owners %v; want kubernetes.io/tls owned by the webhook configuration", s.Type, s.OwnerReferences)
	}
	if kp.usable(Hosts(Name, "elsewhere"), now) {
		t.Error("a certificate for tessera-system is usable for another namespace's Service")
	}
	moved, err := ensureKeyPair(ctx, client, "tessera-system", Name, Hosts(Name, "elsewhere"), owner, now)
	if err != nil || bytes.Equal(moved.cert, kp.cert) || !moved.usable(Hosts(Name, "elsewhere"), now) {
		t.Errorf("a certificate for other names was not replaced: %v", err)
	}
	late := now.Add(certValidity - certRenewBefore/2)
	renewed, err := ensureKeyPair(ctx, client, "tessera-system", Name, Hosts(Name, "elsewhere"), owner, late)
	if err != nil || bytes.Equal(renewed.cert, moved.cert) || !renewed.usable(Hosts(Name, "elsewhere"), late) {
		t.Errorf("a certificate about to expire was not renewed: %v", err)
	}

	// Two replicas at once: this one's create loses.
	race := fake.NewClientset()
	winner, _ := newKeyPair(hosts, now)
	race.PrependReactor("create", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		s := a.(k8stesting.CreateAction).GetObject().(*v1.Secret).DeepCopy()
		s.Data = map[string][]byte{v1.TLSCertKey: winner.cert, v1.TLSPrivateKeyKey: winner.key, "ca.crt": winner.ca}
		if err := race.Tracker().Create(schema.GroupVersionResource{Version: "v1", Resource: "secrets"}, s, s.Namespace); err != nil {
			t.Fatal(err)
		}
		return true, nil, apierrors.NewAlreadyExists(schema.GroupResource{Resource: "secrets"}, s.Name)
	})
	got, err := ensureKeyPair(ctx, race, "tessera-system", Name, hosts, nil, now)
	if err != nil || !bytes.Equal(got.cert, winner.cert) {
		t.Errorf("the replica that lost the race serves its own certificate (%v), not the winner's", err)
	}
}

// TestWebhookAnswersReviews: the handler, as the API server calls it.
func TestWebhookAnswersReviews(t *testing.T) {
	client := fake.NewClientset(&resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "slice", Namespace: "ml"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.tessera.dev"}}}}}}})
	client.PrependReactor("get", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "resourceclaims"}, "x", nil)
	})
	srv := httptest.NewServer(&Server{Client: client, Schedulers: DefaultSchedulers})
	defer srv.Close()
	ask := func(pod *v1.Pod) *admissionv1.AdmissionResponse {
		t.Helper()
		raw, _ := json.Marshal(pod)
		review := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
			Request: &admissionv1.AdmissionRequest{UID: "req-1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Namespace: "ml",
				Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}}}
		body, _ := json.Marshal(review)
		resp, err := http.Post(srv.URL+Path, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out admissionv1.AdmissionReview
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.Response == nil || out.Response.UID != "req-1" || out.Kind != "AdmissionReview" {
			t.Fatalf("answer %+v (%v)", out, err)
		}
		return out.Response
	}
	pod := claimPod("default-scheduler", fromTemplate("gpu", "slice"))
	pod.Name = "train"
	if r := ask(pod); r.Allowed || r.Result == nil || r.Result.Code != http.StatusForbidden || !strings.Contains(r.Result.Message, "set it to tessera-scheduler") {
		t.Errorf("a default-scheduler pod with a gpu.tessera.dev template: %+v", r)
	}
	pod.Spec.SchedulerName = "tessera-scheduler"
	if r := ask(pod); !r.Allowed {
		t.Errorf("a tessera-scheduler pod refused: %+v", r.Result)
	}
	// A claim it may not read: allowed, with the reason as a warning.
	if r := ask(claimPod("default-scheduler", fromClaim("gpu", "hidden"))); !r.Allowed || len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0], "the node refuses to prepare it") {
		t.Errorf("an unreadable claim: %+v", r)
	}
	if resp, err := http.Get(srv.URL + Path); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %v %v", resp.StatusCode, err)
	}
}

// TestSchedulersFlag: --claim-admission-schedulers names the profiles that
// run TesseraGPU: a pod naming one of them is admitted, one naming the
// default scheduler refused.
func TestSchedulersFlag(t *testing.T) {
	var o Options
	fs := pflag.NewFlagSet("tessera-scheduler", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse([]string{"--claim-admission-schedulers=tessera-scheduler,gpu-batch"}); err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset(&resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "slice", Namespace: "ml"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.tessera.dev"}}}}}}})
	s := &Server{Client: client, Schedulers: o.Schedulers}
	for scheduler, allowed := range map[string]bool{"gpu-batch": true, "tessera-scheduler": true, "default-scheduler": false} {
		pod := claimPod(scheduler, fromTemplate("gpu", "slice"))
		raw, _ := json.Marshal(pod)
		r := s.review(context.Background(), &admissionv1.AdmissionRequest{Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Namespace: "ml",
			Object: runtime.RawExtension{Raw: raw}})
		if r.Allowed != allowed {
			t.Errorf("a pod naming %s: allowed %v, want %v (%+v)", scheduler, r.Allowed, allowed, r.Result)
		}
	}
}
