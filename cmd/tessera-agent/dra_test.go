package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/tessera-gpu/tessera/internal/apiservertest"
	"github.com/tessera-gpu/tessera/pkg/agent/dra"
	"github.com/tessera-gpu/tessera/pkg/nvml/nvmltest"
	"github.com/tessera-gpu/tessera/pkg/playground"
)

// TestDRAFlags runs the agent with the arguments and configuration the
// chart renders for an operator who allows no memory oversubscription,
// with --dra=always and the two kubelet directories given by flag, on a
// mock DGX H100 against a real API server (in-process): the driver's
// socket is in --dra-plugin-dir, its registration socket in
// --plugin-registry-dir answers kubelet's plugin watcher with that socket
// and the DRA service, and the node's ResourceSlice holds its eight GPUs,
// each offering its own 80 GiB of memory (the agent's default, 1.5, would
// offer 120 GiB: claims past what the operator allows). Every host path it
// would default to is a scratch one.
func TestDRAFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	cfg := apiservertest.Start(t)
	client := kubernetes.NewForConfigOrDie(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := client.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	if err := playground.WriteKubeconfig(cfg, kc); err != nil {
		t.Fatal(err)
	}
	defer func(f func() gonvml.Interface) { newNVML = f }(newNVML)
	newNVML = func() gonvml.Interface {
		s := dgxh100.New()
		nvmltest.Install(s, func(int) *nvmltest.Reading { return &nvmltest.Reading{SMCount: 132} })
		// No XID stream on this mock: the agent keeps polling health.
		s.EventSetCreateFunc = func() (gonvml.EventSet, gonvml.Return) { return nil, gonvml.ERROR_NOT_SUPPORTED }
		return s
	}
	// Unix sockets want short paths.
	sockets, err := os.MkdirTemp("", "agent")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sockets)
	pluginDir, registryDir := filepath.Join(sockets, "dra"), filepath.Join(sockets, "reg")
	if err := os.MkdirAll(registryDir, 0o755); err != nil {
		t.Fatal(err)
	}
	args := append(chartAgent(t, "{scheduler: {memoryOversubscription: 1.0}, agent: {mps: false}}", dir), "--node", "n1", "--kubeconfig", kc, "--metrics-addr", "127.0.0.1:0", "--cgroup-root=", "--driver-root=", "--host-root=",
		"--device-plugin-dir", filepath.Join(sockets, "dp"), "--pod-resources-socket", filepath.Join(sockets, "pr.sock"), "--cdi-dir", filepath.Join(dir, "cdi"),
		"--mps-root", filepath.Join(dir, "mps"), "--preemption-dir", filepath.Join(dir, "preemption"), "--shim-dir=",
		"--dra=always", "--dra-plugin-dir", pluginDir, "--plugin-registry-dir", registryDir,
		// The mock's GPUs are time-shared: the host's nvidia-smi, on a GPU
		// node, is not run for them; and no host process is looked at.
		"--nvidia-smi", filepath.Join(dir, "no-nvidia-smi"), "--proc", filepath.Join(dir, "proc"))
	var errOut bytes.Buffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, &errOut) }()

	var registration string
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		select {
		case code := <-done:
			return false, fmt.Errorf("the agent exited %d: %s", code, errOut.String())
		default:
		}
		entries, _ := os.ReadDir(registryDir)
		for _, e := range entries {
			if strings.HasSuffix(e.Name(), ".sock") {
				registration = filepath.Join(registryDir, e.Name())
			}
		}
		_, err := os.Stat(dra.SocketPath(pluginDir))
		return registration != "" && err == nil, nil
	}); err != nil {
		t.Fatalf("no driver socket in --dra-plugin-dir and registration socket in --plugin-registry-dir: %v", err)
	}
	// What kubelet's plugin watcher asks the registration socket.
	conn, err := grpc.NewClient("unix://"+registration, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	info, err := registerapi.NewRegistrationClient(conn).GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != registerapi.DRAPlugin || info.Name != dra.DriverName || info.Endpoint != dra.SocketPath(pluginDir) {
		t.Errorf("registration: %+v; want the DRA plugin %s at %s", info, dra.DriverName, dra.SocketPath(pluginDir))
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) != 1 || l.Items[0].Spec.NodeName == nil || *l.Items[0].Spec.NodeName != "n1" || len(l.Items[0].Spec.Devices) != 8 {
			return false, nil
		}
		for _, d := range l.Items[0].Spec.Devices {
			if m := d.Capacity[dra.CapacityMemory]; m.Value.String() != "80Gi" {
				t.Errorf("device %s offers %s of memory, want its own 80Gi (memoryOversubscription 1.0)", d.Name, m.Value.String())
			}
		}
		return true, nil
	}); err != nil {
		t.Fatalf("no ResourceSlice of n1's eight GPUs: %v", err)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("the agent exited %d when stopped: %s", code, errOut.String())
	}
}
