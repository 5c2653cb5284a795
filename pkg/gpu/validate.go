package gpu

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// ErrInvalid is wrapped by every validation and decoding error of this package,
// so callers can tell bad input (tell the user) from other failures.
var ErrInvalid = errors.New("invalid")

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// maxEcho is how much of a user's value a message repeats: messages land in
// the pod's status and events, and a 100 KB annotation must not.
const maxEcho = 64

// Quote is %q of a value a user wrote, cut to maxEcho bytes (on a rune
// boundary) with its full length said, for messages.
func Quote(s string) string {
	if len(s) <= maxEcho {
		return fmt.Sprintf("%q", s)
	}
	n := maxEcho
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return fmt.Sprintf("%q… (%d bytes)", s[:n], len(s))
}

// ParseSharingMode parses the tessera.dev/sharing annotation. An empty value means auto.
func ParseSharingMode(s string) (SharingMode, error) {
	switch m := SharingMode(strings.TrimSpace(s)); m {
	case ModeNone, ModeAuto:
		return ModeAuto, nil
	case ModeExclusive, ModeMPS, ModeTimeSlicing:
		return m, nil
	}
	return "", invalidf("%s=%s: want one of exclusive, mps, time-slicing, auto", AnnotationSharing, Quote(s))
}

// ParseWorkloadClass parses the tessera.dev/workload annotation.
func ParseWorkloadClass(s string) (WorkloadClass, error) {
	switch w := WorkloadClass(strings.TrimSpace(s)); w {
	case WorkloadUnspecified, WorkloadTraining, WorkloadInference:
		return w, nil
	}
	return "", invalidf("%s=%s: want training or inference", AnnotationWorkload, Quote(s))
}

// ParseModelList parses the tessera.dev/gpu-model allow-list: model names
// separated by commas or '|' (the trace format). Empty means any model.
func ParseModelList(s string) ([]string, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	fields := strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == '|' })
	models := make([]string, 0, len(fields))
	seen := make(map[string]bool, len(fields))
	for _, f := range fields {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if seen[f] {
			continue
		}
		seen[f] = true
		models = append(models, f)
	}
	if len(models) == 0 {
		return nil, invalidf("%s=%s: no model named", AnnotationGPUModel, Quote(s))
	}
	return models, nil
}

// Validate checks an inventory: unique indices and UUIDs, positive sizes, NVLink
// peers that exist.
func (n *NodeInventory) Validate() error {
	if n.Node == "" {
		return invalidf("inventory: node name is empty")
	}
	if n.CPUMilli < 0 || n.MemoryMiB < 0 {
		return invalidf("inventory %s: negative cpu (%d) or memory (%d)", n.Node, n.CPUMilli, n.MemoryMiB)
	}
	indices := make(map[int]bool, len(n.GPUs))
	uuids := make(map[string]bool, len(n.GPUs))
	for i, d := range n.GPUs {
		switch {
		case d.Index < 0:
			return invalidf("inventory %s: gpus[%d].index %d is negative", n.Node, i, d.Index)
		case indices[d.Index]:
			return invalidf("inventory %s: gpus[%d].index %d is duplicated", n.Node, i, d.Index)
		case d.UUID == "":
			return invalidf("inventory %s: gpus[%d].uuid is empty", n.Node, i)
		case uuids[d.UUID]:
			return invalidf("inventory %s: gpus[%d].uuid %s is duplicated", n.Node, i, d.UUID)
		case d.MemoryMiB <= 0:
			return invalidf("inventory %s: gpus[%d].memoryMiB %d must be positive", n.Node, i, d.MemoryMiB)
		case d.SMCount < 0:
			return invalidf("inventory %s: gpus[%d].smCount %d is negative", n.Node, i, d.SMCount)
		case d.Slices < 0:
			return invalidf("inventory %s: gpus[%d].slices %d is negative", n.Node, i, d.Slices)
		}
		indices[d.Index] = true
		uuids[d.UUID] = true
	}
	for i, d := range n.GPUs {
		for _, p := range d.NVLinkPeers {
			if p == d.Index || !indices[p] {
				return invalidf("inventory %s: gpus[%d].nvlinkPeers names %d, which is not another GPU of the node", n.Node, i, p)
			}
		}
	}
	return nil
}

// Validate checks an assignment's shape: a node, named containers, a known mode
// and grants with a UUID, positive memory and 1–1000 per-mille cores.
func (a *PodAssignment) Validate() error {
	if a.Node == "" {
		return invalidf("assignment: node is empty")
	}
	for i, c := range a.Containers {
		switch c.Mode {
		case ModeExclusive, ModeMPS, ModeTimeSlicing:
		default:
			return invalidf("assignment: containers[%d].mode %q is not exclusive, mps or time-slicing", i, c.Mode)
		}
		if len(c.GPUs) == 0 {
			return invalidf("assignment: containers[%d] has no GPU", i)
		}
		seen := make(map[string]bool, len(c.GPUs))
		for j, g := range c.GPUs {
			switch {
			case g.UUID == "":
				return invalidf("assignment: containers[%d].gpus[%d].uuid is empty", i, j)
			case seen[g.UUID]:
				return invalidf("assignment: containers[%d].gpus[%d].uuid %s is duplicated", i, j, g.UUID)
			case g.Index < 0:
				return invalidf("assignment: containers[%d].gpus[%d].index %d is negative", i, j, g.Index)
			case g.MemoryMiB <= 0:
				return invalidf("assignment: containers[%d].gpus[%d].memoryMiB %d must be positive", i, j, g.MemoryMiB)
			case g.CoresPerMille <= 0 || g.CoresPerMille > CoresPerGPU:
				return invalidf("assignment: containers[%d].gpus[%d].cores %d must be 1–%d", i, j, g.CoresPerMille, CoresPerGPU)
			}
			seen[g.UUID] = true
		}
	}
	return nil
}
