// Package agentendpoint says where tessera-agent is found in a cluster — its
// namespace, its pods' label selector, its metrics port — and reads its
// metrics, for the commands that read them (tessera top, tessera doctor
// cluster). One place for what the chart and the agent's flags agree on, as
// Kubernetes keeps its ports in pkg/cluster/ports.
package agentendpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

const (
	// Namespace is where the chart installs the agent by default.
	Namespace = "tessera-system"
	// Selector picks the agent DaemonSet's pods.
	Selector = "app.kubernetes.io/name=tessera-agent"
	// Port serves the agent's metrics and GET /doctor: not DCGM
	// exporter's 9400, which often runs beside.
	Port = 9401
)

// DefaultMetricsAddr is the agent's --metrics-addr default.
var DefaultMetricsAddr = ":" + strconv.Itoa(Port)

// Metrics is one agent's metrics as it served them.
type Metrics struct {
	// From names the agent: the URL read, or its pod (namespace/name).
	From     string
	Families map[string]*dto.MetricFamily
}

// FromURL reads one agent's metrics endpoint.
func FromURL(ctx context.Context, c *http.Client, url string) (Metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Metrics{}, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return Metrics{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Metrics{}, fmt.Errorf("%s: %s", url, resp.Status)
	}
	families, err := Parse(resp.Body)
	if err != nil {
		return Metrics{}, fmt.Errorf("%s: %w", url, err)
	}
	return Metrics{From: url, Families: families}, nil
}

// FromPods reads the metrics of every running agent pod in namespace
// through the API server's pod proxy, so a kubeconfig is all it needs. It
// returns those that answered, and why the others did not.
func FromPods(ctx context.Context, client kubernetes.Interface, namespace string) ([]Metrics, error) {
	pods, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: Selector})
	if err != nil {
		return nil, fmt.Errorf("listing the agents' pods in %s: %w", namespace, err)
	}
	var out []Metrics
	var errs []error
	for _, p := range pods.Items {
		if p.Status.Phase != v1.PodRunning {
			continue
		}
		from := p.Namespace + "/" + p.Name
		body, err := client.CoreV1().Pods(p.Namespace).ProxyGet("http", p.Name, strconv.Itoa(Port), "metrics", nil).DoRaw(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("agent %s: %w", from, err))
			continue
		}
		families, err := Parse(bytes.NewReader(body))
		if err != nil {
			errs = append(errs, fmt.Errorf("agent %s: %w", from, err))
			continue
		}
		out = append(out, Metrics{From: from, Families: families})
	}
	return out, errors.Join(errs...)
}

// Parse reads Prometheus' text format.
func Parse(r io.Reader) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(r)
}

// Labels are a sample's labels by name.
func Labels(m *dto.Metric) map[string]string {
	out := make(map[string]string, len(m.GetLabel()))
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}
