// Package tenants maps a GPU process to the pod and container it runs in, so
// every tenant of a shared GPU gets its own metric series. NVML reports
// process IDs; a process's cgroup (/proc/<pid>/cgroup, readable with the
// host's PID namespace; pkg/cgroup reads it) names its pod UID and container
// ID under the kubelet's kubepods hierarchy, and the node's pods (from the
// API server) turn those into namespace, pod and container names.
package tenants

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/pkg/cgroup"
)

// Tenant is the pod container a GPU process belongs to.
type Tenant struct {
	Namespace, Pod, Container string
}

// PodSource lists the pods of this node (the agent's pod informer).
type PodSource func() []*v1.Pod

// Resolver maps process IDs to tenants. It remembers the answer for every
// PID it saw in the previous pass, so a steady set of GPU processes costs
// one map lookup each per pass; PIDs that left are forgotten (a PID reused
// by a new process is resolved afresh the pass after its old owner left).
type Resolver struct {
	procRoot string
	pods     PodSource

	mu   sync.Mutex
	last map[uint32]Tenant
}

// NewResolver reads cgroups under procRoot ("/proc" on a node, with the
// host's PID namespace) and names from pods.
func NewResolver(procRoot string, pods PodSource) *Resolver {
	return &Resolver{procRoot: procRoot, pods: pods, last: map[uint32]Tenant{}}
}

// Resolve maps each PID to its tenant. A PID that is not in a pod, has
// exited, or whose pod this node does not know is left out.
func (r *Resolver) Resolve(pids []uint32) map[uint32]Tenant {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[uint32]Tenant, len(pids))
	var index map[string]*v1.Pod
	for _, pid := range pids {
		if t, ok := r.last[pid]; ok {
			out[pid] = t
			continue
		}
		data, err := os.ReadFile(filepath.Join(r.procRoot, strconv.FormatUint(uint64(pid), 10), "cgroup"))
		if err != nil {
			continue
		}
		ref, err := cgroup.Parse(string(data))
		if err != nil {
			continue
		}
		if index == nil {
			index = map[string]*v1.Pod{}
			for _, p := range r.pods() {
				index[string(p.UID)] = p
			}
		}
		if t, ok := tenantOf(index[ref.PodUID], ref.ContainerID); ok {
			out[pid] = t
		}
	}
	r.last = out
	return out
}

// tenantOf names the container of pod whose runtime ID is containerID. A
// process in the pod's cgroup but no known container (sandbox level, or a
// container whose status has not arrived yet) is still the pod's: named
// after its container when it has only one, with an empty container name
// otherwise.
func tenantOf(pod *v1.Pod, containerID string) (Tenant, bool) {
	if pod == nil {
		return Tenant{}, false
	}
	t := Tenant{Namespace: pod.Namespace, Pod: pod.Name}
	for _, st := range append(append([]v1.ContainerStatus{}, pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...) {
		// containerID is "<runtime>://<id>".
		if containerID != "" && strings.HasSuffix(st.ContainerID, "://"+containerID) {
			t.Container = st.Name
			return t, true
		}
	}
	if len(pod.Spec.Containers) == 1 {
		t.Container = pod.Spec.Containers[0].Name
		return t, true
	}
	return t, true
}

// String is namespace/pod/container, for logs.
func (t Tenant) String() string { return fmt.Sprintf("%s/%s/%s", t.Namespace, t.Pod, t.Container) }
