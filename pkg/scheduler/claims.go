package scheduler

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// claimPlacer is how TesseraGPU allocates a pod's ResourceClaims in a
// profile whose own DynamicResources plugin is disabled: it runs upstream's
// plugin (inner: the structured allocator, the claim tracker, Reserve's
// pending allocation and PreBind's finalizer, allocation and reservedFor,
// which the built-in claim controller undoes) over a view of the
// ResourceSlices in which each node's gpu.tessera.dev devices come in the
// order the fragmentation gradient ranks them for the pod of the cycle.
// The structured allocator takes devices in published order, so its first
// fit is the gradient's best GPU that the claim fits, then the next best;
// claims of other drivers in the same pod are allocated by the same
// allocator, unranked. Nodes are scored by the gradient's best placement.
type claimPlacer struct {
	inner interface {
		fwk.PreEnqueuePlugin
		fwk.PreFilterPlugin
		fwk.FilterPlugin
		fwk.PostFilterPlugin
		fwk.ReservePlugin
		fwk.PreBindPlugin
		fwk.EnqueueExtensions
	}
	claims fwk.ResourceClaimTracker
	slices fwk.ResourceSliceLister

	// listed is, during PreFilter's call into inner, the slices PreFilter
	// listed and each node's (pool's) gpu.tessera.dev devices by their
	// rank for the cycle's pod, so inner reads the same list, ranked,
	// without listing again; the framework runs one scheduling cycle at a
	// time.
	listed atomic.Pointer[rankedList]
}

// rankedList is one cycle's slices and the ranks of their devices.
type rankedList struct {
	slices []*resourceapi.ResourceSlice
	ranks  map[string]map[string]int
}

// claimsKey is the cycle state of a pod whose claims TesseraGPU allocates.
const claimsKey fwk.StateKey = Name + "/claims"

// claimCycle is what PreFilter learned of a pod's claims.
type claimCycle struct {
	// req is the pod's first gpu.tessera.dev request still to allocate
	// (nil: none), and alloc the allocator it was ranked with.
	req   *allocator.Request
	alloc *allocator.Allocator
	// bases are the DRA nodes ranked, with what the device plugin's pods
	// hold and without claims; views add every allocated and in-flight
	// claim.
	bases, views map[string]*allocator.Node
	// scores is each node's gradient score for req where it fits.
	scores map[string]float64
	// nominated are the requests of claim pods nominated to a node that
	// the framework asks Filter to count as placed there (AddPod).
	nominated map[string][]nominatedPod
}

// Clone shares all but the nominated pods, which the framework adds to a
// clone.
func (c *claimCycle) Clone() fwk.StateData {
	d := *c
	d.nominated = make(map[string][]nominatedPod, len(c.nominated))
	for k, v := range c.nominated {
		d.nominated[k] = append([]nominatedPod(nil), v...)
	}
	return &d
}

func readClaims(state fwk.CycleState) *claimCycle {
	d, err := state.Read(claimsKey)
	if err != nil {
		return nil
	}
	c, _ := d.(*claimCycle)
	return c
}

// newClaimPlacer builds upstream's plugin over the ranked view, or returns
// nil where the scheduler runs without DRA (no shared DRA manager).
func newClaimPlacer(ctx context.Context, h fwk.Handle) (*claimPlacer, error) {
	mgr := h.SharedDRAManager()
	if mgr == nil {
		return nil, nil
	}
	c := &claimPlacer{claims: mgr.ResourceClaims(), slices: mgr.ResourceSlices()}
	fts := feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	args := &schedconfig.DynamicResourcesArgs{}
	pl, err := dynamicresources.New(ctx, args, rankedHandle{Handle: h, mgr: rankedManager{SharedDRAManager: mgr, placer: c}}, fts)
	if err != nil && strings.Contains(err.Error(), "indexer conflict") {
		// Upstream's own plugin was set up first in this profile.
		return nil, fmt.Errorf("%s allocates ResourceClaims itself: disable DynamicResources in profile %s (plugins.multiPoint.disabled), as the shipped configuration does: %w",
			Name, h.ProfileName(), err)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: the DRA allocator: %w", Name, err)
	}
	inner, ok := pl.(*dynamicresources.DynamicResources)
	if !ok {
		return nil, fmt.Errorf("%s: the DRA allocator is a %T", Name, pl)
	}
	c.inner = inner
	return c, nil
}

// rankedHandle is the framework's handle with the ranked DRA manager.
type rankedHandle struct {
	fwk.Handle
	mgr fwk.SharedDRAManager
}

func (h rankedHandle) SharedDRAManager() fwk.SharedDRAManager { return h.mgr }

type rankedManager struct {
	fwk.SharedDRAManager
	placer *claimPlacer
}

func (m rankedManager) ResourceSlices() fwk.ResourceSliceLister {
	return rankedSlices{ResourceSliceLister: m.SharedDRAManager.ResourceSlices(), placer: m.placer}
}

type rankedSlices struct {
	fwk.ResourceSliceLister
	placer *claimPlacer
}

func (l rankedSlices) ListWithDeviceTaintRules() ([]*resourceapi.ResourceSlice, error) {
	if r := l.placer.listed.Load(); r != nil {
		return rankDevices(r.slices, r.ranks), nil
	}
	return l.ResourceSliceLister.ListWithDeviceTaintRules()
}

// rankDevices returns slices with each ranked pool's gpu.tessera.dev
// devices in rank order (unranked ones after, in their order); the
// informer's objects are copied, never changed.
func rankDevices(in []*resourceapi.ResourceSlice, ranks map[string]map[string]int) []*resourceapi.ResourceSlice {
	if len(ranks) == 0 {
		return in
	}
	out := make([]*resourceapi.ResourceSlice, len(in))
	for i, s := range in {
		out[i] = s
		rank, ok := ranks[s.Spec.Pool.Name]
		if !ok || s.Spec.Driver != gpu.DRADriver {
			continue
		}
		c := *s
		c.Spec.Devices = slices.Clone(s.Spec.Devices)
		pos := func(name string) int {
			if r, ok := rank[name]; ok {
				return r
			}
			return math.MaxInt
		}
		slices.SortStableFunc(c.Spec.Devices, func(a, b resourceapi.Device) int { return cmp.Compare(pos(a.Name), pos(b.Name)) })
		out[i] = &c
	}
	return out
}

// wants reports whether the pod names ResourceClaims for TesseraGPU to
// allocate.
func (c *claimPlacer) wants(pod *v1.Pod) bool { return c != nil && len(pod.Spec.ResourceClaims) > 0 }

// preFilter ranks every DRA node's GPUs for the pod's first
// gpu.tessera.dev request that is still to be allocated, then has inner
// prepare the cycle's allocator over that ranking.
func (c *claimPlacer) preFilter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo, alloc *allocator.Allocator, snapshot func(node string) *allocator.Node, oversub float64) (*fwk.PreFilterResult, *fwk.Status) {
	cycle := &claimCycle{req: c.request(pod), alloc: alloc}
	if cycle.req != nil {
		if all, err := c.slices.ListWithDeviceTaintRules(); err != nil {
			klog.FromContext(ctx).Error(err, "ResourceSlices unreadable: claims are allocated first fit this cycle")
		} else {
			c.listed.Store(&rankedList{slices: all, ranks: c.rank(klog.FromContext(ctx), cycle, all, snapshot, oversub)})
		}
	}
	res, st := c.inner.PreFilter(ctx, state, pod, nodes)
	c.listed.Store(nil)
	if st.IsSuccess() {
		state.Write(claimsKey, cycle)
	}
	return res, st
}

// request is the pod's first gpu.tessera.dev device request of a claim
// not yet allocated, as the allocator reads a one-GPU request; nil where
// there is none (claims of other drivers, or all allocated already).
func (c *claimPlacer) request(pod *v1.Pod) *allocator.Request {
	for i := range pod.Spec.ResourceClaims {
		name, _, err := resourceclaim.Name(pod, &pod.Spec.ResourceClaims[i])
		if err != nil || name == nil {
			continue
		}
		claim, err := c.claims.Get(pod.Namespace, *name)
		if err != nil || claim.Status.Allocation != nil {
			continue
		}
		if req := specRequest(&claim.Spec); req != nil {
			return req
		}
	}
	return nil
}

// specRequest is a claim spec's first gpu.tessera.dev device request, as
// ClaimRequest reads it: an exact request, or the first alternative of a
// prioritized list (firstAvailable) that is one (the allocator tries the
// alternatives in order, so a list that starts with another driver's
// device is ranked for the first of Tessera's it may fall back to).
func specRequest(spec *resourceapi.ResourceClaimSpec) *allocator.Request {
	for _, r := range spec.Devices.Requests {
		if r.Exactly != nil {
			if req, ok := ClaimRequest(r.Exactly); ok {
				return req
			}
			continue
		}
		for _, sub := range r.FirstAvailable {
			if req, ok := ClaimRequest(&resourceapi.ExactDeviceRequest{DeviceClassName: sub.DeviceClassName, Capacity: sub.Capacity}); ok {
				return req
			}
		}
	}
	return nil
}

// ClaimRequest reads one device request of a claim as the allocator's
// one-GPU request, false where its class is not one of gpu.tessera.dev's
// (named gpu.tessera.dev or <kind>.gpu.tessera.dev, as the chart's are).
// As the driver's request policies resolve it, a request without cores
// (or with every core) takes the whole GPU, and so does the whole class.
func ClaimRequest(r *resourceapi.ExactDeviceRequest) (*allocator.Request, bool) {
	class := r.DeviceClassName
	if class != gpu.DRADriver && !strings.HasSuffix(class, "."+gpu.DRADriver) {
		return nil, false
	}
	req := &allocator.Request{Sharing: gpu.ModeAuto}
	switch strings.TrimSuffix(class, gpu.DRADriver) {
	case "mps.":
		req.Sharing = gpu.ModeMPS
	case "time-sliced.":
		req.Sharing = gpu.ModeTimeSlicing
	}
	ctr := allocator.Container{Name: "claim", Count: 1}
	var cores, mem int64
	if r.Capacity != nil {
		if q, ok := r.Capacity.Requests[gpu.DRACores]; ok {
			cores = q.Value()
		}
		if q, ok := r.Capacity.Requests[gpu.DRAMemory]; ok {
			mem = gpu.MiBUp(q.Value())
		}
	}
	if cores <= 0 || cores >= 100 || class == "whole."+gpu.DRADriver {
		ctr.Whole = true
	} else {
		ctr.Cores = int(cores) * gpu.CoresPerGPU / 100
		ctr.MemoryMiB = mem
	}
	req.Containers = []allocator.Container{ctr}
	return req, true
}

// rank orders the GPUs of every node with a gpu.tessera.dev ResourceSlice
// among all that the cache has an inventory of for cycle.req, counting the
// claims allocated there (and those in flight) on top of what the cache
// books: the device names by rank per pool. It fills the cycle's nodes and
// scores.
func (c *claimPlacer) rank(logger klog.Logger, cycle *claimCycle, all []*resourceapi.ResourceSlice, snapshot func(node string) *allocator.Node, oversub float64) map[string]map[string]int {
	bases := map[string]*allocator.Node{}
	for _, s := range all {
		if s.Spec.Driver != gpu.DRADriver || s.Spec.NodeName == nil || *s.Spec.NodeName != s.Spec.Pool.Name {
			continue
		}
		n, seen := bases[s.Spec.Pool.Name]
		if !seen {
			if n = snapshot(s.Spec.Pool.Name); n == nil {
				continue
			}
			n.DRA = false // claims are what it serves
			bases[s.Spec.Pool.Name] = n
		}
		heldOutsideClaims(n, s, oversub)
	}
	if len(bases) == 0 {
		return nil
	}
	claims, err := c.claims.List()
	if err != nil {
		logger.Error(err, "ResourceClaims unreadable: claims are allocated first fit this cycle")
		return nil
	}
	views := make(map[string]*allocator.Node, len(bases))
	for name, n := range bases {
		views[name] = n.Clone()
	}
	for _, claim := range claims {
		occupy(views, claim)
	}
	ranks := make(map[string]map[string]int, len(views))
	scores := make(map[string]float64, len(views))
	for name, n := range views {
		order, score, ok := cycle.alloc.Rank(n, cycle.req)
		rank := make(map[string]int, len(order))
		for r, i := range order {
			rank[gpu.DRADeviceName(n.GPUs[i].Index)] = r
		}
		ranks[name] = rank
		if ok {
			scores[name] = score
		}
	}
	cycle.bases, cycle.views, cycle.scores = bases, views, scores
	return ranks
}

// gpuOf is n's GPU that the driver names device (gpu-<index>), nil where
// n has none.
func gpuOf(n *allocator.Node, device string) *allocator.GPU {
	index, ok := gpu.DRADeviceIndex(device)
	if !ok {
		return nil
	}
	pos := slices.IndexFunc(n.GPUs, func(g allocator.GPU) bool { return g.Index == index })
	if pos < 0 {
		return nil
	}
	return &n.GPUs[pos]
}

// heldOutsideClaims counts on n what the driver's slice s says its GPUs
// hold beside claims and beyond what the cache books there: the agent
// takes what the node's device-plugin pods hold off each device's
// capacity (a GPU such pods hold whole, or a faulted one, it taints), and
// the cache knows those pods only where their assignments are readable.
func heldOutsideClaims(n *allocator.Node, s *resourceapi.ResourceSlice, oversub float64) {
	for _, d := range s.Spec.Devices {
		g := gpuOf(n, d.Name)
		if g == nil {
			continue
		}
		if len(d.Taints) > 0 {
			n.SetHealthy(g.UUID, false)
			continue
		}
		mem, hasMem := d.Capacity[gpu.DRAMemory]
		cores, hasCores := d.Capacity[gpu.DRACores]
		if !hasMem || !hasCores {
			continue
		}
		heldMem := int64(float64(g.MemoryMiB)*oversub) - mem.Value.Value()>>20 - g.MemoryUsedMiB()
		heldCores := int(100-cores.Value.Value())*gpu.CoresPerGPU/100 - g.CoresUsed()
		if heldMem > 0 || heldCores > 0 {
			mode := gpu.ClaimMode(0, g.MPS)
			n.Occupy(g.UUID, max(heldMem, 0), max(heldCores, 0), mode)
		}
	}
}

// occupy counts what an allocated claim's gpu.tessera.dev devices hold
// on the nodes given, as the driver prepares them (gpu.ClaimGrant).
func occupy(nodes map[string]*allocator.Node, claim *resourceapi.ResourceClaim) {
	// Every claim, every cycle: no map is built on the way.
	eachGrant(nodes, claim, func(node string, g claimGrant) {
		nodes[node].Occupy(g.grant.UUID, g.grant.MemoryMiB, g.grant.CoresPerMille, g.mode)
	})
}

type claimGrant struct {
	mode  gpu.SharingMode
	grant gpu.GPUGrant
}

// claimGrants is what an allocated claim's gpu.tessera.dev devices on the
// nodes given hold, per node.
func claimGrants(nodes map[string]*allocator.Node, claim *resourceapi.ResourceClaim) map[string][]claimGrant {
	var out map[string][]claimGrant
	eachGrant(nodes, claim, func(node string, g claimGrant) {
		if out == nil {
			out = map[string][]claimGrant{}
		}
		out[node] = append(out[node], g)
	})
	return out
}

// eachGrant calls f with what each of an allocated claim's gpu.tessera.dev
// devices on the nodes given holds.
func eachGrant(nodes map[string]*allocator.Node, claim *resourceapi.ResourceClaim, f func(node string, g claimGrant)) {
	if claim.Status.Allocation == nil {
		return
	}
	for i := range claim.Status.Allocation.Devices.Results {
		r := &claim.Status.Allocation.Devices.Results[i]
		if r.Driver != gpu.DRADriver {
			continue
		}
		n, ok := nodes[r.Pool]
		if !ok {
			continue
		}
		g := gpuOf(n, r.Device)
		if g == nil {
			continue
		}
		var mem, cores int64
		if q, ok := r.ConsumedCapacity[gpu.DRAMemory]; ok {
			mem = gpu.MiBUp(q.Value())
		}
		if q, ok := r.ConsumedCapacity[gpu.DRACores]; ok {
			cores = q.Value()
		}
		if r.ShareID == nil { // taken whole, without a share
			cores = 100
		}
		mode, grant := gpu.ClaimGrant(gpu.Device{UUID: g.UUID, Index: g.Index, MemoryMiB: g.MemoryMiB, MPSCapable: g.MPS}, mem, cores)
		f(r.Pool, claimGrant{mode: mode, grant: grant})
	}
}

// PreEnqueue holds a pod back until the claims it names exist, as
// upstream's DynamicResources does.
func (p *Plugin) PreEnqueue(ctx context.Context, pod *v1.Pod) *fwk.Status {
	if !p.claims.wants(pod) {
		return nil
	}
	return p.claims.inner.PreEnqueue(ctx, pod)
}

// PreBindPreFlight says whether PreBind has claims to write.
func (p *Plugin) PreBindPreFlight(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeName string) (*fwk.PreBindPreFlightResult, *fwk.Status) {
	if readClaims(state) == nil {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	return p.claims.inner.PreBindPreFlight(ctx, state, pod, nodeName)
}

// PreBind writes the pod's claims' allocation (finalizer, allocation,
// reservedFor) before the pod is bound, as upstream's DynamicResources
// does, so the built-in claim controller deallocates them when the pod
// is gone.
func (p *Plugin) PreBind(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	if readClaims(state) == nil {
		return nil
	}
	return p.claims.inner.PreBind(ctx, state, pod, nodeName)
}
