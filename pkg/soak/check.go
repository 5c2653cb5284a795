package soak

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// State is what a user could read of the cluster at one moment: the API's
// pods and node inventories, and per node kubelet's record of slots (the
// pod-resources API) and the CDI specs the agent wrote for them.
type State struct {
	At    time.Time
	Nodes []NodeState
	Pods  []PodState
}

// NodeState is one node.
type NodeState struct {
	Name      string
	Inventory *gpu.NodeInventory
	// Slots maps "namespace/pod/container" to the device-plugin slots
	// kubelet says it holds.
	Slots map[string][]string
	// Visible maps a slot to the GPUs its CDI spec shows the container
	// (NVIDIA_VISIBLE_DEVICES); a slot without a spec is absent.
	Visible map[string]string
	// ClaimVisible maps a claim's UID to the GPUs its CDI spec (the DRA
	// driver's) shows; a claim without a spec is absent.
	ClaimVisible map[string]string
}

// PodState is one GPU pod.
type PodState struct {
	Namespace, Name, UID string
	Node                 string
	Phase                string
	Deleting             bool
	Created              time.Time
	// Bound is when the scheduler bound it (its PodScheduled condition).
	Bound time.Time
	// Assignment is its tessera.dev/assignment, nil while unplaced.
	Assignment *gpu.PodAssignment
	// PendingReason is the scheduler's message while it waits.
	PendingReason string
	// Victim: it carries a preemption notice.
	Victim bool
	// ClaimNames are the ResourceClaims it names; ClaimGPUs maps the UID
	// of each gpu.tessera.dev claim allocated and reserved for it to the
	// GPUs its allocation took. Its Assignment is then what its claims
	// consumed (one container per claim, "claim NAME").
	ClaimNames []string
	ClaimGPUs  map[string]string
	// RunningAfter: it was still running in a list of pods taken after
	// the claim specs were read (their check needs it).
	RunningAfter bool
}

func (p PodState) key() string { return p.Namespace + "/" + p.Name }

// Finished pods hold nothing.
func (p PodState) finished() bool { return p.Phase == "Succeeded" || p.Phase == "Failed" }

// Violation is one broken invariant.
type Violation struct {
	Invariant string
	Detail    string
}

func (v Violation) String() string { return v.Invariant + ": " + v.Detail }

// Checker checks States in order; it remembers what a single State cannot
// say (since when a GPU has been unhealthy).
type Checker struct {
	// Oversubscription is the memory oversubscription the scheduler allows.
	Oversubscription float64
	// Grace is how long after a GPU turns unhealthy a placement on it is
	// still the scheduler's in-flight decision, not a violation.
	Grace time.Duration

	unhealthySince map[string]time.Time
}

// Safety checks what must hold at every moment:
//   - per GPU, Σ memory ≤ capacity × oversubscription and Σ cores ≤ 100 %,
//     one sharing mode, at most one exclusive owner;
//   - no slot held by two containers;
//   - every running container's CDI spec shows exactly its assigned GPUs,
//     and every running pod's claim's spec its claim's GPUs;
//   - no slice placed on a GPU that was unhealthy for longer than Grace.
//
// A finished pod, and a deleted victim its agent reported reclaimed, hold
// nothing.
func (c *Checker) Safety(s State) []Violation {
	var out []Violation
	bad := func(inv, format string, a ...any) {
		out = append(out, Violation{Invariant: inv, Detail: fmt.Sprintf(format, a...)})
	}
	if c.unhealthySince == nil {
		c.unhealthySince = map[string]time.Time{}
	}
	type gpuInfo struct {
		node      string
		index     int
		memoryMiB int64
	}
	gpus := map[string]gpuInfo{}
	reclaimed := map[string]bool{}
	nodes := map[string]NodeState{}
	for _, n := range s.Nodes {
		nodes[n.Name] = n
		if n.Inventory == nil {
			continue
		}
		for _, uid := range n.Inventory.Reclaimed {
			reclaimed[uid] = true
		}
		for _, d := range n.Inventory.GPUs {
			gpus[d.UUID] = gpuInfo{n.Name, d.Index, d.MemoryMiB}
			if d.Healthy {
				delete(c.unhealthySince, d.UUID)
			} else if _, ok := c.unhealthySince[d.UUID]; !ok {
				c.unhealthySince[d.UUID] = s.At
			}
		}
	}
	type use struct {
		mem        int64
		cores      int
		modes      map[gpu.SharingMode]bool
		exclusive  []string
		containers []string
	}
	uses := map[string]*use{}
	for _, p := range s.Pods {
		if p.Assignment == nil || p.finished() || (p.Deleting && reclaimed[p.UID]) {
			continue
		}
		for _, ctr := range p.Assignment.Containers {
			for _, g := range ctr.GPUs {
				u := uses[g.UUID]
				if u == nil {
					u = &use{modes: map[gpu.SharingMode]bool{}}
					uses[g.UUID] = u
				}
				u.modes[ctr.Mode] = true
				u.containers = append(u.containers, p.key()+"/"+ctr.Name)
				if ctr.Mode == gpu.ModeExclusive {
					u.exclusive = append(u.exclusive, p.key())
				} else {
					u.mem += g.MemoryMiB
					u.cores += g.CoresPerMille
				}
				if since, ok := c.unhealthySince[g.UUID]; ok && !p.Bound.IsZero() && p.Bound.Sub(since) > c.Grace {
					bad("placed on an unhealthy GPU", "%s bound at %s to GPU %s, unhealthy since %s",
						p.key(), p.Bound.Format(time.RFC3339Nano), g.UUID, since.Format(time.RFC3339Nano))
				}
			}
		}
	}
	uuids := make([]string, 0, len(uses))
	for u := range uses {
		uuids = append(uuids, u)
	}
	sort.Strings(uuids)
	for _, uuid := range uuids {
		u := uses[uuid]
		info, known := gpus[uuid]
		where := uuid
		if known {
			where = fmt.Sprintf("%s GPU %d (%s)", info.node, info.index, uuid)
		}
		if len(u.exclusive) > 1 {
			bad("one exclusive owner", "%s held whole by %v", where, u.exclusive)
		}
		if len(u.modes) > 1 {
			var ms []string
			for m := range u.modes {
				ms = append(ms, string(m))
			}
			sort.Strings(ms)
			bad("one sharing mode", "%s runs %v: %v", where, ms, u.containers)
		}
		if u.cores > gpu.CoresPerGPU {
			bad("cores ≤ 100 %", "%s: %d‰ granted to %v", where, u.cores, u.containers)
		}
		if known && float64(u.mem) > float64(info.memoryMiB)*c.Oversubscription {
			bad("memory ≤ capacity × oversubscription", "%s: %d MiB granted of %d × %.2f, to %v", where, u.mem, info.memoryMiB, c.Oversubscription, u.containers)
		}
	}
	// Slots and CDI specs.
	running := map[string]PodState{}
	for _, p := range s.Pods {
		if p.Phase == "Running" && !p.Deleting {
			running[p.key()] = p
		}
	}
	nodeClaims := map[string]map[string]string{}
	for _, n := range s.Nodes {
		nodeClaims[n.Name] = n.ClaimVisible
	}
	for _, key := range sortedKeys(running) {
		p := running[key]
		if !p.RunningAfter {
			continue // ended while the specs were read
		}
		for _, uid := range sortedKeys(p.ClaimGPUs) {
			want := p.ClaimGPUs[uid]
			got, ok := nodeClaims[p.Node][uid]
			if !ok {
				bad("CDI spec equals assignment", "running %s: claim %s has no CDI spec on %s", key, uid, p.Node)
			} else if got != want {
				bad("CDI spec equals assignment", "running %s: claim %s's spec shows %q, allocated %s", key, uid, got, want)
			}
		}
	}
	for _, n := range s.Nodes {
		holder := map[string]string{}
		keys := make([]string, 0, len(n.Slots))
		for k := range n.Slots {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, ctr := range keys {
			for _, slot := range n.Slots[ctr] {
				if other, ok := holder[slot]; ok {
					bad("one holder per slot", "node %s slot %s held by %s and %s", n.Name, slot, other, ctr)
				}
				holder[slot] = ctr
			}
			podKey := ctr[:strings.LastIndex(ctr, "/")]
			p, ok := running[podKey]
			if !ok || p.Assignment == nil {
				continue
			}
			name := ctr[strings.LastIndex(ctr, "/")+1:]
			var want []string
			for _, ca := range p.Assignment.Containers {
				if ca.Name == name {
					for _, g := range ca.GPUs {
						want = append(want, g.UUID)
					}
				}
			}
			for _, slot := range n.Slots[ctr] {
				got, ok := n.Visible[slot]
				if !ok {
					bad("CDI spec equals assignment", "running %s: slot %s has no CDI spec", ctr, slot)
				} else if got != strings.Join(want, ",") {
					bad("CDI spec equals assignment", "running %s: slot %s shows %q, assigned %v", ctr, slot, got, want)
				}
			}
		}
	}
	return out
}

// Liveness checks what must hold within bound of a pod's last change:
// every pod older than bound is Running, Succeeded, being deleted, or
// Pending with the scheduler's reason.
func Liveness(s State, bound time.Duration) []Violation {
	var out []Violation
	for _, p := range s.Pods {
		if p.Deleting || s.At.Sub(p.Created) < bound {
			continue
		}
		switch {
		case p.Phase == "Running" || p.Phase == "Succeeded":
		case p.Phase == "Failed":
			out = append(out, Violation{"every pod runs, succeeds or waits with a reason", fmt.Sprintf("%s failed", p.key())})
		case p.Assignment == nil && p.PendingReason != "":
		case p.Assignment == nil:
			out = append(out, Violation{"every pod runs, succeeds or waits with a reason",
				fmt.Sprintf("%s pending %v without a reason", p.key(), s.At.Sub(p.Created).Round(time.Second))})
		case s.At.Sub(p.Bound) >= bound:
			out = append(out, Violation{"every pod runs, succeeds or waits with a reason",
				fmt.Sprintf("%s bound to %s %v ago, still %s", p.key(), p.Node, s.At.Sub(p.Bound).Round(time.Second), p.Phase)})
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
