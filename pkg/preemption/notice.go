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
// Where its owner asks for it, the agent also sends the notice as a signal
// to the pod's GPU processes (AnnotationSignal) or POSTs it to the pod
// (AnnotationURL).
//
// This file holds the contract; it imports only k8s.io/api and pkg/gpu.
package preemption

import (
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"strings"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/pkg/gpu"
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
	// AnnotationSignal (set by the pod's owner) has the node agent also
	// send this signal to the pod's GPU processes with the notice:
	// SIGTERM, SIGINT, SIGHUP, SIGUSR1 or SIGUSR2.
	AnnotationSignal = "tessera.dev/checkpoint-signal"
	// AnnotationURL (set by the pod's owner) has the node agent also POST
	// the notice as JSON to the pod: "http://:8080/checkpoint" — port and
	// path only; the host is always the pod's own IP.
	AnnotationURL = "tessera.dev/checkpoint-url"
)

// Signals a pod may ask for; anything else (SIGKILL above all) is refused.
var Signals = map[string]syscall.Signal{
	"SIGTERM": syscall.SIGTERM, "SIGINT": syscall.SIGINT, "SIGHUP": syscall.SIGHUP,
	"SIGUSR1": syscall.SIGUSR1, "SIGUSR2": syscall.SIGUSR2,
}

// SignalOf is the signal a pod asked for with its notice: 0 and no error
// when it asked for none.
func SignalOf(pod *v1.Pod) (syscall.Signal, error) {
	name, ok := pod.Annotations[AnnotationSignal]
	if !ok {
		return 0, nil
	}
	sig, ok := Signals[strings.ToUpper(strings.TrimSpace(name))]
	if !ok {
		return 0, fmt.Errorf("annotation %s: %s is not one of SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2", AnnotationSignal, gpu.Quote(name))
	}
	return sig, nil
}

// URLOf is where the notice is POSTed for a pod that asked for it: "" and
// no error when it did not. The host is the pod's IP whatever the
// annotation says of it, so a pod cannot make the agent call elsewhere.
func URLOf(pod *v1.Pod) (string, error) {
	raw, ok := pod.Annotations[AnnotationURL]
	if !ok {
		return "", nil
	}
	u, err := parseURL(raw)
	if err != nil {
		return "", err
	}
	if pod.Status.PodIP == "" {
		return "", fmt.Errorf("pod has no IP yet")
	}
	u.Host = net.JoinHostPort(pod.Status.PodIP, u.Port())
	return u.String(), nil
}

func parseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "http" || u.Hostname() != "" || u.Port() == "" {
		return nil, fmt.Errorf("annotation %s: %s must be http://:<port>/<path> (the host is the pod's IP)", AnnotationURL, gpu.Quote(raw))
	}
	return u, nil
}

// ValidateAnnotations checks the annotations a pod's owner sets for
// preemption (AnnotationGrace, AnnotationSignal, AnnotationURL), so that a
// typo is refused where the owner sees it instead of ignored when the pod
// is preempted.
func ValidateAnnotations(pod *v1.Pod) error {
	if raw, ok := pod.Annotations[AnnotationGrace]; ok {
		if d, err := time.ParseDuration(strings.TrimSpace(raw)); err != nil || d < 0 {
			return fmt.Errorf("annotation %s: %s is not a duration such as 10s", AnnotationGrace, gpu.Quote(raw))
		}
	}
	if _, err := SignalOf(pod); err != nil {
		return err
	}
	if raw, ok := pod.Annotations[AnnotationURL]; ok {
		if _, err := parseURL(raw); err != nil {
			return err
		}
	}
	return nil
}

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

// CheckpointOf reads when a victim's agent saw its checkpoint saved
// (AnnotationCheckpointed, RFC 3339): ok is false without one. A value that
// is not a time is an error, not a checkpoint: a stopped victim must have
// saved its work.
func CheckpointOf(pod *v1.Pod) (at time.Time, ok bool, err error) {
	s, ok := pod.Annotations[AnnotationCheckpointed]
	if !ok {
		return time.Time{}, false, nil
	}
	at, err = time.Parse(time.RFC3339Nano, strings.TrimSpace(s))
	if err != nil {
		return time.Time{}, false, fmt.Errorf("annotation %s: %s is not an RFC 3339 time", AnnotationCheckpointed, gpu.Quote(s))
	}
	return at, true, nil
}

// IsVictim reports whether the pod carries a notice.
func IsVictim(pod *v1.Pod) bool {
	_, ok := pod.Annotations[AnnotationNotice]
	return ok
}

// Grace is the grace period a victim gets: the configured one, or shorter
// when the pod's owner asked for less.
func Grace(pod *v1.Pod, configured time.Duration) time.Duration {
	if d, err := time.ParseDuration(strings.TrimSpace(pod.Annotations[AnnotationGrace])); err == nil && d >= 0 && d < configured {
		return d
	}
	return configured
}
