//go:build linux

package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// The node's addresses, in its own network namespace only: a veth pair whose
// other end goes nowhere, so nothing can leave the machine.
const (
	nodeName    = "tessera-e2e-node"
	nodeIP      = "10.217.0.1"
	podCIDR     = "10.218.0.0/24"
	serviceCIDR = "10.96.0.0/16"
	apiServerIP = "10.96.0.1"
)

// node is the running cluster: where things are and what was started.
type node struct {
	o       options
	scratch string
	logs    string
	pki     *pki
	admin   string // the administrator's kubeconfig
	runc    string // Debian's runc, found on PATH
	procs   []*exec.Cmd
}

// privatePaths are the host paths the node's components write that must be
// where they are (kubelet's and the agent's), each an empty tmpfs here;
// containerd's root, the CNI's configuration and its address store are
// given scratch paths instead. kubeletRoot is a scratch directory on disk
// mounted inside /var/lib's tmpfs.
var privatePaths = []string{"/run", "/var/lib", "/var/log"}

const kubeletRoot = "/var/lib/kubelet"

// kubeletSysctls are the kernel settings kubelet sets at start
// (setupKernelTunables): not one is per network namespace, so each is a
// scratch file over /proc/sys's here, seeded with the host's value.
var kubeletSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// isolate turns this process's fresh namespaces into the node's: private
// mounts, a new /proc, scratch directories over the components' paths, the
// scratch sysctls, a hostname, and the network.
func (n *node) isolate() error {
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	if err := syscall.Mount("proc", "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting /proc for the node's pid namespace: %w", err)
	}
	for _, p := range privatePaths {
		if err := syscall.Mount("tessera-e2e-node", p, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=0755"); err != nil {
			return fmt.Errorf("tmpfs on %s: %w", p, err)
		}
	}
	src := filepath.Join(n.scratch, "kubelet")
	for _, d := range []string{src, kubeletRoot} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := syscall.Mount(src, kubeletRoot, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("scratch over %s: %w", kubeletRoot, err)
	}
	// The node's resolver: nothing (a pod's lookups fail here rather than
	// ask the host's servers).
	resolv := filepath.Join(n.scratch, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("# make e2e-node: no resolver\noptions ndots:1\n"), 0o644); err != nil {
		return err
	}
	if err := syscall.Mount(resolv, "/etc/resolv.conf", "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("scratch over /etc/resolv.conf: %w", err)
	}
	for _, s := range kubeletSysctls {
		host := filepath.Join("/proc/sys", s)
		v, err := os.ReadFile(host)
		if err != nil {
			return err
		}
		f := filepath.Join(n.scratch, "sysctl", strings.ReplaceAll(s, "/", "."))
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(f, v, 0o644); err != nil {
			return err
		}
		if err := syscall.Mount(f, host, "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("scratch over %s: %w", host, err)
		}
	}
	if err := syscall.Sethostname([]byte(nodeName)); err != nil {
		return err
	}
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", "node0", "type", "veth", "peer", "name", "node0-peer"},
		{"addr", "add", nodeIP + "/24", "dev", "node0"},
		{"link", "set", "node0", "up"},
		{"link", "set", "node0-peer", "up"},
		// A default route, which kubelet and kube-proxy look for, to an
		// address no one holds.
		{"route", "add", "default", "via", "10.217.0.254", "dev", "node0", "onlink"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// start runs a component with its output in logs/<name>.log.
func (n *node) start(name string, args ...string) error {
	path := filepath.Join(n.o.nodeBin, name)
	log, err := os.Create(filepath.Join(n.logs, name+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), "PATH="+n.o.nodeBin+":/usr/sbin:/usr/bin:/sbin:/bin")
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	n.procs = append(n.procs, cmd)
	return nil
}

// stop ends the components, last started first.
func (n *node) stop() {
	for i := len(n.procs) - 1; i >= 0; i-- {
		p := n.procs[i]
		_ = p.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = p.Process.Kill()
		}
	}
}

// adminHTTP is an HTTPS client presenting the administrator's certificate:
// the components authorize /readyz and /metrics by it. Their serving
// certificates are self-signed (kube-scheduler's) or this run's own, on
// addresses inside the node's namespace, so they are not verified.
func (n *node) adminHTTP() (*http.Client, error) {
	cert, err := tls.LoadX509KeyPair(n.pki.path("admin.crt"), n.pki.path("admin.key"))
	if err != nil {
		return nil, err
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true}, //nolint:gosec // see above
	}}, nil
}

// waitHTTPS waits for url to answer 200 to the administrator.
func (n *node) waitHTTPS(ctx context.Context, what, url string, within time.Duration) error {
	c, err := n.adminHTTP()
	if err != nil {
		return err
	}
	return poll(ctx, within, what, func() (bool, string) {
		resp, err := c.Get(url)
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
}

// poll calls f every half second until it says done or within passes.
func poll(ctx context.Context, within time.Duration, what string, f func() (bool, string)) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	last := ""
	for {
		ok, why := f()
		if ok {
			return nil
		}
		last = why
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: not within %s (last: %s)", what, within, last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// up writes the configuration and starts the cluster's components.
func (n *node) up(ctx context.Context) error {
	var err error
	if n.pki, err = newPKI(filepath.Join(n.scratch, "pki")); err != nil {
		return err
	}
	server := "https://" + nodeIP + ":6443"
	for _, c := range []struct {
		name, user string
		groups     []string
		hosts      []string
	}{
		{"apiserver", "kube-apiserver", nil, []string{nodeIP, apiServerIP, "127.0.0.1", "kubernetes", "kubernetes.default",
			"kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}},
		{"apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, nil},
		{"admin", "e2e-admin", []string{"system:masters"}, nil},
		{"controller-manager", "system:kube-controller-manager", nil, nil},
		{"scheduler", "system:kube-scheduler", nil, nil},
		{"kubelet", "system:node:" + nodeName, []string{"system:nodes"}, nil},
		{"kube-proxy", "system:kube-proxy", nil, nil},
	} {
		if err := n.pki.issue(c.name, c.user, c.groups, c.hosts...); err != nil {
			return err
		}
	}
	kc := map[string]string{}
	for _, name := range []string{"admin", "controller-manager", "scheduler", "kubelet", "kube-proxy"} {
		if kc[name], err = n.pki.kubeconfig(name, server); err != nil {
			return err
		}
	}
	n.admin = kc["admin"]
	p := n.pki.path

	if err := n.start("etcd", "--name=e2e-node", "--data-dir="+filepath.Join(n.scratch, "etcd"),
		"--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=e2e-node=http://127.0.0.1:2380", "--listen-metrics-urls=http://127.0.0.1:2381"); err != nil {
		return err
	}
	if err := n.start("kube-apiserver", "--etcd-servers=http://127.0.0.1:2379",
		"--advertise-address="+nodeIP, "--secure-port=6443",
		"--tls-cert-file="+p("apiserver.crt"), "--tls-private-key-file="+p("apiserver.key"),
		"--client-ca-file="+p("ca.crt"),
		"--service-account-key-file="+p("sa.pub"), "--service-account-signing-key-file="+p("sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range="+serviceCIDR, "--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction", "--allow-privileged=true",
		"--kubelet-client-certificate="+p("apiserver-kubelet-client.crt"), "--kubelet-client-key="+p("apiserver-kubelet-client.key"),
		"--kubelet-preferred-address-types=InternalIP", "--profiling=false"); err != nil {
		return err
	}
	if err := n.waitHTTPS(ctx, "kube-apiserver ready", server+"/readyz", 90*time.Second); err != nil {
		return err
	}
	if err := n.start("kube-controller-manager", "--kubeconfig="+kc["controller-manager"],
		"--authentication-kubeconfig="+kc["controller-manager"], "--authorization-kubeconfig="+kc["controller-manager"],
		"--service-account-private-key-file="+p("sa.key"), "--root-ca-file="+p("ca.crt"),
		"--use-service-account-credentials=true", "--leader-elect=false", "--bind-address=127.0.0.1",
		"--cluster-signing-cert-file="+p("ca.crt"), "--cluster-signing-key-file="+p("ca.key")); err != nil {
		return err
	}
	if err := n.start("kube-scheduler", "--kubeconfig="+kc["scheduler"],
		"--authentication-kubeconfig="+kc["scheduler"], "--authorization-kubeconfig="+kc["scheduler"],
		"--leader-elect=false", "--bind-address=127.0.0.1"); err != nil {
		return err
	}
	if err := n.writeNodeConfig(); err != nil {
		return err
	}
	if err := n.start("containerd", "--config="+filepath.Join(n.scratch, "containerd.toml")); err != nil {
		return err
	}
	if err := poll(ctx, 30*time.Second, "containerd's socket", func() (bool, string) {
		_, err := os.Stat("/run/containerd/containerd.sock")
		return err == nil, fmt.Sprint(err)
	}); err != nil {
		return err
	}
	if err := n.start("kubelet", "--config="+filepath.Join(n.scratch, "kubelet.yaml"), "--kubeconfig="+kc["kubelet"],
		"--container-runtime-endpoint=unix:///run/containerd/containerd.sock",
		"--node-ip="+nodeIP, "--hostname-override="+nodeName, "--v=2"); err != nil {
		return err
	}
	return n.start("kube-proxy", "--config="+filepath.Join(n.scratch, "kube-proxy.yaml"), "--v=2")
}

// writeNodeConfig writes containerd's, the CNI's, kubelet's and
// kube-proxy's configuration.
func (n *node) writeNodeConfig() error {
	var err error
	if n.runc, err = exec.LookPath("runc"); err != nil {
		return fmt.Errorf("runc: %w (make e2e-node installs Debian's)", err)
	}
	files := map[string]string{
		filepath.Join(n.scratch, "containerd.toml"): `version = 3
root = "` + filepath.Join(n.scratch, "containerd") + `"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "` + pauseImage + `"
[plugins."io.containerd.cri.v1.runtime"]
  cdi_spec_dirs = ["/var/run/cdi"]
  # Kubelet asks -998 for sandboxes and below zero for critical pods; a
  # build machine's root may lack CAP_SYS_RESOURCE, which lowering needs.
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "` + n.runc + `"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "` + filepath.Join(n.scratch, "cni/net.d") + `"
`,
		filepath.Join(n.scratch, "cni/net.d/10-e2e-node.conflist"): `{
  "cniVersion": "1.0.0",
  "name": "e2e-node",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "` + filepath.Join(n.scratch, "cni/networks") + `", "ranges": [[{"subnet": "` + podCIDR + `"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`,
		filepath.Join(n.scratch, "kubelet.yaml"): `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "` + n.pki.path("ca.crt") + `"}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
cgroupRoot: /` + n.o.cgroupName + `
# This machine's hierarchy is cgroup v1 where cgroup v2 is not mounted alone;
# kubelet 1.37 runs on it when told to.
failCgroupV1: false
failSwapOn: false
resolvConf: "` + filepath.Join(n.scratch, "resolv.conf") + `"
clusterDomain: cluster.local
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
# A build machine's disk is often most of the way full: no eviction and no
# image garbage collection for it in a run of minutes.
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
`,
		filepath.Join(n.scratch, "kube-proxy.yaml"): `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: "` + n.pki.path("kube-proxy.kubeconfig") + `"}
mode: iptables
clusterCIDR: ` + podCIDR + `
hostnameOverride: ` + nodeName + `
bindAddress: ` + nodeIP + `
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
# Zero leaves the kernel's connection-tracking settings alone: the table's
# size is not the network namespace's own.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
`,
	}
	for path, content := range files {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}
