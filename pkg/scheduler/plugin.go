// Package scheduler is the TesseraGPU kube-scheduler framework plugin: an
// adapter that runs every placement decision through pkg/allocator, over an
// in-memory cache of every GPU's assignments that the API server's pods and
// nodes rebuild after a restart.
//
// Extension points:
//   - PreFilter parses the pod's request once and refuses a malformed one as
//     UnschedulableAndUnresolvable, with a reason the pod's owner can act on;
//   - Filter asks the allocator whether the pod fits a node, Score and
//     NormalizeScore rank nodes by the configured policy;
//   - Reserve books the GPUs under the node's lock, Unreserve releases them;
//   - Bind binds the pod with its assignment (pkg/gpu's versioned codec) as
//     an annotation, in the same write, where the node agent reads it;
//   - EventsToRegister retries a waiting pod when a GPU pod goes away or a
//     node's inventory changes, instead of after the unschedulable timeout.
package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	policylisters "k8s.io/client-go/listers/policy/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/inventory"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
	"github.com/tessera-gpu/tessera/pkg/preemption"
)

// Name is the plugin's name in a KubeSchedulerConfiguration.
const Name = "TesseraGPU"

const stateKey fwk.StateKey = Name

// Plugin is the TesseraGPU plugin of one scheduling profile.
type Plugin struct {
	handle     fwk.Handle
	queue      fwk.PodActivator // the handle's: the scheduling queue
	cfg        *config.AllocatorConfig
	preemptCfg config.PreemptionConfig
	pods       corelisters.PodLister
	pdbs       policylisters.PodDisruptionBudgetLister
	*shared
}

var (
	_ fwk.PreFilterPlugin   = (*Plugin)(nil)
	_ fwk.FilterPlugin      = (*Plugin)(nil)
	_ fwk.PreScorePlugin    = (*Plugin)(nil)
	_ fwk.ScorePlugin       = (*Plugin)(nil)
	_ fwk.ScoreExtensions   = (*Plugin)(nil)
	_ fwk.ReservePlugin     = (*Plugin)(nil)
	_ fwk.BindPlugin        = (*Plugin)(nil)
	_ fwk.EnqueueExtensions = (*Plugin)(nil)
	_ fwk.PostFilterPlugin  = (*Plugin)(nil)
)

// shared is the state all profiles of one scheduler share: one cache of GPU
// usage (two profiles booking from separate caches would double-book), the
// informer handlers that feed it, and the recent-workload tracker.
type shared struct {
	cache    *Cache
	workload *workloadTracker
	regs     []toolscache.ResourceEventHandlerRegistration
	synced   atomic.Bool
	// warned remembers pods and nodes already reported, so a report is made
	// once and not on every resync.
	warned sync.Map
	// unreadable holds, per node, why its inventory annotation could not be
	// used, for the pods' reason.
	unreadable sync.Map
	// lastOrphans is the orphan list last logged, joined.
	lastOrphans atomic.Value
	// waiting are the pods to try again once the cache makes room (see
	// EventsToRegister).
	waiting waiters
}

var (
	sharedMu sync.Mutex
	// sharedByFactory maps a scheduler's informer factory to its shared state:
	// profiles of one scheduler share the factory, a restarted scheduler in the
	// same process (tests) gets a new one.
	sharedByFactory = map[informers.SharedInformerFactory]*shared{}
)

// PreemptionController starts what carries a preemption on after the
// notices PostFilter sends — the soft and hard levels, the scene records —
// on the scheduler's pod informer until ctx ends: the binaries pass
// pkg/preemption/controller.Start.
type PreemptionController func(ctx context.Context, client kubernetes.Interface, pods toolscache.SharedIndexInformer, cfg config.PreemptionConfig) error

// pluginFactory is the plugin factory, starting controller once per scheduler.
func pluginFactory(controller PreemptionController) frameworkruntime.PluginFactory {
	return func(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
		return newPlugin(ctx, obj, h, controller)
	}
}

func newPlugin(ctx context.Context, obj runtime.Object, h fwk.Handle, controller PreemptionController) (fwk.Plugin, error) {
	all, err := decodeArgs(obj)
	if err != nil {
		return nil, err
	}
	cfg := &all.Allocator
	base, err := allocator.New(cfg, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", argsField, err)
	}
	registerMetrics()
	factory := h.SharedInformerFactory()
	p := &Plugin{handle: h, queue: h, cfg: cfg, preemptCfg: all.Preemption,
		pods: factory.Core().V1().Pods().Lister(), pdbs: factory.Policy().V1().PodDisruptionBudgets().Lister()}
	pending.setPods(p.pods)

	sharedMu.Lock()
	defer sharedMu.Unlock()
	if s, ok := sharedByFactory[factory]; ok {
		if s.cache.oversub != cfg.MemoryOversubscription {
			return nil, fmt.Errorf("%s.memoryOversubscription: %v differs from another profile's %v; profiles share one view of the GPUs and must agree",
				argsField, cfg.MemoryOversubscription, s.cache.oversub)
		}
		p.shared = s
		return p, nil
	}
	s := &shared{cache: NewCache(cfg.MemoryOversubscription), workload: newWorkloadTracker(base, cfg.WorkloadCoverage)}
	s.cache.reportUntil(ctx, func(name string, n *allocator.Node) {
		recordNode(name, n)
		recordFragmentation(name, n, s.workload.Current())
	}, forgetNode)
	p.shared = s
	logger := klog.FromContext(ctx).WithName(Name)
	nodes, err := factory.Core().V1().Nodes().Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.onNode(logger, obj) },
		UpdateFunc: func(_, obj any) { p.onNode(logger, obj) },
		DeleteFunc: func(obj any) { p.onNodeDelete(logger, obj) },
	})
	if err != nil {
		return nil, err
	}
	pods, err := factory.Core().V1().Pods().Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.onPod(logger, obj, true) },
		UpdateFunc: func(_, obj any) { p.onPod(logger, obj, false) },
		DeleteFunc: func(obj any) { p.onPodDelete(obj) },
	})
	if err != nil {
		return nil, err
	}
	s.regs = []toolscache.ResourceEventHandlerRegistration{nodes, pods}
	sharedByFactory[factory] = s
	// Preemption's soft and hard levels, for the victims PostFilter
	// notifies; and the fallback for victims whose agent never confirms
	// their reclaim.
	if controller == nil {
		logger.Info("No preemption controller runs beside this scheduler: notified victims are never stopped at their deadline")
	} else if err := controller(klog.NewContext(ctx, logger.WithName("preemption")), h.ClientSet(), factory.Core().V1().Pods().Informer(), all.Preemption); err != nil {
		return nil, err
	}
	go wait.UntilWithContext(ctx, func(context.Context) {
		if expired := s.cache.ExpireReclaims(time.Now(), all.Preemption.ReclaimTimeout.Duration); len(expired) > 0 {
			reclaimTimeouts.Add(float64(len(expired)))
			logger.Error(nil, "Preemption victims released without their agent's reclaim confirmation", "pods", expired, "timeout", all.Preemption.ReclaimTimeout.Duration)
		}
		awaitingReclaim.Set(float64(s.cache.AwaitingReclaim()))
		s.waiting.wake(s.cache, logger)
	}, 5*time.Second)
	go func() {
		<-ctx.Done()
		sharedMu.Lock()
		delete(sharedByFactory, factory)
		sharedMu.Unlock()
	}()
	return p, nil
}

// Name implements fwk.Plugin.
func (p *Plugin) Name() string { return Name }

// stateData is what PreFilter learns about a pod for the rest of its cycle.
type stateData struct {
	req *allocator.Request
	// slots is how many device-plugin slots (tessera.dev/gpu) the pod's
	// containers take from kubelet.
	slots int64
	// shape is req.Key(), computed once per cycle.
	shape string
	alloc *allocator.Allocator
	// assignment is what Reserve booked, for Bind to write.
	assignment *gpu.PodAssignment
	// nominated are the pods nominated to a node that the framework asks
	// Filter to count as placed there (AddPod).
	nominated map[string][]nominatedPod
	// rejected tallies Filter's reasons, for PostFilter to record why the
	// pod waits (shared by clones: one cycle's tally).
	rejected *rejections
	// freedAt is the cache's Freed count when the cycle began.
	freedAt uint64
}

// Clone shares the data, except the nominated pods, which the framework
// adds to a clone: nothing else changes after PreFilter but the assignment,
// which only Reserve and Bind of the same cycle touch. A clone is always a
// new object, also without nominated pods: AddPod on a clone that was the
// original itself wrote the map Filter reads on other nodes at once (the
// soak's "concurrent map read and map write" in Filter).
func (s *stateData) Clone() fwk.StateData {
	c := *s
	if s.nominated == nil {
		return &c
	}
	c.nominated = make(map[string][]nominatedPod, len(s.nominated))
	for k, v := range s.nominated {
		c.nominated[k] = append([]nominatedPod(nil), v...)
	}
	return &c
}

func readState(state fwk.CycleState) *stateData {
	d, err := state.Read(stateKey)
	if err != nil {
		return nil
	}
	s, _ := d.(*stateData)
	return s
}

// waitForSync blocks a scheduling cycle until the cache holds every node and
// pod the API server had when the scheduler started: a restarted scheduler
// must count every existing assignment before it books anything.
func (s *shared) waitForSync(ctx context.Context) error {
	if s.synced.Load() {
		return nil
	}
	fns := make([]toolscache.InformerSynced, len(s.regs))
	for i, r := range s.regs {
		fns[i] = r.HasSynced
	}
	if !toolscache.WaitForCacheSync(ctx.Done(), fns...) {
		return fmt.Errorf("%s: GPU assignment cache did not sync: %w", Name, ctx.Err())
	}
	s.synced.Store(true)
	return nil
}

// PreFilter parses and validates the pod's GPU request.
func (p *Plugin) PreFilter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	defer observe("PreFilter", time.Now())
	if !podgpu.WantsGPU(pod) {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	if err := p.waitForSync(ctx); err != nil {
		return nil, fwk.AsStatus(err)
	}
	freedAt := p.cache.Freed()
	req, err := p.compile(pod)
	if err != nil {
		unschedulable.WithLabelValues("InvalidRequest").Inc()
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, err.Error())
	}
	state.Write(stateKey, &stateData{req: req, slots: podgpu.Slots(pod), shape: req.Key(), alloc: p.workload.Current(), rejected: &rejections{}, freedAt: freedAt})
	return nil, nil
}

// compile reads a pod's request and checks it against the cluster: a slice
// larger than every GPU known would wait forever.
func (p *Plugin) compile(pod *v1.Pod) (*allocator.Request, error) {
	greq, err := podgpu.Request(pod)
	if err != nil {
		return nil, fmt.Errorf("invalid GPU request: %w", err)
	}
	if err := preemption.ValidateAnnotations(pod); err != nil {
		return nil, fmt.Errorf("invalid preemption settings: %w", err)
	}
	req, err := allocator.Compile(greq, p.cfg)
	if err != nil {
		return nil, fmt.Errorf("invalid GPU request: %w", err)
	}
	if largest := p.cache.MaxGPUMemoryMiB(); largest > 0 {
		for _, c := range greq.Containers {
			if c.MemoryMiB > largest {
				return nil, fmt.Errorf("invalid GPU request: container %s asks for %s=%d MiB per GPU, but the largest GPU in the cluster has %d MiB",
					c.Name, gpu.ResourceMemory, c.MemoryMiB, largest)
			}
		}
	}
	return req, nil
}

// Filter says whether the pod's GPUs fit the node.
func (p *Plugin) Filter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) *fwk.Status {
	defer observe("Filter", time.Now())
	s := readState(state)
	if s == nil {
		return nil
	}
	var reason allocator.Reason
	var err error
	if len(s.nominated[nodeInfo.Node().Name]) > 0 {
		var ok bool
		if reason, ok = p.fitWithNominated(s, nodeInfo.Node().Name); !ok {
			err = errNoInventory
		}
	} else {
		reason, _, err = p.cache.Fit(s.alloc, nodeInfo.Node().Name, s.shape, s.req)
	}
	if err != nil {
		unschedulable.WithLabelValues("NoInventory").Inc()
		s.rejected.add("NoInventory")
		if _, unreadable := p.unreadable.Load(nodeInfo.Node().Name); !unreadable && p.behind(nodeInfo) {
			s.rejected.markBehind()
		}
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, p.noInventoryReason(nodeInfo.Node().Name))
	}
	if st := slotsFit(s.slots, nodeInfo); st != nil {
		s.rejected.add("InsufficientSlots")
		return st
	}
	if !reason.OK() {
		unschedulable.WithLabelValues(reason.Code.String()).Inc()
		s.rejected.addReason(nodeInfo.Node().Name, reason)
		if p.behind(nodeInfo) {
			s.rejected.markBehind()
		}
		// The message is the code's, the same on every node (the
		// framework counts identical ones); this node's numbers go to the
		// log, and the cluster's to PostFilter's line.
		klog.FromContext(ctx).V(4).Info("GPU pod does not fit the node", "pod", klog.KObj(pod), "node", nodeInfo.Node().Name, "reason", reason.String())
		return fwk.NewStatus(fwk.Unschedulable, reason.Code.Message())
	}
	return nil
}

// behind says whether the cache may not yet have applied a change the
// scheduler's snapshot of the node shows (see Cache.Behind).
func (p *Plugin) behind(nodeInfo fwk.NodeInfo) bool {
	n := nodeInfo.Node()
	return p.cache.Behind(n.Name, nodeInfo.GetRequested().GetScalarResources()[gpu.ResourceGPU], n.Annotations[gpu.AnnotationInventory])
}

// reasonInsufficientSlots is the Filter reason when kubelet has too few
// device-plugin slots left on a node: the reason NodeResourcesFit gives.
const reasonInsufficientSlots = "Insufficient " + gpu.ResourceGPU

// slotsFit checks the node's device-plugin slots as kubelet counts them:
// the pods bound there take theirs until they are deleted, those the agent
// refused their GPUs included, so a GPU with room in the allocator's
// account is no place for a pod kubelet would reject ("UnexpectedAdmission
// Error … Available: 0").
func slotsFit(want int64, nodeInfo fwk.NodeInfo) *fwk.Status {
	if want == 0 {
		return nil
	}
	free := nodeInfo.GetAllocatable().GetScalarResources()[gpu.ResourceGPU] - nodeInfo.GetRequested().GetScalarResources()[gpu.ResourceGPU]
	if want > free {
		unschedulable.WithLabelValues("InsufficientSlots").Inc()
		return fwk.NewStatus(fwk.Unschedulable, reasonInsufficientSlots)
	}
	return nil
}

// noInventoryReason says why a node takes no GPU pod: its inventory is
// missing, or there but unreadable (and why).
func (p *Plugin) noInventoryReason(node string) string {
	if _, ok := p.unreadable.Load(node); ok {
		// Why is in the node's InvalidGPUInventory event: per node, it
		// would make the framework's count one clause per node.
		return fmt.Sprintf("node's GPU inventory (annotation %s) is unreadable (see the node's InvalidGPUInventory event); its tessera-agent republishes it when it runs there",
			gpu.AnnotationInventory)
	}
	return fmt.Sprintf("node has no Tessera GPU inventory (annotation %s); is tessera-agent running there?", gpu.AnnotationInventory)
}

// PreScore skips scoring for pods without GPUs.
func (p *Plugin) PreScore(_ context.Context, state fwk.CycleState, _ *v1.Pod, _ []fwk.NodeInfo) *fwk.Status {
	if readState(state) == nil {
		return fwk.NewStatus(fwk.Skip)
	}
	return nil
}

// scoreScale keeps the allocator's fractional scores distinct as integers.
const scoreScale = 1e6

// Score is the allocator's score of the node under the configured policy:
// the memo Filter filled answers it without placing again, unless the node
// changed in between (a binding completed, a pod left), when it is placed
// afresh. Reserve places once more under the node's lock, so a ranking that
// moved never books anything stale.
func (p *Plugin) Score(_ context.Context, state fwk.CycleState, _ *v1.Pod, nodeInfo fwk.NodeInfo) (int64, *fwk.Status) {
	defer observe("Score", time.Now())
	s := readState(state)
	if s == nil {
		return 0, nil
	}
	reason, score, err := p.cache.Fit(s.alloc, nodeInfo.Node().Name, s.shape, s.req)
	if err != nil || !reason.OK() {
		return math.MinInt64 / 2, nil // changed since Filter; rank it last
	}
	return int64(math.Round(score * scoreScale)), nil
}

// ScoreExtensions returns the plugin, which normalizes its own scores.
func (p *Plugin) ScoreExtensions() fwk.ScoreExtensions { return p }

// NormalizeScore maps scores onto 0–100 so that the allocator's best nodes,
// and only they, get 100: linear scaling alone could round a runner-up into a
// tie with the best, and the framework breaks ties at random.
func (p *Plugin) NormalizeScore(_ context.Context, _ fwk.CycleState, _ *v1.Pod, scores fwk.NodeScoreList) *fwk.Status {
	if len(scores) == 0 {
		return nil
	}
	lo, hi := scores[0].Score, scores[0].Score
	for _, s := range scores {
		lo, hi = min(lo, s.Score), max(hi, s.Score)
	}
	for i := range scores {
		switch {
		case scores[i].Score == hi:
			scores[i].Score = fwk.MaxNodeScore
		default:
			scores[i].Score = int64(float64(scores[i].Score-lo) / float64(hi-lo) * float64(fwk.MaxNodeScore-1))
		}
	}
	return nil
}

// Reserve books the pod's GPUs on the chosen node. It places again under the
// node's lock: the usage may have changed since Filter.
func (p *Plugin) Reserve(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	defer observe("Reserve", time.Now())
	s := readState(state)
	if s == nil {
		return nil
	}
	asg, reason, err := p.cache.Reserve(s.alloc, pod.UID, podKey(pod), nodeName, s.req)
	if err != nil {
		return fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("node %s lost its GPU inventory", nodeName))
	}
	if !reason.OK() {
		return fwk.NewStatus(fwk.Unschedulable, reason.String())
	}
	s.assignment = asg
	pending.reasons.placed(pod.UID)
	p.waiting.forget(pod.UID)
	klog.FromContext(ctx).V(4).Info("Reserved GPUs", "pod", klog.KObj(pod), "node", nodeName, "assignment", asg)
	return nil
}

// Unreserve releases a booking whose pod did not bind.
func (p *Plugin) Unreserve(ctx context.Context, state fwk.CycleState, pod *v1.Pod, _ string) {
	defer observe("Unreserve", time.Now())
	if s := readState(state); s != nil {
		p.cache.ForgetAssumed(pod.UID)
		s.assignment = nil
		p.waiting.wake(p.cache, klog.FromContext(ctx))
	}
}

// Bind binds a GPU pod with its assignment in one write: the binding's
// annotations are merged onto the pod by the API server in the same update
// that sets its node, so a pod is never bound without its assignment, nor
// left with an assignment for a binding that failed — and it costs one
// request instead of a patch plus a binding. Pods without GPUs are left to
// DefaultBinder (Skip); the shipped config runs TesseraGPU first at bind.
func (p *Plugin) Bind(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	s := readState(state)
	if s == nil || s.assignment == nil {
		return fwk.NewStatus(fwk.Skip)
	}
	defer observe("Bind", time.Now())
	enc, err := gpu.EncodeAssignment(s.assignment)
	if err != nil {
		return fwk.AsStatus(err)
	}
	binding := &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID,
			Annotations: map[string]string{gpu.AnnotationAssignment: enc}},
		Target: v1.ObjectReference{Kind: "Node", Name: nodeName},
	}
	if err := p.handle.ClientSet().CoreV1().Pods(pod.Namespace).Bind(ctx, binding, metav1.CreateOptions{}); err != nil {
		return fwk.AsStatus(fmt.Errorf("bind pod %s to %s with its GPU assignment: %w", podKey(pod), nodeName, err))
	}
	return nil
}

func podKey(pod *v1.Pod) string { return pod.Namespace + "/" + pod.Name }

// onPod keeps the cache in step with a pod: a bound pod's assignment is
// booked (or confirmed), a finished one released. New GPU pods also feed the
// workload the fgd and tessera policies score against.
func (p *Plugin) onPod(logger klog.Logger, obj any, added bool) {
	pod, ok := obj.(*v1.Pod)
	if !ok || !podgpu.WantsGPU(pod) {
		return
	}
	if podgpu.Finished(pod) {
		p.release(pod)
		p.waiting.forget(pod.UID)
		p.reportOrphans(logger)
		p.waiting.wake(p.cache, logger)
		return
	}
	if added {
		if req, err := p.compile(pod); err == nil {
			p.workload.Observe(req)
		}
	}
	if pod.Spec.NodeName == "" {
		return
	}
	p.waiting.forget(pod.UID)
	a, err := podgpu.BoundAssignment(pod)
	switch {
	case err != nil:
		assignmentErrors.Inc()
		p.warnOnce(logger, pod, "InvalidGPUAssignment", err.Error())
		return
	case a == nil:
		p.warnOnce(logger, pod, "NoGPUAssignment",
			fmt.Sprintf("pod is bound to %s without a %s annotation: it was not placed by the %s plugin, so its GPUs are not accounted", pod.Spec.NodeName, gpu.AnnotationAssignment, Name))
		return
	}
	switch err := p.cache.AddBound(pod.UID, podKey(pod), a); {
	case errors.Is(err, ErrAssignmentChanged):
		assignmentChanges.Inc()
		p.warnOnce(logger, pod, "GPUAssignmentChanged", err.Error())
	case err != nil:
		assignmentErrors.Inc()
		p.warnOnce(logger, pod, "InvalidGPUAssignment", err.Error())
	}
	if !p.cache.HasNode(a.Node) {
		p.reportOrphans(logger)
	}
}

func (p *Plugin) onPodDelete(obj any) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if pod, ok := obj.(*v1.Pod); ok {
		p.release(pod)
		p.waiting.forget(pod.UID)
		p.reportOrphans(klog.Background())
		p.waiting.wake(p.cache, klog.Background())
		prefix := string(pod.UID) + "/"
		p.warned.Range(func(k, _ any) bool {
			if s := k.(string); len(s) > len(prefix) && s[:len(prefix)] == prefix {
				p.warned.Delete(k)
			}
			return true
		})
	}
}

// release tells the cache a pod left the API server or finished; a
// preemption victim's slices stay booked, for its preemptor, until its
// agent confirms them clean.
func (p *Plugin) release(pod *v1.Pod) {
	if !preemption.IsVictim(pod) {
		p.cache.Gone(pod.UID, false)
		return
	}
	var preemptor types.UID
	if n, err := preemption.NoticeOf(pod); err == nil && n != nil {
		preemptor = types.UID(n.PreemptorUID)
	}
	p.cache.GoneVictimOf(pod.UID, preemptor)
}

// onNode installs, replaces or drops a node's inventory, then wakes the
// pods that waited on a cache behind the scheduler's.
func (p *Plugin) onNode(logger klog.Logger, obj any) {
	p.applyNode(logger, obj)
	p.waiting.wake(p.cache, logger)
}

func (p *Plugin) applyNode(logger klog.Logger, obj any) {
	node, ok := obj.(*v1.Node)
	if !ok {
		return
	}
	if _, has := node.Annotations[gpu.AnnotationInventory]; !has {
		p.unreadable.Delete(node.Name)
		if p.cache.HasNode(node.Name) {
			p.cache.RemoveNode(node.Name)
			p.reportOrphans(logger)
		}
		return
	}
	inv, err := inventory.FromNode(node)
	if err == nil {
		var overfull []string
		overfull, err = p.cache.SetNode(node.Annotations[gpu.AnnotationInventory], inv)
		if err == nil {
			p.unreadable.Delete(node.Name)
			if len(overfull) > 0 {
				logger.Error(nil, "Pods' GPU assignments no longer fit their node's inventory; their GPUs stay booked, over-full, until they leave", "node", node.Name, "pods", overfull)
			}
			p.reportOrphans(logger)
			return
		}
	}
	inventoryErrors.WithLabelValues(node.Name).Inc()
	p.unreadable.Store(node.Name, err.Error())
	p.warnOnce(logger, node, "InvalidGPUInventory", err.Error())
	p.cache.RemoveNode(node.Name)
	p.reportOrphans(logger)
}

func (p *Plugin) onNodeDelete(logger klog.Logger, obj any) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if node, ok := obj.(*v1.Node); ok {
		p.unreadable.Delete(node.Name)
		p.cache.RemoveNode(node.Name)
		p.reportOrphans(logger)
	}
}

// reportOrphans publishes the number of bound pods whose GPUs are counted on
// no node, and logs them: they are invisible to placement until their node's
// inventory returns, which an operator must know.
// It is called whenever the set may have changed (a pod gone too), and logs
// only when the set did change.
func (p *Plugin) reportOrphans(logger klog.Logger) {
	o := p.cache.Orphans()
	orphanedPods.Set(float64(len(o)))
	key := strings.Join(o, ",")
	if prev, _ := p.lastOrphans.Swap(key).(string); prev != key && len(o) > 0 {
		logger.Info("Bound GPU pods are on nodes without a usable GPU inventory", "count", len(o), "pods", o)
	}
}

// warnOnce logs and records a Warning event on obj once per object and reason.
func (p *Plugin) warnOnce(logger klog.Logger, obj runtime.Object, reason, msg string) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return
	}
	key := string(m.GetUID()) + "/" + reason + "/" + msg
	if _, seen := p.warned.LoadOrStore(key, true); seen {
		return
	}
	logger.Error(nil, msg, "object", klog.KObj(m), "reason", reason)
	if p.handle == nil {
		return
	}
	if r := p.handle.EventRecorder(); r != nil {
		r.Eventf(obj, nil, v1.EventTypeWarning, reason, "Scheduling", "%s", msg)
	}
}

// RegisterWith returns what adds Tessera's plugins (TesseraGPU and
// TesseraNodeResourcesFit) to a scheduler's out-of-tree registry, with the
// preemption controller each scheduler runs beside them: pass it where
// kube-scheduler's app takes its options (app.NewSchedulerCommand,
// app.Setup). The binaries wire controller.Start; nil runs none.
func RegisterWith(controller PreemptionController) func(frameworkruntime.Registry) error {
	return func(r frameworkruntime.Registry) error {
		if err := r.Register(Name, pluginFactory(controller)); err != nil {
			return err
		}
		return r.Register(ResourcesFitName, NewResourcesFit)
	}
}
