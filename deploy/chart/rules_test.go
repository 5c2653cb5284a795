package chart

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// rulesFile is the shipped rule file's shape.
type rulesFile struct {
	Groups []struct {
		Rules []struct {
			Alert       string            `json:"alert"`
			Record      string            `json:"record"`
			Expr        string            `json:"expr"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

// shippedRules reads the chart's rule file.
func shippedRules(t *testing.T) rulesFile {
	t.Helper()
	b, err := Files.ReadFile("tessera/files/tessera-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules rulesFile
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	return rules
}

// TestEveryAlertHasARunbook: each shipped alert has a summary, a
// description and a runbook_url into a heading of docs/runbook.md.
func TestEveryAlertHasARunbook(t *testing.T) {
	rules := shippedRules(t)
	readme, err := os.ReadFile("../../docs/runbook.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#+ (.+)$`).FindAllStringSubmatch(string(readme), -1) {
		anchors[strings.ToLower(strings.ReplaceAll(strings.TrimSpace(m[1]), " ", "-"))] = true
	}
	alerts := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			a := r.Annotations
			if a["summary"] == "" || a["description"] == "" {
				t.Errorf("%s lacks a summary or description", r.Alert)
			}
			_, anchor, ok := strings.Cut(a["runbook_url"], "/blob/main/docs/runbook.md#")
			if !ok || !anchors[anchor] {
				t.Errorf("%s: runbook_url %q is not a heading of docs/runbook.md", r.Alert, a["runbook_url"])
			}
		}
	}
	if alerts < 13 {
		t.Errorf("%d alerts, want the 13 shipped", alerts)
	}
}
