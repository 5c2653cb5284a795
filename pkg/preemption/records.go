package preemption

import (
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// Scene records: the preemption controller writes one ConfigMap per hard
// preemption in RecordNamespace; tessera top and the doctor read them.

// RecordLabelKey marks a scene record.
const RecordLabelKey = "tessera.dev/preemption-record"

// RecordLabel selects the scene records.
const RecordLabel = RecordLabelKey + "=true"

// Scene is a hard preemption's record: what was stopped, where, for whom,
// when each level happened, and how its containers stood.
type Scene struct {
	Victim        string             `json:"victim"` // namespace/name
	UID           string             `json:"uid"`
	Node          string             `json:"node"`
	Priority      int32              `json:"priority"`
	PriorityClass string             `json:"priorityClass,omitempty"`
	Containers    []ContainerScene   `json:"containers"`
	Assignment    *gpu.PodAssignment `json:"assignment,omitempty"`
	Preemptor     string             `json:"preemptor"`
	PreemptorUID  string             `json:"preemptorUID"`
	Reason        string             `json:"reason"`
	NoticeAt      time.Time          `json:"noticeAt"`
	Deadline      time.Time          `json:"deadline"`
	StoppedAt     time.Time          `json:"stoppedAt"`
}

// ContainerScene is one container as it stood when stopped.
type ContainerScene struct {
	Name         string            `json:"name"`
	Image        string            `json:"image"`
	Limits       map[string]string `json:"limits,omitempty"`
	State        v1.ContainerState `json:"state"`
	LastState    v1.ContainerState `json:"lastState"`
	RestartCount int32             `json:"restartCount"`
	LastLog      string            `json:"lastLog"`
}
