package chart

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/prometheus/prometheus/promql/parser"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tessera-gpu/tessera/pkg/agent"
	"github.com/tessera-gpu/tessera/pkg/agent/timeslice"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/nvml/nvmltest"
	"github.com/tessera-gpu/tessera/pkg/scheduler"
)

// exported maps every metric family Tessera's components serve to its
// label names, read from the collectors' own descriptors: the agents of an
// MPS node and of a time-sliced node on go-nvml's H100 mock (each exports
// its mode's families), and the scheduler plugin.
func exported(t *testing.T) map[string]map[string]bool {
	t.Helper()
	descs := scheduler.MetricDescs()
	for _, mps := range []bool{true, false} {
		srv := dgxh100.New()
		nvmltest.Install(srv, func(int) *nvmltest.Reading { return &nvmltest.Reading{} })
		client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dash-node"}})
		a, err := agent.New(agent.Options{Node: "dash-node", Config: config.Default(), Client: client, NVML: srv,
			MPS: mps, MPSBinary: "/nonexistent", MPSRoot: t.TempDir(), TimeSlicer: &timeslice.Recorder{}})
		if err != nil {
			t.Fatal(err)
		}
		descs = append(descs, a.MetricDescs()...)
	}
	out := map[string]map[string]bool{}
	desc := regexp.MustCompile(`fqName: "([^"]+)".*?constLabels: \{([^}]*)\}, variableLabels: \{([^}]*)\}`)
	for _, d := range descs {
		m := desc.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read descriptor %s", d)
		}
		labels := map[string]bool{}
		for _, kv := range strings.Split(m[2], ",") {
			if k, _, ok := strings.Cut(kv, "="); ok {
				labels[strings.TrimSpace(k)] = true
			}
		}
		for _, l := range strings.Split(m[3], ",") {
			if l = strings.TrimSpace(l); l != "" {
				labels[l] = true
			}
		}
		out[m[1]] = labels
	}
	return out
}

// family is the exported family a series name belongs to: itself, or a
// histogram's or summary's _bucket, _sum, _count series.
func family(exp map[string]map[string]bool, name string) (map[string]bool, bool) {
	if l, ok := exp[name]; ok {
		return l, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if l, ok := exp[base]; ok {
				ls := map[string]bool{"le": suffix == "_bucket"}
				for k := range l {
					ls[k] = true
				}
				return ls, true
			}
		}
	}
	return nil, false
}

// TestDashboardQueriesNameExportedMetrics: every query of the shipped
// Grafana dashboard (panels and template variables) parses with
// Prometheus' own parser, and every metric it names is one Tessera's
// components export (from their descriptors), a recording rule Tessera
// ships, or Prometheus' own (up, ALERTS); every label it matches on or
// groups by is one that metric carries.
func TestDashboardQueriesNameExportedMetrics(t *testing.T) {
	exp := exported(t)
	for _, want := range []string{"tessera_gpu_memory_used_bytes", "tessera_container_gpu_memory_granted_bytes", "tessera_scheduler_node_fragmented_gpus", "tessera_scheduler_pending_gpu_pods"} {
		if _, ok := exp[want]; !ok {
			t.Fatalf("the descriptors lack %s; read %d families", want, len(exp))
		}
	}
	// Recording rules and the labels their results keep.
	p := parser.NewParser(parser.Options{})
	for _, g := range shippedRules(t).Groups {
		for _, r := range g.Rules {
			if r.Record == "" {
				continue
			}
			labels := map[string]bool{}
			e, err := p.ParseExpr(r.Expr)
			if err != nil {
				t.Fatalf("rule %s: %v", r.Record, err)
			}
			if agg, ok := e.(*parser.AggregateExpr); ok && !agg.Without {
				for _, l := range agg.Grouping {
					labels[l] = true
				}
			}
			exp[r.Record] = labels
		}
	}
	exp["up"] = map[string]bool{"job": true, "instance": true, "node": true}
	// kube-state-metrics' families the agent-absence alerts read.
	exp["kube_pod_status_ready"] = map[string]bool{"namespace": true, "pod": true, "condition": true}
	exp["kube_pod_info"] = map[string]bool{"namespace": true, "pod": true, "node": true, "created_by_kind": true, "created_by_name": true}
	exp["kube_daemonset_status_desired_number_scheduled"] = map[string]bool{"namespace": true, "daemonset": true}
	exp["kube_daemonset_status_number_ready"] = map[string]bool{"namespace": true, "daemonset": true}
	exp["ALERTS"] = map[string]bool{"alertname": true, "alertstate": true, "severity": true}

	raw, err := Files.ReadFile("tessera/files/tessera-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels     []dashPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	type query struct{ where, expr string }
	var queries []query
	var walk func(ps []dashPanel)
	walk = func(ps []dashPanel) {
		for _, pn := range ps {
			if pn.Type != "row" && len(pn.Targets) == 0 {
				t.Errorf("panel %q has no query", pn.Title)
			}
			for _, tg := range pn.Targets {
				queries = append(queries, query{"panel " + pn.Title, tg.Expr})
			}
			walk(pn.Panels)
		}
	}
	walk(dash.Panels)
	vars := map[string]bool{}
	labelValues := regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)
	for _, v := range dash.Templating.List {
		vars[v.Name] = true
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(map[string]any)
		s, _ := q["query"].(string)
		m := labelValues.FindStringSubmatch(s)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(selector, label)", v.Name, s)
			continue
		}
		queries = append(queries, query{"variable " + v.Name, m[1]})
		queries = append(queries, query{"variable " + v.Name + " (its label)", m[1] + ` != 0 or on(` + m[2] + `) vector(0)`})
	}
	for _, want := range []string{"node", "gpu", "namespace"} {
		if !vars[want] {
			t.Errorf("no template variable %s", want)
		}
	}
	if len(queries) < 30 {
		t.Errorf("%d queries; the dashboard has its cluster, node, GPU and tenant rows", len(queries))
	}
	named := map[string]bool{}
	for _, q := range queries {
		e, err := p.ParseExpr(q.expr)
		if err != nil {
			t.Errorf("%s: %q does not parse: %v", q.where, q.expr, err)
			continue
		}
		parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
			switch n := n.(type) {
			case *parser.VectorSelector:
				labels, ok := family(exp, n.Name)
				if !ok {
					t.Errorf("%s: %s is not a metric Tessera exports", q.where, n.Name)
					return nil
				}
				named[n.Name] = true
				for _, m := range n.LabelMatchers {
					if m.Name != "__name__" && !labels[m.Name] {
						t.Errorf("%s: %s has no label %q", q.where, n.Name, m.Name)
					}
				}
			case *parser.AggregateExpr:
				checkGrouping(t, q.where, exp, n.Expr, n.Grouping, n.Without)
			}
			return nil
		})
	}
	t.Logf("%d queries name %d distinct series of %d exported families", len(queries), len(named), len(exp))
}

type dashPanel struct {
	Type    string `json:"type"`
	Title   string `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []dashPanel `json:"panels"`
}

// checkGrouping: an aggregation groups by labels its input's metrics carry.
func checkGrouping(t *testing.T, where string, exp map[string]map[string]bool, e parser.Expr, grouping []string, without bool) {
	t.Helper()
	if without {
		return
	}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		labels, ok := family(exp, vs.Name)
		if !ok {
			return nil
		}
		for _, l := range grouping {
			if !labels[l] {
				t.Errorf("%s: grouping by %q, which %s lacks", where, l, vs.Name)
			}
		}
		return nil
	})
}

// TestEveryPerGPUFamilyHasTheSameLabels: every family, the agent's and the
// scheduler's, that names a GPU carries the whole per-GPU label set, named
// as DCGM exporter names it (gpu.SeriesLabels), so any two join.
func TestEveryPerGPUFamilyHasTheSameLabels(t *testing.T) {
	perGPU := 0
	for name, labels := range exported(t) {
		if !labels["gpu"] && !labels["UUID"] {
			continue
		}
		perGPU++
		for _, l := range gpu.SeriesLabels {
			if !labels[l] {
				t.Errorf("%s names a GPU but lacks the label %q", name, l)
			}
		}
		for _, old := range []string{"index", "model", "uuid"} {
			if labels[old] {
				t.Errorf("%s carries %q beside DCGM's names", name, old)
			}
		}
	}
	if perGPU < 15 {
		t.Errorf("%d per-GPU families, want every GPU, tenant and per-GPU event family", perGPU)
	}
	t.Logf("%d per-GPU families", perGPU)
}

// TestDashboardAtAGlance: every stat says a number when its series are
// absent (its query, or the recording rule it reads, ends in "or
// vector(0)"), and carries a unit, colours by thresholds; every table is
// an instant query formatted as a table (issue 39: "GPUs unhealthy" read 0
// in a full outage, "Pending GPU pods" No data, no panel had thresholds,
// the tables were range queries).
func TestDashboardAtAGlance(t *testing.T) {
	raw, err := Files.ReadFile("tessera/files/tessera-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Type        string `json:"type"`
			Title       string `json:"title"`
			FieldConfig struct {
				Defaults struct {
					Unit       string                `json:"unit"`
					Color      struct{ Mode string } `json:"color"`
					Thresholds struct {
						Steps []struct {
							Color string   `json:"color"`
							Value *float64 `json:"value"`
						} `json:"steps"`
					} `json:"thresholds"`
				} `json:"defaults"`
			} `json:"fieldConfig"`
			Targets []struct {
				Expr    string `json:"expr"`
				Instant bool   `json:"instant"`
				Format  string `json:"format"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	recorded := map[string]string{}
	for _, g := range shippedRules(t).Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				recorded[r.Record] = r.Expr
			}
		}
	}
	stats, tables := 0, 0
	for _, p := range dash.Panels {
		switch p.Type {
		case "stat", "gauge":
			stats++
			d := p.FieldConfig.Defaults
			if d.Unit == "" || d.Color.Mode != "thresholds" || len(d.Thresholds.Steps) == 0 || d.Thresholds.Steps[0].Value != nil {
				t.Errorf("stat %q: unit %q, colour mode %q, thresholds %+v: want a unit and colours by thresholds from a base step", p.Title, d.Unit, d.Color.Mode, d.Thresholds.Steps)
			}
			for _, tg := range p.Targets {
				expr := tg.Expr
				if rule, ok := recorded[strings.TrimSpace(expr)]; ok {
					expr = rule
				}
				if !strings.HasSuffix(strings.TrimSpace(expr), "or vector(0)") {
					t.Errorf("stat %q reads %q, which has no value without series (want … or vector(0))", p.Title, tg.Expr)
				}
			}
		case "table":
			tables++
			for _, tg := range p.Targets {
				if !tg.Instant || tg.Format != "table" {
					t.Errorf("table %q: query %q instant %v format %q; want an instant query formatted as a table", p.Title, tg.Expr, tg.Instant, tg.Format)
				}
			}
		}
	}
	if stats == 0 || tables == 0 {
		t.Fatalf("%d stats and %d tables: the dashboard's shape changed under this test", stats, tables)
	}
}
