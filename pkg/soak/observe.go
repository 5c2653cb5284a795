package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/tessera-gpu/tessera/pkg/agent/deviceplugin"
	"github.com/tessera-gpu/tessera/pkg/inventory"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
	"github.com/tessera-gpu/tessera/pkg/preemption"
)

// NodeAccess is where a node's kubelet and agent can be read: kubelet's
// pod-resources socket and the directory of the agent's CDI specs.
type NodeAccess struct {
	Name, PodResourcesSocket, CDIDir string
}

// observer reads States.
type observer struct {
	client kubernetes.Interface
	ns     string
	nodes  []NodeAccess
	conns  map[string]podresourcesapi.PodResourcesListerClient
	closer []*grpc.ClientConn
}

func newObserver(client kubernetes.Interface, ns string, nodes []NodeAccess) (*observer, error) {
	o := &observer{client: client, ns: ns, nodes: nodes, conns: map[string]podresourcesapi.PodResourcesListerClient{}}
	for _, n := range nodes {
		conn, err := grpc.NewClient("unix://"+n.PodResourcesSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			o.close()
			return nil, err
		}
		o.closer = append(o.closer, conn)
		o.conns[n.Name] = podresourcesapi.NewPodResourcesListerClient(conn)
	}
	return o, nil
}

func (o *observer) close() {
	for _, c := range o.closer {
		_ = c.Close()
	}
}

// observe reads the cluster once.
func (o *observer) observe(ctx context.Context) (State, error) {
	s := State{At: time.Now()}
	pods, err := o.client.CoreV1().Pods(o.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return s, fmt.Errorf("listing pods: %w", err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if !podgpu.WantsGPU(p) {
			continue
		}
		ps := PodState{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID), Node: p.Spec.NodeName,
			Phase: string(p.Status.Phase), Deleting: p.DeletionTimestamp != nil, Created: p.CreationTimestamp.Time,
			Victim: preemption.IsVictim(p)}
		if ps.Phase == "" {
			ps.Phase = string(v1.PodPending)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodScheduled {
				if c.Status == v1.ConditionTrue {
					ps.Bound = c.LastTransitionTime.Time
				} else {
					ps.PendingReason = c.Message
				}
			}
		}
		if a, err := podgpu.BoundAssignment(p); err == nil && a != nil {
			ps.Assignment = a
			if ps.Bound.IsZero() {
				ps.Bound = s.At
			}
		}
		s.Pods = append(s.Pods, ps)
	}
	var errs []error
	for _, n := range o.nodes {
		ns := NodeState{Name: n.Name, Slots: map[string][]string{}, Visible: map[string]string{}}
		node, err := o.client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err == nil {
			ns.Inventory, _ = inventory.FromNode(node)
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := o.conns[n.Name].List(cctx, &podresourcesapi.ListPodResourcesRequest{})
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("node %s: pod resources: %w", n.Name, err))
		}
		for _, pr := range resp.GetPodResources() {
			if pr.GetNamespace() != o.ns {
				continue
			}
			for _, c := range pr.GetContainers() {
				for _, d := range c.GetDevices() {
					if d.GetResourceName() != deviceplugin.ResourceName {
						continue
					}
					key := pr.GetNamespace() + "/" + pr.GetName() + "/" + c.GetName()
					ns.Slots[key] = append(ns.Slots[key], d.GetDeviceIds()...)
					for _, slot := range d.GetDeviceIds() {
						if v, ok := visible(n.CDIDir, slot); ok {
							ns.Visible[slot] = v
						}
					}
				}
			}
		}
		s.Nodes = append(s.Nodes, ns)
	}
	return s, errors.Join(errs...)
}

// visible reads NVIDIA_VISIBLE_DEVICES from a slot's CDI spec.
func visible(dir, slot string) (string, bool) {
	b, err := os.ReadFile(deviceplugin.SpecPath(dir, slot))
	if err != nil {
		return "", false
	}
	var spec struct {
		Devices []struct {
			ContainerEdits struct {
				Env []string `json:"env"`
			} `json:"containerEdits"`
		} `json:"devices"`
	}
	if json.Unmarshal(b, &spec) != nil || len(spec.Devices) != 1 {
		return "", true // a spec that is not one slot's: shows nothing right
	}
	for _, kv := range spec.Devices[0].ContainerEdits.Env {
		if v, ok := strings.CutPrefix(kv, "NVIDIA_VISIBLE_DEVICES="); ok {
			return v, true
		}
	}
	return "", true
}

// leftoverSpecs lists the CDI spec files in dir.
func leftoverSpecs(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var out []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".json") {
			out = append(out, e.Name())
		}
	}
	return out
}
