package deviceplugin_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"

	"github.com/tessera-gpu/tessera/pkg/agent/deviceplugin"
)

// minimalResource is the baseline plugin's resource.
const minimalResource = "example.com/minimal"

// minimalPlugin is the least a device plugin can be: 64 devices, an empty
// Allocate answer, no preferred allocation, no PreStartContainer. Kubelet's
// device manager spends on it what it spends on any plugin (its gRPC calls,
// its checkpoint), so it is the floor Tessera's plugin is measured against.
type minimalPlugin struct {
	pluginapi.UnimplementedDevicePluginServer
}

func (minimalPlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (minimalPlugin) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	var devs []*pluginapi.Device
	for i := range 64 {
		devs = append(devs, &pluginapi.Device{ID: fmt.Sprintf("m%02d", i), Health: pluginapi.Healthy})
	}
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

func (minimalPlugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{})
	}
	return resp, nil
}

// serveMinimal serves and registers the baseline plugin in dir.
func serveMinimal(b *testing.B, ctx context.Context, dir string) {
	b.Helper()
	sock := filepath.Join(dir, "minimal.sock")
	_ = os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, minimalPlugin{})
	go func() { _ = srv.Serve(l) }()
	b.Cleanup(func() { srv.Stop(); _ = os.Remove(sock) })
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "kubelet.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	if _, err := pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: filepath.Base(sock), ResourceName: minimalResource, Options: &pluginapi.DevicePluginOptions{},
	}); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkAllocateThroughDeviceManager measures Allocate as kubelet sees
// it — its device manager's Allocate for one container, which calls the
// plugin's GetPreferredAllocation and Allocate and writes kubelet's
// checkpoint — for Tessera's plugin and for the minimal baseline plugin,
// interleaved in one run so that the machine's noise falls on both alike.
// Each side keeps 40 pods holding slots, as a busy node would, releasing
// the oldest before the next. It reports each side's p50 and p99 (µs) and
// their p99 ratio (Tessera ÷ baseline).
func BenchmarkAllocateThroughDeviceManager(b *testing.B) {
	dir := kubeletDir(b)
	logger := klog.Background()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	k := startKubelet(b, logger)
	defer func() { _ = k.m.Stop(logger) }()

	p := deviceplugin.New(deviceplugin.Config{Node: node, Holder: k, Pods: k.get, CDIDir: b.TempDir()})
	p.SetGPUs(gpus(func(int) bool { return true }))
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(ctx, dir, 50*time.Millisecond) }()
	defer func() { cancel(); <-done }()
	serveMinimal(b, ctx, dir)
	k.waitAllocatable(64)
	k.waitAllocatableOf(minimalResource, 64)

	const live = 40
	var held []types.UID
	pod := func(i int, res string) *v1.Pod {
		p := gpuPod(b, i, assignment(i%live))
		p.Name = fmt.Sprintf("%s-%d", filepath.Base(res), i)
		p.UID = types.UID(p.Name)
		p.Spec.Containers[0].Resources.Limits = v1.ResourceList{v1.ResourceName(res): *resource.NewQuantity(1, resource.DecimalSI)}
		p.CreationTimestamp = metav1.Now()
		return p
	}
	allocate := func(p *v1.Pod) time.Duration {
		if len(held) >= live {
			k.forget(held[0])
			held = held[1:]
		}
		k.admit(p)
		held = append(held, p.UID)
		t0 := time.Now()
		if err := k.m.Allocate(ctx, p, &p.Spec.Containers[0], lifecycle.AddOperation); err != nil {
			b.Fatalf("%s: Allocate: %v", p.Name, err)
		}
		return time.Since(t0)
	}
	ours := make([]time.Duration, 0, b.N)
	base := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ours = append(ours, allocate(pod(i, deviceplugin.ResourceName)))
		base = append(base, allocate(pod(i, minimalResource)))
	}
	b.StopTimer()
	q := func(d []time.Duration, f float64) float64 {
		slices.Sort(d)
		return float64(d[int(f*float64(len(d)-1))].Microseconds())
	}
	b.ReportMetric(q(ours, 0.5), "tessera-p50-µs")
	b.ReportMetric(q(ours, 0.99), "tessera-p99-µs")
	b.ReportMetric(q(base, 0.5), "baseline-p50-µs")
	b.ReportMetric(q(base, 0.99), "baseline-p99-µs")
	b.ReportMetric(q(ours, 0.99)/q(base, 0.99), "p99-ratio")
}
