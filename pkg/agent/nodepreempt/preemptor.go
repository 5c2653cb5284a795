package nodepreempt

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/pkg/agent/reclaim"
	"github.com/tessera-gpu/tessera/pkg/agent/tenantdir"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/patch"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
	"github.com/tessera-gpu/tessera/pkg/preemption"
)

// Config is what a Preemptor works with.
type Config struct {
	Node string
	// Client reports a victim's checkpoint on its pod.
	Client kubernetes.Interface
	// NodePods lists the node's pods (the informer the device plugin
	// reads); nil, or an empty NoticeRoot, turns the node's part of
	// preemption off.
	NodePods func() []*v1.Pod
	// NoticeRoot holds each pod's notice directory, mounted into its GPU
	// containers at preemption.ContainerDir.
	NoticeRoot string
	// GPUs are the node's GPU UUIDs: the reclaim of a victim whose GPUs are
	// not known any more (adopted after a restart) looks at all of them.
	GPUs []string
	// ClaimGPUs, when set, gives the GPUs of the DRA claims prepared on the
	// node, per pod they are reserved for (the driver's): a claim holder's
	// GPUs are not in its pod, and its leftovers are reclaimed there too.
	ClaimGPUs func() map[types.UID][]string
	// Reclaimer finds and kills a victim's leftover GPU processes; nil on a
	// node without GPUs.
	Reclaimer *reclaim.Reclaimer
	// Signal sends a victim's GPU processes the signal its pod asked for
	// (kill(2) when nil).
	Signal func(pid uint32, sig syscall.Signal) error
	// Quarantine takes a GPU out of service, renewed while a victim's
	// leftover process lives there (health.Tracker.Fault).
	Quarantine func(uuid string, now time.Time, reason string)
	// Event records a node event.
	Event func(ctx context.Context, eventType, reason, note string)
	// Publish publishes the node's inventory again: the reclaimed list, a
	// GPU out of service.
	Publish func(ctx context.Context) error
}

// Preemptor carries out the node's part of preemption. Pass runs from one
// goroutine; reclaims run on their own.
type Preemptor struct {
	cfg Config

	mu        sync.Mutex
	victims   map[types.UID]*victim
	reclaimed []string
	// lastSweep is when Pass last removed the notice directories of pods
	// that left (Pass's goroutine alone uses it).
	lastSweep time.Time

	reclaims, reclaimKilled *prometheus.CounterVec
	reclaimDuration         *prometheus.HistogramVec
}

// victim is a pod of this node under a preemption notice.
type victim struct {
	namespace, name string
	gpus            []string
	reclaiming      bool
	// stuck: a leftover survived the kill. The victim stays, and each pass
	// tries again: while the process lives its GPU stays out of service
	// (the fault renewed, not left to expire after the quiet period with
	// the process still holding the GPU); when it is gone at last, the
	// victim is reclaimed as any other.
	stuck bool
}

// New returns a Preemptor with its series at 0 for every label set they
// take on the node (so that increase() sees their first event).
func New(cfg Config) *Preemptor {
	p := &Preemptor{cfg: cfg, victims: map[types.UID]*victim{},
		reclaims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tessera_reclaim_total",
			Help: "Preempted pods whose GPUs the agent checked, by result: clean (no process left), killed (leftovers killed), stuck (a leftover survived; its GPU was taken out of service).",
		}, []string{"node", "result"}),
		reclaimKilled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tessera_reclaim_killed_processes_total",
			Help: "Leftover GPU processes of preempted pods killed by the agent.",
		}, []string{"node"}),
		reclaimDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tessera_reclaim_duration_seconds",
			Help:    "Time the reclaim of a preempted pod that left took: the check of its GPUs' processes, kills and the wait for them included.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 9),
		}, []string{"node"}),
	}
	for _, r := range []string{"clean", "killed", "stuck"} {
		p.reclaims.WithLabelValues(cfg.Node, r)
	}
	p.reclaimKilled.WithLabelValues(cfg.Node)
	if p.cfg.Signal == nil {
		p.cfg.Signal = func(pid uint32, sig syscall.Signal) error { return syscall.Kill(int(pid), sig) }
	}
	return p
}

// Collectors are the Preemptor's series, for the agent's registry.
func (p *Preemptor) Collectors() []prometheus.Collector {
	return []prometheus.Collector{p.reclaims, p.reclaimKilled, p.reclaimDuration}
}

// NoticeDir is the host directory mounted into a pod's GPU containers at
// preemption.ContainerDir.
func (p *Preemptor) NoticeDir(podUID string) string {
	return filepath.Join(p.cfg.NoticeRoot, podUID)
}

// Reclaimed are the victims reclaimed lately (the inventory's Reclaimed).
func (p *Preemptor) Reclaimed() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.reclaimed)
}

// noticeSweepEvery is how often the notice directories of pods that left
// are removed.
const noticeSweepEvery = 10 * time.Second

// Pass does the node's part of preemption for one look at the node's pods
// (plan), at now.
func (p *Preemptor) Pass(ctx context.Context, now time.Time) {
	if p.cfg.NodePods == nil || p.cfg.NoticeRoot == "" {
		return
	}
	logger := klog.FromContext(ctx)
	pods := p.cfg.NodePods()
	if now.Sub(p.lastSweep) >= noticeSweepEvery {
		// First, so that a victim adopted from its directory is
		// reclaimed in this pass.
		p.lastSweep = now
		onNode := make(map[types.UID]bool, len(pods))
		for _, pod := range pods {
			onNode[pod.UID] = true
		}
		p.sweepNoticeDirs(ctx, onNode)
	}
	p.mu.Lock()
	tracked := make(map[types.UID]known, len(p.victims))
	for uid, v := range p.victims {
		tracked[uid] = known{reclaiming: v.reclaiming}
	}
	p.mu.Unlock()
	var claimGPUs map[types.UID][]string
	if p.cfg.ClaimGPUs != nil {
		claimGPUs = p.cfg.ClaimGPUs()
	}
	s := plan(p.cfg.Node, pods, tracked, claimGPUs)
	for _, nv := range s.notify {
		p.deliver(ctx, nv)
	}
	for _, pod := range s.checkpoint {
		p.reportCheckpoint(ctx, pod, now)
	}
	var gone []types.UID
	p.mu.Lock()
	for _, uid := range s.withdraw {
		v := p.victims[uid]
		if v == nil || v.reclaiming {
			continue
		}
		delete(p.victims, uid)
		for _, f := range []string{preemption.NoticeFile, preemption.CheckpointedFile} {
			_ = os.Remove(filepath.Join(p.NoticeDir(string(uid)), f))
		}
		logger.Info("Preemption notice withdrawn", "pod", klog.KRef(v.namespace, v.name))
	}
	for _, uid := range s.reclaim {
		if v := p.victims[uid]; v != nil && !v.reclaiming {
			v.reclaiming = true
			gone = append(gone, uid)
		}
	}
	p.mu.Unlock()
	for _, uid := range gone {
		go p.reclaimVictim(ctx, uid)
	}
}

// reportCheckpoint reports on its pod the checkpoint a victim's workload
// wrote, if it did.
func (p *Preemptor) reportCheckpoint(ctx context.Context, pod *v1.Pod, now time.Time) {
	logger := klog.FromContext(ctx)
	// The tenant writes this directory: look at the entry itself, never
	// through a link it placed there.
	saved, err := tenantdir.HasFile(p.NoticeDir(string(pod.UID)), preemption.CheckpointedFile)
	if err != nil {
		logger.Error(err, "Could not look for a victim's checkpoint", "pod", klog.KObj(pod))
		return
	}
	if !saved {
		return
	}
	at := now.UTC().Format(time.RFC3339Nano)
	report := patch.Annotations("", map[string]*string{preemption.AnnotationCheckpointed: &at})
	if _, err := p.cfg.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, report, metav1.PatchOptions{}); err != nil {
		logger.Error(err, "Could not report a victim's checkpoint", "pod", klog.KObj(pod))
		return
	}
	logger.Info("Preemption victim saved its checkpoint", "pod", klog.KObj(pod))
}

// Reclaiming names a preempted pod whose leftover processes may still hold
// one of gpus: a victim that finished or left and whose GPUs the agent has
// not yet reclaimed (or could not: a process survived the kill). A GPU
// such a victim held through a DRA claim is free as soon as the ResourceClaim
// controller deallocates the claim, before any leftover is killed, so the
// DRA driver asks here before it prepares a claim there (kubelet retries
// it), as the scheduler holds a device-plugin victim's slices until the
// inventory lists it reclaimed. A victim still running is not named: it
// holds its claim, so nothing new overlaps it.
func (p *Preemptor) Reclaiming(gpus []string) (victim string, busy bool) {
	var running map[types.UID]bool
	if p.cfg.NodePods != nil {
		pods := p.cfg.NodePods()
		running = make(map[types.UID]bool, len(pods))
		for _, pod := range pods {
			if !podgpu.Finished(pod) {
				running[pod.UID] = true
			}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, uid := range slices.Sorted(maps.Keys(p.victims)) {
		v := p.victims[uid]
		if running[uid] && !v.reclaiming && !v.stuck {
			continue
		}
		for _, g := range gpus {
			if slices.Contains(v.gpus, g) {
				if v.name == "" {
					return string(uid), true // adopted after a restart: known by UID
				}
				return v.namespace + "/" + v.name, true
			}
		}
	}
	return "", false
}

// sweepNoticeDirs removes the notice directory of every pod no longer on
// this node (one is made for every GPU container, victim or not), except
// victims still being reclaimed: their directories go when reclaim ends.
// The node's pods come from the informer the device plugin reads, so a
// directory made for a pod is never older than the pod's entry there.
//
// A directory that still holds its notice belongs to a victim that left
// while no agent watched (this one restarted: victims are otherwise known
// only in memory): it is adopted as a victim, so the pass reclaims it and
// lists it as reclaimed, instead of the scheduler holding its slices until
// its reclaim timeout (found by the soak). Its GPUs are not known any more,
// so the reclaim looks on all of the node's. A notice a tenant forged in its
// own directory costs nothing: its pod's leftovers are looked for, and the
// scheduler ignores a reclaim of a pod it did not preempt.
func (p *Preemptor) sweepNoticeDirs(ctx context.Context, onNode map[types.UID]bool) {
	logger := klog.FromContext(ctx)
	entries, err := os.ReadDir(p.cfg.NoticeRoot)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			logger.Error(err, "Listing preemption notice directories")
		}
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range entries {
		uid := types.UID(e.Name())
		if !e.IsDir() || onNode[uid] || p.victims[uid] != nil {
			continue
		}
		dir := filepath.Join(p.cfg.NoticeRoot, e.Name())
		if noticed, err := tenantdir.HasFile(dir, preemption.NoticeFile); err == nil && noticed {
			p.victims[uid] = &victim{gpus: slices.Clone(p.cfg.GPUs)}
			logger.Info("Adopting a preemption victim that left while no agent watched", "uid", uid)
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			logger.Error(err, "Removing a preemption notice directory", "uid", uid)
		}
	}
}

// deliver tracks a new victim and writes its notice file once, then sends
// the notice the other ways its pod asked for.
func (p *Preemptor) deliver(ctx context.Context, nv newVictim) {
	pod := nv.pod
	p.mu.Lock()
	_, known := p.victims[pod.UID]
	if !known {
		p.victims[pod.UID] = &victim{namespace: pod.Namespace, name: pod.Name, gpus: nv.gpus}
	}
	p.mu.Unlock()
	if known {
		return
	}
	dir := p.NoticeDir(string(pod.UID))
	b, _ := json.Marshal(nv.notice)
	if err := os.MkdirAll(dir, 0o777); err == nil {
		// The victim's containers can write dir: a link they placed at
		// the notice's name is replaced, never written through.
		err = tenantdir.WriteFile(dir, preemption.NoticeFile, b, 0o644)
		if err == nil {
			klog.FromContext(ctx).Info("Preemption notice delivered", "pod", klog.KObj(pod), "deadline", nv.notice.Deadline, "preemptor", nv.notice.Preemptor)
			go p.notifyWorkload(ctx, pod, b)
			return
		}
		klog.FromContext(ctx).Error(err, "Could not deliver a preemption notice", "pod", klog.KObj(pod))
	}
}

// notifyWorkload sends the notice the other ways the pod's owner asked for:
// a signal to its GPU processes, a POST to the pod. Both are best effort:
// the file is the contract, these are courtesies to workloads that do not
// watch it.
func (p *Preemptor) notifyWorkload(ctx context.Context, pod *v1.Pod, notice []byte) {
	logger := klog.FromContext(ctx).WithValues("pod", klog.KObj(pod))
	if sig, err := preemption.SignalOf(pod); err != nil {
		logger.Error(err, "Not signalling the preemption victim")
	} else if sig != 0 && p.cfg.Reclaimer != nil {
		var gpus []string
		p.mu.Lock()
		if v := p.victims[pod.UID]; v != nil {
			gpus = slices.Clone(v.gpus)
		}
		p.mu.Unlock()
		procs, err := p.cfg.Reclaimer.Processes(string(pod.UID), gpus)
		if err != nil {
			logger.Error(err, "Not signalling the preemption victim")
		}
		for _, pids := range procs {
			for _, pid := range pids {
				if err := p.cfg.Signal(pid, sig); err != nil {
					logger.Error(err, "Signalling a preemption victim's process failed", "pid", pid, "signal", sig)
				} else {
					logger.Info("Signalled a preemption victim's process", "pid", pid, "signal", sig)
				}
			}
		}
	}
	target, err := preemption.URLOf(pod)
	if err != nil {
		logger.Error(err, "Not calling the preemption victim")
		return
	}
	if target == "" {
		return
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(notice))
	if err != nil {
		logger.Error(err, "Not calling the preemption victim")
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := workloadClient.Do(req)
	if err != nil {
		logger.Error(err, "Calling the preemption victim failed", "url", target)
		return
	}
	// The answer is the pod's: read a little of it, never all.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxWorkloadAnswer))
	resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		logger.Info("The preemption victim answered with a redirect, which the agent does not follow", "url", target, "status", resp.Status)
		return
	}
	logger.Info("Called the preemption victim", "url", target, "status", resp.Status)
}

// workloadClient calls a pod's checkpoint URL. The pod chooses the port,
// the path and the answer, so: no redirects (a 3xx would have the agent
// POST wherever the pod says), no proxy from the agent's environment, and a
// short deadline for the whole exchange.
var workloadClient = &http.Client{
	Timeout:       5 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	Transport: &http.Transport{
		Proxy:                  nil,
		DisableKeepAlives:      true,
		ResponseHeaderTimeout:  5 * time.Second,
		MaxResponseHeaderBytes: 16 << 10,
	},
}

// maxWorkloadAnswer bounds what the agent reads of a pod's answer.
const maxWorkloadAnswer = 4 << 10

// reclaimVictim makes sure no process of a victim that left holds its GPUs,
// then lists it as reclaimed in the inventory, which lets the scheduler give
// its slices to the preemptor. A process that will not die takes its GPU
// out of service instead, for as long as it lives: the victim is tried
// again at every pass, and reported (event, counter) once.
func (p *Preemptor) reclaimVictim(ctx context.Context, uid types.UID) {
	p.mu.Lock()
	v := p.victims[uid]
	wasStuck := v.stuck
	p.mu.Unlock()
	logger := klog.FromContext(ctx).WithValues("pod", klog.KRef(v.namespace, v.name), "uid", uid)
	node := p.cfg.Node
	start := time.Now()
	result := "clean"
	if p.cfg.Reclaimer != nil && len(v.gpus) > 0 {
		res, err := p.cfg.Reclaimer.Reclaim(ctx, string(uid), v.gpus)
		killed := 0
		for _, pids := range res.Killed {
			killed += len(pids)
		}
		if killed > 0 {
			result = "killed"
			p.reclaimKilled.WithLabelValues(node).Add(float64(killed))
			logger.Info("Killed a preempted pod's leftover GPU processes", "killed", res.Killed)
		}
		switch {
		case errors.Is(err, reclaim.ErrStuck):
			result = "stuck"
			now := time.Now()
			for uuid, pids := range res.Stuck {
				reason := fmt.Sprintf("preempted pod %s/%s left processes %v that could not be killed", v.namespace, v.name, pids)
				p.cfg.Quarantine(uuid, now, reason)
				if !wasStuck {
					p.cfg.Event(ctx, v1.EventTypeWarning, "ReclaimFailed", fmt.Sprintf("GPU %s out of service: %s", uuid, reason))
				}
			}
			if !wasStuck {
				logger.Error(err, "GPUs of a preempted pod taken out of service until its leftover processes are gone")
			}
		case err != nil:
			// NVML could not be read: try again at the next pass.
			logger.Error(err, "Reclaim check failed; retrying")
			p.mu.Lock()
			v.reclaiming = false
			p.mu.Unlock()
			return
		}
	}
	if result == "stuck" {
		p.mu.Lock()
		v.stuck, v.reclaiming = true, false
		p.mu.Unlock()
		if wasStuck {
			return
		}
		p.reclaims.WithLabelValues(node, result).Inc()
		p.reclaimDuration.WithLabelValues(node).Observe(time.Since(start).Seconds())
		if err := p.cfg.Publish(ctx); err != nil {
			logger.Error(err, "Publishing the GPU's fault failed; retrying at the next pass")
		}
		return
	}
	if !wasStuck {
		p.reclaims.WithLabelValues(node, result).Inc()
		p.reclaimDuration.WithLabelValues(node).Observe(time.Since(start).Seconds())
	}
	p.mu.Lock()
	delete(p.victims, uid)
	p.reclaimed = append(p.reclaimed, string(uid))
	if len(p.reclaimed) > gpu.MaxReclaimed {
		p.reclaimed = p.reclaimed[len(p.reclaimed)-gpu.MaxReclaimed:]
	}
	p.mu.Unlock()
	_ = os.RemoveAll(p.NoticeDir(string(uid)))
	if wasStuck {
		logger.Info("A preempted pod's stuck leftover processes are gone; its GPUs are reclaimed and return to service after the quiet period", "gpus", v.gpus)
	} else {
		logger.Info("Preempted pod's GPUs reclaimed", "gpus", v.gpus, "result", result, "took", time.Since(start))
	}
	if err := p.cfg.Publish(ctx); err != nil {
		logger.Error(err, "Publishing the reclaim failed; retrying at the next pass")
	}
}
