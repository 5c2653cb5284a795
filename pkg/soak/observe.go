package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/tessera-gpu/tessera/pkg/agent/deviceplugin"
	"github.com/tessera-gpu/tessera/pkg/gpu"
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
	// claims: the cluster has DRA nodes; their claims and claim specs are
	// read too.
	claims bool
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
		if !podgpu.WantsGPU(p) && len(p.Spec.ResourceClaims) == 0 {
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
		for j := range p.Spec.ResourceClaims {
			if name, _, err := resourceclaim.Name(p, &p.Spec.ResourceClaims[j]); err == nil && name != nil {
				ps.ClaimNames = append(ps.ClaimNames, *name)
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
	var claims *resourceapi.ResourceClaimList
	if o.claims {
		if claims, err = o.client.ResourceV1().ResourceClaims(o.ns).List(ctx, metav1.ListOptions{}); err != nil {
			errs = append(errs, fmt.Errorf("listing claims: %w", err))
		}
	}
	for _, n := range o.nodes {
		ns := NodeState{Name: n.Name, Slots: map[string][]string{}, Visible: map[string]string{}, ClaimVisible: map[string]string{}}
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
		if o.claims {
			for _, f := range leftoverSpecs(n.CDIDir) {
				if uid, ok := strings.CutPrefix(strings.TrimSuffix(f, ".json"), "tessera-claim-"); ok {
					ns.ClaimVisible[uid], _ = visibleIn(filepath.Join(n.CDIDir, f))
				}
			}
		}
		s.Nodes = append(s.Nodes, ns)
	}
	if claims != nil {
		claimAssignments(&s, claims.Items)
		// The pods were listed before the claim specs were read: a pod
		// that ended meanwhile had its claims unprepared. Those still
		// running in a list taken after the reads are the ones whose
		// specs must be there.
		if after, err := o.client.CoreV1().Pods(o.ns).List(ctx, metav1.ListOptions{}); err != nil {
			errs = append(errs, fmt.Errorf("listing pods: %w", err))
		} else {
			still := map[string]bool{}
			for i := range after.Items {
				if p := &after.Items[i]; p.Status.Phase == v1.PodRunning && p.DeletionTimestamp == nil {
					still[string(p.UID)] = true
				}
			}
			for i := range s.Pods {
				s.Pods[i].RunningAfter = still[s.Pods[i].UID]
			}
		}
	}
	return s, errors.Join(errs...)
}

// claimAssignments gives each pod holding gpu.tessera.dev claims the
// assignment its claims' allocations make (gpu.ClaimGrant, as the driver
// prepares them), one container per claim named "claim NAME", on the
// GPUs of the node's inventory; and each claim's GPUs, for its CDI spec.
func claimAssignments(s *State, claims []resourceapi.ResourceClaim) {
	inventories := map[string]*gpu.NodeInventory{}
	for _, n := range s.Nodes {
		inventories[n.Name] = n.Inventory
	}
	byName := map[string]*resourceapi.ResourceClaim{}
	for i := range claims {
		byName[claims[i].Name] = &claims[i]
	}
	for i := range s.Pods {
		p := &s.Pods[i]
		for _, name := range p.ClaimNames {
			c := byName[name]
			if c == nil || c.Status.Allocation == nil || !slices.ContainsFunc(c.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool { return string(r.UID) == p.UID }) {
				continue
			}
			var gpus []string
			for _, r := range c.Status.Allocation.Devices.Results {
				inv := inventories[r.Pool]
				index, ok := gpu.DRADeviceIndex(r.Device)
				if r.Driver != gpu.DRADriver || inv == nil || !ok {
					continue
				}
				pos := slices.IndexFunc(inv.GPUs, func(d gpu.Device) bool { return d.Index == index })
				if pos < 0 {
					continue
				}
				d := &inv.GPUs[pos]
				mem, cores := r.ConsumedCapacity[gpu.DRAMemory], r.ConsumedCapacity[gpu.DRACores]
				mode, grant := gpu.ClaimGrant(*d, gpu.MiBUp(mem.Value()), cores.Value())
				if p.Assignment == nil {
					p.Assignment = &gpu.PodAssignment{Node: r.Pool}
				}
				p.Assignment.Containers = append(p.Assignment.Containers, gpu.ContainerAssignment{Name: "claim " + name, Mode: mode, GPUs: []gpu.GPUGrant{grant}})
				gpus = append(gpus, grant.UUID)
			}
			if len(gpus) > 0 {
				if p.ClaimGPUs == nil {
					p.ClaimGPUs = map[string]string{}
				}
				p.ClaimGPUs[string(c.UID)] = strings.Join(gpus, ",")
			}
		}
		if p.Assignment != nil && p.Bound.IsZero() {
			p.Bound = s.At
		}
	}
}

// visible reads NVIDIA_VISIBLE_DEVICES from a slot's CDI spec.
func visible(dir, slot string) (string, bool) {
	return visibleIn(deviceplugin.SpecPath(dir, slot))
}

// visibleIn reads NVIDIA_VISIBLE_DEVICES from the CDI spec at path (of
// one device).
func visibleIn(path string) (string, bool) {
	b, err := os.ReadFile(path)
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
