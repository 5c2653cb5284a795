// Package claimadmission refuses, at admission, a pod whose ResourceClaims
// ask gpu.tessera.dev devices while it names a scheduler without
// TesseraGPU (that scheduler's allocator would choose the GPU first fit,
// from a view that does not count the device plugin's pods, and the node
// would then refuse to prepare the claim, the pod stuck in
// ContainerCreating), or while it could leave its slice (privileged, a
// host namespace, the GPUs' variables: what tessera-gpu-pod-limits refuses
// in device-plugin GPU pods). A ValidatingAdmissionPolicy cannot do it: a
// pod's claims are separate objects (a ResourceClaim, or the
// ResourceClaimTemplate its claim will be made from), which CEL cannot
// read; a validating webhook can.
//
// The decision (Refusal) is a pure function of the pod and what its claims
// ask, read through a Lookup; the webhook (Server) serves it over HTTPS
// with a certificate it keeps in a Secret, and keeps the
// ValidatingWebhookConfiguration's caBundle in step with it.
package claimadmission

import (
	"context"
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
)

// TesseraClass says whether a DeviceClass is one of gpu.tessera.dev's, as
// the chart names them: gpu.tessera.dev and <kind>.gpu.tessera.dev.
func TesseraClass(name string) bool {
	return name == gpu.DRADriver || strings.HasSuffix(name, "."+gpu.DRADriver)
}

// classesOf are the DeviceClasses a claim spec's requests name, each
// once, in order (a prioritized list's alternatives included).
func classesOf(spec *resourceapi.ResourceClaimSpec) []string {
	var out []string
	add := func(c string) {
		if c != "" && !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	for _, r := range spec.Devices.Requests {
		if r.Exactly != nil {
			add(r.Exactly.DeviceClassName)
		}
		for _, s := range r.FirstAvailable {
			add(s.DeviceClassName)
		}
	}
	return out
}

// Lookup reads the DeviceClasses a pod's claim asks for: found is false
// for a claim or template that does not exist (yet).
type Lookup interface {
	ClaimClasses(ctx context.Context, namespace, name string) (classes []string, found bool, err error)
	TemplateClasses(ctx context.Context, namespace, name string) (classes []string, found bool, err error)
}

// Refusal is why pod is refused ("" when it is not): it holds a claim (or a
// template's) asking a gpu.tessera.dev class, and names a scheduler not in
// schedulers, or could leave the slice the claim gives it
// (podgpu.EscapesSlice: the rules of the admission policy
// tessera-gpu-pod-limits, which cannot see a claim's driver). A claim that
// does not exist yet asks nothing that can be read; the node still
// refuses to prepare it. An error reading a claim is returned with what
// was decided from the others.
func Refusal(ctx context.Context, pod *v1.Pod, schedulers []string, look Lookup) (string, error) {
	tesseraScheduled := slices.Contains(schedulers, pod.Spec.SchedulerName)
	escapes := podgpu.EscapesSlice(pod)
	if len(pod.Spec.ResourceClaims) == 0 || (tesseraScheduled && len(escapes) == 0) {
		return "", nil // nothing a claim could make wrong: no claim is read
	}
	var errs []error
	for _, pc := range pod.Spec.ResourceClaims {
		var (
			classes []string
			what    string
			err     error
		)
		switch {
		case pc.ResourceClaimName != nil:
			what = fmt.Sprintf("ResourceClaim %s", *pc.ResourceClaimName)
			classes, _, err = look.ClaimClasses(ctx, pod.Namespace, *pc.ResourceClaimName)
		case pc.ResourceClaimTemplateName != nil:
			what = fmt.Sprintf("ResourceClaimTemplate %s", *pc.ResourceClaimTemplateName)
			classes, _, err = look.TemplateClasses(ctx, pod.Namespace, *pc.ResourceClaimTemplateName)
		default:
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("claim %q (%s): %w", pc.Name, what, err))
			continue
		}
		i := slices.IndexFunc(classes, TesseraClass)
		if i < 0 {
			continue
		}
		asks := fmt.Sprintf("the pod's claim %q (%s) asks %s devices (DeviceClass %s)", pc.Name, what, gpu.DRADriver, classes[i])
		if !tesseraScheduled {
			return asks + fmt.Sprintf(", but the pod names spec.schedulerName %q: "+
				"set it to %s, which places gpu.tessera.dev claims on the GPU the fragmentation gradient picks and counts them "+
				"with the device plugin's pods (another scheduler chooses the GPU first fit, and the node would refuse to prepare the claim)",
				pod.Spec.SchedulerName, strings.Join(schedulers, " or ")), nil
		}
		return asks + ", and the pod could leave its GPU slice: " + strings.Join(escapes, "; ") +
			"; remove them (the same rules as the admission policy tessera-gpu-pod-limits)", nil
	}
	if len(errs) > 0 {
		return "", fmt.Errorf("reading the pod's claims: %v", errs)
	}
	return "", nil
}

// ClientLookup reads claims and templates from the API server.
type ClientLookup struct{ Client kubernetes.Interface }

// ClaimClasses implements Lookup.
func (l ClientLookup) ClaimClasses(ctx context.Context, namespace, name string) ([]string, bool, error) {
	c, err := l.Client.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return classesOf(&c.Spec), true, nil
}

// TemplateClasses implements Lookup.
func (l ClientLookup) TemplateClasses(ctx context.Context, namespace, name string) ([]string, bool, error) {
	t, err := l.Client.ResourceV1().ResourceClaimTemplates(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return classesOf(&t.Spec.Spec), true, nil
}
