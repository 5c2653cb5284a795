package playground

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"time"
)

// The stand-in kubelet's HTTPS API, on the loopback only: the API server
// reaches a node's kubelet by the address and port the Node reports (here
// 127.0.0.1 and this server's port, with the API server preferring
// InternalIP), so fetching a pod's log never resolves a playground node's
// name through the host's resolver, nor reaches the real kubelet of the
// machine running the playground on 127.0.0.1:10250.

// serveAPI starts the API on 127.0.0.1 and returns its port.
func (k *kubelet) serveAPI() (int, error) {
	cert, err := selfSigned()
	if err != nil {
		return 0, err
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		return 0, fmt.Errorf("node %s: kubelet API: %w", k.node, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /containerLogs/{namespace}/{pod}/{container}", k.containerLog)
	k.api = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = k.api.Serve(l) }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// containerLog answers what kubelet's /containerLogs does, for containers
// that run nothing: a line saying so, for a container of a pod this node
// runs or ran.
func (k *kubelet) containerLog(w http.ResponseWriter, r *http.Request) {
	ns, pod, container := r.PathValue("namespace"), r.PathValue("pod"), r.PathValue("container")
	k.mu.Lock()
	known := false
	for _, p := range k.running {
		known = known || p.Namespace == ns && p.Name == pod
	}
	k.mu.Unlock()
	if !known {
		http.Error(w, fmt.Sprintf("pod %s/%s runs on no container of node %s", ns, pod, k.node), http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	fmt.Fprintf(w, "%s tessera playground: container %s of pod %s/%s on node %s runs no process; its GPU work is simulated\n",
		time.Now().UTC().Format(time.RFC3339), container, ns, pod, k.node)
}

// stopAPI stops the API server.
func (k *kubelet) stopAPI() {
	if k.api != nil {
		_ = k.api.Close()
	}
}

// selfSigned is a serving certificate for 127.0.0.1, as kubelet makes one
// for itself when it is given none (the API server does not check it
// unless told a CA).
func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(now.UnixNano()), Subject: pkix.Name{CommonName: "tessera-playground-kubelet"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
