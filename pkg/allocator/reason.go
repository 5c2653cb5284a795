package allocator

import (
	"fmt"
	"sort"
	"strings"
)

// Code classifies why a pod does not fit a node.
type Code uint8

// Codes, from the cheapest check to the most specific.
const (
	Fits Code = iota
	InsufficientCPU
	InsufficientMemory
	NoAllowedModel
	NoHealthyGPU
	NotEnoughWholeGPUs
	NoFragment
	ModeConflict
	NoMPS
	SlicesFull
	NoTimeSlicing
	NoHardMemory
	ServesDRA
)

// NumCodes is how many codes there are (Fits included): an array indexed by
// Code holds one entry for each.
const NumCodes = len(codeNames)

var codeNames = [...]string{"Fits", "InsufficientCPU", "InsufficientMemory", "NoAllowedModel", "NoHealthyGPU", "NotEnoughWholeGPUs", "NoFragment", "ModeConflict", "NoMPS", "SlicesFull", "NoTimeSlicing", "NoHardMemory", "ServesDRA"}

func (c Code) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return fmt.Sprintf("Code(%d)", c)
}

// Reason says why a pod does not fit a node, with the numbers a user needs to
// act on it. The zero Reason means the pod fits. Building it allocates
// nothing; the message is formatted only when asked for.
type Reason struct {
	Code Code
	// Want and Have are the asked and available amounts (CPU milli, MiB, GPUs).
	Want, Have int64
	// WantCores is the compute asked per GPU (per-mille), for NoFragment.
	WantCores int64
	// GPU is the index of the GPU with the largest fragment, or -1.
	GPU int
	// HaveCores is the free compute on that GPU (per-mille).
	HaveCores int64
	Models    []string
}

// OK reports whether the pod fits.
func (r Reason) OK() bool { return r.Code == Fits }

func (r Reason) String() string {
	switch r.Code {
	case Fits:
		return "fits"
	case InsufficientCPU:
		return fmt.Sprintf("insufficient CPU: wants %dm, node has %dm free", r.Want, r.Have)
	case InsufficientMemory:
		return fmt.Sprintf("insufficient memory: wants %d MiB, node has %d MiB free", r.Want, r.Have)
	case NoAllowedModel:
		return fmt.Sprintf("no GPU of an allowed model (%s)", strings.Join(r.Models, ", "))
	case NoHealthyGPU:
		return "no healthy GPU"
	case NotEnoughWholeGPUs:
		return fmt.Sprintf("wants %s, %s", count(r.Want, "whole GPU", "whole GPUs"), count(r.Have, "is free", "are free"))
	case NoFragment:
		if r.GPU < 0 {
			return fmt.Sprintf("no GPU with %d MiB and %d%% cores free", r.Want, pct(r.WantCores))
		}
		return fmt.Sprintf("no GPU with %d MiB and %d%% cores free; largest fragment %d MiB and %d%% cores on GPU %d",
			r.Want, pct(r.WantCores), r.Have, pct(r.HaveCores), r.GPU)
	case NoMPS:
		return "no MPS-capable GPU, and the pod asks for tessera.dev/sharing=mps"
	case NoTimeSlicing:
		return "every GPU runs MPS, and the pod asks for tessera.dev/sharing=time-slicing (use mps or auto)"
	case NoHardMemory:
		return "no GPU here holds a slice's memory in the kernel (NVML cgroup limits on a time-sliced GPU), and the pod asks for tessera.dev/isolation=memory-hard (ask for whole GPUs, or place it on nodes whose driver offers the limits)"
	case ServesDRA:
		return "the node serves its GPUs through DRA: ask there with a ResourceClaim of a gpu.tessera.dev DeviceClass, not tessera.dev/gpu"
	case SlicesFull:
		return fmt.Sprintf("GPUs with room hold as many slices as their agent offers (GPU %d: %d); the count follows the GPU's forecast load", r.GPU, r.Have)
	case ModeConflict:
		return fmt.Sprintf("GPUs with room run another sharing mode (GPU %d); the pod's tessera.dev/sharing rules them out", r.GPU)
	}
	return r.Code.String()
}

func pct(perMille int64) int64 { return (perMille + 9) / 10 }

// Message is the code's text, the same on every node. kube-scheduler's
// "0/N nodes are available: …" counts identical Filter messages, so numbers
// in them (Reason.String's, right for one node) made one clause per node on
// a large cluster; the numbers go to Summarize's line instead.
func (c Code) Message() string {
	switch c {
	case Fits:
		return "fits"
	case InsufficientCPU:
		return "insufficient CPU"
	case InsufficientMemory:
		return "insufficient memory"
	case NoAllowedModel:
		return "no GPU of an allowed model"
	case NoHealthyGPU:
		return "no healthy GPU"
	case NotEnoughWholeGPUs:
		return "not enough whole GPUs free"
	case NoFragment:
		return "no GPU with the memory and cores asked free"
	case ModeConflict:
		return "GPUs with room run another sharing mode"
	case NoMPS:
		return "no MPS-capable GPU (the pod asks for tessera.dev/sharing=mps)"
	case SlicesFull:
		return "GPUs with room hold as many slices as their agent offers"
	case NoTimeSlicing:
		return "every GPU runs MPS (the pod asks for tessera.dev/sharing=time-slicing)"
	case NoHardMemory:
		return "no GPU holds a slice's memory in the kernel (the pod asks for tessera.dev/isolation=memory-hard)"
	case ServesDRA:
		return "the node serves its GPUs through DRA (gpu.tessera.dev ResourceClaims)"
	}
	return c.String()
}

// FromInventory reports whether the code follows from the node's inventory
// alone (its GPUs' health, models, MPS and kernel memory limits), whatever
// is booked there: a refusal with such a code can be stale only if the
// inventory is, never because a booking changed.
func (c Code) FromInventory() bool {
	switch c {
	case NoHealthyGPU, NoAllowedModel, NoMPS, NoTimeSlicing, NoHardMemory, ServesDRA:
		return true
	}
	return false
}

// short is the code's clause in Summarize's line: "<n> nodes short of …".
var short = [...]string{Fits: "", InsufficientCPU: "CPU", InsufficientMemory: "memory", NoAllowedModel: "an allowed GPU model",
	NoHealthyGPU: "healthy GPUs", NotEnoughWholeGPUs: "whole GPUs", NoFragment: "a GPU fragment", ModeConflict: "a GPU in the pod's sharing mode",
	NoMPS: "MPS-capable GPUs", SlicesFull: "free slices", NoTimeSlicing: "time-sliced GPUs", NoHardMemory: "kernel memory limits",
	ServesDRA: "device-plugin GPUs (the node serves DRA claims; ask there with a ResourceClaim)"}

// Tally folds the reasons of many nodes as they come (Filter runs on them
// in parallel; the caller serializes Add), keeping what Summarize says: how
// many nodes gave each code, the largest free fragment anywhere, the most
// whole GPUs free on one node. It holds no per-node list, so its size does
// not grow with the cluster.
type Tally struct {
	nodes, fit int
	counts     [len(codeNames)]int
	// largest is the NoFragment reason with the most memory free (then
	// cores) on one GPU, and its node.
	largest     Reason
	largestNode string
	// mostWhole is the most whole GPUs free on one node of those short.
	mostWhole int64
	models    []string
}

// Add counts one node's reason.
func (t *Tally) Add(node string, r Reason) {
	t.nodes++
	if r.OK() {
		t.fit++
		return
	}
	if int(r.Code) < len(t.counts) {
		t.counts[r.Code]++
	}
	switch r.Code {
	case NoFragment:
		if r.GPU >= 0 && (t.largestNode == "" || r.Have > t.largest.Have || (r.Have == t.largest.Have && r.HaveCores > t.largest.HaveCores)) {
			t.largest, t.largestNode = r, node
		}
	case NotEnoughWholeGPUs:
		t.mostWhole = max(t.mostWhole, r.Have)
	case NoAllowedModel:
		if t.models == nil {
			t.models = r.Models
		}
	}
}

// Nodes is how many nodes were added.
func (t *Tally) Nodes() int { return t.nodes }

// String is the cluster-wide line: "0/1000 nodes fit; largest free GPU
// fragment 8192 MiB and 90% cores (node n-17 GPU 3); short of: 812 a GPU
// fragment, 150 whole GPUs (at most 1 free on a node), 38 healthy GPUs".
// Its length is bounded whatever the number of nodes (one clause per code,
// the models asked cut to a few).
func (t *Tally) String() string {
	if d := t.Detail(); d != "" {
		return fmt.Sprintf("%d/%d nodes fit; %s", t.fit, t.nodes, d)
	}
	return fmt.Sprintf("%d/%d nodes fit", t.fit, t.nodes)
}

// Detail is String without the count of nodes that fit (kube-scheduler's
// message has it): "largest free GPU fragment …; nodes short of: …", or ""
// when every node fit.
func (t *Tally) Detail() string {
	var b strings.Builder
	if t.largestNode != "" {
		fmt.Fprintf(&b, "largest free GPU fragment %d MiB and %d%% cores (node %s GPU %d)",
			t.largest.Have, pct(t.largest.HaveCores), truncateName(t.largestNode), t.largest.GPU)
	}
	codes := make([]Code, 0, len(t.counts))
	for c, n := range t.counts {
		if n > 0 {
			codes = append(codes, Code(c))
		}
	}
	if len(codes) == 0 {
		return b.String()
	}
	sort.SliceStable(codes, func(i, j int) bool { return t.counts[codes[i]] > t.counts[codes[j]] })
	if b.Len() > 0 {
		b.WriteString("; ")
	}
	b.WriteString("nodes short of: ")
	for i, c := range codes {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d %s", t.counts[c], short[c])
		switch c {
		case NotEnoughWholeGPUs:
			fmt.Fprintf(&b, " (at most %d free on a node)", t.mostWhole)
		case NoAllowedModel:
			models := t.models
			if len(models) > 3 {
				models = append(models[:3:3], "…")
			}
			fmt.Fprintf(&b, " (%s)", strings.Join(models, ", "))
		}
	}
	return b.String()
}

// truncateName keeps a node name in the line short (names are at most 253
// bytes; the line stays under 1 KiB).
func truncateName(s string) string {
	if len(s) > 64 {
		return s[:63] + "…"
	}
	return s
}

// NodeReason is one node's reason.
type NodeReason struct {
	Node string
	Reason
}

// Summarize folds the reasons of many nodes into Tally's one line.
func Summarize(reasons []NodeReason) string {
	var t Tally
	for _, r := range reasons {
		t.Add(r.Node, r.Reason)
	}
	return t.String()
}

// count is n and the word for one or for several, for messages.
func count(n int64, one, several string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, several)
}
