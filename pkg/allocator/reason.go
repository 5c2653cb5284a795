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
)

var codeNames = [...]string{"Fits", "InsufficientCPU", "InsufficientMemory", "NoAllowedModel", "NoHealthyGPU", "NotEnoughWholeGPUs", "NoFragment", "ModeConflict", "NoMPS", "SlicesFull", "NoTimeSlicing", "NoHardMemory"}

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
	case SlicesFull:
		return fmt.Sprintf("GPUs with room hold as many slices as their agent offers (GPU %d: %d); the count follows the GPU's forecast load", r.GPU, r.Have)
	case ModeConflict:
		return fmt.Sprintf("GPUs with room run another sharing mode (GPU %d); the pod's tessera.dev/sharing rules them out", r.GPU)
	}
	return r.Code.String()
}

func pct(perMille int64) int64 { return (perMille + 9) / 10 }

// Summarize folds the reasons of many nodes into one line for a pod's
// unschedulable status: "0/4 nodes fit: 3 insufficient CPU: …; 1 …".
func Summarize(reasons []Reason) string {
	type group struct {
		count int
		first string
	}
	groups := map[Code]*group{}
	fit := 0
	for _, r := range reasons {
		if r.OK() {
			fit++
			continue
		}
		g := groups[r.Code]
		if g == nil {
			g = &group{first: r.String()}
			groups[r.Code] = g
		}
		g.count++
	}
	codes := make([]Code, 0, len(groups))
	for c := range groups {
		codes = append(codes, c)
	}
	sort.Slice(codes, func(i, j int) bool {
		if groups[codes[i]].count != groups[codes[j]].count {
			return groups[codes[i]].count > groups[codes[j]].count
		}
		return codes[i] < codes[j]
	})
	parts := make([]string, len(codes))
	for i, c := range codes {
		parts[i] = fmt.Sprintf("%d× %s", groups[c].count, groups[c].first)
	}
	return fmt.Sprintf("%d/%d nodes fit: %s", fit, len(reasons), strings.Join(parts, "; "))
}

// count is n and the word for one or for several, for messages.
func count(n int64, one, several string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, several)
}
