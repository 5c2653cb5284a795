// Package preemption is the contract of Tessera's three-level GPU
// preemption between the scheduler, the node agent and the workloads, and
// the scheduler-side controller that carries it out:
//
//  1. Soft. The scheduler (TesseraGPU's PostFilter) picks the victims and
//     writes a Notice on each (annotation tessera.dev/preemption, condition
//     DisruptionTarget). The node agent writes the notice into the victim's
//     containers, at NoticeFile under the directory mounted at
//     ContainerDir. The workload saves a checkpoint and either exits or
//     writes CheckpointedFile there; the agent turns that file into the
//     annotation tessera.dev/checkpointed. Either ends the wait.
//  2. Hard. At the notice's deadline the controller records the victim's
//     scene (an Event and a ConfigMap in RecordNamespace) and deletes it
//     with no further grace.
//  3. Reclaim. The victim's node agent checks that no process of the victim
//     still holds its GPUs, kills leftovers, and lists the victim's UID in
//     its inventory (Reclaimed); only then does the scheduler release the
//     victim's slices to the preemptor.
//
// This file holds the contract; it imports only k8s.io/api.
package preemption

import (
	"encoding/json"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
)

// Annotations of the contract.
const (
	// AnnotationNotice (on a victim, written by the scheduler) holds its
	// Notice as JSON.
	AnnotationNotice = "tessera.dev/preemption"
	// AnnotationCheckpointed (on a victim, written by its node agent) says
	// when the workload reported its checkpoint saved.
	AnnotationCheckpointed = "tessera.dev/checkpointed"
	// AnnotationGrace (set by the pod's owner) shortens the grace period a
	// victim gets, as a Go duration ("10s"); it never lengthens it.
	AnnotationGrace = "tessera.dev/checkpoint-grace"
)

// Files of the contract, inside every GPU container.
const (
	// ContainerDir is where the agent mounts the pod's notice directory.
	ContainerDir = "/run/tessera/preemption"
	// NoticeFile appears in ContainerDir when the pod is preempted; it holds
	// the Notice as JSON.
	NoticeFile = "notice"
	// CheckpointedFile is written by the workload once its checkpoint is
	// saved.
	CheckpointedFile = "checkpointed"
)

// RecordNamespace holds the scene records of hard preemptions.
const RecordNamespace = "tessera-system"

// ConditionReason is the reason of the DisruptionTarget condition a victim
// gets.
const ConditionReason = "PreemptionByTesseraGPU"

// Notice tells a victim why and until when.
type Notice struct {
	Preemptor    string    `json:"preemptor"` // namespace/name
	PreemptorUID string    `json:"preemptorUID"`
	Node         string    `json:"node"`
	Reason       string    `json:"reason"`
	NoticeAt     time.Time `json:"noticeAt"`
	Deadline     time.Time `json:"deadline"`
}

// Encode is the annotation value.
func (n *Notice) Encode() string {
	b, _ := json.Marshal(n)
	return string(b)
}

// NoticeOf reads a pod's notice: nil when it has none.
func NoticeOf(pod *v1.Pod) (*Notice, error) {
	s, ok := pod.Annotations[AnnotationNotice]
	if !ok {
		return nil, nil
	}
	var n Notice
	if err := json.Unmarshal([]byte(s), &n); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", AnnotationNotice, err)
	}
	return &n, nil
}

// IsVictim reports whether the pod carries a notice.
func IsVictim(pod *v1.Pod) bool {
	_, ok := pod.Annotations[AnnotationNotice]
	return ok
}

// Grace is the grace period a victim gets: the configured one, or shorter
// when the pod's owner asked for less.
func Grace(pod *v1.Pod, configured time.Duration) time.Duration {
	if d, err := time.ParseDuration(pod.Annotations[AnnotationGrace]); err == nil && d >= 0 && d < configured {
		return d
	}
	return configured
}
