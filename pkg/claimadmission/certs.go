package claimadmission

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// certValidity is how long a generated certificate lasts; one with less
// than certRenewBefore left is replaced.
const (
	certValidity    = 5 * 365 * 24 * time.Hour
	certRenewBefore = 30 * 24 * time.Hour
)

// keyPair is the webhook's serving certificate and key, and the CA that
// signed it (what the API server is given as caBundle), all PEM.
type keyPair struct {
	cert, key, ca []byte
}

// Hosts are the names the serving certificate is for: the Service's
// (service.namespace.svc, as the API server calls it) and loopback (a
// webhook configuration given a URL on the scheduler's own host).
func Hosts(service, namespace string) []string {
	return []string{service + "." + namespace + ".svc", service + "." + namespace + ".svc.cluster.local", "localhost", "127.0.0.1"}
}

// usable says whether kp is a certificate for every host that lasts past
// now+certRenewBefore, signed by its CA.
func (kp keyPair) usable(hosts []string, now time.Time) bool {
	pair, err := tls.X509KeyPair(kp.cert, kp.key)
	if err != nil {
		return false
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil || now.Add(certRenewBefore).After(leaf.NotAfter) {
		return false
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(kp.ca) {
		return false
	}
	for _, h := range hosts {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: h, Roots: pool, CurrentTime: now}); err != nil {
			return false
		}
	}
	return true
}

// newKeyPair makes a CA and a serving certificate it signed for hosts.
// The CA's key is not kept: a new pair replaces both.
func newKeyPair(hosts []string, now time.Time) (keyPair, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return keyPair{}, err
	}
	serial := func() *big.Int {
		n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
		return n
	}
	caTmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: "tessera-claim-admission-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(certValidity), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return keyPair{}, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return keyPair{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return keyPair{}, err
	}
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: hosts[0]},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(certValidity),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return keyPair{}, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return keyPair{}, err
	}
	return keyPair{
		cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		key:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		ca:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
	}, nil
}

func fromSecret(s *v1.Secret) keyPair {
	return keyPair{cert: s.Data[v1.TLSCertKey], key: s.Data[v1.TLSPrivateKeyKey], ca: s.Data["ca.crt"]}
}

// ensureKeyPair returns the serving key pair kept in Secret name of
// namespace, making it (or replacing one that is unusable or about to
// expire) first. Every replica of the scheduler calls it: the first to
// create or update the Secret wins, and the others read what it wrote.
// owner, when set (the webhook configuration), becomes the Secret's
// owner, so that the garbage collector removes the Secret — which no
// chart renders — with the configuration at uninstall.
func ensureKeyPair(ctx context.Context, client kubernetes.Interface, namespace, name string, hosts []string, owner *metav1.OwnerReference, now time.Time) (keyPair, error) {
	secrets := client.CoreV1().Secrets(namespace)
	for range 5 {
		s, err := secrets.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			kp, err := newKeyPair(hosts, now)
			if err != nil {
				return keyPair{}, err
			}
			s = &v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace,
				Labels: map[string]string{"app.kubernetes.io/name": "tessera-scheduler", "app.kubernetes.io/component": "claim-admission"}},
				Type: v1.SecretTypeTLS, Data: map[string][]byte{v1.TLSCertKey: kp.cert, v1.TLSPrivateKeyKey: kp.key, "ca.crt": kp.ca}}
			if owner != nil {
				s.OwnerReferences = []metav1.OwnerReference{*owner}
			}
			if _, err := secrets.Create(ctx, s, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
				continue // another replica made it first
			} else if err != nil {
				return keyPair{}, fmt.Errorf("creating Secret %s/%s for the claim admission webhook's certificate: %w", namespace, name, err)
			}
			return kp, nil
		case err != nil:
			return keyPair{}, fmt.Errorf("reading Secret %s/%s, the claim admission webhook's certificate: %w", namespace, name, err)
		}
		owned := owner == nil || slices.ContainsFunc(s.OwnerReferences, func(r metav1.OwnerReference) bool { return r.UID == owner.UID })
		kp := fromSecret(s)
		if kp.usable(hosts, now) && owned {
			return kp, nil
		}
		s = s.DeepCopy()
		if !kp.usable(hosts, now) {
			if kp, err = newKeyPair(hosts, now); err != nil {
				return keyPair{}, err
			}
			s.Data = map[string][]byte{v1.TLSCertKey: kp.cert, v1.TLSPrivateKeyKey: kp.key, "ca.crt": kp.ca}
		}
		if !owned {
			s.OwnerReferences = append(s.OwnerReferences, *owner)
		}
		if _, err := secrets.Update(ctx, s, metav1.UpdateOptions{}); apierrors.IsConflict(err) {
			continue
		} else if err != nil {
			return keyPair{}, fmt.Errorf("updating Secret %s/%s, the claim admission webhook's certificate: %w", namespace, name, err)
		}
		return kp, nil
	}
	return keyPair{}, errors.New("the claim admission webhook's certificate Secret kept changing under this replica; retrying")
}

// webhookConfig is ValidatingWebhookConfiguration name, nil where it does
// not exist (the chart's value off, or not applied yet).
func webhookConfig(ctx context.Context, client kubernetes.Interface, name string) (*admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	cfg, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading ValidatingWebhookConfiguration %s: %w", name, err)
	}
	return cfg, nil
}

// ownedBy is the owner reference to cfg.
func ownedBy(cfg *admissionregistrationv1.ValidatingWebhookConfiguration) *metav1.OwnerReference {
	return &metav1.OwnerReference{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingWebhookConfiguration", Name: cfg.Name, UID: cfg.UID}
}

// setCABundle sets caBundle of every webhook of cfg to ca, where it
// differs.
func setCABundle(ctx context.Context, client kubernetes.Interface, cfg *admissionregistrationv1.ValidatingWebhookConfiguration, ca []byte) error {
	changed := false
	cfg = cfg.DeepCopy()
	for i := range cfg.Webhooks {
		if !bytes.Equal(cfg.Webhooks[i].ClientConfig.CABundle, ca) {
			cfg.Webhooks[i].ClientConfig.CABundle = slices.Clone(ca)
			changed = true
		}
	}
	if !changed {
		return nil
	}
	if _, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(ctx, cfg, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("setting the caBundle of ValidatingWebhookConfiguration %s: %w", cfg.Name, err)
	}
	return nil
}
