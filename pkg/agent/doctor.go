package agent

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/pkg/doctor"
)

// doctorTimeout bounds each of the doctor's node checks.
const doctorTimeout = 10 * time.Second

// Doctor runs tessera doctor's node checks from inside the agent: the
// host's kernel and cgroups, the driver and GPUs through the agent's NVML,
// the MPS daemons through its MPS manager, kubelet's sockets. The runtime's
// configuration is not visible here (doctor.NodeOptions.InAgent).
func (a *Agent) Doctor(ctx context.Context) []doctor.Finding {
	if a.opts.HostRoot == "" {
		return nil
	}
	var query doctor.MPSQuery
	if a.mpsMgr != nil {
		query = func(uuid, command string) (string, error) { return a.mpsMgr.Control(ctx, uuid, command) }
	}
	return doctor.DiagnoseNode(ctx, os.DirFS(a.opts.HostRoot), a.opts.NVML, nil, query,
		doctor.NodeOptions{MPS: a.mpsMgr != nil, InAgent: true}, doctorTimeout)
}

// DoctorHandler serves Doctor's findings as JSON (GET /doctor on the
// metrics port): status 200 whatever they say, the worst in the body.
func (a *Agent) DoctorHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.opts.HostRoot == "" {
			http.Error(w, "the node checks are off (tessera-agent --host-root is empty)", http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if err := doctor.WriteJSON(w, a.Doctor(r.Context())); err != nil {
			klog.FromContext(r.Context()).Error(err, "Writing the doctor's findings")
		}
	})
}

// reportDoctor runs the node checks once at start: warnings and errors are
// logged, and errors also go into one event on the node, where an operator
// looking at the node sees them.
func (a *Agent) reportDoctor(ctx context.Context) {
	logger := klog.FromContext(ctx)
	var errs []string
	for _, f := range a.Doctor(ctx) {
		if f.Severity < doctor.Warning {
			continue
		}
		logger.Info("Node check: "+f.Summary, "check", f.ID, "severity", f.Severity.String(), "subject", f.Subject, "evidence", f.Evidence, "remedy", f.Remedy)
		if f.Severity == doctor.Error {
			errs = append(errs, strings.TrimSpace(f.ID+" "+f.Subject))
		}
	}
	if len(errs) > 0 {
		a.event(ctx, v1.EventTypeWarning, "NodeCheckFailed",
			fmt.Sprintf("tessera doctor found %d error(s) on this node: %s; the agent's log (or GET /doctor on its metrics port) has the evidence and remedies", len(errs), strings.Join(errs, ", ")))
	}
}
