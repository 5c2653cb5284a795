package agent

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// agentMetrics are the agent's own event series, one set per Agent and
// registered on its registry only: the playground runs several agents in
// one process, and each node's series must come from its own agent's
// endpoint (a set shared by the process made every agent export every
// node's events, and one MPS restart fire its alert once per agent).
type agentMetrics struct {
	mpsRestarts                     *prometheus.CounterVec
	assignmentChanges, sliceChanges *prometheus.CounterVec
}

func newAgentMetrics() *agentMetrics {
	return &agentMetrics{
		mpsRestarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tessera_mps_daemon_restarts_total", Help: "MPS control daemons found dead and restarted, per GPU.",
		}, gpu.SeriesLabels),
		assignmentChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tessera_agent_assignment_changes_total", Help: "Changes of a bound pod's tessera.dev/assignment, each ignored: the first assignment counts.",
		}, []string{"node"}),
		sliceChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tessera_gpu_slice_changes_total", Help: "Changes of a GPU's slice count by the forecast-driven adjuster, by direction.",
		}, append(append([]string{}, gpu.SeriesLabels...), "direction")),
	}
}

func (m *agentMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.mpsRestarts, m.sliceChanges, m.assignmentChanges}
}
