package playground

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/spf13/pflag"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/apiserver/pkg/util/compatibility"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/keyutil"
	basecompatibility "k8s.io/component-base/compatibility"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
	"k8s.io/kubernetes/cmd/kube-apiserver/app/options"
)

// controlPlane is etcd and kube-apiserver, both in this process: what the
// integration tests run, started without the testing package.
type controlPlane struct {
	etcd   *embed.Etcd
	config *rest.Config // system:masters, over the loopback token
	cancel context.CancelFunc
	done   chan error // the API server's Run result
}

// startControlPlane starts etcd and kube-apiserver with their state under
// dir. The API server listens on 127.0.0.1 only.
func startControlPlane(ctx context.Context, dir string) (*controlPlane, error) {
	e, err := startEtcd(filepath.Join(dir, "etcd"))
	if err != nil {
		return nil, err
	}
	cp := &controlPlane{etcd: e}
	if err := cp.startAPIServer(ctx, dir, e.Clients[0].Addr().String()); err != nil {
		e.Close()
		return nil, err
	}
	return cp, nil
}

// stop stops the API server, waits for it, then stops etcd.
func (cp *controlPlane) stop() {
	if cp.cancel != nil {
		cp.cancel()
		select {
		case <-cp.done:
		case <-time.After(30 * time.Second):
		}
	}
	cp.etcd.Close()
}

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// startEtcd runs a single-member etcd that keeps nothing worth syncing to
// disk (the playground's state dies with it).
func startEtcd(dir string) (*embed.Etcd, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.UnsafeNoFsync = true
	client := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))}
	peer := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	zc := zap.NewProductionConfig()
	zc.Level = zap.NewAtomicLevelAt(zapcore.ErrorLevel)
	zc.OutputPaths, zc.ErrorOutputPaths = []string{filepath.Join(dir, "etcd.log")}, []string{filepath.Join(dir, "etcd.log")}
	logger, err := zc.Build()
	if err != nil {
		return nil, err
	}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(logger)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, errors.New("etcd did not become ready within 60 s")
	}
}

// startAPIServer runs kube-apiserver as its command does, with the flags a
// one-machine cluster needs: a self-signed serving certificate, a fresh
// service-account key, and no admission plugin that waits for a controller
// this playground does not run (the token controller, the node lifecycle
// controller that lifts the not-ready taint), and RBAC authorization.
func (cp *controlPlane) startAPIServer(ctx context.Context, dir, etcdAddr string) error {
	certDir := filepath.Join(dir, "apiserver")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	saKeyPEM, err := keyutil.MarshalPrivateKeyToPEM(saKey)
	if err != nil {
		return err
	}
	saKeyFile := filepath.Join(certDir, "service-account.key")
	if err := os.WriteFile(saKeyFile, saKeyPEM, 0o600); err != nil {
		return err
	}

	// A registry of this server's own, as kube-apiserver's test server
	// does: two playgrounds in one process (the end-to-end tests) must not
	// share feature-gate state.
	featureGate := utilfeature.DefaultMutableFeatureGate.DeepCopy()
	version := compatibility.DefaultBuildEffectiveVersion()
	registry := basecompatibility.NewComponentGlobalsRegistry()
	if err := registry.Register(basecompatibility.DefaultKubeComponent, version, featureGate); err != nil {
		return err
	}
	s := options.NewServerRunOptions()
	s.GenericServerRunOptions.ComponentGlobalsRegistry = registry
	fs := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	for _, f := range s.Flags().FlagSets {
		fs.AddFlagSet(f)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	s.SecureServing.Listener, s.SecureServing.BindPort = l, l.Addr().(*net.TCPAddr).Port
	s.SecureServing.ServerCert.CertDirectory = certDir
	s.SecureServing.ExternalAddress = net.ParseIP("127.0.0.1")
	s.ServiceClusterIPRanges = "10.0.0.0/16"
	s.EndpointReconcilerType = "none"
	sc := storagebackend.NewDefaultConfig("/registry", nil)
	sc.Transport.ServerList = []string{"http://" + etcdAddr}
	s.Etcd.StorageConfig = *sc
	s.ServiceAccountSigningKeyFile = saKeyFile
	s.Authentication.ServiceAccounts.Issuers = []string{"https://tessera.playground.local"}
	s.Authentication.ServiceAccounts.KeyFiles = []string{saKeyFile}
	if err := fs.Parse([]string{
		"--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
		// As kubeadm and managed clusters set it: node agents run privileged.
		"--allow-privileged=true",
		// As a cluster authorizes: the scheduler and the agents act as their
		// service accounts, with the shipped RBAC.
		"--authorization-mode=RBAC",
		// Kubelets by their loopback address and port (kubeletapi.go), never
		// by node name: the playground's node names resolve nowhere, and
		// looking them up would ask the host's resolver.
		"--kubelet-preferred-address-types=InternalIP",
	}); err != nil {
		l.Close()
		return err
	}
	if err := registry.Set(); err != nil {
		l.Close()
		return err
	}
	completed, err := s.Complete(ctx)
	if err != nil {
		l.Close()
		return fmt.Errorf("kube-apiserver options: %w", err)
	}
	if errs := completed.Validate(); len(errs) != 0 {
		l.Close()
		return fmt.Errorf("kube-apiserver options: %w", utilerrors.NewAggregate(errs))
	}
	cfg, err := app.NewConfig(completed)
	if err != nil {
		return err
	}
	cc, err := cfg.Complete()
	if err != nil {
		return err
	}
	server, err := app.CreateServerChain(cc)
	if err != nil {
		return fmt.Errorf("kube-apiserver: %w", err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	cp.cancel, cp.done = cancel, make(chan error, 1)
	go func() {
		prepared, err := server.PrepareRun()
		if err == nil {
			err = prepared.Run(runCtx)
		}
		cp.done <- err
		close(cp.done)
	}()
	cp.config = rest.CopyConfig(server.GenericAPIServer.LoopbackClientConfig)
	cp.config.QPS, cp.config.Burst = 1000, 2000
	return cp.waitReady(ctx)
}

// waitReady waits for /readyz and the default namespace.
func (cp *controlPlane) waitReady(ctx context.Context) error {
	client, err := kubernetes.NewForConfig(cp.config)
	if err != nil {
		return err
	}
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-cp.done:
			return false, fmt.Errorf("kube-apiserver stopped: %w", err)
		default:
		}
		status := 0
		client.CoreV1().RESTClient().Get().AbsPath("/readyz").Do(ctx).StatusCode(&status)
		if status != 200 {
			return false, nil
		}
		_, err := client.CoreV1().Namespaces().Get(ctx, metav1.NamespaceDefault, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for kube-apiserver: %w", err)
	}
	return nil
}
