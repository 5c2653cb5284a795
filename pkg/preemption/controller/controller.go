// Package controller is the preemption controller: after the scheduler's
// PostFilter notifies victims (pkg/preemption is the notice contract), it
// carries out the soft and hard levels. It is its own component, started by
// the binaries that run a tessera-scheduler (cmd/tessera-scheduler, the
// playground) through scheduler.RegisterWith; the node agent links only the
// contract.
package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/patch"
	"github.com/tessera-gpu/tessera/pkg/preemption"
)

// Controller carries out the soft and hard levels for the victims the
// scheduler notified: it ends the wait when a victim exits or reports its
// checkpoint, and at the deadline records the victim's scene and deletes it.
// It runs in the scheduler process, on the scheduler's pod informer (Start).
type Controller struct {
	client kubernetes.Interface
	pods   corelisters.PodLister
	cfg    config.PreemptionConfig
	queue  workqueue.TypedRateLimitingInterface[types.NamespacedName]
	now    func() time.Time
	// byPreemptor indexes victims by their preemptor's UID.
	byPreemptor cache.Indexer

	// ended remembers how each victim's preemption ended once the
	// controller ended it, so the deletion that follows is not counted
	// again; a victim that left on its own is a soft preemption.
	ended sync.Map // types.UID → level
}

// Levels a preemption ends at.
const (
	LevelSoft = "soft" // the victim exited or reported its checkpoint
	LevelHard = "hard" // the grace period ran out
	// LevelCancelled: the preemptor was placed elsewhere or went away
	// before the victim was stopped; the victim was spared.
	LevelCancelled = "cancelled"
)

// Start runs a controller on informer's pods (the scheduler's) with two
// workers until ctx ends: the scheduler plugin calls it once per scheduler,
// with the preemption settings of its arguments.
func Start(ctx context.Context, client kubernetes.Interface, informer cache.SharedIndexInformer, cfg config.PreemptionConfig) error {
	c, err := New(client, informer, cfg)
	if err != nil {
		return err
	}
	go c.Run(ctx, 2)
	return nil
}

// New watches informer's pods (the scheduler's).
func New(client kubernetes.Interface, informer cache.SharedIndexInformer, cfg config.PreemptionConfig) (*Controller, error) {
	registerMetrics()
	c := &Controller{
		client: client, pods: corelisters.NewPodLister(informer.GetIndexer()), cfg: cfg, now: time.Now,
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[types.NamespacedName]()),
	}
	// Victims by their preemptor's UID: a preemptor that is placed, or
	// goes away, spares its victims not yet stopped.
	if err := informer.AddIndexers(cache.Indexers{preemptorIndex: func(obj any) ([]string, error) {
		if p, ok := obj.(*v1.Pod); ok {
			if n, _ := preemption.NoticeOf(p); n != nil {
				return []string{n.PreemptorUID}, nil
			}
		}
		return nil, nil
	}}); err != nil {
		return nil, err
	}
	c.byPreemptor = informer.GetIndexer()
	_, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueue,
		UpdateFunc: func(_, o any) { c.enqueue(o) },
		DeleteFunc: func(o any) { c.deleted(o); c.enqueue(o) },
	})
	return c, err
}

const preemptorIndex = "tessera.dev/preemptor"

// enqueue queues a victim, and the victims of a pod that preempted.
func (c *Controller) enqueue(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	p, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	if preemption.IsVictim(p) {
		c.queue.Add(types.NamespacedName{Namespace: p.Namespace, Name: p.Name})
	}
	if c.byPreemptor == nil {
		return
	}
	victims, _ := c.byPreemptor.ByIndex(preemptorIndex, string(p.UID))
	for _, o := range victims {
		if v, ok := o.(*v1.Pod); ok {
			c.queue.Add(types.NamespacedName{Namespace: v.Namespace, Name: v.Name})
		}
	}
}

// deleted counts a victim that left: a soft preemption unless the
// controller ended it itself.
func (c *Controller) deleted(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	p, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	n, err := preemption.NoticeOf(p)
	if err != nil || n == nil {
		return
	}
	if _, ended := c.ended.LoadAndDelete(p.UID); ended {
		return
	}
	levels.WithLabelValues(LevelSoft).Inc()
	levelSeconds.WithLabelValues(LevelSoft).Observe(c.now().Sub(n.NoticeAt).Seconds())
}

// Run works the queue until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	defer c.queue.ShutDown()
	for range workers {
		go func() {
			for c.next(ctx) {
			}
		}()
	}
	<-ctx.Done()
}

func (c *Controller) next(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	after, err := c.sync(ctx, key)
	switch {
	case err != nil:
		klog.FromContext(ctx).Error(err, "Preemption step failed; retrying", "pod", key)
		c.queue.AddRateLimited(key)
	case after > 0:
		c.queue.Forget(key)
		c.queue.AddAfter(key, after)
	default:
		c.queue.Forget(key)
	}
	return true
}

// sync moves one victim on; it returns how long until it must look again.
func (c *Controller) sync(ctx context.Context, key types.NamespacedName) (time.Duration, error) {
	pod, err := c.pods.Pods(key.Namespace).Get(key.Name)
	if apierrors.IsNotFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n, err := preemption.NoticeOf(pod)
	if err != nil || n == nil || pod.DeletionTimestamp != nil {
		return 0, nil
	}
	logger := klog.FromContext(ctx).WithValues("victim", klog.KObj(pod), "preemptor", n.Preemptor)
	now := c.now()
	if why := c.needless(n); why != "" && !podFinished(pod) {
		// Nothing is lost by sparing it: a placed preemptor fits without
		// this victim (its slices were still booked when it was placed).
		logger.Info("Preemption no longer needed; sparing the victim", "why", why)
		return 0, c.cancel(ctx, pod, why)
	}
	at, saved, err := preemption.CheckpointOf(pod)
	if err != nil {
		// Not its agent's writing: the grace period runs on.
		logger.Error(err, "Ignoring an unreadable checkpoint report")
	}
	if saved {
		// Its checkpoint is saved: nothing is lost by stopping it now.
		logger.Info("Victim reported its checkpoint; stopping it", "checkpointedAt", at)
		c.event(ctx, pod, v1.EventTypeNormal, "PreemptedAfterCheckpoint", fmt.Sprintf("Checkpoint reported at %s; stopped for %s", at.Format(time.RFC3339), n.Preemptor))
		return 0, c.stop(ctx, pod, n, LevelSoft, now)
	}
	if now.Before(n.Deadline) {
		return n.Deadline.Sub(now), nil
	}
	// Hard: keep the scene, then stop it.
	rec, err := c.record(ctx, pod, n, now)
	if err != nil {
		// A lost record must not keep the preemptor waiting.
		logger.Error(err, "Could not record the preempted pod's scene")
	}
	c.event(ctx, pod, v1.EventTypeWarning, "PreemptedHard",
		fmt.Sprintf("preemption.Grace period ended at %s without a checkpoint; stopped for %s; scene recorded in %s/%s", n.Deadline.Format(time.RFC3339), n.Preemptor, preemption.RecordNamespace, rec))
	if ns, name, ok := strings.Cut(n.Preemptor, "/"); ok {
		c.event(ctx, &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(n.PreemptorUID)}}, v1.EventTypeNormal, "VictimStopped",
			fmt.Sprintf("Victim %s/%s ignored its notice and was stopped at the end of its grace period; scene in %s/%s", pod.Namespace, pod.Name, preemption.RecordNamespace, rec))
	}
	logger.Info("preemption.Grace period over; stopping the victim", "record", rec)
	return 0, c.stop(ctx, pod, n, LevelHard, now)
}

// needless says why a notice no longer serves its preemptor ("" while it
// does): the preemptor was placed, or is gone.
func (c *Controller) needless(n *preemption.Notice) string {
	ns, name, _ := strings.Cut(n.Preemptor, "/")
	pre, err := c.pods.Pods(ns).Get(name)
	switch {
	case apierrors.IsNotFound(err), err == nil && string(pre.UID) != n.PreemptorUID:
		return "preemptor " + n.Preemptor + " is gone"
	case err != nil:
		return ""
	case pre.Spec.NodeName != "":
		return "preemptor " + n.Preemptor + " was placed on " + pre.Spec.NodeName
	}
	return ""
}

func podFinished(p *v1.Pod) bool {
	return p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed
}

// cancel withdraws a victim's notice: the annotation goes (the agent then
// removes the notice file), the DisruptionTarget condition turns False, and
// an event says why.
func (c *Controller) cancel(ctx context.Context, pod *v1.Pod, why string) error {
	withdraw := patch.Annotations("", map[string]*string{preemption.AnnotationNotice: nil, preemption.AnnotationCheckpointed: nil})
	if _, err := c.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, withdraw, metav1.PatchOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	cond := patch.PodCondition(v1.PodCondition{Type: v1.DisruptionTarget, Status: v1.ConditionFalse, Reason: "PreemptionCancelled",
		Message: why, LastTransitionTime: metav1.NewTime(c.now().UTC().Truncate(time.Second))})
	if _, err := c.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, cond, metav1.PatchOptions{}, "status"); err != nil {
		klog.FromContext(ctx).V(2).Info("Could not clear the DisruptionTarget condition", "pod", klog.KObj(pod), "err", err)
	}
	levels.WithLabelValues(LevelCancelled).Inc()
	c.event(ctx, pod, v1.EventTypeNormal, "PreemptionCancelled", "Preemption withdrawn: "+why)
	return nil
}

// stop deletes the victim at once (its grace was the notice's).
func (c *Controller) stop(ctx context.Context, pod *v1.Pod, n *preemption.Notice, level string, now time.Time) error {
	if _, already := c.ended.LoadOrStore(pod.UID, level); already {
		// A second look queued before the informer saw the first stop.
		return nil
	}
	zero := int64(0)
	uid := pod.UID
	err := c.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &uid}})
	switch {
	case apierrors.IsNotFound(err):
		// Gone meanwhile on its own: its deletion event counts it.
		c.ended.Delete(pod.UID)
		return nil
	case err != nil:
		c.ended.Delete(pod.UID)
		return err
	}
	levels.WithLabelValues(level).Inc()
	levelSeconds.WithLabelValues(level).Observe(now.Sub(n.NoticeAt).Seconds())
	return nil
}

// logLines is how much of each container's log a record keeps.
const logLines = 50

// record writes the victim's scene into a ConfigMap in preemption.RecordNamespace and
// trims the records to the retention limit. It returns the record's name.
func (c *Controller) record(ctx context.Context, pod *v1.Pod, n *preemption.Notice, now time.Time) (string, error) {
	sc := preemption.Scene{Victim: pod.Namespace + "/" + pod.Name, UID: string(pod.UID), Node: pod.Spec.NodeName, PriorityClass: pod.Spec.PriorityClassName,
		Preemptor: n.Preemptor, PreemptorUID: n.PreemptorUID, Reason: n.Reason, NoticeAt: n.NoticeAt, Deadline: n.Deadline, StoppedAt: now.UTC()}
	if pod.Spec.Priority != nil {
		sc.Priority = *pod.Spec.Priority
	}
	if s, ok := pod.Annotations[gpu.AnnotationAssignment]; ok {
		sc.Assignment, _ = gpu.DecodeAssignment(s)
	}
	statuses := map[string]v1.ContainerStatus{}
	for _, st := range pod.Status.ContainerStatuses {
		statuses[st.Name] = st
	}
	for _, ct := range pod.Spec.Containers {
		cs := preemption.ContainerScene{Name: ct.Name, Image: ct.Image, Limits: map[string]string{}}
		for k, q := range ct.Resources.Limits {
			cs.Limits[string(k)] = q.String()
		}
		st := statuses[ct.Name]
		cs.State, cs.LastState, cs.RestartCount = st.State, st.LastTerminationState, st.RestartCount
		cs.LastLog = c.lastLog(ctx, pod, ct.Name)
		sc.Containers = append(sc.Containers, cs)
	}
	body, err := json.MarshalIndent(sc, "", "  ")
	if err != nil {
		return "", err
	}
	if err := c.ensureNamespace(ctx); err != nil {
		return "", err
	}
	name := recordName(pod)
	cm := &v1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: preemption.RecordNamespace, Labels: map[string]string{
			preemption.RecordLabelKey: "true", "tessera.dev/victim-namespace": pod.Namespace,
		}, Annotations: map[string]string{"tessera.dev/victim": sc.Victim, "tessera.dev/preemptor": n.Preemptor}},
		Data: map[string]string{"scene.json": string(body)},
	}
	if _, err := c.client.CoreV1().ConfigMaps(preemption.RecordNamespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	return name, c.trim(ctx)
}

func recordName(pod *v1.Pod) string {
	n := pod.Name
	if len(n) > 40 {
		n = n[:40]
	}
	return strings.TrimSuffix("preempted-"+n, "-") + "-" + string(pod.UID)[:8]
}

// lastLog is the tail of a container's log, or why there is none.
func (c *Controller) lastLog(ctx context.Context, pod *v1.Pod, container string) string {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	lines := int64(logLines)
	b, err := c.client.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &v1.PodLogOptions{Container: container, TailLines: &lines}).DoRaw(ctx)
	if err != nil {
		return "unavailable: " + err.Error()
	}
	return string(b)
}

// ensureNamespace creates preemption.RecordNamespace where it is missing. It looks
// first: the shipped RBAC lets the scheduler read namespaces, not create
// them (the manifests create tessera-system).
func (c *Controller) ensureNamespace(ctx context.Context) error {
	_, err := c.client.CoreV1().Namespaces().Get(ctx, preemption.RecordNamespace, metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		return err
	}
	_, err = c.client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: preemption.RecordNamespace}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// trim deletes the oldest records beyond the retention limit.
func (c *Controller) trim(ctx context.Context) error {
	list, err := c.client.CoreV1().ConfigMaps(preemption.RecordNamespace).List(ctx, metav1.ListOptions{LabelSelector: preemption.RecordLabel})
	if err != nil {
		return err
	}
	items := list.Items
	if len(items) <= c.cfg.RecordRetention {
		return nil
	}
	sort.Slice(items, func(i, j int) bool {
		if !items[i].CreationTimestamp.Equal(&items[j].CreationTimestamp) {
			return items[i].CreationTimestamp.Before(&items[j].CreationTimestamp)
		}
		return items[i].Name < items[j].Name
	})
	for _, cm := range items[:len(items)-c.cfg.RecordRetention] {
		if err := c.client.CoreV1().ConfigMaps(preemption.RecordNamespace).Delete(ctx, cm.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// event records an Event on the victim, best effort.
func (c *Controller) event(ctx context.Context, pod *v1.Pod, kind, reason, msg string) {
	now := metav1.NewTime(c.now())
	ev := &v1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: pod.Name + ".", Namespace: pod.Namespace},
		InvolvedObject: v1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, APIVersion: "v1"},
		Reason:         reason, Message: msg, Type: kind, Source: v1.EventSource{Component: "tessera-scheduler"},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if _, err := c.client.CoreV1().Events(pod.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		klog.FromContext(ctx).V(2).Info("Could not record event", "reason", reason, "err", err)
	}
}

var (
	levels = metrics.NewCounterVec(&metrics.CounterOpts{
		Subsystem: "tessera_scheduler", Name: "preemption_levels_total",
		Help:           "Preemption victims by the level their preemption ended at: soft (exited or checkpointed within the grace period), hard (stopped at its end), cancelled (spared: the preemptor was placed or went away first).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"level"})
	levelSeconds = metrics.NewHistogramVec(&metrics.HistogramOpts{
		Subsystem: "tessera_scheduler", Name: "preemption_level_duration_seconds",
		Help:           "Time from a victim's notice to its end, by the level it ended at.",
		Buckets:        metrics.ExponentialBuckets(0.1, 2, 12),
		StabilityLevel: metrics.ALPHA,
	}, []string{"level"})
	registerOnce sync.Once
)

func registerMetrics() {
	registerOnce.Do(func() { legacyregistry.MustRegister(levels, levelSeconds) })
}
