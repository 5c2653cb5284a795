// Package scheduler is the TesseraGPU kube-scheduler framework plugin: an
// adapter that runs every placement decision through pkg/allocator, over an
// in-memory cache of every GPU's assignments that the API server's pods and
// nodes rebuild after a restart.
//
// Extension points, one file each:
//   - prefilter.go: PreFilter parses the pod's request once and refuses a
//     malformed one as UnschedulableAndUnresolvable, with a reason the pod's
//     owner can act on (nominated.go: the nominated pods it counts);
//   - filter.go: Filter asks the allocator whether the pod fits a node
//     (UnschedulableAndUnresolvable where the node's GPUs alone refuse it,
//     which no eviction changes; Unschedulable where bookings do);
//   - score.go: Score and NormalizeScore rank nodes by the configured policy;
//   - reserve.go: Reserve books the GPUs under the node's lock, Unreserve
//     releases them;
//   - bind.go: Bind binds the pod with its assignment (pkg/gpu's versioned
//     codec) as an annotation, in the same write, where the node agent reads
//     it;
//   - postfilter.go: PostFilter preempts — preemptplan.go chooses the victims
//     (a pure function), notices.go notifies them;
//   - claims.go: a pod's ResourceClaims, allocated by upstream's
//     DynamicResources over slices whose gpu.tessera.dev devices are in the
//     order the fragmentation gradient ranks them (PreEnqueue, PreBind);
//   - hints.go: EventsToRegister retries a waiting pod when a GPU pod goes
//     away or a node's inventory changes, instead of after the
//     unschedulable timeout.
//
// handlers.go keeps the cache (package cache) in step with the informers.
package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
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
	"github.com/tessera-gpu/tessera/pkg/scheduler/cache"
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
	// pending are this instance's GPU pods that found no node, for the
	// pending collector.
	pending pendingReasons
	// claims allocates pods' ResourceClaims (nil: the scheduler runs
	// without DRA).
	claims *claimPlacer
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
	_ fwk.PreEnqueuePlugin  = (*Plugin)(nil)
	_ fwk.PreBindPlugin     = (*Plugin)(nil)
)

// shared is the state all profiles of one scheduler share: one cache of GPU
// usage (two profiles booking from separate caches would double-book), the
// informer handlers that feed it, and the recent-workload tracker.
type shared struct {
	cache    *cache.Cache
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
	// cycles counts PreFilter's GPU cycles, to time one in timedCycleEvery.
	cycles atomic.Uint64
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
// Starter starts something that runs beside the scheduler with its
// client, once TesseraGPU is built (the claim admission webhook); an error
// stops the scheduler at start.
type Starter func(ctx context.Context, client kubernetes.Interface) error

func pluginFactory(controller PreemptionController, starters []Starter) frameworkruntime.PluginFactory {
	return func(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
		return newPlugin(ctx, obj, h, controller, starters)
	}
}

func newPlugin(ctx context.Context, obj runtime.Object, h fwk.Handle, controller PreemptionController, starters []Starter) (fwk.Plugin, error) {
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
	pending.track(ctx, &p.pending, p.pods)
	if p.claims, err = newClaimPlacer(ctx, h); err != nil {
		return nil, err
	}

	sharedMu.Lock()
	defer sharedMu.Unlock()
	if s, ok := sharedByFactory[factory]; ok {
		if s.cache.Oversubscription() != cfg.MemoryOversubscription {
			return nil, fmt.Errorf("%s.memoryOversubscription: %v differs from another profile's %v; profiles share one view of the GPUs and must agree",
				argsField, cfg.MemoryOversubscription, s.cache.Oversubscription())
		}
		p.shared = s
		fragmentation.set(s.cache, p.pods, cfg)
		return p, nil
	}
	s := &shared{cache: cache.New(cfg.MemoryOversubscription), workload: newWorkloadTracker(base, cfg.WorkloadCoverage)}
	s.cache.ReportUntil(ctx, recordNode, forgetNode)
	p.shared = s
	fragmentation.set(s.cache, p.pods, cfg)
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
	for _, start := range starters {
		if err := start(ctx, h.ClientSet()); err != nil {
			return nil, err
		}
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
	// shape is req.Key()'s number in the cache, computed once per cycle.
	shape cache.Shape
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
	// timed: Filter and Score record their latency in this cycle (see
	// timedCycleEvery).
	timed bool
	// excluded are the nodes PreFilter left out of the cycle (see
	// candidates), for PostFilter's account when no node fits.
	excluded []cache.ExcludedNode
	// claims: the pod also has ResourceClaims to allocate (claims.go).
	claims bool
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

// errNoCycleState is Filter's error for a GPU pod whose cycle has no
// PreFilter state.
var errNoCycleState = errors.New(Name + ": no PreFilter state in the scheduling cycle (PreFilter did not run, or another plugin overwrote its key)")

// readState is the cycle's state that PreFilter wrote, or nil where
// PreFilter skipped the pod (no GPU asked) or did not run.
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

func podKey(pod *v1.Pod) string { return pod.Namespace + "/" + pod.Name }

// RegisterWith returns what adds Tessera's plugins (TesseraGPU and
// TesseraNodeResourcesFit) to a scheduler's out-of-tree registry, with the
// preemption controller each scheduler runs beside them: pass it where
// kube-scheduler's app takes its options (app.NewSchedulerCommand,
// app.Setup). The binaries wire controller.Start; nil runs none. starters
// run once TesseraGPU is built, with the scheduler's client (the claim
// admission webhook).
func RegisterWith(controller PreemptionController, starters ...Starter) func(frameworkruntime.Registry) error {
	return func(r frameworkruntime.Registry) error {
		if err := r.Register(Name, pluginFactory(controller, starters)); err != nil {
			return err
		}
		return r.Register(ResourcesFitName, NewResourcesFit)
	}
}
