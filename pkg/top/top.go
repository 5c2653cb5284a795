// Package top shows who holds which GPU slice in a cluster: per GPU, its
// mode, slices in use, memory and cores granted, and each pod with its
// grant, from the nodes' published inventories and the pods' assignments —
// and, where an agent's metrics endpoint is given, what each tenant really
// uses. `tessera top` and the playground's demo print it.
package top

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/pkg/agentendpoint"
	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/inventory"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
	"github.com/tessera-gpu/tessera/pkg/preemption"
)

// Tenant is one container's grant on one GPU.
type Tenant struct {
	Namespace    string          `json:"namespace"`
	Pod          string          `json:"pod"`
	Container    string          `json:"container"`
	Priority     int32           `json:"priority"`
	Mode         gpu.SharingMode `json:"mode"`
	MemoryMiB    int64           `json:"memoryMiB"`
	CoresPercent int             `json:"coresPercent"`
	// State is the pod's phase, Terminating, Preempting (it holds a
	// preemption notice), or NotStarted (bound with its slices booked, no
	// container started yet), with the reason a container waits.
	State string `json:"state"`
	// Isolation is what holds the slice, per dimension, by the GPU's offer
	// in its agent's inventory and the rule the agent applies
	// (gpu.GuaranteeOf): device, kernel, mps-server, shim, mps-client or
	// none.
	Isolation gpu.Guarantee `json:"isolation"`
	grant     gpu.GPUGrant
	// recorded is what the agent recorded on the pod when the container
	// started (its GPUIsolation condition), when it did.
	recorded *gpu.Guarantee
	// Claim names the tenant's DRA ResourceClaim (driver gpu.tessera.dev)
	// when it holds the GPU through one; Pod is then the pod the claim is
	// reserved for, if any, and Container is empty: every container the
	// claim is given shares its slice.
	Claim string `json:"claim,omitempty"`
	// claimPods is how many pods the claim is reserved for: the kernel's
	// memory limits hold a claim of one pod only (gpu.ClaimOffer).
	claimPods int
	// Live usage, when an agent reported it.
	Live          bool    `json:"live"`
	UsedMiB       int64   `json:"usedMiB,omitempty"`
	SMUtilization float64 `json:"smUtilization,omitempty"`
}

// GPU is one GPU and its tenants.
type GPU struct {
	Node      string `json:"node"`
	Index     int    `json:"index"`
	UUID      string `json:"uuid"`
	Model     string `json:"model"`
	MemoryMiB int64  `json:"memoryMiB"`
	Healthy   bool   `json:"healthy"`
	// Cordoned: its node takes no new pods (kubectl cordon, or drained).
	Cordoned bool `json:"cordoned,omitempty"`
	Slices   int  `json:"slices,omitempty"`
	// MPS: the GPU runs MPS (its agent's inventory says so); the agent
	// keeps it in exclusive-process mode, where no tenant can time-slice.
	MPS     bool     `json:"mps"`
	Tenants []Tenant `json:"tenants"`
	// Offer is what the GPU's driver offers to hold slices, from the
	// agent's inventory.
	Offer gpu.IsolationOffer `json:"offer"`
}

// Mode is the GPU's sharing mode: "free" without tenants, "exclusive" when a
// tenant holds it whole, else the mode the GPU runs (its inventory's, never
// guessed from a tenant's record).
func (g GPU) Mode() string {
	if len(g.Tenants) == 0 {
		return "free"
	}
	for _, t := range g.Tenants {
		if t.Mode == gpu.ModeExclusive {
			return string(gpu.ModeExclusive)
		}
	}
	if g.MPS {
		return string(gpu.ModeMPS)
	}
	return string(gpu.ModeTimeSlicing)
}

// maxOversubscription is the most memory oversubscription any
// configuration allows (allocator.memoryOversubscription ≤ 1.5).
const maxOversubscription = 1.5

// memory is the MEMORY column: granted/capacity, and the oversubscription
// factor when the grants exceed the GPU's memory, said to be within what a
// configuration may allow or over it.
func (g GPU) memory() string {
	granted := g.GrantedMiB()
	out := fmt.Sprintf("%d/%d", granted, g.MemoryMiB)
	if g.MemoryMiB <= 0 || granted <= g.MemoryMiB {
		return out
	}
	f := float64(granted) / float64(g.MemoryMiB)
	if f <= maxOversubscription {
		return out + fmt.Sprintf(" (%.2f× oversubscribed)", f)
	}
	return out + fmt.Sprintf(" (%.2f×, OVER the %.1f× limit)", f, maxOversubscription)
}

// GrantedMiB and GrantedCores sum the tenants' grants.
func (g GPU) GrantedMiB() int64 {
	var s int64
	for _, t := range g.Tenants {
		s += t.MemoryMiB
	}
	return s
}

// GrantedCores is the percent of the GPU's SMs granted.
func (g GPU) GrantedCores() int {
	s := 0
	for _, t := range g.Tenants {
		s += t.CoresPercent
	}
	return s
}

// Snapshot is the cluster's GPUs, ordered by node and index.
type Snapshot struct {
	GPUs []GPU `json:"gpus"`
	// Pending counts GPU pods not yet placed.
	Pending int `json:"pending"`
	// NotStarted counts pods holding slices whose containers never started.
	NotStarted int `json:"notStarted"`
	// Unreadable lists the nodes whose inventory annotation could not be
	// read, with why: their GPUs are unknown, not absent.
	Unreadable []string `json:"unreadable,omitempty"`
	// Held lists pods bound to a node without a Tessera assignment that
	// hold its device-plugin slots (the agent refuses them their GPUs;
	// kubelet keeps their slots until they are deleted).
	Held []string `json:"held,omitempty"`
	// PendingPods are the GPU pods not yet placed, with the scheduler's
	// last word on each (Pending counts them).
	PendingPods []PendingPod `json:"pendingPods,omitempty"`
	// Fragmentation is the free GPU compute and what of it the cluster's
	// typical and waiting GPU pods cannot use.
	Fragmentation Fragmentation `json:"fragmentation"`
	// ClaimsUnreadable says why the DRA claims could not be listed (their
	// tenants are then missing), empty when they were.
	ClaimsUnreadable string `json:"claimsUnreadable,omitempty"`
}

// PendingPod is a GPU pod not yet placed.
type PendingPod struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Reason is the scheduler's message on the pod's PodScheduled
	// condition ("0/4 nodes are available: …"), empty before its first
	// attempt.
	Reason string      `json:"reason"`
	Since  metav1.Time `json:"since"`
}

// Collect reads the inventories and the pods' assignments.
func Collect(ctx context.Context, client kubernetes.Interface) (*Snapshot, error) {
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	pods, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	snap := &Snapshot{}
	byUUID := map[string]int{}
	var invs []*gpu.NodeInventory
	placed := map[string][]placedPod{}
	var requests []*allocator.Request
	minSlice := config.Default().Allocator.MinSliceMiB
	for i := range nodes.Items {
		inv, err := inventory.FromNode(&nodes.Items[i])
		if err != nil {
			snap.Unreadable = append(snap.Unreadable, fmt.Sprintf("%s: GPU inventory (%s) unreadable: %v", nodes.Items[i].Name, gpu.AnnotationInventory, err))
			continue
		}
		if inv == nil {
			continue
		}
		invs = append(invs, inv)
		for _, d := range inv.GPUs {
			byUUID[d.UUID] = len(snap.GPUs)
			snap.GPUs = append(snap.GPUs, GPU{Node: inv.Node, Index: d.Index, UUID: d.UUID, Model: d.Model,
				MemoryMiB: d.MemoryMiB, Healthy: d.Healthy, Cordoned: nodes.Items[i].Spec.Unschedulable,
				Slices: d.Slices, MPS: d.MPSCapable, Offer: d.Offer()})
		}
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if !podgpu.WantsGPU(p) || podgpu.Finished(p) {
			continue
		}
		req, reqErr := podgpu.Request(p, minSlice)
		if reqErr == nil {
			requests = append(requests, req)
		}
		a, err := podgpu.BoundAssignment(p)
		if err != nil || a == nil {
			if p.Spec.NodeName == "" {
				snap.Pending++
				pp := PendingPod{Namespace: p.Namespace, Name: p.Name, Since: p.CreationTimestamp}
				for _, c := range p.Status.Conditions {
					if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse {
						pp.Reason = c.Message
					}
				}
				if reqErr != nil && pp.Reason == "" {
					pp.Reason = reqErr.Error()
				}
				snap.PendingPods = append(snap.PendingPods, pp)
			} else if n := podgpu.Slots(p); n > 0 {
				snap.Held = append(snap.Held, fmt.Sprintf("%s/%s holds %d GPU slot(s) of %s without a Tessera assignment; kubelet gives them to no other pod until it is deleted",
					p.Namespace, p.Name, n, p.Spec.NodeName))
			}
			continue
		}
		if reqErr == nil {
			placed[a.Node] = append(placed[a.Node], placedPod{assignment: a, cpuMilli: req.CPUMilli, memMiB: req.MemoryMiB})
		}
		state := string(p.Status.Phase)
		switch {
		case p.DeletionTimestamp != nil:
			state = "Terminating"
		case preemption.IsVictim(p):
			state = "Preempting"
		case p.Status.Phase == v1.PodPending || p.Status.Phase == "":
			state = "NotStarted"
			for _, cs := range p.Status.ContainerStatuses {
				if cs.State.Waiting != nil && cs.State.Waiting.Reason != "" {
					state += " (" + cs.State.Waiting.Reason + ")"
					break
				}
			}
			snap.NotStarted++
		}
		var prio int32
		if p.Spec.Priority != nil {
			prio = *p.Spec.Priority
		}
		var recorded []gpu.SliceGuarantee
		for _, c := range p.Status.Conditions {
			if c.Type == gpu.ConditionIsolation {
				recorded, _ = gpu.ParseSliceGuarantees(c.Message)
			}
		}
		for _, c := range a.Containers {
			for _, g := range c.GPUs {
				i, ok := byUUID[g.UUID]
				if !ok {
					continue
				}
				mem, cores := g.MemoryMiB, g.CoresPercent()
				if c.Mode == gpu.ModeExclusive {
					mem, cores = snap.GPUs[i].MemoryMiB, 100
				}
				t := Tenant{Namespace: p.Namespace, Pod: p.Name, Container: c.Name,
					Priority: prio, Mode: c.Mode, MemoryMiB: mem, CoresPercent: cores, State: state, grant: g}
				for _, r := range recorded {
					if r.Container == c.Name && r.GPU == g.UUID {
						t.recorded = &r.Guarantee
					}
				}
				snap.GPUs[i].Tenants = append(snap.GPUs[i].Tenants, t)
			}
		}
	}
	addClaims(ctx, client, snap, pods.Items, placed)
	snap.Fragmentation = measureFragmentation(invs, placed, requests)
	sort.Slice(snap.PendingPods, func(i, j int) bool {
		a, b := snap.PendingPods[i], snap.PendingPods[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Name < b.Name
	})
	sort.Slice(snap.GPUs, func(i, j int) bool {
		a, b := snap.GPUs[i], snap.GPUs[j]
		if a.Node != b.Node {
			return nodeLess(a.Node, b.Node)
		}
		return a.Index < b.Index
	})
	for i := range snap.GPUs {
		setIsolation(&snap.GPUs[i])
		ts := snap.GPUs[i].Tenants
		sort.Slice(ts, func(a, b int) bool {
			if ts[a].Namespace != ts[b].Namespace {
				return ts[a].Namespace < ts[b].Namespace
			}
			if ts[a].Pod != ts[b].Pod {
				return ts[a].Pod < ts[b].Pod
			}
			return ts[a].Container < ts[b].Container
		})
	}
	return snap, nil
}

// setIsolation fills each tenant's guarantee: what its agent recorded on
// the pod when the container started, else the agent's rule on the GPU's
// offer. An MPS slice depends on the server's limits when its client
// connected, which only the agent knows: without its record, it is taken
// to have connected under the whole GPU's.
func setIsolation(g *GPU) {
	for i := range g.Tenants {
		t := &g.Tenants[i]
		if t.recorded != nil {
			t.Isolation = *t.recorded
			continue
		}
		offer := g.Offer
		if t.Claim != "" {
			offer = gpu.ClaimOffer(offer, t.claimPods)
		}
		t.Isolation = gpu.GuaranteeOf(t.Mode, t.grant, offer, gpu.MPSServerLimits{ThreadPercent: 100})
	}
}

// addClaims adds the tenants of allocated gpu.tessera.dev ResourceClaims
// to their GPUs (pool = node, device = gpu-<index>), and books them for
// the fragmentation. A cluster without the resource.k8s.io API has none; a
// list refused is said (ClaimsUnreadable), not taken for none.
func addClaims(ctx context.Context, client kubernetes.Interface, snap *Snapshot, pods []v1.Pod, placed map[string][]placedPod) {
	claims, err := client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return
	case err != nil:
		snap.ClaimsUnreadable = fmt.Sprintf("ResourceClaims could not be listed (%v): GPUs held through %s claims look free here", err, gpu.DRADriver)
		return
	}
	at := map[string]int{} // node/index → snap.GPUs
	for i, g := range snap.GPUs {
		at[g.Node+"/"+strconv.Itoa(g.Index)] = i
	}
	phase := map[string]string{}
	for i := range pods {
		phase[pods[i].Namespace+"/"+pods[i].Name] = string(pods[i].Status.Phase)
	}
	for i := range claims.Items {
		c := &claims.Items[i]
		if c.Status.Allocation == nil {
			continue
		}
		pod, state, pods := "-", "Allocated", 0
		for _, r := range c.Status.ReservedFor {
			if r.Resource != "pods" {
				continue
			}
			if pods++; pods == 1 {
				pod, state = r.Name, "Reserved" // for a pod this look did not find
				if ph, ok := phase[c.Namespace+"/"+r.Name]; ok {
					state = ph
				}
			}
		}
		if c.DeletionTimestamp != nil {
			state = "Terminating"
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			index, ok := gpu.DRADeviceIndex(r.Device)
			if r.Driver != gpu.DRADriver || !ok {
				continue
			}
			gi, ok := at[r.Pool+"/"+strconv.Itoa(index)]
			if !ok {
				continue
			}
			g := &snap.GPUs[gi]
			mem, cores := r.ConsumedCapacity["memory"], r.ConsumedCapacity["cores"]
			memMiB, pct := (mem.Value()+1<<20-1)>>20, cores.Value()
			if len(r.ConsumedCapacity) == 0 {
				memMiB, pct = g.MemoryMiB, 100 // an allocation without consumable capacity takes the device
			}
			mode, grant := gpu.ClaimGrant(gpu.Device{UUID: g.UUID, Index: g.Index, MemoryMiB: g.MemoryMiB, MPSCapable: g.MPS}, memMiB, pct)
			g.Tenants = append(g.Tenants, Tenant{Namespace: c.Namespace, Pod: pod, Claim: c.Name, Mode: mode, MemoryMiB: grant.MemoryMiB,
				CoresPercent: grant.CoresPercent(), State: state, grant: grant, claimPods: pods})
			placed[g.Node] = append(placed[g.Node], placedPod{assignment: &gpu.PodAssignment{Node: g.Node,
				Containers: []gpu.ContainerAssignment{{Name: "claim-" + c.Name, Mode: mode, GPUs: []gpu.GPUGrant{grant}}}}})
		}
	}
}

// held is the HELD column: memory/compute mechanisms.
func held(g gpu.Guarantee) string {
	if g.Memory == "" {
		return "-"
	}
	return string(g.Memory) + "/" + string(g.Compute)
}

// nodeLess orders names with numbers numerically (gpu-node-2 < gpu-node-10).
func nodeLess(a, b string) bool {
	pa, na := splitNumber(a)
	pb, nb := splitNumber(b)
	if pa != pb || na < 0 || nb < 0 {
		return a < b
	}
	return na < nb
}

func splitNumber(s string) (string, int) {
	i := len(s)
	for i > 0 && s[i-1] >= '0' && s[i-1] <= '9' {
		i--
	}
	n, err := strconv.Atoi(s[i:])
	if err != nil {
		return s, -1
	}
	return s[:i], n
}

// AddUsage scrapes an agent's metrics endpoint and fills in the live usage
// of the tenants it reports.
func (s *Snapshot) AddUsage(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := agentendpoint.FromURL(ctx, http.DefaultClient, url)
	if err != nil {
		return err
	}
	s.addUsageFrom(m.Families)
	return nil
}

// AddUsageFromAgents reads every running agent's metrics through the API
// server's pod proxy, so a kubeconfig is all it needs. It returns how many
// agents answered.
func (s *Snapshot) AddUsageFromAgents(ctx context.Context, client kubernetes.Interface) (int, error) {
	agents, err := agentendpoint.FromPods(ctx, client, agentendpoint.Namespace)
	for _, m := range agents {
		s.addUsageFrom(m.Families)
	}
	return len(agents), err
}

// addUsageFrom merges one agent's metrics.
func (s *Snapshot) addUsageFrom(families map[string]*dto.MetricFamily) {
	type key struct{ uuid, ns, pod, container string }
	mem, sm := map[key]float64{}, map[key]float64{}
	read := func(name string, into map[key]float64) {
		f := families[name]
		if f == nil {
			return
		}
		for _, m := range f.GetMetric() {
			l := agentendpoint.Labels(m)
			into[key{l["UUID"], l["namespace"], l["pod"], l["container"]}] = m.GetGauge().GetValue()
		}
	}
	read("tessera_container_gpu_memory_used_bytes", mem)
	read("tessera_container_gpu_sm_utilization_ratio", sm)
	for i := range s.GPUs {
		for j := range s.GPUs[i].Tenants {
			t := &s.GPUs[i].Tenants[j]
			k := key{s.GPUs[i].UUID, t.Namespace, t.Pod, t.Container}
			if b, ok := mem[k]; ok {
				t.Live, t.UsedMiB, t.SMUtilization = true, int64(b)/(1<<20), sm[k]
			}
		}
	}
}

// Render prints the snapshot: one line per GPU, and one per tenant below
// it.
func Render(w io.Writer, s *Snapshot) error {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tGPU\tMODEL\tMODE\tSLICES\tMEMORY MiB\tCORES\tPOD\tPRIO\tSTATE\tMiB\tCORES\tHELD MEM/SM\tUSED MiB\tSM")
	for i := 0; i < len(s.GPUs); i++ {
		g := s.GPUs[i]
		mode := g.Mode()
		if !g.Healthy {
			mode += " (unhealthy)"
		}
		index := strconv.Itoa(g.Index)
		if free(g) {
			// A run of free GPUs of one node and model is one line.
			j := i
			for j+1 < len(s.GPUs) && free(s.GPUs[j+1]) && s.GPUs[j+1].Node == g.Node && s.GPUs[j+1].Model == g.Model &&
				s.GPUs[j+1].Slices == g.Slices && s.GPUs[j+1].Index == s.GPUs[j].Index+1 {
				j++
			}
			if j > i {
				index = fmt.Sprintf("%d-%d", g.Index, s.GPUs[j].Index)
				i = j
			}
		}
		head := fmt.Sprintf("%s\t%s\t%s\t%s\t%d/%d\t%s\t%d%%", g.Node, index, shortModel(g.Model), mode,
			len(g.Tenants), g.Slices, g.memory(), g.GrantedCores())
		if len(g.Tenants) == 0 {
			fmt.Fprintln(tw, head+"\t-\t\t\t\t\t\t\t")
			continue
		}
		for i, t := range g.Tenants {
			if i > 0 {
				head = "\t\t\t\t\t\t"
			}
			used, sm := "-", "-"
			if t.Live {
				used, sm = strconv.FormatInt(t.UsedMiB, 10), fmt.Sprintf("%.0f%%", 100*t.SMUtilization)
			}
			name := t.Namespace + "/" + t.Pod
			if t.Container != "" {
				name += "/" + t.Container
			}
			if t.Claim != "" {
				name += " (claim " + t.Claim + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%d%%\t%s\t%s\t%s\n", head, name, t.Priority, t.State, t.MemoryMiB, t.CoresPercent, held(t.Isolation), used, sm)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// Lines of free GPUs end in padding for the tenant columns.
	for _, line := range strings.SplitAfter(buf.String(), "\n") {
		if _, err := io.WriteString(w, strings.TrimRight(line, " \n")+strings.Repeat("\n", strings.Count(line, "\n"))); err != nil {
			return err
		}
	}
	noUsage := 0
	for _, g := range s.GPUs {
		for _, t := range g.Tenants {
			if !t.Live {
				noUsage++
			}
		}
	}
	if noUsage > 0 {
		if _, err := fmt.Fprintf(w, "%d tenant(s) without live usage (USED MiB, SM: -): no agent reported them; give the agents' metrics with --metrics, or check that the tessera-agent pods run and the API server's proxy reaches them\n", noUsage); err != nil {
			return err
		}
	}
	for _, h := range s.Held {
		if _, err := fmt.Fprintln(w, h); err != nil {
			return err
		}
	}
	for _, u := range s.Unreadable {
		if _, err := fmt.Fprintf(w, "%s; its GPUs are not shown\n", u); err != nil {
			return err
		}
	}
	if s.ClaimsUnreadable != "" {
		if _, err := fmt.Fprintln(w, s.ClaimsUnreadable); err != nil {
			return err
		}
	}
	if s.NotStarted > 0 {
		if _, err := fmt.Fprintf(w, "%d GPU pod(s) hold slices but have not started (STATE NotStarted)\n", s.NotStarted); err != nil {
			return err
		}
	}
	if s.Pending > 0 {
		_, err := fmt.Fprintf(w, "%d GPU pod(s) waiting for a slice\n", s.Pending)
		return err
	}
	return nil
}

// free is a healthy GPU without tenants.
func free(g GPU) bool { return g.Healthy && len(g.Tenants) == 0 }

// shortModel drops the vendor prefix: "NVIDIA H100 80GB HBM3" → "H100 80GB HBM3".
func shortModel(m string) string { return strings.TrimPrefix(m, "NVIDIA ") }
