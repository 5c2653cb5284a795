package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/pkg/agent/reclaim"
	"github.com/tessera-gpu/tessera/pkg/agent/tenantdir"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/patch"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
	"github.com/tessera-gpu/tessera/pkg/preemption"
)

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

// NoticeDir is the host directory mounted into a pod's GPU containers at
// preemption.ContainerDir.
func (a *Agent) NoticeDir(podUID string) string {
	return filepath.Join(a.opts.NoticeRoot, podUID)
}

// preemptionPass does the node's part of preemption for one look at the
// node's pods: it writes the notice into each new victim's containers,
// reports a checkpoint the workload wrote, and reclaims the GPUs of victims
// that have left.
func (a *Agent) preemptionPass(ctx context.Context, now time.Time) {
	if a.opts.NodePods == nil || a.opts.NoticeRoot == "" {
		return
	}
	logger := klog.FromContext(ctx)
	onNode := map[types.UID]bool{}
	running := map[types.UID]bool{}   // pods whose containers may still run
	withdrawn := map[types.UID]bool{} // running, and no longer under notice
	for _, p := range a.opts.NodePods() {
		onNode[p.UID] = true
		if !podgpu.Finished(p) {
			running[p.UID] = true
		}
		n, err := preemption.NoticeOf(p)
		if err != nil || n == nil {
			withdrawn[p.UID] = true
			continue
		}
		a.trackVictim(ctx, p, n)
		if _, done := p.Annotations[preemption.AnnotationCheckpointed]; !done {
			// The tenant writes this directory: look at the entry itself,
			// never through a link it placed there.
			if saved, err := tenantdir.HasFile(a.NoticeDir(string(p.UID)), preemption.CheckpointedFile); err != nil {
				logger.Error(err, "Could not look for a victim's checkpoint", "pod", klog.KObj(p))
			} else if saved {
				at := now.UTC().Format(time.RFC3339Nano)
				report := patch.Annotations("", map[string]*string{preemption.AnnotationCheckpointed: &at})
				if _, err := a.opts.Client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, report, metav1.PatchOptions{}); err != nil {
					logger.Error(err, "Could not report a victim's checkpoint", "pod", klog.KObj(p))
				} else {
					logger.Info("Preemption victim saved its checkpoint", "pod", klog.KObj(p))
				}
			}
		}
	}
	if now.Sub(a.lastNoticeSweep) >= noticeSweepEvery {
		a.lastNoticeSweep = now
		a.sweepNoticeDirs(ctx, onNode)
	}
	a.preemptMu.Lock()
	var gone []types.UID
	for uid, v := range a.victims {
		switch {
		case v.reclaiming:
		case running[uid] && withdrawn[uid]:
			// The scheduler spared it (its preemptor went elsewhere):
			// take the notice back from its containers.
			delete(a.victims, uid)
			for _, f := range []string{preemption.NoticeFile, preemption.CheckpointedFile} {
				_ = os.Remove(filepath.Join(a.NoticeDir(string(uid)), f))
			}
			logger.Info("Preemption notice withdrawn", "pod", klog.KRef(v.namespace, v.name))
		case !running[uid]:
			v.reclaiming = true
			gone = append(gone, uid)
		}
	}
	a.preemptMu.Unlock()
	for _, uid := range gone {
		go a.reclaimVictim(ctx, uid)
	}
}

// noticeSweepEvery is how often the notice directories of pods that left
// are removed.
const noticeSweepEvery = 10 * time.Second

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
func (a *Agent) sweepNoticeDirs(ctx context.Context, onNode map[types.UID]bool) {
	logger := klog.FromContext(ctx)
	entries, err := os.ReadDir(a.opts.NoticeRoot)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			logger.Error(err, "Listing preemption notice directories")
		}
		return
	}
	a.preemptMu.Lock()
	defer a.preemptMu.Unlock()
	for _, e := range entries {
		uid := types.UID(e.Name())
		if !e.IsDir() || onNode[uid] || a.victims[uid] != nil {
			continue
		}
		dir := filepath.Join(a.opts.NoticeRoot, e.Name())
		if noticed, err := tenantdir.HasFile(dir, preemption.NoticeFile); err == nil && noticed {
			v := &victim{}
			for _, d := range a.devices {
				v.gpus = append(v.gpus, d.UUID)
			}
			a.victims[uid] = v
			logger.Info("Adopting a preemption victim that left while no agent watched", "uid", uid)
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			logger.Error(err, "Removing a preemption notice directory", "uid", uid)
		}
	}
}

// trackVictim remembers a victim's GPUs and writes its notice file once.
func (a *Agent) trackVictim(ctx context.Context, p *v1.Pod, n *preemption.Notice) {
	a.preemptMu.Lock()
	_, known := a.victims[p.UID]
	if !known {
		v := &victim{namespace: p.Namespace, name: p.Name}
		if asg, err := podgpu.BoundAssignment(p); err == nil && asg != nil && asg.Node == a.opts.Node {
			for _, c := range asg.Containers {
				for _, g := range c.GPUs {
					if !slices.Contains(v.gpus, g.UUID) {
						v.gpus = append(v.gpus, g.UUID)
					}
				}
			}
		}
		a.victims[p.UID] = v
	}
	a.preemptMu.Unlock()
	if known {
		return
	}
	dir := a.NoticeDir(string(p.UID))
	b, _ := json.Marshal(n)
	if err := os.MkdirAll(dir, 0o777); err == nil {
		// The victim's containers can write dir: a link they placed at
		// the notice's name is replaced, never written through.
		err = tenantdir.WriteFile(dir, preemption.NoticeFile, b, 0o644)
		if err == nil {
			klog.FromContext(ctx).Info("Preemption notice delivered", "pod", klog.KObj(p), "deadline", n.Deadline, "preemptor", n.Preemptor)
			go a.notifyWorkload(ctx, p, b)
			return
		}
		klog.FromContext(ctx).Error(err, "Could not deliver a preemption notice", "pod", klog.KObj(p))
	}
}

// notifyWorkload sends the notice the other ways the pod's owner asked for:
// a signal to its GPU processes, a POST to the pod. Both are best effort:
// the file is the contract, these are courtesies to workloads that do not
// watch it.
func (a *Agent) notifyWorkload(ctx context.Context, p *v1.Pod, notice []byte) {
	logger := klog.FromContext(ctx).WithValues("pod", klog.KObj(p))
	if sig, err := preemption.SignalOf(p); err != nil {
		logger.Error(err, "Not signalling the preemption victim")
	} else if sig != 0 && a.reclaimer != nil {
		var gpus []string
		a.preemptMu.Lock()
		if v := a.victims[p.UID]; v != nil {
			gpus = slices.Clone(v.gpus)
		}
		a.preemptMu.Unlock()
		procs, err := a.reclaimer.Processes(string(p.UID), gpus)
		if err != nil {
			logger.Error(err, "Not signalling the preemption victim")
		}
		signal := a.opts.Signal
		if signal == nil {
			signal = func(pid uint32, sig syscall.Signal) error { return syscall.Kill(int(pid), sig) }
		}
		for _, pids := range procs {
			for _, pid := range pids {
				if err := signal(pid, sig); err != nil {
					logger.Error(err, "Signalling a preemption victim's process failed", "pid", pid, "signal", sig)
				} else {
					logger.Info("Signalled a preemption victim's process", "pid", pid, "signal", sig)
				}
			}
		}
	}
	target, err := preemption.URLOf(p)
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
func (a *Agent) reclaimVictim(ctx context.Context, uid types.UID) {
	a.preemptMu.Lock()
	v := a.victims[uid]
	wasStuck := v.stuck
	a.preemptMu.Unlock()
	logger := klog.FromContext(ctx).WithValues("pod", klog.KRef(v.namespace, v.name), "uid", uid)
	start := time.Now()
	result := "clean"
	if a.reclaimer != nil && len(v.gpus) > 0 {
		res, err := a.reclaimer.Reclaim(ctx, string(uid), v.gpus)
		killed := 0
		for _, pids := range res.Killed {
			killed += len(pids)
		}
		if killed > 0 {
			result = "killed"
			a.m.reclaimKilled.WithLabelValues(a.opts.Node).Add(float64(killed))
			logger.Info("Killed a preempted pod's leftover GPU processes", "killed", res.Killed)
		}
		switch {
		case errors.Is(err, reclaim.ErrStuck):
			result = "stuck"
			now := time.Now()
			for uuid, pids := range res.Stuck {
				reason := fmt.Sprintf("preempted pod %s/%s left processes %v that could not be killed", v.namespace, v.name, pids)
				a.health.Fault(uuid, now, reason)
				if !wasStuck {
					a.event(ctx, now, v1.EventTypeWarning, "ReclaimFailed", "Quarantine", fmt.Sprintf("GPU %s out of service: %s", uuid, reason))
				}
			}
			if !wasStuck {
				logger.Error(err, "GPUs of a preempted pod taken out of service until its leftover processes are gone")
			}
		case err != nil:
			// NVML could not be read: try again at the next pass.
			logger.Error(err, "Reclaim check failed; retrying")
			a.preemptMu.Lock()
			v.reclaiming = false
			a.preemptMu.Unlock()
			return
		}
	}
	if result == "stuck" {
		a.preemptMu.Lock()
		v.stuck, v.reclaiming = true, false
		a.preemptMu.Unlock()
		if wasStuck {
			return
		}
		a.m.reclaims.WithLabelValues(a.opts.Node, result).Inc()
		a.m.reclaimDuration.WithLabelValues(a.opts.Node).Observe(time.Since(start).Seconds())
		if err := a.Refresh(ctx, time.Now()); err != nil {
			logger.Error(err, "Publishing the GPU's fault failed; retrying at the next pass")
		}
		return
	}
	if !wasStuck {
		a.m.reclaims.WithLabelValues(a.opts.Node, result).Inc()
		a.m.reclaimDuration.WithLabelValues(a.opts.Node).Observe(time.Since(start).Seconds())
	}
	a.preemptMu.Lock()
	delete(a.victims, uid)
	a.reclaimed = append(a.reclaimed, string(uid))
	if len(a.reclaimed) > gpu.MaxReclaimed {
		a.reclaimed = a.reclaimed[len(a.reclaimed)-gpu.MaxReclaimed:]
	}
	a.preemptMu.Unlock()
	_ = os.RemoveAll(a.NoticeDir(string(uid)))
	if wasStuck {
		logger.Info("A preempted pod's stuck leftover processes are gone; its GPUs are reclaimed and return to service after the quiet period", "gpus", v.gpus)
	} else {
		logger.Info("Preempted pod's GPUs reclaimed", "gpus", v.gpus, "result", result, "took", time.Since(start))
	}
	if err := a.Refresh(ctx, time.Now()); err != nil {
		logger.Error(err, "Publishing the reclaim failed; retrying at the next pass")
	}
}

// reclaimedList is the inventory's Reclaimed field.
func (a *Agent) reclaimedList() []string {
	a.preemptMu.Lock()
	defer a.preemptMu.Unlock()
	return slices.Clone(a.reclaimed)
}
