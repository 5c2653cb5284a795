package agent

import (
	"context"
	"unicode/utf8"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// EventComponent is the source the agent's events name.
const EventComponent = "tessera-agent"

// maxNote is the longest note events.k8s.io takes; a longer one is cut, not
// refused.
const maxNote = 1024

// newEventRecorder records events through client-go's recorder, as kubelet
// records its node's: an identical event again (same object, reason and
// note) raises the first one's count instead of adding an event per retry;
// more than ten similar ones within ten minutes are combined; one object's
// events are held to a burst of 25, then one per five minutes. The
// broadcaster's Shutdown stops the sending goroutine.
func newEventRecorder(client kubernetes.Interface, node string, opts ...record.BroadcasterOption) (record.EventBroadcaster, record.EventRecorderLogger) {
	b := record.NewBroadcaster(opts...)
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	return b, b.NewRecorder(scheme.Scheme, v1.EventSource{Component: EventComponent, Host: node})
}

// eventOn records an event about regarding (a Node, or a Pod in its
// namespace), best effort: an agent that cannot write events still serves
// its GPUs.
func (a *Agent) eventOn(ctx context.Context, regarding *v1.ObjectReference, eventType, reason, note string) {
	if a.recorder == nil {
		// An agent without an API server (New without a client).
		klog.FromContext(ctx).Info("Event", "type", eventType, "reason", reason, "note", note)
		return
	}
	a.recorder.WithLogger(klog.FromContext(ctx)).Event(regarding, eventType, reason, cutNote(note))
}

// event records an event on this node.
func (a *Agent) event(ctx context.Context, eventType, reason, note string) {
	// Kubelet's reference to its node: the UID is the node's name.
	a.eventOn(ctx, &v1.ObjectReference{Kind: "Node", Name: a.opts.Node, UID: types.UID(a.opts.Node)}, eventType, reason, note)
}

// podEvent records an event on a pod.
func (a *Agent) podEvent(ctx context.Context, namespace, name string, uid types.UID, eventType, reason, note string) {
	a.eventOn(ctx, &v1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: namespace, Name: name, UID: uid}, eventType, reason, note)
}

// cutNote cuts a note longer than maxNote at a rune boundary, marking the
// cut.
func cutNote(note string) string {
	if len(note) <= maxNote {
		return note
	}
	note = note[:maxNote-len("…")]
	for !utf8.ValidString(note) {
		note = note[:len(note)-1]
	}
	return note + "…"
}
