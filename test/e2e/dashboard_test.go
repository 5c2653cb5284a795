package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/pkg/playground"
)

// TestDashboardOnTheDemo evaluates every query of the shipped Grafana
// dashboard in a real Prometheus scraping `make demo`'s playground (4 nodes
// × 8 H100s, 2 in MPS mode, the demo workload), with the shipped recording
// rules, and logs each panel's title, query and series (issue 39: the
// dashboard's at-a-glance stats must read a number, never "No data").
// Template variables take "All".
func TestDashboardOnTheDemo(t *testing.T) {
	bin := prometheusBinary(t)
	c, _ := up(t, playground.Options{Nodes: 4, GPUsPerNode: 8, Model: "h100", MPSNodes: 2})
	ctx := context.Background()
	if err := playground.Submit(ctx, c.Client, playground.DemoNamespace, playground.DemoWorkload()); err != nil {
		t.Fatal(err)
	}
	if _, err := playground.WaitSettled(ctx, c.Client, playground.DemoNamespace, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	// Every 5 s, as a scrape of 32 GPUs' series may take over a second on
	// a machine busy with make test's other packages.
	const every = 5 * time.Second
	p := startPrometheus(t, bin, shippedRules(t), tesseraScrapes(t, c), every)
	p.targetsUp(5)
	// The agents' GPUs, and the recording rules evaluated. (The
	// scheduler's series live in the test process's one registry, where
	// the playgrounds of earlier tests in the same run may have left
	// theirs: its counts can be higher here than on a real cluster.)
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(time.Second) {
		agents, _ := p.scalar(`count(tessera_gpu_healthy)`)
		rule, _ := p.scalar(`tessera:gpus:count`)
		if agents == "32" && rule != "" {
			break
		}
		if time.Now().After(deadline) {
			up, _ := p.scalar(`count(up == 1)`)
			t.Fatalf("after 90 s: the agents' GPUs %q (want 32), tessera:gpus:count %q, targets up %s", agents, rule, up)
		}
	}
	// Rates need two samples in their windows: three evaluations of the
	// rule since its series appeared, so as many scrapes too.
	p.waitUntil("three evaluations of tessera:gpus:count", 60*time.Second, func() bool {
		v, ok := p.scalar(`count_over_time(tessera:gpus:count[10m])`)
		n, err := strconv.Atoi(v)
		return ok && err == nil && n >= 3
	})

	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "grafana", "tessera-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	all := strings.NewReplacer(`"$node"`, `".*"`, `"$gpu"`, `".*"`, `"$namespace"`, `".*"`)
	var table strings.Builder
	fmt.Fprintln(&table, "| panel | query | series |")
	fmt.Fprintln(&table, "|---|---|---|")
	queries := 0
	for _, panel := range dash.Panels {
		for _, target := range panel.Targets {
			expr := all.Replace(target.Expr)
			if strings.Contains(expr, "$") {
				t.Errorf("panel %s: a template variable is left in %q", panel.Title, expr)
				continue
			}
			var r struct {
				Status string `json:"status"`
				Error  string `json:"error"`
				Data   struct {
					Result []json.RawMessage `json:"result"`
				} `json:"data"`
			}
			if err := p.get("query?query="+url.QueryEscape(expr), &r); err != nil || r.Status != "success" {
				t.Errorf("panel %s: %s: %v %s", panel.Title, expr, err, r.Error)
				continue
			}
			queries++
			fmt.Fprintf(&table, "| %s | `%s` | %d |\n", panel.Title, strings.ReplaceAll(target.Expr, "|", `\|`), len(r.Data.Result))
			if panel.Type == "stat" && len(r.Data.Result) == 0 {
				t.Errorf("stat panel %s reads No data on the demo: %s", panel.Title, expr)
			}
		}
	}
	if queries < 30 {
		t.Errorf("evaluated %d queries; the dashboard has more", queries)
	}
	t.Logf("the dashboard on the demo workload:\n%s", table.String())
}
