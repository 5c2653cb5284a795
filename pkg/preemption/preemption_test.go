package preemption

import (
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestGrace(t *testing.T) {
	for ann, want := range map[string]time.Duration{"": 30 * time.Second, "10s": 10 * time.Second, "0s": 0, "1m": 30 * time.Second, "soon": 30 * time.Second, "-1s": 30 * time.Second} {
		p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{}}}
		if ann != "" {
			p.Annotations[AnnotationGrace] = ann
		}
		if got := Grace(p, 30*time.Second); got != want {
			t.Errorf("grace with %q = %v, want %v (an owner may shorten it, never lengthen it)", ann, got, want)
		}
	}
}

func TestSignalAndURL(t *testing.T) {
	pod := func(ann map[string]string, ip string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: ann}, Status: v1.PodStatus{PodIP: ip}}
	}
	if sig, err := SignalOf(pod(map[string]string{AnnotationSignal: "sigusr1"}, "")); err != nil || sig != syscall.SIGUSR1 {
		t.Errorf("SIGUSR1: %v, %v", sig, err)
	}
	if _, err := SignalOf(pod(map[string]string{AnnotationSignal: "SIGKILL"}, "")); err == nil {
		t.Error("SIGKILL accepted: the notice must never kill")
	}
	if sig, err := SignalOf(pod(nil, "")); sig != 0 || err != nil {
		t.Error("a pod without the annotation gets a signal")
	}
	for raw, want := range map[string]string{
		"http://:8080/checkpoint":             "http://10.1.2.3:8080/checkpoint",
		"http://evil.example:8080/checkpoint": "",
		"https://:8443/x":                     "",
		"http:///x":                           "",
	} {
		got, err := URLOf(pod(map[string]string{AnnotationURL: raw}, "10.1.2.3"))
		if got != want || (want == "") != (err != nil) {
			t.Errorf("URLOf(%q) = %q, %v; want %q", raw, got, err, want)
		}
	}
}

// TestValidateAnnotations: the owner's preemption settings are checked
// where the owner sees the answer (the scheduler refuses the pod), not
// ignored when the pod is preempted.
func TestValidateAnnotations(t *testing.T) {
	for _, tc := range []struct {
		ann  map[string]string
		want string // "" when valid
	}{
		{nil, ""},
		{map[string]string{AnnotationGrace: "10s", AnnotationSignal: "SIGUSR2", AnnotationURL: "http://:8080/ckpt"}, ""},
		{map[string]string{AnnotationGrace: " 0s "}, ""},
		{map[string]string{AnnotationGrace: "ten seconds"}, `tessera.dev/checkpoint-grace: "ten seconds" is not a duration`},
		{map[string]string{AnnotationGrace: "-5s"}, "is not a duration"},
		{map[string]string{AnnotationSignal: "SIGKILL"}, `"SIGKILL" is not one of`},
		{map[string]string{AnnotationURL: "http://10.0.0.1:8080/x"}, "must be http://:<port>/<path>"},
		{map[string]string{AnnotationURL: strings.Repeat("h", 100_000)}, "… (100000 bytes) must be"},
	} {
		err := ValidateAnnotations(&v1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: tc.ann}})
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: %v", tc.ann, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || len(err.Error()) > 300):
			t.Errorf("%.80v: %v, want %q", tc.ann, err, tc.want)
		}
	}
}

func TestNoticeRoundTrip(t *testing.T) {
	n := &Notice{Preemptor: "ns/hi", PreemptorUID: "u", Node: "n1", Reason: "r", NoticeAt: time.Unix(100, 0).UTC(), Deadline: time.Unix(130, 0).UTC()}
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnotationNotice: n.Encode()}}}
	got, err := NoticeOf(p)
	if err != nil || *got != *n {
		t.Fatalf("NoticeOf = %+v, %v; want %+v", got, err, n)
	}
	p.Annotations[AnnotationNotice] = "{broken"
	if _, err := NoticeOf(p); err == nil {
		t.Error("a broken notice decoded")
	}
	if n, err := NoticeOf(&v1.Pod{}); n != nil || err != nil || IsVictim(&v1.Pod{}) {
		t.Error("a pod without a notice is a victim")
	}
}
