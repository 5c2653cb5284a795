package claimadmission

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"
	admissionv1 "k8s.io/api/admission/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// Name names the webhook's Secret, Service and ValidatingWebhookConfiguration,
// as the chart makes them; Path is the webhook's URL path.
const (
	Name = "tessera-claim-admission"
	Path = "/validate-pod-claims"
)

// DefaultSchedulers are the profiles that run TesseraGPU in the chart.
var DefaultSchedulers = []string{"tessera-scheduler"}

// Options configure the webhook, from tessera-scheduler's flags.
type Options struct {
	// Address and Port are where it serves HTTPS (Port 0: it does not
	// run; Address empty: every interface).
	Address string
	Port    int
	// Namespace holds its Secret and Service (the scheduler's own).
	Namespace string
	// Schedulers are the profiles that run TesseraGPU.
	Schedulers []string
	// Every is how often the Secret is read again and the
	// configuration's caBundle checked (30 s when zero).
	Every time.Duration
}

// AddFlags adds the webhook's flags to fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.IntVar(&o.Port, "claim-admission-port", 0,
		"Serve the admission webhook that refuses pods whose ResourceClaims ask gpu.tessera.dev devices but name another scheduler or could leave their slice, on this port (0: off). "+
			"Its certificate is kept in Secret "+Name+" of --claim-admission-namespace, and the caBundle of ValidatingWebhookConfiguration "+Name+" is kept in step.")
	fs.StringVar(&o.Address, "claim-admission-address", "", "The address the webhook listens on (empty: every interface).")
	fs.StringVar(&o.Namespace, "claim-admission-namespace", "", "The namespace of the webhook's Secret and Service (the scheduler's own); required with --claim-admission-port.")
	fs.StringSliceVar(&o.Schedulers, "claim-admission-schedulers", DefaultSchedulers, "The scheduler profiles that run TesseraGPU: a pod naming another is refused a gpu.tessera.dev claim.")
}

// startOnce keeps Start to one webhook per process: every profile running
// TesseraGPU starts it.
var startOnce sync.Map // port → struct{}

// Start runs the webhook in the background until ctx ends, when Port is
// set: tessera-scheduler calls it with its client once TesseraGPU is
// built. A bad option is an error the scheduler stops on; what goes wrong
// later (the API server away) is logged and retried.
func (o *Options) Start(ctx context.Context, client kubernetes.Interface) error {
	if o.Port == 0 {
		return nil
	}
	if o.Port < 0 || o.Port > 65535 {
		return fmt.Errorf("--claim-admission-port %d: give a port from 1 to 65535, or 0 for no webhook", o.Port)
	}
	if o.Namespace == "" {
		return errors.New("--claim-admission-namespace is required with --claim-admission-port: the namespace of the webhook's Secret and Service")
	}
	if _, loaded := startOnce.LoadOrStore(o.Port, struct{}{}); loaded {
		return nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(o.Address, strconv.Itoa(o.Port)))
	if err != nil {
		startOnce.Delete(o.Port)
		return fmt.Errorf("the claim admission webhook cannot listen on %s port %d: %w", o.Address, o.Port, err)
	}
	s := &Server{Client: client, Namespace: o.Namespace, Schedulers: o.Schedulers, Every: o.Every}
	go func() {
		defer startOnce.Delete(o.Port)
		if err := s.Serve(ctx, ln); err != nil {
			klog.FromContext(ctx).Error(err, "The claim admission webhook stopped")
		}
	}()
	return nil
}

// Server is the webhook.
type Server struct {
	Client     kubernetes.Interface
	Namespace  string
	Schedulers []string
	Every      time.Duration

	cert atomic.Pointer[tls.Certificate]
}

// Serve serves the webhook on ln until ctx ends: it gets its certificate
// from its Secret (making it the first time), then keeps the Secret read
// and the webhook configuration's caBundle set, every Every.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	logger := klog.FromContext(ctx).WithName("claim-admission")
	ctx = klog.NewContext(ctx, logger)
	if s.Every <= 0 {
		s.Every = 30 * time.Second
	}
	if len(s.Schedulers) == 0 {
		s.Schedulers = DefaultSchedulers
	}
	// The first certificate, before any request: retried while the API
	// server cannot be reached.
	if err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		if err := s.refresh(ctx); err != nil {
			logger.Error(err, "The claim admission webhook has no certificate yet; retrying")
			return false, nil
		}
		return true, nil
	}); err != nil {
		ln.Close()
		return nil // ctx ended
	}
	go wait.UntilWithContext(ctx, func(ctx context.Context) {
		if err := s.refresh(ctx); err != nil {
			logger.Error(err, "Keeping the claim admission webhook's certificate")
		}
	}, s.Every)
	mux := http.NewServeMux()
	mux.Handle(Path, s)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.cert.Load(), nil }}}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	logger.Info("Serving the claim admission webhook", "address", ln.Addr().String(), "path", Path, "schedulers", s.Schedulers)
	if err := srv.ServeTLS(ln, "", ""); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// refresh reads the certificate from its Secret (or makes it) and puts
// its CA in the webhook configuration.
func (s *Server) refresh(ctx context.Context) error {
	cfg, err := webhookConfig(ctx, s.Client, Name)
	if err != nil {
		return err
	}
	var owner *metav1.OwnerReference
	if cfg != nil {
		owner = ownedBy(cfg)
	}
	kp, err := ensureKeyPair(ctx, s.Client, s.Namespace, Name, Hosts(Name, s.Namespace), owner, time.Now())
	if err != nil {
		return err
	}
	pair, err := tls.X509KeyPair(kp.cert, kp.key)
	if err != nil {
		return fmt.Errorf("the certificate in Secret %s/%s: %w", s.Namespace, Name, err)
	}
	s.cert.Store(&pair)
	if cfg == nil {
		klog.FromContext(ctx).V(2).Info("No ValidatingWebhookConfiguration to give the CA to: the API server does not call this webhook", "name", Name)
		return nil
	}
	return setCABundle(ctx, s.Client, cfg, kp.ca)
}

// maxReview bounds what is read of an AdmissionReview (a pod is at most
// about 1.5 MB in etcd).
const maxReview = 3 << 20

// ServeHTTP answers the API server's AdmissionReview for a pod.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST an AdmissionReview", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxReview))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
		http.Error(w, fmt.Sprintf("not an admission.k8s.io/v1 AdmissionReview: %v", err), http.StatusBadRequest)
		return
	}
	resp := s.review(r.Context(), review.Request)
	resp.UID = review.Request.UID
	out := admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// review decides one request. What cannot be decided (an object that is
// not a pod, a claim that cannot be read) is allowed with a warning: the
// node still refuses to prepare a claim for a pod of another scheduler.
func (s *Server) review(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	logger := klog.FromContext(ctx)
	var pod v1.Pod
	if req.Kind.Kind != "Pod" || json.Unmarshal(req.Object.Raw, &pod) != nil {
		return &admissionv1.AdmissionResponse{Allowed: true, Warnings: []string{Name + ": not a pod; not checked"}}
	}
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace
	}
	ctx, cancel := context.WithTimeout(ctx, 4*time.Second)
	defer cancel()
	why, err := Refusal(ctx, &pod, s.Schedulers, ClientLookup{Client: s.Client})
	if why != "" {
		logger.V(2).Info("Refused a pod with a gpu.tessera.dev claim", "pod", klog.KRef(req.Namespace, podName(&pod, req)), "scheduler", pod.Spec.SchedulerName, "why", why)
		return &admissionv1.AdmissionResponse{Allowed: false, Result: &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusForbidden,
			Reason: metav1.StatusReasonForbidden, Message: why}}
	}
	if err != nil {
		logger.Error(err, "Admitting a pod whose claims could not be read", "pod", klog.KRef(req.Namespace, podName(&pod, req)))
		return &admissionv1.AdmissionResponse{Allowed: true, Warnings: []string{Name + ": " + err.Error() +
			"; if a claim asks gpu.tessera.dev devices, the node refuses to prepare it unless the pod names " + s.Schedulers[0]}}
	}
	return &admissionv1.AdmissionResponse{Allowed: true}
}

func podName(p *v1.Pod, req *admissionv1.AdmissionRequest) string {
	if p.Name != "" {
		return p.Name
	}
	if req.Name != "" {
		return req.Name
	}
	return p.GenerateName + "…"
}
