package preemption

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FuzzAnnotations: whatever a pod's owner or a forger writes into the
// preemption annotations, reading them never panics; what
// ValidateAnnotations accepts, the readers the agent and the controller use
// read the same way; a notice that decodes encodes back to itself; a
// checkpoint report is a time or an error.
func FuzzAnnotations(f *testing.F) {
	good := (&Notice{Preemptor: "ns/p", PreemptorUID: "u1", Node: "n1", Reason: "r",
		NoticeAt: time.Unix(1, 0).UTC(), Deadline: time.Unix(31, 0).UTC()}).Encode()
	f.Add(good, "10s", "SIGUSR1", "http://:8080/checkpoint", "2026-12-04T17:00:00Z")
	f.Add(`{"preemptor":1}`, "-1s", "KILL", "https://x:1/", "yesterday")
	f.Add("", "", "", "", "")
	f.Add(`{"deadline":"0001-01-01T00:00:00Z"}`, "1h2m", "SIGTERM", "http://:0/", " 2026-12-04T17:00:00.123456789+01:00 ")
	f.Fuzz(func(t *testing.T, notice, grace, signal, url, checkpointed string) {
		pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
			AnnotationNotice: notice, AnnotationGrace: grace, AnnotationSignal: signal,
			AnnotationURL: url, AnnotationCheckpointed: checkpointed,
		}}, Status: v1.PodStatus{PodIP: "10.0.0.7"}}
		if n, err := NoticeOf(pod); err == nil {
			var back Notice
			if err := json.Unmarshal([]byte(n.Encode()), &back); err != nil {
				t.Fatalf("a decoded notice does not decode after encoding: %v", err)
			}
			// Times compare by instant; everything else must match.
			same := back.NoticeAt.Equal(n.NoticeAt) && back.Deadline.Equal(n.Deadline)
			back.NoticeAt, back.Deadline = n.NoticeAt, n.Deadline
			if !same || !reflect.DeepEqual(back, *n) {
				t.Fatalf("notice round trip: %+v became %+v", *n, back)
			}
		}
		if err := ValidateAnnotations(pod); err == nil {
			if _, err := SignalOf(pod); err != nil {
				t.Fatalf("validated, yet the signal does not read: %v", err)
			}
			if _, err := URLOf(pod); err != nil {
				t.Fatalf("validated, yet the URL does not read: %v", err)
			}
			if d := Grace(pod, time.Hour); d < 0 || d > time.Hour {
				t.Fatalf("grace %v outside 0–1h", d)
			}
		}
		at, ok, err := CheckpointOf(pod)
		if ok == (err != nil) || (ok && at.IsZero() && checkpointed == "") {
			t.Fatalf("checkpoint %q: at %v, ok %v, err %v", checkpointed, at, ok, err)
		}
	})
}
