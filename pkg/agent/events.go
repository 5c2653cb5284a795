package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"

	v1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// seriesWindow is how long a repeated event extends its series instead of
// starting a new event (the API server keeps events an hour by default).
const seriesWindow = 30 * time.Minute

// maxNote is the longest note events.k8s.io takes.
const maxNote = 1024

// eventSeries is one event the agent recorded and how often it recurred.
type eventSeries struct {
	name, namespace string
	count           int32
	first           time.Time
}

// eventOn records an event about regarding (a Node, or a Pod in its
// namespace). The same event again — same object, reason and note — within
// seriesWindow extends the first one's series (count, last time) instead of
// adding an event per retry, as client-go's recorder aggregates.
func (a *Agent) eventOn(ctx context.Context, now time.Time, regarding v1.ObjectReference, kind, reason, action, note string) {
	logger := klog.FromContext(ctx)
	if len(note) > maxNote {
		// The API server refuses a longer note.
		note = note[:maxNote-len("…")] + "…"
		for !utf8.ValidString(note) {
			note = note[:len(note)-len("…")-1] + "…"
		}
	}
	ns := regarding.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	key := fmt.Sprintf("%s/%s/%s/%s\x00%s\x00%s", regarding.Kind, ns, regarding.Name, regarding.UID, reason, note)
	a.eventsMu.Lock()
	if a.eventsSeen == nil {
		a.eventsSeen = map[string]*eventSeries{}
	}
	for k, s := range a.eventsSeen {
		if now.Sub(s.first) >= seriesWindow {
			delete(a.eventsSeen, k)
		}
	}
	s := a.eventsSeen[key]
	if s != nil {
		s.count++
	}
	a.eventsMu.Unlock()
	if s != nil {
		patch, _ := json.Marshal(map[string]any{"series": eventsv1.EventSeries{Count: s.count, LastObservedTime: metav1.NewMicroTime(now)}})
		_, err := a.opts.Client.EventsV1().Events(s.namespace).Patch(ctx, s.name, types.MergePatchType, patch, metav1.PatchOptions{})
		if err == nil {
			return
		}
		logger.V(2).Info("Could not extend an event's series; recording it anew", "reason", reason, "err", err)
	}
	ev := &eventsv1.Event{
		// Named as client-go's recorder names events: a generateName of
		// "<name>." is refused by the API server (a DNS subdomain cannot
		// end in a dot), so no event was ever recorded.
		ObjectMeta:          metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", regarding.Name, now.UnixNano()), Namespace: ns},
		EventTime:           metav1.NewMicroTime(now),
		ReportingController: "tessera.dev/agent",
		ReportingInstance:   "tessera-agent-" + a.opts.Node,
		Action:              action,
		Reason:              reason,
		Regarding:           regarding,
		Note:                note,
		Type:                kind,
	}
	if _, err := a.opts.Client.EventsV1().Events(ns).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		logger.Error(err, "Could not record an event", "reason", reason, "regarding", klog.KRef(ns, regarding.Name))
		return
	}
	a.eventsMu.Lock()
	a.eventsSeen[key] = &eventSeries{name: ev.Name, namespace: ns, count: 1, first: now}
	a.eventsMu.Unlock()
}
