package timeslice

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// Retry is how long a GPU whose class could not be set waits before
// nvidia-smi runs for it again.
const Retry = time.Minute

// Controller keeps a node's time-shared GPUs at the classes their tenants
// call for, through a Manager, and says what happened: the class applied
// and the failures as per-GPU series, a log line per change, one event per
// pass that failed. It owns its series.
type Controller struct {
	// manager is nil where no Setter was found: the GPUs keep the driver's
	// default, and Apply does nothing.
	manager *Manager
	gpus    []string
	labels  func(uuid string) []string
	event   func(ctx context.Context, eventType, reason, note string)

	class    *prometheus.GaugeVec
	failures *prometheus.CounterVec
}

// NewController returns a Controller of gpus, the node's time-shared GPUs,
// setting classes through s (nil: none can be set). labels gives a GPU's
// series label values (gpu.SeriesLabels); event records a node event. The
// failure series start at 0 for every GPU, so that increase() sees the
// first failure.
func NewController(s Setter, gpus []string, labels func(uuid string) []string,
	event func(ctx context.Context, eventType, reason, note string)) *Controller {
	c := &Controller{gpus: gpus, labels: labels, event: event,
		class: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tessera_gpu_timeslice_class",
			Help: "The driver time-slice class the agent applied to a time-shared GPU (nvidia-smi compute-policy: 1 short, 2 medium, 3 long). Absent until applied.",
		}, gpu.SeriesLabels),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tessera_gpu_timeslice_failures_total", Help: "Attempts to set a GPU's time-slice class that failed.",
		}, gpu.SeriesLabels),
	}
	if s != nil {
		c.manager = NewManager(s, Retry)
	}
	for _, uuid := range gpus {
		c.failures.WithLabelValues(labels(uuid)...)
	}
	return c
}

// Enabled says whether classes can be set on this node.
func (c *Controller) Enabled() bool { return c.manager != nil }

// Applied is the class last applied to uuid.
func (c *Controller) Applied(uuid string) (Class, bool) {
	if c.manager == nil {
		return 0, false
	}
	return c.manager.Applied(uuid)
}

// Collectors are the Controller's series, for the agent's registry.
func (c *Controller) Collectors() []prometheus.Collector {
	return []prometheus.Collector{c.class, c.failures}
}

// Apply brings every time-shared GPU to its class in want; a failure is
// logged, counted and reported as an event, and retried Retry later.
func (c *Controller) Apply(ctx context.Context, want map[string]Class, now time.Time) {
	if c.manager == nil {
		return
	}
	logger := klog.FromContext(ctx)
	var failed []string
	var firstErr error
	for _, ch := range c.manager.Apply(ctx, c.gpus, want, now) {
		if ch.Err != nil {
			c.failures.WithLabelValues(c.labels(ch.GPU)...).Inc()
			logger.Error(ch.Err, "Setting the GPU's time-slice class failed; retrying later", "gpu", ch.GPU, "class", ch.To, "retryAfter", Retry)
			failed = append(failed, ch.GPU)
			if firstErr == nil {
				firstErr = ch.Err
			}
			continue
		}
		c.class.WithLabelValues(c.labels(ch.GPU)...).Set(float64(ch.To))
		if ch.First {
			logger.Info("Set the GPU's time-slice class", "gpu", ch.GPU, "class", ch.To)
		} else {
			logger.Info("Changed the GPU's time-slice class for its tenants", "gpu", ch.GPU, "from", ch.From, "to", ch.To)
		}
	}
	// One event per pass, however many GPUs failed: a driver that refuses
	// refuses them all.
	if len(failed) > 0 {
		c.event(ctx, v1.EventTypeWarning, "TimeSliceNotSet",
			fmt.Sprintf("time-slice class not set on %d GPU(s) (%s …), retrying in %v: %v", len(failed), failed[0], Retry, firstErr))
	}
}
