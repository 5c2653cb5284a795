package scheduler

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/component-base/metrics"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
)

// rejections tallies, within one scheduling cycle, why nodes refused the
// pod; Filter runs on many nodes at once. counts are by reason code (the
// allocator's, NoInventory, InsufficientSlots); tally folds the allocator's
// reasons with their numbers, for the one cluster-wide line PostFilter adds
// to the pod's status.
type rejections struct {
	mu     sync.Mutex
	counts map[string]int
	tally  allocator.Tally
	// behind: on some node the cache may not yet have applied a change the
	// scheduler's snapshot shows (Cache.Behind), so a refusal may be the
	// cache's lag, not the cluster's state. Once set, Filter asks no more.
	behind atomic.Bool
}

func (r *rejections) add(reason string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.countLocked(reason)
}

func (r *rejections) countLocked(reason string) {
	if r.counts == nil {
		r.counts = map[string]int{}
	}
	r.counts[reason]++
}

// addReason counts a node the allocator found no room on.
func (r *rejections) addReason(node string, reason allocator.Reason) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.countLocked(reason.Code.String())
	r.tally.Add(node, reason)
}

// summary is the cluster-wide line of the allocator's reasons ("" when the
// allocator refused no node).
func (r *rejections) summary() string {
	if r == nil {
		return ""
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	d := r.tally.Detail()
	if d == "" {
		return ""
	}
	return "GPUs: " + d
}

// dominant is the reason most nodes gave (ties: the first by name), or
// "Other" when Tessera refused on no node (another plugin did).
func (r *rejections) dominant() string {
	if r == nil {
		return "Other"
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	best, n := "Other", 0
	for reason, c := range r.counts {
		if c > n || (c == n && reason < best) {
			best, n = reason, c
		}
	}
	return best
}

// pendingPod is an unschedulable GPU pod and why its last attempt failed.
type pendingPod struct {
	namespace, name string
	reason          string
}

// pendingReasons remembers, per GPU pod whose last scheduling attempt found
// no node, the reason most nodes gave; a pod leaves when it is placed, or,
// found gone or bound at a scrape, then.
type pendingReasons struct {
	mu    sync.Mutex
	byPod map[types.UID]pendingPod
}

func (p *pendingReasons) set(pod *v1.Pod, reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byPod == nil {
		p.byPod = map[types.UID]pendingPod{}
	}
	p.byPod[pod.UID] = pendingPod{namespace: pod.Namespace, name: pod.Name, reason: reason}
}

func (p *pendingReasons) placed(uid types.UID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.byPod, uid)
}

// pendingCount is how many pods wait for one reason, and since when the
// oldest of them exists.
type pendingCount struct {
	pods   int
	oldest time.Time
}

// counts prunes the pods that are gone, bound or finished and counts the
// rest by reason.
func (p *pendingReasons) counts(pods corelisters.PodLister) map[string]pendingCount {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]pendingCount{}
	for uid, pp := range p.byPod {
		pod, err := pods.Pods(pp.namespace).Get(pp.name)
		if err != nil || pod.UID != uid || pod.Spec.NodeName != "" || podgpu.Finished(pod) {
			delete(p.byPod, uid)
			continue
		}
		c := out[pp.reason]
		c.pods++
		if created := pod.CreationTimestamp.Time; c.oldest.IsZero() || created.Before(c.oldest) {
			c.oldest = created
		}
		out[pp.reason] = c
	}
	return out
}

var (
	pendingDesc = metrics.NewDesc("tessera_scheduler_pending_gpu_pods",
		"GPU pods whose last scheduling attempt found no node, by the reason most nodes gave (the allocator's reason codes; InsufficientSlots, NoInventory, Other), or why the pod was refused before any node was tried (InvalidRequest, TooManyGPUs).",
		[]string{"reason"}, nil, metrics.ALPHA, "")
	pendingAgeDesc = metrics.NewDesc("tessera_scheduler_pending_gpu_pod_age_seconds",
		"Age of the oldest GPU pod that waits for a slice, by the reason its last attempt found no node (as tessera_scheduler_pending_gpu_pods).",
		[]string{"reason"}, nil, metrics.ALPHA, "")
)

// pendingCollector exports, at each scrape, the pending GPU pods of every
// plugin instance alive (each profile's plugin keeps its own
// pendingReasons; a scheduler restarted in the same process, as in tests,
// leaves none behind): one collector, since the instances share a
// registry.
type pendingCollector struct {
	metrics.BaseStableCollector

	mu      sync.Mutex
	sources map[*pendingReasons]corelisters.PodLister
}

var pending = &pendingCollector{}

// track exports r, whose pods pods lists, until ctx ends.
func (c *pendingCollector) track(ctx context.Context, r *pendingReasons, pods corelisters.PodLister) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sources == nil {
		c.sources = map[*pendingReasons]corelisters.PodLister{}
	}
	c.sources[r] = pods
	go func() {
		<-ctx.Done()
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.sources, r)
	}()
}

func (c *pendingCollector) DescribeWithStability(ch chan<- *metrics.Desc) {
	ch <- pendingDesc
	ch <- pendingAgeDesc
}

func (c *pendingCollector) CollectWithStability(ch chan<- metrics.Metric) {
	c.mu.Lock()
	sources := make(map[*pendingReasons]corelisters.PodLister, len(c.sources))
	for r, pods := range c.sources {
		sources[r] = pods
	}
	c.mu.Unlock()
	all := map[string]pendingCount{}
	for r, pods := range sources {
		for reason, n := range r.counts(pods) {
			a := all[reason]
			a.pods += n.pods
			if a.oldest.IsZero() || n.oldest.Before(a.oldest) {
				a.oldest = n.oldest
			}
			all[reason] = a
		}
	}
	now := time.Now()
	for reason, n := range all {
		ch <- metrics.NewLazyConstMetric(pendingDesc, metrics.GaugeValue, float64(n.pods), reason)
		ch <- metrics.NewLazyConstMetric(pendingAgeDesc, metrics.GaugeValue, now.Sub(n.oldest).Seconds(), reason)
	}
}
