package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// withRecorder gives a hand-built agent the recorder New gives it.
func withRecorder(t *testing.T, a *Agent) *Agent {
	t.Helper()
	a.events, a.recorder = newEventRecorder(a.opts.Client, a.opts.Node)
	t.Cleanup(a.events.Shutdown)
	return a
}

// waitEvents waits (the recorder sends in the background) until the
// events of namespace ns satisfy done, and returns the last listing. The
// recorder writes core/v1 events; the API server serves them as
// events.k8s.io too, the fake client does not.
func waitEvents(t *testing.T, client kubernetes.Interface, ns string, done func([]v1.Event) bool) []v1.Event {
	t.Helper()
	var evs []v1.Event
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		evs = l.Items
		return done(evs), nil
	})
	if err != nil {
		t.Logf("events of %s never became what the test waits for: %v", ns, err)
	}
	return evs
}

// eventWith is a done func for waitEvents: an event of reason about name
// whose message has every part.
func eventWith(reason, name string, parts ...string) func([]v1.Event) bool {
	return func(evs []v1.Event) bool {
		for _, e := range evs {
			if e.Reason != reason || e.InvolvedObject.Name != name {
				continue
			}
			ok := true
			for _, p := range parts {
				ok = ok && strings.Contains(e.Message, p)
			}
			if ok {
				return true
			}
		}
		return false
	}
}

// TestRepeatedEventsAggregate: the same event again (a retry every minute)
// raises the first one's count instead of adding one event per retry
// (issue 15); another note is another event. The events name the agent as
// their source and are cut to the 1 KiB a note may have.
func TestRepeatedEventsAggregate(t *testing.T) {
	client := newNode()
	a := withRecorder(t, &Agent{m: newAgentMetrics(), opts: Options{Node: "n1", Client: client}})
	ctx := context.Background()
	for range 3 {
		a.event(ctx, v1.EventTypeWarning, "TimeSliceNotSet", "nvidia-smi failed: exit 9")
	}
	a.event(ctx, v1.EventTypeWarning, "TimeSliceNotSet", "nvidia-smi failed: exit 3")
	a.event(ctx, v1.EventTypeWarning, "Long", strings.Repeat("é", 600))
	evs := waitEvents(t, client, metav1.NamespaceDefault, func(evs []v1.Event) bool {
		count := map[string]int32{}
		for _, e := range evs {
			count[e.Message] = e.Count
		}
		return len(evs) == 3 && count["nvidia-smi failed: exit 9"] == 3
	})
	if len(evs) != 3 {
		t.Fatalf("%d events, want 3 (one of count 3, two single): %+v", len(evs), evs)
	}
	for _, e := range evs {
		if e.InvolvedObject.Kind != "Node" || e.InvolvedObject.Name != "n1" || e.Source.Component != EventComponent || e.Source.Host != "n1" {
			t.Errorf("event about %+v from %+v, want node n1 from %s on n1", e.InvolvedObject, e.Source, EventComponent)
		}
		switch e.Message {
		case "nvidia-smi failed: exit 9":
			if e.Count != 3 {
				t.Errorf("count %d, want 3", e.Count)
			}
		case "nvidia-smi failed: exit 3":
			if e.Count != 1 {
				t.Errorf("a single event has count %d", e.Count)
			}
		default:
			if len(e.Message) > maxNote || !strings.HasSuffix(e.Message, "é…") {
				t.Errorf("a %d-byte note cut to %d bytes ending %q", 1200, len(e.Message), e.Message[len(e.Message)-8:])
			}
		}
	}
}
