package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// SocketPrefix starts the name of the plugin's socket in kubelet's
// device-plugin directory. Each start uses a new name: kubelet keeps a
// plugin's endpoint until its old connection notices the plugin left, and
// refuses a registration on the same path until then ("device plugin already
// connected") — with a fresh name the agent's restart is not at that mercy.
const SocketPrefix = "tessera-gpu-"

// Run serves the plugin in dir (pluginapi.DevicePluginPath on a node) and
// registers it with the kubelet socket there, until ctx ends. When kubelet
// restarts — its socket is created anew, and it wipes the directory — Run
// serves on a fresh socket and registers again within checkEvery.
func (p *Plugin) Run(ctx context.Context, dir string, checkEvery time.Duration) error {
	logger := klog.FromContext(ctx)
	kubelet := filepath.Join(dir, filepath.Base(pluginapi.KubeletSocket))
	var (
		srv  *grpc.Server
		seen os.FileInfo
	)
	stop := func() {
		if srv != nil {
			srv.Stop()
			srv = nil
		}
	}
	defer stop()
	tick := time.NewTicker(checkEvery)
	defer tick.Stop()
	for {
		fi, err := os.Stat(kubelet)
		switch {
		case err != nil:
			if seen != nil {
				logger.Info("Kubelet's device-plugin socket is gone; waiting for it", "socket", kubelet)
				seen = nil
				stop()
			}
		case seen == nil || !os.SameFile(seen, fi) || !fi.ModTime().Equal(seen.ModTime()):
			stop()
			s, endpoint, err := p.serve(dir)
			if err != nil {
				return err
			}
			srv = s
			if err := register(ctx, kubelet, endpoint); err != nil {
				// Kubelet may still be starting; the next tick retries.
				logger.Error(err, "Registering with kubelet failed; retrying", "socket", kubelet)
				stop()
				break
			}
			seen = fi
			logger.Info("Registered with kubelet", "resource", ResourceName, "socket", filepath.Join(dir, endpoint))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// serve listens on a fresh plugin socket in dir, after removing the sockets
// of earlier starts, and returns the socket's name.
func (p *Plugin) serve(dir string) (*grpc.Server, string, error) {
	old, _ := filepath.Glob(filepath.Join(dir, SocketPrefix+"*.sock"))
	for _, o := range old {
		if err := os.Remove(o); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, "", fmt.Errorf("remove stale plugin socket: %w", err)
		}
	}
	name := fmt.Sprintf("%s%d.sock", SocketPrefix, time.Now().UnixNano())
	path := filepath.Join(dir, name)
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, "", fmt.Errorf("listen on %s: %w", path, err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() { _ = srv.Serve(l) }()
	return srv, name, nil
}

func register(ctx context.Context, kubeletSocket, endpoint string) error {
	conn, err := grpc.NewClient("unix://"+kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: endpoint, ResourceName: ResourceName, Options: Options(),
	})
	return err
}
