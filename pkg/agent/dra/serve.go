package dra

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// DefaultPluginDir is where kubelet looks for the driver's socket, and
// where the driver keeps its checkpoint (a host directory that outlives
// the agent's pod).
var DefaultPluginDir = filepath.Join(kubeletplugin.KubeletPluginsDir, DriverName)

// DefaultRegistryDir is kubelet's plugin registration directory.
const DefaultRegistryDir = kubeletplugin.KubeletRegistryDir

// ServeOptions say where kubelet finds the driver and what it publishes.
type ServeOptions struct {
	Client kubernetes.Interface
	// PluginDir holds the driver's socket (DefaultPluginDir on a node).
	PluginDir string
	// RegistryDir is kubelet's registration directory; empty registers
	// nothing (a test registers the socket with kubelet's DRA manager
	// itself).
	RegistryDir string
	Policy      Policy
}

// Server is the driver serving kubelet and publishing the node's
// ResourceSlice.
type Server struct {
	driver *Driver
	helper *kubeletplugin.Helper
	policy Policy

	// healthMu guards health, the GPUs' health as last published: the
	// health watch is woken only when it changes (Publish also runs
	// every few seconds for what the device plugin's pods hold).
	healthMu sync.Mutex
	health   string
}

// Serve starts the driver's gRPC services (and kubelet's registration,
// unless RegistryDir is empty). The ResourceSlice is published at the
// first Publish.
func Serve(ctx context.Context, d *Driver, o ServeOptions) (*Server, error) {
	if o.Client == nil {
		return nil, errors.New("DRA driver: an API server client is required to publish the node's ResourceSlice")
	}
	if o.PluginDir == "" {
		o.PluginDir = DefaultPluginDir
	}
	// The helper listens there but does not make it.
	if err := os.MkdirAll(o.PluginDir, 0o750); err != nil {
		return nil, fmt.Errorf("DRA driver %s: plugin directory: %w", DriverName, err)
	}
	opts := []kubeletplugin.Option{
		kubeletplugin.DriverName(DriverName),
		kubeletplugin.KubeClient(o.Client),
		kubeletplugin.NodeName(d.cfg.Node),
		kubeletplugin.PluginDataDirectoryPath(o.PluginDir),
		kubeletplugin.GRPCVerbosity(5),
	}
	if o.RegistryDir == "" {
		opts = append(opts, kubeletplugin.RegistrationService(false))
	} else {
		opts = append(opts, kubeletplugin.RegistrarDirectoryPath(o.RegistryDir))
	}
	h, err := kubeletplugin.Start(ctx, d, opts...)
	if err != nil {
		return nil, fmt.Errorf("DRA driver %s: %w", DriverName, err)
	}
	klog.FromContext(ctx).Info("DRA driver serving kubelet", "driver", DriverName, "socket", SocketPath(o.PluginDir), "registry", o.RegistryDir)
	return &Server{driver: d, helper: h, policy: o.Policy}, nil
}

// SocketPath is the driver's socket in pluginDir, as kubeletplugin names
// it.
func SocketPath(pluginDir string) string { return filepath.Join(pluginDir, "dra.sock") }

// Publish replaces the node's ResourceSlice with inv's GPUs, less what
// held says the device plugin's pods hold (a fault taints a GPU at once, a
// recovery lifts it, a new slice count changes its slices), and tells
// kubelet's health watch when a GPU's health changed. Publishing what was
// published changes nothing.
func (s *Server) Publish(ctx context.Context, inv *gpu.NodeInventory, held map[string]Held) error {
	if err := s.helper.PublishResources(ctx, Resources(inv, s.policy, held)); err != nil {
		return err
	}
	var health strings.Builder
	for _, g := range inv.GPUs {
		fmt.Fprintf(&health, "%d:%t ", g.Index, g.Healthy)
	}
	s.healthMu.Lock()
	changed := health.String() != s.health
	s.health = health.String()
	s.healthMu.Unlock()
	if changed {
		s.driver.InventoryChanged()
	}
	return nil
}

// Stop stops serving kubelet. The ResourceSlice stays: kubelet removes a
// driver's slices when it stays away.
func (s *Server) Stop() { s.helper.Stop() }

// NodeLabel marks, with "true", a node whose agent serves its GPUs through
// this driver when it runs with --dra=node-label.
const NodeLabel = "tessera.dev/dra"
