// Package cgroup reads where a process runs from its cgroup: the pod UID
// and container ID that kubelet's kubepods hierarchy names (either cgroup
// driver, cgroup v1 or v2). The agent and tessera doctor node both map GPU
// processes to pods with it; it does no I/O.
package cgroup

import (
	"errors"
	"regexp"
	"strings"
)

// Ref is what a process's cgroup says about where it runs.
type Ref struct {
	// PodUID is the pod's UID, with dashes.
	PodUID string
	// ContainerID is the runtime's container ID (64 hex digits for
	// containerd, CRI-O and Docker), without the runtime prefix.
	ContainerID string
}

// ErrNotAPod says the process does not run in a Kubernetes pod (a host
// process, or the MPS daemon).
var ErrNotAPod = errors.New("process is not in a kubepods cgroup")

// podSegment matches the pod component of both cgroup drivers:
//
//	cgroupfs: pod0c6e1a9a-3a9e-4f0e-9a55-6f7b2f2bb1de
//	systemd:  kubepods-besteffort-pod0c6e1a9a_3a9e_4f0e_9a55_6f7b2f2bb1de.slice
var podSegment = regexp.MustCompile(`pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})(\.slice)?$`)

// PodUIDOfSegment says whether one cgroup directory name is a pod's (either
// cgroup driver's form), and which pod's UID, with dashes.
func PodUIDOfSegment(name string) (string, bool) {
	m := podSegment.FindStringSubmatch(name)
	if m == nil {
		return "", false
	}
	return strings.ReplaceAll(m[1], "_", "-"), true
}

// containerSegment matches the container component: a bare ID (cgroupfs) or
// a runtime scope (systemd): cri-containerd-<id>.scope, crio-<id>.scope,
// docker-<id>.scope.
var containerSegment = regexp.MustCompile(`^(?:(?:cri-containerd|crio|docker)-)?([0-9a-f]{64})(?:\.scope)?$`)

// Parse reads the contents of /proc/<pid>/cgroup (v1 or v2) and
// returns the pod and container the process belongs to.
func Parse(data string) (Ref, error) {
	for _, line := range strings.Split(data, "\n") {
		// hierarchy-ID:controllers:path; the path may itself hold colons.
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) != 3 || !strings.Contains(parts[2], "kubepods") {
			continue
		}
		segs := strings.Split(strings.Trim(parts[2], "/"), "/")
		var ref Ref
		for i, s := range segs {
			if m := podSegment.FindStringSubmatch(s); m != nil {
				ref.PodUID = strings.ReplaceAll(m[1], "_", "-")
				if i+1 < len(segs) {
					if c := containerSegment.FindStringSubmatch(segs[i+1]); c != nil {
						ref.ContainerID = c[1]
					}
				}
				break
			}
		}
		if ref.PodUID != "" {
			return ref, nil
		}
	}
	return Ref{}, ErrNotAPod
}
