package playground

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	dpv1beta1 "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"
	kubeletdra "k8s.io/kubernetes/pkg/kubelet/cm/dra"

	"github.com/tessera-gpu/tessera/pkg/agent/dra"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/patch"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
	"github.com/tessera-gpu/tessera/pkg/preemption"
)

// Annotations that script a playground pod's simulated containers.
const (
	// AnnotationRunFor makes the containers exit successfully after the
	// given duration ("30s"); without it they run until deleted.
	AnnotationRunFor = "playground.tessera.dev/run-for"
	// AnnotationOnPreemption is what the workload does when its
	// preemption notice appears: "exit" (it saves its state and exits),
	// "checkpoint" (it saves its state and writes the checkpointed file),
	// or "ignore" (the default: it knows nothing of the contract).
	AnnotationOnPreemption = "playground.tessera.dev/on-preemption"
	// AnnotationLeftover leaves the containers' GPU processes behind when
	// they stop: "process" (until killed) or "unkillable".
	AnnotationLeftover = "playground.tessera.dev/leftover"
	// AnnotationExitMessage makes a run-for pod's containers fail (exit 1)
	// with this termination message instead of succeeding: a workload
	// that ran out of GPU memory, for one.
	AnnotationExitMessage = "playground.tessera.dev/exit-message"
)

// kubelet is the playground's stand-in for one node's kubelet: it registers
// the Node, runs kubelet's own device-plugin registration server and plugin
// client (devicemanager/plugin/v1beta1) on this node's socket, serves
// kubelet's own pod-resources server, and "runs" the pods bound here: each
// GPU container gets its slots through GetPreferredAllocation, Allocate and
// PreStartContainer — exactly the calls, in kubelet's order, that a real
// node makes — before the pod is reported Running. Containers run nothing;
// their GPU processes are simulated on the node's NVML mock (see load).
type kubelet struct {
	node   string
	client kubernetes.Interface
	// dir holds device-plugins/ and pod-resources/ as /var/lib/kubelet does.
	dir  string
	load *load
	// noticeRoot is the agent's preemption notice root: a container sees
	// its pod's directory under it.
	noticeRoot string
	// cgroupRoot holds the pods' cgroups (podCgroup), made before a pod's
	// containers start, as kubelet's pod container manager does.
	cgroupRoot string
	// agentUp says whether the node's agent runs: its pod
	// (Options.AgentDaemonSet) is ready only then.
	agentUp func() bool

	// nodeCtx is the node's life; each run of kubelet (between restarts)
	// has its own, ended by runCancel, and runDone waits for its workers.
	nodeCtx   context.Context
	runCancel context.CancelFunc
	runDone   sync.WaitGroup

	// runMu guards this run's servers, work queue and pod informer (apart
	// from mu: the pod-resources provider reads pods holding mu).
	runMu    sync.Mutex
	reg      dpv1beta1.Server
	podRes   *grpc.Server
	queue    workqueue.TypedRateLimitingInterface[types.UID]
	informer cache.SharedIndexInformer

	mu sync.Mutex

	plugin  dpv1beta1.DevicePlugin
	devices map[string]bool                   // slot → healthy
	held    map[types.UID]map[string][]string // pod → container → slots
	running map[types.UID]*v1.Pod             // pods whose containers run
	stopAt  map[types.UID]*time.Timer         // run-for timers
	reacted map[types.UID]bool                // preemption notices acted on
	// draNode: the node serves its GPUs through the DRA driver; dra is
	// kubelet's own DRA manager (pkg/kubelet/cm/dra) then, draPods the
	// pods whose claims it prepared, and draUp whether the agent's driver
	// is registered with it.
	draNode bool
	dra     *kubeletdra.Manager
	draPods map[types.UID]*v1.Pod
	draUp   atomic.Bool
	// exited are the pods whose containers ended by themselves: they are
	// not started again while the API still shows them Running (their
	// status update in flight), as kubelet does not restart them.
	exited map[types.UID]bool
	synced map[string]int64 // last tessera.dev/gpu capacity written

	// api is kubelet's HTTPS API on 127.0.0.1:apiPort (kubeletapi.go).
	api     *http.Server
	apiPort int
}

func (k *kubelet) pluginDir() string { return filepath.Join(k.dir, "device-plugins") }
func (k *kubelet) podResourcesSocket() string {
	return filepath.Join(k.dir, "pod-resources", "kubelet.sock")
}

// nodeCapacity is what every playground node offers besides GPUs.
var nodeCapacity = v1.ResourceList{
	v1.ResourceCPU:    resource.MustParse("128"),
	v1.ResourceMemory: resource.MustParse("1Ti"),
	v1.ResourcePods:   resource.MustParse("250"),
}

func newKubelet(node, dir, noticeRoot string, client kubernetes.Interface, l *load) *kubelet {
	return &kubelet{
		node: node, dir: dir, client: client, load: l, noticeRoot: noticeRoot,
		devices: map[string]bool{}, held: map[types.UID]map[string][]string{},
		running: map[types.UID]*v1.Pod{}, draPods: map[types.UID]*v1.Pod{},
		stopAt: map[types.UID]*time.Timer{}, reacted: map[types.UID]bool{}, exited: map[types.UID]bool{},
	}
}

// draPluginDir is where the node's DRA driver keeps its socket and
// checkpoint (kubelet's plugins/gpu.tessera.dev on a node).
func (k *kubelet) draPluginDir() string { return filepath.Join(k.dir, "dra") }

// startDRA starts kubelet's DRA manager, with its checkpoint under the
// node's kubelet directory.
func (k *kubelet) startDRA(ctx context.Context) error {
	dir := filepath.Join(k.dir, "dra-state")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	m, err := kubeletdra.NewManager(klog.FromContext(ctx), k.client, dir)
	if err != nil {
		return err
	}
	getNode := func(ctx context.Context) (*v1.Node, error) {
		return k.client.CoreV1().Nodes().Get(ctx, k.node, metav1.GetOptions{})
	}
	if err := m.Start(ctx, k.GetActivePods, getNode, sourcesNotReady{}); err != nil {
		return err
	}
	k.dra = m
	return nil
}

// sourcesNotReady keeps kubelet's DRA manager from unpreparing on its own:
// the stand-in kubelet unprepares a pod's claims when the pod ends.
type sourcesNotReady struct{}

func (sourcesNotReady) AddSource(string)           {}
func (sourcesNotReady) AllReady() bool             { return false }
func (sourcesNotReady) SeenAllSources(string) bool { return false }

// registerDRA registers the agent's driver socket with kubelet's DRA
// manager once the agent serves it, as kubelet's plugin watcher does on a
// node.
func (k *kubelet) registerDRA(ctx context.Context) {
	socket := dra.SocketPath(k.draPluginDir())
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		_, err := os.Stat(socket)
		return err == nil, nil
	})
	if err != nil {
		return // the agent stopped first
	}
	if err := k.dra.GetWatcherHandler().RegisterPlugin(ctx, dra.DriverName, socket, []string{drapbv1.DRAPluginService}, nil); err != nil {
		klog.FromContext(ctx).Error(err, "Registering the DRA driver failed", "socket", socket)
		return
	}
	k.draUp.Store(true)
}

// deregisterDRA is the driver's socket gone (its agent stopped).
func (k *kubelet) deregisterDRA() {
	if k.draUp.Swap(false) {
		k.dra.GetWatcherHandler().DeRegisterPlugin(k.nodeCtx, dra.DriverName, dra.SocketPath(k.draPluginDir()))
	}
}

func (k *kubelet) draRegistered() bool { return k.draUp.Load() }

// start registers the Node and starts kubelet's servers; the pod workers run
// until ctx ends (or the next restart).
func (k *kubelet) start(ctx context.Context) error {
	port, err := k.serveAPI()
	if err != nil {
		return err
	}
	k.apiPort = port
	if err := k.registerNode(ctx); err != nil {
		return err
	}
	k.nodeCtx = ctx
	if k.draNode {
		if err := k.startDRA(ctx); err != nil {
			return fmt.Errorf("node %s: kubelet's DRA manager: %w", k.node, err)
		}
	}
	return k.run(ctx)
}

// run starts kubelet's servers, its pod informer and its workers, until ctx
// ends or restart stops them.
func (k *kubelet) run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	rctx, cancel := context.WithCancel(ctx)
	// The registration server wipes the plugin directory and creates
	// kubelet.sock anew, as kubelet's device manager does at its start: the
	// agent's plugin must notice and register again.
	reg, err := dpv1beta1.NewServer(logger, filepath.Join(k.pluginDir(), filepath.Base(pluginapi.KubeletSocket)), k, k)
	if err != nil {
		cancel()
		return err
	}
	if err := reg.Start(logger); err != nil {
		cancel()
		return fmt.Errorf("node %s: device-plugin registration server: %w", k.node, err)
	}
	if err := os.MkdirAll(filepath.Dir(k.podResourcesSocket()), 0o750); err != nil {
		cancel()
		return err
	}
	_ = os.Remove(k.podResourcesSocket()) // left by the run before a restart
	l, err := net.Listen("unix", k.podResourcesSocket())
	if err != nil {
		cancel()
		return err
	}
	podRes := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(podRes, podresources.NewV1PodResourcesServer(rctx, podresources.PodResourcesProviders{
		Pods: k, Devices: k, Cpus: noCPUs{}, Memory: noMemory{}, DynamicResources: noDynamic{},
	}))
	go func() { _ = podRes.Serve(l) }()

	queue := workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[types.UID](200*time.Millisecond, 5*time.Second))
	factory := informers.NewSharedInformerFactoryWithOptions(k.client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", k.node).String()
	}))
	informer := factory.Core().V1().Pods().Informer()
	enqueue := func(obj any) {
		if p, ok := obj.(*v1.Pod); ok {
			queue.Add(p.UID)
		} else if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			if p, ok := t.Obj.(*v1.Pod); ok {
				queue.Add(p.UID)
			}
		}
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }, DeleteFunc: enqueue,
	}); err != nil {
		cancel()
		return err
	}
	if err := informer.AddIndexers(cache.Indexers{"uid": func(obj any) ([]string, error) {
		return []string{string(obj.(*v1.Pod).UID)}, nil
	}}); err != nil {
		cancel()
		return err
	}
	k.runMu.Lock()
	k.reg, k.podRes, k.queue, k.informer, k.runCancel = reg, podRes, queue, informer, cancel
	k.runMu.Unlock()
	factory.Start(rctx.Done())
	factory.WaitForCacheSync(rctx.Done())
	// Pods this kubelet ran before a restart and that were deleted while
	// it was down get no event: look at each again, as kubelet's pod
	// cleanup does, so their containers stop and their slots and claims
	// are released (unprepared: kubelet's DRA manager would otherwise hold
	// their claims prepared, and the agent their CDI specs).
	for _, uid := range k.knownPods() {
		queue.Add(uid)
	}
	// Kubelet admits pods one at a time but starts their containers in
	// parallel; several workers put the agent's lookups under concurrency.
	for range 8 {
		k.runDone.Go(func() { k.work(rctx, queue) })
	}
	k.runDone.Go(func() { wait.UntilWithContext(rctx, k.watchNotices, 100*time.Millisecond) })
	return nil
}

// knownPods are the pods this kubelet holds anything of: running, with
// slots, or with claims it prepared.
func (k *kubelet) knownPods() []types.UID {
	k.mu.Lock()
	defer k.mu.Unlock()
	known := map[types.UID]bool{}
	for uid := range k.running {
		known[uid] = true
	}
	for uid := range k.held {
		known[uid] = true
	}
	for uid := range k.draPods {
		known[uid] = true
	}
	return slices.Collect(maps.Keys(known))
}

// restart stops kubelet and starts it again, as a node's kubelet restart
// does: containers and their GPU processes run on, and the device manager's
// checkpoint keeps every pod's slots; the device plugin's connection is lost
// until the agent registers again on the new kubelet.sock, and the pod
// workers see every pod of the node afresh.
func (k *kubelet) restart(down func() error) error {
	k.runMu.Lock()
	cancel, queue, reg, podRes := k.runCancel, k.queue, k.reg, k.podRes
	k.runMu.Unlock()
	logger := klog.FromContext(k.nodeCtx)
	cancel()
	queue.ShutDown()
	_ = reg.Stop(logger)
	podRes.Stop()
	k.runDone.Wait()
	k.mu.Lock()
	k.plugin = nil
	k.mu.Unlock()
	var downErr error
	if down != nil {
		downErr = down()
	}
	if err := k.run(k.nodeCtx); err != nil {
		return err
	}
	return downErr
}

// watchNotices plays the workloads' side of the preemption contract: a
// running container whose notice appeared in its mounted directory exits or
// writes its checkpoint file, as its pod's annotation scripts it.
func (k *kubelet) watchNotices(ctx context.Context) {
	k.mu.Lock()
	var todo []*v1.Pod
	for _, p := range k.running {
		if p.Annotations[AnnotationOnPreemption] != "" && p.Annotations[AnnotationOnPreemption] != "ignore" {
			todo = append(todo, p)
		}
	}
	k.mu.Unlock()
	for _, p := range todo {
		dir := filepath.Join(k.noticeRoot, string(p.UID))
		if _, err := os.Stat(filepath.Join(dir, preemption.NoticeFile)); err != nil {
			// No notice, or a withdrawn one: a later notice is news.
			k.mu.Lock()
			delete(k.reacted, p.UID)
			k.mu.Unlock()
			continue
		}
		k.mu.Lock()
		done := k.reacted[p.UID]
		k.mu.Unlock()
		if done {
			continue
		}
		k.mu.Lock()
		k.reacted[p.UID] = true
		k.mu.Unlock()
		switch p.Annotations[AnnotationOnPreemption] {
		case "exit":
			k.complete(ctx, p.UID)
		case "checkpoint":
			_ = os.WriteFile(filepath.Join(dir, preemption.CheckpointedFile), []byte(time.Now().UTC().Format(time.RFC3339Nano)), 0o644)
		}
	}
}

// stop stops the servers and the workers.
func (k *kubelet) stop(logger klog.Logger) {
	k.runMu.Lock()
	cancel, queue, reg, podRes := k.runCancel, k.queue, k.reg, k.podRes
	k.runMu.Unlock()
	if cancel != nil {
		cancel()
	}
	if queue != nil {
		queue.ShutDown()
	}
	if reg != nil {
		_ = reg.Stop(logger)
	}
	if podRes != nil {
		podRes.Stop()
	}
	k.mu.Lock()
	for _, t := range k.stopAt {
		t.Stop()
	}
	k.mu.Unlock()
}

func (k *kubelet) registerNode(ctx context.Context) error {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: k.node, Labels: map[string]string{
		"kubernetes.io/hostname": k.node, "kubernetes.io/os": "linux", "tessera.dev/playground": "true",
		// As NVIDIA's GPU feature discovery labels a GPU node: the
		// agent DaemonSet's nodeSelector.
		"nvidia.com/gpu.present": "true",
	}}}
	if k.draNode {
		// As an operator marks a node for DRA (docs/operations.md).
		node.Labels[dra.NodeLabel] = "true"
	}
	if _, err := k.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("register node %s: %w", k.node, err)
	}
	// The agent may annotate the new Node at once (its inventory): write
	// the status on the newest version.
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := k.client.CoreV1().Nodes().Get(ctx, k.node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		return k.writeStatus(ctx, node)
	})
}

// writeStatus writes a registered Node's status: ready, with the playground
// node's capacity.
func (k *kubelet) writeStatus(ctx context.Context, node *v1.Node) error {
	node.Status = v1.NodeStatus{
		Capacity: nodeCapacity.DeepCopy(), Allocatable: nodeCapacity.DeepCopy(),
		Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady",
			Message: "tessera playground node", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
		Addresses:       []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "127.0.0.1"}, {Type: v1.NodeHostName, Address: k.node}},
		DaemonEndpoints: v1.NodeDaemonEndpoints{KubeletEndpoint: v1.DaemonEndpoint{Port: int32(k.apiPort)}},
		NodeInfo:        v1.NodeSystemInfo{KubeletVersion: "v1.37.2-tessera-playground", OperatingSystem: "linux", Architecture: "amd64"},
	}
	_, err := k.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
	return err
}

// --- device-plugin registration (dpv1beta1.RegistrationHandler, ClientHandler)

// CleanupPluginDirectory removes what earlier plugins left in the directory,
// as kubelet does at start.
func (k *kubelet) CleanupPluginDirectory(_ klog.Logger, dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// PluginConnected keeps the plugin's client.
func (k *kubelet) PluginConnected(ctx context.Context, resource string, p dpv1beta1.DevicePlugin) error {
	if resource != gpu.ResourceGPU {
		return fmt.Errorf("the playground serves only %s, not %s", gpu.ResourceGPU, resource)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.plugin = p
	return nil
}

// pluginServes reports whether a plugin is connected with a healthy slot.
func (k *kubelet) pluginServes() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.plugin == nil {
		return false
	}
	for _, healthy := range k.devices {
		if healthy {
			return true
		}
	}
	return false
}

// PluginDisconnected forgets the plugin; its slots turn unhealthy, as in
// kubelet (which keeps them through a grace period for a quick return).
func (k *kubelet) PluginDisconnected(logger klog.Logger, resource, _ string) {
	k.mu.Lock()
	k.plugin = nil
	for id := range k.devices {
		k.devices[id] = false
	}
	k.mu.Unlock()
	logger.V(2).Info("Device plugin disconnected", "node", k.node, "resource", resource)
	go k.syncCapacity(context.Background())
}

// PluginListAndWatchReceiver records the plugin's slots.
func (k *kubelet) PluginListAndWatchReceiver(_ klog.Logger, _ string, resp *pluginapi.ListAndWatchResponse) {
	k.mu.Lock()
	k.devices = make(map[string]bool, len(resp.Devices))
	for _, d := range resp.Devices {
		k.devices[d.ID] = d.Health == pluginapi.Healthy
	}
	k.mu.Unlock()
	go k.syncCapacity(context.Background())
}

// syncCapacity writes the slot count to the Node, as kubelet does:
// capacity all slots, allocatable the healthy ones.
func (k *kubelet) syncCapacity(ctx context.Context) {
	k.mu.Lock()
	var total, healthy int64
	for _, ok := range k.devices {
		total++
		if ok {
			healthy++
		}
	}
	k.mu.Unlock()
	slots := patch.NodeResource(gpu.ResourceGPU, total, healthy)
	_, err := k.client.CoreV1().Nodes().Patch(ctx, k.node, types.StrategicMergePatchType, slots, metav1.PatchOptions{}, "status")
	if err != nil && ctx.Err() == nil {
		klog.FromContext(ctx).V(2).Info("Could not update the node's GPU slots", "node", k.node, "err", err)
	}
}

// --- pod-resources providers (what kubelet's pod-resources server reads)

// GetActivePods implements podresources.PodsProvider.
func (k *kubelet) GetActivePods() []*v1.Pod { return k.GetPods() }

// GetPods implements podresources.PodsProvider.
func (k *kubelet) GetPods() []*v1.Pod {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]*v1.Pod, 0, len(k.running)+len(k.held))
	seen := map[types.UID]bool{}
	for uid, p := range k.running {
		out, seen[uid] = append(out, p), true
	}
	// A pod whose containers are being started holds its slots already.
	for uid := range k.held {
		if !seen[uid] {
			if p := k.podByUID(uid); p != nil {
				out = append(out, p)
			}
		}
	}
	return out
}

// GetPodByName implements podresources.PodsProvider.
func (k *kubelet) GetPodByName(namespace, name string) (*v1.Pod, bool) {
	for _, p := range k.GetPods() {
		if p.Namespace == namespace && p.Name == name {
			return p, true
		}
	}
	return nil, false
}

// UpdateAllocatedDevices implements podresources.DevicesProvider: slots are
// released when a pod stops, so there is nothing to collect here.
func (k *kubelet) UpdateAllocatedDevices(klog.Logger) {}

// GetDevices implements podresources.DevicesProvider.
func (k *kubelet) GetDevices(podUID, container string) []*podresourcesapi.ContainerDevices {
	k.mu.Lock()
	defer k.mu.Unlock()
	ids := k.held[types.UID(podUID)][container]
	if len(ids) == 0 {
		return nil
	}
	return []*podresourcesapi.ContainerDevices{{ResourceName: gpu.ResourceGPU, DeviceIds: slices.Clone(ids)}}
}

// GetAllocatableDevices implements podresources.DevicesProvider.
func (k *kubelet) GetAllocatableDevices(klog.Logger) []*podresourcesapi.ContainerDevices {
	k.mu.Lock()
	defer k.mu.Unlock()
	var ids []string
	for id, ok := range k.devices {
		if ok {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return []*podresourcesapi.ContainerDevices{{ResourceName: gpu.ResourceGPU, DeviceIds: ids}}
}

type noCPUs struct{}

func (noCPUs) GetCPUs(*v1.Pod, *v1.Container) []int64 { return nil }
func (noCPUs) GetPodCPUs(string) []int64              { return nil }
func (noCPUs) GetAllocatableCPUs() []int64            { return nil }

type noMemory struct{}

func (noMemory) GetMemory(klog.Logger, *v1.Pod, *v1.Container) []*podresourcesapi.ContainerMemory {
	return nil
}
func (noMemory) GetPodMemory(klog.Logger, string) []*podresourcesapi.ContainerMemory { return nil }
func (noMemory) GetAllocatableMemory(klog.Logger) []*podresourcesapi.ContainerMemory { return nil }

type noDynamic struct{}

func (noDynamic) GetDynamicResources(klog.Logger, *v1.Pod, *v1.Container) []*podresourcesapi.DynamicResource {
	return nil
}

// --- pod lifecycle

// podByUID is the informer's pod with this UID, or nil.
func (k *kubelet) podByUID(uid types.UID) *v1.Pod {
	k.runMu.Lock()
	informer := k.informer
	k.runMu.Unlock()
	objs, err := informer.GetIndexer().ByIndex("uid", string(uid))
	if err != nil || len(objs) == 0 {
		return nil
	}
	return objs[0].(*v1.Pod)
}

func (k *kubelet) work(ctx context.Context, queue workqueue.TypedRateLimitingInterface[types.UID]) {
	for {
		uid, quit := queue.Get()
		if quit {
			return
		}
		err := k.sync(ctx, uid)
		switch {
		case err == nil:
			queue.Forget(uid)
		case ctx.Err() != nil:
		case queue.NumRequeues(uid) < 10:
			klog.FromContext(ctx).V(2).Info("Pod not started yet; retrying", "node", k.node, "uid", uid, "err", err)
			queue.AddRateLimited(uid)
		default:
			queue.Forget(uid)
		}
		queue.Done(uid)
	}
}

// sync brings one pod to what its object asks: started, or stopped and
// released.
func (k *kubelet) sync(ctx context.Context, uid types.UID) error {
	pod := k.podByUID(uid)
	if pod == nil { // deleted
		k.release(uid)
		k.mu.Lock()
		delete(k.exited, uid)
		k.mu.Unlock()
		return nil
	}
	if pod.DeletionTimestamp != nil {
		// Containers stop at once (no graceful shutdown to wait for);
		// kubelet then removes the object, as its status manager does.
		k.release(uid)
		zero := int64(0)
		err := k.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &uid}})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return err
	}
	if pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
		k.release(uid)
		return nil
	}
	k.mu.Lock()
	_, running := k.running[uid]
	exited := k.exited[uid]
	k.mu.Unlock()
	if running || exited {
		// Running already; or ended by itself, its status on its way (the
		// soak saw the stand-in start a finished pod's containers again).
		return nil
	}
	return k.startPod(ctx, pod)
}

// startPod gives each GPU container its slots and starts it, then reports
// the pod Running.
func (k *kubelet) startPod(ctx context.Context, pod *v1.Pod) error {
	logger := klog.FromContext(ctx).WithValues("pod", klog.KObj(pod), "node", k.node)
	if k.cgroupRoot != "" {
		// It stays after the pod ends, as a real one does for a while;
		// the agent removes its limits.
		if err := os.MkdirAll(filepath.Join(podCgroup(k.cgroupRoot, pod.UID), "cri-containerd-"+string(pod.UID)+".scope"), 0o755); err != nil {
			return err
		}
	}
	if len(pod.Spec.ResourceClaims) > 0 {
		// Kubelet prepares a pod's claims before its containers start,
		// and retries when the driver refuses or is away.
		if k.dra == nil {
			return k.failAdmission(ctx, pod, fmt.Errorf("node %s serves no DRA driver", k.node))
		}
		if err := k.dra.PrepareResources(ctx, pod); err != nil {
			for i := range pod.Spec.Containers {
				k.containerError(ctx, pod, pod.Spec.Containers[i].Name, err)
			}
			return err
		}
		k.mu.Lock()
		k.draPods[pod.UID] = pod
		k.mu.Unlock()
	}
	plugin, slots, err := k.admit(ctx, pod)
	if err != nil {
		return k.failAdmission(ctx, pod, err)
	}
	if plugin == nil && len(slots) > 0 {
		// Admitted earlier; its plugin is gone for now (the agent
		// restarting): kubelet retries the containers' creation, the pod
		// keeps its slots. (The soak found the stand-in dereferencing it.)
		err := fmt.Errorf("no device plugin serves %s on node %s yet", gpu.ResourceGPU, k.node)
		for name := range slots {
			k.containerError(ctx, pod, name, err)
		}
		return err
	}
	ids := map[string]string{}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		if held := slots[c.Name]; len(held) > 0 {
			if _, err := plugin.API().Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: held}}}); err != nil {
				k.release(pod.UID)
				return k.failAdmission(ctx, pod, fmt.Errorf("allocate failed due to %v, which is unexpected", err))
			}
			if _, err := plugin.API().PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: held}); err != nil {
				// Kubelet retries container creation with a back-off; so
				// does the playground (the agent may not have seen the
				// pod's assignment yet).
				k.containerError(ctx, pod, c.Name, err)
				return err
			}
		}
		ids[c.Name] = containerID()
	}
	if err := k.reportRunning(ctx, pod, ids); err != nil {
		return err
	}
	k.mu.Lock()
	k.running[pod.UID] = pod
	if d, err := time.ParseDuration(pod.Annotations[AnnotationRunFor]); err == nil && d > 0 {
		uid := pod.UID
		// The container's own clock: it outlives a kubelet restart.
		k.stopAt[uid] = time.AfterFunc(d, func() { k.complete(k.nodeCtx, uid) })
	}
	k.mu.Unlock()
	asg, _ := podgpu.BoundAssignment(pod)
	if asg == nil && len(pod.Spec.ResourceClaims) > 0 {
		asg = k.claimAssignment(ctx, pod)
	}
	k.load.start(pod, asg, ids)
	logger.V(2).Info("Pod running", "slots", slots)
	return nil
}

// claimAssignment is what pod's gpu.tessera.dev claims hold on this node,
// as an assignment of the containers given them (a claim's process runs in
// the first), for the pod's simulated GPU processes: a claim pod's GPUs
// are busy, and its processes can be left behind, as a device-plugin
// pod's. Claims that cannot be read give no process.
func (k *kubelet) claimAssignment(ctx context.Context, pod *v1.Pod) *gpu.PodAssignment {
	a := &gpu.PodAssignment{Node: k.node}
	for i := range pod.Spec.ResourceClaims {
		pc := &pod.Spec.ResourceClaims[i]
		name, _, err := resourceclaim.Name(pod, pc)
		if err != nil || name == nil {
			continue
		}
		claim, err := k.client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, *name, metav1.GetOptions{})
		if err != nil || claim.Status.Allocation == nil {
			continue
		}
		container := pod.Spec.Containers[0].Name
	find:
		for _, c := range pod.Spec.Containers {
			for _, r := range c.Resources.Claims {
				if r.Name == pc.Name {
					container = c.Name
					break find
				}
			}
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			index, ok := gpu.DRADeviceIndex(r.Device)
			uuid := k.load.uuidAt(index)
			if r.Driver != gpu.DRADriver || r.Pool != k.node || !ok || uuid == "" {
				continue
			}
			mem, cores := r.ConsumedCapacity[gpu.DRAMemory], r.ConsumedCapacity[gpu.DRACores]
			mode := gpu.ModeTimeSlicing
			if cores.Value() >= 100 {
				mode = gpu.ModeExclusive
			}
			a.Containers = append(a.Containers, gpu.ContainerAssignment{Name: container, Mode: mode,
				GPUs: []gpu.GPUGrant{{UUID: uuid, MemoryMiB: gpu.MiBUp(mem.Value()), CoresPerMille: int(cores.Value()) * gpu.CoresPerGPU / 100}}})
		}
	}
	return a
}

// admit takes slots for every GPU container, as kubelet's device manager
// does at admission: the plugin's preferred allocation among the free
// healthy slots. A retried pod keeps the slots it took.
func (k *kubelet) admit(ctx context.Context, pod *v1.Pod) (dpv1beta1.DevicePlugin, map[string][]string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if held, ok := k.held[pod.UID]; ok {
		return k.plugin, held, nil
	}
	held := map[string][]string{}
	taken := map[string]bool{}
	for _, cs := range k.held {
		for _, ids := range cs {
			for _, id := range ids {
				taken[id] = true
			}
		}
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		q, ok := c.Resources.Limits[gpu.ResourceGPU]
		if !ok || q.Value() == 0 {
			continue
		}
		if k.plugin == nil {
			return nil, nil, fmt.Errorf("no device plugin serves %s on node %s", gpu.ResourceGPU, k.node)
		}
		var free []string
		for id, healthy := range k.devices {
			if healthy && !taken[id] {
				free = append(free, id)
			}
		}
		sort.Strings(free)
		n := int(q.Value())
		if len(free) < n {
			return nil, nil, fmt.Errorf("requested number of devices unavailable for %s. Requested: %d, Available: %d", gpu.ResourceGPU, n, len(free))
		}
		resp, err := k.plugin.API().GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
			AvailableDeviceIDs: free, AllocationSize: int32(n)}}})
		chosen := free[:n]
		if err == nil && len(resp.ContainerResponses) == 1 && len(resp.ContainerResponses[0].DeviceIDs) == n {
			chosen = resp.ContainerResponses[0].DeviceIDs
		}
		for _, id := range chosen {
			taken[id] = true
		}
		held[c.Name] = slices.Clone(chosen)
	}
	k.held[pod.UID] = held
	return k.plugin, held, nil
}

// release frees a pod's slots, stops its simulated processes and
// unprepares its claims.
func (k *kubelet) release(uid types.UID) {
	if draPod := k.stopPod(uid); draPod != nil {
		k.unprepare(draPod)
	}
}

// stopPod is release without unpreparing the pod's claims: it returns
// the pod whose claims are still to unprepare (nil: none).
func (k *kubelet) stopPod(uid types.UID) *v1.Pod {
	left := LeftoverNone
	k.mu.Lock()
	if p := k.running[uid]; p != nil {
		left = Leftover(p.Annotations[AnnotationLeftover])
	}
	delete(k.reacted, uid)
	delete(k.held, uid)
	delete(k.running, uid)
	draPod := k.draPods[uid]
	delete(k.draPods, uid)
	if t := k.stopAt[uid]; t != nil {
		t.Stop()
		delete(k.stopAt, uid)
	}
	k.mu.Unlock()
	k.load.stop(uid, left)
	return draPod
}

func (k *kubelet) unprepare(draPod *v1.Pod) {
	if err := k.dra.UnprepareResources(k.nodeCtx, draPod); err != nil {
		klog.FromContext(k.nodeCtx).Error(err, "Unpreparing the pod's claims failed", "pod", klog.KObj(draPod))
	}
}

// complete ends a run-for pod: its containers exited 0. As kubelet's
// SyncTerminatedPod does, the terminal status is written before the pod's
// claims are unprepared.
func (k *kubelet) complete(ctx context.Context, uid types.UID) {
	pod := k.podByUID(uid)
	k.mu.Lock()
	k.exited[uid] = true
	k.mu.Unlock()
	if draPod := k.stopPod(uid); draPod != nil {
		defer k.unprepare(draPod)
	}
	if pod == nil || pod.DeletionTimestamp != nil {
		return
	}
	now := metav1.Now()
	// As kubelet's status manager does, a write that lost to another
	// (the agent's annotations, the scheduler's condition) is made again
	// on the pod as it now is: a pod left Running with its containers gone
	// would hold its GPUs for ever.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pod = pod.DeepCopy()
		pod.Status.Phase = v1.PodSucceeded
		code, reason, msg := int32(0), "Completed", pod.Annotations[AnnotationExitMessage]
		if msg != "" {
			pod.Status.Phase, code, reason = v1.PodFailed, 1, "Error"
		}
		for i := range pod.Status.ContainerStatuses {
			st := &pod.Status.ContainerStatuses[i]
			started := now
			if st.State.Running != nil {
				started = st.State.Running.StartedAt
			}
			st.State = v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: code, Reason: reason, Message: msg, StartedAt: started, FinishedAt: now, ContainerID: st.ContainerID}}
			st.Ready = false
		}
		setCondition(pod, v1.PodReady, v1.ConditionFalse, "PodCompleted")
		setCondition(pod, v1.ContainersReady, v1.ConditionFalse, "PodCompleted")
		_, err := k.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			fresh, gerr := k.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
			if gerr != nil || fresh.UID != uid || fresh.DeletionTimestamp != nil {
				return nil // gone or going: nothing to report
			}
			pod = fresh
		}
		return err
	})
	if err != nil && ctx.Err() == nil && !apierrors.IsNotFound(err) {
		klog.FromContext(ctx).Error(err, "Could not report a completed pod", "pod", klog.KObj(pod))
	}
}

func containerID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func setCondition(pod *v1.Pod, t v1.PodConditionType, s v1.ConditionStatus, reason string) {
	now := metav1.Now()
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == t {
			if pod.Status.Conditions[i].Status != s {
				pod.Status.Conditions[i].LastTransitionTime = now
			}
			pod.Status.Conditions[i].Status, pod.Status.Conditions[i].Reason = s, reason
			return
		}
	}
	pod.Status.Conditions = append(pod.Status.Conditions, v1.PodCondition{Type: t, Status: s, Reason: reason, LastTransitionTime: now})
}

// reportRunning writes the pod's status as kubelet would once its
// containers run: containerd IDs (the agent's per-tenant metrics map GPU
// processes to them), Ready conditions, the start time.
func (k *kubelet) reportRunning(ctx context.Context, pod *v1.Pod, ids map[string]string) error {
	pod = pod.DeepCopy()
	now := metav1.Now()
	pod.Status.Phase = v1.PodRunning
	pod.Status.HostIP = "127.0.0.1"
	pod.Status.HostIPs = []v1.HostIP{{IP: "127.0.0.1"}}
	pod.Status.StartTime = &now
	pod.Status.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, v1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: true, Started: ptr(true),
			ContainerID: "containerd://" + ids[c.Name],
			State:       v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: now}},
		})
	}
	for _, t := range []v1.PodConditionType{v1.PodInitialized, v1.PodReady, v1.ContainersReady, v1.PodScheduled} {
		setCondition(pod, t, v1.ConditionTrue, "")
	}
	updated, err := k.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	if err == nil && isAgentPod(updated) && !k.agentReady() {
		// The node's agent is stopped: its container exits at once.
		return k.reportAgent(ctx, updated)
	}
	return err
}

func ptr[T any](v T) *T { return &v }

// failAdmission rejects the pod as kubelet does when the device manager
// cannot serve it: phase Failed, reason UnexpectedAdmissionError.
func (k *kubelet) failAdmission(ctx context.Context, pod *v1.Pod, cause error) error {
	k.release(pod.UID)
	pod = pod.DeepCopy()
	pod.Status.Phase = v1.PodFailed
	pod.Status.Reason = "UnexpectedAdmissionError"
	pod.Status.Message = fmt.Sprintf("Pod was rejected: %v", cause)
	k.event(ctx, pod, v1.EventTypeWarning, "UnexpectedAdmissionError", pod.Status.Message)
	_, err := k.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	return err
}

// containerError shows why a container could not start, as kubelet does
// while it backs off: a waiting state and a Failed event.
func (k *kubelet) containerError(ctx context.Context, pod *v1.Pod, container string, cause error) {
	pod = pod.DeepCopy()
	msg := fmt.Sprintf("device plugin PreStartContainer rpc failed with err: %v", cause)
	found := false
	for i := range pod.Status.ContainerStatuses {
		if pod.Status.ContainerStatuses[i].Name == container {
			pod.Status.ContainerStatuses[i].State = v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "RunContainerError", Message: msg}}
			found = true
		}
	}
	if !found {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, v1.ContainerStatus{Name: container,
			State: v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "RunContainerError", Message: msg}}})
	}
	k.event(ctx, pod, v1.EventTypeWarning, "Failed", msg)
	if _, err := k.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil && !errors.Is(err, context.Canceled) {
		klog.FromContext(ctx).V(2).Info("Could not report a container error", "pod", klog.KObj(pod), "err", err)
	}
}

func (k *kubelet) event(ctx context.Context, pod *v1.Pod, kind, reason, msg string) {
	now := metav1.Now()
	ev := &v1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: pod.Name + ".", Namespace: pod.Namespace},
		InvolvedObject: v1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, APIVersion: "v1"},
		Reason:         reason, Message: msg, Type: kind, Source: v1.EventSource{Component: "kubelet", Host: k.node},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	_, _ = k.client.CoreV1().Events(pod.Namespace).Create(ctx, ev, metav1.CreateOptions{})
}
