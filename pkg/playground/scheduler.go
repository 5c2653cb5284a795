package playground

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/component-base/configz"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"

	"github.com/tessera-gpu/tessera/deploy"
	preemptioncontroller "github.com/tessera-gpu/tessera/pkg/preemption/controller"
	"github.com/tessera-gpu/tessera/pkg/scheduler"
)

// The Lease the shipped configuration elects tessera-scheduler's leader on
// (deploy/scheduler-config.yaml), and the playground's election timing:
// short, so a takeover is seconds, with the renew deadline well inside the
// lease so a leader stops before another may start.
const (
	leaseNamespace = "kube-system"
	leaseName      = "tessera-scheduler"
	leaseDuration  = 4 * time.Second
	renewDeadline  = 2 * time.Second
	retryPeriod    = 500 * time.Millisecond
)

// schedulerConfig is the shipped scheduler configuration for a cluster of
// one scheduler, on this playground's API server, with reclaimTimeout for
// preemption.reclaimTimeout when it is not zero.
func schedulerConfig(kubeconfig string, reclaimTimeout time.Duration) (string, error) {
	cfg := deploy.StandaloneSchedulerConfig()
	if reclaimTimeout > 0 {
		shipped := regexp.MustCompile(`(?m)^(\s+reclaimTimeout:) \S+$`)
		if len(shipped.FindAllString(cfg, -1)) != 1 {
			return "", errors.New("the shipped scheduler configuration has no single preemption.reclaimTimeout to set")
		}
		cfg = shipped.ReplaceAllString(cfg, "${1} "+reclaimTimeout.String())
	}
	return cfg + fmt.Sprintf("clientConnection: {kubeconfig: %q}\n", kubeconfig), nil
}

// startScheduler starts the playground's tessera-scheduler: one without an
// election (replicas 0), or Options.SchedulerReplicas electing a leader on
// the shipped Lease, one of them included. Every scheduler serves its
// metrics on one port, so SchedulerMetricsURL stays put across restarts and
// takeovers.
func (c *Cluster) startScheduler(ctx context.Context, replicas int) error {
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	c.schedPort = ports[0]
	c.SchedulerMetricsURL = fmt.Sprintf("https://127.0.0.1:%d/metrics", c.schedPort)
	if replicas <= 0 {
		sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		done, err := c.runScheduler(sctx)
		if err != nil {
			cancel()
			return err
		}
		c.schedStop, c.schedDone = cancel, done
		return nil
	}
	for range replicas {
		c.startReplica(ctx)
	}
	return nil
}

// runScheduler runs tessera-scheduler as cmd/tessera-scheduler does — the
// kube-scheduler command's options, with the TesseraGPU plugins — until ctx
// ends; done closes when it has stopped.
func (c *Cluster) runScheduler(ctx context.Context) (done chan struct{}, err error) {
	dir := filepath.Join(c.Dir, "scheduler")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	// tessera-scheduler acts as its service account, so the admission
	// policies and RBAC treat it as they would in a cluster.
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := WriteKubeconfig(As(c.Config, deploy.SchedulerUser, nil), kubeconfig); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "config.yaml")
	cfg, err := schedulerConfig(kubeconfig, c.reclaimTimeout)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	opts := options.NewOptions()
	fs := pflag.NewFlagSet("tessera-scheduler", pflag.ContinueOnError)
	for _, f := range opts.Flags.FlagSets {
		fs.AddFlagSet(f)
	}
	if err := fs.Parse([]string{"--config", path,
		"--bind-address", "127.0.0.1", "--secure-port", fmt.Sprint(c.schedPort), "--cert-dir", dir,
		"--authentication-kubeconfig", kubeconfig, "--authorization-kubeconfig", kubeconfig,
		"--authorization-always-allow-paths", "/healthz,/readyz,/livez,/metrics",
	}); err != nil {
		return nil, err
	}
	cc, sched, err := app.Setup(ctx, opts, scheduler.RegisterWith(preemptioncontroller.Start))
	if err != nil {
		return nil, fmt.Errorf("tessera-scheduler: %w", err)
	}
	// app.Run registers the configuration on the process-wide configz
	// endpoint; the next scheduler in this process must find it free.
	configz.Delete("componentconfig")
	done = make(chan struct{})
	go func() {
		defer close(done)
		if err := app.Run(ctx, cc, sched); err != nil && ctx.Err() == nil {
			klog.FromContext(ctx).Error(err, "tessera-scheduler stopped")
		}
	}()
	return done, nil
}

// schedulerReplica is one of several tessera-schedulers electing a leader
// on the shipped Lease, with the shipped RBAC. kube-scheduler's own election
// ends the process when a leader stops, so the playground elects around it,
// with client-go's elector as kube-scheduler uses it: the replica that holds
// the lease runs a scheduler, the others wait — kube-scheduler with
// delayCacheUntilActive, whose standby starts its informers on taking over.
type schedulerReplica struct {
	identity string
	kill     context.CancelFunc
	done     chan struct{}
	active   atomic.Bool
}

// startReplica starts a replica campaigning for the lease until it is
// killed. A replica that loses the lease stops its scheduler and campaigns
// again, as a restarted pod would.
func (c *Cluster) startReplica(ctx context.Context) *schedulerReplica {
	c.schedMu.Lock()
	c.replicaSeq++
	r := &schedulerReplica{identity: fmt.Sprintf("tessera-scheduler-%d", c.replicaSeq), done: make(chan struct{})}
	c.replicas = append(c.replicas, r)
	c.schedMu.Unlock()
	logger := klog.FromContext(ctx).WithValues("replica", r.identity)
	rctx, kill := context.WithCancel(klog.NewContext(context.WithoutCancel(ctx), logger))
	r.kill = kill
	client := kubernetes.NewForConfigOrDie(As(c.Config, deploy.SchedulerUser, nil))
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: leaseNamespace, Name: leaseName},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: r.identity},
	}
	go func() {
		defer close(r.done)
		for rctx.Err() == nil {
			r.campaign(c, rctx, lock, logger)
			select {
			case <-rctx.Done():
			case <-time.After(retryPeriod):
			}
		}
	}()
	return r
}

// campaign runs one election: when it wins, the replica's scheduler runs
// until the lease is lost or the replica killed; it returns when both the
// elector and the scheduler have stopped.
func (r *schedulerReplica) campaign(c *Cluster, ctx context.Context, lock resourcelock.Interface, logger klog.Logger) {
	ectx, stop := context.WithCancel(ctx)
	defer stop()
	// The elector calls OnStartedLeading on a goroutine of its own; the
	// scheduler runs here instead, so this waits for it.
	lead := make(chan context.Context, 1)
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, Name: r.identity,
		LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) { lead <- lctx },
			OnStoppedLeading: func() {},
		},
		// A killed replica does not release the lease: its successor
		// takes over when it expires, as after a crash.
		ReleaseOnCancel: false,
	})
	if err != nil {
		logger.Error(err, "Leader election")
		return
	}
	elected := make(chan struct{})
	go func() {
		defer close(elected)
		elector.Run(ectx)
	}()
	select {
	case <-elected:
		return // killed before it led
	case lctx := <-lead:
		done, err := c.runScheduler(lctx)
		if err != nil {
			logger.Error(err, "Leader could not start its scheduler; campaigning again")
			stop()
		} else {
			logger.Info("Leading: scheduler started")
			r.active.Store(true)
			<-done
			r.active.Store(false)
			logger.Info("No longer leading: scheduler stopped")
		}
		<-elected
	}
}

// ActiveSchedulers counts the schedulers running now: with replicas, those
// leading; at most one at any time is the election's promise.
func (c *Cluster) ActiveSchedulers() int {
	c.schedMu.Lock()
	defer c.schedMu.Unlock()
	if len(c.replicas) == 0 {
		return 1
	}
	n := 0
	for _, r := range c.replicas {
		if r.active.Load() {
			n++
		}
	}
	return n
}

// ErrNoLeader says no replica leads now (a takeover in progress).
var ErrNoLeader = errors.New("no tessera-scheduler replica leads now")

// RestartScheduler stops tessera-scheduler and starts a new one, which must
// count every existing assignment before it books anything. With replicas,
// it kills the leader (a crash: the lease is not released), whose successor
// takes over when the lease expires, and starts a new replica in its place.
// It returns the killed replica's identity ("" with one scheduler).
func (c *Cluster) RestartScheduler(ctx context.Context) (string, error) {
	c.schedMu.Lock()
	var leader *schedulerReplica
	for _, r := range c.replicas {
		if r.active.Load() {
			leader = r
		}
	}
	replicas := len(c.replicas)
	c.schedMu.Unlock()
	if replicas == 0 {
		if c.schedStop != nil { // not stopped by StopScheduler
			c.schedStop()
			<-c.schedDone
		}
		sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		done, err := c.runScheduler(sctx)
		if err != nil {
			cancel()
			return "", err
		}
		c.schedStop, c.schedDone = cancel, done
		return "", nil
	}
	if leader == nil {
		return "", ErrNoLeader
	}
	leader.kill()
	<-leader.done
	c.schedMu.Lock()
	for i, r := range c.replicas {
		if r == leader {
			c.replicas = append(c.replicas[:i], c.replicas[i+1:]...)
			break
		}
	}
	c.schedMu.Unlock()
	c.startReplica(ctx)
	return leader.identity, nil
}

// StopScheduler stops every tessera-scheduler, replicas included, and
// starts none in their place, as a cluster whose scheduler Deployment was
// scaled to zero (or whose every replica crash-loops): GPU pods stay
// pending and nothing answers on SchedulerMetricsURL.
func (c *Cluster) StopScheduler() {
	c.stopSchedulers()
}

// stopSchedulers stops every scheduler (Down, StopScheduler).
func (c *Cluster) stopSchedulers() {
	c.schedMu.Lock()
	replicas := c.replicas
	c.replicas = nil
	c.schedMu.Unlock()
	for _, r := range replicas {
		r.kill()
	}
	for _, r := range replicas {
		<-r.done
	}
	if c.schedStop != nil {
		c.schedStop()
		<-c.schedDone
		c.schedStop = nil
	}
}
